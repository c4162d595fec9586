// Dissemination allreduce of 64-bit words: ceil(log2 n) steps.
//
// n a power of two: in step k rank r exchanges what it has combined so far
// with rank r XOR 2^k (recursive doubling), and both combine the pair with
// the lower rank's words first. After step k, rank r holds the combination
// of the 2^(k+1) ranks that agree with it above bit k, each exactly once, so
// after log2 n steps every rank holds every rank's words once, combined in
// the same order on every rank: the same bits everywhere, for any
// associative combine (sums of floats included), not only idempotent ones.
//
// Other n: in step k rank r sends to rank r + 2^k and combines what rank
// r - 2^k sends (both mod n). After step k, rank r holds the combination of
// ranks r - 2^(k+1) + 1 .. r, so after ceil(log2 n) steps of every rank;
// some ranks are combined twice, which an idempotent combine does not
// notice.
//
// Every rank sends exactly ceil(log2 n) messages of the vector's size, for
// every n: the negotiation's cache-hit round (AND of bit vectors, min and
// max of steps, a speculated small allreduce) in log depth.
#include <bit>
#include <cstring>
#include <vector>

#include "gyre/collectives/algorithms.h"
#include "validate.h"

namespace gyre::collectives {

void dissemination_allreduce(Transport& t, std::span<std::uint64_t> words,
                             const WordCombine& combine, const DisseminationOptions& opt) {
  constexpr const char* kAlgo = "dissemination_allreduce";
  detail::check_world(t, kAlgo);
  detail::check_tag(opt.tag, kAlgo);
  const int n = t.size(), r = t.rank();
  if (n == 1) return;
  const std::size_t bytes = words.size() * sizeof(std::uint64_t);
  std::vector<std::uint64_t> sent(words.size()), got(words.size());
  const bool pairs = std::has_single_bit(static_cast<unsigned>(n));
  for (int dist = 1; dist < n; dist *= 2) {
    const int to = pairs ? r ^ dist : (r + dist) % n;
    const int from = pairs ? r ^ dist : (r - dist + n) % n;
    // What this rank has combined so far travels; `words` may change only
    // after the send completed, so the message is a copy.
    std::memcpy(sent.data(), words.data(), bytes);
    transport::Transfer recv =
        t.irecv(from, opt.tag,
                std::span<std::byte>(reinterpret_cast<std::byte*>(got.data()), bytes));
    transport::Transfer send =
        t.isend(to, opt.tag,
                std::span<const std::byte>(reinterpret_cast<const std::byte*>(sent.data()), bytes));
    t.wait(recv);
    t.wait(send);
    if (!pairs || r < from) {
      combine(words, std::span<const std::uint64_t>(got));
    } else {
      // The partner's words first, as the partner combines them.
      combine(std::span<std::uint64_t>(got), std::span<const std::uint64_t>(sent));
      std::memcpy(words.data(), got.data(), bytes);
    }
  }
}

}  // namespace gyre::collectives
