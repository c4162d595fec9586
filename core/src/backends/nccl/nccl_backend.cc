// NcclBackend (see nccl_backend.h): communicator set-up and teardown,
// allreduce and broadcast. The deadline-bounded waits are in
// nccl_backend_impl.h, the other collectives in nccl_collectives.cc.
#include "backends/nccl/nccl_backend.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "gyre/collectives/algorithms.h"
#include "fusion/fusion.h"
#include "backends/nccl/nccl_backend_impl.h"

namespace gyre::core {

namespace {

// Tag of the unique-id broadcast: apart from negotiation (1) and data (2).
constexpr int kTagNcclId = 3;

std::string names_of(const std::vector<Response*>& resps) {
  std::vector<std::string> names;
  for (const Response* r : resps) names.push_back("'" + r->name + "'");
  return fmt::format("{}", fmt::join(names, ", "));
}

std::size_t numel(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return static_cast<std::size_t>(n);
}

}  // namespace

NcclBackend::NcclBackend(transport::Transport& t, const Options& opt, const Logger& log,
                         int device, int local_rank)
    : impl_(std::make_unique<Impl>(t, opt, log)) {
  Impl& m = *impl_;
  std::string why;
  const int count = cuda_device_count(&why);
  if (count <= 0) {
    throw TransportError(fmt::format("NCCL set-up on rank {}: no CUDA device usable ({})",
                                     t.rank(), count < 0 ? why : "0 devices"));
  }
  m.device = device >= 0 ? device : local_rank % count;
  const std::string what = fmt::format("NCCL set-up on rank {} (cuda:{})", t.rank(), m.device);
  check_cuda(cudaSetDevice(m.device), what + ": cudaSetDevice");
  // Blocking on purpose: ordered after earlier work of the legacy default
  // stream, where the caller's tensors are usually produced (header).
  check_cuda(cudaStreamCreateWithFlags(&m.stream, cudaStreamDefault),
             what + ": cudaStreamCreate");
  check_cuda(cudaEventCreateWithFlags(&m.done, cudaEventDisableTiming),
             what + ": cudaEventCreate");

  // Rank 0 makes the id; the ring broadcast runs on this (background)
  // thread like every other transport call.
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (t.rank() == 0) check_nccl(ncclGetUniqueId(&id), what + ": ncclGetUniqueId");
  collectives::RingOptions ro;
  ro.tag = kTagNcclId;
  ro.chunk_bytes = opt.ring_chunk_bytes;
  collectives::ring_broadcast(t, &id, sizeof id, 0, ro);

  // Non-blocking initialisation, so a rank that never joins costs a
  // TimeoutError after the deadline instead of a hang.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&m.comm, t.size(), id, t.rank(), &config);
  m.settle(r, what + ": ncclCommInitRankConfig");
  log.info("NCCL communicator ready: {} ranks, this rank on cuda:{}", t.size(), m.device);
}

NcclBackend::~NcclBackend() = default;  // Impl releases everything

int NcclBackend::device() const { return impl_->device; }

void NcclBackend::allreduce(const std::vector<Response*>& resps, std::vector<Entry>& entries,
                            ReduceOp op, double prescale, double postscale) {
  Impl& m = *impl_;
  const Response& head = *resps.front();
  const DataType dt = head.agreed.dtype;
  const std::string what = fmt::format("allreduce of CUDA tensors [{}]", names_of(resps));
  check_scale(what, dt, prescale, postscale);
  if (!nccl_dtype(dt) || !nccl_op(op)) {
    throw InvalidArgument(fmt::format("{}: no NCCL reduction for {} on {}", what, op_name(op),
                                      dtype_name(dt)));
  }
  check_cuda(cudaSetDevice(m.device), what + ": cudaSetDevice");
  const std::size_t esize = dtype_size(dt);

  if (resps.size() == 1) {
    // Alone: reduce the caller's buffers directly, no fusion copy.
    const std::size_t count = numel(head.agreed.shape);
    const std::size_t bytes = count * esize;
    if (count == 0) return;
    const void* in;
    void* out;
    if (entries[0]) {
      in = entries[0]->in.data;
      out = entries[0]->out.data;
    } else {  // joined: zeros
      out = m.scratch.get(bytes, what);
      check_cuda(cudaMemsetAsync(out, 0, bytes, m.stream), what + ": cudaMemsetAsync");
      in = out;
    }
    if (prescale != 1.0) {
      // Scale a copy (the output), never the caller's input.
      m.copy(out, in, bytes, cudaMemcpyDeviceToDevice, what);
      m.scale(out, count, dt, prescale, what);
      in = out;
    }
    m.all_reduce(in, out, count, dt, op, what);
    m.scale(out, count, dt, postscale, what);
    m.synchronize(what);
    return;
  }

  // Fused: members at 64-byte aligned offsets in the device fusion buffer,
  // zeroed padding (and zeros for joined members) between them.
  const FusedLayout layout = fused_layout(resps);
  const std::vector<std::size_t>& offsets = layout.offsets;
  const std::vector<std::size_t>& sizes = layout.sizes;
  const std::size_t total = layout.total;
  auto* buf = static_cast<std::byte*>(m.fusion.get(total, what));
  check_cuda(cudaMemsetAsync(buf, 0, total, m.stream), what + ": cudaMemsetAsync");
  for (std::size_t i = 0; i < resps.size(); ++i) {
    if (entries[i]) m.copy(buf + offsets[i], entries[i]->in.data, sizes[i],
                           cudaMemcpyDeviceToDevice, what);
  }
  const std::size_t count = total / esize;
  m.scale(buf, count, dt, prescale, what);
  m.all_reduce(buf, buf, count, dt, op, what);
  m.scale(buf, count, dt, postscale, what);
  for (std::size_t i = 0; i < resps.size(); ++i) {
    if (entries[i]) m.copy(entries[i]->out.data, buf + offsets[i], sizes[i],
                           cudaMemcpyDeviceToDevice, what);
  }
  m.synchronize(what);
}

void NcclBackend::broadcast(const Response& resp, Entry& entry) {
  Impl& m = *impl_;
  const std::string what = fmt::format("broadcast of CUDA tensor '{}'", resp.name);
  const std::size_t bytes = resp.agreed.nbytes();
  if (bytes == 0) return;
  check_cuda(cudaSetDevice(m.device), what + ": cudaSetDevice");
  void* buf = entry ? entry->in.data : m.scratch.get(bytes, what);
  m.settle(ncclBroadcast(buf, buf, bytes, ncclUint8, resp.agreed.root, m.comm, m.stream),
           what + ": ncclBroadcast");
  m.synchronize(what);
}

}  // namespace gyre::core
