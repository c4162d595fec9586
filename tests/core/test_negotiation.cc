// Unit tests of the Negotiator on its own: ranks as threads over a
// LocalTransport world, no runtime, queue or executor around it.
#include <catch2/catch.hpp>

#include <exception>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "execution/executor.h"
#include "gyre/collectives/local_transport.h"
#include "negotiation/negotiator.h"
#include "negotiator_ranks.h"
#include "queue/tensor_queue.h"
#include "runtime/stall_inspector.h"

using namespace gyre;
using namespace gyre::core;
using gyre::core::test::expect;
using gyre::core::test::on_ranks;

namespace {

Request named(const std::string& name, std::int64_t len) {
  Request r;
  r.name = name;
  r.shape = {len};
  return r;
}

}  // namespace

TEST_CASE("negotiator: every rank gets the same responses, long messages and cache hits",
          "[negotiator]") {
  const int n = 3;
  std::vector<std::vector<std::string>> seen(n);
  on_ranks(n, NegotiatorOptions{}, [&](int r, Negotiator& neg) {
    // Names long enough that the messages exceed the inline block and
    // take the second allgather; each rank enqueues in its own order.
    std::vector<Request> mine;
    for (int i = 0; i < 8; ++i) {
      int k = (i + 3 * r) % 8;
      mine.push_back(named(fmt::format("layer.{}.{}", k, std::string(40, 'x')), k + 1));
    }
    for (auto& q : mine) q.seq = 1;
    std::vector<std::string> order;
    Agreement a = neg.round(mine, {});
    for (const auto& resp : a.responses) {
      expect(resp.ok(), r, resp.error);
      order.push_back(resp.name);
    }
    expect(order.size() == 8, r, "8 responses in round 1");
    // The next submissions of the same requests are cache hits: one bit each.
    for (auto& q : mine) q.seq = 2;
    a = neg.round(mine, {});
    expect(a.responses.size() == 8, r, "8 responses from cache hits");
    for (std::size_t i = 0; i < a.responses.size(); ++i) {
      expect(a.responses[i].name == order[i] && a.responses[i].ok(), r, "the same order");
      expect(a.responses[i].agreed.seq == 2, r, "a hit stands for the next submission");
    }
    expect(neg.cache().size() == 8, r, "8 cached requests");
    a = neg.round({}, {});
    expect(a.idle && a.responses.empty(), r, "an idle round");
    seen[static_cast<std::size_t>(r)] = order;
  });
  CHECK(seen[0] == seen[1]);
  CHECK(seen[1] == seen[2]);
}

TEST_CASE("negotiator: shutdown and version steps travel in the round", "[negotiator]") {
  on_ranks(2, NegotiatorOptions{}, [&](int r, Negotiator& neg) {
    RoundFlags flags;
    flags.shutdown = r == 1;
    Agreement a = neg.round({}, flags);
    expect(a.shutdown_rank == 1, r, "rank 1 asked to shut down");
    expect(!a.idle, r, "a round with a shutdown flag is not idle");
  });
}

TEST_CASE("queue: take_for hands a response its entry, never a later enqueue's", "[queue]") {
  TensorQueue q;
  LocalEntry e;
  e.request = named("t", 4);
  e.state = std::make_shared<OpState>();
  std::vector<LocalEntry> v;
  v.push_back(e);
  q.push(std::move(v));
  Response resp;
  resp.name = "t";
  resp.per_rank.resize(2);
  // Rank 1 joined (no request): no entry of its own.
  resp.per_rank[0] = named("t", 4);
  CHECK_FALSE(take_entry(q, resp, 1));
  // Rank 0's request in this response was a failure it announced: the
  // pending entry "t" is a later enqueue and stays.
  resp.per_rank[0]->error_kind = ErrorKind::kInvalidArgument;
  CHECK_FALSE(take_entry(q, resp, 0));
  CHECK(q.size() == 1);
  resp.per_rank[0]->error_kind = ErrorKind::kNone;
  // The entry is this rank's first submission of "t": a response to
  // another one (an earlier announced failure) does not take it.
  resp.per_rank[0]->seq = 2;
  CHECK_FALSE(take_entry(q, resp, 0));
  resp.per_rank[0]->seq = 1;
  auto got = take_entry(q, resp, 0);
  REQUIRE(got);
  CHECK(got->state == e.state);
  CHECK(q.size() == 0);
}

