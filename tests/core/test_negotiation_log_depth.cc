// The log-depth negotiation round (negotiation/negotiator.h): when every
// rank's requests are cache hits at one step, a round is one dissemination
// exchange of a fixed-size vector, ceil(log2 n) messages per rank, counted
// here by the Negotiator's own message counter (what runtime_stats()
// reports) for n = 2..16; and every way a round must fall back to the full
// exchange, or hold a hit for a later round, gives the responses the full
// exchange gives. Ranks as threads over a LocalTransport world.
#include <catch2/catch.hpp>

#include <chrono>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "gyre/collectives/local_transport.h"
#include "negotiation/negotiator.h"
#include "negotiator_ranks.h"

using namespace gyre;
using namespace gyre::core;
using gyre::core::test::expect;
using gyre::core::test::on_host_ranks;
using gyre::core::test::on_ranks;

namespace {

Request named(const std::string& name, std::int64_t len, std::uint64_t seq) {
  Request r;
  r.name = name;
  r.shape = {len};
  r.seq = seq;
  return r;
}

std::uint64_t ceil_log2(int n) {
  std::uint64_t k = 0;
  while ((1 << k) < n) ++k;
  return k;
}

std::vector<std::string> names(const Agreement& a) {
  std::vector<std::string> out;
  for (const auto& resp : a.responses) out.push_back(resp.name);
  return out;
}

// One round; also returns the messages this rank sent in it and whether the
// log-depth exchange decided it alone.
struct Counted {
  Agreement agreed;
  std::uint64_t messages = 0;
  bool log_depth = false;
};
Counted counted_round(Negotiator& neg, std::vector<Request> reqs, RoundFlags flags = {}) {
  const std::uint64_t m0 = neg.messages_sent(), f0 = neg.log_depth_rounds();
  Counted c;
  c.agreed = neg.round(std::move(reqs), std::move(flags));
  c.messages = neg.messages_sent() - m0;
  c.log_depth = neg.log_depth_rounds() == f0 + 1;
  return c;
}

}  // namespace

TEST_CASE("log-depth negotiation: a cache-hit round is ceil(log2 n) messages, n = 2..16",
          "[negotiator][log-depth]") {
  for (int n = 2; n <= 16; ++n) {
    INFO("n = " << n);
    std::vector<std::vector<std::string>> orders(static_cast<std::size_t>(n));
    std::vector<std::uint64_t> full_messages(static_cast<std::size_t>(n));
    on_ranks(n, NegotiatorOptions{}, [&](int r, Negotiator& neg, VersionVector&) {
      // Round 1: new requests travel in full (the ring allgather: n - 1
      // messages, more than ceil(log2 n) from n = 4) and fill the cache.
      Counted c = counted_round(neg, {named("a", 3, 1), named("b", 5, 1), named("c", 7, 1)});
      expect(!c.log_depth && c.agreed.responses.size() == 3, r, "3 responses of a full round");
      full_messages[static_cast<std::size_t>(r)] = c.messages;
      // Rounds 2..4: every rank submits the next iteration of each name.
      for (std::uint64_t seq = 2; seq <= 4; ++seq) {
        c = counted_round(neg, {named("c", 7, seq), named("a", 3, seq), named("b", 5, seq)});
        expect(c.log_depth, r, "a log-depth round");
        expect(c.messages == ceil_log2(n), r,
               fmt::format("{} messages, not {}", ceil_log2(n), c.messages));
        expect(c.agreed.responses.size() == 3 && !c.agreed.idle, r, "3 responses");
        for (const auto& resp : c.agreed.responses) {
          expect(resp.ok() && resp.agreed.seq == seq && resp.contributors == n, r,
                 "each response is the iteration every rank submitted");
        }
        if (seq == 2) orders[static_cast<std::size_t>(r)] = names(c.agreed);
      }
      // A round where nothing was submitted: log depth too, and idle.
      c = counted_round(neg, {});
      expect(c.log_depth && c.messages == ceil_log2(n) && c.agreed.idle &&
                 c.agreed.responses.empty(),
             r, "an idle log-depth round");
    });
    for (int r = 1; r < n; ++r) CHECK(orders[static_cast<std::size_t>(r)] == orders[0]);
    // The order is the cache's slot order: the first round's order.
    CHECK(orders[0] == std::vector<std::string>{"a", "b", "c"});
    if (n >= 4) CHECK(full_messages[0] > ceil_log2(n));
  }
}

