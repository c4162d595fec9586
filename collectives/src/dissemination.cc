// Dissemination allreduce of 64-bit words: ceil(log2 n) steps; in step k
// rank r sends what it has combined so far to rank r + 2^k and combines what
// rank r - 2^k sends (both mod n). After step k, rank r holds the
// combination of ranks r - 2^(k+1) + 1 .. r, so after ceil(log2 n) steps of
// every rank; for n not a power of two some ranks are combined twice, which
// an idempotent combine does not notice. Every rank sends exactly
// ceil(log2 n) messages of the vector's size, for every n: the negotiation's
// cache-hit round (AND of bit vectors, min and max of steps) in log depth.
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
  for (int dist = 1; dist < n; dist *= 2) {
    // What this rank has combined so far travels; `words` may change only
    // after the send completed, so the message is a copy.
    std::memcpy(sent.data(), words.data(), bytes);
    transport::Transfer recv =
        t.irecv((r - dist + n) % n, opt.tag,
                std::span<std::byte>(reinterpret_cast<std::byte*>(got.data()), bytes));
    transport::Transfer send =
        t.isend((r + dist) % n, opt.tag,
                std::span<const std::byte>(reinterpret_cast<const std::byte*>(sent.data()), bytes));
    t.wait(recv);
    t.wait(send);
    combine(words, std::span<const std::uint64_t>(got));
  }
}

}  // namespace gyre::collectives