TEST_CASE("queue: wait_for_work polls for its spin, then sleeps until the deadline",
          "[queue]") {
  using namespace std::chrono_literals;
  TensorQueue q;
  auto push = [&q](const std::string& name) {
    LocalEntry e;
    e.request = named(name, 1);
    e.state = std::make_shared<OpState>();
    std::vector<LocalEntry> v;
    v.push_back(std::move(e));
    q.push(std::move(v));
  };
  // Work enqueued during the spin (or already there) ends the wait: bounds
  // far above the time taken, never below (the machine may be loaded).
  std::thread producer([&] {
    std::this_thread::sleep_for(2ms);
    push("a");
  });
  auto t0 = Clock::now();
  q.wait_for_work(30s, 20s);
  CHECK(Clock::now() - t0 < 20s);
  producer.join();
  CHECK(q.drain_new().size() == 1);
  push("b");  // already there: no wait at all
  t0 = Clock::now();
  q.wait_for_work(30s, 20s);
  CHECK(Clock::now() - t0 < 20s);
  q.drain_new();
  // wake() ends a spin as it ends a sleep.
  std::thread waker([&] {
    std::this_thread::sleep_for(2ms);
    q.wake();
  });
  t0 = Clock::now();
  q.wait_for_work(30s, 20s);
  CHECK(Clock::now() - t0 < 20s);
  waker.join();
  q.drain_new();
  // Nothing comes: the timeout bounds spin and sleep together.
  t0 = Clock::now();
  q.wait_for_work(50ms, 200ms);
  const auto waited = Clock::now() - t0;
  CHECK(waited >= 50ms);
  CHECK(waited < 20s);
}

TEST_CASE("queue: a pending name is refused first and never announced", "[queue]") {
  TensorQueue q;
  LocalEntry e;
  e.request = named("x", 4);
  e.state = std::make_shared<OpState>();
  std::vector<LocalEntry> v;
  v.push_back(e);
  q.push(std::move(v));
  CHECK_THROWS_WITH(q.check_not_pending(named("x", 8)), Catch::Contains("already pending"));
  CHECK_NOTHROW(q.check_not_pending(named("y", 8)));
  // A failed group announces its other members; a pending one is skipped.
  Request failed = named("x", 4);
  failed.error_kind = ErrorKind::kInvalidArgument;
  CHECK_FALSE(q.announce_failure(failed));
  failed.name = "y";
  CHECK(q.announce_failure(failed));
  auto fresh = q.drain_new();
  REQUIRE(fresh.size() == 2);  // the pending x, the announced y
  CHECK(fresh[0].name == "x");
  CHECK(fresh[0].error_kind == ErrorKind::kNone);
  CHECK(fresh[1].name == "y");
}

TEST_CASE("queue: the latest push keeps its names until its completion is taken or another "
          "push follows", "[queue]") {
  TensorQueue q;
  auto push = [&q](std::vector<std::string> names) {
    auto state = std::make_shared<OpState>(static_cast<int>(names.size()));
    std::vector<LocalEntry> v;
    for (auto& n : names) {
      LocalEntry e;
      e.request = named(n, 4);
      e.state = state;
      v.push_back(std::move(e));
    }
    q.push(std::move(v));
    return state;
  };
  // Takes `name`'s entry out as its agreed response does.
  auto take = [&q](const std::string& name) {
    Response resp;
    resp.name = name;
    resp.per_rank.resize(1);
    resp.per_rank[0] = named(name, 4);
    resp.per_rank[0]->seq = 1;
    auto e = take_entry(q, resp, 0);
    REQUIRE(e);
    e->state->complete_one();
  };
  auto x = push({"x"});
  take("x");
  REQUIRE(q.size() == 0);
  // Completed, not taken, nothing pushed since: still refused, and a failure
  // of the name is not announced.
  CHECK_THROWS_WITH(q.check_not_pending(named("x", 4)), Catch::Contains("already pending"));
  CHECK_THROWS_AS(push({"x"}), InvalidArgument);
  Request failed = named("x", 4);
  failed.error_kind = ErrorKind::kInvalidArgument;
  CHECK_FALSE(q.announce_failure(failed));
  // Taken (poll() returned true): free.
  CHECK(Handle(x).poll());
  CHECK_NOTHROW(q.check_not_pending(named("x", 4)));

  // Never taken, but another push follows: free once completed.
  push({"y"});
  auto z = push({"z"});
  CHECK_THROWS(q.check_not_pending(named("y", 4)));  // still pending
  take("y");
  CHECK_NOTHROW(q.check_not_pending(named("y", 4)));
  take("z");
  CHECK_THROWS(q.check_not_pending(named("z", 4)));
  Handle(z).wait();  // taken by a wait
  CHECK_NOTHROW(q.check_not_pending(named("z", 4)));

  // A group keeps every member's name; forget_latest() (a join) frees them.
  push({"g.0", "g.1"});
  take("g.0");
  take("g.1");
  CHECK_THROWS(q.check_not_pending(named("g.0", 4)));
  CHECK_THROWS(q.check_not_pending(named("g.1", 4)));
  q.forget_latest();
  CHECK_NOTHROW(q.check_not_pending(named("g.0", 4)));
  CHECK_NOTHROW(q.check_not_pending(named("g.1", 4)));
}

