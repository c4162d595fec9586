// The backends of this build and the one place that knows which exist: the
// executor asks it for the backend of a device kind; the API and the
// bindings ask it whether CUDA tensors can be taken. Host tensors take
// CpuRingBackend, or ShmBackend / HierarchicalBackend once the runtime has
// set up the host's shared-memory group (use_shared_memory,
// use_hierarchical); a backend of another device kind is one more entry in
// device_backends() (registry.cc).
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

#include "backends/backend.h"
#include "backends/cpu/cpu_ring_backend.h"
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

class BackendRegistry {
 public:
  BackendRegistry(transport::Transport& t, const Options& opt, const Logger& log);
  ~BackendRegistry();

  // The backend for tensors on `device.type`, created now if this is the
  // first use (`device.index`: see BackendContext::device), or nullptr if
  // this build has none for that device kind. Background thread.
  Backend* get(Device device);
  // The host backend (always present).
  CpuRingBackend& cpu() { return *cpu_; }
  const CpuRingBackend& cpu() const { return *cpu_; }

  void set_local_rank(int r) { local_rank_ = r; }
  // Host tensors go over the host's shared-memory group (ShmBackend) from
  // now on. Before the background thread starts.
  void use_shared_memory(std::shared_ptr<transport::ShmHost> host);
  // Host tensors' allreduces go hierarchically over each host's group and
  // `cross` (HierarchicalBackend). Before the background thread starts.
  void use_hierarchical(std::shared_ptr<transport::ShmHost> host,
                        std::shared_ptr<transport::Transport> cross);

 private:
  transport::Transport& t_;
  const Options& opt_;
  const Logger& log_;
  int local_rank_ = 0;
  // Created at once: the runtime reads its fusion statistics any time.
  std::unique_ptr<CpuRingBackend> cpu_;
  // The device backends created so far, by device kind.
  std::vector<std::pair<DeviceType, std::unique_ptr<Backend>>> created_;
};

}  // namespace gyre::core
