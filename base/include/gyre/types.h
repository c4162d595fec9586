// Element types, reduction operations and devices: the vocabulary shared by
// the public API, the runtime and the collective algorithms.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace gyre {

// The element types gyre can move and reduce. float16 and bfloat16 are
// reduced by converting to float32, accumulating, and rounding back.
enum class DataType : std::uint8_t {
  kFloat32 = 0,
  kFloat64,
  kFloat16,
  kBFloat16,
  kInt8,
  kUInt8,
  kInt32,
  kInt64,
};
inline constexpr int kNumDataTypes = 8;

enum class ReduceOp : std::uint8_t {
  kSum = 0,
  kAverage,  // sum, then one division by the number of contributing ranks
  kMin,
  kMax,
  kProduct,
};
inline constexpr int kNumReduceOps = 5;

enum class DeviceType : std::uint8_t { kCPU = 0, kCUDA = 1 };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;
  friend bool operator==(const Device&, const Device&) = default;
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
  }
  return "unknown";
}

constexpr std::string_view device_name(DeviceType d) {
  return d == DeviceType::kCPU ? "cpu" : "cuda";
}

// Whether `op` is defined on `dt`. Average is defined on floating types only:
// an integer average would silently truncate, so it is refused rather than
// guessed (sum, then divide in the caller's own arithmetic, instead).
constexpr bool op_defined(DataType dt, ReduceOp op) {
  return op != ReduceOp::kAverage || is_floating(dt);
}

}  // namespace gyre
