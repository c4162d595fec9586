// Element types, reduction operations and devices: the vocabulary shared by
// the public API, the runtime and the collective algorithms.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace gyre {

// The element types gyre can move and reduce. float16 and bfloat16 are
// reduced by converting to float32, accumulating, and rounding back. New
// types go at the end: the values travel in negotiation messages.
enum class DataType : std::uint8_t {
  kFloat32 = 0,
  kFloat64,
  kFloat16,
  kBFloat16,
  kInt8,
  kUInt8,
  kInt32,
  kInt64,
  kInt16,
  kBool,  // one byte, 0 or 1 (torch.bool, numpy.bool_)
};
inline constexpr int kNumDataTypes = 10;

// Reductions. New ops go at the end (the values travel in messages).
//
// Integer semantics (Horovod's): sum and product wrap around; average is
// the sum times 1/n, and pre/postscale multiply by their factor, each
// computed in float64 and truncated toward zero into the integer type
// (values beyond the type's range saturate). bool: sum and max are logical
// or, product and min logical and (as torch.distributed defines them);
// average and scaling are not defined on bool.
enum class ReduceOp : std::uint8_t {
  kSum = 0,
  kAverage,  // sum, then one division by the number of contributing ranks
  kMin,
  kMax,
  kProduct,
  // Adaptive summation (Maleki et al., MLSys 2021): floating types only, a
  // power-of-two number of ranks; each tensor of a fused bucket is
  // combined on its own (collectives/algorithms.h, adasum_allreduce).
  kAdasum,
};
inline constexpr int kNumReduceOps = 6;

enum class DeviceType : std::uint8_t { kCPU = 0, kCUDA = 1 };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;
  friend bool operator==(const Device&, const Device&) = default;
};

// One member of a fused bucket, reduced where it lies rather than packed:
// `bytes` bytes at `offset` in the bucket's layout, read from `in` (nullptr:
// zeros, a rank without this tensor) and written to `out` (nullptr:
// discarded). in == out is in place.
struct BucketPiece {
  const void* in;
  void* out;
  std::size_t offset;
  std::size_t bytes;
};

constexpr std::size_t dtype_size(DataType dt) {
  switch (dt) {
    case DataType::kFloat32: return 4;
    case DataType::kFloat64: return 8;
    case DataType::kFloat16: return 2;
    case DataType::kBFloat16: return 2;
    case DataType::kInt8: return 1;
    case DataType::kUInt8: return 1;
    case DataType::kInt32: return 4;
    case DataType::kInt64: return 8;
    case DataType::kInt16: return 2;
    case DataType::kBool: return 1;
  }
  return 0;
}

constexpr bool is_floating(DataType dt) {
  return dt == DataType::kFloat32 || dt == DataType::kFloat64 ||
         dt == DataType::kFloat16 || dt == DataType::kBFloat16;
}

constexpr std::string_view dtype_name(DataType dt) {
  switch (dt) {
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kFloat16: return "float16";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kInt8: return "int8";
    case DataType::kUInt8: return "uint8";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
    case DataType::kInt16: return "int16";
    case DataType::kBool: return "bool";
  }
  return "unknown";
}

constexpr std::string_view op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAverage: return "average";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kProduct: return "product";
    case ReduceOp::kAdasum: return "adasum";
  }
  return "unknown";
}

constexpr std::string_view device_name(DeviceType d) {
  return d == DeviceType::kCPU ? "cpu" : "cuda";
}

// Whether pre/postscale factors other than 1 (and average's 1/n) apply to
// `dt`: every numeric type; not bool.
constexpr bool scaling_defined(DataType dt) { return dt != DataType::kBool; }

// Whether `op` is defined on `dt` (see ReduceOp for the integer and bool
// semantics): Adasum needs a floating type, average a scalable one.
constexpr bool op_defined(DataType dt, ReduceOp op) {
  if (op == ReduceOp::kAdasum) return is_floating(dt);
  if (op == ReduceOp::kAverage) return scaling_defined(dt);
  return true;
}

}  // namespace gyre
