// HierarchicalBackend: the host backend when the job spans several hosts
// that each hold the same number (more than one) of ranks. Allreduce is
// hierarchical (collectives/shm.h: reduce-scatter within the host over
// shared memory, an allreduce of each shard among the ranks with the same
// local rank across hosts, an allgather within the host), so each byte
// crosses the network once per host instead of once per rank; the other
// collectives are the CPU backend's rings over the world's transport.
//
// Set up at init() by the API (api.cc) when GYRE_HIERARCHICAL_ALLREDUCE
// asks for it (or, by default, whenever the layout allows it).
//
// Thread: the runtime's background thread only.
#pragma once

#include <memory>

#include "backends/cpu/cpu_ring_backend.h"
#include "gyre/collectives/shm_host.h"

namespace gyre::core {

class HierarchicalBackend final : public CpuRingBackend {
 public:
  HierarchicalBackend(transport::Transport& world, const Options& opt,
                      std::shared_ptr<transport::ShmHost> host,
                      std::shared_ptr<transport::Transport> cross)
      : CpuRingBackend(world, opt), host_(std::move(host)), cross_(std::move(cross)) {}

  const char* name() const override { return "hierarchical"; }

  void allreduce(const void* in, void* out, std::size_t count, DataType dt, const Reduction& red,
                 const OpLabel& what) override;

 private:
  std::shared_ptr<transport::ShmHost> host_;
  std::shared_ptr<transport::Transport> cross_;
};

}  // namespace gyre::core
