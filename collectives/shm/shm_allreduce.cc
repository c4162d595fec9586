// shm_allreduce: every rank reduces its share of each chunk straight from
// every rank's slot and writes it into all of them; shm_reduce_slots is that
// middle step alone (the single-copy bound of the benchmarks), and
// shm_allreduce_buffers the same step on the ranks' buffers (the runtime's
// fusion buffers).
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

// Where each rank's operand lies: its slot, or its buffer.
using Area = std::byte* (ShmGroup::*)(int) const;

// Rank g.rank()'s share of the first n elements of every rank's `area`,
// reduced in rank order (rank 0's operand first) and written into every
// rank's area. `acc` is scratch. Between two barriers: each rank touches
// only its own share.
void reduce_my_share(ShmGroup& g, Area area, std::size_t n, DataType dt, ReduceFn reduce,
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
    auto operand = [&](int q) { return (g.*area)(q) + at; };
    std::byte* mine;
    if (p == 1) {
      mine = operand(0);
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

}  // namespace

void shm_allreduce(ShmGroup& g, const void* in, void* out, std::size_t count, DataType dt,
                   ReduceOp op, double prescale, double postscale) {
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
  const int me = g.rank();
  const auto* src = static_cast<const std::byte*>(in);
  auto* dst = static_cast<std::byte*>(out);
  std::vector<std::byte> acc;
  try {
    for (std::size_t done = 0; done < count; done += chunk_elems) {
      const std::size_t n = std::min(chunk_elems, count - done);
      const std::size_t off = done * esize;
      // 1. My chunk into my slot.
      std::memcpy(g.slot(me), src + off, n * esize);
      if (prescale != 1.0) scale(g.slot(me), n, dt, prescale);
      g.barrier();
      // 2. My share of the chunk, from every slot into every slot.
      reduce_my_share(g, &ShmGroup::slot, n, dt, reduce, combine, postscale, acc);
      g.barrier();
      // 3. The reduced chunk out of my slot. Peers write my slot again only
      // after the next chunk's first barrier, which waits for me.
      std::memcpy(dst + off, g.slot(me), n * esize);
    }
  } catch (...) {
    g.fail();
    throw;
  }
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
    reduce_my_share(g, &ShmGroup::slot, count, dt, reduce, combine, postscale, acc);
    g.barrier();
  } catch (...) {
    g.fail();
    throw;
  }
}

void shm_allreduce_buffers(ShmGroup& g, std::size_t count, DataType dt, ReduceOp op,
                           double prescale, double postscale) {
  // Checked alike on every rank (agreed arguments) before the first barrier.
  check_scales(dt, prescale, postscale);
  if (count * dtype_size(dt) > g.buffer_bytes()) {
    throw InvalidArgument(fmt::format(
        "shm allreduce of buffers: {} {} elements exceed a buffer of {} bytes", count,
        dtype_name(dt), g.buffer_bytes()));
  }
  if (op == ReduceOp::kAverage) postscale /= g.size();
  const ReduceFn reduce = reduce_kernel(dt, op);
  const CombineFn combine = combine_kernel(dt, op);
  std::vector<std::byte> acc;
  try {
    if (prescale != 1.0) scale(g.buffer(g.rank()), count, dt, prescale);
    // Every rank's data are in its buffer...
    g.barrier();
    reduce_my_share(g, &ShmGroup::buffer, count, dt, reduce, combine, postscale, acc);
    // ... and every share has been written into every buffer: from here on
    // no peer reads or writes this rank's buffer until the next call's
    // first barrier, which waits for this rank.
    g.barrier();
  } catch (...) {
    g.fail();
    throw;
  }
}

}  // namespace gyre::collectives
