// Element-wise reduction kernels, looked up once per (dtype, op).
//
// Semantics shared by every kernel:
// - Integers wrap around on overflow (two's complement), for sum and product.
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
// is not defined for the type.
ReduceFn reduce_kernel(DataType dt, ReduceOp op, KernelIsa isa = KernelIsa::kBest);
CombineFn combine_kernel(DataType dt, ReduceOp op, KernelIsa isa = KernelIsa::kBest);

// buf[i] *= factor, computed in float32 for float32/float16/bfloat16 and in
// float64 for float64. Integer types: factor 1 is a no-op and any other
// factor throws InvalidArgument (gyre does not define integer scaling: it
// would have to pick a rounding; scale in the caller's arithmetic instead).
void scale(void* buf, std::size_t count, DataType dt, double factor,
           KernelIsa isa = KernelIsa::kBest);

}  // namespace gyre::collectives
