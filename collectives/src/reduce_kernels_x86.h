// AVX2 + F16C kernels for float16 and bfloat16, used when the CPU has them.
// The portable loops in reduce_kernels.cc convert with integer tricks (SSE2:
// about 1 GB/s for float16 on this class of machine); these use the
// hardware conversions (vcvtph2ps / vcvtps2ph) and 8-lane float arithmetic.
// Results are bit-identical to the portable loops (same float32 arithmetic,
// same round-to-nearest-even, same NaN quieting), which the unit tests check.
// Internal to collectives/.
#pragma once

#include <cstddef>

#include "gyre/collectives/reduce_kernels.h"

namespace gyre::collectives::detail {

// Whether this CPU runs the kernels below (x86-64 with AVX2 and F16C).
bool has_avx2_f16c();

// The kernel for (dt, op), dt float16 or bfloat16 and op defined (average
// maps to sum); nullptr for any other dtype or when !has_avx2_f16c().
ReduceFn reduce_kernel_avx2(DataType dt, ReduceOp op);
CombineFn combine_kernel_avx2(DataType dt, ReduceOp op);

// buf[i] *= factor for float16/bfloat16; false (and nothing done) when not
// available for dt on this CPU.
bool scale_avx2(void* buf, std::size_t count, DataType dt, float factor);

}  // namespace gyre::collectives::detail
