// Adasum allreduce (algorithms.h): recursive vector halving with the
// pairwise Adasum rule per tensor, then the all-gather that undoes the
// halving.
//
// Level l (distance d = 2^l): rank r and its partner r ^ d hold the same
// region [lo, hi) of their partial results (the results of their two
// subtrees). The lower rank keeps [lo, mid), the higher [mid, hi); each
// sends the other half and receives the partner's copy of the half it keeps.
// The pieces of the two subtrees' results are now spread over the block of
// 2d ranks r & ~(2d - 1) ..., each holding one piece of both, so the dot
// products a.b, a.a, b.b of each tensor are the sums of the block's partial
// products: a recursive-doubling sum of 3 doubles per tensor within the
// block (addition is commutative bit for bit, so every rank of the block
// gets the same sums and the same coefficients). Each rank then combines
// its piece. After log2(n) levels a rank holds 1/n of the result; the
// all-gather walks the levels back, each pair swapping its halves.
#include <algorithm>
#include <bit>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "gyre/collectives/algorithms.h"
#include "gyre/collectives/reduce_kernels.h"
#include "gyre/error.h"
#include "kernel_ops.h"
#include "ring_pipeline.h"
#include "validate.h"

namespace gyre::collectives {

namespace {

constexpr const char* kName = "adasum_allreduce";

struct Region {
  std::size_t lo = 0, hi = 0;
  std::size_t size() const { return hi - lo; }
};

// The half of `r` a rank keeps at a level: the first for the lower rank.
Region kept_half(Region r, bool lower) {
  const std::size_t mid = r.lo + r.size() / 2;
  return lower ? Region{r.lo, mid} : Region{mid, r.hi};
}

void exchange(Transport& t, int peer, int tag, const std::byte* send, std::size_t send_bytes,
              std::byte* recv, std::size_t recv_bytes) {
  transport::Transfer rr, sr;
  if (recv_bytes > 0) rr = t.irecv(peer, tag, {recv, recv_bytes});
  if (send_bytes > 0) sr = t.isend(peer, tag, {send, send_bytes});
  t.wait(rr);
  t.wait(sr);
}

// Sums `v` over the block of `block` ranks (a power of two) holding this
// rank, by recursive doubling.
void block_sum(Transport& t, int block, int tag, std::vector<double>& v,
               std::vector<double>& theirs) {
  theirs.resize(v.size());
  const std::size_t bytes = v.size() * sizeof(double);
  for (int mask = 1; mask < block; mask <<= 1) {
    exchange(t, t.rank() ^ mask, tag, reinterpret_cast<const std::byte*>(v.data()), bytes,
             reinterpret_cast<std::byte*>(theirs.data()), bytes);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] += theirs[i];
  }
}

void check_tensors(std::span<const TensorExtent> tensors, std::size_t count) {
  std::size_t end = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorExtent& e = tensors[i];
    if (e.offset < end || e.count > count || e.offset > count - e.count) {
      throw InvalidArgument(fmt::format(
          "{}: tensor {} at [{}, {}) overlaps the previous one, is out of order or ends past the "
          "buffer of {} elements", kName, i, e.offset, e.offset + e.count, count));
    }
    end = e.offset + e.count;
  }
}

// The levels of one call, for one element type E (Codec<E>: storage and
// conversion to double).
template <class E>
class Adasum {
  using C = kernels::Codec<E>;
  using S = typename C::Storage;

 public:
  Adasum(Transport& t, S* buf, std::size_t count, std::span<const TensorExtent> tensors, int tag)
      : t_(t), buf_(buf), tensors_(tensors), tag_(tag) {
    whole_ = {0, count};
    if (tensors_.empty()) tensors_ = std::span<const TensorExtent>(&whole_, 1);
    levels_ = std::countr_zero(static_cast<unsigned>(t.size()));
  }

  void run() {
    std::vector<Region> regions;  // the region each level starts from
    Region mine{0, whole_.count};
    for (int l = 0; l < levels_; ++l) {
      regions.push_back(mine);
      mine = reduce_level(l, mine);
    }
    for (int l = levels_ - 1; l >= 0; --l) gather_level(l, regions[static_cast<std::size_t>(l)]);
  }

