// shm_allreduce_pieces (and shm_allreduce, its one-piece case): every rank
// gathers its part of each chunk into its slot, reduces its share of the
// chunk straight from every rank's slot and writes it into all of them, then
// scatters the chunk out; shm_reduce_slots is that middle step alone (the
// single-copy bound of the benchmarks).
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

// Rank g.rank()'s share of the first n elements of every rank's slot,
// reduced in rank order (rank 0's operand first) and written into every
// rank's slot. `acc` is scratch. Between two barriers: each rank touches
// only its own share.
void reduce_my_share(ShmGroup& g, std::size_t n, DataType dt, ReduceFn reduce,
                     CombineFn combine, double postscale, std::vector<std::byte>& acc) {
  const int p = g.size();
  const std::size_t esize = dtype_size(dt);
  const std::size_t line = line_elems(esize);
  const std::size_t per = (n + p - 1) / p;
  const std::size_t per_aligned = (per + line - 1) / line * line;
  const std::size_t lo = std::min(n, static_cast<std::size_t>(g.rank()) * per_aligned);
  const std::size_t hi = std::min(n, lo + per_aligned);
  if (hi <= lo) return;
  // In pieces that keep the accumulator in cache: a share of a large slot
  // (the bound's) would otherwise go through memory three more times.
  constexpr std::size_t kPieceBytes = 128u << 10;
  const std::size_t piece = std::max<std::size_t>(kPieceBytes / esize / line * line, line);
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
  std::byte* const slot = g.slot(g.rank());
  PieceCursor cursor{pieces};
  std::vector<std::byte> acc;
  try {
    for (std::size_t done = 0; done < count; done += chunk_elems) {
      const std::size_t n = std::min(chunk_elems, count - done);
      const std::size_t lo = done * esize, hi = lo + n * esize;
      cursor.advance_to(lo);
      // 1. My part of the chunk into my slot.
      gather_chunk(cursor, lo, hi, slot);
      if (prescale != 1.0) scale(slot, n, dt, prescale);
      g.barrier();
      // 2. My share of the chunk, from every slot into every slot.
      reduce_my_share(g, n, dt, reduce, combine, postscale, acc);
      g.barrier();
      // 3. The reduced chunk out of my slot. Peers write my slot again only
      // after the next chunk's first barrier, which waits for me.
      scatter_chunk(cursor, lo, hi, slot);
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
