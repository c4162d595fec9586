// NcclBackend (see nccl_backend.h): communicator set-up and teardown, the
// device memory calls, allreduce and broadcast. The deadline-bounded waits
// are in nccl_backend_impl.h, the other collectives in nccl_collectives.cc.
#include "backends/nccl/nccl_backend.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "gyre/collectives/algorithms.h"
#include "backends/cpu/cpu_ring_backend.h"
#include "backends/nccl/nccl_backend_impl.h"
#include "negotiation/message_tags.h"

namespace gyre::core {

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
  collectives::BroadcastOptions bo;
  bo.tag = kTagNcclId;
  bo.chunk_bytes = opt.ring_chunk_bytes;
  collectives::ring_broadcast(t, &id, sizeof id, 0, bo);

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

std::byte* NcclBackend::fusion_buffer(std::size_t bytes, const OpLabel& what) {
  Impl& m = *impl_;
  const std::string w = describe(what);
  check_cuda(cudaSetDevice(m.device), w + ": cudaSetDevice");
  return static_cast<std::byte*>(m.fusion.get(bytes, w));
}

std::byte* NcclBackend::zeros(std::size_t bytes, const OpLabel& what) {
  Impl& m = *impl_;
  const std::string w = describe(what);
  check_cuda(cudaSetDevice(m.device), w + ": cudaSetDevice");
  auto* z = static_cast<std::byte*>(m.zeros.get(bytes, w));
  if (bytes > 0) check_cuda(cudaMemsetAsync(z, 0, bytes, m.stream), w + ": cudaMemsetAsync");
  return z;
}

void NcclBackend::copy(void* dst, const void* src, std::size_t bytes, const OpLabel& what) {
  impl_->copy(dst, src, bytes, cudaMemcpyDeviceToDevice, describe(what));
}

void NcclBackend::zero_ranges(std::byte* buf, std::span<const ByteRange> ranges,
                              const OpLabel& what) {
  if (ranges.empty()) return;
  // One kernel over the whole extent rather than one per gap: the members
  // are copied in afterwards (backend.h).
  const std::size_t begin = ranges.front().offset;
  const std::size_t end = ranges.back().offset + ranges.back().bytes;
  check_cuda(cudaMemsetAsync(buf + begin, 0, end - begin, impl_->stream),
             describe(what) + ": cudaMemsetAsync");
}

void NcclBackend::synchronize(const OpLabel& what) { impl_->synchronize(describe(what)); }

void NcclBackend::allreduce(const void* in, void* out, std::size_t count, DataType dt,
                            const Reduction& red, const OpLabel& what) {
  Impl& m = *impl_;
  const std::string w = describe(what);
  check_scale(w, dt, red.prescale, red.postscale);
  if (!nccl_dtype(dt) || !nccl_op(red.op)) {
    throw InvalidArgument(fmt::format("{}: no NCCL reduction for {} on {}", w, op_name(red.op),
                                      dtype_name(dt)));
  }
  if (count == 0) return;
  check_cuda(cudaSetDevice(m.device), w + ": cudaSetDevice");
  if (red.prescale != 1.0) {
    // Scale a copy (the output), never the caller's input.
    m.copy(out, in, count * dtype_size(dt), cudaMemcpyDeviceToDevice, w);
    m.scale(out, count, dt, red.prescale, w);
    in = out;
  }
  m.all_reduce(in, out, count, dt, red.op, w);
  m.scale(out, count, dt, red.postscale, w);
}

void NcclBackend::broadcast(void* buf, std::size_t bytes, int root, const OpLabel& what) {
  Impl& m = *impl_;
  if (bytes == 0) return;
  const std::string w = describe(what);
  check_cuda(cudaSetDevice(m.device), w + ": cudaSetDevice");
  m.settle(ncclBroadcast(buf, buf, bytes, ncclUint8, root, m.comm, m.stream),
           w + ": ncclBroadcast");
}

void NcclBackend::adasum(const void* in, void* out, std::size_t count, DataType dt,
                         const Reduction& red, std::span<const ByteRange> tensors,
                         const OpLabel& what) {
  Impl& m = *impl_;
  if (count == 0) return;
  const std::string w = describe(what);
  const std::size_t bytes = count * dtype_size(dt);
  check_cuda(cudaSetDevice(m.device), w + ": cudaSetDevice");
  // Staged in host memory: the copies wait for the stream, which orders
  // them after whatever wrote `in` (the fusion buffer's copies).
  std::vector<std::byte> host(2 * bytes);
  m.copy(host.data(), in, bytes, cudaMemcpyDeviceToHost, w);
  m.synchronize(w);
  adasum_on_host(m.t, host.data(), host.data() + bytes, count, dt, red, tensors);
  m.copy(out, host.data() + bytes, bytes, cudaMemcpyHostToDevice, w);
  m.synchronize(w);  // `host` is freed on return
}

}  // namespace gyre::core
