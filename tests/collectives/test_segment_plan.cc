// plan_ring / plan_blocks: the planning math alone, no transport.
#include <catch2/catch.hpp>

#include <vector>

#include "gyre/collectives/segment_plan.h"
#include "gyre/error.h"

using namespace gyre;
using namespace gyre::collectives;

namespace {

// Every invariant the ring relies on: segments tile [0, count) in order,
// chunks tile each segment in order, every chunk fits max_chunk_bytes
// (unless a single element is larger) and max_chunk_count is the largest.
void check_invariants(const SegmentPlan& p, std::size_t max_chunk_bytes) {
  REQUIRE(p.world() >= 1);
  REQUIRE(p.chunks >= 1);
  CHECK(p.segment_offset(0) == 0);
  std::size_t largest = 0;
  for (int s = 0; s < p.world(); ++s) {
    std::size_t pos = p.segment_offset(s);
    for (std::size_t j = 0; j < p.chunks; ++j) {
      CHECK(p.chunk_offset(s, j) == pos);
      const std::size_t c = p.chunk_count(s, j);
      if (max_chunk_bytes >= p.elem_size) CHECK(c * p.elem_size <= max_chunk_bytes);
      else CHECK(c <= 1);
      largest = std::max(largest, c);
      pos += c;
    }
    CHECK(pos == p.segment_offset(s) + p.segment_count(s));
    // Chunks of one segment differ by at most one element.
    CHECK(p.chunk_count(s, 0) - p.chunk_count(s, p.chunks - 1) <= 1);
  }
  CHECK(p.segment_offset(p.world() - 1) + p.segment_count(p.world() - 1) == p.count());
  CHECK(largest == p.max_chunk_count);
}

}  // namespace

TEST_CASE("plan_ring: balanced segments, the longer ones first", "[plan]") {
  const SegmentPlan p = plan_ring(10, 4, 4, 1 << 20);
  REQUIRE(p.world() == 4);
  CHECK(p.segment_count(0) == 3);
  CHECK(p.segment_count(1) == 3);
  CHECK(p.segment_count(2) == 2);
  CHECK(p.segment_count(3) == 2);
  CHECK(p.segment_offset(2) == 6);
  CHECK(p.chunks == 1);
  CHECK(p.max_chunk_count == 3);
  check_invariants(p, 1 << 20);
}

TEST_CASE("plan_ring: count smaller than the world leaves empty segments", "[plan]") {
  const SegmentPlan p = plan_ring(2, 8, 5, 64);
  CHECK(p.segment_count(0) == 1);
  CHECK(p.segment_count(1) == 1);
  CHECK(p.segment_count(4) == 0);
  CHECK(p.chunk_count(4, 0) == 0);
  check_invariants(p, 64);
  const SegmentPlan z = plan_ring(0, 4, 3, 64);
  CHECK(z.count() == 0);
  CHECK(z.chunks == 1);
  CHECK(z.max_chunk_count == 0);
  check_invariants(z, 64);
}

TEST_CASE("plan_ring: chunks of at most max_chunk_bytes", "[plan]") {
  // 1000 floats over 3 ranks: segments 334, 333, 333; 40-byte chunks hold
  // 10 floats, so 34 chunks per segment.
  const SegmentPlan p = plan_ring(1000, 4, 3, 40);
  CHECK(p.chunks == 34);
  CHECK(p.max_chunk_count == 10);
  check_invariants(p, 40);
  // A chunk size below one element still moves one element per chunk.
  const SegmentPlan q = plan_ring(9, 8, 2, 3);
  CHECK(q.chunks == 5);
  CHECK(q.max_chunk_count == 1);
  check_invariants(q, 3);
  // A chunk size that is not a multiple of the element size rounds down.
  const SegmentPlan r = plan_ring(100, 4, 1, 10);
  CHECK(r.max_chunk_count == 2);
  check_invariants(r, 10);
}

TEST_CASE("plan_ring: invariants over a sweep of sizes", "[plan]") {
  for (int world = 1; world <= 9; ++world) {
    for (std::size_t count : {0, 1, 2, 7, 8, 9, 63, 64, 65, 1000, 4099}) {
      for (std::size_t esz : {1, 2, 4, 8}) {
        for (std::size_t chunk : {1, 3, 16, 100, 4096, 1 << 20}) {
          INFO("world " << world << " count " << count << " esz " << esz << " chunk " << chunk);
          check_invariants(plan_ring(count, esz, world, chunk), chunk);
        }
      }
    }
  }
}

TEST_CASE("plan_blocks: uneven blocks share one chunk count", "[plan]") {
  const std::vector<std::size_t> counts = {5, 0, 17, 1};
  const SegmentPlan p = plan_blocks(counts, 2, 8);  // 4 elements per chunk
  CHECK(p.world() == 4);
  CHECK(p.segment_offset(2) == 5);
  CHECK(p.segment_count(2) == 17);
  CHECK(p.count() == 23);
  CHECK(p.chunks == 5);  // ceil(17 / 4)
  check_invariants(p, 8);
}

TEST_CASE("plan_ring: bad arguments", "[plan]") {
  CHECK_THROWS_AS(plan_ring(10, 4, 0, 64), InvalidArgument);
  CHECK_THROWS_AS(plan_ring(10, 0, 2, 64), InvalidArgument);
  CHECK_THROWS_AS(plan_ring(10, 4, 2, 0), InvalidArgument);
  CHECK_THROWS_AS(plan_blocks(std::vector<std::size_t>{}, 4, 64), InvalidArgument);
}