TEST_CASE("coordinator: the resync policy is a field of its own, compared", "[coordinator]") {
  ResponseCache cache(16);
  Coordinator c(2, 0, 0);
  std::vector<RoundMessage> msgs(2);
  for (int r = 0; r < 2; ++r) {
    Request q;
    q.name = "__gyre.resync.0";
    q.collective = Collective::kResync;
    q.digests = {42};
    q.resync_policy = r == 0 ? ResyncPolicy::kNewest : ResyncPolicy::kAverage;
    msgs[static_cast<std::size_t>(r)].requests = {q};
  }
  auto out = c.process(msgs, cache, Clock::now());
  REQUIRE(out.responses.size() == 1);
  CHECK(out.responses[0].error_kind == ErrorKind::kMismatch);
  CHECK_THAT(out.responses[0].error, Catch::Contains("policy") &&
                                         Catch::Contains("rank 0 has newest") &&
                                         Catch::Contains("rank 1 has average"));
}

TEST_CASE("coordinator: a rank's later request of a name waits, never replaces", "[coordinator]") {
  ResponseCache cache(16);
  Coordinator c(2, 0, 0);
  std::vector<RoundMessage> msgs(2);
  Request failed = named("t", 3);
  failed.error_kind = ErrorKind::kInvalidArgument;
  failed.error = "input buffer is null";
  // Rank 1 announces a failure of "t", then enqueues "t" again, before
  // rank 0 enqueued it once.
  msgs[1].requests = {failed, named("t", 3)};
  auto out = c.process(msgs, cache, Clock::now());
  CHECK(out.responses.empty());
  msgs = std::vector<RoundMessage>(2);
  msgs[0].requests = {named("t", 3)};
  out = c.process(msgs, cache, Clock::now());
  REQUIRE(out.responses.size() == 1);  // rank 0's first "t" meets the failure
  CHECK(out.responses[0].error == "allreduce 't': failed on rank 1: input buffer is null");
  REQUIRE(c.pending().count("t"));  // rank 1's second "t" waits for rank 0's second
  msgs = std::vector<RoundMessage>(2);
  msgs[0].requests = {named("t", 3)};
  out = c.process(msgs, cache, Clock::now());
  REQUIRE(out.responses.size() == 1);
  CHECK(out.responses[0].ok());
  CHECK(c.pending().empty());
}

TEST_CASE("coordinator: different iterations of a reused name are a mismatch naming both",
          "[coordinator][sequence]") {
  ResponseCache cache(16);
  Coordinator c(3, 0, 0);
  std::vector<RoundMessage> msgs(3);
  for (int r = 0; r < 3; ++r) {
    Request q = named("g", 4);
    q.seq = r == 1 ? 1 : 2;  // rank 1 one iteration behind
    msgs[static_cast<std::size_t>(r)].requests = {q};
  }
  auto out = c.process(msgs, cache, Clock::now());
  REQUIRE(out.responses.size() == 1);
  CHECK(out.responses[0].error_kind == ErrorKind::kMismatch);
  CHECK_THAT(out.responses[0].error, Catch::Contains("'g'") && Catch::Contains("iteration") &&
                                         Catch::Contains("ranks 0, 2 have 2") &&
                                         Catch::Contains("rank 1 has 1"));
  CHECK(cache.size() == 0);
}

TEST_CASE("coordinator: alike requests agree without comparing; any difference is compared",
          "[coordinator]") {
  // check() skips the per-field comparisons when every rank sent the same
  // request bit for bit; the slightest difference must still be judged.
  auto run = [](const std::function<void(int, Request&)>& edit) {
    ResponseCache cache(16);
    Coordinator c(3, 0, 0);
    std::vector<RoundMessage> msgs(3);
    for (int r = 0; r < 3; ++r) {
      Request q = named("a", 4);
      q.prescale = 0.5;
      edit(r, q);
      msgs[static_cast<std::size_t>(r)].requests = {q};
    }
    auto out = c.process(msgs, cache, Clock::now());
    REQUIRE(out.responses.size() == 1);
    return out.responses[0];
  };
  CHECK(run([](int, Request&) {}).ok());
  // Equal as numbers, different as bits: the comparison decides, as before.
  auto zero = run([](int r, Request& q) { q.prescale = r == 2 ? -0.0 : 0.0; });
  CHECK(zero.error_kind == ErrorKind::kMismatch);
  CHECK_THAT(zero.error, Catch::Contains("prescale") && Catch::Contains("rank 2 has -0"));
  auto shape = run([](int r, Request& q) { q.shape = {r == 1 ? 5 : 4}; });
  CHECK_THAT(shape.error, Catch::Contains("shape") && Catch::Contains("rank 1 has [5]"));
  auto op = run([](int r, Request& q) { q.op = r == 0 ? ReduceOp::kMax : ReduceOp::kSum; });
  CHECK_THAT(op.error, Catch::Contains("reduce op") && Catch::Contains("rank 0 has max"));
  // A rank that joined sends nothing: the others' requests alike suffice.
  ResponseCache cache(16);
  Coordinator c(2, 0, 0);
  std::vector<RoundMessage> msgs(2);
  msgs[0].requests = {named("j", 2)};
  msgs[1].joined = true;
  auto out = c.process(msgs, cache, Clock::now());
  REQUIRE(out.responses.size() == 1);
  CHECK(out.responses[0].ok());
}

