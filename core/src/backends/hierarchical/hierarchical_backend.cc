// HierarchicalBackend (hierarchical_backend.h).
#include "backends/hierarchical/hierarchical_backend.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "backends/hierarchical/cost_model.h"
#include "gyre/collectives/algorithms.h"
#include "gyre/collectives/shm.h"
#include "gyre/error.h"
#include "negotiation/message_tags.h"

namespace gyre::core {

void HierarchicalBackend::allreduce(const void* in, void* out, std::size_t count, DataType dt,
                                    const Reduction& red, const OpLabel& what) {
  const LayoutCost& c = ring_.layout_cost();
  const std::size_t nbytes = count * dtype_size(dt);
  const double bytes = static_cast<double>(nbytes);
  // Pieces of the pipelined form: the model's, or GYRE_HIERARCHICAL_PIPELINE's.
  const int pieces = opt_.hierarchical_pipeline == -1
                         ? hierarchical_pieces(c, bytes)
                         : static_cast<int>(std::max(1L, opt_.hierarchical_pipeline));
  // The form: forced, the cost model's, or (GYRE_AUTOTUNE) the tuner's,
  // which times the call.
  bool hierarchical = opt_.hierarchical_allreduce == 1;
  const bool tune = opt_.hierarchical_allreduce == -1 && opt_.autotune == 1;
  if (opt_.hierarchical_allreduce == -1) {
    const bool model = hierarchical_allreduce_s(c, bytes, pieces) <= flat_allreduce_s(c, bytes);
    hierarchical = tune ? tuner_.choose(nbytes, model) : model;
  }
  using Clock = std::chrono::steady_clock;
  const auto start = tune ? Clock::now() : Clock::time_point{};
  if (hierarchical) {
    hierarchical_allreduce(in, out, count, dt, red, pieces);
  } else {
    ring_.allreduce(in, out, count, dt, red, what);
  }
  if (!tune) return;
  const double s = std::chrono::duration<double>(Clock::now() - start).count();
  if (auto t = tuner_.record(world_, nbytes, hierarchical, s); t && world_.rank() == 0) {
    log_.info("autotune: allreduces of {} to {} KiB, {} calls of each form: flat {:.3f} ms "
              "per MiB, hierarchical {:.3f}; {} chosen (the cost model's choice: {})",
              t->min_bytes >> 10, t->min_bytes >> 9, t->trials, t->flat_s_per_mib * 1e3,
              t->hierarchical_s_per_mib * 1e3,
              t->hierarchical ? "hierarchical" : "flat",
              t->model_hierarchical ? "hierarchical" : "flat");
  }
}

void HierarchicalBackend::hierarchical_allreduce(const void* in, void* out, std::size_t count,
                                                 DataType dt, const Reduction& red, int pieces) {
  const LayoutCost& c = ring_.layout_cost();
  const double bytes = static_cast<double>(count * dtype_size(dt));
  // The cross-host allreduce takes no scale factors of its own (see
  // hierarchical_allreduce): those of `red` are passed separately. Its
  // algorithm above the small size follows from a piece's size, the same
  // on every rank.
  collectives::AllreduceOptions cross_opt = ring_.allreduce_options(Reduction{});
  cross_opt.large = cross_uses_rabenseifner(c, bytes / pieces)
                        ? collectives::LargeAllreduce::kRabenseifner
                        : collectives::LargeAllreduce::kRing;
  // A piece at or below the small size that the model gives to
  // Rabenseifner's algorithm rather than recursive doubling.
  if (cross_opt.large == collectives::LargeAllreduce::kRabenseifner &&
      bytes / pieces / c.per_host <= static_cast<double>(cross_opt.small_bytes)) {
    cross_opt.small_bytes = 0;
  }
  collectives::hierarchical_allreduce(host_->group(), *cross_, in, out, count, dt, red.op,
                                      red.prescale, red.postscale, cross_opt,
                                      static_cast<std::size_t>(pieces));
}

const std::vector<int>& HierarchicalBackend::placement() {
  if (!world_rank_of_.empty()) return world_rank_of_;
  const int p = host_->group().size(), hosts = cross_->size(), n = world_.size();
  if (p * hosts != n) {
    throw TransportError("hierarchical allgather: " + std::to_string(hosts) + " hosts x " +
                         std::to_string(p) + " ranks but " + std::to_string(n) + " in the job");
  }
  // Every rank's (host, local rank), in world rank order.
  const int mine[2] = {cross_->rank(), host_->group().rank()};
  std::vector<int> all(2 * static_cast<std::size_t>(n));
  std::vector<std::size_t> bytes(n, sizeof mine);
  collectives::AllgatherOptions o;
  o.tag = kTagData;
  collectives::ring_allgather(world_, mine, all.data(), bytes, o);
  std::vector<int> w(n, -1);
  for (int r = 0; r < n; ++r) {
    const int h = all[2 * r], l = all[2 * r + 1];
    if (h < 0 || h >= hosts || l < 0 || l >= p || w[h * p + l] != -1) {
      throw TransportError("hierarchical allgather: rank " + std::to_string(r) +
                           " reports host " + std::to_string(h) + ", local rank " +
                           std::to_string(l) + ", not a free place of " + std::to_string(hosts) +
                           " x " + std::to_string(p));
    }
    w[h * p + l] = r;
  }
  world_rank_of_ = std::move(w);
  return world_rank_of_;
}

void HierarchicalBackend::allgather(const void* in, std::span<const std::size_t> block_bytes,
                                    void* out, const OpLabel& what) {
  bool hierarchical = opt_.hierarchical_allgather == 1;
  if (opt_.hierarchical_allgather == -1) {
    const LayoutCost& c = ring_.layout_cost();
    double bytes = 0;
    for (auto b : block_bytes) bytes += static_cast<double>(b);
    hierarchical = hierarchical_allgather_s(c, bytes) <= flat_allgather_s(c, bytes);
  }
  if (!hierarchical) {
    ring_.allgather(in, block_bytes, out, what);
    return;
  }
  const std::vector<int>& w = placement();
  collectives::AllgatherOptions o;
  o.chunk_bytes = opt_.ring_chunk_bytes;
  o.tag = kTagData;
  collectives::hierarchical_allgather(host_->group(), *cross_, in, out, block_bytes, w, o,
                                      scratch_);
}

}  // namespace gyre::core