TEST_CASE("log-depth negotiation: a request one rank sends in full makes the round a full one",
          "[negotiator][log-depth]") {
  for (int n : {2, 3, 5, 8}) {
    INFO("n = " << n);
    on_ranks(n, NegotiatorOptions{}, [&](int r, Negotiator& neg, VersionVector&) {
      counted_round(neg, {named("x", 4, 1)});
      // Rank 1 has a new name besides its cache hit: every rank falls back
      // to the full exchange (ceil(log2 n) messages, then the allgather).
      std::vector<Request> mine{named("x", 4, 2)};
      if (r == 1) mine.push_back(named("new", 2, 1));
      Counted c = counted_round(neg, mine);
      expect(!c.log_depth && c.messages > ceil_log2(n), r, "a full round");
      expect(names(c.agreed) == std::vector<std::string>{"x"}, r, "x runs; new waits");
      expect(neg.coordinator().pending().count("new") == 1, r, "new pending everywhere");
      // With a request pending in the Coordinator no rank tries log depth.
      std::vector<Request> rest;
      if (r != 1) rest.push_back(named("new", 2, 1));
      c = counted_round(neg, rest);
      expect(!c.log_depth && names(c.agreed) == std::vector<std::string>{"new"}, r,
             "new runs in a full round");
      expect(c.agreed.responses[0].ok() && c.agreed.responses[0].contributors == n, r,
             "from every rank");
      // Nothing pending: log depth again, for both names.
      c = counted_round(neg, {named("new", 2, 2), named("x", 4, 3)});
      expect(c.log_depth && c.agreed.responses.size() == 2, r, "back to log depth");
    });
  }
}

TEST_CASE("log-depth negotiation: a hit the other ranks have not submitted waits for them",
          "[negotiator][log-depth]") {
  on_ranks(4, NegotiatorOptions{}, [&](int r, Negotiator& neg, VersionVector&) {
    counted_round(neg, {named("p", 4, 1), named("q", 4, 1)});
    // Rank 0 is ahead: it submits p and q; the others only p.
    std::vector<Request> mine{named("p", 4, 2)};
    if (r == 0) mine.push_back(named("q", 4, 2));
    Counted c = counted_round(neg, mine);
    expect(c.log_depth && names(c.agreed) == std::vector<std::string>{"p"}, r,
           "p runs in log depth; q waits");
    expect(neg.coordinator().pending().empty(), r, "nothing pending in the Coordinator");
    // Rank 0's q was held and goes again; the others submit theirs now.
    mine.clear();
    if (r != 0) mine.push_back(named("q", 4, 2));
    c = counted_round(neg, mine);
    expect(c.log_depth && names(c.agreed) == std::vector<std::string>{"q"}, r, "q runs");
    expect(c.agreed.responses[0].contributors == 4 && c.agreed.responses[0].agreed.seq == 2, r,
           "q's second iteration from every rank");
    c = counted_round(neg, {});
    expect(c.log_depth && c.agreed.idle, r, "nothing is left held");
  });
}

