// ShmBackend: the host backend when every rank of the job is on one host.
// The collectives run over the host's shared-memory group
// (collectives/shm.h: chunks staged through per-rank slots, synchronised by
// counters, each rank reducing its share straight from every slot) instead
// of point-to-point messages; memory calls (zeros, copies) and Adasum are
// the CPU ring backend's it holds (HostBackend).
//
// Fused buckets are never packed: allreduce_members gathers each chunk of
// the bucket from its members into this rank's slot, reduces it and
// scatters it back into the members while it is still in cache
// (shm_allreduce_pieces), so a fused byte costs what an unfused one does.
// Packing the whole bucket first, even into a buffer in the segment that
// the peers read in place, took one more pass through memory each way
// (docs/benchmarks.md, "Fused buckets chunk by chunk").
//
// A single tensor's allreduce in place on buffers that every rank allocated
// from the host's pool (gyre::alloc_shared, GYRE_SHM_POOL_BYTES) is reduced
// from the buffers themselves, with no copy through the slots
// (shm_allreduce_registered); from kPoolAllreduceMinBytes, below which the
// slots cost little.
//
// The group is set up over MPI by the API (ShmHost) and handed to the
// runtime; GYRE_SHM=0 keeps the ring over MPI. A local peer that stops
// coming is a TimeoutError after GYRE_OP_TIMEOUT_S, as a stalled transfer is.
//
// Thread: the runtime's background thread only.
#pragma once

#include <memory>

#include "backends/host_backend.h"
#include "gyre/collectives/shm_host.h"

namespace gyre::core {

class ShmBackend final : public HostBackend {
 public:
  static constexpr std::size_t kPoolAllreduceMinBytes = 64u << 10;

  ShmBackend(transport::Transport& t, const Options& opt,
             std::shared_ptr<transport::ShmHost> host)
      : HostBackend(t, opt), host_(std::move(host)) {}

  const char* name() const override { return "shm"; }

  void allreduce(const void* in, void* out, std::size_t count, DataType dt, const Reduction& red,
                 const OpLabel& what) override;
  bool reduces_members() const override { return true; }
  void allreduce_members(std::span<const BucketPiece> members, std::size_t count, DataType dt,
                         const Reduction& red, const OpLabel& what) override;
  void broadcast(void* buf, std::size_t bytes, int root, const OpLabel& what) override;
  void allgather(const void* in, std::span<const std::size_t> block_bytes, void* out,
                 const OpLabel& what) override;
  void alltoall(const void* in, std::span<const std::size_t> send_bytes, void* out,
                std::span<const std::size_t> recv_bytes, std::size_t largest_bytes,
                const OpLabel& what) override;
  void reducescatter(const void* in, std::span<const std::size_t> counts, void* out, DataType dt,
                     const Reduction& red, const OpLabel& what) override;

 private:
  collectives::ShmGroup& group() { return host_->group(); }
  std::shared_ptr<transport::ShmHost> host_;
};

}  // namespace gyre::core
