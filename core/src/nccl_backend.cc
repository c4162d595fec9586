// NcclBackend (see nccl_backend.h): communicator set-up, the three
// collectives on CUDA tensors, and the deadline-bounded waits.
#include "nccl_backend.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "gyre/collectives/algorithms.h"
#include "gyre/error.h"
#include "nccl_device.h"
#include "nccl_scale.h"

namespace gyre::core {

namespace {

// Tag of the unique-id broadcast: apart from negotiation (1) and data (2).
constexpr int kTagNcclId = 3;
constexpr std::size_t kAlign = 64;
// Pause between polls of the stream and the communicator. Short, so a
// finished collective is noticed within a few microseconds, but not a busy
// spin that takes a core from the training process.
constexpr auto kPollPause = std::chrono::microseconds(20);

std::size_t align_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

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

// Integer pre/postscale is undefined in gyre (collectives::scale refuses it
// too); refused before anything is enqueued, from agreed arguments.
void check_scale(const std::string& what, DataType dt, double prescale, double postscale) {
  if (is_floating(dt) || (prescale == 1.0 && postscale == 1.0)) return;
  throw InvalidArgument(fmt::format(
      "{}: prescale {} / postscale {} on integer dtype {}: gyre defines scaling only for "
      "floating types", what, prescale, postscale, dtype_name(dt)));
}

// A device buffer that only grows; allocated once for the common case.
struct DeviceBuffer {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  int allocations = 0;

  void* get(std::size_t want, const std::string& what) {
    if (want <= bytes) return ptr;
    if (ptr) check_cuda(cudaFree(ptr), what + ": cudaFree");
    ptr = nullptr;
    bytes = 0;
    want = align_up(want);
    check_cuda(cudaMalloc(&ptr, want), fmt::format("{}: cudaMalloc of {} bytes", what, want));
    bytes = want;
    ++allocations;
    return ptr;
  }
  void release() {
    if (ptr) cudaFree(ptr);  // teardown: nothing to report to
    ptr = nullptr;
    bytes = 0;
  }
};

}  // namespace

struct NcclBackend::Impl {
  transport::Transport& t;
  const Options& opt;
  const Logger& log;
  int device = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;
  DeviceBuffer fusion;   // packed allreduce buckets
  DeviceBuffer scratch;  // joined ranks' stand-ins, allgather staging

  Impl(transport::Transport& tr, const Options& o, const Logger& l)
      : t(tr), opt(o), log(l) {}
  // Here rather than in ~NcclBackend so that a constructor that fails half
  // way still releases what it created.
  ~Impl() {
    cudaSetDevice(device);
    // Abort rather than destroy: ncclCommDestroy may wait for peers that
    // have already left (the runtime stops on every rank in the same round,
    // but not at the same instant). Aborting first also ends any NCCL kernel
    // still waiting for a peer, so freeing the buffers cannot block on it.
    abandon();
    fusion.release();
    scratch.release();
    if (done) cudaEventDestroy(done);
    if (stream) cudaStreamDestroy(stream);
  }

  // The communicator is unusable from here on (the runtime ends the job).
  void abandon() {
    if (comm) ncclCommAbort(comm);
    comm = nullptr;
  }

  std::chrono::steady_clock::time_point deadline() const {
    if (opt.op_timeout_s <= 0) return std::chrono::steady_clock::time_point::max();
    return std::chrono::steady_clock::now() +
           std::chrono::microseconds(static_cast<long>(opt.op_timeout_s * 1e6));
  }

  [[noreturn]] void abort_on_timeout(const std::string& what) {
    // ncclCommAbort returns without waiting for the peers.
    abandon();
    throw TimeoutError(fmt::format(
        "{}: no progress on the GPU for GYRE_OP_TIMEOUT_S={} s (a rank is stuck or gone); "
        "the NCCL communicator was aborted", what, opt.op_timeout_s));
  }

  // A non-blocking communicator may answer ncclInProgress: poll its state
  // until the call has finished, within the deadline.
  void settle(ncclResult_t r, const std::string& what) {
    const auto until = deadline();
    while (r == ncclInProgress) {
      if (std::chrono::steady_clock::now() > until) abort_on_timeout(what);
      std::this_thread::sleep_for(kPollPause);
      check_nccl(ncclCommGetAsyncError(comm, &r), what + ": ncclCommGetAsyncError", comm);
    }
    check_nccl(r, what, comm);
  }

