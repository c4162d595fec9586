// A seeded mutation test of the negotiation decoder and the coordinator:
// valid messages with random bytes changed, inserted, dropped or cut must
// either decode or fail with a TransportError naming the peer, and what
// decodes must go through the coordinator without crashing. Fixed seeds,
// so a failure reproduces; run it under ASan to catch out-of-bounds reads.
// The seed corpus of the libFuzzer targets (tests/fuzz/corpus) is read too:
// its messages must still decode (else the wire format changed: rerun
// tests/fuzz/make_corpus.sh), and are mutated like the built-in seeds.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <span>

#include "negotiation/coordinator.h"
#include "negotiation/message.h"
#include "negotiation/response_cache.h"

using namespace gyre;
using namespace gyre::core;

namespace {

constexpr int kWorld = 3;

// Valid messages covering every collective and every field.
std::vector<RoundMessage> seeds() {
  auto req = [](const std::string& name, Collective c, std::vector<std::int64_t> shape) {
    Request r;
    r.name = name;
    r.collective = c;
    r.shape = std::move(shape);
    r.seq = 1;
    return r;
  };
  RoundMessage a;
  a.step = 7;
  a.cache_hits = {0, 2};
  a.requests.push_back(req("grad.0", Collective::kAllreduce, {4, 3}));
  a.requests.back().op = ReduceOp::kAverage;
  a.requests.back().prescale = 0.5;
  a.requests.push_back(req("gather", Collective::kAllgather, {2, 5}));
  a.requests.push_back(req("bcast", Collective::kBroadcast, {8}));
  a.requests.back().root = 2;
  Request t = req("a2a", Collective::kAlltoall, {6, 2});
  t.splits = {1, 2, 3};
  a.requests.push_back(t);
  a.requests.push_back(req("rs", Collective::kReducescatter, {9}));
  RoundMessage b;
  b.joined = true;
  b.requests.push_back(req("__gyre.fingerprint.0", Collective::kFingerprint, {}));
  b.requests.back().digests = {11, 22, 33};
  b.requests.push_back(req("__gyre.resync.0", Collective::kResync, {}));
  b.requests.back().digests = {44};
  b.requests.back().resync_policy = ResyncPolicy::kAverage;
  Request g = req("g.1", Collective::kAllreduce, {3});
  g.group = "g.0";
  g.group_size = 2;
  b.requests.push_back(g);
  Request bad = req("bad", Collective::kAllreduce, {1});
  bad.error_kind = ErrorKind::kInvalidArgument;
  bad.error = "input buffer is null";
  b.requests.push_back(bad);
  b.stall_failures = {"stuck"};
  RoundMessage c;
  c.shutdown = true;
  return {a, b, c};
}

std::vector<std::byte> mutate(std::vector<std::byte> m, std::mt19937& rng) {
  auto pick = [&](std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n)(rng); };
  const int edits = 1 + static_cast<int>(pick(3));
  for (int e = 0; e < edits && !m.empty(); ++e) {
    switch (pick(5)) {
      case 0: m[pick(m.size() - 1)] = static_cast<std::byte>(pick(255)); break;
      case 1: m[pick(m.size() - 1)] ^= static_cast<std::byte>(1u << pick(7)); break;
      case 2: m.insert(m.begin() + static_cast<long>(pick(m.size())), static_cast<std::byte>(pick(255))); break;
      case 3: m.erase(m.begin() + static_cast<long>(pick(m.size() - 1))); break;
      case 4: m.resize(pick(m.size())); break;
      default: {  // an extreme 32-bit value (a length or a count) somewhere
        if (m.size() < 4) break;
        const std::uint32_t v[] = {0xffffffffu, 0x80000000u, 0x7fffffffu, 0x10000u, 0};
        std::memcpy(m.data() + pick(m.size() - 4), &v[pick(4)], 4);
      }
    }
  }
  // Mostly keep the length field consistent, so that the mutation reaches
  // the fields behind it.
  if (m.size() >= 4 && pick(3) != 0) {
    auto len = static_cast<std::uint32_t>(m.size());
    std::memcpy(m.data(), &len, 4);
  }
  return m;
}

}  // namespace

TEST_CASE("negotiation messages: the empty message is the documented minimum", "[message][fuzz]") {
  CHECK(encode(RoundMessage{}).size() == kMinMessageBytes);
}