 private:
  Region reduce_level(int l, Region region) {
    const int d = 1 << l;
    const int partner = t_.rank() ^ d;
    const bool lower = (t_.rank() & d) == 0;
    const Region keep = kept_half(region, lower);
    const Region give = kept_half(region, !lower);
    S* const theirs = reinterpret_cast<S*>(thread_scratch(keep.size() * sizeof(S)));
    exchange(t_, partner, tag_, reinterpret_cast<const std::byte*>(buf_ + give.lo),
             give.size() * sizeof(S), reinterpret_cast<std::byte*>(theirs),
             keep.size() * sizeof(S));
    S* const own = buf_ + keep.lo;
    // a is the lower rank's partial result, b the higher's.
    const S* const a = lower ? own : theirs;
    const S* const b = lower ? theirs : own;

    dots_.assign(3 * tensors_.size(), 0.0);
    for_each_piece(keep, [&](std::size_t t, std::size_t from, std::size_t to) {
      double ab = 0, aa = 0, bb = 0;
      for (std::size_t i = from; i < to; ++i) {
        const double x = C::load(a[i]), y = C::load(b[i]);
        ab += x * y;
        aa += x * x;
        bb += y * y;
      }
      dots_[3 * t] += ab;
      dots_[3 * t + 1] += aa;
      dots_[3 * t + 2] += bb;
    });
    block_sum(t_, 2 * d, tag_ + 1, dots_, scratch_);
    for_each_piece(keep, [&](std::size_t t, std::size_t from, std::size_t to) {
      const double ab = dots_[3 * t], aa = dots_[3 * t + 1], bb = dots_[3 * t + 2];
      const double ca = aa == 0 ? 1.0 : 1.0 - ab / (2.0 * aa);
      const double cb = bb == 0 ? 1.0 : 1.0 - ab / (2.0 * bb);
      for (std::size_t i = from; i < to; ++i) {
        own[i] = C::store(static_cast<typename C::Compute>(ca * C::load(a[i]) +
                                                          cb * C::load(b[i])));
      }
    });
    return keep;
  }

  void gather_level(int l, Region region) {
    const int d = 1 << l;
    const bool lower = (t_.rank() & d) == 0;
    const Region mine = kept_half(region, lower);
    const Region other = kept_half(region, !lower);
    exchange(t_, t_.rank() ^ d, tag_, reinterpret_cast<const std::byte*>(buf_ + mine.lo),
             mine.size() * sizeof(S), reinterpret_cast<std::byte*>(buf_ + other.lo),
             other.size() * sizeof(S));
  }

  // Calls fn(tensor, from, to) for each tensor's part of `r`, with from/to
  // relative to r.lo.
  template <class F>
  void for_each_piece(Region r, F&& fn) const {
    for (std::size_t t = 0; t < tensors_.size(); ++t) {
      const std::size_t lo = std::max(r.lo, tensors_[t].offset);
      const std::size_t hi = std::min(r.hi, tensors_[t].offset + tensors_[t].count);
      if (lo < hi) fn(t, lo - r.lo, hi - r.lo);
    }
  }

  Transport& t_;
  S* buf_;
  std::span<const TensorExtent> tensors_;
  TensorExtent whole_;
  int tag_;
  int levels_ = 0;
  std::vector<double> dots_, scratch_;
};

template <class E>
void run_adasum(Transport& t, void* buf, std::size_t count, std::span<const TensorExtent> tensors,
                int tag) {
  Adasum<E>(t, static_cast<typename kernels::Codec<E>::Storage*>(buf), count, tensors, tag).run();
}

}  // namespace

void adasum_allreduce(Transport& t, const void* in, void* out, std::size_t count, DataType dt,
                      std::span<const TensorExtent> tensors, const AdasumOptions& opt) {
  detail::check_world(t, kName);
  detail::check_dtype(dt, kName);
  if (!is_floating(dt)) {
    throw InvalidArgument(fmt::format("{}: Adasum is defined for floating types, not {}", kName,
                                      dtype_name(dt)));
  }
  if (!std::has_single_bit(static_cast<unsigned>(t.size()))) {
    throw InvalidArgument(fmt::format(
        "{}: Adasum needs a power-of-two number of ranks, this job has {}", kName, t.size()));
  }
  detail::check_tag(opt.tag, kName);
  detail::check_scaling(dt, opt.prescale, opt.postscale, kName);
  const std::size_t bytes = detail::checked_bytes(count, dtype_size(dt), kName);
  detail::check_buffer(in, bytes, "input buffer", kName);
  detail::check_buffer(out, bytes, "output buffer", kName);
  detail::check_overlap(in, bytes, out, bytes, "input", "output", kName);
  check_tensors(tensors, count);
  if (count == 0) return;

  if (in != out) std::memcpy(out, in, bytes);
  scale(out, count, dt, opt.prescale);
  if (t.size() > 1) {
    switch (dt) {
      case DataType::kFloat32: run_adasum<float>(t, out, count, tensors, opt.tag); break;
      case DataType::kFloat64: run_adasum<double>(t, out, count, tensors, opt.tag); break;
      case DataType::kFloat16: run_adasum<kernels::Half>(t, out, count, tensors, opt.tag); break;
      case DataType::kBFloat16:
        run_adasum<kernels::BFloat>(t, out, count, tensors, opt.tag);
        break;
      default: break;  // refused above
    }
  }
  scale(out, count, dt, opt.postscale);
}

}  // namespace gyre::collectives