TEST_CASE("log-depth negotiation: numbered names (torch.<group>.<call>) are log-depth rounds",
          "[negotiator][log-depth]") {
  for (int n : {2, 3, 4, 7, 8, 16}) {
    INFO("n = " << n);
    on_ranks(n, NegotiatorOptions{}, [&](int r, Negotiator& neg, VersionVector&) {
      auto call = [](std::uint64_t k, std::int64_t len) {
        return named(fmt::format("torch.g0.{}", k), len, 1);
      };
      // Calls 1 and 2 are new signatures: full rounds.
      Counted c = counted_round(neg, {call(1, 4)});
      expect(!c.log_depth, r, "call 1 in full");
      c = counted_round(neg, {call(2, 6)});
      expect(!c.log_depth, r, "call 2 in full (another signature)");
      // From then on every call repeats a signature of the stream: each
      // round is ceil(log2 n) messages, and the response is the call every
      // rank made, under its own name.
      std::uint64_t k = 3;
      for (std::int64_t len : {4, 6, 4, 4, 6}) {
        c = counted_round(neg, {call(k, len)});
        expect(c.log_depth && c.messages == ceil_log2(n), r,
               fmt::format("call {}: a log-depth round of {} messages, not {}", k,
                           ceil_log2(n), c.messages));
        expect(names(c.agreed) == std::vector<std::string>{fmt::format("torch.g0.{}", k)} &&
                   c.agreed.responses[0].ok() && c.agreed.responses[0].contributors == n &&
                   c.agreed.responses[0].agreed.shape == std::vector<std::int64_t>{len},
               r, fmt::format("call {} agreed from every rank", k));
        ++k;
      }
      // One rank's call differs in shape: it travels in full, the round
      // is a full one and the mismatch is named on every rank.
      c = counted_round(neg, {call(k, r == 1 ? 5 : 4)});
      expect(!c.log_depth && c.agreed.responses.size() == 1, r, "a full round");
      expect(c.agreed.responses[0].error_kind == ErrorKind::kMismatch &&
                 c.agreed.responses[0].error.find("torch.g0.8") != std::string::npos,
             r, "a MismatchError naming torch.g0.8: " + c.agreed.responses[0].error);
      // A rank one call ahead (it made call 9 and 10, the others call 9):
      // call 10 waits for the others, held or in full, and runs once they
      // make it.
      ++k;
      std::vector<Request> mine{call(k, 4)};
      if (r == 0) mine.push_back(call(k + 1, 4));
      c = counted_round(neg, mine);
      expect(names(c.agreed) == std::vector<std::string>{fmt::format("torch.g0.{}", k)}, r,
             "call 9 runs; call 10 waits");
      mine.clear();
      if (r != 0) mine.push_back(call(k + 1, 4));
      c = counted_round(neg, mine);
      expect(names(c.agreed) == std::vector<std::string>{fmt::format("torch.g0.{}", k + 1)} &&
                 c.agreed.responses[0].contributors == n,
             r, "call 10 from every rank");
    });
  }
}

TEST_CASE("log-depth negotiation: a hit held past the hold limit reaches the Coordinator",
          "[negotiator][log-depth]") {
  NegotiatorOptions opt;
  opt.hold_limit_s = 0.0;  // any hold is too long
  on_ranks(3, opt, [&](int r, Negotiator& neg, VersionVector&) {
    counted_round(neg, {named("s", 4, 1)});
    Counted c = counted_round(neg, r == 2 ? std::vector<Request>{named("s", 4, 2)}
                                          : std::vector<Request>{});
    expect(c.log_depth && c.agreed.responses.empty() && !c.agreed.idle, r,
           "a log-depth round holding s on rank 2");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // past a limit of 0 s
    // Rank 2 asks for the full exchange: s is pending where the stall
    // inspector looks for operations some rank never submitted.
    c = counted_round(neg, {});
    expect(!c.log_depth && c.agreed.responses.empty(), r, "a full round");
    const auto& pending = neg.coordinator().pending();
    expect(pending.count("s") == 1 && pending.at("s").per_rank[2].has_value() &&
               !pending.at("s").per_rank[0].has_value(),
           r, "s pending from rank 2");
    c = counted_round(neg, r == 2 ? std::vector<Request>{} : std::vector<Request>{named("s", 4, 2)});
    expect(names(c.agreed) == std::vector<std::string>{"s"} && c.agreed.responses[0].ok(), r,
           "s runs once the others submit it");
  });
}

