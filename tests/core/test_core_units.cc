// Unit tests of the runtime's pure parts: message encoding, the response
// cache, fusion planning, the coordinator's agreement rules, version-vector
// lag checks, fingerprints and the timeline file.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <future>

#include "negotiation/coordinator.h"
#include "api/fingerprint.h"
#include "execution/executor.h"
#include "fusion/fusion.h"
#include "negotiation/message.h"
#include "negotiation/response_cache.h"
#include "runtime/timeline.h"
#include "negotiation/version_vector.h"

using namespace gyre;
using namespace gyre::core;

namespace {

Request make_req(const std::string& name, std::vector<std::int64_t> shape,
                 DataType dt = DataType::kFloat32, ReduceOp op = ReduceOp::kSum) {
  Request r;
  r.name = name;
  r.shape = std::move(shape);
  r.dtype = dt;
  r.op = op;
  return r;
}

std::vector<RoundMessage> empty_round(int n) { return std::vector<RoundMessage>(n); }

}  // namespace

TEST_CASE("RoundMessage survives encode/decode", "[message]") {
  RoundMessage m;
  m.shutdown = true;
  m.step = 42;
  m.cache_hits = {0, 3, 17};
  Request r = make_req("layer.0/weight", {3, 4}, DataType::kBFloat16, ReduceOp::kMax);
  r.collective = Collective::kAlltoall;
  r.root = 2;
  r.prescale = 0.5;
  r.postscale = 3.25;
  r.splits = {1, 2, 0};
  r.resync_policy = ResyncPolicy::kAverage;
  r.step = 9;
  r.error_kind = ErrorKind::kInvalidArgument;
  r.error = "bad \"buffer\"";
  Request f = make_req("f", {});
  f.collective = Collective::kFingerprint;
  f.digests = {~0ull, 7};
  m.requests = {r, make_req("b", {}), f};
  m.stall_failures = {"stuck"};
  auto bytes = encode(m);
  REQUIRE(encoded_length(bytes) == bytes.size());
  RoundMessage d = decode(bytes, 1, 3);
  CHECK(d.shutdown);
  CHECK_FALSE(d.joined);
  CHECK(d.step == 42);
  CHECK(d.cache_hits == m.cache_hits);
  REQUIRE(d.requests.size() == 3);
  const Request& x = d.requests[0];
  CHECK(x.same_operation(r));
  CHECK(x.step == 9);
  CHECK(x.error_kind == ErrorKind::kInvalidArgument);
  CHECK(x.error == r.error);
  CHECK(d.requests[1].name == "b");
  CHECK(d.requests[2].same_operation(f));
  CHECK(d.stall_failures == m.stall_failures);
}

TEST_CASE("decode rejects truncated and corrupted messages", "[message]") {
  RoundMessage m;
  m.requests = {make_req("w", {10})};
  auto bytes = encode(m);
  std::vector<std::byte> cut(bytes.begin(), bytes.end() - 3);
  CHECK_THROWS_AS(decode(cut, 2, 3), TransportError);
  auto bad = bytes;
  bad[4 + 1 + 8 + 4 + 4 + 4 + 1] = std::byte{200};  // the collective byte of request 0
  CHECK_THROWS_WITH(decode(bad, 2, 3), Catch::Contains("rank 2"));
}

TEST_CASE("response cache: find, replace, LRU eviction", "[cache]") {
  ResponseCache cache(2);
  Request a = make_req("a", {4}), b = make_req("b", {4}), c = make_req("c", {4});
  // A hit is the next submission of a cached name: sequence number + 1.
  auto next = [](Request r) {
    ++r.seq;
    return r;
  };
  CHECK_FALSE(cache.find(next(a)));
  cache.put(a);
  cache.put(b);
  REQUIRE(cache.find(next(a)));
  CHECK_FALSE(cache.find(a));  // the cached submission itself: not the next one
  auto slot_a = *cache.find(next(a));
  CHECK(cache.hit(slot_a).name == "a");
  CHECK(cache.hit(slot_a).seq == a.seq + 1);
  Request a2 = make_req("a", {5});
  CHECK_FALSE(cache.find(next(a2)));  // same name, other shape: not a hit
  cache.put(a);                       // a most recent: c evicts b
  cache.put(c);
  CHECK(cache.find(next(a)));
  CHECK_FALSE(cache.find(next(b)));
  CHECK(*cache.find(next(c)) != slot_a);
  CHECK(cache.size() == 2);
  cache.put(a2);  // replaces a in place
  CHECK(*cache.find(next(a2)) == slot_a);
  CHECK_THROWS_AS(cache.hit(99), TransportError);
  ResponseCache off(0);
  off.put(a);
  CHECK_FALSE(off.find(next(a)));
}

