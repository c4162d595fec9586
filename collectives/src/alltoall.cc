// Personalised all-to-all and barrier.
//
// alltoall: every receive is posted first, then the sends in the pairwise
// order r+1, r+2, ... (so that at each moment the ranks tend to target
// different peers), then all are awaited. Each pair exchanges one message
// per direction, of any size; the transport cuts huge ones.
//
// barrier: dissemination barrier, ceil(log2 n) rounds; in round i rank r
// signals r + 2^i and waits for r - 2^i. After the last round every rank has
// heard, directly or through others, from every rank.
#include <cstring>
#include <vector>

#include "gyre/collectives/algorithms.h"
#include "gyre/error.h"
#include "validate.h"

namespace gyre::collectives {

void alltoall(Transport& t, const void* in, std::span<const std::size_t> send_bytes, void* out,
              std::span<const std::size_t> recv_bytes, const AlltoallOptions& opt) {
  constexpr const char* kAlgo = "alltoall";
  detail::check_world(t, kAlgo);
  detail::check_tag(opt.tag, kAlgo);
  const int n = t.size(), r = t.rank();
  detail::check_per_rank(send_bytes, n, "send_bytes", kAlgo);
  detail::check_per_rank(recv_bytes, n, "recv_bytes", kAlgo);
  const std::size_t send_total = detail::checked_sum(send_bytes, 1, "send_bytes", kAlgo);
  const std::size_t recv_total = detail::checked_sum(recv_bytes, 1, "recv_bytes", kAlgo);
  detail::check_buffer(in, send_total, "input buffer", kAlgo);
  detail::check_buffer(out, recv_total, "output buffer", kAlgo);
  // The exchange reads `in` while writing `out`: no overlap at all.
  if (detail::overlaps(in, send_total, out, recv_total)) {
    throw InvalidArgument(std::string(kAlgo) + ": input and output buffers overlap");
  }
  const std::size_t self = static_cast<std::size_t>(r);
  if (send_bytes[self] != recv_bytes[self]) {
    throw InvalidArgument(std::string(kAlgo) + ": rank " + std::to_string(r) + " sends " +
                          std::to_string(send_bytes[self]) + " bytes to itself but expects " +
                          std::to_string(recv_bytes[self]));
  }

  std::vector<std::size_t> send_off(static_cast<std::size_t>(n) + 1, 0), recv_off(send_off);
  for (std::size_t p = 0; p < static_cast<std::size_t>(n); ++p) {
    send_off[p + 1] = send_off[p] + send_bytes[p];
    recv_off[p + 1] = recv_off[p] + recv_bytes[p];
  }
  const auto* src = static_cast<const std::byte*>(in);
  auto* dst = static_cast<std::byte*>(out);
  std::vector<transport::Transfer> reqs;
  reqs.reserve(2 * static_cast<std::size_t>(n));
  for (int i = 1; i < n; ++i) {
    const auto p = static_cast<std::size_t>((r - i + n) % n);
    if (recv_bytes[p] > 0) {
      reqs.push_back(t.irecv(static_cast<int>(p), opt.tag,
                             std::span<std::byte>(dst + recv_off[p], recv_bytes[p])));
    }
  }
  for (int i = 1; i < n; ++i) {
    const auto p = static_cast<std::size_t>((r + i) % n);
    if (send_bytes[p] > 0) {
      reqs.push_back(t.isend(static_cast<int>(p), opt.tag,
                             std::span<const std::byte>(src + send_off[p], send_bytes[p])));
    }
  }
  if (send_bytes[self] > 0) std::memcpy(dst + recv_off[self], src + send_off[self], send_bytes[self]);
  for (auto& q : reqs) t.wait(q);
}

void barrier(Transport& t, const BarrierOptions& opt) {
  constexpr const char* kAlgo = "barrier";
  detail::check_world(t, kAlgo);
  detail::check_tag(opt.tag, kAlgo);
  const int n = t.size(), r = t.rank();
  for (int dist = 1; dist < n; dist *= 2) {
    transport::Transfer recv = t.irecv((r - dist + n) % n, opt.tag, {});
    transport::Transfer send = t.isend((r + dist) % n, opt.tag, {});
    t.wait(recv);
    t.wait(send);
  }
}

}  // namespace gyre::collectives
