// The shared-memory allgather, broadcast, reduce-scatter and all-to-all:
// each round, every rank stages a chunk in its own slot, a barrier, every
// rank takes what it needs from the slots, a barrier.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include "gyre/collectives/reduce_kernels.h"
#include "gyre/collectives/shm.h"
#include "gyre/error.h"

namespace gyre::collectives {

namespace {

// Runs body() and marks the group failed if it throws, so peers waiting in
// a barrier for this rank stop at once.
template <class Body>
void guarded(ShmGroup& g, Body body) {
  try {
    body();
  } catch (...) {
    g.fail();
    throw;
  }
}

void check_sizes(const ShmGroup& g, std::size_t n, const char* what) {
  if (n != static_cast<std::size_t>(g.size())) {
    throw InvalidArgument(fmt::format("shm {}: {} sizes for {} ranks", what, n, g.size()));
  }
}

std::vector<std::size_t> offsets_of(std::span<const std::size_t> sizes) {
  std::vector<std::size_t> off(sizes.size() + 1, 0);
  std::partial_sum(sizes.begin(), sizes.end(), off.begin() + 1);
  return off;
}

}  // namespace

void shm_allgather(ShmGroup& g, const void* in, void* out,
                   std::span<const std::size_t> block_bytes) {
  check_sizes(g, block_bytes.size(), "allgather");
  const int p = g.size(), me = g.rank();
  const auto off = offsets_of(block_bytes);
  const std::size_t largest = *std::max_element(block_bytes.begin(), block_bytes.end());
  const std::size_t s = g.slot_bytes();
  const auto* src = static_cast<const std::byte*>(in);
  auto* dst = static_cast<std::byte*>(out);
  guarded(g, [&] {
    for (std::size_t at = 0; at < largest; at += s) {
      const std::size_t mine = std::min(s, block_bytes[me] - std::min(at, block_bytes[me]));
      if (mine) std::memcpy(g.slot(me), src + at, mine);
      g.barrier();
      for (int q = 0; q < p; ++q) {
        const std::size_t n = std::min(s, block_bytes[q] - std::min(at, block_bytes[q]));
        if (n && !(q == me && dst + off[q] + at == src + at)) {
          std::memcpy(dst + off[q] + at, g.slot(q), n);
        }
      }
      g.barrier();
    }
  });
}

void shm_broadcast(ShmGroup& g, void* buf, std::size_t bytes, int root) {
  if (root < 0 || root >= g.size()) {
    throw InvalidArgument(fmt::format("shm broadcast: root {} of {} ranks", root, g.size()));
  }
  auto* b = static_cast<std::byte*>(buf);
  const std::size_t s = g.slot_bytes();
  guarded(g, [&] {
    for (std::size_t at = 0; at < bytes; at += s) {
      const std::size_t n = std::min(s, bytes - at);
      if (g.rank() == root) std::memcpy(g.slot(root), b + at, n);
      g.barrier();
      if (g.rank() != root) std::memcpy(b + at, g.slot(root), n);
      g.barrier();
    }
  });
}

void shm_reduce_scatter(ShmGroup& g, const void* in, void* out,
                        std::span<const std::size_t> counts, DataType dt, ReduceOp op,
                        double prescale, double postscale) {
  check_sizes(g, counts.size(), "reduce-scatter");
  if (!scaling_defined(dt) && (prescale != 1.0 || postscale != 1.0)) {
    throw InvalidArgument(fmt::format("shm reduce-scatter: scale factors {} and {} on {} tensors",
                                      prescale, postscale, dtype_name(dt)));
  }
  if (op == ReduceOp::kAverage) postscale /= g.size();
  const ReduceFn reduce = reduce_kernel(dt, op);
  const CombineFn combine = combine_kernel(dt, op);
  const int p = g.size(), me = g.rank();
  const std::size_t esize = dtype_size(dt);
  const auto off = offsets_of(counts);  // in elements
  const std::size_t total = off.back();
  const std::size_t chunk = std::max<std::size_t>(g.slot_bytes() / esize, 1);
  const auto* src = static_cast<const std::byte*>(in);
  auto* dst = static_cast<std::byte*>(out);
  guarded(g, [&] {
    for (std::size_t done = 0; done < total; done += chunk) {
      const std::size_t n = std::min(chunk, total - done);
      std::memcpy(g.slot(me), src + done * esize, n * esize);
      if (prescale != 1.0) scale(g.slot(me), n, dt, prescale);
      g.barrier();
      // My block's part of this chunk, reduced in rank order into `out`.
      const std::size_t lo = std::max(done, off[me]), hi = std::min(done + n, off[me + 1]);
      if (hi > lo) {
        const std::size_t at = (lo - done) * esize;
        std::byte* o = dst + (lo - off[me]) * esize;
        if (p == 1) {
          std::memcpy(o, g.slot(0) + at, (hi - lo) * esize);
        } else {
          combine(o, g.slot(0) + at, g.slot(1) + at, hi - lo);
          for (int q = 2; q < p; ++q) reduce(o, g.slot(q) + at, hi - lo);
        }
        if (postscale != 1.0) scale(o, hi - lo, dt, postscale);
      }
      g.barrier();
    }
  });
}

void shm_alltoall(ShmGroup& g, const void* in, std::span<const std::size_t> send_bytes,
                  void* out, std::span<const std::size_t> recv_bytes,
                  std::size_t max_pair_bytes) {
  check_sizes(g, send_bytes.size(), "alltoall");
  check_sizes(g, recv_bytes.size(), "alltoall");
  const int p = g.size(), me = g.rank();
  // Each slot holds one sub-slot per destination, on cache-line boundaries.
  const std::size_t sub = g.slot_bytes() / static_cast<std::size_t>(p) / 64 * 64;
  if (sub == 0) {
    throw InvalidArgument(fmt::format("shm alltoall: slots of {} bytes are too small for {} ranks",
                                      g.slot_bytes(), p));
  }
  for (int q = 0; q < p; ++q) {
    if (send_bytes[q] > max_pair_bytes || recv_bytes[q] > max_pair_bytes) {
      throw InvalidArgument(fmt::format(
          "shm alltoall: rank {} exchanges {} and {} bytes with rank {}, above max_pair_bytes {}",
          me, send_bytes[q], recv_bytes[q], q, max_pair_bytes));
    }
  }
  const auto send_off = offsets_of(send_bytes);
  const auto recv_off = offsets_of(recv_bytes);
  const auto* src = static_cast<const std::byte*>(in);
  auto* dst = static_cast<std::byte*>(out);
  auto piece = [&](std::size_t bytes, std::size_t at) { return std::min(sub, bytes - std::min(at, bytes)); };
  guarded(g, [&] {
    for (std::size_t at = 0; at < max_pair_bytes; at += sub) {
      for (int q = 0; q < p; ++q) {
        if (auto n = piece(send_bytes[q], at)) {
          std::memcpy(g.slot(me) + q * sub, src + send_off[q] + at, n);
        }
      }
      g.barrier();
      for (int q = 0; q < p; ++q) {
        if (auto n = piece(recv_bytes[q], at)) {
          std::memcpy(dst + recv_off[q] + at, g.slot(q) + me * sub, n);
        }
      }
      g.barrier();
    }
  });
}

}  // namespace gyre::collectives
