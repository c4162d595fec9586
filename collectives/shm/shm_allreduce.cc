// shm_allreduce_pieces (and shm_allreduce, its one-piece case): every rank
// copies its input of each other rank's share of a chunk into its slot (of
// its own share only what it cannot read in place from the pieces'
// inputs), reduces its share into the pieces' outputs and into every other
// slot, and copies the other shares out of its slot; shm_reduce_slots
// reduces data already in the slots (the single-copy bound of the
// benchmarks); shm_allreduce_registered reduces buffers that lie in a pool
// every rank maps straight from one another (shm_pool.h).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "gyre/collectives/reduce_kernels.h"
#include "gyre/collectives/shm.h"
#include "gyre/collectives/shm_pool.h"
#include "gyre/error.h"

namespace gyre::collectives {

namespace {

// Each share starts on a 64-byte boundary, so no two ranks write the same
// cache line of a slot.
std::size_t line_elems(std::size_t esize) { return std::max<std::size_t>(64 / esize, 1); }

// Rank q's share of a chunk of n elements: [lo, hi), whole 64-byte lines
// (the last share may be short or empty).
struct Share {
  std::size_t lo = 0, hi = 0;
};
Share share_of(int q, int p, std::size_t n, std::size_t line) {
  const std::size_t per = (n + static_cast<std::size_t>(p) - 1) / static_cast<std::size_t>(p);
  const std::size_t per_aligned = (per + line - 1) / line * line;
  const std::size_t lo = std::min(n, static_cast<std::size_t>(q) * per_aligned);
  return {lo, std::min(n, lo + per_aligned)};
}

// A share is reduced in pieces that keep the accumulator in cache: a share
// of a large slot (the bound's) would otherwise go through memory three
// more times.
std::size_t reduce_piece_elems(std::size_t esize, std::size_t line) {
  constexpr std::size_t kPieceBytes = 128u << 10;
  return std::max<std::size_t>(kPieceBytes / esize / line * line, line);
}

// How this rank reduces its share: the kernels, the dtype, the postscale
// (an average's 1/n folded in), and scratch.
struct ShareReduction {
  DataType dt;
  ReduceFn reduce;
  CombineFn combine;
  double postscale;
  std::vector<std::byte> acc;
};

// Bytes [at, at + len) of this rank's share of a chunk (at: the offset in
// the slots), reduced in rank order: this rank's operand is `own` (in its
// slot, or its input read in place), every other rank's is in its slot.
// The result goes into `dest` (this rank's output, or its slot) and into
// every other rank's slot, in pieces that keep it in cache
// (reduce_piece_elems). Between two barriers: each rank touches only its
// own share. At least 2 ranks.
void reduce_share(ShmGroup& g, std::size_t at, std::size_t len, const std::byte* own,
                  std::byte* dest, ShareReduction& r) {
  const int p = g.size(), me = g.rank();
  const std::size_t esize = dtype_size(r.dt);
  const std::size_t piece = reduce_piece_elems(esize, line_elems(esize)) * esize;
  for (std::size_t x = 0; x < len; x += piece) {
    const std::size_t bytes = std::min(piece, len - x);
    const std::size_t m = bytes / esize;
    auto operand = [&](int q) -> const std::byte* {
      return q == me ? own + x : g.slot(q) + at + x;
    };
    // Where my operand is where the result goes, accumulating there would
    // overwrite it before it is read, unless it is one of the first two
    // operands (read as they are written): a scratch buffer then.
    std::byte* target = dest + x;
    if (me >= 2 && own == dest) {
      r.acc.resize(bytes);
      target = r.acc.data();
    }
    r.combine(target, operand(0), operand(1), m);
    for (int q = 2; q < p; ++q) r.reduce(target, operand(q), m);
    if (r.postscale != 1.0) scale(target, m, r.dt, r.postscale);
    if (target != dest + x) std::memcpy(dest + x, target, bytes);
    // Pushed into every other slot while it is in cache: that costs less
    // than each rank reading it out of the owner's slot after the barrier
    // (measured: 64 KiB 15 against 10 us, 16 MiB 1.15x).
    for (int q = 0; q < p; ++q) {
      if (q != me) std::memcpy(g.slot(q) + at + x, target, bytes);
    }
  }
}

// Checks made before the first barrier: arguments are agreed across ranks,
// so every rank throws alike and none is left waiting.
void check_scales(DataType dt, double prescale, double postscale) {
  if (!scaling_defined(dt) && (prescale != 1.0 || postscale != 1.0)) {
    throw InvalidArgument(fmt::format("shm allreduce: scale factors {} and {} on {} tensors",
                                      prescale, postscale, dtype_name(dt)));
  }
}

// The pieces that overlap bytes [lo, hi) of the bucket, sorted by offset:
// `first` is the first piece not wholly before `lo` (advanced as the
// chunks move on, since chunks come in order).
struct PieceCursor {
  std::span<const BucketPiece> pieces;
  std::size_t first = 0;
  void advance_to(std::size_t lo) {
    while (first < pieces.size() && pieces[first].offset + pieces[first].bytes <= lo) ++first;
  }
};

// Bytes [a, b) of the bucket within one piece (its input and output at a,
// either possibly absent) or between pieces (neither).
struct Segment {
  std::size_t a = 0, b = 0;
  const std::byte* in = nullptr;
  std::byte* out = nullptr;
};

// Calls f(segment) for the segments that cover bytes [lo, hi), in order.
template <class F>
void for_each_segment(PieceCursor c, std::size_t lo, std::size_t hi, F&& f) {
  c.advance_to(lo);
  std::size_t at = lo;
  for (std::size_t i = c.first; i < c.pieces.size() && c.pieces[i].offset < hi; ++i) {
    const BucketPiece& pc = c.pieces[i];
    const std::size_t a = std::max(lo, pc.offset), b = std::min(hi, pc.offset + pc.bytes);
    if (a > at) f(Segment{at, a, nullptr, nullptr});
    const std::size_t off = a - pc.offset;
    f(Segment{a, b, pc.in != nullptr ? static_cast<const std::byte*>(pc.in) + off : nullptr,
              pc.out != nullptr ? static_cast<std::byte*>(pc.out) + off : nullptr});
    at = b;
  }
  if (hi > at) f(Segment{at, hi, nullptr, nullptr});
}

// A segment's input into `to` (zeros where it has none).
void gather_segment(const Segment& s, std::byte* to) {
  if (s.in != nullptr) {
    std::memcpy(to, s.in, s.b - s.a);
  } else {
    std::memset(to, 0, s.b - s.a);
  }
}

}  // namespace

void shm_allreduce_pieces(ShmGroup& g, std::span<const BucketPiece> pieces, std::size_t count,
                          DataType dt, ReduceOp op, double prescale, double postscale) {
  check_scales(dt, prescale, postscale);
  if (op == ReduceOp::kAverage) postscale /= g.size();
  const std::size_t esize = dtype_size(dt);
  const std::size_t line = line_elems(esize);
  const std::size_t chunk_elems = g.slot_bytes() / esize / line * line;
  if (chunk_elems == 0) {
    throw InvalidArgument(fmt::format("shm allreduce: slot of {} bytes holds no {} element",
                                      g.slot_bytes(), dtype_name(dt)));
  }
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const bool ordered = i == 0 || pieces[i].offset >= pieces[i - 1].offset + pieces[i - 1].bytes;
    if (!ordered || pieces[i].offset + pieces[i].bytes > count * esize) {
      throw InvalidArgument(fmt::format(
          "shm allreduce: piece {} (bytes {} to {}) overlaps the one before it or ends past "
          "the {} bytes of the bucket", i, pieces[i].offset, pieces[i].offset + pieces[i].bytes,
          count * esize));
    }
    if (pieces[i].offset % esize != 0 || pieces[i].bytes % esize != 0) {
      throw InvalidArgument(fmt::format(
          "shm allreduce: piece {} (bytes {} to {}) does not start and end on {} elements", i,
          pieces[i].offset, pieces[i].offset + pieces[i].bytes, dtype_name(dt)));
    }
  }
  const int p = g.size(), me = g.rank();
  std::byte* const slot = g.slot(me);
  // This rank's operand of its own share is read in place from each
  // piece's input where there is one and it is not prescaled, and its
  // result goes straight into the piece's output; the rest of the share
  // goes through the slot.
  auto in_place = [&](const Segment& s) { return s.in != nullptr && prescale == 1.0; };
  ShareReduction r{dt, reduce_kernel(dt, op), combine_kernel(dt, op), postscale, {}};
  PieceCursor cursor{pieces};
  try {
    for (std::size_t done = 0; done < count; done += chunk_elems) {
      const std::size_t n = std::min(chunk_elems, count - done);
      const std::size_t lo = done * esize, hi = lo + n * esize;
      cursor.advance_to(lo);
      auto bytes_of = [&](const Share& sh) {
        return std::pair{lo + sh.lo * esize, lo + sh.hi * esize};
      };
      // A segment's input (zeros where it has none), prescaled, at its
      // place in my slot.
      auto stage = [&](const Segment& s) {
        std::byte* const at = slot + (s.a - lo);
        gather_segment(s, at);
        if (prescale != 1.0) scale(at, (s.b - s.a) / esize, dt, prescale);
        return at;
      };
      if (p == 1) {
        for_each_segment(cursor, lo, hi, [&](const Segment& s) {
          std::byte* const at = stage(s);
          if (postscale != 1.0) scale(at, (s.b - s.a) / esize, dt, postscale);
          if (s.out != nullptr) std::memcpy(s.out, at, s.b - s.a);
        });
        continue;
      }
      // 1. Into my slot, at each rank's share: my input of that share (of
      // my own share only where it is not read in place).
      for (int q = 0; q < p; ++q) {
        const auto [a, b] = bytes_of(share_of(q, p, n, line));
        for_each_segment(cursor, a, b, [&](const Segment& s) {
          if (q != me || !in_place(s)) stage(s);
        });
      }
      g.barrier();
      // 2. My share, from rank q's slot (my input for q = me), reduced in
      // rank order into my output (or my slot), and into every other slot.
      {
        const auto [a, b] = bytes_of(share_of(me, p, n, line));
        for_each_segment(cursor, a, b, [&](const Segment& s) {
          std::byte* const in_slot = slot + (s.a - lo);
          reduce_share(g, s.a - lo, s.b - s.a, in_place(s) ? s.in : in_slot,
                       s.out != nullptr ? s.out : in_slot, r);
        });
      }
      g.barrier();
      // 3. The other shares out of my slot (mine went to the outputs in
      // step 2). Peers write my slot again only after the next chunk's
      // first barrier, which waits for me.
      for (int q = 0; q < p; ++q) {
        if (q == me) continue;
        const auto [a, b] = bytes_of(share_of(q, p, n, line));
        for_each_segment(cursor, a, b, [&](const Segment& s) {
          if (s.out != nullptr) std::memcpy(s.out, slot + (s.a - lo), s.b - s.a);
        });
      }
    }
  } catch (...) {
    g.fail();
    throw;
  }
}