TEST_CASE("response cache: numbered names hit as their stream's next call", "[cache]") {
  // "<stream>.<n>" submitted once each (sequence number 1), as the
  // torch.distributed backend's "torch.<group>.<call>" names are.
  auto call = [](std::uint64_t n, std::vector<std::int64_t> shape) {
    Request r = make_req(fmt::format("torch.g0.{}", n), std::move(shape));
    r.seq = 1;
    return r;
  };
  ResponseCache cache(64);
  CHECK_FALSE(cache.find(call(1, {4})));
  cache.put(call(1, {4}));
  CHECK(cache.size() == 2);  // the stream's entry and the name's own
  // The stream's next call with the same signature: a hit that rebuilds
  // exactly the sender's request on any copy of the cache.
  const auto slot = cache.find(call(2, {4}));
  REQUIRE(slot);
  const Request rebuilt = cache.hit(*slot);
  CHECK(rebuilt.name == "torch.g0.2");
  CHECK(rebuilt.seq == 1);
  CHECK(rebuilt.same_operation(call(2, {4})));
  CHECK_FALSE(cache.find(call(3, {4})));  // not the next call: call 2 is not agreed yet
  CHECK_FALSE(cache.find(call(2, {5})));  // another signature
  Request other = call(2, {4});
  other.op = ReduceOp::kMax;
  CHECK_FALSE(cache.find(other));
  Request again = call(2, {4});
  again.seq = 2;  // the name's second submission: a reused name, not a stream's call
  CHECK_FALSE(cache.find(again));
  // Signatures in turn: each hits from its second occurrence, one entry each.
  cache.put(call(2, {5}));
  CHECK(cache.find(call(3, {4})) == slot);
  cache.put(call(3, {4}));
  CHECK(cache.find(call(4, {5})));
  cache.put(call(4, {5}));
  CHECK(cache.size() == 2 + 4);  // one per signature, and each name's own
  CHECK(cache.hit(*slot).name == "torch.g0.5");
  // A caller that numbers afresh (a group made again under its old name)
  // is followed from its first call agreed.
  cache.put(call(1, {4}));
  CHECK(cache.find(call(2, {4})));
  CHECK(cache.hit(*cache.find(call(2, {4}))).name == "torch.g0.2");
  // Names that are not canonical numbers are reused names, never a stream's.
  for (const char* name : {"torch.g0.05", "torch.g0.", ".5", "torch.g0.5x", "torch.g0.-5",
                           "torch.g0.1234567890123456789"}) {
    INFO(name);
    CHECK_FALSE(ResponseCache::numbered(name));
  }
  CHECK(ResponseCache::numbered("a.0")->n == 0);
  CHECK(ResponseCache::numbered("a.b.17")->stream == "a.b");
  // Streams are apart: another group's calls do not hit on this one's.
  Request g1 = call(5, {4});
  g1.name = "torch.g1.5";
  CHECK_FALSE(cache.find(g1));
  // At most kPerStream signatures per stream, the least recently used
  // one out; the stream keeps its place among the others.
  ResponseCache small(4 * ResponseCache::kPerStream);
  std::uint64_t n = 1;
  for (std::int64_t len = 1; len <= static_cast<std::int64_t>(ResponseCache::kPerStream) + 1;
       ++len) {
    small.put(call(n++, {len}));
  }
  CHECK(small.size() == ResponseCache::kPerStream + ResponseCache::kPerStream + 1);
  CHECK_FALSE(small.find(call(n, {1})));
  CHECK(small.find(call(n, {2})));
  // Eviction by capacity takes a stream's entry like any other.
  ResponseCache three(3);
  three.put(call(1, {4}));  // the stream's entry, then torch.g0.1's own
  Request plain = make_req("w", {3});
  three.put(plain);
  three.put(make_req("v", {3}));  // evicts the stream's only entry
  CHECK(three.size() == 3);
  CHECK_FALSE(three.find(call(2, {4})));
  three.put(call(2, {4}));  // evicts torch.g0.1 and w; the stream starts again
  CHECK(three.find(call(3, {4})));
  ++plain.seq;
  CHECK_FALSE(three.find(plain));
  // A numbered name the caller reuses hits as a reused name from its
  // second submission, as any name does.
  Request layer = make_req("layer.3", {2});
  layer.seq = 1;
  cache.put(layer);
  ++layer.seq;
  CHECK(cache.find(layer));
  CHECK(cache.hit(*cache.find(layer)).name == "layer.3");
}

