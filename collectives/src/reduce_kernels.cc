// Reduction kernels: one template instantiated per (dtype, op), looked up in
// a table. Compiled with -O3 (see collectives/CMakeLists.txt). These are the
// portable loops; for float16/bfloat16 on CPUs with AVX2+F16C the lookup
// returns the hand-written loops of reduce_kernels_x86.cc instead (measured
// on this machine, 256 KiB in cache, out = a + b: float16 1.0 -> 29.6 GB/s,
// bfloat16 4.1 -> 12.3 GB/s; float32 is ~45-50 GB/s either way).
//
// Vectorisation, checked with gcc 12.2 on x86-64 at baseline ISA (SSE2, no
// -march), flags `-std=c++20 -O3`:
// - `-fopt-info-vec-optimized` reports "loop vectorized using 16 byte
//   vectors" for the loops of combine_into, combine_to and scale_loop, and
//   `-fopt-info-vec-missed` reports no "control flow in loop" left;
// - `objdump -d` of each reduce_fn / combine_fn instantiation shows packed
//   instructions (addps/minps/mulpd/paddb/pminub/pmuludq/... on %xmm) for
//   float32, float64, float16, bfloat16, int8, uint8, int32 with every op,
//   and for int64 sum.
// Not vectorised at baseline ISA, as expected: int64 product (SSE2 has no
// 64-bit lane multiply) and int64 min/max (no 64-bit compare before SSE4.2).
// What made the difference: __restrict pointers with the aliasing cases
// split once per call (out == a, out == b, or disjoint), so gcc needs no
// runtime overlap check; and float16.h's conversions written with mask
// selects (with ?: gcc reported "control flow in loop" for float16).
// Re-check: configure with -DGYRE_KERNEL_VEC_REPORT=ON (adds
// -fopt-info-vec-optimized to this file).
#include "gyre/collectives/reduce_kernels.h"

#include <cmath>
#include <cstdint>
#include <fmt/format.h>
#include <limits>
#include <type_traits>

#include "gyre/error.h"
#include "kernel_ops.h"
#include "reduce_kernels_x86.h"

namespace gyre::collectives {

namespace {

using namespace kernels;

template <class E, class Op>
void combine_into(typename Codec<E>::Storage* __restrict inout,
                  const typename Codec<E>::Storage* __restrict in, std::size_t n) {
  using C = Codec<E>;
  for (std::size_t i = 0; i < n; ++i) inout[i] = C::store(Op::apply(C::load(inout[i]), C::load(in[i])));
}

template <class E, class Op>
void combine_to(typename Codec<E>::Storage* __restrict out,
                const typename Codec<E>::Storage* __restrict a,
                const typename Codec<E>::Storage* __restrict b, std::size_t n) {
  using C = Codec<E>;
  for (std::size_t i = 0; i < n; ++i) out[i] = C::store(Op::apply(C::load(a[i]), C::load(b[i])));
}

template <class E, class Op>
void reduce_fn(void* inout, const void* in, std::size_t n) {
  using S = typename Codec<E>::Storage;
  combine_into<E, Op>(static_cast<S*>(inout), static_cast<const S*>(in), n);
}

template <class E, class Op>
void combine_fn(void* out, const void* a, const void* b, std::size_t n) {
  using S = typename Codec<E>::Storage;
  auto* o = static_cast<S*>(out);
  if (out == a) {
    combine_into<E, Op>(o, static_cast<const S*>(b), n);
  } else if (out == b) {
    combine_into<E, Op>(o, static_cast<const S*>(a), n);  // every op is commutative
  } else {
    combine_to<E, Op>(o, static_cast<const S*>(a), static_cast<const S*>(b), n);
  }
}

template <class E, class Compute>
void scale_loop(typename Codec<E>::Storage* __restrict x, std::size_t n, Compute f) {
  using C = Codec<E>;
  for (std::size_t i = 0; i < n; ++i) x[i] = C::store(C::load(x[i]) * f);
}

// x / k for every element: an average's 1/n applied as torch and Horovod's
// tests compute it (t / n, correctly rounded), where x * fl(1/n) can be one
// ulp off (2 * 37 * fl(1/3) != fl(74 / 3) in float32).
template <class E, class Compute>
void divide_loop(typename Codec<E>::Storage* __restrict x, std::size_t n, Compute k) {
  using C = Codec<E>;
  for (std::size_t i = 0; i < n; ++i) x[i] = C::store(C::load(x[i]) / k);
}

// k when f is the float64 nearest to 1/k for an integer k >= 1, else 0.
double reciprocal_of(double f) {
  const double k = std::round(1.0 / f);
  return k >= 1 && std::isfinite(k) && 1.0 / k == f ? k : 0.0;
}

struct Entry {
  ReduceFn reduce;
  CombineFn combine;
};

template <class E>
constexpr Entry entries_for(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage: return {reduce_fn<E, OpSum>, combine_fn<E, OpSum>};
    case ReduceOp::kMin: return {reduce_fn<E, OpMin>, combine_fn<E, OpMin>};
    case ReduceOp::kMax: return {reduce_fn<E, OpMax>, combine_fn<E, OpMax>};
    case ReduceOp::kProduct: return {reduce_fn<E, OpProd>, combine_fn<E, OpProd>};
    case ReduceOp::kAdasum: break;  // not element-wise: refused by lookup()
  }
  return {nullptr, nullptr};
}

// bool: sum and max are logical or, product and min logical and.
constexpr Entry bool_entries(ReduceOp op) {
  using B = std::uint8_t;
  if (op == ReduceOp::kSum || op == ReduceOp::kMax) {
    return {reduce_fn<B, OpOr>, combine_fn<B, OpOr>};
  }
  return {reduce_fn<B, OpAnd>, combine_fn<B, OpAnd>};
}

// The integer value nearest to v toward zero, saturated to T's range:
// Horovod's integer scaling (the product in float64, converted to the
// integer type), with the out-of-range case (undefined in C++) defined.
template <class T>
T truncate_saturate(double v) {
  constexpr double lo = static_cast<double>(std::numeric_limits<T>::min());
  // max() + 1 is a power of two, exact as a double, unlike max() for int64.
  constexpr double hi = static_cast<double>(std::numeric_limits<T>::max() / 2 + 1) * 2.0;
  if (v != v) return 0;
  if (v <= lo) return std::numeric_limits<T>::min();
  if (v >= hi) return std::numeric_limits<T>::max();
  return static_cast<T>(v);  // truncates toward zero
}

// When f is the float64 nearest to 1/k for an integer k (average's 1/n,
// a postscale of 1/k), x / k is computed instead of x * f: the factor
// stands for that exact fraction, and the product can fall just below an
// exact multiple (49 * fl(1/49) < 1 would truncate to 0).
template <class T>
void scale_int(T* x, std::size_t n, double f) {
  const double k = std::round(1.0 / f);
  if (k != 0 && std::isfinite(k) && 1.0 / k == f) {
    for (std::size_t i = 0; i < n; ++i) x[i] = truncate_saturate<T>(static_cast<double>(x[i]) / k);
    return;
  }
  for (std::size_t i = 0; i < n; ++i) x[i] = truncate_saturate<T>(static_cast<double>(x[i]) * f);
}

Entry lookup(DataType dt, ReduceOp op) {
  if (static_cast<int>(op) >= kNumReduceOps) {
    throw InvalidArgument(fmt::format("unknown reduce op {}", static_cast<int>(op)));
  }
  if (op == ReduceOp::kAdasum) {
    throw InvalidArgument(
        "reduce op 'adasum' has no element-wise kernel: it is computed by adasum_allreduce");
  }
  if (!op_defined(dt, op)) {
    throw InvalidArgument(fmt::format("reduce op '{}' is not defined for dtype {}", op_name(op),
                                      dtype_name(dt)));
  }
  switch (dt) {
    case DataType::kFloat32: return entries_for<float>(op);
    case DataType::kFloat64: return entries_for<double>(op);
    case DataType::kFloat16: return entries_for<Half>(op);
    case DataType::kBFloat16: return entries_for<BFloat>(op);
    case DataType::kInt8: return entries_for<std::int8_t>(op);
    case DataType::kUInt8: return entries_for<std::uint8_t>(op);
    case DataType::kInt32: return entries_for<std::int32_t>(op);
    case DataType::kInt64: return entries_for<std::int64_t>(op);
    case DataType::kInt16: return entries_for<std::int16_t>(op);
    case DataType::kBool: return bool_entries(op);
  }
  throw InvalidArgument(fmt::format("unknown dtype {}", static_cast<int>(dt)));
}

}  // namespace

