// observe.h — what natural-gradient methods see of the layers they precondition (Linear, Conv2d): each
// layer's input in forward and the gradient at its output in backward, handed to the one installed
// LayerObserver (distributed/kfac.h). Nothing is observed, and no op is added, when none is installed.
// Owns: LayerObserver, its installation (a process-wide pointer set for the steps that collect statistics;
//       a layer's output-gradient callback binds the observer installed when its forward ran).
// Does not own: the statistics (the observer's), the layers' maths (nn/layers.cpp).
#pragma once
#include <ATen/ATen.h>

#include <string>

namespace ration::nn {

class Conv2d;

class LayerObserver {
 public:
  virtual ~LayerObserver() = default;
  // A Linear layer (module path `layer`) got input x (..., in) in forward.
  virtual void linear_input(const std::string& layer, const at::Tensor& x) {}
  // A Conv2d layer got input x (B, C_in, H, W) in forward.
  virtual void conv_input(const std::string& layer, const Conv2d& conv, const at::Tensor& x) {}
  // Backward reached the layer's output with gradient g (the shape of its output).
  virtual void output_grad(const std::string& layer, const at::Tensor& g) {}
};

// The installed observer, or null.
LayerObserver* layer_observer();
// Installs `observer` (may be null) until destroyed, then restores the previous one.
class LayerObserverScope {
 public:
  explicit LayerObserverScope(LayerObserver* observer);
  ~LayerObserverScope();
  LayerObserverScope(const LayerObserverScope&) = delete;
  LayerObserverScope& operator=(const LayerObserverScope&) = delete;

 private:
  LayerObserver* previous_;
};

}  // namespace ration::nn
