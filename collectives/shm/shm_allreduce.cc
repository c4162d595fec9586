// shm_allreduce_pieces (and shm_allreduce, its one-piece case): every rank
// copies its input of each other rank's share of a chunk into its slot (its
// own share too unless it reads it from its contiguous input in place),
// reduces its share into its output (or its slot) and into every other
// slot, and copies the other shares out of its slot; shm_reduce_slots
// reduces data already in the slots (the single-copy bound of the
// benchmarks).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "gyre/collectives/reduce_kernels.h"
#include "gyre/collectives/shm.h"
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

// Rank g.rank()'s share of the first n elements of every rank's slot,
// reduced in rank order (rank 0's operand first) and written into every
// rank's slot. `acc` is scratch. Between two barriers: each rank touches
// only its own share.
void reduce_my_share(ShmGroup& g, std::size_t n, DataType dt, ReduceFn reduce,
                     CombineFn combine, double postscale, std::vector<std::byte>& acc) {
  const int p = g.size();
  const std::size_t esize = dtype_size(dt);
  const std::size_t line = line_elems(esize);
  const auto [lo, hi] = share_of(g.rank(), p, n, line);
  const std::size_t piece = reduce_piece_elems(esize, line);
  for (std::size_t a = lo; a < hi; a += piece) {
    const std::size_t m = std::min(piece, hi - a);
    const std::size_t bytes = m * esize;
    const std::size_t at = a * esize;
    auto operand = [&](int q) { return g.slot(q) + at; };
    std::byte* mine;
    if (p == 1) {
      mine = operand(0);
    } else if (g.rank() < 2) {
      // Accumulate in this rank's own slot: it is one of the first two
      // operands, read before it is written, and not read again, so the
      // order stays the rank order and one copy of the share is saved.
      mine = operand(g.rank());
      combine(mine, operand(0), operand(1), m);
      for (int q = 2; q < p; ++q) reduce(mine, operand(q), m);
    } else {
      acc.resize(bytes);
      mine = acc.data();
      combine(mine, operand(0), operand(1), m);
      for (int q = 2; q < p; ++q) reduce(mine, operand(q), m);
    }
    if (postscale != 1.0) scale(mine, m, dt, postscale);
    for (int q = 0; q < p; ++q) {
      if (operand(q) != mine) std::memcpy(operand(q), mine, bytes);
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

// Bytes [lo, hi) of the bucket into `slot`: each piece's input (zeros for
// a piece without one), zeros between pieces and after the last.
void gather_chunk(PieceCursor& c, std::size_t lo, std::size_t hi, std::byte* slot) {
  std::size_t at = lo;
  for (std::size_t i = c.first; i < c.pieces.size() && c.pieces[i].offset < hi; ++i) {
    const BucketPiece& pc = c.pieces[i];
    const std::size_t a = std::max(lo, pc.offset), b = std::min(hi, pc.offset + pc.bytes);
    if (a > at) std::memset(slot + (at - lo), 0, a - at);
    if (pc.in != nullptr) {
      std::memcpy(slot + (a - lo), static_cast<const std::byte*>(pc.in) + (a - pc.offset), b - a);
    } else {
      std::memset(slot + (a - lo), 0, b - a);
    }
    at = b;
  }
  if (hi > at) std::memset(slot + (at - lo), 0, hi - at);
}

// Bytes [lo, hi) of the reduced bucket from `slot` into each piece's output.
void scatter_chunk(const PieceCursor& c, std::size_t lo, std::size_t hi, const std::byte* slot) {
  for (std::size_t i = c.first; i < c.pieces.size() && c.pieces[i].offset < hi; ++i) {
    const BucketPiece& pc = c.pieces[i];
    if (pc.out == nullptr) continue;
    const std::size_t a = std::max(lo, pc.offset), b = std::min(hi, pc.offset + pc.bytes);
    std::memcpy(static_cast<std::byte*>(pc.out) + (a - pc.offset), slot + (a - lo), b - a);
  }
}

}  // namespace

void shm_allreduce_pieces(ShmGroup& g, std::span<const BucketPiece> pieces, std::size_t count,
                          DataType dt, ReduceOp op, double prescale, double postscale) {
  check_scales(dt, prescale, postscale);
  if (op == ReduceOp::kAverage) postscale /= g.size();
  const ReduceFn reduce = reduce_kernel(dt, op);
  const CombineFn combine = combine_kernel(dt, op);
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
  }
  const int p = g.size(), me = g.rank();
  std::byte* const slot = g.slot(me);
  // This rank's own operand straight from the caller's input, without a
  // copy into the slot: one contiguous input, not scaled.
  const bool direct = pieces.size() == 1 && pieces[0].in != nullptr && pieces[0].offset == 0 &&
                      pieces[0].bytes == count * esize && prescale == 1.0;
  const auto* const in = direct ? static_cast<const std::byte*>(pieces[0].in) : nullptr;
  // And, with a contiguous output, its share reduced straight into it, so
  // that only the other shares are copied out of the slot.
  auto* const out = direct ? static_cast<std::byte*>(pieces[0].out) : nullptr;
  PieceCursor cursor{pieces};
  std::vector<std::byte> acc;
  // Bytes [lo, hi) of the bucket into `at` (a slot), with a cursor of its
  // own: a sub-range starts past pieces the chunk's cursor still holds.
  auto gather = [&](std::size_t lo, std::size_t hi, std::byte* at) {
    PieceCursor c = cursor;
    c.advance_to(lo);
    gather_chunk(c, lo, hi, at);
  };
  try {
    for (std::size_t done = 0; done < count; done += chunk_elems) {
      const std::size_t n = std::min(chunk_elems, count - done);
      const std::size_t lo = done * esize, hi = lo + n * esize;
      if (p == 1) {
        cursor.advance_to(lo);
        gather_chunk(cursor, lo, hi, slot);
        if (prescale != 1.0) scale(slot, n, dt, prescale);
        if (postscale != 1.0) scale(slot, n, dt, postscale);
        scatter_chunk(cursor, lo, hi, slot);
        continue;
      }
      cursor.advance_to(lo);
      // 1. Into my slot, at each rank's share: my input of that share (of
      // my own share only when it is not read from the input directly).
      for (int q = 0; q < p; ++q) {
        if (q == me && direct) continue;
        const Share s = share_of(q, p, n, line);
        if (s.hi <= s.lo) continue;
        gather(lo + s.lo * esize, lo + s.hi * esize, slot + s.lo * esize);
        if (prescale != 1.0) scale(slot + s.lo * esize, s.hi - s.lo, dt, prescale);
      }
      g.barrier();
      // 2. My share, from rank q's slot (my input for q = me), reduced in
      // rank order into my slot at my share.
      const Share s = share_of(me, p, n, line);
      const std::size_t piece = reduce_piece_elems(esize, line);
      for (std::size_t a = s.lo; a < s.hi; a += piece) {
        const std::size_t m = std::min(piece, s.hi - a);
        const std::size_t at = a * esize;
        auto operand = [&](int q) -> const std::byte* {
          return q == me && direct ? in + lo + at : g.slot(q) + at;
        };
        std::byte* const mine = out != nullptr ? out + lo + at : slot + at;
        // Where my operand is where the result goes (in my slot, or in
        // place), accumulating there would overwrite it before it is read,
        // unless it is one of the first two operands (read as they are
        // written): a scratch buffer then.
        std::byte* target = mine;
        if (me >= 2 && (!direct || out == in)) {
          acc.resize(m * esize);
          target = acc.data();
        }
        combine(target, operand(0), operand(1), m);
        for (int q = 2; q < p; ++q) reduce(target, operand(q), m);
        if (postscale != 1.0) scale(target, m, dt, postscale);
        // Into every slot: pushing the share while it is in cache costs
        // less than each rank reading it out of the owner's slot after the
        // barrier (measured: 64 KiB 15 against 10 us, 16 MiB 1.15x).
        if (target != mine) std::memcpy(mine, target, m * esize);
        for (int q = 0; q < p; ++q) {
          if (q != me) std::memcpy(g.slot(q) + at, target, m * esize);
        }
      }
      g.barrier();
      // 3. The reduced chunk out of my slot (less my share where it went
      // straight to the output). Peers write my slot again only after the
      // next chunk's first barrier, which waits for me.
      if (out == nullptr) {
        scatter_chunk(cursor, lo, hi, slot);
      } else {
        for (int q = 0; q < p; ++q) {
          const Share sq = share_of(q, p, n, line);
          if (q == me || sq.hi <= sq.lo) continue;
          std::memcpy(out + lo + sq.lo * esize, slot + sq.lo * esize, (sq.hi - sq.lo) * esize);
        }
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
  double postscale = op == ReduceOp::kAverage ? 1.0 / g.size() : 1.0;
  const ReduceFn reduce = reduce_kernel(dt, op);
  const CombineFn combine = combine_kernel(dt, op);
  std::vector<std::byte> acc;
  try {
    g.barrier();
    reduce_my_share(g, count, dt, reduce, combine, postscale, acc);
    g.barrier();
  } catch (...) {
    g.fail();
    throw;
  }
}

}  // namespace gyre::collectives
