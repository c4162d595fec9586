// Executor: runs the agreed responses of one round and completes the
// handles of this rank's entries.
//
// Allreduces are planned into buckets (fusion.h) and each bucket becomes one
// Backend::allreduce (Backend::adasum, with the members' ranges, for
// Adasum), on the fusion buffer when it has several members (the
// executor packs and unpacks it with the backend's memory calls) or on the
// caller's buffers when alone; every other collective is planned by
// plan.h and is one Backend call. The backend is the registry's for the
// response's device. Every rank runs the same responses in the same order,
// so the collectives match across ranks. A rank that joined takes part
// without an entry: it contributes zeros (reductions) or no rows
// (allgather) and discards what it receives.
//
// Errors: a response that failed negotiation completes its handle with the
// error and sends nothing. An InvalidArgument thrown by a backend before
// any transfer (its arguments come from agreed metadata, so every rank
// throws it alike) fails that operation only; so does a device kind this
// build has no backend for. Any other exception (TimeoutError,
// TransportError) propagates to the runtime loop, which aborts the job:
// ranks may be half-way through a ring.
//
// Thread: background thread only.
#pragma once

#include <optional>
#include <vector>

#include "execution/backend.h"
#include "fusion/fusion.h"
#include "gyre/collectives/transport.h"
#include "gyre/options.h"
#include "negotiation/coordinator.h"
#include "negotiation/negotiator.h"
#include "negotiation/version_vector.h"
#include "queue/tensor_queue.h"
#include "runtime/logging.h"
#include "runtime/timeline.h"

namespace gyre::core {

class Executor {
 public:
  // `t`: the transport of the runtime's rank (its rank() is this rank's);
  // `backends`: where each bucket's backend comes from (the runtime's
  // BackendRegistry), outliving the executor.
  Executor(transport::Transport& t, const Options& opt, TensorQueue& queue, VersionVector& vv,
           BackendSet& backends, Timeline* timeline, const Logger& log)
      : t_(t), opt_(opt), queue_(queue), vv_(vv), timeline_(timeline), log_(log),
        backends_(backends) {}

  // Runs a round's agreed `responses`, in order: takes this rank's entry of
  // each from the queue (take_entry), then plans, fuses and calls the
  // backends. `agreed_at`: when negotiation of this round finished
  // (timeline). `speculated`: an allreduce of `responses` the round itself
  // reduced (Negotiator), completed from its result with no collective.
  void run(std::vector<Response>& responses, Clock::time_point agreed_at,
           const Speculated* speculated = nullptr);

  // After run() threw an error not known to be alike on every rank: fails
  // the operations of that round that had not completed with that error.
  // Runtime::fatal calls it once it has logged the error, so that a caller
  // ending the process on the exception cannot cut the log short.
  void fail_held();

 private:
  using Entry = std::optional<LocalEntry>;
  // The registry's backend for the bucket's device; InvalidArgument if none.
  Backend& backend_for(const Response& head, const Entry& entry);
  void run_allreduce(Backend& be, std::vector<Response*>& resps, std::vector<Entry>& entries);
  void run_single(Backend& be, Response& resp, Entry& entry);
  // An allreduce the negotiation round reduced (Speculated): the result
  // into the caller's output, postscaled; no collective.
  void complete_speculated(const Response& r, Entry& entry, std::span<const std::byte> result);
  void run_allgather(Backend& be, Response& resp, Entry& entry, const OpLabel& what);
  void run_broadcast(Backend& be, Response& resp, Entry& entry, const OpLabel& what);
  void run_alltoall(Backend& be, Response& resp, Entry& entry, const OpLabel& what);
  void run_reducescatter(Backend& be, Response& resp, Entry& entry, const OpLabel& what);
  void run_fingerprint(Response& resp, Entry& entry);
  void run_resync(Response& resp, Entry& entry);

  void trace(const Entry& e, const char* phase, Clock::time_point a, Clock::time_point b,
             std::size_t bytes, std::size_t bucket_size = 1);

  // Host memory for the result of a collective this rank takes part in
  // without an entry (it joined): written by the backend, never read.
  void* discard(std::size_t bytes) {
    if (discard_.size() < bytes) discard_.resize(bytes);
    return discard_.data();
  }

  transport::Transport& t_;
  const Options& opt_;
  TensorQueue& queue_;
  VersionVector& vv_;
  Timeline* timeline_;
  const Logger& log_;
  BackendSet& backends_;
  std::vector<std::byte> discard_;
  // The failed round's operations, until fail_held() (background thread).
  std::vector<LocalEntry> held_;
  std::exception_ptr held_error_;
};

// This rank's (`rank`) entry for `resp`, taken from `queue`: the queue's
// take_for() with what it needs of the response (this rank's request,
// whether it took part as a joined rank, the latest iteration any rank
// sent); none if this rank takes part without one. Executor::run calls it
// for each response of a round, in order.
std::optional<LocalEntry> take_entry(TensorQueue& queue, const Response& resp, int rank);

// fingerprint_check's comparison: digests[r][i] is rank r's digest of buffer
// i (every rank has names.size()). Returns the buffers whose digests differ,
// groups in ascending digest order. Pure; executor_sync.cc.
std::vector<FingerprintMismatch> find_mismatches(
    const std::vector<std::string>& names, const std::vector<std::vector<std::uint64_t>>& digests);

}  // namespace gyre::core
