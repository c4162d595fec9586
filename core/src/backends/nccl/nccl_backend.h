// NcclBackend: the Backend for CUDA tensors (backend.h). Collectives run
// through NCCL on one gyre-owned CUDA stream; CPU tensors keep the ring
// over the transport (CpuRingBackend).
//
// Ownership: the BackendRegistry creates one NcclBackend lazily, at the
// first agreed response on CUDA tensors (every rank runs the same responses,
// so every rank creates it in the same round), and owns it until the
// runtime stops. The backend owns the NCCL communicator, the stream, an
// event and the device fusion, zeros and staging buffers. Creating the
// communicator is a collective: rank 0 asks NCCL for a unique id and
// ring_broadcasts it over the runtime's transport, then every rank joins
// with a non-blocking ncclCommInitRankConfig polled against the deadline.
//
// What runs: allreduce (sum, min, max, product; the executor folds average
// into the postscale; pre/postscale by a kernel, on a copy, never on the
// caller's input), broadcast, allgather (blocks padded to the largest for
// ncclAllGather and compacted when copied out), reducescatter (blocks padded
// likewise) and alltoall (grouped ncclSend/ncclRecv). The results of the
// last three are delivered in host memory (Handle::output()).
// fingerprint_check and resync are refused at enqueue (operations.cc).
//
// Synchronisation: gyre's stream is a blocking stream (not
// cudaStreamNonBlocking), so the work it is given is ordered after all work
// enqueued earlier on the device's legacy default stream: tensors produced
// there (PyTorch's default stream) need no further synchronisation. Tensors
// produced on another stream must be ready before enqueue (synchronise that
// stream, or make the legacy default stream wait for it, as a DLPack export
// with stream=1 does). A handle completes only after gyre's stream has
// finished with the caller's buffers.
//
// Errors: every CUDA and NCCL status is checked at the call and turned into
// TransportError naming the call, the error string and the tensors. A wait
// that makes no progress for GYRE_OP_TIMEOUT_S aborts the communicator and
// throws TimeoutError. Both propagate to the runtime loop, which ends the job
// (ranks may be half-way through a collective). An InvalidArgument (integer
// pre/postscale) is thrown before anything is enqueued, from agreed
// arguments, so alike on every rank.
//
// This header names no CUDA or NCCL type. Only backends/registry.cc (in
// NCCL builds) and the GPU tests include it; it is compiled only when gyre
// is built with NCCL.
//
// Thread: the runtime's background thread only.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "execution/backend.h"
#include "gyre/collectives/transport.h"
#include "gyre/options.h"
#include "runtime/logging.h"

namespace gyre::core {

// CUDA devices visible to this process, or -1 with *why set to the CUDA
// runtime's error (no driver, no device, ...). Any thread.
int cuda_device_count(std::string* why);
// Empty when `data` is device (or managed) memory of CUDA device `device`;
// otherwise what it is instead ("host memory", "memory of cuda:1", or the
// CUDA error). Any thread.
std::string describe_foreign_pointer(const void* data, int device);

class NcclBackend final : public Backend {
 public:
  // `device`: the CUDA device of this rank's tensors, or -1 (a joined rank
  // with no CUDA tensor yet): then local_rank modulo the device count.
  NcclBackend(transport::Transport& t, const Options& opt, const Logger& log, int device,
              int local_rank);
  ~NcclBackend() override;
  NcclBackend(const NcclBackend&) = delete;
  NcclBackend& operator=(const NcclBackend&) = delete;

  const char* name() const override { return "nccl"; }
  bool synchronous() const override { return false; }

  std::byte* fusion_buffer(std::size_t bytes, const OpLabel& what) override;
  std::byte* zeros(std::size_t bytes, const OpLabel& what) override;
  void copy(void* dst, const void* src, std::size_t bytes, const OpLabel& what) override;
  void zero_ranges(std::byte* buf, std::span<const ByteRange> ranges,
                   const OpLabel& what) override;
  void synchronize(const OpLabel& what) override;

  void allreduce(const void* in, void* out, std::size_t count, DataType dt, const Reduction& red,
                 const OpLabel& what) override;
  void broadcast(void* buf, std::size_t bytes, int root, const OpLabel& what) override;
  // NCCL has no Adasum: the bucket is staged through host memory and
  // combined by the CPU algorithm over the runtime's transport.
  void adasum(const void* in, void* out, std::size_t count, DataType dt, const Reduction& red,
              std::span<const ByteRange> tensors, const OpLabel& what) override;
  void allgather(const void* in, std::span<const std::size_t> block_bytes, void* out,
                 const OpLabel& what) override;
  void alltoall(const void* in, std::span<const std::size_t> send_bytes, void* out,
                std::span<const std::size_t> recv_bytes, std::size_t largest_bytes,
                const OpLabel& what) override;
  void reducescatter(const void* in, std::span<const std::size_t> counts, void* out, DataType dt,
                     const Reduction& red, const OpLabel& what) override;

  int device() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gyre::core