TEST_CASE("log-depth negotiation: the hold limit is each hit's own, not the rank's",
          "[negotiator][log-depth]") {
  // Rank 0 is always one operation ahead: every round it holds a different
  // hit for one round. Over more than the limit in all, no hit is held
  // longer than a round, so every round stays in log depth.
  NegotiatorOptions opt;
  opt.hold_limit_s = 0.1;
  constexpr int kOps = 8;
  on_ranks(3, opt, [&](int r, Negotiator& neg) {
    std::vector<Request> first;
    for (int k = 0; k <= kOps; ++k) first.push_back(named(fmt::format("op.{}", k), 4, 1));
    counted_round(neg, first);
    const auto start = std::chrono::steady_clock::now();
    for (int k = 1; k <= kOps; ++k) {
      // Rounds 30 ms apart: the time passes that the limit counts.
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      // Rank 0 submits op.k (and op.0 with op.1 in the first round), the
      // others op.k-1.
      std::vector<Request> mine{named(fmt::format("op.{}", r == 0 ? k : k - 1), 4, 2)};
      if (r == 0 && k == 1) mine.insert(mine.begin(), named("op.0", 4, 2));
      Counted c = counted_round(neg, mine);
      expect(c.log_depth, r, fmt::format("round {} in log depth", k));
      expect(names(c.agreed) == std::vector<std::string>{fmt::format("op.{}", k - 1)}, r,
             "the operation every rank has now submitted runs");
    }
    expect(std::chrono::steady_clock::now() - start > std::chrono::milliseconds(200), r,
           "the rounds spanned more than the hold limit");
  });
}

TEST_CASE("log-depth negotiation: a grouped allreduce runs only with all its members",
          "[negotiator][log-depth]") {
  on_ranks(3, NegotiatorOptions{}, [&](int r, Negotiator& neg, VersionVector&) {
    auto member = [](const std::string& name, std::uint64_t seq) {
      Request q = named(name, 4, seq);
      q.group = "g.a";
      q.group_size = 2;
      return q;
    };
    Counted c = counted_round(neg, {member("g.a", 1), member("g.b", 1), named("solo", 2, 1)});
    expect(c.agreed.responses.size() == 3, r, "3 responses");
    // Every rank has g.a; rank 1 not yet g.b: the group waits, solo runs.
    std::vector<Request> mine{member("g.a", 2), named("solo", 2, 2)};
    if (r != 1) mine.push_back(member("g.b", 2));
    c = counted_round(neg, mine);
    expect(c.log_depth && names(c.agreed) == std::vector<std::string>{"solo"}, r,
           "only solo runs");
    c = counted_round(neg, r == 1 ? std::vector<Request>{member("g.b", 2)}
                                  : std::vector<Request>{});
    expect(c.log_depth && names(c.agreed) == std::vector<std::string>{"g.a", "g.b"}, r,
           "both members in one round");
  });
}

TEST_CASE("log-depth negotiation: ranks at different steps take the full exchange",
          "[negotiator][log-depth]") {
  NegotiatorOptions opt;
  opt.max_version_lag = 1;
  on_ranks(3, opt, [&](int r, Negotiator& neg, VersionVector& vv) {
    // Requests carry the step of their rank at enqueue, as the queue sets it.
    auto at_step = [&](std::uint64_t seq) {
      Request q = named("w", 4, seq);
      q.step = vv.own();
      return q;
    };
    counted_round(neg, {at_step(1)});
    if (r == 0) vv.commit();  // rank 0 one step ahead
    Counted c = counted_round(neg, {at_step(2)});
    expect(!c.log_depth, r, "a full round");
    expect(names(c.agreed) == std::vector<std::string>{"w"} && c.agreed.responses[0].ok(), r,
           "w runs within the allowed lag");
    expect(vv.snapshot()[0] == 1 && vv.snapshot()[1] == 0, r, "the steps every rank sent");
    if (r != 0) vv.commit();
    c = counted_round(neg, {at_step(3)});
    expect(c.log_depth && c.agreed.responses.size() == 1, r, "one step again: log depth");
    expect(vv.snapshot() == std::vector<std::uint64_t>{1, 1, 1}, r, "every rank at step 1");
  });
}