TEST_CASE("fusion planner groups same-kind allreduces up to the threshold", "[fusion]") {
  auto item = [](std::size_t bytes, DataType dt = DataType::kFloat32, bool fusable = true) {
    FusionItem i;
    i.fusable = fusable;
    i.dtype = dt;
    i.bytes = bytes;
    return i;
  };
  // 64-byte aligned members: 100 -> 128, 60 -> 64.
  std::vector<FusionItem> items = {item(100), item(60), item(40, DataType::kFloat64),
                                   item(1000), item(60), item(10, DataType::kFloat32, false),
                                   item(60, DataType::kFloat64)};
  auto buckets = plan_buckets(items, 256);
  // [0,1,4] float32 (128+64+64=256), [2,6] float64, [3] too big, [5] not fusable.
  REQUIRE(buckets.size() == 4);
  CHECK(buckets[0].members == std::vector<std::size_t>{0, 1, 4});
  CHECK(buckets[0].bytes == 256);
  CHECK(buckets[1].members == std::vector<std::size_t>{2, 6});
  CHECK(buckets[2].members == std::vector<std::size_t>{3});
  CHECK_FALSE(buckets[2].fused());
  CHECK(buckets[3].members == std::vector<std::size_t>{5});
  std::size_t total = 0;
  auto offs = bucket_offsets(items, buckets[0], &total);
  CHECK(offs == std::vector<std::size_t>{0, 128, 192});
  CHECK(total == 256);
  // Threshold 0: fusion off, one bucket per tensor, in order.
  auto solo = plan_buckets(items, 0);
  REQUIRE(solo.size() == items.size());
  for (std::size_t i = 0; i < solo.size(); ++i) CHECK(solo[i].members.front() == i);
  // Scale factors and ops separate buckets.
  FusionItem p = item(8), q = item(8);
  q.prescale = 2.0;
  CHECK(plan_buckets({p, q}, 1024).size() == 2);
}

TEST_CASE("fusion buffer is allocated once and reused", "[fusion]") {
  FusionBuffer buf;
  auto* p = buf.get(1000);
  CHECK(buf.get(500) == p);
  CHECK(buf.get(1000) == p);
  CHECK(buf.allocations() == 1);
  buf.get(5000);
  CHECK(buf.allocations() == 2);
}

