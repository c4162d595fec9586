// Size arithmetic shared by every layer: element counts of a row-major shape
// and rounding a byte count up to an alignment. The one home of these
// helpers; the API (TensorView), the planner and the backends all use them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace gyre {

// Elements of a tensor of this shape (1 for a scalar, shape []).
constexpr std::int64_t numel(std::span<const std::int64_t> shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

// Elements per row of the first dimension: the product of every dimension
// but the first (1 for shapes of rank 0 or 1).
constexpr std::int64_t row_elems(std::span<const std::int64_t> shape) {
  std::int64_t n = 1;
  for (std::size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

// `n` rounded up to a multiple of `alignment` (> 0).
constexpr std::size_t align_up(std::size_t n, std::size_t alignment) {
  return (n + alignment - 1) / alignment * alignment;
}

}  // namespace gyre
