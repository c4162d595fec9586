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
// Every rank sends exactly ceil(log2 n) messages, each its vector as it
// stands, for every n: the negotiation's cache-hit round (AND of bit
// vectors, min and max of steps, a speculated small allreduce in the tail)
// in log depth.
#include <algorithm>
#include <bit>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "gyre/collectives/algorithms.h"
#include "gyre/error.h"
#include "validate.h"

namespace gyre::collectives {

void dissemination_allreduce(Transport& t, std::vector<std::uint64_t>& words,
                             std::size_t max_words, const TailCombine& combine,
                             const DisseminationOptions& opt) {
  constexpr const char* kAlgo = "dissemination_allreduce";
  detail::check_world(t, kAlgo);
  detail::check_tag(opt.tag, kAlgo);
  const int n = t.size(), r = t.rank();
  if (n == 1) return;
  constexpr std::size_t kWord = sizeof(std::uint64_t);
  // Received into room for the longest vector, not zeroed: only what
  // arrived is read.
  std::vector<std::uint64_t> sent, got;
  const auto room = std::make_unique_for_overwrite<std::uint64_t[]>(max_words);
  const bool pairs = std::has_single_bit(static_cast<unsigned>(n));
  for (int dist = 1; dist < n; dist *= 2) {
    const int to = pairs ? r ^ dist : (r + dist) % n;
    const int from = pairs ? r ^ dist : (r - dist + n) % n;
    if (words.size() > max_words) {
      throw InvalidArgument(fmt::format("{}: a vector of {} words, over the {} agreed", kAlgo,
                                        words.size(), max_words));
    }
    // What this rank has combined so far travels; `words` may change only
    // after the send completed, so the message is a copy.
    sent.assign(words.begin(), words.end());
    std::size_t received = 0;
    transport::Transfer recv = t.irecv_message(
        from, opt.tag,
        std::span<std::byte>(reinterpret_cast<std::byte*>(room.get()), max_words * kWord),
        &received);
    transport::Transfer send = t.isend_message(
        to, opt.tag,
        std::span<const std::byte>(reinterpret_cast<const std::byte*>(sent.data()),
                                   sent.size() * kWord));
    t.wait(recv);
    t.wait(send);
    if (received % kWord != 0) {
      throw TransportError(fmt::format("{}: rank {} sent {} bytes, not a whole number of words",
                                       kAlgo, from, received));
    }
    const std::span<const std::uint64_t> in(room.get(), received / kWord);
    if (!pairs || r < from) {
      combine(words, in);
    } else {
      // The partner's words first, as the partner combines them.
      got.assign(in.begin(), in.end());
      combine(got, std::span<const std::uint64_t>(sent));
      words.swap(got);
    }
  }
}

void dissemination_allreduce(Transport& t, std::span<std::uint64_t> words,
                             const WordCombine& combine, const DisseminationOptions& opt) {
  std::vector<std::uint64_t> v(words.begin(), words.end());
  const std::size_t size = words.size();
  dissemination_allreduce(
      t, v, size,
      [&](std::vector<std::uint64_t>& acc, std::span<const std::uint64_t> in) {
        if (in.size() != size) {
          throw TransportError(fmt::format(
              "dissemination_allreduce: a peer sent {} words where every rank passes {}",
              in.size(), size));
        }
        combine(std::span<std::uint64_t>(acc), in);
      },
      opt);
  std::copy(v.begin(), v.end(), words.begin());
}

}  // namespace gyre::collectives
