// NcclBackend's internals, shared by its two source files: nccl_backend.cc
// (set-up, memory, allreduce, broadcast) and nccl_collectives.cc (allgather,
// reducescatter, alltoall: the collectives whose result is delivered in host
// memory). Includes nccl.h and cuda_runtime.h: only nccl_*.cc include it.
//
// Thread: the runtime's background thread (as NcclBackend).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "gyre/error.h"
#include "gyre/sizes.h"
#include "backends/nccl/nccl_backend.h"
#include "backends/nccl/nccl_device.h"
#include "backends/nccl/nccl_scale.h"

namespace gyre::core {

inline constexpr std::size_t kNcclAlign = 64;
// Pause between polls of the stream and the communicator. Short, so a
// finished collective is noticed within a few microseconds, but not a busy
// spin that takes a core from the training process.
inline constexpr auto kNcclPollPause = std::chrono::microseconds(20);

// How messages name an operation of this backend.
inline std::string describe(const OpLabel& what) { return what.str() + " (CUDA)"; }

// Integer scaling (average's 1/n, pre/postscale) has no CUDA kernel yet
// (the CPU path truncates as Horovod does: collectives/reduce_kernels.h);
// refused before anything is enqueued, from agreed arguments.
inline void check_scale(const std::string& what, DataType dt, double prescale,
                        double postscale) {
  if (is_floating(dt) || (prescale == 1.0 && postscale == 1.0)) return;
  throw InvalidArgument(fmt::format(
      "{}: average or prescale {} / postscale {} on {} CUDA tensors is not implemented (it is "
      "on CPU tensors); use sum", what, prescale, postscale, dtype_name(dt)));
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
    want = align_up(want, kNcclAlign);
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

struct NcclBackend::Impl {
  transport::Transport& t;
  const Options& opt;
  const Logger& log;
  int device = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;
  DeviceBuffer fusion;   // packed allreduce buckets
  DeviceBuffer zeros;    // joined ranks' contributions
  DeviceBuffer staging;  // padded blocks of allgather, reducescatter, alltoall

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
    zeros.release();
    staging.release();
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
      std::this_thread::sleep_for(kNcclPollPause);
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
      std::this_thread::sleep_for(kNcclPollPause);
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

}  // namespace gyre::core
