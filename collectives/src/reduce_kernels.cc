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

#include <cstdint>
#include <fmt/format.h>
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
  }
  return {nullptr, nullptr};
}

Entry lookup(DataType dt, ReduceOp op) {
  if (static_cast<int>(op) >= kNumReduceOps) {
    throw InvalidArgument(fmt::format("unknown reduce op {}", static_cast<int>(op)));
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
    default:
      throw InvalidArgument(fmt::format(
          "scale factor {} on integer dtype {}: gyre defines pre/postscale only for floating "
          "types",
          factor, dtype_name(dt)));
  }
}

}  // namespace gyre::collectives
