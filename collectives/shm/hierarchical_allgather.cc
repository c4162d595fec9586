// hierarchical_allgather: a ring across hosts, then shared memory within one.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "gyre/collectives/algorithms.h"
#include "gyre/collectives/shm.h"
#include "gyre/collectives/transport.h"
#include "gyre/error.h"

namespace gyre::collectives {

void hierarchical_allgather(ShmGroup& local, transport::Transport& cross, const void* in,
                            void* out, std::span<const std::size_t> block_bytes,
                            std::span<const int> world_rank_of,
                            const AllgatherOptions& cross_opt, std::vector<std::byte>& scratch) {
  const int p = local.size();
  const int hosts = cross.size();
  const int me = local.rank();
  const std::size_t n = static_cast<std::size_t>(p) * hosts;
  if (world_rank_of.size() != n || block_bytes.size() != n) {
    throw InvalidArgument("hierarchical_allgather: " + std::to_string(block_bytes.size()) +
                          " block sizes and " + std::to_string(world_rank_of.size()) +
                          " placements for " + std::to_string(hosts) + " hosts x " +
                          std::to_string(p) + " ranks");
  }
  auto world = [&](int host, int l) {
    return static_cast<std::size_t>(world_rank_of[static_cast<std::size_t>(host) * p + l]);
  };
  // Staging order: local rank major, host minor, i.e. what local rank l
  // gathers across hosts (blocks of (0, l), (1, l), ...) is one contiguous
  // piece, the piece it contributes to the allgather within the host.
  std::vector<std::size_t> piece(p, 0), cross_blocks(hosts);
  std::size_t total = 0;
  bool identity = true;  // staging order == world rank order
  std::size_t pos = 0;
  for (int l = 0; l < p; ++l) {
    for (int h = 0; h < hosts; ++h) {
      piece[l] += block_bytes[world(h, l)];
      if (world(h, l) != pos++) identity = false;
    }
    total += piece[l];
  }
  for (int h = 0; h < hosts; ++h) cross_blocks[h] = block_bytes[world(h, me)];
  std::byte* stage;
  if (identity) {
    stage = static_cast<std::byte*>(out);
  } else {
    if (scratch.size() < total) scratch.resize(total);
    stage = scratch.data();
  }
  std::size_t mine_at = 0;
  for (int l = 0; l < me; ++l) mine_at += piece[l];
  // 1. Across hosts: the blocks of the ranks with this local rank. (When
  //    the staging area is `out` itself, `in` may be this rank's block in it:
  //    then this is the ring's in-place form.)
  ring_allgather(cross, in, stage + mine_at, cross_blocks, cross_opt);
  // 2. Within the host: every local rank's piece to every local rank.
  shm_allgather(local, stage + mine_at, stage, piece);
  if (identity) return;
  // 3. Into world rank order.
  auto* dst = static_cast<std::byte*>(out);
  std::vector<std::size_t> offset(n + 1, 0);
  for (std::size_t r = 0; r < n; ++r) offset[r + 1] = offset[r] + block_bytes[r];
  const std::byte* src = stage;
  for (int l = 0; l < p; ++l) {
    for (int h = 0; h < hosts; ++h) {
      const std::size_t w = world(h, l);
      if (block_bytes[w] > 0) std::memcpy(dst + offset[w], src, block_bytes[w]);
      src += block_bytes[w];
    }
  }
}

}  // namespace gyre::collectives