ReduceFn reduce_kernel(DataType dt, ReduceOp op, KernelIsa isa) {
  const Entry e = lookup(dt, op);  // validates dt and op
  if (isa == KernelIsa::kBest) {
    if (ReduceFn fast = detail::reduce_kernel_avx2(dt, op)) return fast;
  }
  return e.reduce;
}

CombineFn combine_kernel(DataType dt, ReduceOp op, KernelIsa isa) {
  const Entry e = lookup(dt, op);
  if (isa == KernelIsa::kBest) {
    if (CombineFn fast = detail::combine_kernel_avx2(dt, op)) return fast;
  }
  return e.combine;
}

void scale(void* buf, std::size_t count, DataType dt, double factor, KernelIsa isa) {
  if (factor == 1.0) return;
  if (count > 0 && buf == nullptr) throw InvalidArgument("scale: null buffer with a non-zero count");
  // An average's 1/n (or any 1/k) divides by k in float32 and float64.
  if (const double k = reciprocal_of(factor); k != 0.0) {
    if (dt == DataType::kFloat32) {
      return divide_loop<float>(static_cast<float*>(buf), count, static_cast<float>(k));
    }
    if (dt == DataType::kFloat64) return divide_loop<double>(static_cast<double*>(buf), count, k);
  }
  if (isa == KernelIsa::kBest && detail::scale_avx2(buf, count, dt, static_cast<float>(factor))) {
    return;
  }
  switch (dt) {
    case DataType::kFloat32:
      return scale_loop<float>(static_cast<float*>(buf), count, static_cast<float>(factor));
    case DataType::kFloat64:
      return scale_loop<double>(static_cast<double*>(buf), count, factor);
    case DataType::kFloat16:
      return scale_loop<Half>(static_cast<std::uint16_t*>(buf), count, static_cast<float>(factor));
    case DataType::kBFloat16:
      return scale_loop<BFloat>(static_cast<std::uint16_t*>(buf), count, static_cast<float>(factor));
    case DataType::kInt8: return scale_int(static_cast<std::int8_t*>(buf), count, factor);
    case DataType::kUInt8: return scale_int(static_cast<std::uint8_t*>(buf), count, factor);
    case DataType::kInt16: return scale_int(static_cast<std::int16_t*>(buf), count, factor);
    case DataType::kInt32: return scale_int(static_cast<std::int32_t*>(buf), count, factor);
    case DataType::kInt64: return scale_int(static_cast<std::int64_t*>(buf), count, factor);
    case DataType::kBool:
      throw InvalidArgument(fmt::format(
          "scale factor {} on a bool tensor: scaling (prescale, postscale, average) is not "
          "defined for bool", factor));
  }
  throw InvalidArgument(fmt::format("scale: unknown dtype {}", static_cast<int>(dt)));
}

}  // namespace gyre::collectives
