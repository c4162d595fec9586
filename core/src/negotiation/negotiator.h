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
// Rounds in log depth. When nothing is pending in the Coordinator and no
// rank has joined (state every rank holds alike), a round first combines a
// fixed-size vector by dissemination (ceil(log2 n) messages per rank): an
// OR of "needs the full exchange" (a request not in the cache, a flag, a
// stall failure, a cache hit held too long), the min and max of the
// committed steps, and the AND and OR of the cache-hit bits. If no rank
// needs the full exchange and every rank is at the same step, that is the
// whole round: the operations whose bits every rank set run (a grouped
// allreduce only with all its members), in slot order, and each rank keeps
// its other hits for the next round (Horovod's response cache works the
// same way). Otherwise the round goes on with the full exchange below, as
// if the log-depth step had not happened. A hit held longer than
// hold_limit_s asks for the full exchange, so that the Coordinator (and
// its stall inspector) sees an operation some rank never submits (the
// limit is each hit's own: a rank that is always one operation ahead holds
// a different one each round and never reaches it).
//
// A small allreduce rides in the log-depth round (speculation): a rank
// whose hits include a cached allreduce of at most speculate_bytes of host
// memory (no group, not Adasum) puts the lowest such slot in the vector and
// its input (prescaled) as the vector's tail, and the combine reduces the
// inputs of ranks that put the same slot (any other mix marks the
// speculation void and drops the tail, which is then not sent on: the
// vector's length varies, and the dissemination sends messages of unknown
// length, Transport::isend_message). If every rank put the
// same slot and the round decides that operation, its result is already
// on every rank: the executor completes it from the vector and runs no
// collective (one exchange per small operation instead of two). The
// combine must then give the same bits on every rank whatever the values:
// in pairs (SpeculationOrder::kPairs) only where the dissemination is
// recursive doubling (a power of two of ranks, or of hosts in two tiers),
// which combines each pair lower rank first on both partners, as
// recursive_doubling_allreduce does; in rank order (kRankOrder) for any
// number of ranks, each rank's input gathered at its own place and reduced
// on every rank in rank order. Which order is the backend's (so that a
// call's bits do not depend on whether the round caught it) is the
// runtime's decision (Runtime::speculation()).
//
// In two tiers across hosts (set_host_tier): the log-depth vector is
// combined within each host over shared memory first (no messages), then
// by dissemination among one rank per host (local rank 0, over its
// cross-host transport: ceil(log2 hosts) messages), and handed back to the
// host's other ranks over shared memory, which send nothing. The full
// exchange stays over every rank.
//
// Thread: background thread only (round() is a collective: every rank of the
// transport calls it in the same sequence).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <optional>
#include <string>
#include <vector>

#include "gyre/collectives/algorithms.h"
#include "gyre/collectives/counting_transport.h"
#include "gyre/collectives/shm.h"
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
  bool log_depth = true;               // try the log-depth round (see above)
  double hold_limit_s = 1.0;           // longest a cache hit waits outside the Coordinator
  std::size_t speculate_bytes = 16u << 10;  // largest allreduce run in the round itself; 0: off
};

// How the round reduces a speculated input (see above): kPairs in the
// dissemination itself, each pair lower rank first (recursive doubling's
// order; the vector carries one input); kRankOrder by gathering every
// rank's input (the vector carries N, at most 4 KiB in all) and reducing
// them on every rank in rank order, rank 0's with rank 1's first, as the
// shared-memory allreduce does.
enum class SpeculationOrder { kPairs, kRankOrder };

// The input of a cached allreduce for the round to speculate on: copies the
// operation's input, prescaled, into `out` (exactly its bytes) and returns
// true; false when this rank cannot (no such entry in host memory).
using SpeculationSource = std::function<bool(const Request&, std::span<std::byte> out)>;

// An allreduce the round itself reduced (see above): its name and result,
// before postscale (and an average's division).
struct Speculated {
  std::string name;
  std::vector<std::byte> result;
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
  std::optional<Speculated> speculated;  // one of `responses`, already reduced
};

class Negotiator {
 public:
  Negotiator(transport::Transport& t, const NegotiatorOptions& opt, VersionVector& vv);

