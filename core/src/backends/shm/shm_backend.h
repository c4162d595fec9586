// ShmBackend: the host backend when every rank of the job is on one host.
// The collectives run over the host's shared-memory group
// (collectives/shm.h: chunks staged through per-rank slots, synchronised by
// counters, each rank reducing its share straight from every slot) instead
// of point-to-point messages; memory calls (zeros, copies) are the CPU
// backend's.
//
// Fusion buffer: when the group has buffers (GYRE_SHM_FUSION=1, the
// default) a fused bucket that fits is packed into this rank's buffer in
// the segment, which every local rank maps, and its allreduce runs on the
// buffers themselves (shm_allreduce_buffers: each rank reduces its share
// from every rank's buffer and writes it into all; no copy into slots and
// back). A bucket larger than the buffer, and every unfused tensor, take the
// CPU backend's private fusion buffer or the caller's memory and
// shm_allreduce through the slots. Every rank asks for the same bucket
// sizes in the same order, so all take the same path.
//
// The group is set up over MPI by the API (ShmHost) and handed to the
// runtime; GYRE_SHM=0 keeps the ring over MPI. A local peer that stops
// coming is a TimeoutError after GYRE_OP_TIMEOUT_S, as a stalled transfer is.
//
// Thread: the runtime's background thread only.
#pragma once

#include <memory>

#include "backends/cpu/cpu_ring_backend.h"
#include "gyre/collectives/shm_host.h"

namespace gyre::core {

class ShmBackend final : public CpuRingBackend {
 public:
  ShmBackend(transport::Transport& t, const Options& opt,
             std::shared_ptr<transport::ShmHost> host)
      : CpuRingBackend(t, opt), host_(std::move(host)) {}

  const char* name() const override { return "shm"; }

  std::byte* fusion_buffer(std::size_t bytes, const OpLabel& what) override;

  void allreduce(const void* in, void* out, std::size_t count, DataType dt, const Reduction& red,
                 const OpLabel& what) override;
  void broadcast(void* buf, std::size_t bytes, int root, const OpLabel& what) override;
  void allgather(const void* in, std::span<const std::size_t> block_bytes, void* out,
                 const OpLabel& what) override;
  void alltoall(const void* in, std::span<const std::size_t> send_bytes, void* out,
                std::span<const std::size_t> recv_bytes, const OpLabel& what) override;
  void reducescatter(const void* in, std::span<const std::size_t> counts, void* out, DataType dt,
                     const Reduction& red, const OpLabel& what) override;

 private:
  collectives::ShmGroup& group() { return host_->group(); }
  std::shared_ptr<transport::ShmHost> host_;
};

}  // namespace gyre::core
