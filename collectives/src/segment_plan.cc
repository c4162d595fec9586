#include "gyre/collectives/segment_plan.h"

#include <algorithm>
#include <fmt/format.h>

#include "gyre/error.h"

namespace gyre::collectives {

namespace {

void finish_plan(SegmentPlan& p, std::size_t max_chunk_bytes) {
  std::size_t longest = 0;
  for (int s = 0; s < p.world(); ++s) longest = std::max(longest, p.segment_count(s));
  const std::size_t cap = std::max<std::size_t>(1, max_chunk_bytes / p.elem_size);
  p.chunks = std::max<std::size_t>(1, (longest + cap - 1) / cap);
  // ceil(longest / chunks) <= cap, so no chunk exceeds max_chunk_bytes
  // (unless one element alone does).
  p.max_chunk_count = (longest + p.chunks - 1) / p.chunks;
}

void check_common(std::size_t elem_size, std::size_t max_chunk_bytes) {
  if (elem_size == 0) throw InvalidArgument("ring plan: element size must be > 0");
  if (max_chunk_bytes == 0) throw InvalidArgument("ring plan: chunk_bytes must be > 0");
}

}  // namespace

SegmentPlan plan_ring(std::size_t count, std::size_t elem_size, int world,
                      std::size_t max_chunk_bytes) {
  check_common(elem_size, max_chunk_bytes);
  if (world < 1) throw InvalidArgument(fmt::format("ring plan: world size must be >= 1, got {}", world));
  SegmentPlan p;
  p.elem_size = elem_size;
  const auto n = static_cast<std::size_t>(world);
  p.offsets.resize(n + 1);
  const std::size_t base = count / n, extra = count % n;
  for (std::size_t s = 0; s <= n; ++s) p.offsets[s] = s * base + std::min(s, extra);
  finish_plan(p, max_chunk_bytes);
  return p;
}

SegmentPlan plan_blocks(std::span<const std::size_t> counts, std::size_t elem_size,
                        std::size_t max_chunk_bytes) {
  check_common(elem_size, max_chunk_bytes);
  if (counts.empty()) throw InvalidArgument("ring plan: at least one block is required");
  SegmentPlan p;
  p.elem_size = elem_size;
  p.offsets.resize(counts.size() + 1);
  p.offsets[0] = 0;
  for (std::size_t s = 0; s < counts.size(); ++s) p.offsets[s + 1] = p.offsets[s] + counts[s];
  finish_plan(p, max_chunk_bytes);
  return p;
}

}  // namespace gyre::collectives