TEST_CASE("coordinator: ready when every rank submitted, same order everywhere", "[coordinator]") {
  ResponseCache cache(16);
  Coordinator c(3, 0, 0);
  auto now = Clock::now();
  auto msgs = empty_round(3);
  msgs[0].requests = {make_req("x", {2}), make_req("y", {2})};
  msgs[2].requests = {make_req("y", {2})};
  auto out = c.process(msgs, cache, now);
  CHECK(out.responses.empty());
  CHECK(c.pending().size() == 2);
  msgs = empty_round(3);
  msgs[1].requests = {make_req("y", {2}), make_req("x", {2})};
  msgs[2].requests = {make_req("x", {2})};
  out = c.process(msgs, cache, now);
  REQUIRE(out.responses.size() == 2);
  // Order of first arrival (x before y, both first seen from rank 0).
  CHECK(out.responses[0].name == "x");
  CHECK(out.responses[1].name == "y");
  CHECK(out.responses[0].ok());
  CHECK(out.responses[0].contributors == 3);
  CHECK(c.pending().empty());
  // Both are cached now; a hit on slot of "x" from every rank is ready.
  Request x2 = make_req("x", {2});
  x2.seq = 1;  // the next submission of "x"
  auto sx = cache.find(x2);
  REQUIRE(sx);
  msgs = empty_round(3);
  for (auto& m : msgs) m.cache_hits = {*sx};
  out = c.process(msgs, cache, now);
  REQUIRE(out.responses.size() == 1);
  CHECK(out.responses[0].name == "x");
}

TEST_CASE("coordinator: process_alike decides as process does with every rank's message the same",
          "[coordinator]") {
  // Two coordinators and caches brought to the same state; then the same
  // round, as N copies of one message and as process_alike.
  ResponseCache cache_a(16), cache_b(16);
  Coordinator a(3, 0, 0), b(3, 0, 0);
  const auto now = Clock::now();
  auto msgs = empty_round(3);
  for (auto& m : msgs) m.requests = {make_req("p", {2}), make_req("q", {3})};
  REQUIRE(a.process(msgs, cache_a, now).responses.size() == 2);
  REQUIRE(b.process(msgs, cache_b, now).responses.size() == 2);
  Request p2 = make_req("p", {2}), q2 = make_req("q", {3});
  p2.seq = q2.seq = 1;
  auto sp = cache_a.find(p2), sq = cache_a.find(q2);
  REQUIRE(sp);
  REQUIRE(sq);
  RoundMessage each;
  each.step = 0;
  each.cache_hits = {*sq, *sp};
  std::vector<RoundMessage> copies(3, each);
  const RoundOutcome full = a.process(copies, cache_a, now);
  const RoundOutcome alike = b.process_alike(each, cache_b, now);
  REQUIRE(full.responses.size() == 2);
  REQUIRE(alike.responses.size() == full.responses.size());
  for (std::size_t i = 0; i < full.responses.size(); ++i) {
    CHECK(alike.responses[i].name == full.responses[i].name);
    CHECK(alike.responses[i].ok());
    CHECK(alike.responses[i].contributors == 3);
    CHECK(alike.responses[i].agreed.shape == full.responses[i].agreed.shape);
  }
  CHECK(alike.shutdown_rank == full.shutdown_rank);
  CHECK(a.pending().empty());
  CHECK(b.pending().empty());
  CHECK(cache_b.size() == cache_a.size());
  // A wrong number of messages is refused, not read past.
  CHECK_THROWS_AS(a.process(std::vector<RoundMessage>(2, each), cache_a, now), std::logic_error);
}

TEST_CASE("coordinator: mismatches name tensor, field and ranks", "[coordinator]") {
  ResponseCache cache(16);
  Coordinator c(3, 0, 0);
  auto msgs = empty_round(3);
  msgs[0].requests = {make_req("w", {4, 5}), make_req("d", {2}), make_req("o", {2})};
  msgs[1].requests = {make_req("w", {4, 6}), make_req("d", {2}, DataType::kFloat64),
                      make_req("o", {2}, DataType::kFloat32, ReduceOp::kMax)};
  msgs[2].requests = {make_req("w", {4, 5}), make_req("d", {2}), make_req("o", {2})};
  auto out = c.process(msgs, cache, Clock::now());
  REQUIRE(out.responses.size() == 3);
  for (auto& r : out.responses) CHECK(r.error_kind == ErrorKind::kMismatch);
  CHECK(out.responses[0].error ==
        "allreduce 'w': ranks disagree on shape: ranks 0, 2 have [4, 5]; rank 1 has [4, 6]");
  CHECK_THAT(out.responses[1].error, Catch::Contains("dtype") && Catch::Contains("float64"));
  CHECK_THAT(out.responses[2].error, Catch::Contains("reduce op") && Catch::Contains("max"));
  CHECK(cache.size() == 0);  // failed responses are not cached
}

