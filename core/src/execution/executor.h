// Executor: runs the agreed responses of one round and completes the
// handles of this rank's entries.
//
// Allreduces are planned into buckets (fusion.h) and each bucket becomes one
// ring_allreduce; every other collective is one call of its algorithm.
// Every rank runs the same responses in the same order, so the collectives
// match across ranks. A rank that joined takes part without an entry: it
// contributes zeros (reductions) or no rows (allgather) from scratch memory
// and discards what it receives.
//
// Errors: a response that failed negotiation completes its handle with the
// error and sends nothing. An InvalidArgument thrown by an algorithm before
// any transfer (its arguments come from agreed metadata, so every rank
// throws it alike) fails that operation only. Any other exception from the
// transport (TimeoutError, TransportError) propagates to the runtime loop,
// which aborts the job: ranks may be half-way through a ring.
//
// Thread: background thread only.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "negotiation/coordinator.h"
#include "fusion/fusion.h"
#include "gyre/collectives/algorithms.h"
#include "gyre/collectives/transport.h"
#include "gyre/options.h"
#include "runtime/logging.h"
#include "queue/tensor_queue.h"
#include "runtime/timeline.h"
#include "negotiation/version_vector.h"

namespace gyre::core {

class NcclBackend;

class Executor {
 public:
  Executor(transport::Transport& t, const Options& opt, TensorQueue& queue, VersionVector& vv,
           Timeline* timeline, const Logger& log)
      : t_(t), opt_(opt), queue_(queue), vv_(vv), timeline_(timeline), log_(log) {}

  // `agreed_at`: when negotiation of this round finished (timeline).
  void run(std::vector<Response>& responses, Clock::time_point agreed_at);

  const FusionBuffer& fusion_buffer() const { return fusion_; }
  // This rank's index among the ranks of its host: the CUDA device a rank
  // that joined before enqueueing any CUDA tensor uses. Set before the
  // background thread starts.
  void set_local_rank(int r) { local_rank_ = r; }

 private:
  using Entry = std::optional<LocalEntry>;
  void run_allreduce_bucket(std::vector<Response*>& resps, std::vector<Entry>& entries);
  void run_single(Response& resp, Entry& entry);
  void run_allgather(Response& resp, Entry& entry);
  void run_broadcast(Response& resp, Entry& entry);
  void run_alltoall(Response& resp, Entry& entry);
  void run_reducescatter(Response& resp, Entry& entry);
  void run_fingerprint(Response& resp, Entry& entry);
  void run_resync(Response& resp, Entry& entry);
  // Responses on CUDA tensors: through NcclBackend (nccl_backend.h), or
  // refused in a build without NCCL.
  void run_cuda(std::vector<Response*>& resps, std::vector<Entry>& entries);

  std::byte* scratch(std::size_t bytes);
  // The collectives' options from opt_, on the data tag.
  collectives::RingOptions ring_options() const;
  void trace(const Entry& e, const char* phase, Clock::time_point a, Clock::time_point b,
             std::size_t bytes, std::size_t bucket_size = 1);

  transport::Transport& t_;
  const Options& opt_;
  TensorQueue& queue_;
  VersionVector& vv_;
  Timeline* timeline_;
  const Logger& log_;
  FusionBuffer fusion_;
  std::vector<std::byte> scratch_;  // joined ranks' stand-in buffers
  int local_rank_ = 0;
  // Created at the first CUDA response (GYRE_HAVE_NCCL builds only). A
  // shared_ptr so that this header needs no complete NcclBackend type and
  // no build-dependent members.
  std::shared_ptr<NcclBackend> nccl_;
};

}  // namespace gyre::core
