// Element-wise reduction kernels, looked up once per (dtype, op).
//
// Semantics shared by every kernel:
// - Integers wrap around on overflow (two's complement), for sum and product.
// - bool (one byte): sum and max are logical or, product and min logical
//   and; any non-zero byte reads as true, results are 0 or 1.
// - float16 and bfloat16 are converted to float32, combined, and rounded back
//   to nearest even: each call accumulates in float32, and a ring rounds once
//   per hop, as a 16-bit wire format must.
// - min/max with a NaN operand return one of the operands (the hardware
//   minps/maxps rule, which is what lets them vectorise); NaN is not
//   guaranteed to propagate. sum/product propagate NaN as IEEE does.
// Kernels are pure functions, callable from any thread.
#pragma once

#include <cstddef>

#include "gyre/types.h"

namespace gyre::collectives {

// inout[i] = op(inout[i], in[i]) for i < count.
using ReduceFn = void (*)(void* inout, const void* in, std::size_t count);

// out[i] = op(a[i], b[i]) for i < count. `out` may be the same pointer as
// `a` or `b` (in-place); otherwise the three ranges must not overlap. The
// ring uses it to reduce a received chunk into the output straight from the
// caller's input, with no prior copy.
using CombineFn = void (*)(void* out, const void* a, const void* b, std::size_t count);

// Which implementation to return: kBest picks, for float16 and bfloat16,
// AVX2+F16C loops when the CPU has them (bit-identical results, several
// times faster); kPortable always returns the baseline-ISA loops (tests use
// it to check both).
enum class KernelIsa { kBest, kPortable };

// The kernel for (dt, op); kAverage returns the sum kernel (the division is
// applied once, at the end, by scale()). Throws InvalidArgument when the op
// is not defined for the type, and for kAdasum (not element-wise: see
// adasum_allreduce in algorithms.h).
ReduceFn reduce_kernel(DataType dt, ReduceOp op, KernelIsa isa = KernelIsa::kBest);
CombineFn combine_kernel(DataType dt, ReduceOp op, KernelIsa isa = KernelIsa::kBest);

// buf[i] *= factor, computed in float32 for float32/float16/bfloat16 and in
// float64 for float64; a factor that is the float64 nearest to 1/k for an
// integer k (an average's 1/n) divides float32 and float64 by k instead,
// correctly rounded as torch's t / n (x * fl(1/3) is one ulp off for a
// third of the integers). Integer types, as Horovod scales them: the product is
// computed in float64 and truncated toward zero (3 * 0.5 -> 1, -3 * 0.5 ->
// -1); a product beyond the type's range saturates to its min or max (int64
// values beyond 2^53 lose precision in the float64 product, as Horovod's
// do). A factor that is the float64 nearest to 1/k for an integer k
// (average's 1/n) divides by k instead, so that exact multiples of k divide
// exactly. bool: factor 1 is a no-op, any other throws InvalidArgument.
void scale(void* buf, std::size_t count, DataType dt, double factor,
           KernelIsa isa = KernelIsa::kBest);

}  // namespace gyre::collectives
