// shm_allreduce: every rank reduces its share of each chunk straight from
// every rank's slot and writes the result into all of them.
#include <algorithm>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "gyre/collectives/reduce_kernels.h"
#include "gyre/collectives/shm.h"
#include "gyre/error.h"

namespace gyre::collectives {

void shm_allreduce(ShmGroup& g, const void* in, void* out, std::size_t count, DataType dt,
                   ReduceOp op, double prescale, double postscale) {
  // Every check before the first barrier: arguments are agreed across ranks,
  // so every rank throws alike and none is left waiting.
  const std::size_t esize = dtype_size(dt);
  if (!scaling_defined(dt) && (prescale != 1.0 || postscale != 1.0)) {
    throw InvalidArgument(fmt::format("shm allreduce: scale factors {} and {} on {} tensors",
                                      prescale, postscale, dtype_name(dt)));
  }
  if (op == ReduceOp::kAverage) postscale /= g.size();
  const ReduceFn reduce = reduce_kernel(dt, op);
  const CombineFn combine = combine_kernel(dt, op);
  const int p = g.size();
  const int me = g.rank();
  // Each share starts on a 64-byte boundary of the chunk, so no two ranks
  // write the same cache line of a slot.
  const std::size_t line_elems = std::max<std::size_t>(64 / esize, 1);
  const std::size_t chunk_elems = g.slot_bytes() / esize / line_elems * line_elems;
  if (chunk_elems == 0) {
    throw InvalidArgument(fmt::format("shm allreduce: slot of {} bytes holds no {} element",
                                      g.slot_bytes(), dtype_name(dt)));
  }
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
      // 2. My share, rank 0's operand first, then into every slot.
      const std::size_t per = (n + p - 1) / p;
      const std::size_t per_aligned = (per + line_elems - 1) / line_elems * line_elems;
      const std::size_t lo = std::min(n, static_cast<std::size_t>(me) * per_aligned);
      const std::size_t hi = std::min(n, lo + per_aligned);
      if (hi > lo) {
        const std::size_t bytes = (hi - lo) * esize;
        const std::size_t at = lo * esize;
        std::byte* mine;
        if (p == 1) {
          mine = g.slot(0) + at;
        } else {
          acc.resize(bytes);
          mine = acc.data();
          combine(mine, g.slot(0) + at, g.slot(1) + at, hi - lo);
          for (int q = 2; q < p; ++q) reduce(mine, g.slot(q) + at, hi - lo);
        }
        if (postscale != 1.0) scale(mine, hi - lo, dt, postscale);
        for (int q = 0; q < p; ++q) {
          if (g.slot(q) + at != mine) std::memcpy(g.slot(q) + at, mine, bytes);
        }
      }
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

}  // namespace gyre::collectives
