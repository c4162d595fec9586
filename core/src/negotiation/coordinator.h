// Coordinator: turns the messages of one negotiation round into the ordered
// list of responses every rank runs.
//
// Each rank holds a Coordinator and feeds it the same gathered messages in
// the same round, so every rank computes the same pending table, the same
// consistency errors and the same responses in the same order without a
// coordinating rank (see docs/architecture.md). A tensor is ready once every
// rank that has not joined submitted it; ready tensors are ordered by when
// the first request for them arrived (round, then rank, then position in
// that rank's message), which does not depend on the order in which each
// rank enqueued them.
//
// Thread: background thread only; pure computation, no transport.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "negotiation/message.h"
#include "negotiation/response_cache.h"

namespace gyre::core {

struct Response {
  std::string name;
  Collective collective = Collective::kAllreduce;
  Request agreed;  // the request of the lowest submitting rank
  std::vector<std::optional<Request>> per_rank;
  std::vector<bool> joined;  // joined ranks that take part without a request
  int contributors = 0;      // ranks that submitted a request
  ErrorKind error_kind = ErrorKind::kNone;
  std::string error;
  Clock::time_point first_seen{};  // when this rank saw the first request

  bool ok() const { return error_kind == ErrorKind::kNone; }
  bool any_joined() const;
  // The contributors and the joined ranks (which contribute zeros): what an
  // average divides by, as Horovod's join defines it.
  int ranks_taking_part() const;
};

struct RoundOutcome {
  std::vector<Response> responses;
  int shutdown_rank = -1;             // lowest rank that asked to shut down
  std::optional<int> join_completed;  // every rank joined: the last to join
};

class Coordinator {
 public:
  // One name's requests not yet answered. per_rank[r] is rank r's oldest;
  // a rank's later requests of the name (after a failure it announced, it
  // may enqueue the name again before the others answered) wait in
  // later[r] and never replace an earlier one: each request is answered
  // by the response of its own iteration.
  struct Pending {
    std::uint64_t arrival = 0;  // order of first arrival (round, rank, position)
    Clock::time_point first_seen{};
    std::vector<std::optional<Request>> per_rank;
    std::vector<std::deque<Request>> later;  // empty until a rank has a later request
  };

  Coordinator(int size, long max_version_lag, double stall_shutdown_s)
      : size_(size), max_lag_(max_version_lag), stall_shutdown_s_(stall_shutdown_s),
        joined_(static_cast<std::size_t>(size), false) {}

  // msgs[r] is rank r's message of this round. Decodes cache hits with
  // `cache` as it was at the start of the round, then updates it with the
  // successful responses in order.
  RoundOutcome process(const std::vector<RoundMessage>& msgs, ResponseCache& cache,
                       Clock::time_point now);
  // The same where every rank's message is `each` (a log-depth round's
  // outcome), without a copy of it per rank.
  RoundOutcome process_alike(const RoundMessage& each, ResponseCache& cache,
                             Clock::time_point now);

  const std::map<std::string, Pending>& pending() const { return pending_; }
  const std::vector<bool>& joined() const { return joined_; }
  int size() const { return size_; }

 private:
  RoundOutcome process_messages(const std::function<const RoundMessage&(int)>& message_of,
                                ResponseCache& cache, Clock::time_point now);
  void add(int rank, Request r, Clock::time_point now);
  Response make_response(const std::string& name, Pending& p) const;
  // Takes the response of `it`'s oldest requests; the name stays pending
  // with its later requests, if any.
  Response answer(std::map<std::string, Pending>::iterator it, Clock::time_point now);
  void check(Response& resp) const;

  int size_;
  long max_lag_;
  double stall_shutdown_s_;
  std::uint64_t next_arrival_ = 0;
  std::map<std::string, Pending> pending_;
  std::vector<bool> joined_;
  std::vector<int> join_order_;
};

}  // namespace gyre::core
