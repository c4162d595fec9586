// NcclBackend: the GPU path. Collectives on CUDA tensors run through NCCL on
// one gyre-owned CUDA stream; CPU tensors keep the ring over the transport.
//
// Ownership: the Executor creates one NcclBackend lazily, at the first
// agreed response on CUDA tensors (every rank runs the same responses, so
// every rank creates it in the same round), and owns it until the runtime
// stops. The backend owns the NCCL communicator, the stream, an event and
// the device fusion and scratch buffers. Creating the communicator is a
// collective: rank 0 asks NCCL for a unique id and ring_broadcasts it over
// the runtime's transport, then every rank joins with a non-blocking
// ncclCommInitRankConfig polled against the deadline.
//
// What runs on CUDA tensors: allreduce (fused or single; sum, min, max,
// product; average as a sum with the 1/contributors folded into the
// postscale, so joined ranks are not counted; pre/postscale by a kernel),
// broadcast and allgather (first dimensions may differ: blocks are padded to
// the largest for ncclAllGather and compacted when copied out; the result is
// delivered in host memory, Handle::output()), reducescatter (padded
// blocks likewise; result in host memory) and alltoall (grouped
// ncclSend/ncclRecv; result in host memory). fingerprint_check and resync
// are refused at enqueue (operations.cc).
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
// This header names no CUDA or NCCL type: the runtime includes it in every
// build. Everything declared here is defined only when gyre is
// built with NCCL (GYRE_HAVE_NCCL, see nccl_backend.cc).
//
// Thread: the runtime's background thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "negotiation/coordinator.h"
#include "gyre/collectives/transport.h"
#include "gyre/options.h"
#include "runtime/logging.h"
#include "queue/tensor_queue.h"

namespace gyre::core {

// CUDA devices visible to this process, or -1 with *why set to the CUDA
// runtime's error (no driver, no device, ...). Any thread.
int cuda_device_count(std::string* why);
// Empty when `data` is device (or managed) memory of CUDA device `device`;
// otherwise what it is instead ("host memory", "memory of cuda:1", or the
// CUDA error). Any thread.
std::string describe_foreign_pointer(const void* data, int device);

// The layout of an allgather on CUDA: ncclAllGather moves equal blocks, so
// each rank's rows (blocks[r] bytes; joined ranks 0) travel padded to the
// largest block and are compacted when copied out (total_bytes, rows).
struct PaddedGather {
  std::size_t row_bytes = 0;
  std::vector<std::size_t> blocks;
  std::size_t padded_block = 0;
  std::size_t total_bytes = 0;
  std::int64_t rows = 0;
};
PaddedGather plan_padded_gather(const Response& resp);

class NcclBackend {
 public:
  using Entry = std::optional<LocalEntry>;

  // `device`: the CUDA device of this rank's tensors, or -1 (a joined rank
  // with no CUDA tensor yet): then local_rank modulo the device count.
  NcclBackend(transport::Transport& t, const Options& opt, const Logger& log, int device,
              int local_rank);
  ~NcclBackend();
  NcclBackend(const NcclBackend&) = delete;
  NcclBackend& operator=(const NcclBackend&) = delete;

  // One bucket of agreed allreduces (one member: reduced in the caller's
  // buffers; several: packed into the device fusion buffer). `op` is the
  // effective op (never kAverage), the scales the effective ones.
  void allreduce(const std::vector<Response*>& resps, std::vector<Entry>& entries, ReduceOp op,
                 double prescale, double postscale);
  void broadcast(const Response& resp, Entry& entry);
  void allgather(const Response& resp, Entry& entry);
  // The CPU path's row split (earlier ranks one extra row); blocks padded
  // to the largest for ncclReduceScatter. Result in host memory.
  void reducescatter(const Response& resp, Entry& entry, ReduceOp op, double prescale,
                     double postscale);
  // Grouped ncclSend/ncclRecv; result in host memory.
  void alltoall(const Response& resp, Entry& entry);

  int device() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gyre::core
