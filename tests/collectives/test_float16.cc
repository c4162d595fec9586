// float16 / bfloat16 conversions: every 16-bit pattern widened, and
// narrowing checked on every value class, on the exact midpoints between
// neighbouring 16-bit values (ties to even) and just either side of them.
// The float16 reference is the compiler's own _Float16 conversion (gcc's
// soft-float routines); the bfloat16 reference is exact arithmetic in double.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "gyre/collectives/float16.h"

using namespace gyre::collectives;

namespace {

std::uint32_t bits(float f) { return std::bit_cast<std::uint32_t>(f); }
float from_bits(std::uint32_t b) { return std::bit_cast<float>(b); }

// Exact value of a half bit pattern, computed from its fields.
double half_value(std::uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  if (exp == 0x1f) return mant ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(mant, -24);
  return sign * std::ldexp(1024 + mant, exp - 25);
}

#ifdef __FLT16_MANT_DIG__
std::uint16_t reference_to_half(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  std::uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}
#endif

// bfloat16 round to nearest even, by comparing distances in double.
std::uint16_t reference_to_bf16(float f) {
  if (std::isnan(f)) return 0x7fc0;
  const std::uint32_t b = bits(f);
  const std::uint32_t lo = b & 0xffff0000u;
  const std::uint32_t hi = lo + 0x10000u;  // next bf16 away from zero
  const double dlo = std::fabs(double(f) - double(from_bits(lo)));
  // hi may be the pattern just past the largest finite value: infinity.
  const double vhi = (hi & 0x7fffffffu) == 0x7f800000u
                         ? std::ldexp(1.0, 128) * (f < 0 ? -1 : 1)
                         : double(from_bits(hi));
  const double dhi = std::fabs(vhi - double(f));
  if (dlo < dhi) return static_cast<std::uint16_t>(lo >> 16);
  if (dhi < dlo) return static_cast<std::uint16_t>(hi >> 16);
  return static_cast<std::uint16_t>(((lo >> 16) & 1) ? hi >> 16 : lo >> 16);
}

bool same_16(std::uint16_t got, std::uint16_t want, bool half) {
  const std::uint16_t exp_mask = half ? 0x7c00 : 0x7f80;
  const std::uint16_t mant_mask = half ? 0x03ff : 0x007f;
  const bool got_nan = (got & exp_mask) == exp_mask && (got & mant_mask);
  const bool want_nan = (want & exp_mask) == exp_mask && (want & mant_mask);
  if (got_nan || want_nan) return got_nan && want_nan;  // any NaN is a NaN
  return got == want;
}

}  // namespace

TEST_CASE("half_to_float is exact for all 65536 patterns", "[float16]") {
  int wrong = 0;
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float f = half_to_float(static_cast<std::uint16_t>(h));
    const double want = half_value(static_cast<std::uint16_t>(h));
    const bool ok = std::isnan(want) ? std::isnan(f) : (double(f) == want && std::signbit(f) == std::signbit(want));
    if (!ok && wrong++ < 5) FAIL_CHECK("half 0x" << std::hex << h << " -> " << f << " want " << want);
  }
  CHECK(wrong == 0);
}