TEST_CASE("log-depth negotiation: off, every round is a full one", "[negotiator][log-depth]") {
  NegotiatorOptions opt;
  opt.log_depth = false;
  on_ranks(4, opt, [&](int r, Negotiator& neg, VersionVector&) {
    counted_round(neg, {named("o", 4, 1)});
    Counted c = counted_round(neg, {named("o", 4, 2)});
    expect(!c.log_depth && c.messages == 3 && c.agreed.responses.size() == 1, r,
           "the ring allgather's n - 1 messages");
  });
}

TEST_CASE("log-depth negotiation in two tiers: ceil(log2 hosts) messages from local rank 0, "
          "none from the others; a new request still takes the full exchange",
          "[negotiator][log-depth][tiers]") {
  for (auto [hosts, per_host] : {std::pair{2, 2}, std::pair{3, 2}, std::pair{2, 3},
                                 std::pair{4, 4}, std::pair{5, 3}, std::pair{1, 4}}) {
    const int n = hosts * per_host;
    INFO(hosts << " hosts x " << per_host);
    std::vector<std::vector<std::string>> orders(static_cast<std::size_t>(n));
    on_host_ranks(hosts, per_host, NegotiatorOptions{}, [&](int r, int local, Negotiator& neg) {
      expect(neg.tier_hosts() == hosts, r, "the tier's host count");
      Counted c = counted_round(neg, {named("a", 3, 1), named("b", 5, 1)});
      expect(!c.log_depth && c.agreed.responses.size() == 2, r, "a full first round");
      const std::uint64_t want = local == 0 ? ceil_log2(hosts) : 0;
      for (std::uint64_t seq = 2; seq <= 4; ++seq) {
        c = counted_round(neg, {named("b", 5, seq), named("a", 3, seq)});
        expect(c.log_depth, r, "a log-depth round");
        expect(c.messages == want, r, fmt::format("{} messages, not {}", want, c.messages));
        expect(c.agreed.responses.size() == 2, r, "2 responses");
        for (const auto& resp : c.agreed.responses) {
          expect(resp.ok() && resp.agreed.seq == seq && resp.contributors == n, r,
                 "each response is the iteration every rank submitted");
        }
        if (seq == 2) orders[static_cast<std::size_t>(r)] = names(c.agreed);
      }
      // The last rank asks for a new tensor: every rank takes the full
      // exchange (over every rank) and agrees on it.
      std::vector<Request> reqs = {named("a", 3, 5), named("b", 5, 5)};
      if (r == n - 1) reqs.push_back(named("new", 2, 1));
      c = counted_round(neg, reqs);
      expect(!c.log_depth, r, "a full round for the new request");
      if (r != n - 1) {
        c = counted_round(neg, {named("new", 2, 1)});
        expect(c.agreed.responses.size() == 1 && c.agreed.responses[0].name == "new", r,
               "the new tensor agreed once every rank sent it");
      } else {
        c = counted_round(neg, {});
        expect(c.agreed.responses.size() == 1 && c.agreed.responses[0].name == "new", r,
               "the new tensor agreed once every rank sent it");
      }
      // Idle rounds are log depth and tiered too.
      c = counted_round(neg, {});
      expect(c.log_depth && c.agreed.idle && c.messages == want, r, "an idle tiered round");
    });
    for (int r = 1; r < n; ++r) CHECK(orders[static_cast<std::size_t>(r)] == orders[0]);
    CHECK(orders[0] == std::vector<std::string>{"a", "b"});
  }
}
