// Element codecs and reduction operators shared by the kernel files
// (reduce_kernels.cc: portable loops; reduce_kernels_x86.cc: AVX2/F16C
// loops for the 16-bit float types). Internal to collectives/.
#pragma once

#include <cstdint>
#include <type_traits>

#include "gyre/collectives/float16.h"

namespace gyre::collectives::kernels {

// How an element is stored and in which type it is combined.
template <class T>
struct Codec {
  using Storage = T;
  using Compute = T;
  static T load(T x) { return x; }
  static T store(T x) { return x; }
};
struct Half {};
struct BFloat {};
template <>
struct Codec<Half> {
  using Storage = std::uint16_t;
  using Compute = float;
  static float load(std::uint16_t x) { return half_to_float(x); }
  static std::uint16_t store(float x) { return float_to_half(x); }
};
template <>
struct Codec<BFloat> {
  using Storage = std::uint16_t;
  using Compute = float;
  static float load(std::uint16_t x) { return bf16_to_float(x); }
  static std::uint16_t store(float x) { return float_to_bf16(x); }
};

// Integer sum and product in the unsigned type: wrap-around is then defined
// behaviour (and identical to the two's-complement result).
template <class T>
T wrap_add(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}
template <class T>
T wrap_mul(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    return a * b;
  }
}

struct OpSum {
  template <class T> static T apply(T a, T b) { return wrap_add(a, b); }
};
struct OpProd {
  template <class T> static T apply(T a, T b) { return wrap_mul(a, b); }
};
struct OpMin {
  template <class T> static T apply(T a, T b) { return b < a ? b : a; }
};
struct OpMax {
  template <class T> static T apply(T a, T b) { return a < b ? b : a; }
};
// bool, stored as one byte: any non-zero byte reads as true and every
// result is 0 or 1.
struct OpOr {
  template <class T> static T apply(T a, T b) { return static_cast<T>((a | b) != 0); }
};
struct OpAnd {
  template <class T> static T apply(T a, T b) { return static_cast<T>((a != 0) & (b != 0)); }
};

}  // namespace gyre::collectives::kernels
