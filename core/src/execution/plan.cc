// Planning of one agreed collective (plan.h).
#include "execution/plan.h"

#include <algorithm>

#include "gyre/sizes.h"
#include "negotiation/coordinator.h"

namespace gyre::core {

Reduction effective_reduction(ReduceOp op, double prescale, double postscale, int ranks) {
  if (op == ReduceOp::kAverage) return {ReduceOp::kSum, prescale, postscale / ranks};
  return {op, prescale, postscale};
}

Reduction effective_reduction(const Response& resp) {
  return effective_reduction(resp.agreed.op, resp.agreed.prescale, resp.agreed.postscale,
                             resp.ranks_taking_part());
}

AllgatherPlan plan_allgather(const Response& resp) {
  const Request& a = resp.agreed;
  AllgatherPlan p;
  p.row_bytes = static_cast<std::size_t>(row_elems(a.shape)) * dtype_size(a.dtype);
  p.blocks.assign(resp.per_rank.size(), 0);
  std::int64_t rows = 0;
  for (std::size_t r = 0; r < resp.per_rank.size(); ++r) {
    const std::int64_t k = resp.per_rank[r] ? resp.per_rank[r]->shape[0] : 0;
    p.blocks[r] = static_cast<std::size_t>(k) * p.row_bytes;
    p.total_bytes += p.blocks[r];
    rows += k;
  }
  p.out_shape = a.shape;
  p.out_shape[0] = rows;
  return p;
}

AlltoallPlan plan_alltoall(const Response& resp, int rank) {
  const auto me = static_cast<std::size_t>(rank);
  const Request& mine = *resp.per_rank[me];
  const std::size_t n = resp.per_rank.size();
  const std::size_t row_bytes =
      static_cast<std::size_t>(row_elems(resp.agreed.shape)) * dtype_size(resp.agreed.dtype);
  AlltoallPlan p;
  p.send_bytes.resize(n);
  p.recv_bytes.resize(n);
  p.received_splits.resize(n);
  std::int64_t rows = 0;
  for (std::size_t q = 0; q < n; ++q) {
    for (std::int64_t rows_pq : resp.per_rank[q]->splits) {
      p.largest_bytes = std::max(p.largest_bytes, static_cast<std::size_t>(rows_pq) * row_bytes);
    }
    p.send_bytes[q] = static_cast<std::size_t>(mine.splits[q]) * row_bytes;
    p.received_splits[q] = resp.per_rank[q]->splits[me];
    p.recv_bytes[q] = static_cast<std::size_t>(p.received_splits[q]) * row_bytes;
    p.recv_total += p.recv_bytes[q];
    rows += p.received_splits[q];
  }
  p.out_shape = mine.shape;
  p.out_shape[0] = rows;
  return p;
}

ReduceScatterPlan plan_reducescatter(const Request& agreed, int world, int rank) {
  const std::int64_t dim0 = agreed.shape.empty() ? 1 : agreed.shape[0];
  const auto per_row = static_cast<std::size_t>(row_elems(agreed.shape));
  ReduceScatterPlan p;
  p.counts.resize(static_cast<std::size_t>(world));
  std::int64_t my_rows = 0;
  for (int r = 0; r < world; ++r) {
    const std::int64_t rows = dim0 / world + (r < dim0 % world ? 1 : 0);
    p.counts[static_cast<std::size_t>(r)] = static_cast<std::size_t>(rows) * per_row;
    if (r == rank) my_rows = rows;
  }
  p.my_count = p.counts[static_cast<std::size_t>(rank)];
  p.out_shape = agreed.shape;
  if (!p.out_shape.empty()) p.out_shape[0] = my_rows;
  return p;
}

std::vector<ByteRange> fusion_zero_ranges(const FusedLayout& layout,
                                          const std::vector<bool>& has_input) {
  std::vector<ByteRange> out;
  auto add = [&](std::size_t begin, std::size_t end) {
    if (begin >= end) return;
    if (!out.empty() && out.back().offset + out.back().bytes == begin) {
      out.back().bytes += end - begin;
    } else {
      out.push_back({begin, end - begin});
    }
  };
  for (std::size_t i = 0; i < layout.offsets.size(); ++i) {
    const std::size_t begin = layout.offsets[i];
    add(has_input[i] ? begin + layout.sizes[i] : begin, layout.end(i));
  }
  return out;
}

std::size_t largest_block(std::span<const std::size_t> blocks) {
  return blocks.empty() ? 0 : *std::max_element(blocks.begin(), blocks.end());
}

}  // namespace gyre::core
