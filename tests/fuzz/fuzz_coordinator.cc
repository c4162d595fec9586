// libFuzzer target: the coordinator fed decoded messages, round after round.
//
// The input is a sequence of encoded negotiation messages, each starting
// with its 4-byte length as on the wire; message i is rank i % 3's in round
// i / 3. A message that does not decode is replaced by an empty one (in the
// runtime it would end the job; here the rounds go on, so the fuzzer can
// reach the coordinator's states). Two coordinators, each with its own
// response cache, process the same rounds, as two ranks would.
//
// Findings: a crash or out-of-bounds access (ASan), an exception other than
// TransportError (a cache slot a peer refers to that this rank does not
// hold is refused with a TransportError naming that rank), the two
// coordinators deciding differently (ranks would pair different transfers),
// or a response that breaks its invariants: one entry per rank, and a
// successful response has a request or the joined flag from every rank.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "gyre/error.h"
#include "negotiation/coordinator.h"
#include "negotiation/message.h"
#include "negotiation/response_cache.h"

using namespace gyre;
using namespace gyre::core;

namespace {
constexpr int kWorld = 3;
constexpr std::size_t kCacheCapacity = 8;  // small: evictions happen
constexpr int kMaxRounds = 64;

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "fuzz_coordinator: %s\n", what.c_str());
  std::abort();
}

struct Rank {
  Coordinator coord{kWorld, 1, 1.0};
  ResponseCache cache{kCacheCapacity};
  bool failed = false;  // threw TransportError: in the runtime the job ends
};

// What one round decided, as text to compare between the two coordinators.
std::string summary(const RoundOutcome& out) {
  std::string s = std::to_string(out.shutdown_rank) + "|" +
                  (out.join_completed ? std::to_string(*out.join_completed) : "-") + "|";
  for (const Response& r : out.responses) {
    s += r.name + ":" + std::to_string(static_cast<int>(r.error_kind)) + ":" + r.error + ":" +
         std::to_string(r.contributors) + ";";
  }
  return s;
}

void check_invariants(const RoundOutcome& out) {
  for (const Response& r : out.responses) {
    if (r.per_rank.size() != kWorld || r.joined.size() != kWorld) {
      finding("response '" + r.name + "' without one entry per rank");
    }
    if (!r.ok()) continue;
    for (int q = 0; q < kWorld; ++q) {
      if (!r.per_rank[static_cast<std::size_t>(q)] && !r.joined[static_cast<std::size_t>(q)]) {
        finding("response '" + r.name + "' succeeded without rank " + std::to_string(q));
      }
    }
    if (r.contributors < 1) finding("response '" + r.name + "' succeeded without a request");
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<RoundMessage> msgs;
  std::size_t at = 0;
  while (at + 4 <= size && msgs.size() < kMaxRounds * kWorld) {
    const auto rest = std::span<const std::byte>(reinterpret_cast<const std::byte*>(data) + at,
                                                 size - at);
    const std::size_t len = std::min<std::size_t>(std::max<std::uint32_t>(encoded_length(rest), 4),
                                                  rest.size());
    const int from = static_cast<int>(msgs.size() % kWorld);
    try {
      msgs.push_back(decode(rest.first(len), from, kWorld));
    } catch (const TransportError&) {
      msgs.emplace_back();
    }
    at += len;
  }
  while (msgs.size() % kWorld != 0) msgs.emplace_back();

  Rank a, b;
  const auto now = Clock::now();
  for (std::size_t round = 0; round < msgs.size() / kWorld; ++round) {
    const std::vector<RoundMessage> these(msgs.begin() + static_cast<long>(round * kWorld),
                                          msgs.begin() + static_cast<long>((round + 1) * kWorld));
    std::string decided[2];
    Rank* ranks[2] = {&a, &b};
    for (int i = 0; i < 2; ++i) {
      try {
        RoundOutcome out = ranks[i]->coord.process(these, ranks[i]->cache, now);
        check_invariants(out);
        decided[i] = summary(out);
      } catch (const TransportError& e) {
        if (!std::strstr(e.what(), "rank ")) finding(std::string("refusal names no rank: ") + e.what());
        ranks[i]->failed = true;
        decided[i] = std::string("refused: ") + e.what();
      } catch (const std::exception& e) {
        finding(std::string("process threw something other than TransportError: ") + e.what());
      }
    }
    if (decided[0] != decided[1]) {
      finding("two coordinators decided differently on the same messages:\n  " + decided[0] +
              "\n  " + decided[1]);
    }
    if (a.failed) break;  // the job would end here
  }
  return 0;
}
