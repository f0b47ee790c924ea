// ctr_movielens.cpp — MovieLens CSV reader and time split (see ctr_movielens.h).
#include "ration/data/ctr_movielens.h"

#include <algorithm>
#include <fstream>
#include <numeric>
#include <sstream>

#include "ration/base/check.h"

namespace ration::data {
namespace {

// FNV-1a: a stable id for a genre name.
int64_t genre_id(const std::string& g) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : g) h = (h ^ c) * 1099511628211ULL;
  return static_cast<int64_t>(h >> 1);
}

// One CSV line into fields, honouring double quotes.
std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (char c : line) {
    if (c == '"') quoted = !quoted;
    else if (c == ',' && !quoted) out.emplace_back();
    else if (c != '\r') out.back().push_back(c);
  }
  return out;
}

}  // namespace

std::pair<std::shared_ptr<Movielens>, std::shared_ptr<Movielens>> Movielens::load(const std::string& csv,
                                                                                double train_fraction) {
  RATION_CHECK(train_fraction > 0 && train_fraction < 1, "data.train_fraction must be in (0, 1); got ", train_fraction);
  std::ifstream in(csv);
  RATION_CHECK(in.good(), "data.file '", csv, "' cannot be read; create it with scripts/movielens.sh ", csv);
  std::string line;
  std::getline(in, line);
  RATION_CHECK(line.find("userId") != std::string::npos && line.find("genres") != std::string::npos, "data.file '", csv,
               "': expected the header userId,movieId,rating,timestamp,year,genres (from scripts/movielens.sh)");
  struct Raw {
    int64_t user, movie, ts, year;
    double rating;
    std::string genres;
  };
  std::vector<Raw> raw;
  int64_t lineno = 1;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty()) continue;
    const auto f = split_csv(line);
    RATION_CHECK(f.size() == 6, "data.file '", csv, "' line ", lineno, ": expected 6 fields ",
                 "userId,movieId,rating,timestamp,year,genres; got ", f.size());
    try {
      raw.push_back({std::stoll(f[0]), std::stoll(f[1]), std::stoll(f[3]), std::stoll(f[4]), std::stod(f[2]), f[5]});
    } catch (const std::exception&) {
      RATION_CHECK(false, "data.file '", csv, "' line ", lineno, ": a number field is not a number: '", line, "'");
    }
  }
  RATION_CHECK(raw.size() >= 10, "data.file '", csv, "' holds ", raw.size(), " ratings; expected the MovieLens set");
  std::vector<size_t> order(raw.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return raw[a].ts < raw[b].ts; });
  auto rows = std::make_shared<MovielensRows>();
  for (size_t k : order) {
    const Raw& r = raw[k];
    rows->user.push_back(r.user);
    rows->movie.push_back(r.movie);
    rows->year.push_back(r.year);
    rows->label.push_back(r.rating >= 4.0 ? 1 : 0);
    rows->dense.push_back(r.year > 0 ? static_cast<float>((r.year - 1990) / 20.0) : 0.0f);
    std::vector<int64_t> g;
    std::stringstream ss(r.genres);
    std::string item;
    while (std::getline(ss, item, '|'))
      if (!item.empty()) g.push_back(genre_id(item));
    rows->genres.push_back(std::move(g));
  }
  const int64_t n = static_cast<int64_t>(raw.size());
  const int64_t n_train = static_cast<int64_t>(static_cast<double>(n) * train_fraction);
  return {std::make_shared<Movielens>(rows, 0, n_train), std::make_shared<Movielens>(rows, n_train, n - n_train)};
}

Movielens::Movielens(std::shared_ptr<const MovielensRows> rows, int64_t begin, int64_t count)
    : rows_(std::move(rows)), begin_(begin), count_(count) {}

Batch Movielens::get(const std::vector<int64_t>& indices) const {
  const int64_t b = static_cast<int64_t>(indices.size());
  at::Tensor dense = at::empty({b, 1}, at::kFloat);
  at::Tensor labels = at::empty({b}, at::kLong);
  std::vector<int64_t> user, movie, year, genres;
  at::Tensor single = at::arange(b, at::kLong);
  at::Tensor genre_off = at::empty({b}, at::kLong);
  for (int64_t i = 0; i < b; ++i) {
    const int64_t idx = indices[static_cast<size_t>(i)];
    RATION_CHECK(idx >= 0 && idx < count_, "movielens index ", idx, " out of range [0, ", count_, ")");
    const size_t r = static_cast<size_t>(begin_ + idx);
    dense.data_ptr<float>()[i] = rows_->dense[r];
    labels.data_ptr<int64_t>()[i] = rows_->label[r];
    user.push_back(rows_->user[r]);
    movie.push_back(rows_->movie[r]);
    year.push_back(rows_->year[r]);
    genre_off.data_ptr<int64_t>()[i] = static_cast<int64_t>(genres.size());
    genres.insert(genres.end(), rows_->genres[r].begin(), rows_->genres[r].end());
  }
  Batch batch;
  batch.input = Value(dense);
  batch.target = Value(labels);
  batch.items = b;
  batch.sparse = {{at::tensor(user, at::kLong), single},
                  {at::tensor(movie, at::kLong), single.clone()},
                  {at::tensor(genres, at::kLong), genre_off},
                  {at::tensor(year, at::kLong), single.clone()}};
  return batch;
}

}  // namespace ration::data
