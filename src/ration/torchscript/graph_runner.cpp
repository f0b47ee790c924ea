// graph_runner.cpp — see graph_runner.h. One function per kind of JIT node over a Frame (the values of one
// forward); run_operator routes each operator node: plain (no gradient needed), native, or generic.
#include "ration/torchscript/graph_runner.h"

#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/runtime/graph_executor.h>

#include <algorithm>
#include <optional>
#include <sstream>

#include "ration/base/check.h"
#include "ration/core/node.h"
#include "ration/torchscript/generic_op.h"
#include "ration/torchscript/native_ops.h"

namespace ration::torchscript {
namespace jit = torch::jit;
using c10::IValue;
using Tensors = std::vector<at::Tensor>;

namespace {

// ---- tensors inside IValues (lists, tuples, optionals) ---------------------------------------------------
void collect_tensors(const IValue& v, Tensors& out) {
  if (v.isTensor()) {
    out.push_back(v.toTensor());
  } else if (v.isList()) {
    for (const IValue& e : v.toListRef()) collect_tensors(e, out);
  } else if (v.isTuple()) {
    for (const IValue& e : v.toTupleRef().elements()) collect_tensors(e, out);
  }
}

// `v` with its tensors replaced, in collect_tensors' order, by ts[k], ts[k + 1], ... (undefined tensors
// when ts is empty: the shape of the value without holding its data).
IValue substitute(const IValue& v, const Tensors& ts, size_t& k) {
  if (v.isTensor()) return ts.empty() ? at::Tensor() : ts.at(k++);
  if (v.isList()) {
    c10::List<IValue> src = v.toList();
    c10::impl::GenericList out(src.elementType());
    out.reserve(src.size());
    for (const IValue& e : src) out.push_back(substitute(e, ts, k));
    return out;
  }
  if (v.isTuple()) {
    std::vector<IValue> elements;
    for (const IValue& e : v.toTupleRef().elements()) elements.push_back(substitute(e, ts, k));
    return c10::ivalue::Tuple::create(std::move(elements));
  }
  return v;
}
IValue stripped(const IValue& v) {
  size_t k = 0;
  return substitute(v, {}, k);
}

// Tensors a value of this type holds, when the type alone says (nullopt for lists and optionals of tensors).
std::optional<int> tensor_count(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::TensorType) return 1;
  if (const auto tuple = type->cast<c10::TupleType>()) {
    int n = 0;
    for (const auto& e : tuple->elements()) {
      const auto c = tensor_count(e);
      if (!c) return std::nullopt;
      n += *c;
    }
    return n;
  }
  if (const auto list = type->cast<c10::ListType>()) {
    const auto c = tensor_count(list->getElementType());
    return c && *c == 0 ? std::optional<int>(0) : std::nullopt;
  }
  if (const auto optional = type->cast<c10::OptionalType>()) {
    const auto c = tensor_count(optional->getElementType());
    return c && *c == 0 ? std::optional<int>(0) : std::nullopt;
  }
  return 0;
}

// Which arguments the op writes in place (schema `Tensor(a!)`).
std::vector<bool> written_args(const jit::Node* n) {
  std::vector<bool> out(n->inputs().size(), false);
  if (const c10::FunctionSchema* s = n->maybeSchema()) {
    for (size_t i = 0; i < s->arguments().size() && i < out.size(); ++i) {
      const auto* alias = s->arguments()[i].alias_info();
      out[i] = alias != nullptr && alias->isWrite();
    }
  }
  return out;
}

// The module path of an inlined node ("layer1.0.conv1"): the instance names along its call stack.
std::string module_path(const jit::Node* n) {
  std::string path;
  c10::optional<jit::ModuleInstanceInfo> last;
  if (const auto cs = n->callstack()) {
    for (const auto& entry : (*cs)->vec()) {
      const auto& info = std::get<2>(entry);
      // A method calling another method of its own module is named SELF, and functions it calls
      // (F.interpolate) repeat its instance: neither adds a path component.
      if (!info || info->instance_name().empty() || info->instance_name() == "SELF" || info == last) continue;
      last = info;
      path += (path.empty() ? "" : ".") + info->instance_name();
    }
  }
  return path;
}

bool has_calls(const jit::Block* b) {
  for (const jit::Node* n : b->nodes()) {
    if (n->kind() == c10::prim::CallMethod || n->kind() == c10::prim::CallFunction) return true;
    for (const jit::Block* sub : n->blocks())
      if (has_calls(sub)) return true;
  }
  return false;
}

void collect_paths(const jit::Block* b, std::unordered_map<const jit::Node*, std::string>& out) {
  for (const jit::Node* n : b->nodes()) {
    out.emplace(n, module_path(n));
    for (const jit::Block* sub : n->blocks()) collect_paths(sub, out);
  }
}

std::string describe(const IValue& v) {
  Tensors ts;
  collect_tensors(v, ts);
  if (ts.empty()) return v.tagKind();
  std::ostringstream s;
  for (size_t i = 0; i < ts.size(); ++i) {
    if (i > 0) s << ", ";
    if (ts[i].defined()) s << ts[i].sizes() << " " << ts[i].scalar_type();
    else s << "None";
  }
  return s.str();
}

// The values of one forward: every JIT value's IValue, and the ration Value behind each tensor.
struct Frame {
  std::unordered_map<const jit::Value*, IValue> env;
  // The Value behind each tensor some env entry holds (refs: how many), so a tensor's Value lives exactly
  // as long as the graph values that hold it: a dropped activation is not kept alive by the interpreter.
  std::unordered_map<const c10::TensorImpl*, Value> values;
  std::unordered_map<const c10::TensorImpl*, int> refs;
  // The tensors each env entry was counted for (a list an op appends to is counted again: rebind).
  std::unordered_map<const jit::Value*, std::vector<const c10::TensorImpl*>> counted;
  const std::unordered_map<const c10::TensorImpl*, Value>& parameters;
  const std::unordered_set<const c10::TensorImpl*>& buffers;
  const std::unordered_map<const jit::Node*, std::string>& paths;
  std::unordered_map<const jit::Node*, jit::Operation>& operations;
  std::map<std::string, OpRoute>& routes;
  const std::string& origin;
  bool active_dropout = false;