TEST_CASE("coordinator: allgather may differ in the first dimension only", "[coordinator]") {
  ResponseCache cache(16);
  Coordinator c(2, 0, 0);
  auto msgs = empty_round(2);
  Request a = make_req("g", {3, 2}), b = make_req("g", {5, 2});
  Request e = make_req("h", {3, 2}), f = make_req("h", {3, 4});
  for (Request* r : {&a, &b, &e, &f}) r->collective = Collective::kAllgather;
  msgs[0].requests = {a, e};
  msgs[1].requests = {b, f};
  auto out = c.process(msgs, cache, Clock::now());
  REQUIRE(out.responses.size() == 2);
  CHECK(out.responses[0].ok());
  CHECK_THAT(out.responses[1].error, Catch::Contains("shape beyond the first dimension"));
}

TEST_CASE("coordinator: a rank's own failure reaches every rank", "[coordinator]") {
  ResponseCache cache(16);
  Coordinator c(2, 0, 0);
  auto msgs = empty_round(2);
  Request bad = make_req("t", {3});
  bad.error_kind = ErrorKind::kInvalidArgument;
  bad.error = "input buffer is null";
  msgs[0].requests = {make_req("t", {3})};
  msgs[1].requests = {bad};
  auto out = c.process(msgs, cache, Clock::now());
  REQUIRE(out.responses.size() == 1);
  CHECK(out.responses[0].error_kind == ErrorKind::kInvalidArgument);
  CHECK(out.responses[0].error == "allreduce 't': failed on rank 1: input buffer is null");
}

TEST_CASE("coordinator: version lag gives DivergenceError", "[coordinator][version]") {
  ResponseCache cache(16);
  Coordinator strict(2, 0, 0), loose(2, 1, 0);
  auto msgs = empty_round(2);
  Request a = make_req("s", {1}), b = make_req("s", {1});
  a.step = 5;
  b.step = 4;
  msgs[0].requests = {a};
  msgs[1].requests = {b};
  auto out = strict.process(msgs, cache, Clock::now());
  REQUIRE(out.responses.size() == 1);
  CHECK(out.responses[0].error_kind == ErrorKind::kDivergence);
  CHECK_THAT(out.responses[0].error, Catch::Contains("'s'") &&
                                         Catch::Contains("rank 0 at step 5") &&
                                         Catch::Contains("rank 1 at step 4"));
  out = loose.process(msgs, cache, Clock::now());
  CHECK(out.responses[0].ok());
  // Never committed: steps all 0, never flagged.
  CHECK_FALSE(check_lag("t", {0ull, 0ull, std::nullopt}, 0));
  CHECK(check_lag("t", {3ull, std::nullopt, 1ull}, 1));
}

TEST_CASE("coordinator: join, shutdown and stall failures", "[coordinator]") {
  ResponseCache cache(16);
  Coordinator c(3, 0, 2.5);
  auto msgs = empty_round(3);
  msgs[2].joined = true;
  msgs[0].requests = {make_req("g", {2}), make_req("m", {2}, DataType::kFloat32, ReduceOp::kMax)};
  msgs[1].requests = msgs[0].requests;
  auto out = c.process(msgs, cache, Clock::now());
  REQUIRE(out.responses.size() == 2);
  CHECK(out.responses[0].ok());
  CHECK(out.responses[0].joined == std::vector<bool>{false, false, true});
  CHECK(out.responses[0].contributors == 2);
  CHECK(out.responses[1].error_kind == ErrorKind::kState);  // max cannot take zeros
  CHECK_FALSE(out.join_completed);
  msgs = empty_round(3);
  msgs[1].joined = true;
  msgs[2].joined = true;
  msgs[0].requests = {make_req("late", {1})};
  out = c.process(msgs, cache, Clock::now());
  CHECK_FALSE(out.join_completed);
  REQUIRE(out.responses.size() == 1);  // ranks 1 and 2 joined: rank 0 alone runs it
  msgs = empty_round(3);
  msgs[0].joined = msgs[1].joined = msgs[2].joined = true;
  out = c.process(msgs, cache, Clock::now());
  REQUIRE(out.join_completed);
  CHECK(*out.join_completed == 0);  // rank 0 joined last
  CHECK(c.joined() == std::vector<bool>{false, false, false});

  msgs = empty_round(3);
  msgs[0].requests = {make_req("stuck", {1})};
  c.process(msgs, cache, Clock::now());
  msgs = empty_round(3);
  msgs[0].stall_failures = {"stuck"};
  msgs[1].shutdown = true;
  out = c.process(msgs, cache, Clock::now());
  CHECK(out.shutdown_rank == 1);
  REQUIRE(out.responses.size() == 1);
  CHECK(out.responses[0].error_kind == ErrorKind::kTimeout);
  CHECK_THAT(out.responses[0].error,
             Catch::Contains("'stuck'") && Catch::Contains("ranks 1, 2 never enqueued"));
}

