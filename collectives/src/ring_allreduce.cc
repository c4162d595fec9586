// Ring allreduce: a reduce-scatter phase then an all-gather phase around the
// ring r -> r+1, each segment pipelined in chunks.
//
// Memory traffic is what limits a CPU allreduce, so the ring is built to
// touch each byte as few times as possible:
// - a chunk arriving in the reduce-scatter phase lands in a small staging
//   slot (cache-sized, reused) and is combined with a 3-operand kernel,
//   out = in (+) staged, so out-of-place needs no initial copy of `in`;
// - the next receives stay posted while a chunk is being reduced (a window of
//   kRecvWindow staging slots), so the transfer of chunk k+1 overlaps the
//   reduction of chunk k;
// - a reduced chunk is forwarded as soon as it is reduced, and in the
//   all-gather phase chunks are received straight into `out`.
//
// Rank r at step k sends segment r-k and receives segment r-k-1 (mod n).
// Steps 0..n-2 reduce (after them rank r holds segment r+1 fully reduced),
// steps n-1..2n-3 copy. The last reduce-scatter step forwards its result as
// the first all-gather step's send, so the pipeline runs across the phase
// boundary without draining.
#include <algorithm>
#include <cstring>

#include "gyre/collectives/algorithms.h"
#include "gyre/collectives/reduce_kernels.h"
#include "ring_pipeline.h"
#include "validate.h"

namespace gyre::collectives {

namespace {

class RingAllreduce {
 public:
  RingAllreduce(Transport& t, const std::byte* src, std::byte* out, const SegmentPlan& plan,
                CombineFn combine, DataType dt, double postscale, int tag)
      : n_(t.size()),
        pipe_(t, plan, 2 * (n_ - 1), t.rank(), tag),
        src_(src),
        out_(out),
        combine_(combine),
        dt_(dt),
        postscale_(postscale),
        slot_bytes_(plan.max_chunk_count * plan.elem_size),
        staging_(thread_scratch(kRecvWindow * slot_bytes_)) {}

  void run() {
    start();
    reduce_scatter_phase();
    all_gather_phase();
    pipe_.finish();
  }

 private:
  // Step 0 sends this rank's own segment straight from the input, all of it
  // at once. (Holding these sends back to the receive window would save MPI
  // buffering the head of unexpected messages, but forwarded sends must
  // follow them in unit order on the one tag: they could then not start
  // until the whole segment had been posted anyway.)
  void start() {
    for (std::size_t j = 0; j < pipe_.chunks(); ++j) send_own_chunk(j);
    top_up(kRecvWindow);
  }

  void send_own_chunk(std::size_t j) {
    pipe_.post_send(0, j, src_ + pipe_.chunk_byte_offset(pipe_.send_segment(0), j));
  }

  // n-1 steps: receive a partial sum of segment r-k-1, combine it with this
  // rank's input for that segment, pass the result on.
  void reduce_scatter_phase() {
    const int last = n_ - 2;
    for (int k = 0; k <= last; ++k) {
      const int seg = pipe_.recv_segment(k);
      for (std::size_t j = 0; j < pipe_.chunks(); ++j) {
        wait_unit(k, j);
        const std::size_t off = pipe_.chunk_byte_offset(seg, j);
        const std::size_t count = pipe_.chunk_count(seg, j);
        combine_(out_ + off, src_ + off, staging(k, j), count);
        if (k == last) scale(out_ + off, count, dt_, postscale_);  // average's 1/n included
        forward(k, j);
      }
    }
  }

  // n-1 steps: receive a fully reduced chunk into place, pass it on.
  void all_gather_phase() {
    for (int k = n_ - 1; k < pipe_.steps(); ++k) {
      for (std::size_t j = 0; j < pipe_.chunks(); ++j) {
        wait_unit(k, j);
        forward(k, j);
      }
    }
  }

  // Unit (k, j) is done: send its chunk on as unit (k+1, j) and keep the
  // receive window full.
  void forward(int k, std::size_t j) {
    const std::size_t u = static_cast<std::size_t>(k) * pipe_.chunks() + j;
    if (k + 1 < pipe_.steps()) {
      pipe_.post_send(k + 1, j, out_ + pipe_.chunk_byte_offset(pipe_.send_segment(k + 1), j));
    }
    top_up(u + 1 + kRecvWindow);
  }