  // Waits for everything enqueued on the stream, watching the communicator
  // for asynchronous errors and the deadline.
  void synchronize(const std::string& what) {
    check_cuda(cudaEventRecord(done, stream), what + ": cudaEventRecord");
    const auto until = deadline();
    while (true) {
      cudaError_t e = cudaEventQuery(done);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) check_cuda(e, what + ": waiting for the GPU");
      ncclResult_t async = ncclSuccess;
      check_nccl(ncclCommGetAsyncError(comm, &async), what + ": ncclCommGetAsyncError", comm);
      if (async != ncclSuccess && async != ncclInProgress) {
        std::string text;
        try {
          check_nccl(async, what + " (asynchronous NCCL error)", comm);
        } catch (const TransportError& err) {
          text = err.what();
        }
        abandon();  // its kernels may be waiting for a peer that failed
        throw TransportError(text);
      }
      if (std::chrono::steady_clock::now() > until) abort_on_timeout(what);
      std::this_thread::sleep_for(kPollPause);
    }
  }

  void copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
            const std::string& what) {
    if (bytes == 0 || dst == src) return;
    check_cuda(cudaMemcpyAsync(dst, src, bytes, kind, stream), what + ": cudaMemcpyAsync");
  }

  void scale(void* buf, std::size_t count, DataType dt, double factor, const std::string& what) {
    check_cuda(launch_scale(buf, count, dt, factor, stream),
               fmt::format("{}: scale kernel (factor {})", what, factor));
  }

  void all_reduce(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op,
                  const std::string& what) {
    settle(ncclAllReduce(in, out, count, *nccl_dtype(dt), *nccl_op(op), comm, stream),
           what + ": ncclAllReduce");
  }
};

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
  std::vector<std::size_t> offsets, sizes;
  std::size_t total = 0;
  for (const Response* r : resps) {
    offsets.push_back(total);
    sizes.push_back(r->agreed.nbytes());
    total += align_up(sizes.back());
  }
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

PaddedGather plan_padded_gather(const Response& resp) {
  const Request& a = resp.agreed;
  PaddedGather g;
  g.row_bytes = dtype_size(a.dtype);
  for (std::size_t i = 1; i < a.shape.size(); ++i) g.row_bytes *= static_cast<std::size_t>(a.shape[i]);
  g.blocks.assign(resp.per_rank.size(), 0);
  for (std::size_t r = 0; r < resp.per_rank.size(); ++r) {
    const std::int64_t k = resp.per_rank[r] ? resp.per_rank[r]->shape[0] : 0;
    g.blocks[r] = static_cast<std::size_t>(k) * g.row_bytes;
    g.padded_block = std::max(g.padded_block, g.blocks[r]);
    g.total_bytes += g.blocks[r];
    g.rows += k;
  }
  return g;
}

void NcclBackend::allgather(const Response& resp, Entry& entry) {
  Impl& m = *impl_;
  const std::string what = fmt::format("allgather of CUDA tensor '{}'", resp.name);
  // Ranks may differ in the first dimension; ncclAllGather needs equal
  // blocks, so every block is padded to the largest and compacted when
  // copied out.
  const PaddedGather g = plan_padded_gather(resp);
  const std::size_t n = g.blocks.size();
  const std::size_t me = static_cast<std::size_t>(m.t.rank());
  if (entry) {
    OwnedTensor& out = entry->state->output;
    out.dtype = resp.agreed.dtype;
    out.shape = entry->request.shape;
    out.shape[0] = g.rows;
    out.data.resize(g.total_bytes);
  }
  if (g.padded_block == 0) return;
  check_cuda(cudaSetDevice(m.device), what + ": cudaSetDevice");
  auto* staging = static_cast<std::byte*>(m.scratch.get(g.padded_block * n, what));
  std::byte* mine = staging + g.padded_block * me;
  if (entry) m.copy(mine, entry->in.data, g.blocks[me], cudaMemcpyDeviceToDevice, what);
  m.settle(ncclAllGather(mine, staging, g.padded_block, ncclUint8, m.comm, m.stream),
           what + ": ncclAllGather");
  // A copy into pageable host memory blocks the calling thread until the
  // stream gets there, beyond any deadline: wait for the gather first.
  m.synchronize(what);
  if (entry) {
    std::byte* host = entry->state->output.data.data();
    for (std::size_t r = 0; r < n; ++r) {
      m.copy(host, staging + g.padded_block * r, g.blocks[r], cudaMemcpyDeviceToHost, what);
      host += g.blocks[r];
    }
    m.synchronize(what);
  }
}

