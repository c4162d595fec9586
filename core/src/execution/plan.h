// Planning of one agreed collective: pure functions from the agreed
// response (and this rank's place in the world) to the arguments a Backend
// runs with: block and split sizes, output shapes, the effective reduction,
// and which bytes of a fused bucket are zeros. Every backend runs what these
// plan, so the CPU ring and NCCL cannot drift apart. The fused layout
// itself is fused_layout() in fusion/fusion.h.
//
// Joined ranks (per_rank[r] empty) contribute nothing: no rows to an
// allgather, zeros to a reduction, and are not counted by an average.
//
// Any thread; no state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "fusion/fusion.h"
#include "gyre/types.h"

namespace gyre::core {

struct Request;   // negotiation/message.h
struct Response;  // negotiation/coordinator.h

// The reduction a backend applies: `op` is never kAverage.
struct Reduction {
  ReduceOp op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  friend bool operator==(const Reduction&, const Reduction&) = default;
};

// Average becomes a sum with 1/ranks folded into the postscale; other ops as
// agreed. For a response `ranks` counts the joined ranks too (they
// contribute zeros and are divided by, as in Horovod's join).
Reduction effective_reduction(ReduceOp op, double prescale, double postscale, int ranks);
Reduction effective_reduction(const Response& resp);

// Allgather: rank r contributes blocks[r] bytes (its first dimension times
// the row size; 0 for a joined rank); the result has the agreed shape with
// the first dimension the sum of every rank's.
struct AllgatherPlan {
  std::size_t row_bytes = 0;
  std::vector<std::size_t> blocks;
  std::size_t total_bytes = 0;
  std::vector<std::int64_t> out_shape;
};
AllgatherPlan plan_allgather(const Response& resp);

// Alltoall: rank p sends splits[p][q] rows to rank q (every rank's splits are
// in the gathered requests; joined ranks are refused at negotiation). This
// rank sends send_bytes[q] to q and receives recv_bytes[p] from p, which is
// received_splits[p] rows; the result keeps this rank's trailing dimensions.
// largest_bytes: the largest message between any two ranks (the same on
// every rank: what a backend that moves every pair in lockstep sizes its
// rounds by).
struct AlltoallPlan {
  std::vector<std::size_t> send_bytes, recv_bytes;
  std::size_t largest_bytes = 0;
  std::vector<std::int64_t> received_splits;
  std::size_t recv_total = 0;
  std::vector<std::int64_t> out_shape;
};
AlltoallPlan plan_alltoall(const Response& resp, int rank);

// Reduce-scatter: rank r keeps block r of the first dimension; when the rows
// do not divide evenly the earlier ranks take one extra row. counts[r] is in
// elements; the result has the agreed shape with this rank's rows.
struct ReduceScatterPlan {
  std::vector<std::size_t> counts;
  std::vector<std::int64_t> out_shape;
  std::size_t my_count = 0;
};
ReduceScatterPlan plan_reducescatter(const Request& agreed, int world, int rank);

// A byte range [offset, offset + bytes) of a buffer.
struct ByteRange {
  std::size_t offset = 0;
  std::size_t bytes = 0;
  friend bool operator==(const ByteRange&, const ByteRange&) = default;
};

// The bytes of a fused bucket that must be zero before the reduction: the
// padding after each member and the whole slot of a member this rank has no
// input for (a joined rank contributes zeros). Adjacent ranges are merged;
// empty ones are left out. `has_input[i]`: member i is copied in.
std::vector<ByteRange> fusion_zero_ranges(const FusedLayout& layout,
                                          const std::vector<bool>& has_input);

// The largest of the blocks: NCCL's collectives move equal blocks, so a
// backend pads every block to this.
std::size_t largest_block(std::span<const std::size_t> blocks);

}  // namespace gyre::core
