// The allreduce entry points: argument checks, prescale and the one-rank
// case, shared by both algorithms (allreduce_impl.h), and the choice between
// them by size.
#include <cstring>

#include "allreduce_impl.h"
#include "gyre/collectives/algorithms.h"
#include "gyre/collectives/reduce_kernels.h"
#include "validate.h"

namespace gyre::collectives {

namespace {

enum class Algorithm { kBySize, kRing, kRecursiveDoubling, kRabenseifner };

// Every entry point's options as allreduce()'s; `small_bytes` and `large`
// decide only for Algorithm::kBySize, `chunk_bytes` matters to the ring and
// Rabenseifner's algorithm.
void allreduce_with(Algorithm algo, const char* name, Transport& t, const void* in, void* out,
                    std::size_t count, DataType dt, ReduceOp op, const AllreduceOptions& opt) {
  detail::check_world(t, name);
  detail::check_reduction(dt, op, name);
  detail::check_chunk(opt.chunk_bytes, name);
  detail::check_tag(opt.tag, name);
  detail::check_scaling(dt, opt.prescale, opt.postscale, name);
  const std::size_t bytes = detail::checked_bytes(count, dtype_size(dt), name);
  detail::check_buffer(in, bytes, "input buffer", name);
  detail::check_buffer(out, bytes, "output buffer", name);
  detail::check_overlap(in, bytes, out, bytes, "input", "output", name);
  if (count == 0) return;

  const int n = t.size();
  const double postscale = opt.postscale * (op == ReduceOp::kAverage ? 1.0 / n : 1.0);
  const auto* src = static_cast<const std::byte*>(in);
  auto* dst = static_cast<std::byte*>(out);
  if (opt.prescale != 1.0) {
    // Rare: scale a copy in `out` and reduce that in place, so `in` stays
    // unchanged and every contribution is scaled exactly once.
    if (dst != src) std::memcpy(dst, src, bytes);
    scale(dst, count, dt, opt.prescale);
    src = dst;
  }
  if (n == 1) {
    if (dst != src) std::memcpy(dst, src, bytes);
    scale(dst, count, dt, postscale);
    return;
  }
  if (algo == Algorithm::kRecursiveDoubling ||
      (algo == Algorithm::kBySize && bytes <= opt.small_bytes)) {
    detail::run_recursive_doubling(t, src, dst, count, dt, op, postscale, opt.tag);
  } else if (algo == Algorithm::kRabenseifner ||
             (algo == Algorithm::kBySize && opt.large == LargeAllreduce::kRabenseifner)) {
    detail::run_rabenseifner(t, src, dst, count, dt, op, postscale, opt.chunk_bytes, opt.tag);
  } else {
    detail::run_ring_allreduce(t, src, dst, count, dt, op, postscale, opt.chunk_bytes, opt.tag);
  }
}

}  // namespace

const char* large_allreduce_name(LargeAllreduce a) {
  switch (a) {
    case LargeAllreduce::kRing: return "ring";
    case LargeAllreduce::kRabenseifner: return "rabenseifner";
  }
  return "?";
}

void allreduce(Transport& t, const void* in, void* out, std::size_t count, DataType dt,
               ReduceOp op, const AllreduceOptions& opt) {
  allreduce_with(Algorithm::kBySize, "allreduce", t, in, out, count, dt, op, opt);
}

void ring_allreduce(Transport& t, const void* in, void* out, std::size_t count, DataType dt,
                    ReduceOp op, const RingAllreduceOptions& opt) {
  AllreduceOptions o;
  o.chunk_bytes = opt.chunk_bytes;
  o.tag = opt.tag;
  o.prescale = opt.prescale;
  o.postscale = opt.postscale;
  allreduce_with(Algorithm::kRing, "ring_allreduce", t, in, out, count, dt, op, o);
}

void recursive_doubling_allreduce(Transport& t, const void* in, void* out, std::size_t count,
                                  DataType dt, ReduceOp op, const RecursiveDoublingOptions& opt) {
  AllreduceOptions o;
  o.tag = opt.tag;
  o.prescale = opt.prescale;
  o.postscale = opt.postscale;
  allreduce_with(Algorithm::kRecursiveDoubling, "recursive_doubling_allreduce", t, in, out, count,
                 dt, op, o);
}

void rabenseifner_allreduce(Transport& t, const void* in, void* out, std::size_t count,
                            DataType dt, ReduceOp op, const RabenseifnerOptions& opt) {
  AllreduceOptions o;
  o.chunk_bytes = opt.chunk_bytes;
  o.tag = opt.tag;
  o.prescale = opt.prescale;
  o.postscale = opt.postscale;
  allreduce_with(Algorithm::kRabenseifner, "rabenseifner_allreduce", t, in, out, count, dt, op, o);
}

}  // namespace gyre::collectives