void shm_allreduce(ShmGroup& g, const void* in, void* out, std::size_t count, DataType dt,
                   ReduceOp op, double prescale, double postscale) {
  const BucketPiece whole{in, out, 0, count * dtype_size(dt)};
  shm_allreduce_pieces(g, std::span(&whole, 1), count, dt, op, prescale, postscale);
}

void shm_reduce_slots(ShmGroup& g, std::size_t count, DataType dt, ReduceOp op) {
  if (count * dtype_size(dt) > g.slot_bytes()) {
    throw InvalidArgument(fmt::format("shm_reduce_slots: {} {} elements exceed a slot of {} bytes",
                                      count, dtype_name(dt), g.slot_bytes()));
  }
  ShareReduction r{dt, reduce_kernel(dt, op), combine_kernel(dt, op),
                   op == ReduceOp::kAverage ? 1.0 / g.size() : 1.0, {}};
  const std::size_t esize = dtype_size(dt);
  try {
    g.barrier();
    // One rank: its slot is the result already (an average's 1/1 aside).
    if (g.size() > 1) {
      const auto [lo, hi] = share_of(g.rank(), g.size(), count, line_elems(esize));
      std::byte* const mine = g.slot(g.rank()) + lo * esize;
      reduce_share(g, lo * esize, (hi - lo) * esize, mine, mine, r);
    }
    g.barrier();
  } catch (...) {
    g.fail();
    throw;
  }
}