  const IValue& in(const jit::Node* n, size_t i) const { return env.at(n->inputs().at(i)); }
  void uncount(const std::vector<const c10::TensorImpl*>& impls) {
    for (const c10::TensorImpl* impl : impls) {
      if (--refs[impl] > 0) continue;
      refs.erase(impl);
      values.erase(impl);
    }
  }
  void bind(const jit::Value* v, IValue value) {
    Tensors ts;
    collect_tensors(value, ts);
    std::vector<const c10::TensorImpl*> impls;
    for (const at::Tensor& t : ts) {
      if (!t.defined()) continue;
      impls.push_back(t.unsafeGetTensorImpl());
      ++refs[impls.back()];  // before releasing the old binding: rebinding a value to itself keeps it
    }
    release(v);
    env.emplace(v, std::move(value));
    counted.emplace(v, std::move(impls));
  }
  void release(const jit::Value* v) {
    auto it = counted.find(v);
    if (it != counted.end()) {
      const std::vector<const c10::TensorImpl*> impls = std::move(it->second);
      counted.erase(it);
      uncount(impls);
    }
    env.erase(v);
  }
  // The Value of a tensor: a parameter, the one ration tracks, or a constant (buffer, batch input, plain result).
  Value value_of(const at::Tensor& t) {
    if (!t.defined()) return Value();
    const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    if (auto p = parameters.find(impl); p != parameters.end()) return p->second;
    auto it = values.find(impl);
    if (it != values.end()) return it->second;
    Value v(t);
    values.emplace(impl, v);
    return v;
  }
  bool tracked(const at::Tensor& t) const {
    if (!t.defined()) return false;
    if (t.requires_grad()) return true;  // oracle mode: libtorch tracks it
    const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    if (auto p = parameters.find(impl); p != parameters.end()) return p->second.requires_grad();
    auto it = values.find(impl);
    return it != values.end() && it->second.requires_grad();
  }
  jit::Operation& operation(const jit::Node* n) {
    auto it = operations.find(n);
    if (it == operations.end()) it = operations.emplace(n, n->getOperation()).first;
    return it->second;
  }
  // "aten::conv2d in layer1.0.conv1 (torch/nn/modules/conv.py:459)"
  std::string where(const jit::Node* n) const {
    std::string s = n->kind().toQualString();
    const std::string& path = paths.at(n);
    if (!path.empty()) s += " in " + path;
    if (const auto flc = n->sourceRange().file_line_col())
      s += " (" + std::get<0>(*flc) + ":" + std::to_string(std::get<1>(*flc)) + ")";
    return s;
  }
};

void run_block(Frame& f, const jit::Block* b);

void run_constant(Frame& f, const jit::Node* n) {
  const jit::Value* out = n->output();
  if (out->type()->kind() == c10::TypeKind::FunctionType) {
    f.bind(out, IValue());  // a function reference, already inlined
    return;
  }
  const auto v = jit::toIValue(out);
  RATION_CHECK(v.has_value(), f.origin, ": cannot read the constant ", *n);
  f.bind(out, *v);
}

void run_if(Frame& f, const jit::Node* n) {
  const jit::Block* b = n->blocks().at(f.in(n, 0).toBool() ? 0 : 1);
  run_block(f, b);
  for (size_t i = 0; i < n->outputs().size(); ++i) f.bind(n->outputs()[i], IValue(f.env.at(b->outputs()[i])));
}

// prim::Loop(max_trip_count, condition, carried...) with body (i, carried...) -> (condition, carried...).
void run_loop(Frame& f, const jit::Node* n) {
  const int64_t trips = f.in(n, 0).toInt();
  bool go_on = f.in(n, 1).toBool();
  std::vector<IValue> carried;
  for (size_t j = 2; j < n->inputs().size(); ++j) carried.push_back(f.in(n, j));
  const jit::Block* body = n->blocks().at(0);
  for (int64_t i = 0; i < trips && go_on; ++i) {
    f.bind(body->inputs()[0], i);
    for (size_t j = 0; j < carried.size(); ++j) f.bind(body->inputs()[j + 1], carried[j]);
    run_block(f, body);
    go_on = f.env.at(body->outputs()[0]).toBool();
    for (size_t j = 0; j < carried.size(); ++j) carried[j] = f.env.at(body->outputs()[j + 1]);
  }
  for (size_t j = 0; j < carried.size(); ++j) f.bind(n->outputs()[j], carried[j]);
}

void run_structural(Frame& f, const jit::Node* n) {
  const auto kind = n->kind();
  if (kind == c10::prim::ListConstruct) {
    c10::impl::GenericList list(n->output()->type()->expectRef<c10::ListType>().getElementType());
    for (size_t i = 0; i < n->inputs().size(); ++i) list.push_back(f.in(n, i));
    f.bind(n->output(), list);
  } else if (kind == c10::prim::TupleConstruct) {
    std::vector<IValue> elements;
    for (size_t i = 0; i < n->inputs().size(); ++i) elements.push_back(f.in(n, i));
    f.bind(n->output(), c10::ivalue::Tuple::create(std::move(elements)));
  } else if (kind == c10::prim::ListUnpack || kind == c10::prim::TupleUnpack) {
    const IValue& v = f.in(n, 0);
    const std::vector<IValue> items = v.isTuple() ? v.toTupleRef().elements().vec() : v.toListRef().vec();
    RATION_CHECK(items.size() == n->outputs().size(), f.origin, ": ", f.where(n), " unpacks ", items.size(),
                 " values into ", n->outputs().size());
    for (size_t i = 0; i < items.size(); ++i) f.bind(n->outputs()[i], items[i]);
  } else if (kind == c10::prim::TupleIndex) {  // an element, not a node: the tensor keeps its Value
    const auto& items = f.in(n, 0).toTupleRef().elements();
    const int64_t size = static_cast<int64_t>(items.size()), i = f.in(n, 1).toInt();
    RATION_CHECK(i >= -size && i < size, f.origin, ": ", f.where(n), " reads element ", i, " of a ", size, "-tuple");
    f.bind(n->output(), items[static_cast<size_t>(i < 0 ? i + size : i)]);
  } else if (kind == c10::prim::GetAttr) {
    f.bind(n->output(), f.in(n, 0).toObjectRef().getAttr(n->s(c10::attr::name)));
  } else if (kind == c10::prim::SetAttr) {
    f.in(n, 0).toObject()->setAttr(n->s(c10::attr::name), f.in(n, 1));
  } else if (kind == c10::prim::isinstance) {
    const c10::TypePtr type = f.in(n, 0).type();
    bool is = false;
    for (const auto& candidate : n->tys(c10::attr::types)) is = is || type->isSubtypeOf(*candidate);
    f.bind(n->output(), is);
  } else {  // prim::unchecked_cast, prim::Uninitialized
    f.bind(n->output(), kind == c10::prim::Uninitialized ? IValue() : IValue(f.in(n, 0)));
  }
}

bool is_structural(c10::Symbol kind) {
  return kind == c10::prim::ListConstruct || kind == c10::prim::TupleConstruct || kind == c10::prim::ListUnpack ||
         kind == c10::prim::TupleUnpack || kind == c10::prim::TupleIndex || kind == c10::prim::GetAttr || kind == c10::prim::SetAttr ||
         kind == c10::prim::isinstance || kind == c10::prim::unchecked_cast || kind == c10::prim::Uninitialized;
}

// An in-place op may write only the module's buffers; any other tensor it would write is cloned first
// (and the JIT value it wrote is rebound to the result by the caller). Returns whether it cloned.
bool protect_written(const Frame& f, const std::vector<bool>& written, jit::Stack& stack) {
  bool cloned = false;
  for (size_t i = 0; i < written.size(); ++i) {
    if (!written[i] || !stack[i].isTensor()) continue;
    const at::Tensor& t = stack[i].toTensor();
    if (f.buffers.count(t.unsafeGetTensorImpl()) > 0) continue;
    stack[i] = t.clone();
    cloned = true;
  }
  return cloned;
}

void bind_outputs(Frame& f, const jit::Node* n, const jit::Stack& outs, bool rebind_written) {
  for (size_t i = 0; i < n->outputs().size(); ++i) f.bind(n->outputs()[i], outs.at(i));
  if (rebind_written && !n->outputs().empty()) f.bind(n->inputs()[0], outs.at(0));
}

// No gradient flows through this node: run the operator as the TorchScript interpreter would.
void run_plain(Frame& f, const jit::Node* n, const std::vector<IValue>& args) {
  jit::Stack stack(args.begin(), args.end());
  const std::vector<bool> written = written_args(n);
  const bool cloned = protect_written(f, written, stack);
  f.operation(n)(stack);
  bind_outputs(f, n, stack, cloned);
  for (size_t i = 0; i < written.size(); ++i) {  // a list the op wrote (aten::append): count its tensors again
    const jit::Value* arg = n->inputs()[i];
    if (written[i] && f.env.count(arg) > 0 && f.env.at(arg).isList()) f.bind(arg, IValue(f.env.at(arg)));
  }
}

// A tensor op ration has no native version of: one generic node over every tensor among its arguments.
void run_generic(Frame& f, const jit::Node* n, const std::vector<IValue>& args) {
  Tensors tensors;
  std::vector<IValue> shape;  // the arguments without their tensors: the closure holds no activation
  for (const IValue& a : args) {
    collect_tensors(a, tensors);
    shape.push_back(stripped(a));
  }
  Values inputs;
  for (const at::Tensor& t : tensors) inputs.push_back(f.value_of(t));
  const std::vector<bool> written = written_args(n);
  auto out_shape = std::make_shared<std::vector<IValue>>();
  jit::Operation op = f.operation(n);
  TensorFn fn = [shape, written, op, out_shape, buffers = &f.buffers](const Tensors& in) mutable {
    size_t k = 0;
    jit::Stack stack;
    for (const IValue& a : shape) stack.push_back(substitute(a, in, k));
    for (size_t i = 0; i < written.size(); ++i)
      if (written[i] && stack[i].isTensor() && buffers->count(stack[i].toTensor().unsafeGetTensorImpl()) == 0)
        stack[i] = stack[i].toTensor().clone();
    op(stack);
    Tensors outs;
    out_shape->clear();
    for (const IValue& v : stack) {
      collect_tensors(v, outs);
      out_shape->push_back(stripped(v));
    }
    return outs;
  };
  std::optional<int> count = 0;
  for (const jit::Value* o : n->outputs()) {
    const auto c = tensor_count(o->type());
    count = c && count ? std::optional<int>(*count + *c) : std::nullopt;
  }
  if (!count) {  // a list of tensors: how many, from one run without gradient
    at::NoGradGuard no_grad;
    Tensors probe;
    for (const Value& v : inputs) probe.push_back(v.defined() ? v.tensor() : at::Tensor());
    count = static_cast<int>(fn(probe).size());
  }
  const bool rng = n->isNondeterministic();
  const Values outs = generic_node(n->kind().toQualString(), f.where(n), inputs, fn, *count, rng);
  Tensors out_tensors;
  for (const Value& v : outs) {
    out_tensors.push_back(v.defined() ? v.tensor() : at::Tensor());
    if (v.defined()) f.values[v.tensor().unsafeGetTensorImpl()] = v;
  }
  jit::Stack stack;
  size_t k = 0;
  for (const IValue& s : *out_shape) stack.push_back(substitute(s, out_tensors, k));
  bind_outputs(f, n, stack, written[0]);
}

void run_operator(Frame& f, const jit::Node* n) {
  std::vector<IValue> args;
  for (size_t i = 0; i < n->inputs().size(); ++i) args.push_back(f.in(n, i));
  Tensors tensors;
  for (const IValue& a : args) collect_tensors(a, tensors);
  bool needs_grad = false;
  for (const at::Tensor& t : tensors) needs_grad = needs_grad || f.tracked(t);
  // Only an op that returns tensors can carry a gradient (aten::size or aten::dim on a tracked tensor cannot).
  bool returns_tensors = false;
  for (const jit::Value* o : n->outputs()) {
    const auto c = tensor_count(o->type());
    returns_tensors = returns_tensors || !c || *c > 0;
  }
  needs_grad = needs_grad && returns_tensors && grad_enabled();
  const std::string kind = n->kind().toQualString();
  OpRoute& route = f.routes[kind];
  if (!needs_grad) {
    ++route.plain;
    run_plain(f, n, args);
    return;
  }
  if (kind == "aten::dropout" || kind == "aten::dropout_")
    f.active_dropout = f.active_dropout || (args.at(2).toBool() && args.at(1).toDouble() > 0);
  if (kind == "aten::lstm" && args.size() == 9)  // dropout between layers, training mode
    f.active_dropout = f.active_dropout || (args.at(6).toBool() && args.at(5).toDouble() > 0 && args.at(4).toInt() > 1);
  if (NativeFn native = find_native(kind)) {
    NodeArgs a(args, [&f](const at::Tensor& t) { return f.value_of(t); });
    if (std::optional<Values> outs = native(a)) {
      ++route.native;
      jit::Stack stack;
      c10::List<at::Tensor> list;  // a node with one Tensor[] output (aten::chunk) gets them as one list
      const bool as_list = n->outputs().size() == 1 && n->output()->type()->kind() == c10::TypeKind::ListType;
      for (const Value& out : *outs) {
        f.values[out.tensor().unsafeGetTensorImpl()] = out;
        if (as_list) list.push_back(out.tensor());
        else stack.push_back(IValue(out.tensor()));
      }
      if (as_list) stack.push_back(IValue(list));
      bind_outputs(f, n, stack, written_args(n)[0]);
      return;
    }
  }
  ++route.generic;
  run_generic(f, n, args);
}

// Operator nodes with the error they raise annotated: which op, where in the module, on which inputs.
void run_annotated(Frame& f, const jit::Node* n) {
  auto inputs = [&] {
    std::string s;
    for (size_t i = 0; i < n->inputs().size(); ++i) s += (i ? "; " : "") + describe(f.in(n, i));
    return s;
  };
  try {
    run_operator(f, n);
  } catch (const Error& e) {
    RATION_CHECK(false, f.origin, ": ", f.where(n), " failed on inputs (", inputs(), "): ", e.message());
  } catch (const c10::Error& e) {
    RATION_CHECK(false, f.origin, ": ", f.where(n), " failed on inputs (", inputs(), "): ", e.what_without_backtrace());
  }
}

void run_node(Frame& f, const jit::Node* n) {
  const auto kind = n->kind();
  if (kind == c10::prim::Constant) return run_constant(f, n);
  if (kind == c10::prim::If) return run_if(f, n);
  if (kind == c10::prim::Loop) return run_loop(f, n);
  if (is_structural(kind)) return run_structural(f, n);
  if (kind == c10::prim::RaiseException) {
    const std::string what = n->inputs().size() > 1 && f.in(n, 1).isString() ? f.in(n, 1).toStringRef() : "Exception";
    RATION_CHECK(false, f.origin, ": the module raised ", what, ": ", f.in(n, 0).toStringRef(), " (", f.where(n),
                 "; check the batch's inputs against what the module's forward expects)");
  }
  RATION_CHECK(n->maybeOperator() != nullptr, f.origin, ": ", f.where(n), " is not an operator ration can run (",
               *n, "); hint: a module whose forward calls Python code cannot be exported whole: script or trace ",
               "only tensor code");
  // The node's module path is its scope (nested control flow opens none: its nodes carry the full path).
  const std::string& path = f.paths.at(n);
  std::optional<ScopeGuard> scope;
  if (!path.empty()) scope.emplace(path);
  run_annotated(f, n);
}

void run_block(Frame& f, const jit::Block* b) {
  for (const jit::Node* n : b->nodes()) run_node(f, n);
}

}  // namespace

