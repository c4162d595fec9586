// HostBackend: a backend for host tensors composed on the CPU ring backend
// (backends/cpu/): the memory calls, and every collective a host backend
// does not run its own way, go to the CpuRingBackend it holds. Used as it
// is, it is the ring over the runtime's Transport ("cpu"); ShmBackend
// (backends/shm/) and HierarchicalBackend (backends/hierarchical/) override
// the collectives they run over shared memory. BackendRegistry holds the
// host backend as one of these.
//
// Thread: the runtime's background thread only.
#pragma once

#include <optional>

#include "backends/cpu/cpu_ring_backend.h"
#include "backends/hierarchical/autotune.h"

namespace gyre::core {

class HostBackend : public Backend {
 public:
  HostBackend(transport::Transport& t, const Options& opt,
              std::optional<LayoutCost> layout = std::nullopt)
      : ring_(t, opt, layout) {}

  const char* name() const override { return ring_.name(); }
  bool synchronous() const final { return true; }

  std::byte* fusion_buffer(std::size_t bytes, const OpLabel& what) final {
    return ring_.fusion_buffer(bytes, what);
  }
  std::byte* zeros(std::size_t bytes, const OpLabel& what) final {
    return ring_.zeros(bytes, what);
  }
  void copy(void* dst, const void* src, std::size_t bytes, const OpLabel& what) final {
    ring_.copy(dst, src, bytes, what);
  }
  void zero_ranges(std::byte* buf, std::span<const ByteRange> ranges,
                   const OpLabel& what) final {
    ring_.zero_ranges(buf, ranges, what);
  }
  void synchronize(const OpLabel&) final {}

  void allreduce(const void* in, void* out, std::size_t count, DataType dt, const Reduction& red,
                 const OpLabel& what) override {
    ring_.allreduce(in, out, count, dt, red, what);
  }
  void broadcast(void* buf, std::size_t bytes, int root, const OpLabel& what) override {
    ring_.broadcast(buf, bytes, root, what);
  }
  void allgather(const void* in, std::span<const std::size_t> block_bytes, void* out,
                 const OpLabel& what) override {
    ring_.allgather(in, block_bytes, out, what);
  }
  void alltoall(const void* in, std::span<const std::size_t> send_bytes, void* out,
                std::span<const std::size_t> recv_bytes, std::size_t largest_bytes,
                const OpLabel& what) override {
    ring_.alltoall(in, send_bytes, out, recv_bytes, largest_bytes, what);
  }
  void reducescatter(const void* in, std::span<const std::size_t> counts, void* out, DataType dt,
                     const Reduction& red, const OpLabel& what) override {
    ring_.reducescatter(in, counts, out, dt, red, what);
  }
  // The ring backend's Adasum in every host backend: its pairwise exchanges
  // are point-to-point.
  void adasum(const void* in, void* out, std::size_t count, DataType dt, const Reduction& red,
              std::span<const ByteRange> tensors, const OpLabel& what) final {
    ring_.adasum(in, out, count, dt, red, tensors, what);
  }

  // The host fusion buffer (its allocation count is a runtime statistic).
  const FusionBuffer& host_fusion_buffer() const { return ring_.host_fusion_buffer(); }
  // The cost model's parameters its choices are made with.
  const LayoutCost& layout_cost() const { return ring_.layout_cost(); }
  // GYRE_AUTOTUNE's choices so far (any thread): only the hierarchical
  // backend has two forms to choose between.
  virtual std::vector<TunedAllreduce> tuned_allreduces() const { return {}; }

 protected:
  CpuRingBackend ring_;
};

}  // namespace gyre::core
