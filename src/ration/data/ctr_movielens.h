// ctr_movielens.h — data.kind = "movielens": MovieLens ratings as click data.
// Owns: reading the CSV written by scripts/movielens.sh (userId,movieId,rating,timestamp,year,genres),
//       label = rating >= 4, the time split (rows sorted by timestamp; the earliest train_fraction train,
//       the rest evaluate), and the fields: user, movie, genres (multi-hot), year; one dense feature
//       (the movie's year, centred and scaled). Feature ids are the raw ids (genres: a stable string hash).
// Does not own: producing the CSV (scripts/movielens.sh, R's dslabs), batching order, the model.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ration/data/dataset.h"

namespace ration::data {

inline constexpr const char* kDefaultMovielensCsv = "data/movielens.csv";

struct MovielensRows {
  std::vector<int64_t> user, movie, year;
  std::vector<std::vector<int64_t>> genres;  // hashed genre ids per row
  std::vector<int64_t> label;
  std::vector<float> dense;                  // one per row
};

class Movielens : public Dataset {
 public:
  enum class Split { Train, Eval };
  // Reads and splits `csv`; errors name the file, line and expected form.
  static std::pair<std::shared_ptr<Movielens>, std::shared_ptr<Movielens>> load(const std::string& csv,
                                                                                double train_fraction);
  explicit Movielens(std::shared_ptr<const MovielensRows> rows, int64_t begin, int64_t count);
  int64_t size() const override { return count_; }
  // input (B, 1) float32 (year), target (B) int64, sparse: user, movie, genres, year.
  Batch get(const std::vector<int64_t>& indices) const override;
  static constexpr int64_t kFields = 4;

 private:
  std::shared_ptr<const MovielensRows> rows_;
  int64_t begin_, count_;
};

}  // namespace ration::data
