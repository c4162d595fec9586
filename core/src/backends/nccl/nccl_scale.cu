// The scaling kernel of nccl_scale.h, compiled by nvcc.
#include "backends/nccl/nccl_scale.h"

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace gyre::core {

namespace {

// One thread per element in a grid-stride loop, so any count fits in a
// bounded grid.
template <typename T, typename Compute, typename Load, typename Store>
__global__ void scale_kernel(T* x, std::size_t n, Compute f, Load load, Store store) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    x[i] = store(load(x[i]) * f);
  }
}

struct Same {
  template <typename T>
  __device__ T operator()(T v) const { return v; }
};
struct HalfToFloat {
  __device__ float operator()(__half v) const { return __half2float(v); }
};
struct FloatToHalf {
  __device__ __half operator()(float v) const { return __float2half_rn(v); }
};
struct BFloatToFloat {
  __device__ float operator()(__nv_bfloat16 v) const { return __bfloat162float(v); }
};
struct FloatToBFloat {
  __device__ __nv_bfloat16 operator()(float v) const { return __float2bfloat16_rn(v); }
};

constexpr unsigned kThreads = 256;
constexpr std::size_t kMaxBlocks = 4096;

template <typename T, typename Compute, typename Load, typename Store>
cudaError_t launch(void* buf, std::size_t n, Compute f, Load load, Store store,
                   cudaStream_t stream) {
  std::size_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  scale_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      static_cast<T*>(buf), n, f, load, store);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_scale(void* buf, std::size_t count, DataType dt, double factor,
                         cudaStream_t stream) {
  if (count == 0 || factor == 1.0) return cudaSuccess;
  const float ff = static_cast<float>(factor);
  switch (dt) {
    case DataType::kFloat32: return launch<float>(buf, count, ff, Same{}, Same{}, stream);
    case DataType::kFloat64: return launch<double>(buf, count, factor, Same{}, Same{}, stream);
    case DataType::kFloat16:
      return launch<__half>(buf, count, ff, HalfToFloat{}, FloatToHalf{}, stream);
    case DataType::kBFloat16:
      return launch<__nv_bfloat16>(buf, count, ff, BFloatToFloat{}, FloatToBFloat{}, stream);
    default: return cudaErrorInvalidValue;  // integers: refused before any launch
  }
}

}  // namespace gyre::core
