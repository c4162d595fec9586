// ShmBackend (shm_backend.h): the collectives of collectives/shm.h on host
// buffers.
#include "backends/shm/shm_backend.h"

#include "gyre/collectives/shm.h"
#include "gyre/collectives/shm_pool.h"

namespace gyre::core {

void ShmBackend::allreduce(const void* in, void* out, std::size_t count, DataType dt,
                           const Reduction& red, const OpLabel&) {
  // Buffers of gyre::alloc_shared on every rank are reduced straight from
  // one another; the attempt costs a barrier when some rank's is not, so
  // only from a size where that is small beside the copies it can save.
  // Every rank takes the same branch: the size and the pool are alike.
  if (!host_->pool().empty() && count * dtype_size(dt) >= kPoolAllreduceMinBytes &&
      collectives::shm_allreduce_registered(group(), host_->pool(), in, out, count, dt, red.op,
                                            red.prescale, red.postscale)) {
    host_->count_pool_allreduce();
    return;
  }
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
  collectives::shm_allgather(group(), in, out, block_bytes);
}

void ShmBackend::alltoall(const void* in, std::span<const std::size_t> send_bytes, void* out,
                          std::span<const std::size_t> recv_bytes, std::size_t largest_bytes,
                          const OpLabel&) {
  // The number of rounds follows the largest message of any pair: agreed
  // (the plan's, from every rank's splits), so no exchange is needed here.
  collectives::shm_alltoall(group(), in, send_bytes, out, recv_bytes, largest_bytes);
}

void ShmBackend::reducescatter(const void* in, std::span<const std::size_t> counts, void* out,
                               DataType dt, const Reduction& red, const OpLabel&) {
  collectives::shm_reduce_scatter(group(), in, out, counts, dt, red.op, red.prescale,
                                  red.postscale);
}

}  // namespace gyre::core
