// Element-wise reduction kernels, looked up once per (dtype, op).
#pragma once

#include <cstddef>

#include "gyre/types.h"

namespace gyre::collectives {

// inout[i] = op(inout[i], in[i]) for i < count.
using ReduceFn = void (*)(void* inout, const void* in, std::size_t count);

// The kernel for (dt, op); kAverage returns the sum kernel (the division is
// applied once, at the end, by scale()). Throws InvalidArgument when the op
// is not defined for the type.
ReduceFn reduce_kernel(DataType dt, ReduceOp op);

// buf[i] *= factor, computed in float32/float64 for floating types.
void scale(void* buf, std::size_t count, DataType dt, double factor);

}  // namespace gyre::collectives
