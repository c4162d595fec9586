// Where a parameter store's tensors live: pure functions of the tensors'
// sizes and the number of ranks, computed alike on every rank (the ranks
// register the same tensors in the same order). See gyre/store.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gyre::core::store {

// One contiguous piece of a tensor: elements [offset, offset + count), owned
// by the member of index `owner` (an index into the store's ranks).
struct ShardSpan {
  int owner = 0;
  std::int64_t offset = 0;
  std::int64_t count = 0;
};

// The shards of a tensor of `numel` elements of `elem_size` bytes among
// `bytes_held.size()` members, given the bytes each member holds so far
// (updated): at most `split_bytes` bytes, one shard owned by the member
// holding the fewest bytes (ties: the lowest index); more, one shard per
// member (member i owns shard i; the first numel % members shards take one
// element more). A tensor of no elements is one empty shard.
std::vector<ShardSpan> place_tensor(std::int64_t numel, std::size_t elem_size,
                                    std::size_t split_bytes, std::vector<std::size_t>& bytes_held);

}  // namespace gyre::core::store
