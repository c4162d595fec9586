// Planning math of the ring algorithms: how a buffer is cut into segments
// (one per rank) and each segment into pipelined chunks. Pure functions, no
// transport; every rank computes the same plan from the same arguments, which
// is what lets sender and receiver agree on every transfer's size.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace gyre::collectives {

struct SegmentPlan {
  std::size_t elem_size = 1;
  // offsets[s] is the first element of segment s; offsets[world] == count.
  std::vector<std::size_t> offsets;
  // Every segment is cut into the same number of chunks (at least 1), so
  // that step k of the ring moves chunk j of some segment on every rank;
  // a short segment may have empty chunks, which are not transferred.
  std::size_t chunks = 1;
  // The largest chunk of any segment, in elements (the staging size).
  std::size_t max_chunk_count = 0;

  int world() const { return static_cast<int>(offsets.size()) - 1; }
  std::size_t count() const { return offsets.back(); }
  std::size_t segment_offset(int s) const { return offsets[static_cast<std::size_t>(s)]; }
  std::size_t segment_count(int s) const {
    return offsets[static_cast<std::size_t>(s) + 1] - offsets[static_cast<std::size_t>(s)];
  }
  // Chunk j of segment s, in elements from the start of the buffer. The
  // chunks of a segment differ in length by at most one element.
  std::size_t chunk_offset(int s, std::size_t j) const {
    const std::size_t n = segment_count(s);
    return segment_offset(s) + j * (n / chunks) + (j < n % chunks ? j : n % chunks);
  }
  std::size_t chunk_count(int s, std::size_t j) const {
    const std::size_t n = segment_count(s);
    return n / chunks + (j < n % chunks ? 1 : 0);
  }
};

// Cuts `count` elements of `elem_size` bytes into `world` segments whose
// lengths differ by at most one element (the first count % world segments
// are the longer ones), and each segment into chunks of at most
// max_chunk_bytes (but at least one element). Throws InvalidArgument for
// world < 1, elem_size == 0 or max_chunk_bytes == 0.
SegmentPlan plan_ring(std::size_t count, std::size_t elem_size, int world,
                      std::size_t max_chunk_bytes);

// The same for given segment lengths (counts[s] elements for segment s),
// as allgather and reduce-scatter with per-rank counts need.
SegmentPlan plan_blocks(std::span<const std::size_t> counts, std::size_t elem_size,
                        std::size_t max_chunk_bytes);

}  // namespace gyre::collectives