// ---- GraphRunner -----------------------------------------------------------------------------------------
struct GraphRunner::Caches {
  std::unordered_map<const jit::Node*, std::string> paths;
  std::unordered_map<const jit::Node*, jit::Operation> operations;
  // Per top-level node: the graph values dead once it ran (last used there, or defined in its blocks).
  std::vector<std::vector<const jit::Value*>> dead_after;
};

namespace {

// Every value node `n` reads, including inside its blocks (and what those blocks return), and every value
// its blocks define.
void uses_and_inner(const jit::Node* n, std::vector<const jit::Value*>& used, std::vector<const jit::Value*>& inner) {
  for (const jit::Value* v : n->inputs()) used.push_back(v);
  for (const jit::Block* b : n->blocks()) {
    for (const jit::Value* v : b->inputs()) inner.push_back(v);
    for (const jit::Node* m : b->nodes()) {
      uses_and_inner(m, used, inner);
      for (const jit::Value* v : m->outputs()) inner.push_back(v);
    }
    for (const jit::Value* v : b->outputs()) used.push_back(v);
  }
}

std::vector<std::vector<const jit::Value*>> dead_after(const jit::Graph& graph) {
  std::unordered_map<const jit::Value*, size_t> last_use;
  std::vector<std::vector<const jit::Value*>> inner;
  size_t i = 0;
  for (const jit::Node* n : graph.block()->nodes()) {
    std::vector<const jit::Value*> used, defined_inside;
    uses_and_inner(n, used, defined_inside);
    for (const jit::Value* v : used) last_use[v] = i;
    for (const jit::Value* v : n->outputs()) last_use.emplace(v, i);  // never read: dead at once
    inner.push_back(std::move(defined_inside));
    ++i;
  }
  for (const jit::Value* v : graph.outputs()) last_use.erase(v);  // returned: alive to the end
  last_use.erase(graph.inputs()[0]);                              // self
  std::vector<std::vector<const jit::Value*>> dead = std::move(inner);
  for (const auto& [v, at] : last_use) dead.at(at).push_back(v);
  for (auto& d : dead) {  // released in a fixed order, whatever the hash map's
    std::sort(d.begin(), d.end(), [](const jit::Value* a, const jit::Value* b) { return a->unique() < b->unique(); });
  }
  return dead;
}

}  // namespace

