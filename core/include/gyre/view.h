// Views of a job's own containers as gyre tensors, the element type deduced
// from the C++ type: gyre::view(weights) instead of a TensorView filled by
// hand. The view does not own the memory (see TensorView in gyre.h).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "gyre/gyre.h"

namespace gyre {

// 16-bit floating-point elements as storage: the bits of an IEEE 754 half
// (float16_t) or of a bfloat16, which gyre reduces (in float32). A job
// converts to and from them with its own routines or its framework's.
struct float16_t {
  std::uint16_t bits;
};
struct bfloat16_t {
  std::uint16_t bits;
};

// The DataType of a C++ element type; a type gyre has none for does not
// compile (no definition).
template <typename T>
struct dtype_of;
template <> struct dtype_of<float> { static constexpr DataType value = DataType::kFloat32; };
template <> struct dtype_of<double> { static constexpr DataType value = DataType::kFloat64; };
template <> struct dtype_of<float16_t> { static constexpr DataType value = DataType::kFloat16; };
template <> struct dtype_of<bfloat16_t> { static constexpr DataType value = DataType::kBFloat16; };
template <> struct dtype_of<std::int8_t> { static constexpr DataType value = DataType::kInt8; };
template <> struct dtype_of<std::uint8_t> { static constexpr DataType value = DataType::kUInt8; };
template <> struct dtype_of<std::int16_t> { static constexpr DataType value = DataType::kInt16; };
template <> struct dtype_of<std::int32_t> { static constexpr DataType value = DataType::kInt32; };
template <> struct dtype_of<std::int64_t> { static constexpr DataType value = DataType::kInt64; };
template <> struct dtype_of<bool> { static constexpr DataType value = DataType::kBool; };
static_assert(sizeof(bool) == 1, "gyre's bool is one byte");

// `data` as a tensor of `shape` (empty: one dimension of data.size()).
// Throws InvalidArgument when the shape's element count is not data.size().
// A view of const data is for the roles gyre only reads (an allreduce's
// input, a push's delta); passing it as an output is the caller's error.
template <typename T>
TensorView view(std::span<T> data, std::vector<std::int64_t> shape = {}) {
  using Element = std::remove_const_t<T>;
  if (shape.empty()) shape = {static_cast<std::int64_t>(data.size())};
  if (numel(shape) != static_cast<std::int64_t>(data.size())) {
    throw InvalidArgument("gyre::view: a shape of " + std::to_string(numel(shape)) +
                          " elements over " + std::to_string(data.size()) + " elements");
  }
  return TensorView{const_cast<Element*>(data.data()), dtype_of<Element>::value, std::move(shape)};
}

template <typename T, typename A>
TensorView view(std::vector<T, A>& v, std::vector<std::int64_t> shape = {}) {
  return view(std::span<T>(v), std::move(shape));
}

template <typename T, typename A>
TensorView view(const std::vector<T, A>& v, std::vector<std::int64_t> shape = {}) {
  return view(std::span<const T>(v), std::move(shape));
}

}  // namespace gyre
