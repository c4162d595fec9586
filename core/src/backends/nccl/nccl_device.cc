#include "backends/nccl/nccl_device.h"

#include <fmt/format.h>

#include "gyre/error.h"
#include "backends/nccl/nccl_backend.h"

namespace gyre::core {

std::optional<ncclDataType_t> nccl_dtype(DataType dt) {
  switch (dt) {
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kFloat64: return ncclFloat64;
    case DataType::kFloat16: return ncclFloat16;
    case DataType::kBFloat16: return ncclBfloat16;
    case DataType::kInt8: return ncclInt8;
    case DataType::kUInt8: return ncclUint8;
    case DataType::kInt32: return ncclInt32;
    case DataType::kInt64: return ncclInt64;
    // NCCL has no 16-bit integer; a bool sum would count rather than or.
    // Byte-moving collectives use ncclUint8 for every type.
    case DataType::kInt16:
    case DataType::kBool: return std::nullopt;
  }
  return std::nullopt;
}

std::optional<ncclRedOp_t> nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kProduct: return ncclProd;
    case ReduceOp::kAverage:
    case ReduceOp::kAdasum: return std::nullopt;
  }
  return std::nullopt;
}

void check_cuda(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return;
  throw TransportError(
      fmt::format("{}: CUDA error {} ({})", what, cudaGetErrorName(e), cudaGetErrorString(e)));
}

void check_nccl(ncclResult_t r, const std::string& what, ncclComm_t comm) {
  if (r == ncclSuccess) return;
  // ncclGetLastError gives the detail NCCL logged for this failure (which
  // peer, which transport); it may be empty.
  const char* last = ncclGetLastError(comm);
  throw TransportError(fmt::format("{}: NCCL error {} ({}{}{})", what, static_cast<int>(r),
                                   ncclGetErrorString(r), last && *last ? "; " : "",
                                   last ? last : ""));
}

int cuda_device_count(std::string* why) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = fmt::format("{} ({})", cudaGetErrorName(e), cudaGetErrorString(e));
    return -1;
  }
  return n;
}

std::string describe_foreign_pointer(const void* data, int device) {
  cudaPointerAttributes attr{};
  cudaError_t e = cudaPointerGetAttributes(&attr, data);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear it: the caller reports it, nothing else should see it
    return fmt::format("a pointer CUDA does not know ({})", cudaGetErrorString(e));
  }
  switch (attr.type) {
    case cudaMemoryTypeDevice:
    case cudaMemoryTypeManaged:
      if (attr.device == device) return {};
      return fmt::format("memory of cuda:{}", attr.device);
    case cudaMemoryTypeHost: return "pinned host memory";
    default: return "host memory";
  }
}

}  // namespace gyre::core