TEST_CASE("fingerprints: digests and mismatch groups", "[fingerprint]") {
  std::vector<float> a(1001), b;
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i) * 0.25f;
  b = a;
  CHECK(hash_bytes(a.data(), a.size() * 4) == hash_bytes(b.data(), b.size() * 4));
  b[777] = std::nextafter(b[777], 1e9f);  // one ulp
  CHECK(hash_bytes(a.data(), a.size() * 4) != hash_bytes(b.data(), b.size() * 4));
  CHECK(hash_bytes(a.data(), 12) != hash_bytes(a.data(), 13));
  CHECK(hash_bytes(a.data(), 0) != hash_bytes(a.data(), 0, 1));
  auto m = find_mismatches({"w", "v"}, {{1, 5}, {1, 5}, {1, 3}});
  REQUIRE(m.size() == 1);
  CHECK(m[0].name == "v");
  REQUIRE(m[0].groups.size() == 2);
  CHECK(m[0].groups[0] == std::pair<std::uint64_t, std::vector<int>>{3, {2}});
  CHECK(m[0].groups[1] == std::pair<std::uint64_t, std::vector<int>>{5, {0, 1}});
}

TEST_CASE("timeline file is valid JSON after every event", "[timeline]") {
  // "{rank}" names rank 3's file.
  const std::string pattern = fmt::format("gyre_core_timeline_unit_{}_{{rank}}.json", ::getpid());
  const std::string path = fmt::format("gyre_core_timeline_unit_{}_3.json", ::getpid());
  auto parses = [&] {
    std::string cmd = "python3 -c \"import json,sys; d=json.load(open(sys.argv[1])); "
                      "assert isinstance(d['traceEvents'], list)\" " + path;
    return std::system(cmd.c_str()) == 0;
  };
  {
    Timeline t(3);
    t.start(pattern, false, "test");
    CHECK(parses());
    auto t0 = Clock::now();
    t.slice("grad \"q\"\n", "NEGOTIATE", t0, t0 + std::chrono::microseconds(5));
    CHECK(parses());
    t.slice("grad \"q\"\n", "ALLREDUCE", t0, t0 + std::chrono::microseconds(9),
            R"({"bytes":4})");
    t.slice("other", "QUEUE", t0, t0);
    CHECK(parses());
    CHECK(t.events() == 6);  // process name, 2 thread names, 3 slices
  }
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  CHECK_THAT(ss.str(), Catch::Contains("\"ph\":\"X\"") && Catch::Contains("\"pid\":3"));
  std::remove(path.c_str());
  Timeline bad(0);
  CHECK_THROWS_AS(bad.start("/nonexistent-dir/x.json", false, "test"), InvalidArgument);
  CHECK_FALSE(bad.active());
}

