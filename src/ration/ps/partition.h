// partition.h — which shard of N holds a feature id: a stable hash, the same in every process and run.
// Owns: shard_of() and the shard spec "I/N" parser. Does not own: the hash mixer (store.h mix64).
#pragma once
#include <cstdint>
#include <string>

#include "ration/ps/store.h"

namespace ration::ps {

// Salted so the shard split is independent of the stripe split inside a table (store.cpp).
inline uint32_t shard_of(uint64_t id, uint32_t num_shards) {
  return static_cast<uint32_t>(mix64(id ^ 0x5EEDC0FFEE123457ULL) % num_shards);
}

struct ShardId {
  uint32_t index = 0;
  uint32_t count = 1;
  std::string to_string() const { return std::to_string(index) + "/" + std::to_string(count); }
};
// "I/N" with 0 <= I < N; errors name `where` and the expected form.
ShardId parse_shard(const std::string& text, const std::string& where);

}  // namespace ration::ps
