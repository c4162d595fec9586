// Rabenseifner's allreduce (see algorithms.h for when it is chosen):
// reduce-scatter by recursive halving, then allgather by recursive doubling.
//
// With p the largest power of two <= n and e = n - p, ranks 2i+1 < 2e first
// fold into 2i (send their whole input; 2i combines it, the lower rank's
// operand first) and wait for the result; the p remaining ranks, renumbered
// v = 0..p-1 in rank order (2i -> i, r >= 2e -> r - e), run the power-of-two
// algorithm:
//
// - reduce-scatter, mask = p/2, p/4, ..., 1: the range [lo, hi) this rank
//   still works on (the whole buffer at first) is split at
//   mid = lo + (hi - lo) / 2; the rank with v & mask == 0 keeps [lo, mid),
//   its partner v ^ mask keeps [mid, hi). Each sends its partial result of
//   the half it gives up and combines the partner's partial result of the
//   half it keeps. Partners have the same range at every step (they agree on
//   every bit above mask), so they agree on the split. After log2 p steps
//   rank v holds about 1/p of the buffer fully reduced; postscale (with
//   average's 1/n) is applied to that block only.
// - allgather, mask = 1, 2, ..., p/2: the steps in reverse; each rank sends
//   the range it kept at that level and receives the partner's, straight
//   into `out`.
//
// Then 2i sends the result to 2i+1. Per rank: 2 log2 p messages (plus 2 for
// the folded pairs), 2 (p-1)/p of the buffer sent and received (plus the
// whole buffer twice for the folded pairs), and (p-1)/p of it combined.
//
// Each element is combined by exactly one rank at each step and the result
// copied to the others, so every rank ends with the same bits (for every op,
// min and max with NaN or signed zeros included). A step's exchange is cut
// in chunks of chunk_bytes, kWindow of them in flight each way, so the
// transfer of chunk j+1 overlaps the combine of chunk j. Both partners post
// the chunks of one exchange in the same order on one tag, so they match in
// order; empty ranges (counts smaller than p) send nothing on either side.
// Received partial results land in kWindow chunk-sized slots of the
// per-thread staging area, reused once combined; the first step reads the
// caller's input directly, so out-of-place needs no initial copy. The folds
// are chunked alike.
#include <algorithm>
#include <bit>
#include <cstring>
#include <vector>

#include "allreduce_impl.h"
#include "gyre/collectives/reduce_kernels.h"
#include "ring_pipeline.h"

