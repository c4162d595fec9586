// Helpers shared by the collectives unit tests: typed element access through
// a DataType, closed-form inputs, comparison tolerances, and the scaffolding
// of tests that run ranks as threads over one cache-line-aligned region.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <thread>
#include <vector>

#include "gyre/collectives/float16.h"
#include "gyre/types.h"

namespace gyre::test {

// Writes v (already representable, or rounded by the type's own rule) as
// element i of a buffer of dtype dt.
inline void store(DataType dt, void* buf, std::size_t i, double v) {
  switch (dt) {
    case DataType::kFloat32: static_cast<float*>(buf)[i] = static_cast<float>(v); return;
    case DataType::kFloat64: static_cast<double*>(buf)[i] = v; return;
    case DataType::kFloat16:
      static_cast<std::uint16_t*>(buf)[i] = collectives::float_to_half(static_cast<float>(v));
      return;
    case DataType::kBFloat16:
      static_cast<std::uint16_t*>(buf)[i] = collectives::float_to_bf16(static_cast<float>(v));
      return;
    case DataType::kInt8: static_cast<std::int8_t*>(buf)[i] = static_cast<std::int8_t>(v); return;
    case DataType::kUInt8: static_cast<std::uint8_t*>(buf)[i] = static_cast<std::uint8_t>(v); return;
    case DataType::kInt32: static_cast<std::int32_t*>(buf)[i] = static_cast<std::int32_t>(v); return;
    case DataType::kInt64: static_cast<std::int64_t*>(buf)[i] = static_cast<std::int64_t>(v); return;
    case DataType::kInt16: static_cast<std::int16_t*>(buf)[i] = static_cast<std::int16_t>(v); return;
    case DataType::kBool: static_cast<std::uint8_t*>(buf)[i] = v != 0; return;
  }
}

inline double load(DataType dt, const void* buf, std::size_t i) {
  switch (dt) {
    case DataType::kFloat32: return static_cast<const float*>(buf)[i];
    case DataType::kFloat64: return static_cast<const double*>(buf)[i];
    case DataType::kFloat16:
      return collectives::half_to_float(static_cast<const std::uint16_t*>(buf)[i]);
    case DataType::kBFloat16:
      return collectives::bf16_to_float(static_cast<const std::uint16_t*>(buf)[i]);
    case DataType::kInt8: return static_cast<const std::int8_t*>(buf)[i];
    case DataType::kUInt8: return static_cast<const std::uint8_t*>(buf)[i];
    case DataType::kInt32: return static_cast<const std::int32_t*>(buf)[i];
    case DataType::kInt64: return static_cast<double>(static_cast<const std::int64_t*>(buf)[i]);
    case DataType::kInt16: return static_cast<const std::int16_t*>(buf)[i];
    case DataType::kBool: return static_cast<const std::uint8_t*>(buf)[i];
  }
  return 0;
}

// Relative tolerance for results that involve one inexact scaling (average,
// pre/postscale): a few units in the last place of the type. Everything else
// in these tests is exact by construction.
inline double scaled_tolerance(DataType dt) {
  switch (dt) {
    case DataType::kFloat16: return 2e-3;
    case DataType::kBFloat16: return 1.6e-2;
    case DataType::kFloat32: return 1e-6;
    case DataType::kFloat64: return 1e-14;
    default: return 0;
  }
}

inline bool close_enough(double got, double want, double rel) {
  if (rel == 0) return got == want;
  return std::fabs(got - want) <= rel * std::max(1.0, std::fabs(want));
}

// The dtypes of the sweeps (every dtype and op, world sizes, counts). Under
// ThreadSanitizer (scripts/test.sh's TSan stage: ranks as threads) a sweep
// takes one type of each kind: TSan looks for races, whose code paths do not
// depend on the element type, and the full sweeps took most of its 7 minutes
// there. Every type's arithmetic is checked by the ordinary and ASan builds.
#if defined(__SANITIZE_THREAD__)
#define GYRE_TEST_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define GYRE_TEST_UNDER_TSAN 1
#endif
#endif
#ifdef GYRE_TEST_UNDER_TSAN
inline constexpr DataType kAllTypes[] = {DataType::kFloat32, DataType::kFloat16,
                                         DataType::kInt64, DataType::kBool};
#else
inline constexpr DataType kAllTypes[] = {
    DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16,
    DataType::kInt8,    DataType::kUInt8,   DataType::kInt16,   DataType::kInt32,
    DataType::kInt64,   DataType::kBool};
#endif
inline constexpr ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin,
                                       ReduceOp::kMax, ReduceOp::kProduct};

// Closed-form contributions: rank r's element i, small integers so every
// type holds them and every reduction of them exactly.
inline double contribution(ReduceOp op, int r, std::size_t i) {
  if (op == ReduceOp::kProduct) return 1.0 + static_cast<double>((static_cast<std::size_t>(r) + i) % 2);
  return static_cast<double>(r) + static_cast<double>(i % 7);
}

// The reduction of contribution(op, r, i) over ranks 0..n-1.
inline double expected(ReduceOp op, int n, std::size_t i) {
  const double base = static_cast<double>(i % 7);
  switch (op) {
    case ReduceOp::kSum: return n * base + n * (n - 1) / 2.0;
    case ReduceOp::kAverage: return base + (n - 1) / 2.0;
    case ReduceOp::kMin: return base;
    case ReduceOp::kMax: return base + (n - 1);
    case ReduceOp::kProduct: {
      double p = 1;
      for (int r = 0; r < n; ++r) p *= contribution(op, r, i);
      return p;
    }
  }
  return 0;
}

// The reduction as dtype dt defines it: integers average by truncating
// toward zero (Horovod's rule, exact here since the factor is 1/n); bool
// reduces the truth of each contribution (sum, max: or; min, product: and).
inline double expected(DataType dt, ReduceOp op, int n, std::size_t i) {
  if (dt == DataType::kBool) {
    const bool any = op == ReduceOp::kSum || op == ReduceOp::kMax;
    bool acc = !any;
    for (int r = 0; r < n; ++r) {
      const bool v = contribution(op, r, i) != 0;
      acc = any ? (acc || v) : (acc && v);
    }
    return acc ? 1.0 : 0.0;
  }
  if (op == ReduceOp::kAverage && !is_floating(dt)) {
    return std::trunc(expected(ReduceOp::kSum, n, i) / n);
  }
  return expected(op, n, i);
}

// A zeroed, cache-line-aligned region that threads map as a host's segment.
struct Region {
  explicit Region(std::size_t bytes)
      : p(static_cast<std::byte*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64))) {
    std::memset(p, 0, bytes);
  }
  ~Region() { std::free(p); }
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;
  std::byte* p;
};

// Runs fn(r) for r in [0, n) on n threads, joins them all, then rethrows the
// first exception any of them raised.
template <class Fn>
void on_threads(int n, Fn fn) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace gyre::test
