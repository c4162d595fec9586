// Ring allgather of per-rank byte blocks of any sizes: n-1 steps in which
// rank r passes block r-k on to r+1 and receives block r-k-1 straight into
// its place in `out`, every block pipelined in chunks.
#include <algorithm>
#include <cstring>
#include <fmt/format.h>

#include "gyre/error.h"

#include "gyre/collectives/algorithms.h"
#include "ring_pipeline.h"
#include "validate.h"

namespace gyre::collectives {

namespace {

class RingAllgather {
 public:
  RingAllgather(Transport& t, const std::byte* in, std::byte* out, const SegmentPlan& plan, int tag)
      : pipe_(t, plan, t.size() - 1, t.rank(), tag), in_(in), out_(out) {}

  // Step 0 sends this rank's block from `in`; every unit is received
  // straight into its place in `out` and forwarded from there at the next
  // step.
  void run() {
    auto recv_buffer = [&](int k, std::size_t j) {
      return out_ + pipe_.chunk_byte_offset(pipe_.recv_segment(k), j);
    };
    auto forward = [&](int k, std::size_t j) {
      if (k + 1 < pipe_.steps()) {
        pipe_.post_send(k + 1, j, out_ + pipe_.chunk_byte_offset(pipe_.send_segment(k + 1), j));
      }
    };
    pipe_.run_in_order(in_, recv_buffer, forward);
  }

 private:
  RingPipeline pipe_;
  const std::byte* in_;
  std::byte* out_;
};

}  // namespace

void ring_allgather(Transport& t, const void* in, void* out,
                    std::span<const std::size_t> block_bytes, const AllgatherOptions& opt) {
  constexpr const char* kAlgo = "ring_allgather";
  detail::check_world(t, kAlgo);
  detail::check_chunk(opt.chunk_bytes, kAlgo);
  detail::check_tag(opt.tag, kAlgo);
  detail::check_per_rank(block_bytes, t.size(), "block_bytes", kAlgo);
  const std::size_t total = detail::checked_sum(block_bytes, 1, "block_bytes", kAlgo);
  const int r = t.rank();
  const std::size_t mine = block_bytes[static_cast<std::size_t>(r)];
  detail::check_buffer(in, mine, "input buffer", kAlgo);
  detail::check_buffer(out, total, "output buffer", kAlgo);
  const SegmentPlan plan = plan_blocks(block_bytes, 1, opt.chunk_bytes);
  auto* dst = static_cast<std::byte*>(out);
  const auto* src = static_cast<const std::byte*>(in);
  std::byte* own = dst + plan.segment_offset(r);
  // In place means `in` is this rank's block inside `out`; any other
  // overlap of `in` with `out` is refused.
  if (src != own && detail::overlaps(in, mine, out, total)) {
    throw InvalidArgument(fmt::format(
        "{}: input overlaps the output but is not this rank's block of it (rank {}, offset {})",
        kAlgo, r, plan.segment_offset(r)));
  }
  if (total == 0) return;
  if (mine > 0 && src != own) std::memcpy(own, src, mine);
  if (t.size() == 1) return;
  RingAllgather(t, src, dst, plan, opt.tag).run();
}

}  // namespace gyre::collectives