TEST_CASE("negotiation messages: mutated bytes decode or fail with TransportError",
          "[message][fuzz]") {
  const auto valid = seeds();
  for (const auto& m : valid) REQUIRE_NOTHROW(decode(encode(m), 1, kWorld));
  int decoded = 0, refused = 0;
  for (std::uint32_t seed : {1u, 2u, 3u, 4u}) {
    std::mt19937 rng(seed);
    for (int i = 0; i < 1500; ++i) {
      const RoundMessage& base = valid[static_cast<std::size_t>(i) % valid.size()];
      const auto bytes = mutate(encode(base), rng);
      RoundMessage m;
      try {
        m = decode(bytes, 1, kWorld);
      } catch (const TransportError& e) {
        ++refused;
        REQUIRE_THAT(e.what(), Catch::Contains("rank 1"));
        continue;
      }
      ++decoded;
      // What decodes goes through the coordinator, with the other ranks'
      // valid messages and a cache that holds a few entries.
      ResponseCache cache(4);
      cache.put(valid[0].requests[0]);
      Coordinator coord(kWorld, 0, 1.0);
      std::vector<RoundMessage> msgs = {valid[0], m, valid[1]};
      msgs[0].cache_hits.clear();
      try {
        coord.process(msgs, cache, Clock::now());
        coord.process(std::vector<RoundMessage>(kWorld), cache, Clock::now());
      } catch (const TransportError& e) {
        REQUIRE_THAT(e.what(), Catch::Contains("rank"));
      }
    }
  }
  // Both outcomes were reached: the mutations are neither all fatal nor
  // all harmless.
  CHECK(decoded > 100);
  CHECK(refused > 100);
}

namespace {

std::vector<std::byte> read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(c.size());
  std::memcpy(out.data(), c.data(), c.size());
  return out;
}

std::vector<std::filesystem::path> corpus(const char* target) {
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(GYRE_FUZZ_CORPUS) / target)) {
    files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// Splits a coordinator corpus file into its messages (each starts with its
// length) and groups them into rounds of kWorld.
std::vector<std::vector<std::byte>> split(const std::vector<std::byte>& all) {
  std::vector<std::vector<std::byte>> out;
  std::size_t at = 0;
  while (at < all.size()) {
    const std::size_t len = encoded_length(std::span<const std::byte>(all).subspan(at));
    REQUIRE(len >= kMinMessageBytes);
    REQUIRE(at + len <= all.size());
    out.emplace_back(all.begin() + static_cast<long>(at), all.begin() + static_cast<long>(at + len));
    at += len;
  }
  return out;
}

}  // namespace

TEST_CASE("negotiation messages: the fuzz corpus decodes, runs through the coordinator, and "
          "its mutations decode or fail with TransportError",
          "[message][fuzz]") {
  const auto messages = corpus("message");
  const auto rounds = corpus("coordinator");
  REQUIRE(messages.size() >= 10);
  REQUIRE(rounds.size() >= 5);
  std::vector<std::vector<std::byte>> seeds_bytes;
  for (const auto& p : messages) {
    INFO(p.string());
    auto bytes = read_file(p);
    REQUIRE_NOTHROW(decode(bytes, 1, kWorld));
    seeds_bytes.push_back(std::move(bytes));
  }
  // Every coordinator file is a valid sequence of rounds: two coordinators
  // decide the same, and the scenarios reach responses.
  std::size_t responses = 0;
  for (const auto& p : rounds) {
    INFO(p.string());
    const auto parts = split(read_file(p));
    REQUIRE(parts.size() % kWorld == 0);
    Coordinator a(kWorld, 1, 1.0), b(kWorld, 1, 1.0);
    ResponseCache ca(8), cb(8);
    for (std::size_t i = 0; i < parts.size(); i += kWorld) {
      std::vector<RoundMessage> msgs;
      for (int r = 0; r < kWorld; ++r) msgs.push_back(decode(parts[i + static_cast<std::size_t>(r)], r, kWorld));
      const auto x = a.process(msgs, ca, Clock::now());
      const auto y = b.process(msgs, cb, Clock::now());
      REQUIRE(x.responses.size() == y.responses.size());
      for (std::size_t k = 0; k < x.responses.size(); ++k) {
        CHECK(x.responses[k].name == y.responses[k].name);
        CHECK(x.responses[k].error == y.responses[k].error);
      }
      responses += x.responses.size();
    }
  }
  CHECK(responses > 10);
  int refused = 0;
  std::mt19937 rng(20261125);
  for (int i = 0; i < 3000; ++i) {
    const auto bytes = mutate(seeds_bytes[static_cast<std::size_t>(i) % seeds_bytes.size()], rng);
    try {
      const RoundMessage m = decode(bytes, 1, kWorld);
      Coordinator coord(kWorld, 0, 1.0);
      ResponseCache cache(4);
      std::vector<RoundMessage> msgs(kWorld);
      msgs[1] = m;
      try {
        coord.process(msgs, cache, Clock::now());
      } catch (const TransportError& e) {
        REQUIRE_THAT(e.what(), Catch::Contains("rank 1"));
      }
    } catch (const TransportError& e) {
      ++refused;
      REQUIRE_THAT(e.what(), Catch::Contains("rank 1"));
    }
  }
  CHECK(refused > 100);
}
