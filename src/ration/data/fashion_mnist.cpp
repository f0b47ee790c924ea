// fashion_mnist.cpp — gzipped IDX reading and validation for Fashion-MNIST (see fashion_mnist.h).
#include "ration/data/fashion_mnist.h"

#include <zlib.h>

#include <array>
#include <cstring>
#include <filesystem>

#include "ration/base/check.h"
#include "ration/base/allocator.h"

namespace ration::data {
namespace {

constexpr uint32_t kImagesMagic = 2051;  // 0x00000803: unsigned bytes, 3 dimensions
constexpr uint32_t kLabelsMagic = 2049;  // 0x00000801: unsigned bytes, 1 dimension

// A gzip stream that closes itself; every error names the file.
class GzFile {
 public:
  explicit GzFile(const std::string& path) : path_(path) {
    RATION_CHECK(std::filesystem::exists(path), "Fashion-MNIST file '", path,
                 "' does not exist; hint: point data.dir at a folder holding the four *-ubyte.gz files");
    file_ = gzopen(path.c_str(), "rb");
    RATION_CHECK(file_ != nullptr, "cannot open Fashion-MNIST file '", path, "' for reading");
  }
  ~GzFile() {
    if (file_ != nullptr) gzclose(file_);
  }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;

  // Reads exactly n bytes; `what` describes them for the error.
  void read(void* dst, int64_t n, const char* what) {
    auto* out = static_cast<char*>(dst);
    int64_t done = 0;
    while (done < n) {
      const auto chunk = static_cast<unsigned>(std::min<int64_t>(n - done, 1 << 30));
      const int got = gzread(file_, out + done, chunk);
      if (got < 0) {
        int errnum = 0;
        const char* msg = gzerror(file_, &errnum);
        RATION_CHECK(false, "Fashion-MNIST file '", path_, "' is not a readable gzip stream while reading ", what,
                     ": ", msg);
      }
      RATION_CHECK(got > 0, "Fashion-MNIST file '", path_, "' is truncated: expected ", n, " bytes of ", what,
                   ", found ", done);
      done += got;
    }
  }
  uint32_t read_u32_be(const char* what) {
    std::array<unsigned char, 4> b{};
    read(b.data(), 4, what);
    return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | uint32_t{b[3]};
  }
  // Throws unless the stream is exhausted.
  void expect_end(const char* what) {
    char extra = 0;
    const int got = gzread(file_, &extra, 1);
    RATION_CHECK(got == 0, "Fashion-MNIST file '", path_, "' has data after the ", what,
                 " its header declares; hint: the file is corrupt or not the one named");
  }

 private:
  std::string path_;
  gzFile file_ = nullptr;
};

at::Tensor read_images(const std::string& path) {
  GzFile f(path);
  const uint32_t magic = f.read_u32_be("the magic number");
  RATION_CHECK(magic == kImagesMagic, "Fashion-MNIST file '", path, "' has magic number ", magic, ", expected ",
               kImagesMagic, " (an IDX3 image file); hint: is it a labels file, or not gzipped IDX?");
  const uint32_t count = f.read_u32_be("the image count");
  const uint32_t rows = f.read_u32_be("the row count");
  const uint32_t cols = f.read_u32_be("the column count");
  RATION_CHECK(rows == FashionMnist::kSide && cols == FashionMnist::kSide, "Fashion-MNIST file '", path,
               "' declares ", rows, "x", cols, " images, expected 28x28");
  RATION_CHECK(count > 0, "Fashion-MNIST file '", path, "' declares 0 images");
  at::Tensor images = at::empty({count, rows, cols}, at::kByte);  // (N, 28, 28)
  f.read(images.data_ptr(), images.numel(), "image pixels");
  f.expect_end("images");
  return images;
}

at::Tensor read_labels(const std::string& path) {
  GzFile f(path);
  const uint32_t magic = f.read_u32_be("the magic number");
  RATION_CHECK(magic == kLabelsMagic, "Fashion-MNIST file '", path, "' has magic number ", magic, ", expected ",
               kLabelsMagic, " (an IDX1 label file); hint: is it an images file, or not gzipped IDX?");
  const uint32_t count = f.read_u32_be("the label count");
  RATION_CHECK(count > 0, "Fashion-MNIST file '", path, "' declares 0 labels");
  at::Tensor bytes = at::empty({count}, at::kByte);  // (N)
  f.read(bytes.data_ptr(), bytes.numel(), "labels");
  f.expect_end("labels");
  const int64_t max_label = bytes.max().item<int64_t>();
  RATION_CHECK(max_label < FashionMnist::kClasses, "Fashion-MNIST file '", path, "' has label ", max_label,
               ", expected labels in 0..9");
  return bytes.to(at::kLong);
}

}  // namespace

std::string fashion_mnist_images_file(FashionMnist::Split split) {
  return split == FashionMnist::Split::Train ? "train-images-idx3-ubyte.gz" : "t10k-images-idx3-ubyte.gz";
}
std::string fashion_mnist_labels_file(FashionMnist::Split split) {
  return split == FashionMnist::Split::Train ? "train-labels-idx1-ubyte.gz" : "t10k-labels-idx1-ubyte.gz";
}

FashionMnist::FashionMnist(Split split, const std::string& dir) {
  memory::CategoryGuard data(memory::Category::Data);
  const std::string images_path = (std::filesystem::path(dir) / fashion_mnist_images_file(split)).string();
  const std::string labels_path = (std::filesystem::path(dir) / fashion_mnist_labels_file(split)).string();
  images_ = read_images(images_path);
  labels_ = read_labels(labels_path);
  RATION_CHECK(images_.size(0) == labels_.size(0), "Fashion-MNIST files disagree: '", images_path, "' holds ",
               images_.size(0), " images but '", labels_path, "' holds ", labels_.size(0),
               " labels; expected one label per image");
}

Batch FashionMnist::get(const std::vector<int64_t>& indices) const {
  memory::CategoryGuard data(memory::Category::Data);
  const int64_t n = size();
  for (int64_t i : indices) {
    RATION_CHECK(i >= 0 && i < n, "Fashion-MNIST index ", i, " is outside [0, ", n, ")");
  }
  const at::Tensor idx = at::tensor(indices, at::kLong);  // (B)
  at::Tensor x = images_.index_select(0, idx)             // (B, 28, 28) uint8
                     .unsqueeze(1)                        // (B, 1, 28, 28)
                     .to(at::kFloat)
                     .div_(255.0)
                     .sub_(kMean)
                     .div_(kStd);
  Batch b;
  b.input = Value(std::move(x));
  b.target = Value(labels_.index_select(0, idx));  // (B) int64
  b.items = static_cast<int64_t>(indices.size());
  return b;
}

}  // namespace ration::data
