// Shard placement of the parameter store (placement.h).
#include "store/placement.h"

#include <algorithm>

namespace gyre::core::store {

std::vector<ShardSpan> place_tensor(std::int64_t numel, std::size_t elem_size,
                                    std::size_t split_bytes, std::vector<std::size_t>& bytes_held) {
  const auto members = static_cast<std::int64_t>(bytes_held.size());
  const std::size_t bytes = static_cast<std::size_t>(numel) * elem_size;
  if (bytes <= split_bytes || members == 1 || numel < members) {
    const auto least = std::min_element(bytes_held.begin(), bytes_held.end());
    const int owner = static_cast<int>(least - bytes_held.begin());
    *least += bytes;
    return {ShardSpan{owner, 0, numel}};
  }
  std::vector<ShardSpan> shards;
  shards.reserve(static_cast<std::size_t>(members));
  const std::int64_t base = numel / members, extra = numel % members;
  std::int64_t offset = 0;
  for (std::int64_t i = 0; i < members; ++i) {
    const std::int64_t count = base + (i < extra ? 1 : 0);
    shards.push_back(ShardSpan{static_cast<int>(i), offset, count});
    bytes_held[static_cast<std::size_t>(i)] += static_cast<std::size_t>(count) * elem_size;
    offset += count;
  }
  return shards;
}

}  // namespace gyre::core::store