TEST_CASE("float16 edge values", "[float16]") {
  CHECK(float_to_half(0.0f) == 0x0000);
  CHECK(float_to_half(-0.0f) == 0x8000);
  CHECK(float_to_half(INFINITY) == 0x7c00);
  CHECK(float_to_half(-INFINITY) == 0xfc00);
  CHECK(float_to_half(65504.0f) == 0x7bff);         // largest finite
  CHECK(float_to_half(65519.99f) == 0x7bff);        // below the midpoint to infinity
  CHECK(float_to_half(65520.0f) == 0x7c00);         // tie, rounds to even = infinity
  CHECK(float_to_half(1e10f) == 0x7c00);
  CHECK(float_to_half(std::ldexp(1.0f, -14)) == 0x0400);   // smallest normal
  CHECK(float_to_half(std::ldexp(1.0f, -24)) == 0x0001);   // smallest subnormal
  CHECK(float_to_half(std::ldexp(1.0f, -25)) == 0x0000);   // tie between 0 and 2^-24: even = 0
  CHECK(float_to_half(std::ldexp(1.5f, -25)) == 0x0001);   // above the tie
  CHECK(float_to_half(std::ldexp(3.0f, -25)) == 0x0002);   // tie between 1 and 2 ulps: even = 2
  CHECK(float_to_half(std::ldexp(1023.5f, -24)) == 0x0400);  // largest subnormal rounds up to normal
  CHECK(float_to_half(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);  // tie: even mantissa kept
  CHECK(float_to_half(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);  // tie: rounds up to even
  CHECK(float_to_half(1e-30f) == 0x0000);  // a float subnormal-range input underflows to 0
  CHECK(float_to_half(-1e-45f) == 0x8000);  // float denormal, sign kept
  const std::uint16_t qnan = float_to_half(std::numeric_limits<float>::quiet_NaN());
  CHECK((qnan & 0x7c00) == 0x7c00);
  CHECK((qnan & 0x03ff) != 0);
  // A signalling NaN whose payload sits only in the low 13 bits stays a NaN.
  const std::uint16_t snan = float_to_half(from_bits(0x7f800001u));
  CHECK((snan & 0x7c00) == 0x7c00);
  CHECK((snan & 0x03ff) != 0);
  CHECK(std::isnan(half_to_float(0x7e00)));
  CHECK(half_to_float(0x0001) == std::ldexp(1.0f, -24));
  CHECK(half_to_float(0x83ff) == -std::ldexp(1023.0f, -24));
}

#ifdef __FLT16_MANT_DIG__
TEST_CASE("float_to_half matches _Float16 at every midpoint and a million samples", "[float16]") {
  int wrong = 0;
  auto check_one = [&](float f) {
    const std::uint16_t got = float_to_half(f), want = reference_to_half(f);
    if (!same_16(got, want, true) && wrong++ < 5) {
      FAIL_CHECK("float bits 0x" << std::hex << bits(f) << ": got 0x" << got << " want 0x" << want);
    }
  };
  for (std::uint32_t h = 0; h < 0x7c00; ++h) {
    // Midpoint between half h and h+1, and one float ulp either side.
    const double mid = (half_value(static_cast<std::uint16_t>(h)) +
                        (h + 1 == 0x7c00 ? 65536.0 : half_value(static_cast<std::uint16_t>(h + 1)))) / 2;
    const float m = static_cast<float>(mid);  // exact: a half midpoint fits in a float
    for (float f : {m, std::nextafter(m, 0.0f), std::nextafter(m, INFINITY),
                    static_cast<float>(half_value(static_cast<std::uint16_t>(h)))}) {
      check_one(f);
      check_one(-f);
    }
  }
  std::mt19937 gen(12345);
  for (int i = 0; i < 1'000'000; ++i) check_one(from_bits(static_cast<std::uint32_t>(gen())));
  CHECK(wrong == 0);
}
#endif

TEST_CASE("bfloat16 conversions", "[bfloat16]") {
  int wrong = 0;
  for (std::uint32_t h = 0; h < 0x10000; ++h) {  // widening is exact, round trip is identity
    const float f = bf16_to_float(static_cast<std::uint16_t>(h));
    if (bits(f) != h << 16 && wrong++ < 5) FAIL_CHECK("bf16 0x" << std::hex << h);
    if (!std::isnan(f) && float_to_bf16(f) != h && wrong++ < 5) FAIL_CHECK("round trip 0x" << std::hex << h);
  }
  auto check_one = [&](float f) {
    const std::uint16_t got = float_to_bf16(f), want = reference_to_bf16(f);
    if (!same_16(got, want, false) && wrong++ < 5) {
      FAIL_CHECK("float bits 0x" << std::hex << bits(f) << ": got 0x" << got << " want 0x" << want);
    }
  };
  for (std::uint32_t h = 0; h < 0x7f80; ++h) {  // ties, and either side of them
    const std::uint32_t mid = (h << 16) | 0x8000u;
    for (std::uint32_t b : {mid, mid - 1, mid + 1}) {
      check_one(from_bits(b));
      check_one(from_bits(b | 0x80000000u));
    }
  }
  std::mt19937 gen(777);
  for (int i = 0; i < 1'000'000; ++i) check_one(from_bits(static_cast<std::uint32_t>(gen())));
  CHECK(wrong == 0);
  CHECK(float_to_bf16(INFINITY) == 0x7f80);
  CHECK(float_to_bf16(-INFINITY) == 0xff80);
  CHECK(float_to_bf16(std::numeric_limits<float>::max()) == 0x7f80);  // rounds to infinity
  CHECK(float_to_bf16(from_bits(0x00000001u)) == 0x0000);              // tiny subnormal
  CHECK(float_to_bf16(from_bits(0x00018000u)) == 0x0002);              // subnormal tie to even
  const std::uint16_t snan = float_to_bf16(from_bits(0x7f800001u));    // NaN payload in low bits
  CHECK((snan & 0x7f80) == 0x7f80);
  CHECK((snan & 0x007f) != 0);
}
