// Ring reduce-scatter with per-rank block sizes: n-1 steps in which rank r
// receives a partial reduction of block r-k-2 (mod n), combines its own input
// for that block into it and passes it on; after the last step rank r holds
// block r fully reduced, written straight into `out`.
//
// Intermediate partial results (steps 0..n-3) live in two block-sized
// scratch halves used alternately: the result of step k is sent at step k+1,
// so before step k+2 overwrites that half, the send must have completed.
#include <algorithm>
#include <cstring>
#include <fmt/format.h>
#include <vector>

#include "gyre/collectives/algorithms.h"
#include "gyre/collectives/reduce_kernels.h"
#include "gyre/error.h"
#include "ring_pipeline.h"
#include "validate.h"

namespace gyre::collectives {

namespace {

class RingReduceScatter {
 public:
  RingReduceScatter(Transport& t, const std::byte* in, std::byte* out, const SegmentPlan& plan,
                    CombineFn combine, DataType dt, double postscale, int tag)
      : n_(t.size()),
        rank_(t.rank()),
        plan_(plan),
        pipe_(t, plan, n_ - 1, rank_ - 1, tag),
        in_(in),
        out_(out),
        combine_(combine),
        dt_(dt),
        postscale_(postscale),
        slot_bytes_(plan.max_chunk_count * plan.elem_size),
        block_bytes_(max_block_bytes(plan)) {
    std::byte* scratch = thread_scratch(kRecvWindow * slot_bytes_ + 2 * block_bytes_);
    staging_ = scratch;
    partial_[0] = scratch + kRecvWindow * slot_bytes_;
    partial_[1] = partial_[0] + block_bytes_;
  }

  // Step 0 sends this rank's input for block r-1; each arriving partial
  // result is combined with this rank's input for its block and passed on,
  // the last step's straight into `out`.
  void run() {
    const int last = pipe_.steps() - 1;
    auto recv_buffer = [&](int k, std::size_t j) { return staging(k, j); };
    auto reduce = [&](int k, std::size_t j) {
      const int block = pipe_.recv_segment(k);
      const std::size_t off = pipe_.chunk_byte_offset(block, j);
      const std::size_t in_block = off - plan_.segment_offset(block) * plan_.elem_size;
      const std::size_t count = pipe_.chunk_count(block, j);
      std::byte* dst;
      if (k == last) {
        dst = out_ + in_block;  // block == rank_
      } else {
        if (k >= 2) pipe_.wait_send(k - 1, j);  // it sent this half's chunk j
        dst = partial_[k % 2] + in_block;
      }
      combine_(dst, in_ + off, staging(k, j), count);
      if (k == last) {
        scale(dst, count, dt_, postscale_);
      } else {
        pipe_.post_send(k + 1, j, dst);
      }
    };
    pipe_.run_in_order(in_ + plan_.segment_offset(pipe_.send_segment(0)) * plan_.elem_size,
                       recv_buffer, reduce);
  }

 private:
  static std::size_t max_block_bytes(const SegmentPlan& p) {
    std::size_t m = 0;
    for (int s = 0; s < p.world(); ++s) m = std::max(m, p.segment_count(s));
    return m * p.elem_size;
  }

  std::byte* staging(int k, std::size_t j) {
    return staging_ + ((static_cast<std::size_t>(k) * pipe_.chunks() + j) % kRecvWindow) * slot_bytes_;
  }

  const int n_, rank_;
  const SegmentPlan& plan_;
  RingPipeline pipe_;
  const std::byte* in_;
  std::byte* out_;
  CombineFn combine_;
  DataType dt_;
  double postscale_;
  std::size_t slot_bytes_, block_bytes_;
  std::byte* staging_;
  std::byte* partial_[2];
};

}  // namespace

void ring_reduce_scatter(Transport& t, const void* in, void* out,
                         std::span<const std::size_t> counts, DataType dt, ReduceOp op,
                         const ReduceScatterOptions& opt) {
  constexpr const char* kAlgo = "ring_reduce_scatter";
  detail::check_world(t, kAlgo);
  detail::check_reduction(dt, op, kAlgo);
  detail::check_chunk(opt.chunk_bytes, kAlgo);
  detail::check_tag(opt.tag, kAlgo);
  detail::check_scaling(dt, opt.prescale, opt.postscale, kAlgo);
  detail::check_per_rank(counts, t.size(), "counts", kAlgo);
  const std::size_t esz = dtype_size(dt);
  const std::size_t total = detail::checked_sum(counts, esz, "counts", kAlgo);
  const int n = t.size(), r = t.rank();
  const std::size_t mine = counts[static_cast<std::size_t>(r)] * esz;
  detail::check_buffer(in, total, "input buffer", kAlgo);
  detail::check_buffer(out, mine, "output buffer", kAlgo);
  const SegmentPlan plan = plan_blocks(counts, esz, opt.chunk_bytes);
  const auto* src = static_cast<const std::byte*>(in);
  auto* dst = static_cast<std::byte*>(out);
  // In place means `out` is this rank's block inside `in`.
  const std::byte* own_in = src + plan.segment_offset(r) * esz;
  if (dst != own_in && detail::overlaps(in, total, out, mine)) {
    throw InvalidArgument(fmt::format(
        "{}: output overlaps the input but is not this rank's block of it (rank {})", kAlgo, r));
  }
  if (total == 0) return;

  const double postscale = opt.postscale * (op == ReduceOp::kAverage ? 1.0 / n : 1.0);
  std::vector<std::byte> prescaled;
  if (opt.prescale != 1.0) {
    // Rare: a scaled copy of the whole input, so `in` stays unchanged.
    prescaled.assign(src, src + total);
    scale(prescaled.data(), total / esz, dt, opt.prescale);
    src = prescaled.data();
    own_in = src + plan.segment_offset(r) * esz;
  }
  if (n == 1) {
    if (dst != own_in) std::memmove(dst, own_in, mine);
    scale(dst, mine / esz, dt, postscale);
    return;
  }
  RingReduceScatter(t, src, dst, plan, combine_kernel(dt, op), dt, postscale, opt.tag).run();
}

}  // namespace gyre::collectives
