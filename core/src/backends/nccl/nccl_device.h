// The CUDA/NCCL boundary of the GPU path: gyre's dtypes and reduce ops as
// NCCL's, and the checks that turn every CUDA and NCCL status into a gyre
// exception. Pure functions (no device needed), so tests/gpu checks the
// tables on a machine without a GPU.
//
// Only nccl_*.cc and the GPU tests include this header (it includes nccl.h
// and cuda_runtime.h). Any thread.
#pragma once

#include <optional>
#include <string>

#include <cuda_runtime.h>
#include <nccl.h>

#include "gyre/types.h"

namespace gyre::core {

// The NCCL type reductions use; none for int16 (NCCL has no such type) and
// bool (a sum would count, not or): their reductions are refused on CUDA.
std::optional<ncclDataType_t> nccl_dtype(DataType dt);
// sum, min, max, product (none for kAdasum: CPU only). kAverage has no entry on purpose: the executor
// turns it into a sum with 1/contributors in the postscale (ncclAvg would
// divide by all ranks, joined ones included).
std::optional<ncclRedOp_t> nccl_op(ReduceOp op);

// Throw TransportError "<what>: CUDA error cudaErrorX (text)" /
// "<what>: NCCL error (text; last: <ncclGetLastError>)" unless ok.
// ncclInProgress is not handled here (NcclBackend polls for it).
void check_cuda(cudaError_t e, const std::string& what);
void check_nccl(ncclResult_t r, const std::string& what, ncclComm_t comm = nullptr);

}  // namespace gyre::core
