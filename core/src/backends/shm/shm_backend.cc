// ShmBackend (shm_backend.h): the collectives of collectives/shm.h on host
// buffers.
#include "backends/shm/shm_backend.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gyre/collectives/shm.h"

namespace gyre::core {

void ShmBackend::allreduce(const void* in, void* out, std::size_t count, DataType dt,
                           const Reduction& red, const OpLabel&) {
  collectives::shm_allreduce(group(), in, out, count, dt, red.op, red.prescale, red.postscale);
}

void ShmBackend::allreduce_members(std::span<const BucketPiece> members, std::size_t count,
                                   DataType dt, const Reduction& red, const OpLabel&) {
  collectives::shm_allreduce_pieces(group(), members, count, dt, red.op, red.prescale,
                                    red.postscale);
}

void ShmBackend::broadcast(void* buf, std::size_t bytes, int root, const OpLabel&) {
  collectives::shm_broadcast(group(), buf, bytes, root);
}

void ShmBackend::allgather(const void* in, std::span<const std::size_t> block_bytes, void* out,
                           const OpLabel&) {
  if (out == nullptr) {
    std::size_t total = 0;
    for (auto b : block_bytes) total += b;
    out = discard(total);
  }
  collectives::shm_allgather(group(), in, out, block_bytes);
}

void ShmBackend::alltoall(const void* in, std::span<const std::size_t> send_bytes, void* out,
                          std::span<const std::size_t> recv_bytes, const OpLabel&) {
  // The number of rounds follows the largest message of any pair, which this
  // rank does not know: one small allgather of each rank's largest first.
  std::uint64_t mine = 0;
  for (auto b : send_bytes) mine = std::max<std::uint64_t>(mine, b);
  for (auto b : recv_bytes) mine = std::max<std::uint64_t>(mine, b);
  const auto n = static_cast<std::size_t>(group().size());
  std::vector<std::uint64_t> all(n);
  collectives::shm_allgather(group(), &mine, all.data(),
                             std::vector<std::size_t>(n, sizeof(std::uint64_t)));
  const std::uint64_t largest = *std::max_element(all.begin(), all.end());
  collectives::shm_alltoall(group(), in, send_bytes, out, recv_bytes,
                            static_cast<std::size_t>(largest));
}

void ShmBackend::reducescatter(const void* in, std::span<const std::size_t> counts, void* out,
                               DataType dt, const Reduction& red, const OpLabel&) {
  if (out == nullptr) {
    const auto me = static_cast<std::size_t>(group().rank());
    out = discard(me < counts.size() ? counts[me] * dtype_size(dt) : 0);
  }
  collectives::shm_reduce_scatter(group(), in, out, counts, dt, red.op, red.prescale,
                                  red.postscale);
}

}  // namespace gyre::core
