#include "api/fingerprint.h"

#include <cstring>

namespace gyre::core {

namespace {
constexpr std::uint64_t kMulA = 0x9fb21c651e98df25ULL;
constexpr std::uint64_t kMulB = 0xc2b2ae3d27d4eb4fULL;

inline std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 32;
  x *= kMulA;
  x ^= x >> 29;
  x *= kMulB;
  x ^= x >> 32;
  return x;
}
}  // namespace

std::uint64_t hash_bytes(const void* data, std::size_t bytes, std::uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  // Four independent lanes over 8-byte words keep the multiplier pipeline
  // busy; each word is multiplied, xor-shifted and folded into its lane.
  std::uint64_t lane[4] = {seed ^ kMulA, seed ^ kMulB, seed + bytes, ~seed};
  std::size_t i = 0;
  for (; i + 32 <= bytes; i += 32) {
    for (int k = 0; k < 4; ++k) {
      std::uint64_t w;
      std::memcpy(&w, p + i + 8 * k, 8);
      w *= kMulB;
      w ^= w >> 31;
      lane[k] = (lane[k] ^ w) * kMulA;
      lane[k] = (lane[k] << 27) | (lane[k] >> 37);
    }
  }
  std::uint64_t h = mix(lane[0]) ^ (mix(lane[1]) * 3) ^ (mix(lane[2]) * 5) ^ (mix(lane[3]) * 7);
  for (; i + 8 <= bytes; i += 8) {
    std::uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = mix(h ^ (w * kMulB));
  }
  if (i < bytes) {
    std::uint64_t w = 0;
    std::memcpy(&w, p + i, bytes - i);
    h = mix(h ^ (w * kMulB) ^ (bytes - i));
  }
  return mix(h ^ bytes);
}

std::uint64_t hash_combine(std::uint64_t h, std::string_view s) {
  return hash_bytes(s.data(), s.size(), mix(h + 0x632be59bd9b4e019ULL));
}

}  // namespace gyre::core
