// BackendRegistry and the build's capabilities (registry.h). The only file
// outside backends/nccl/ that knows whether gyre was built with NCCL.
#include "backends/registry.h"

#include <fmt/format.h>

#include "backends/hierarchical/hierarchical_backend.h"
#include "backends/hierarchical/link_probe.h"
#include "backends/shm/shm_backend.h"

#ifdef GYRE_HAVE_NCCL
#include "backends/nccl/nccl_backend.h"
#endif

namespace gyre {

// Public (gyre.h): for the bindings and C++ jobs.
bool nccl_built() { return core::backends::nccl_built(); }

namespace core {

namespace backends {

#ifdef GYRE_HAVE_NCCL

bool nccl_built() { return true; }

void check_cuda_tensor(const std::string& what, const char* which, const TensorView& t) {
  std::string why;
  const int count = cuda_device_count(&why);
  if (count < 0) {
    throw InvalidArgument(fmt::format("{}: {} is on cuda:{}, but no CUDA device is usable: {}",
                                      what, which, t.device.index, why));
  }
  if (t.device.index < 0 || t.device.index >= count) {
    throw InvalidArgument(fmt::format("{}: {} is on cuda:{}, but this process sees {} CUDA "
                                      "device{}", what, which, t.device.index, count,
                                      count == 1 ? "" : "s"));
  }
  if (t.data != nullptr) {
    // NCCL given a host pointer would fault on the device, far from here.
    std::string other = describe_foreign_pointer(t.data, t.device.index);
    if (!other.empty()) {
      throw InvalidArgument(fmt::format("{}: {} claims cuda:{}, but its buffer is {}", what,
                                        which, t.device.index, other));
    }
  }
}

#else

bool nccl_built() { return false; }

void check_cuda_tensor(const std::string& what, const char* which, const TensorView& t) {
  throw InvalidArgument(fmt::format(
      "{}: {} is on cuda:{}, but this build of gyre was built without NCCL and moves CPU "
      "tensors only", what, which, t.device.index));
}

#endif

}  // namespace backends

namespace {

#ifdef GYRE_HAVE_NCCL
std::unique_ptr<Backend> make_nccl(const BackendContext& c) {
  return std::make_unique<NcclBackend>(c.transport, c.options, c.log, c.device.index,
                                       c.local_rank);
}
#endif

}  // namespace

std::span<const BackendEntry> device_backends() {
  // One line per device backend of this build (the host's backend is
  // chosen by connect(), not listed here).
  static const std::vector<BackendEntry> entries = {
#ifdef GYRE_HAVE_NCCL
      {DeviceType::kCUDA, "nccl", make_nccl},
#endif
  };
  return entries;
}

BackendRegistry::BackendRegistry(transport::Transport& t, const Options& opt, const Logger& log)
    : t_(t), opt_(opt), log_(log), host_(std::make_unique<HostBackend>(t, opt)) {}

BackendRegistry::~BackendRegistry() = default;

void BackendRegistry::connect(HostLayout layout) {
  local_rank_ = layout.local_rank;
  if (layout.shm && layout.cross) {
    LayoutCost cost = default_layout_cost(layout.cross->size(), layout.shm->group().size(),
                                          opt_.allreduce_small_bytes, opt_.rabenseifner_allreduce);
    if (opt_.link_probe == 1) {
      cost = probe_links(t_, *layout.cross, &layout.shm->group(), opt_, log_, cost, link_source_);
    }
    host_ = std::make_unique<HierarchicalBackend>(t_, opt_, std::move(layout.shm),
                                                 std::move(layout.cross), cost, log_);
    log_.debug("host allreduces hierarchical: shared memory within hosts, a ring across them");
  } else if (layout.shm) {
    host_ = std::make_unique<ShmBackend>(t_, opt_, std::move(layout.shm));
    log_.debug("host tensors over shared memory");
  } else if (opt_.link_probe == 1 && layout.hosts_of_one > 1) {
    // Every hop of the flat allreduce crosses hosts: its choice of algorithm
    // per size follows the probed network, measured from the ring backend's
    // built-in parameters of this layout.
    host_ = std::make_unique<HostBackend>(
        t_, opt_, probe_links(t_, t_, nullptr, opt_, log_, host_->layout_cost(), link_source_));
  }
}

Backend* BackendRegistry::get(Device device) {
  if (device.type == DeviceType::kCPU) return host_.get();
  for (auto& [type, backend] : created_) {
    if (type == device.type) return backend.get();
  }
  for (const BackendEntry& e : device_backends()) {
    if (e.device != device.type) continue;
    created_.emplace_back(device.type, e.make({t_, opt_, log_, local_rank_, device}));
    log_.debug("backend {} created for {} tensors", e.name, device_name(device.type));
    return created_.back().second.get();
  }
  return nullptr;
}

}  // namespace core
}  // namespace gyre
