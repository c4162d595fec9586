// Negotiator: one negotiation round of one group of ranks, from this rank's
// new requests to the ordered list of responses every rank runs.
//
// It owns what negotiation needs and nothing else: the framing of a round
// (encode this rank's RoundMessage, allgather every rank's bytes over the
// transport on its own tag, decode), the response cache (which turns a
// repeated request into one bit), the Coordinator (the decisions), and the
// refresh of the version vector from the steps the messages carry. It keeps
// no global state: a process set gets a Negotiator of its own on its own
// transport.
//
// Thread: background thread only (round() is a collective: every rank of the
// transport calls it in the same sequence).
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gyre/collectives/transport.h"
#include "negotiation/coordinator.h"
#include "negotiation/message.h"
#include "negotiation/response_cache.h"
#include "negotiation/version_vector.h"

namespace gyre::core {

struct NegotiatorOptions {
  std::size_t cache_capacity = 1024;   // response cache entries; 0: off
  long max_version_lag = 0;            // see Coordinator
  double stall_shutdown_s = 0.0;       // quoted in stall failures
  std::size_t chunk_bytes = 256u << 10;  // ring chunk of the allgathers
  int tag = 1;                         // message tag of negotiation traffic
};

// What this rank says in a round besides its requests.
struct RoundFlags {
  bool shutdown = false;
  bool joined = false;
  std::vector<std::string> stall_failures;  // rank 0's stall inspector
};

// What one round agreed, the same on every rank.
struct Agreement {
  std::vector<Response> responses;
  int shutdown_rank = -1;             // lowest rank that asked to shut down
  std::optional<int> join_completed;  // every rank joined: the last to join
  bool idle = false;                  // no rank said anything
  Clock::time_point agreed_at{};
};

class Negotiator {
 public:
  Negotiator(transport::Transport& t, const NegotiatorOptions& opt, VersionVector& vv);

  // Sends `fresh` (this rank's requests enqueued since the previous round,
  // or announced as failed) and `flags`, receives every rank's, and returns
  // the agreed responses in the order every rank runs them. Throws
  // TransportError for a malformed message (naming the peer) and whatever
  // the transport throws; either ends the job.
  Agreement round(std::vector<Request> fresh, RoundFlags flags);

  const Coordinator& coordinator() const { return coord_; }
  const ResponseCache& cache() const { return cache_; }
  // This rank's valid requests so far: sent in full, and sent as a cache
  // bit (announced failures are not counted). Any thread.
  std::uint64_t requests_sent() const { return requests_sent_.load(); }
  std::uint64_t cache_hits_sent() const { return cache_hits_sent_.load(); }

 private:
  // Allgathers the encoded messages: every rank's first kInlineBytes in one
  // ring allgather, the remainders of longer messages in a second.
  std::vector<RoundMessage> exchange(const RoundMessage& mine);

  transport::Transport& t_;
  NegotiatorOptions opt_;
  VersionVector& vv_;
  ResponseCache cache_;
  Coordinator coord_;
  std::atomic<std::uint64_t> requests_sent_{0};
  std::atomic<std::uint64_t> cache_hits_sent_{0};
};

}  // namespace gyre::core
