// CpuRingBackend: the Backend for host memory. Each collective is one call
// of its algorithm in collectives/ (allreduce: recursive doubling up to
// GYRE_ALLREDUCE_SMALL_BYTES, above it the ring or Rabenseifner's algorithm
// as GYRE_RABENSEIFNER_ALLREDUCE and the cost model say; ring allgather,
// broadcast and reduce-scatter, pairwise alltoall)
// over the runtime's Transport, on the data tag. Owns the host fusion
// buffer and the zeros joined ranks contribute. The other host backends
// (HostBackend, backends/host_backend.h) are built on one.
//
// Thread: the runtime's background thread only (as every transport call).
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "execution/backend.h"
#include "backends/hierarchical/cost_model.h"
#include "fusion/fusion.h"
#include "gyre/collectives/algorithms.h"
#include "gyre/collectives/transport.h"
#include "gyre/options.h"

namespace gyre::core {

// Adasum over `t` on host memory (the bucket's members each combined on
// their own): CpuRingBackend's, and NcclBackend's once it has staged the
// bucket in host memory.
void adasum_on_host(transport::Transport& t, const void* in, void* out, std::size_t count,
                    DataType dt, const Reduction& red, std::span<const ByteRange> tensors);

class CpuRingBackend final : public Backend {
 public:
  // `layout`: the hosts and ranks per host the allreduce's cost model sees;
  // by default every rank of the world on a host of its own, so that every
  // step of the allreduce may cross the network.
  CpuRingBackend(transport::Transport& t, const Options& opt,
                 std::optional<LayoutCost> layout = std::nullopt);

  const char* name() const override { return "cpu"; }
  bool synchronous() const override { return true; }

  std::byte* fusion_buffer(std::size_t bytes, const OpLabel&) override {
    return fusion_.get(bytes);
  }
  std::byte* zeros(std::size_t bytes, const OpLabel& what) override;
  void copy(void* dst, const void* src, std::size_t bytes, const OpLabel& what) override;
  void zero_ranges(std::byte* buf, std::span<const ByteRange> ranges,
                   const OpLabel& what) override;
  void synchronize(const OpLabel&) override {}

  void allreduce(const void* in, void* out, std::size_t count, DataType dt, const Reduction& red,
                 const OpLabel& what) override;
  void broadcast(void* buf, std::size_t bytes, int root, const OpLabel& what) override;
  void allgather(const void* in, std::span<const std::size_t> block_bytes, void* out,
                 const OpLabel& what) override;
  void alltoall(const void* in, std::span<const std::size_t> send_bytes, void* out,
                std::span<const std::size_t> recv_bytes, std::size_t largest_bytes,
                const OpLabel& what) override;
  void reducescatter(const void* in, std::span<const std::size_t> counts, void* out, DataType dt,
                     const Reduction& red, const OpLabel& what) override;
  // collectives::adasum_allreduce over the transport (also under ShmBackend:
  // its pairwise exchanges are point-to-point).
  void adasum(const void* in, void* out, std::size_t count, DataType dt, const Reduction& red,
              std::span<const ByteRange> tensors, const OpLabel& what) override;

  // The host fusion buffer (its allocation count is a runtime statistic).
  const FusionBuffer& host_fusion_buffer() const { return fusion_; }
  // The ring/recursive-doubling allreduce's options: the runtime's chunk
  // size and small-buffer threshold, the data tag, `red`'s scale factors.
  collectives::AllreduceOptions allreduce_options(const Reduction& red) const;
  // The layout the allreduce's cost model sees (the constructor's).
  const LayoutCost& layout_cost() const { return layout_; }

 private:
  // The algorithm of an allreduce of `bytes` above the small size
  // (flat_uses_rabenseifner on the layout); the same on every rank.
  collectives::LargeAllreduce flat_large_allreduce(std::size_t bytes) const;

  transport::Transport& t_;
  const Options& opt_;
  LayoutCost layout_;
  FusionBuffer fusion_;
  std::vector<std::byte> zeros_;    // joined ranks' contributions
};

}  // namespace gyre::core