TEST_CASE("timeline: a FIFO or a directory is refused at once, with the reason", "[timeline]") {
  const std::string fifo = fmt::format("gyre_core_timeline_fifo_{}", ::getpid());
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // start() on its own thread: before the fix it waited for ever in open()
  // for a reader. If it has not returned within the bound, a reader is
  // opened to release it, so that the test fails instead of hanging.
  auto start_on = [](const std::string& path) {
    return std::async(std::launch::async, [path] {
      Timeline t(0);
      try {
        t.start(path, false, "GYRE_TIMELINE");
      } catch (const InvalidArgument& e) {
        return std::string(e.what());
      }
      return std::string("started");
    });
  };
  auto check_refused = [&](bool with_reader) {
    const int reader = with_reader ? ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK) : -1;
    auto result = start_on(fifo);
    const bool returned = result.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
    int release = -1;
    if (!returned) release = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
    const std::string what = result.get();
    if (release >= 0) ::close(release);
    if (reader >= 0) ::close(reader);
    CHECK(returned);
    CHECK_THAT(what, Catch::Contains("is a FIFO, not a regular file") &&
                         Catch::Contains(fifo) && Catch::Contains("GYRE_TIMELINE"));
  };
  SECTION("no reader") { check_refused(false); }
  SECTION("a reader waiting") { check_refused(true); }
  SECTION("a directory") {
    Timeline t(0);
    CHECK_THROWS_WITH(t.start(".", false, "start_timeline"),
                      Catch::Contains("is a directory, not a regular file"));
    CHECK_FALSE(t.active());
  }
  ::unlink(fifo.c_str());
}

TEST_CASE("coordinator: a grouped allreduce runs once the whole group is ready", "[coordinator]") {
  ResponseCache cache(16);
  Coordinator c(2, 0, 0);
  auto member = [](const std::string& name) {
    Request r = make_req(name, {2});
    r.group = "a";
    r.group_size = 2;
    return r;
  };
  auto msgs = empty_round(2);
  msgs[0].requests = {member("a"), make_req("x", {1}), member("b")};
  msgs[1].requests = {member("a"), make_req("x", {1})};
  auto out = c.process(msgs, cache, Clock::now());
  REQUIRE(out.responses.size() == 1);  // x; a waits for b
  CHECK(out.responses[0].name == "x");
  msgs = empty_round(2);
  msgs[1].requests = {member("b")};
  out = c.process(msgs, cache, Clock::now());
  REQUIRE(out.responses.size() == 2);
  CHECK(out.responses[0].name == "a");
  CHECK(out.responses[1].name == "b");
  CHECK(out.responses[0].ok());
  // One rank grouping what another does not: a mismatch on "group".
  msgs = empty_round(2);
  msgs[0].requests = {member("a"), member("b")};
  msgs[1].requests = {make_req("a", {2}), make_req("b", {2})};
  out = c.process(msgs, cache, Clock::now());
  REQUIRE(out.responses.size() == 2);
  CHECK_THAT(out.responses[0].error, Catch::Contains("ranks disagree on group"));
}

TEST_CASE("coordinator: collective, scale factors and root are compared too", "[coordinator]") {
  ResponseCache cache(16);
  Coordinator c(2, 0, 0);
  auto msgs = empty_round(2);
  Request ar = make_req("k", {2}), bc = make_req("k", {2});
  bc.collective = Collective::kBroadcast;
  bc.root = 0;
  Request p0 = make_req("p", {2}), p1 = make_req("p", {2});
  p1.prescale = 0.5;
  Request q0 = make_req("q", {2}), q1 = make_req("q", {2});
  q1.postscale = 2.0;
  msgs[0].requests = {ar, p0, q0};
  msgs[1].requests = {bc, p1, q1};
  auto out = c.process(msgs, cache, Clock::now());
  REQUIRE(out.responses.size() == 3);
  CHECK(out.responses[0].error ==
        "allreduce 'k': ranks disagree on collective: rank 0 has allreduce; rank 1 has broadcast");
  CHECK_THAT(out.responses[1].error, Catch::Contains("prescale") && Catch::Contains("rank 1 has 0.5"));
  CHECK_THAT(out.responses[2].error, Catch::Contains("postscale") && Catch::Contains("rank 1 has 2"));
  for (auto& r : out.responses) CHECK(r.error_kind == ErrorKind::kMismatch);
}