TEST_CASE("coordinator: a stalled name whose last rank enqueues it in the failing round runs",
          "[coordinator][stall]") {
  // Rank 0's stall inspector sends "s" for failure in the same round in
  // which rank 1 finally enqueues it: the round adds rank 1's request
  // first, so "s" is complete and runs (it used to fail on every rank with
  // "ranks  never enqueued it (ranks 0, 1 did)").
  ResponseCache cache(16);
  Coordinator c(2, 0, 5.0);
  std::vector<RoundMessage> msgs(2);
  msgs[0].requests = {named("s", 3)};
  auto out = c.process(msgs, cache, Clock::now());
  CHECK(out.responses.empty());
  msgs = std::vector<RoundMessage>(2);
  msgs[0].stall_failures = {"s"};
  msgs[1].requests = {named("s", 3)};
  out = c.process(msgs, cache, Clock::now());
  REQUIRE(out.responses.size() == 1);
  CHECK(out.responses[0].ok());
  CHECK(out.responses[0].error.empty());
  CHECK(c.pending().empty());
}

TEST_CASE("coordinator: a stalled name fails on every rank naming the missing ranks",
          "[coordinator][stall]") {
  ResponseCache cache(16);
  Coordinator c(3, 0, 5.0);
  std::vector<RoundMessage> msgs(3);
  msgs[0].requests = {named("s", 3)};
  msgs[2].requests = {named("s", 3)};
  c.process(msgs, cache, Clock::now());
  msgs = std::vector<RoundMessage>(3);
  msgs[0].stall_failures = {"s"};
  auto out = c.process(msgs, cache, Clock::now());
  REQUIRE(out.responses.size() == 1);
  CHECK(out.responses[0].error_kind == ErrorKind::kTimeout);
  CHECK_THAT(out.responses[0].error, Catch::Contains("timeout") && Catch::Contains("rank 1") &&
                                         Catch::Contains("ranks 0, 2 did"));
}

TEST_CASE("stall inspector: a name's deadline is its longest prefix's, capped by the global",
          "[stall]") {
  std::map<std::string, double> d{{"torch.g1.", 1.0}, {"torch.g1.7", 0.25}, {"torch.g2.", 900}};
  CHECK(StallInspector::deadline_of(d, 600, "torch.g1.3") == 1.0);
  CHECK(StallInspector::deadline_of(d, 600, "torch.g1.7") == 0.25);
  CHECK(StallInspector::deadline_of(d, 600, "torch.g2.0") == 600);  // never past the global
  CHECK(StallInspector::deadline_of(d, 0, "torch.g2.0") == 900);    // global off: the group's
  CHECK(StallInspector::deadline_of(d, 600, "other") == 600);
  CHECK(StallInspector::deadline_of({}, 0, "other") == 0);
}

TEST_CASE("stall inspector: rank 0 fails a name at its own deadline, not the global one",
          "[stall]") {
  Coordinator c(2, 0, 600);
  ResponseCache cache(16);
  std::vector<RoundMessage> msgs(2);
  msgs[0].requests = {named("torch.g1.0", 1), named("torch.g0.0", 1)};
  const auto t0 = Clock::now();
  c.process(msgs, cache, t0);
  StallInspector inspector(0, 60, 600);
  Logger log(0, LogLevel::kError);
  inspector.set_deadline("torch.g1.", 1.0);
  CHECK(inspector.inspect(c, t0 + std::chrono::milliseconds(900), log).empty());
  auto expired = inspector.inspect(c, t0 + std::chrono::milliseconds(1100), log);
  REQUIRE(expired == std::vector<std::string>{"torch.g1.0"});
  StallInspector global_only(0, 60, 600);  // no deadline of its own: the global one
  CHECK(global_only.inspect(c, t0 + std::chrono::seconds(2), log).empty());
  global_only.set_deadline("torch.g1.", 1.0);
  global_only.set_deadline("torch.g1.", 0);  // removed again
  CHECK(global_only.inspect(c, t0 + std::chrono::seconds(3), log).empty());
}
