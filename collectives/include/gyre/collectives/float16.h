// IEEE binary16 (float16) and bfloat16 <-> float32 conversions, exact for
// every input class: zeros, subnormals, normals, infinities and NaN (NaN
// stays NaN, made quiet, keeping the top payload bits). float32 -> 16-bit
// rounds to nearest, ties to even. Written with integer arithmetic and
// selects, no table and no branch on the data, so that the reduction loops
// that call them can be vectorised (see reduce_kernels.cc).
#pragma once

#include <bit>
#include <cstdint>

namespace gyre::collectives {

inline float bf16_to_float(std::uint16_t h) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

inline std::uint16_t float_to_bf16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  // Ties to even: add 0x7fff plus the lowest kept bit, then truncate. A
  // carry out of the mantissa correctly bumps the exponent (up to infinity).
  const std::uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const bool nan = (x & 0x7fffffffu) > 0x7f800000u;
  // Truncation could turn a NaN with only low payload bits into infinity;
  // setting the quiet bit keeps it a NaN.
  return static_cast<std::uint16_t>(nan ? ((x >> 16) | 0x0040u) : rounded);
}

inline float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t em = h & 0x7fffu;  // exponent and mantissa
  const std::uint32_t exp = em & 0x7c00u;
  // Normal numbers: move the fields into place and rebias the exponent
  // (15 -> 127, i.e. add 112 << 23).
  const std::uint32_t normal = (em << 13) + (112u << 23);
  // Infinity and NaN: exponent all ones in both formats.
  const std::uint32_t special = (em << 13) | 0x7f800000u;
  // Subnormals (and zero): m * 2^-24 computed exactly as the float
  // (2^-14 * (1 + m/1024)) - 2^-14; both operands are normal floats, so no
  // float denormal is ever produced or consumed.
  const float sub = std::bit_cast<float>((em << 13) + (113u << 23)) - 6.103515625e-05f;
  const std::uint32_t subnormal = std::bit_cast<std::uint32_t>(sub);
  // Selects as masks rather than ?: so that gcc if-converts and vectorises
  // the loops that inline this.
  const std::uint32_t sub_mask = 0u - static_cast<std::uint32_t>(exp == 0);
  const std::uint32_t special_mask = 0u - static_cast<std::uint32_t>(exp == 0x7c00u);
  const std::uint32_t bits = (subnormal & sub_mask) | (special & special_mask) |
                             (normal & ~(sub_mask | special_mask));
  return std::bit_cast<float>(sign | bits);
}

inline std::uint16_t float_to_half(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t a = x & 0x7fffffffu;  // |f|
  // |f| >= 2^16 overflows (values in [65520, 65536) are handled by the
  // normal path, whose rounding carries them into infinity).
  const std::uint32_t nan_mask = 0u - static_cast<std::uint32_t>(a > 0x7f800000u);
  const std::uint32_t big = 0x7c00u | (nan_mask & (0x0200u | ((a >> 13) & 0x3ffu)));
  // Normal half range [2^-14, 2^16): rebias, round to nearest even on the
  // 13 dropped bits (the carry may propagate into the exponent; fine).
  const std::uint32_t normal = (a - (112u << 23) + 0x0fffu + ((a >> 13) & 1u)) >> 13;
  // Below 2^-14: adding 0.5 aligns the value so that the FPU's own
  // round-to-nearest-even leaves exactly the half subnormal (or 2^-14 on
  // round-up) in the low mantissa bits.
  const float shifted = std::bit_cast<float>(a) + 0.5f;
  const std::uint32_t sub = std::bit_cast<std::uint32_t>(shifted) - 0x3f000000u;
  const std::uint32_t big_mask = 0u - static_cast<std::uint32_t>(a >= 0x47800000u);
  const std::uint32_t sub_mask = 0u - static_cast<std::uint32_t>(a < 0x38800000u);
  const std::uint32_t bits = (big & big_mask) | (sub & sub_mask) | (normal & ~(big_mask | sub_mask));
  return static_cast<std::uint16_t>(sign | bits);
}

}  // namespace gyre::collectives
