// Prescale and postscale of CUDA buffers: buf[i] *= factor on the device,
// with the same arithmetic as the CPU kernel (collectives::scale): float32,
// float16 and bfloat16 computed in float32 and rounded to nearest even,
// float64 in float64. Integer types are not scaled (the caller refuses a
// factor other than 1 before anything runs, as the CPU path does).
//
// Only nccl_*.cc / nccl_*.cu include this header (it names cudaStream_t).
// Thread: the runtime's background thread (NcclBackend).
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "gyre/types.h"

namespace gyre::core {

// Enqueues the scaling kernel on `stream`; returns the launch status
// (cudaSuccess when count is 0 or factor is 1: nothing is launched).
cudaError_t launch_scale(void* buf, std::size_t count, DataType dt, double factor,
                         cudaStream_t stream);

}  // namespace gyre::core