void NcclBackend::reducescatter(const Response& resp, Entry& entry, ReduceOp op,
                                double prescale, double postscale) {
  Impl& m = *impl_;
  const Request& a = resp.agreed;
  const DataType dt = a.dtype;
  const std::string what = fmt::format("reducescatter of CUDA tensor '{}'", resp.name);
  check_scale(what, dt, prescale, postscale);
  if (!nccl_dtype(dt) || !nccl_op(op)) {
    throw InvalidArgument(fmt::format("{}: no NCCL reduction for {} on {}", what, op_name(op),
                                      dtype_name(dt)));
  }
  // The CPU path's split: rank r keeps block r of the first dimension,
  // earlier ranks one extra row when it does not divide evenly.
  // ncclReduceScatter needs equal blocks, so each is padded to the largest
  // (block 0) with zeros, which no op turns into a wrong value for the
  // elements kept: padding is only ever reduced with padding.
  const std::size_t n = static_cast<std::size_t>(m.t.size());
  const std::size_t me = static_cast<std::size_t>(m.t.rank());
  const std::int64_t dim0 = a.shape.empty() ? 1 : a.shape[0];
  std::size_t per_row = 1;
  for (std::size_t i = 1; i < a.shape.size(); ++i) per_row *= static_cast<std::size_t>(a.shape[i]);
  std::vector<std::size_t> counts(n), offsets(n);
  std::size_t at = 0;
  for (std::size_t r = 0; r < n; ++r) {
    const std::int64_t rows =
        dim0 / static_cast<std::int64_t>(n) + (static_cast<std::int64_t>(r) < dim0 % static_cast<std::int64_t>(n) ? 1 : 0);
    counts[r] = static_cast<std::size_t>(rows) * per_row;
    offsets[r] = at;
    at += counts[r];
  }
  const std::size_t esize = dtype_size(dt);
  if (entry) {
    OwnedTensor& out = entry->state->output;
    out.dtype = dt;
    out.shape = a.shape;
    if (!out.shape.empty()) out.shape[0] = static_cast<std::int64_t>(counts[me] / std::max<std::size_t>(per_row, 1));
    out.data.resize(counts[me] * esize);
  }
  const std::size_t largest = counts[0];
  if (largest == 0) return;
  check_cuda(cudaSetDevice(m.device), what + ": cudaSetDevice");
  const std::size_t block = largest * esize;
  auto* staging = static_cast<std::byte*>(m.scratch.get(block * (n + 1), what));
  std::byte* result = staging + block * n;
  check_cuda(cudaMemsetAsync(staging, 0, block * n, m.stream), what + ": cudaMemsetAsync");
  if (entry) {
    const auto* in = static_cast<const std::byte*>(entry->in.data);
    for (std::size_t r = 0; r < n; ++r) {
      m.copy(staging + block * r, in + offsets[r] * esize, counts[r] * esize,
             cudaMemcpyDeviceToDevice, what);
    }
  }
  m.scale(staging, largest * n, dt, prescale, what);
  m.settle(ncclReduceScatter(staging, result, largest, *nccl_dtype(dt), *nccl_op(op), m.comm,
                             m.stream),
           what + ": ncclReduceScatter");
  m.scale(result, largest, dt, postscale, what);
  m.synchronize(what);  // before a copy into pageable memory, which blocks
  if (entry) {
    m.copy(entry->state->output.data.data(), result, counts[me] * esize,
           cudaMemcpyDeviceToHost, what);
    m.synchronize(what);
  }
}

}  // namespace gyre::core