namespace {

// What a rank publishes in its pool part's header: where its buffer lies in
// its part (kNotInPool: it does not, or the call is not in place).
struct Mailbox {
  std::uint64_t offset;
  std::uint64_t bytes;
};
static_assert(sizeof(Mailbox) <= kShmPoolHeader);
constexpr std::uint64_t kNotInPool = ~std::uint64_t{0};

}  // namespace

bool shm_allreduce_registered(ShmGroup& g, const ShmPool& pool, const void* in, void* out,
                              std::size_t count, DataType dt, ReduceOp op, double prescale,
                              double postscale) {
  check_scales(dt, prescale, postscale);
  const int p = g.size(), me = g.rank();
  // Alike on every rank: the pool is set up collectively, count is agreed.
  if (pool.empty() || pool.size != p || count == 0) return false;
  if (op == ReduceOp::kAverage) postscale /= p;
  const std::size_t esize = dtype_size(dt), bytes = count * esize;
  std::byte* const mine = pool.part(me);
  auto* const buf = static_cast<std::byte*>(out);
  Mailbox said{kNotInPool, bytes};
  const auto at = reinterpret_cast<std::uintptr_t>(buf);
  const auto from = reinterpret_cast<std::uintptr_t>(mine);
  if (in == out && at >= from + kShmPoolHeader && bytes <= pool.part_bytes &&
      at - from <= pool.part_bytes - bytes && at % kShmPoolAlign == 0) {
    said.offset = at - from;
  }
  try {
    std::memcpy(mine, &said, sizeof said);
    // Every rank has its input in place and its mailbox written. A rank
    // writes its mailbox again only in a later call, after the barriers of
    // this one (or of the fallback's shm_allreduce), which every rank
    // passes only once it has read the mailboxes here.
    g.barrier();
    std::vector<std::byte*> operand(static_cast<std::size_t>(p));
    for (int q = 0; q < p; ++q) {
      Mailbox m{};
      std::memcpy(&m, pool.part(q), sizeof m);
      if (m.offset == kNotInPool || m.bytes != bytes) return false;
      operand[static_cast<std::size_t>(q)] = pool.part(q) + m.offset;
    }
    if (prescale != 1.0) {
      scale(buf, count, dt, prescale);
      g.barrier();  // every input scaled before any rank reads it
    }
    if (p == 1) {
      if (postscale != 1.0) scale(buf, count, dt, postscale);
      return true;
    }
    // My share of every buffer, reduced in rank order a piece at a time
    // (small enough to stay in cache) into my own buffer, or into scratch
    // when my buffer is an operand read after the first two (accumulating
    // there would overwrite it before it is read), then copied into every
    // other buffer. No other rank reads or writes this share of any buffer.
    const CombineFn combine = combine_kernel(dt, op);
    const ReduceFn reduce = reduce_kernel(dt, op);
    const std::size_t line = line_elems(esize);
    const Share sh = share_of(me, p, count, line);
    const std::size_t piece = reduce_piece_elems(esize, line) * esize;
    thread_local std::vector<std::byte> acc;
    if (me >= 2) acc.resize(std::min(piece, (sh.hi - sh.lo) * esize));
    auto at = [&](int q, std::size_t x) { return operand[static_cast<std::size_t>(q)] + x; };
    for (std::size_t x = sh.lo * esize; x < sh.hi * esize; x += piece) {
      const std::size_t bytes = std::min(piece, sh.hi * esize - x), n = bytes / esize;
      std::byte* const target = me < 2 ? at(me, x) : acc.data();
      combine(target, at(0, x), at(1, x), n);
      for (int q = 2; q < p; ++q) reduce(target, at(q, x), n);
      if (postscale != 1.0) scale(target, n, dt, postscale);
      for (int q = 0; q < p; ++q) {
        if (at(q, x) != target) std::memcpy(at(q, x), target, bytes);
      }
    }
    g.barrier();  // every share written into every buffer
    return true;
  } catch (...) {
    g.fail();
    throw;
  }
}

}  // namespace gyre::collectives
