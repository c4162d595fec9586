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
//   all-gather phase chunks are received straight into `out`;
// - chunks are processed in wavefronts across steps (see plan_order), so
//   the next rank copies a forwarded chunk while it is still in cache.
//
// Rank r at step k sends segment r-k and receives segment r-k-1 (mod n).
// Steps 0..n-2 reduce (after them rank r holds segment r+1 fully reduced),
// steps n-1..2n-3 copy. The last reduce-scatter step forwards its result as
// the first all-gather step's send, so the pipeline runs across the phase
// boundary without draining.
#include <algorithm>
#include <cstring>
#include <vector>

#include "gyre/collectives/algorithms.h"
#include "gyre/collectives/reduce_kernels.h"
#include "allreduce_impl.h"
#include "ring_pipeline.h"

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
        staging_(thread_scratch(kRecvWindow * slot_bytes_)) {
    plan_order();
  }

  void run() {
    start();
    for (const Unit& u : order_) {
      if (u.k < n_ - 1) {
        reduce_chunk(u.k, u.j);  // reduce-scatter phase
      } else {
        gather_chunk(u.k, u.j);  // all-gather phase
      }
    }
    pipe_.finish();
  }

 private:
  // Step 0 sends this rank's own segment straight from the input, keeping
  // kRecvWindow chunks ahead of the reduction: a message that reaches the
  // peer before its receive is posted costs MPI an extra copy. (Step 0 has
  // its own tag, see RingPipeline, so these sends need not be ordered with
  // the forwarded ones.)
  void start() {
    pipe_.start_own_sends(src_ + pipe_.chunk_byte_offset(pipe_.send_segment(0), 0));
    top_up(kRecvWindow);
  }

  // Reduce-scatter step k (0 <= k < n-1): receive a partial sum of chunk j
  // of segment r-k-1, combine it with this rank's input for it, pass it on.
  void reduce_chunk(int k, std::size_t j) {
    wait_unit(k, j);
    const int seg = pipe_.recv_segment(k);
    const std::size_t off = pipe_.chunk_byte_offset(seg, j);
    const std::size_t count = pipe_.chunk_count(seg, j);
    combine_(out_ + off, src_ + off, staging(k, j), count);
    if (k == n_ - 2) scale(out_ + off, count, dt_, postscale_);  // average's 1/n included
    if (k == 0) pipe_.pace_own_send(j);
    forward(k, j);
  }

  // All-gather step k (n-1 <= k < 2n-2): receive a fully reduced chunk in
  // place, pass it on.
  void gather_chunk(int k, std::size_t j) {
    wait_unit(k, j);
    forward(k, j);
  }

  // Unit (k, j) is done: send its chunk on as unit (k+1, j) and keep the
  // receive window full.
  void forward(int k, std::size_t j) {
    if (k + 1 < pipe_.steps()) {
      pipe_.post_send(k + 1, j, out_ + pipe_.chunk_byte_offset(pipe_.send_segment(k + 1), j));
    }
    top_up(position(k, j) + 1 + kRecvWindow);
  }

  struct Unit {
    int k;
    std::size_t j;
  };

  // The processing order: wavefronts d = k + j, each from its latest step
  // down (with two ranks: chunk by chunk, reduce then gather).
  // Unit (k, j) needs unit (k-1, j) of the previous rank, which is on
  // wavefront d-1, so ranks advance wavefront by wavefront, and a chunk
  // forwarded at one wavefront is copied by the next rank at the next one,
  // while still in cache. (Done phase by phase instead, a chunk would wait a
  // whole segment before being copied, from memory.) Both neighbours order
  // the units the same way, shifted by one step, which keeps each message
  // stream in the same order at both ends (see ring_pipeline.h).
  void plan_order() {
    const auto steps = static_cast<std::size_t>(pipe_.steps());
    const std::size_t chunks = pipe_.chunks();
    position_.assign(steps * chunks, 0);
    later_index_.assign(steps * chunks, 0);
    order_.reserve(steps * chunks);
    for (std::size_t d = 0; d + 1 < steps + chunks; ++d) {
      const std::size_t k_first = d >= chunks ? d - chunks + 1 : 0;
      for (std::size_t k = std::min(d, steps - 1) + 1; k-- > k_first;) {
        const std::size_t id = k * chunks + (d - k);
        position_[id] = order_.size();
        if (k > 0) {
          later_index_[id] = later_.size();
          later_.push_back(order_.size());
        }
        order_.push_back({static_cast<int>(k), d - k});
      }
    }
  }

  std::size_t position(int k, std::size_t j) const {
    return position_[static_cast<std::size_t>(k) * pipe_.chunks() + j];
  }

  // Receives are posted in processing order within each of the two streams
  // of RingPipeline (step 0 on one tag, later steps on the other), so that
  // an all-gather receive held back by hazard_free never holds back the
  // reduce-scatter receives behind it. Later-step units are numbered in
  // processing order: i -> order_[later_[i]].
  int later_step(std::size_t i) const { return order_[later_[i]].k; }
  std::size_t later_chunk(std::size_t i) const { return order_[later_[i]].j; }
  std::size_t later_index(int k, std::size_t j) const {
    return later_index_[static_cast<std::size_t>(k) * pipe_.chunks() + j];
  }

  // Posts receives at positions below `limit` (the window: at most
  // kRecvWindow positions past the last unit processed). Stops the
  // later-step stream, without blocking, at a receive whose buffer is still
  // being sent from (see hazard_free); wait_unit() posts it when needed.
  void top_up(std::size_t limit) {
    while (next_first_ < pipe_.chunks() && position(0, next_first_) < limit) {
      post_receive(0, next_first_++);
    }
    const std::size_t later_units = pipe_.units() - pipe_.chunks();
    while (next_later_ < later_units) {
      const int k = later_step(next_later_);
      const std::size_t j = later_chunk(next_later_);
      if (position(k, j) >= limit || !hazard_free(k, j, /*block=*/false)) return;
      post_receive(k, j);
      ++next_later_;
    }
  }

  // Waits for the receive of unit (k, j), posting it (and what precedes it
  // in its stream) first if top_up has not.
  void wait_unit(int k, std::size_t j) {
    if (k == 0) {
      while (next_first_ <= j) post_receive(0, next_first_++);
    } else {
      while (next_later_ <= later_index(k, j)) {
        const int pk = later_step(next_later_);
        const std::size_t pj = later_chunk(next_later_);
        hazard_free(pk, pj, /*block=*/true);
        post_receive(pk, pj);
        ++next_later_;
      }
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

  // Staging slot of a reduce-scatter unit: the unit kRecvWindow positions
  // earlier, which used the same slot, has been reduced before this one's
  // receive is posted.
  std::byte* staging(int k, std::size_t j) {
    return staging_ + (position(k, j) % kRecvWindow) * slot_bytes_;
  }

  const int n_;
  RingPipeline pipe_;
  const std::byte* src_;
  std::byte* out_;
  CombineFn combine_;
  DataType dt_;
  double postscale_;
  std::vector<Unit> order_;                // units in processing order
  std::vector<std::size_t> position_;      // unit id (k * chunks + j) -> index in order_
  std::vector<std::size_t> later_;         // later-step stream: i -> index in order_
  std::vector<std::size_t> later_index_;   // unit id -> i in later_
  std::size_t slot_bytes_;
  std::byte* staging_;
  std::size_t next_first_ = 0;  // step-0 receives of chunks [0, next_first_) are posted
  std::size_t next_later_ = 0;  // later-step receives [0, next_later_) are posted
};

}  // namespace

namespace detail {

void run_ring_allreduce(Transport& t, const std::byte* src, std::byte* out, std::size_t count,
                        DataType dt, ReduceOp op, double postscale, std::size_t chunk_bytes,
                        int tag) {
  const SegmentPlan plan = plan_ring(count, dtype_size(dt), t.size(), chunk_bytes);
  RingAllreduce(t, src, out, plan, combine_kernel(dt, op), dt, postscale, tag).run();
}

}  // namespace detail
}  // namespace gyre::collectives