  // Log-depth rounds in two tiers (see above): `local` is this rank's host
  // group, `cross` its transport among the ranks of its local rank on every
  // host (only local rank 0 uses it here; `hosts` = cross.size()). Before
  // the first round, on every rank of the job or on none; both must outlive
  // the Negotiator. The background thread uses `local` and `cross` for
  // collectives too, never at the same time.
  void set_host_tier(collectives::ShmGroup& local, transport::Transport& cross);
  // The hosts of the two-tier rounds; 0 when rounds are not tiered.
  int tier_hosts() const { return local_ ? tier_hosts_ : 0; }

  // Where the round's speculation takes its inputs (see above); without
  // one, no round speculates. Before the first round, on every rank.
  // `max_bytes` caps the options' speculate_bytes for this order (rank
  // order: the inputs the runtime's shared-memory allreduce reduces all on
  // rank 0).
  void set_speculation_source(SpeculationSource source,
                              SpeculationOrder order = SpeculationOrder::kPairs,
                              std::size_t max_bytes = SIZE_MAX) {
    source_ = std::move(source);
    order_ = order;
    speculate_max_ = max_bytes;
  }

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
  // Rounds decided by the log-depth exchange alone, and the messages this
  // rank sent in negotiation (both kinds of round). Any thread.
  std::uint64_t log_depth_rounds() const { return log_depth_rounds_.load(); }
  // Allreduces completed by a round's speculation (see above). Any thread.
  std::uint64_t speculated() const { return speculated_.load(); }
  // Whether this rank holds no cache hit for a later round and the
  // Coordinator has no request pending: nothing of this rank's waits for
  // another round. Between rounds, on the thread that runs them.
  bool holds_nothing() const { return held_.empty() && coord_.pending().empty(); }
  std::uint64_t messages_sent() const {
    return counted_.messages() + (leaders_ ? leaders_->messages() : 0);
  }
  std::uint64_t bytes_sent() const { return counted_.bytes() + (leaders_ ? leaders_->bytes() : 0); }

 private:
  // Allgathers the encoded messages: every rank's first kInlineBytes in one
  // ring allgather, the remainders of longer messages in a second.
  std::vector<RoundMessage> exchange(const RoundMessage& mine);
  // A request this rank sent as a cache hit, and since when it has been
  // waiting for the other ranks (the start of the round it was first sent).
  struct Hit {
    Request request;
    Clock::time_point since;
  };
  // The log-depth round; nullopt when the full exchange must follow.
  // `hits[i]` is the request mine.cache_hits[i] stands for; `now` is the
  // round's start.
  std::optional<Agreement> log_depth_round(const RoundMessage& mine, std::vector<Hit>& hits,
                                           Clock::time_point now);
  // Whether every rank tries the log-depth round now (state alike everywhere).
  bool log_depth_possible() const;
  // The words of a speculated input in the log-depth vector: none when the
  // combine of this layout would not give the same bits on every rank
  // (alike on every rank: it follows from the sizes and the options).
  std::size_t speculation_words() const;
  // The log-depth vector combined over every rank: by dissemination over
  // the transport, or in two tiers (set_host_tier).
  // `v` may grow up to max_words and shrink as it is combined (its tail is
  // the speculated input).
  using Combine = collectives::TailCombine;
  void combine_all(std::vector<std::uint64_t>& v, std::size_t max_words, const Combine& combine);

  transport::Transport& t_;
  // t_, counting this rank's negotiation messages: all negotiation traffic
  // goes through it.
  transport::CountingTransport counted_;
  NegotiatorOptions opt_;
  VersionVector& vv_;
  ResponseCache cache_;
  Coordinator coord_;
  std::atomic<std::uint64_t> requests_sent_{0};
  std::atomic<std::uint64_t> cache_hits_sent_{0};
  std::atomic<std::uint64_t> log_depth_rounds_{0};
  std::atomic<std::uint64_t> speculated_{0};
  SpeculationSource source_;
  SpeculationOrder order_ = SpeculationOrder::kPairs;
  std::size_t speculate_max_ = SIZE_MAX;
  // This rank's cache hits that some rank had not submitted in the last
  // log-depth round: sent again first in the next round, in order.
  std::vector<Hit> held_;
  // The two tiers (set_host_tier): the host's group, and local rank 0's
  // cross-host transport, counted like t_.
  collectives::ShmGroup* local_ = nullptr;
  std::unique_ptr<transport::CountingTransport> leaders_;
  int tier_hosts_ = 0;
};

}  // namespace gyre::core