namespace gyre::collectives::detail {

namespace {

// Chunks of one exchange in flight each way.
constexpr std::size_t kWindow = 8;

struct Range {
  std::size_t lo = 0, hi = 0;  // elements
  std::size_t size() const { return hi - lo; }
};

// One exchange with `peer`: sends `send_count` elements from `send`,
// receives `recv_count`, both in chunks of `chunk` elements, at most kWindow
// chunks in flight each way. Received chunks land contiguously in `recv`
// when `staged` is false; when it is true, chunk j lands in slot j % kWindow
// of `recv` (kWindow * chunk elements), reused once chunk j has been
// handled. on_chunk(offset, count, data) runs once each received chunk has
// arrived, in order (offset in elements from the start of the received
// range, data where it landed). Returns after every transfer has completed.
template <class OnChunk>
void exchange_chunked(Transport& t, int peer, int tag, const std::byte* send,
                      std::size_t send_count, std::byte* recv, bool staged, std::size_t recv_count,
                      std::size_t chunk, std::size_t esz, OnChunk&& on_chunk) {
  const std::size_t send_chunks = (send_count + chunk - 1) / chunk;
  const std::size_t recv_chunks = (recv_count + chunk - 1) / chunk;
  std::vector<transport::Transfer> sends(send_chunks), recvs(recv_chunks);
  auto at = [&](std::size_t j) {
    return recv + (staged ? (j % kWindow) * chunk : j * chunk) * esz;
  };
  auto post_recv = [&](std::size_t j) {
    if (j >= recv_chunks) return;
    const std::size_t off = j * chunk, n = std::min(chunk, recv_count - off);
    recvs[j] = t.irecv(peer, tag, {at(j), n * esz});
  };
  auto post_send = [&](std::size_t j) {
    if (j >= send_chunks) return;
    const std::size_t off = j * chunk, n = std::min(chunk, send_count - off);
    sends[j] = t.isend(peer, tag, {send + off * esz, n * esz});
  };
  for (std::size_t j = 0; j < kWindow; ++j) {
    post_recv(j);
    post_send(j);
  }
  const std::size_t rounds = std::max(send_chunks, recv_chunks);
  for (std::size_t j = 0; j < rounds; ++j) {
    if (j < recv_chunks) {
      t.wait(recvs[j]);
      const std::size_t off = j * chunk;
      on_chunk(off, std::min(chunk, recv_count - off), at(j));
      post_recv(j + kWindow);
    }
    if (j < send_chunks) {
      // Keep at most kWindow sends in flight: the next one goes once this
      // one has left.
      t.wait(sends[j]);
      post_send(j + kWindow);
    }
  }
}

}  // namespace

void run_rabenseifner(Transport& t, const std::byte* src, std::byte* out, std::size_t count,
                      DataType dt, ReduceOp op, double postscale, std::size_t chunk_bytes,
                      int tag) {
  const int n = t.size();
  const int r = t.rank();
  const int p = static_cast<int>(std::bit_floor(static_cast<unsigned>(n)));
  const int extra = n - p;
  const std::size_t esz = dtype_size(dt);
  const std::size_t chunk = std::min(count, std::max<std::size_t>(1, chunk_bytes / esz));
  const CombineFn combine = combine_kernel(dt, op);
  auto nothing = [](std::size_t, std::size_t, const std::byte*) {};

  if (r < 2 * extra && r % 2 == 1) {
    // Folded into r-1: contribute, then receive the scaled result. (Not one
    // exchange: in place, `out` is the buffer being sent.)
    exchange_chunked(t, r - 1, tag, src, count, nullptr, false, 0, chunk, esz, nothing);
    exchange_chunked(t, r - 1, tag, nullptr, 0, out, false, count, chunk, esz, nothing);
    return;
  }

  std::byte* const staging = thread_scratch(kWindow * chunk * esz);
  const std::byte* mine = src;  // this rank's partial results (full layout)
  int v;                        // rank among the p
  if (r < 2 * extra) {
    // Fold r+1 in, chunk by chunk as it arrives: out = op(src, theirs).
    exchange_chunked(t, r + 1, tag, nullptr, 0, staging, true, count, chunk, esz,
                     [&](std::size_t off, std::size_t m, const std::byte* theirs) {
                       combine(out + off * esz, src + off * esz, theirs, m);
                     });
    mine = out;
    v = r / 2;
  } else {
    v = r - extra;
  }
  auto world_rank = [&](int u) { return u < extra ? 2 * u : u + extra; };

  // Reduce-scatter by recursive halving; kept[l] is the range kept at the
  // level of mask p >> (l + 1), given[l] the partner's.
  std::vector<Range> kept, given;
  Range cur{0, count};
  for (int mask = p / 2; mask >= 1; mask /= 2) {
    const int pv = v ^ mask;
    const std::size_t mid = cur.lo + cur.size() / 2;
    const Range low{cur.lo, mid}, high{mid, cur.hi};
    const Range keep = (v & mask) ? high : low;
    const Range give = (v & mask) ? low : high;
    const bool mine_first = v < pv;
    exchange_chunked(
        t, world_rank(pv), tag, mine + give.lo * esz, give.size(), staging, true, keep.size(),
        chunk, esz, [&](std::size_t off, std::size_t m, const std::byte* received) {
          const std::size_t at = (keep.lo + off) * esz;
          // The lower rank's operand first. A kernel whose output is its
          // second operand computes op(b, a) (reduce_kernels.cc), so in
          // place with the partner's operand first the result is formed in
          // the staging slot and copied.
          auto* theirs = const_cast<std::byte*>(received);
          if (mine_first) {
            combine(out + at, mine + at, theirs, m);
          } else if (mine != out) {
            combine(out + at, theirs, mine + at, m);
          } else {
            combine(theirs, theirs, out + at, m);
            std::memcpy(out + at, theirs, m * esz);
          }
        });
    // Every send of `give` has completed (exchange_chunked waits for them),
    // and `out` now holds this rank's partial results of `keep`.
    mine = out;
    kept.push_back(keep);
    given.push_back(give);
    cur = keep;
  }
  scale(out + cur.lo * esz, cur.size(), dt, postscale);

  // Allgather by recursive doubling: the levels in reverse, received
  // straight into `out`.
  for (std::size_t l = kept.size(); l-- > 0;) {
    const int pv = v ^ (p >> (l + 1));
    exchange_chunked(t, world_rank(pv), tag, out + kept[l].lo * esz, kept[l].size(),
                     out + given[l].lo * esz, false, given[l].size(), chunk, esz, nothing);
  }

  if (r < 2 * extra) {
    exchange_chunked(t, r + 1, tag, out, count, nullptr, false, 0, chunk, esz, nothing);
  }
}

}  // namespace gyre::collectives::detail