GraphRunner::GraphRunner(torch::jit::Module module, std::string origin)
    : module_(std::move(module)), origin_(std::move(origin)), caches_(std::make_unique<Caches>()) {
  const auto method = module_.find_method("forward");
  RATION_CHECK(method.has_value(), origin_, ": the TorchScript module has no forward method");
  graph_ = method->graph()->copy();
  // Inline inlines callees' graphs as they are: with the graph executor's optimisation off (see
  // forward_jit) those still call their own methods, so repeat until no call is left.
  for (int round = 0; round < 64 && has_calls(graph_->block()); ++round) jit::Inline(*graph_);
  RATION_CHECK(!has_calls(graph_->block()), origin_, ": forward still calls functions after inlining (recursion?)");
  for (size_t i = 1; i < graph_->inputs().size(); ++i) {
    const jit::Value* in = graph_->inputs()[i];
    std::string name = in->debugName();  // the source name, without the JIT's ".N" suffix
    if (const auto dot = name.rfind('.'); dot != std::string::npos &&
        name.find_first_not_of("0123456789", dot + 1) == std::string::npos)
      name.resize(dot);
    RATION_CHECK(in->type()->kind() == c10::TypeKind::TensorType, origin_, ": forward argument '", name,
                 "' is ", in->type()->repr_str(), "; ration feeds forward tensors only (the batch's inputs, then ",
                 "the target when the module computes the loss)");
  }
  for (const auto& p : module_.named_parameters(/*recurse=*/true)) p.value.set_requires_grad(false);
  for (const auto& b : module_.named_buffers(/*recurse=*/true)) buffers_.insert(b.value.unsafeGetTensorImpl());
  collect_paths(graph_->block(), caches_->paths);
  caches_->dead_after = dead_after(*graph_);
}

