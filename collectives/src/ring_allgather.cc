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

  void run() {
    // Step 0 sends this rank's block from `in`, kRecvWindow chunks ahead
    // (see ring_allreduce.cc); later steps forward what arrived in `out` at
    // the step before.
    for (std::size_t j = 0; j < std::min(pipe_.chunks(), kRecvWindow); ++j) send_own_chunk(j);
    for (std::size_t u = 0; u < kRecvWindow; ++u) post_receive(u);
    for (int k = 0; k < pipe_.steps(); ++k) {
      for (std::size_t j = 0; j < pipe_.chunks(); ++j) {
        pipe_.wait_recv(k, j);
        if (k + 1 < pipe_.steps()) {
          pipe_.post_send(k + 1, j, out_ + pipe_.chunk_byte_offset(pipe_.send_segment(k + 1), j));
        }
        const std::size_t u = static_cast<std::size_t>(k) * pipe_.chunks() + j;
        if (k == 0) send_own_chunk(j + kRecvWindow);
        post_receive(u + kRecvWindow);
      }
    }
    pipe_.finish();
  }

 private:
  void send_own_chunk(std::size_t j) {
    if (j >= pipe_.chunks()) return;
    const int own = pipe_.send_segment(0);
    pipe_.post_send(0, j, in_ + pipe_.chunk_byte_offset(own, j) - pipe_.chunk_byte_offset(own, 0));
  }

  void post_receive(std::size_t u) {
    if (u >= pipe_.units()) return;
    const int k = static_cast<int>(u / pipe_.chunks());
    const std::size_t j = u % pipe_.chunks();
    pipe_.post_recv(k, j, out_ + pipe_.chunk_byte_offset(pipe_.recv_segment(k), j));
  }

  RingPipeline pipe_;
  const std::byte* in_;
  std::byte* out_;
};

}  // namespace

void ring_allgather(Transport& t, const void* in, void* out,
                    std::span<const std::size_t> block_bytes, const RingOptions& opt) {
  constexpr const char* kAlgo = "ring_allgather";
  detail::check_world(t, kAlgo);
  detail::check_options(opt, kAlgo);
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
