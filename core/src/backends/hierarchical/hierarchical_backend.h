// HierarchicalBackend: the host backend when the job spans several hosts
// that each hold the same number (more than one) of ranks. Allreduce is
// hierarchical (collectives/shm.h: reduce-scatter within the host over
// shared memory, an allreduce of each shard among the ranks with the same
// local rank across hosts, an allgather within the host), so each byte
// crosses the network once per host instead of once per rank. Allgather is
// hierarchical too (a ring among the ranks with the same local rank across
// hosts, then an allgather within the host). The network phase of the
// allreduce runs recursive doubling, the ring or Rabenseifner's algorithm
// (GYRE_RABENSEIFNER_ALLREDUCE, cost_model.h). GYRE_HIERARCHICAL_ALLREDUCE and
// GYRE_HIERARCHICAL_ALLGATHER: 1 always, 0 never (the CPU ring backend's
// flat algorithms over the world's transport, which it holds: HostBackend),
// -1 per call by the cost model (cost_model.h), or, with GYRE_AUTOTUNE=1,
// by timing both on the job's first calls of each size (autotune.h). The
// other collectives are
// that ring backend's; its cost model sees this layout (hosts x ranks per
// host).
//
// Set up at init() by the API (api/lifecycle.cc) when the layout allows it and either
// option is not 0.
//
// Thread: the runtime's background thread only.
#pragma once

#include <memory>
#include <vector>

#include "backends/hierarchical/autotune.h"
#include "backends/host_backend.h"
#include "gyre/collectives/shm_host.h"
#include "negotiation/message_tags.h"
#include "runtime/logging.h"

namespace gyre::core {

class HierarchicalBackend final : public HostBackend {
 public:
  // `cost`: the cost model's parameters for this layout (built in, or
  // measured by the link probe).
  HierarchicalBackend(transport::Transport& world, const Options& opt,
                      std::shared_ptr<transport::ShmHost> host,
                      std::shared_ptr<transport::Transport> cross, const LayoutCost& cost,
                      const Logger& log)
      : HostBackend(world, opt, cost),
        world_(world),
        opt_(opt),
        log_(log),
        host_(std::move(host)),
        cross_(std::move(cross)),
        tuner_(kTagData) {}

  const char* name() const override { return "hierarchical"; }

  void allreduce(const void* in, void* out, std::size_t count, DataType dt, const Reduction& red,
                 const OpLabel& what) override;
  void allgather(const void* in, std::span<const std::size_t> block_bytes, void* out,
                 const OpLabel& what) override;
  std::vector<TunedAllreduce> tuned_allreduces() const override { return tuner_.decisions(); }

 private:
  void hierarchical_allreduce(const void* in, void* out, std::size_t count, DataType dt,
                              const Reduction& red, int pieces);
  // world_rank_of_[h * p + l]: the world rank of local rank l on host h,
  // learnt with one small allgather at the first hierarchical allgather.
  const std::vector<int>& placement();
  transport::Transport& world_;
  const Options& opt_;
  const Logger& log_;
  std::shared_ptr<transport::ShmHost> host_;
  std::shared_ptr<transport::Transport> cross_;
  std::vector<int> world_rank_of_;
  std::vector<std::byte> scratch_;
  AllreduceTuner tuner_;  // GYRE_AUTOTUNE
};

}  // namespace gyre::core
