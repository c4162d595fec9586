#include "validate.h"

#include <cmath>
#include <cstdint>
#include <fmt/format.h>
#include <limits>

#include "gyre/error.h"

namespace gyre::collectives::detail {

void check_world(const Transport& t, const char* algo) {
  if (t.size() < 1 || t.rank() < 0 || t.rank() >= t.size()) {
    throw InvalidArgument(fmt::format("{}: transport reports rank {} of world size {}", algo,
                                      t.rank(), t.size()));
  }
}

void check_dtype(DataType dt, const char* algo) {
  if (static_cast<int>(dt) >= kNumDataTypes) {
    throw InvalidArgument(fmt::format("{}: unknown dtype value {}", algo, static_cast<int>(dt)));
  }
}

void check_reduction(DataType dt, ReduceOp op, const char* algo) {
  check_dtype(dt, algo);
  if (static_cast<int>(op) >= kNumReduceOps) {
    throw InvalidArgument(fmt::format("{}: unknown reduce op value {}", algo, static_cast<int>(op)));
  }
  if (op == ReduceOp::kAdasum) {
    throw InvalidArgument(fmt::format(
        "{}: op 'adasum' is not an element-wise reduction; it is computed by adasum_allreduce",
        algo));
  }
  if (!op_defined(dt, op)) {
    throw InvalidArgument(fmt::format("{}: op '{}' is not defined for dtype {}", algo,
                                      op_name(op), dtype_name(dt)));
  }
}

void check_chunk(std::size_t chunk_bytes, const char* algo) {
  if (chunk_bytes == 0) throw InvalidArgument(fmt::format("{}: chunk_bytes must be > 0", algo));
}

void check_tag(int tag, const char* algo) {
  // The ring algorithms use tag and tag + 1 (see ring_pipeline.h).
  if (tag < 0 || tag == std::numeric_limits<int>::max()) {
    throw InvalidArgument(fmt::format("{}: tag must be in [0, INT_MAX), got {}", algo, tag));
  }
}

void check_scaling(DataType dt, double prescale, double postscale, const char* algo) {
  if (!std::isfinite(prescale) || !std::isfinite(postscale)) {
    throw InvalidArgument(fmt::format("{}: prescale ({}) and postscale ({}) must be finite", algo,
                                      prescale, postscale));
  }
  if (!scaling_defined(dt) && (prescale != 1.0 || postscale != 1.0)) {
    throw InvalidArgument(fmt::format(
        "{}: prescale {} / postscale {} on dtype {}: scaling is not defined for {}", algo,
        prescale, postscale, dtype_name(dt), dtype_name(dt)));
  }
}

void check_buffer(const void* p, std::size_t bytes, const char* name, const char* algo) {
  if (p == nullptr && bytes > 0) {
    throw InvalidArgument(fmt::format("{}: {} is null but {} bytes are to be accessed", algo,
                                      name, bytes));
  }
}

bool overlaps(const void* a, std::size_t abytes, const void* b, std::size_t bbytes) {
  if (abytes == 0 || bbytes == 0) return false;
  const auto pa = reinterpret_cast<std::uintptr_t>(a);
  const auto pb = reinterpret_cast<std::uintptr_t>(b);
  return pa < pb + bbytes && pb < pa + abytes;
}

void check_overlap(const void* a, std::size_t abytes, const void* b, std::size_t bbytes,
                   const char* aname, const char* bname, const char* algo) {
  if (a != b && overlaps(a, abytes, b, bbytes)) {
    throw InvalidArgument(fmt::format(
        "{}: {} and {} overlap without being the same buffer (in-place needs equal pointers)",
        algo, aname, bname));
  }
}

void check_per_rank(std::span<const std::size_t> v, int world, const char* name, const char* algo) {
  if (v.size() != static_cast<std::size_t>(world)) {
    throw InvalidArgument(fmt::format("{}: {} has {} entries but the world has {} ranks", algo,
                                      name, v.size(), world));
  }
}

std::size_t checked_sum(std::span<const std::size_t> v, std::size_t scale, const char* name,
                        const char* algo) {
  std::size_t total = 0;
  for (std::size_t x : v) {
    if (x > (std::numeric_limits<std::size_t>::max() - total) / scale) {
      throw InvalidArgument(fmt::format("{}: {} add up to more than fits in memory", algo, name));
    }
    total += x * scale;
  }
  return total;
}

std::size_t checked_bytes(std::size_t count, std::size_t elem_size, const char* algo) {
  if (elem_size != 0 && count > std::numeric_limits<std::size_t>::max() / elem_size) {
    throw InvalidArgument(fmt::format("{}: count {} overflows the byte size", algo, count));
  }
  return count * elem_size;
}

}  // namespace gyre::collectives::detail
