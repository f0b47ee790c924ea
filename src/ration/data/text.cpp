// text.cpp — byte corpus loading, train/val split, next-byte windows, unigram entropy (see text.h).
#include "ration/data/text.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "ration/base/check.h"
#include "ration/base/allocator.h"

namespace ration::data {

TextCorpus::TextCorpus(const std::vector<std::string>& paths, double val_fraction) {
  RATION_CHECK(!paths.empty(), "text data needs at least one file; hint: set data.files");
  RATION_CHECK(val_fraction > 0 && val_fraction < 1, "validation fraction must be in (0, 1), got ", val_fraction);
  std::string bytes;
  for (const auto& path : paths) {
    RATION_CHECK(!std::filesystem::is_directory(path), "text file '", path, "' is a directory; hint: data.files ",
                 "names files, comma-separated (e.g. data.files = \"a.txt,b.txt\")");
    std::ifstream in(path, std::ios::binary);
    RATION_CHECK(in.good(), "cannot open text file '", path, "'; hint: check the path in data.files");
    const std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    RATION_CHECK(!in.bad(), "error while reading text file '", path, "'");
    RATION_CHECK(!content.empty(), "text file '", path, "' is empty");
    bytes += content;
  }
  const auto n = static_cast<int64_t>(bytes.size());
  const auto n_val = static_cast<int64_t>(std::floor(static_cast<double>(n) * val_fraction));
  const int64_t n_train = n - n_val;
  RATION_CHECK(n_val >= 2 && n_train >= 2, "text corpus of ", n, " bytes is too small for a train/val split with ",
               "validation fraction ", val_fraction, " (", n_train, " train, ", n_val, " val bytes)");
  memory::CategoryGuard data(memory::Category::Data);
  at::Tensor all = at::empty({n}, at::kByte);  // (N)
  std::memcpy(all.data_ptr(), bytes.data(), bytes.size());
  train_ = all.narrow(0, 0, n_train);
  val_ = all.narrow(0, n_train, n_val);
}

double TextCorpus::unigram_entropy(bool bits) const {
  const at::Tensor counts = at::bincount(train_.to(at::kLong), {}, kByteVocab).to(at::kDouble);  // (256)
  const at::Tensor p = counts / counts.sum();
  const at::Tensor nz = p.masked_select(p > 0);
  const double nats = -(nz * nz.log()).sum().item<double>();
  return bits ? nats / std::log(2.0) : nats;
}

TextWindows::TextWindows(at::Tensor split, int64_t block_size, int64_t stride)
    : split_(std::move(split)), block_size_(block_size), stride_(stride) {
  RATION_CHECK(split_.dim() == 1 && split_.scalar_type() == at::kByte, "text windows need a 1-D uint8 tensor, got ",
               split_.scalar_type(), " of shape ", split_.sizes());
  split_ = split_.contiguous();
  RATION_CHECK(block_size > 0 && stride > 0, "block_size and stride must be > 0, got ", block_size, " and ", stride);
  RATION_CHECK(split_.numel() >= block_size + 1, "a text split of ", split_.numel(), " bytes cannot hold a window of ",
               block_size, " inputs plus one target; hint: lower the block size (model.block_size)");
  count_ = (split_.numel() - block_size - 1) / stride + 1;
}

Batch TextWindows::get(const std::vector<int64_t>& indices) const {
  memory::CategoryGuard data(memory::Category::Data);
  const auto b = static_cast<int64_t>(indices.size());
  const int64_t t = block_size_;
  at::Tensor input = at::empty({b, t}, at::kLong);   // (B, T)
  at::Tensor target = at::empty({b, t}, at::kLong);  // (B, T)
  const uint8_t* src = split_.data_ptr<uint8_t>();
  int64_t* in = input.data_ptr<int64_t>();
  int64_t* tg = target.data_ptr<int64_t>();
  for (int64_t row = 0; row < b; ++row) {
    const int64_t i = indices[static_cast<size_t>(row)];
    RATION_CHECK(i >= 0 && i < count_, "text window index ", i, " is outside [0, ", count_, ")");
    const uint8_t* s = src + offset_of(i);
    for (int64_t k = 0; k < t; ++k) {
      in[row * t + k] = s[k];
      tg[row * t + k] = s[k + 1];
    }
  }
  Batch batch;
  batch.input = Value(std::move(input));
  batch.target = Value(std::move(target));
  batch.items = b * t;
  return batch;
}

}  // namespace ration::data
