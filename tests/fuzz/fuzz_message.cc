// libFuzzer target: the negotiation message decoder on arbitrary bytes.
//
// decode() must either return a message or throw TransportError naming the
// peer: any other exception, a crash, an out-of-bounds read or a huge
// allocation (ASan, -rss_limit_mb / -malloc_limit_mb) is a finding. What
// decodes must survive a round trip: encoding it and decoding the result
// gives a message that encodes to the same bytes.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>

#include "gyre/error.h"
#include "negotiation/message.h"

using namespace gyre;
using namespace gyre::core;

namespace {
constexpr int kWorld = 3;
constexpr int kFrom = 1;

[[noreturn]] void finding(const char* what, const char* detail) {
  std::fprintf(stderr, "fuzz_message: %s: %s\n", what, detail);
  std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  RoundMessage m;
  try {
    m = decode(bytes, kFrom, kWorld);
  } catch (const TransportError& e) {
    if (!std::strstr(e.what(), "rank 1")) finding("a refusal does not name the peer", e.what());
    return 0;
  } catch (const std::exception& e) {
    finding("decode threw something other than TransportError", e.what());
  }
  const auto once = encode(m);
  RoundMessage again;
  try {
    again = decode(once, kFrom, kWorld);
  } catch (const std::exception& e) {
    finding("a decoded message, encoded again, does not decode", e.what());
  }
  const auto twice = encode(again);
  if (once != twice) finding("round trip", "encode(decode(encode(m))) != encode(m)");
  return 0;
}
