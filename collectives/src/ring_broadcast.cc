// Broadcast pipelined along the ring: the root sends its buffer to root+1 in
// chunks; every other rank receives each chunk in place and passes it on,
// except the last rank of the chain (root-1). With c chunks and n ranks the
// time is about (c + n - 2) chunk transfers instead of c * (n - 1).
#include <fmt/format.h>
#include <vector>

#include "gyre/collectives/algorithms.h"
#include "gyre/collectives/segment_plan.h"
#include "gyre/error.h"
#include "ring_pipeline.h"
#include "validate.h"

namespace gyre::collectives {

void ring_broadcast(Transport& t, void* buf, std::size_t bytes, int root,
                    const BroadcastOptions& opt) {
  constexpr const char* kAlgo = "ring_broadcast";
  detail::check_world(t, kAlgo);
  detail::check_chunk(opt.chunk_bytes, kAlgo);
  detail::check_tag(opt.tag, kAlgo);
  const int n = t.size();
  if (root < 0 || root >= n) {
    throw InvalidArgument(fmt::format("{}: root {} is outside the world of {} ranks", kAlgo, root, n));
  }
  detail::check_buffer(buf, bytes, "buffer", kAlgo);
  if (bytes == 0 || n == 1) return;

  const SegmentPlan plan = plan_ring(bytes, 1, 1, opt.chunk_bytes);
  const std::size_t chunks = plan.chunks;
  auto* data = static_cast<std::byte*>(buf);
  auto chunk = [&](std::size_t j) {
    return std::span<std::byte>(data + plan.chunk_offset(0, j), plan.chunk_count(0, j));
  };
  const int position = (t.rank() - root + n) % n;  // hops from the root
  const bool forwards = position < n - 1;
  const int next = transport::ring_next(t), prev = transport::ring_prev(t);

  std::vector<transport::Transfer> sends(chunks), recvs(chunks);
  if (position == 0) {
    // At most kRecvWindow chunks in flight, matching the receives the next
    // rank keeps posted (an unmatched message costs MPI an extra copy).
    for (std::size_t j = 0; j < chunks; ++j) {
      if (j >= kRecvWindow) t.wait(sends[j - kRecvWindow]);
      sends[j] = t.isend(next, opt.tag, chunk(j));
    }
  } else {
    auto post_receive = [&](std::size_t j) {
      if (j < chunks) recvs[j] = t.irecv(prev, opt.tag, chunk(j));
    };
    for (std::size_t j = 0; j < kRecvWindow; ++j) post_receive(j);
    for (std::size_t j = 0; j < chunks; ++j) {
      t.wait(recvs[j]);
      if (forwards) sends[j] = t.isend(next, opt.tag, chunk(j));
      post_receive(j + kRecvWindow);
    }
  }
  for (auto& s : sends) t.wait(s);
}

}  // namespace gyre::collectives