GraphRunner::~GraphRunner() = default;

void GraphRunner::set_parameters(const std::vector<std::pair<std::string, Value>>& params) {
  parameters_.clear();
  for (const auto& [name, v] : params) parameters_.emplace(v.tensor().unsafeGetTensorImpl(), v);
}

size_t GraphRunner::num_inputs() const { return graph_->inputs().size() - 1; }

void GraphRunner::set_training(bool training) {
  if (training_ == static_cast<int>(training)) return;
  module_.train(training);
  training_ = static_cast<int>(training);
}

Values GraphRunner::forward(const Values& inputs, bool training) {
  RATION_CHECK(inputs.size() == num_inputs(), origin_, ": forward takes ", num_inputs(), " tensors but was given ",
               inputs.size(), "; hint: the data file's inputs (plus the target when model.loss is not set) must ",
               "match forward's arguments");
  set_training(training);
  routes_.clear();
  Frame f{{}, {}, {}, {}, parameters_, buffers_, caches_->paths, caches_->operations, routes_, origin_};
  f.bind(graph_->inputs()[0], module_._ivalue());
  for (size_t i = 0; i < inputs.size(); ++i) {
    f.values[inputs[i].tensor().unsafeGetTensorImpl()] = inputs[i];
    f.bind(graph_->inputs()[i + 1], inputs[i].tensor());
  }
  // Top-level nodes one by one, each graph value released after its last use (as the TorchScript
  // interpreter frees them), so only what ration's nodes saved outlives its consumers.
  size_t i = 0;
  for (const jit::Node* n : graph_->block()->nodes()) {
    run_node(f, n);
    for (const jit::Value* dead : caches_->dead_after.at(i)) f.release(dead);
    ++i;
  }
  active_dropout_ = f.active_dropout;
  Tensors outs;
  for (const jit::Value* o : graph_->outputs()) collect_tensors(f.env.at(o), outs);
  Values result;
  for (const at::Tensor& t : outs) result.push_back(f.value_of(t));
  return result;
}

Values GraphRunner::forward_jit(const Values& inputs, bool training) {
  RATION_CHECK(inputs.size() == num_inputs(), origin_, ": forward takes ", num_inputs(), " tensors but was given ",
               inputs.size());
  set_training(training);
  std::vector<IValue> args;
  for (const Value& v : inputs) args.emplace_back(v.tensor());
  // The graph as written, differentiated by libtorch autograd: no optimisation (the profiling executor
  // would, after a few runs, fuse ops and differentiate them by its own symbolic formulas).
  const bool optimize = jit::getGraphExecutorOptimize();
  jit::setGraphExecutorOptimize(false);
  IValue out;
  try {
    out = module_.forward(args);
  } catch (...) {
    jit::setGraphExecutorOptimize(optimize);
    throw;
  }
  jit::setGraphExecutorOptimize(optimize);
  Tensors outs;
  collect_tensors(out, outs);
  Values result;
  for (const at::Tensor& t : outs) result.emplace_back(t);
  return result;
}

}  // namespace ration::torchscript
