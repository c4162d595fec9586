// Recursive-doubling allreduce (see algorithms.h for when it is chosen).
//
// With p the largest power of two <= n and e = n - p: ranks 2i+1 < 2e send
// their input to rank 2i and wait; the p remaining ranks, renumbered
// v = 0..p-1 in rank order, exchange their whole partial result with the
// partner v ^ mask for mask = 1, 2, ..., p/2 and combine; then each rank 2i
// sends the result to 2i+1. Every combination puts the lower rank's operand
// first, so both partners compute the same bits (min and max are not
// commutative bit for bit: NaN against a number, +0 against -0), and all
// ranks end with one result.
//
// The whole buffer goes in one message per step: the buffers this serves are
// small (kDefaultSmallBytes), where a step's latency, not its bytes, is the
// cost. Received data lands in the per-thread staging area; the first step
// sends straight from the input, so out-of-place needs no initial copy, and
// at most one copy into `out` ends the exchanges.
#include <bit>
#include <cstring>

#include "allreduce_impl.h"
#include "gyre/collectives/reduce_kernels.h"
#include "ring_pipeline.h"

namespace gyre::collectives::detail {

namespace {

// Sends `send` to and receives `recv` from `peer` at once (the receive posted
// first, so the peer's message never waits in MPI's unexpected queue).
void exchange(Transport& t, int peer, int tag, const std::byte* send, std::byte* recv,
              std::size_t bytes) {
  transport::Transfer rr = t.irecv(peer, tag, {recv, bytes});
  transport::Transfer sr = t.isend(peer, tag, {send, bytes});
  t.wait(rr);
  t.wait(sr);
}

}  // namespace

void run_recursive_doubling(Transport& t, const std::byte* src, std::byte* out, std::size_t count,
                            DataType dt, ReduceOp op, double postscale, int tag) {
  const int n = t.size();
  const int r = t.rank();
  const int p = static_cast<int>(std::bit_floor(static_cast<unsigned>(n)));
  const int extra = n - p;
  const std::size_t bytes = count * dtype_size(dt);
  const CombineFn combine = combine_kernel(dt, op);

  if (r < 2 * extra && r % 2 == 1) {
    // Folded into r-1: contribute, then receive the scaled result.
    transport::Transfer sr = t.isend(r - 1, tag, {src, bytes});
    if (src != out) {
      transport::Transfer rr = t.irecv(r - 1, tag, {out, bytes});
      t.wait(sr);
      t.wait(rr);
    } else {
      t.wait(sr);  // `out` is the buffer being sent
      transport::Transfer rr = t.irecv(r - 1, tag, {out, bytes});
      t.wait(rr);
    }
    return;
  }

  // Two receive buffers: a partial result may stay in the one it arrived in
  // while the next step receives into the other.
  std::byte* const scratch = thread_scratch(2 * bytes);
  std::byte* const spare[2] = {scratch, scratch + bytes};
  int next = 0;
  const std::byte* mine = src;  // this rank's partial result
  int v;                        // rank among the p
  if (r < 2 * extra) {
    transport::Transfer rr = t.irecv(r + 1, tag, {spare[0], bytes});
    t.wait(rr);
    combine(out, src, spare[0], count);  // r before r+1
    mine = out;
    v = r / 2;
  } else {
    v = r - extra;
  }
  for (int mask = 1; mask < p; mask <<= 1) {
    const int pv = v ^ mask;
    const int peer = pv < extra ? 2 * pv : pv + extra;
    std::byte* const theirs = spare[next];
    exchange(t, peer, tag, mine, theirs, bytes);
    // A combine kernel computes op(a, b), but op(b, a) when its output is
    // `b` (combine_fn in reduce_kernels.cc), so the output is always the
    // first operand's buffer: `out` when this rank's result comes first,
    // the receive buffer when the peer's does.
    if (v < pv) {
      combine(out, mine, theirs, count);
      mine = out;
    } else {
      combine(theirs, theirs, mine, count);
      mine = theirs;
      next ^= 1;
    }
  }
  if (mine != out) std::memcpy(out, mine, bytes);
  scale(out, count, dt, postscale);
  if (r < 2 * extra) {
    transport::Transfer sr = t.isend(r + 1, tag, {out, bytes});
    t.wait(sr);
  }
}

}  // namespace gyre::collectives::detail