  // Posts receives, in unit order, up to (not including) unit `limit`.
  // Stops early, without blocking, at an all-gather receive whose buffer is
  // still being sent from (see hazard_free); wait_unit() posts it later.
  void top_up(std::size_t limit) {
    limit = std::min(limit, pipe_.units());
    while (posted_ < limit) {
      const int k = static_cast<int>(posted_ / pipe_.chunks());
      const std::size_t j = posted_ % pipe_.chunks();
      if (!hazard_free(k, j, /*block=*/false)) return;
      post_receive(k, j);
      ++posted_;
    }
  }

  // Waits for the receive of unit (k, j), posting it first if top_up could not.
  void wait_unit(int k, std::size_t j) {
    const std::size_t u = static_cast<std::size_t>(k) * pipe_.chunks() + j;
    while (posted_ <= u) {
      const int pk = static_cast<int>(posted_ / pipe_.chunks());
      const std::size_t pj = posted_ % pipe_.chunks();
      hazard_free(pk, pj, /*block=*/true);
      post_receive(pk, pj);
      ++posted_;
    }
    pipe_.wait_recv(k, j);
  }

  // An all-gather receive at step k overwrites the segment that
  // reduce-scatter step k-(n-1) sent from `out` (from `src` at step 0, which
  // is `out` when in place). Its buffer is free once that send completed;
  // in practice it has, as the data has been around the ring since.
  bool hazard_free(int k, std::size_t j, bool block) {
    const int k_send = k - (n_ - 1);
    if (k_send < 0 || (k_send == 0 && src_ != out_)) return true;
    if (block) {
      pipe_.wait_send(k_send, j);
      return true;
    }
    return pipe_.test_send(k_send, j);
  }

  void post_receive(int k, std::size_t j) {
    if (k < n_ - 1) {
      pipe_.post_recv(k, j, staging(k, j));
    } else {
      pipe_.post_recv(k, j, out_ + pipe_.chunk_byte_offset(pipe_.recv_segment(k), j));
    }
  }

  std::byte* staging(int k, std::size_t j) {
    return staging_ + ((static_cast<std::size_t>(k) * pipe_.chunks() + j) % kRecvWindow) * slot_bytes_;
  }

  const int n_;
  RingPipeline pipe_;
  const std::byte* src_;
  std::byte* out_;
  CombineFn combine_;
  DataType dt_;
  double postscale_;
  std::size_t slot_bytes_;
  std::byte* staging_;
  std::size_t posted_ = 0;  // receives of units [0, posted_) have been posted
};

}  // namespace

void ring_allreduce(Transport& t, const void* in, void* out, std::size_t count, DataType dt,
                    ReduceOp op, const RingOptions& opt) {
  constexpr const char* kAlgo = "ring_allreduce";
  detail::check_world(t, kAlgo);
  detail::check_reduction(dt, op, kAlgo);
  detail::check_options(opt, kAlgo);
  detail::check_scaling(dt, opt, kAlgo);
  const std::size_t bytes = detail::checked_bytes(count, dtype_size(dt), kAlgo);
  detail::check_buffer(in, bytes, "input buffer", kAlgo);
  detail::check_buffer(out, bytes, "output buffer", kAlgo);
  detail::check_overlap(in, bytes, out, bytes, "input", "output", kAlgo);
  if (count == 0) return;

  const int n = t.size();
  const double postscale = opt.postscale * (op == ReduceOp::kAverage ? 1.0 / n : 1.0);
  const auto* src = static_cast<const std::byte*>(in);
  auto* dst = static_cast<std::byte*>(out);
  if (opt.prescale != 1.0) {
    // Rare: scale a copy in `out` and reduce that in place, so `in` stays
    // unchanged and every contribution is scaled exactly once.
    if (dst != src) std::memcpy(dst, src, bytes);
    scale(dst, count, dt, opt.prescale);
    src = dst;
  }
  if (n == 1) {
    if (dst != src) std::memcpy(dst, src, bytes);
    scale(dst, count, dt, postscale);
    return;
  }
  const SegmentPlan plan = plan_ring(count, dtype_size(dt), n, opt.chunk_bytes);
  RingAllreduce(t, src, dst, plan, combine_kernel(dt, op), dt, postscale, opt.tag).run();
}

}  // namespace gyre::collectives
