// The backends of this build and the one place that knows which exist and
// which serves what: the executor asks it (as its BackendSet,
// execution/backend.h) for the backend of a device kind; the runtime asks it
// whether CUDA tensors can be taken. Host tensors take the CPU ring
// (HostBackend as it is, backends/host_backend.h), or,
// once the runtime has handed it the host layout (connect()), the backend
// that layout calls for: ShmBackend for a group spanning the job,
// HierarchicalBackend for a group per host and a transport across the hosts.
// A backend of another device kind is one more entry in device_backends()
// (registry.cc). The runtime owns the registry (one per runtime).
//
// Device backends are created at first use, on the background thread:
// creating one may be a collective (NCCL's communicator), and every rank
// runs the same responses, so every rank creates it in the same round. One
// registry per runtime, so one per process set (each set has its runtime
// and executor).
#pragma once

#include <memory>
#include <span>
#include <utility>
#include <string>
#include <vector>

#include "execution/backend.h"
#include "backends/host_backend.h"
#include "gyre/collectives/shm_host.h"
#include "gyre/collectives/transport.h"
#include "gyre/gyre.h"
#include "gyre/options.h"
#include "runtime/logging.h"

namespace gyre::core {

namespace backends {

// Whether this build has the NCCL backend (CUDA tensors). Any thread.
bool nccl_built();

// Throws InvalidArgument (naming `what` and `which`) unless `t`, a tensor on
// CUDA, can be used by this build: a backend for CUDA exists, the device
// exists, and the buffer is memory of that device. Which device a rank
// uses is the caller's check (Runtime::claim_cuda_device). Any thread.
void check_cuda_tensor(const std::string& what, const char* which, const TensorView& t);

}  // namespace backends

// What a backend is created with.
struct BackendContext {
  transport::Transport& transport;
  const Options& options;
  const Logger& log;
  // This rank's index among the ranks of its host.
  int local_rank = 0;
  // The device of the first tensor the backend serves; index -1 when that
  // rank has no tensor of its own (it joined): the backend then chooses.
  Device device{};
};

// A backend for one device kind, as registry.cc lists them.
using BackendFactory = std::unique_ptr<Backend> (*)(const BackendContext&);
struct BackendEntry {
  DeviceType device;
  const char* name;
  BackendFactory make;
};
// The backends this build has, beside the host one (CpuRingBackend, which
// every build has and the registry creates at once).
std::span<const BackendEntry> device_backends();

// Where a rank sits among the hosts, as the runtime learned it at start-up
// (api/lifecycle.cc sets the groups up over MPI).
struct HostLayout {
  // This rank's index among the ranks of its host: the CUDA device a rank
  // that joined before enqueueing any CUDA tensor uses.
  int local_rank = 0;
  // The shared-memory group of this rank's host (or of the whole job when
  // it runs on one host); none: host tensors go over the transport.
  std::shared_ptr<transport::ShmHost> shm;
  // With `shm` a group per host: the transport among the ranks of the same
  // local rank on every host.
  std::shared_ptr<transport::Transport> cross;
  // Without `shm`: the number of hosts when every host holds one rank
  // (then the world's transport crosses a host boundary at every hop), 0
  // otherwise.
  int hosts_of_one = 0;
};

class BackendRegistry final : public BackendSet {
 public:
  BackendRegistry(transport::Transport& t, const Options& opt, const Logger& log);
  ~BackendRegistry() override;

  // Chooses the host backend from `layout`: hierarchical with a group per
  // host and a transport across the hosts, shared memory with a group alone,
  // the ring over the transport otherwise (its cost model probed under
  // GYRE_LINK_PROBE=1 when the hosts hold one rank each). Before the
  // background thread starts.
  void connect(HostLayout layout);

  // BackendSet: `device.index`, see BackendContext::device. Background thread.
  Backend* get(Device device) override;
  Backend& host() override { return *host_; }
  const char* host_backend() const override { return host_->name(); }
  const FusionBuffer& host_fusion_buffer() const override { return host_->host_fusion_buffer(); }
  // The host backend's cost-model parameters and where they come from:
  // "built-in", "probed" or "cached" (GYRE_LINK_PROBE, link_probe.h).
  const LayoutCost& host_layout_cost() const { return host_->layout_cost(); }
  const std::string& link_source() const { return link_source_; }
  // GYRE_AUTOTUNE's choices so far (any thread).
  std::vector<TunedAllreduce> tuned_allreduces() const { return host_->tuned_allreduces(); }

 private:
  transport::Transport& t_;
  const Options& opt_;
  const Logger& log_;
  int local_rank_ = 0;
  // The host backend, created at once: the runtime reads its fusion
  // statistics any time.
  std::unique_ptr<HostBackend> host_;
  std::string link_source_ = "built-in";
  // The device backends created so far, by device kind.
  std::vector<std::pair<DeviceType, std::unique_ptr<Backend>>> created_;
};

}  // namespace gyre::core
