// Negotiator: the framing of a round and the steps from requests to
// responses.
#include "negotiation/negotiator.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "gyre/collectives/algorithms.h"
#include "gyre/error.h"

namespace gyre::core {

namespace {

// Bytes of each rank's message that travel in the first allgather of a
// round; longer messages send the rest in a second one. Steady-state
// messages (flags, step, cache bits) fit easily.
constexpr std::size_t kInlineBytes = 256;

}  // namespace

Negotiator::Negotiator(transport::Transport& t, const NegotiatorOptions& opt, VersionVector& vv)
    : t_(t),
      opt_(opt),
      vv_(vv),
      cache_(opt.cache_capacity),
      coord_(t.size(), opt.max_version_lag, opt.stall_shutdown_s) {}

Agreement Negotiator::round(std::vector<Request> fresh, RoundFlags flags) {
  RoundMessage mine;
  mine.shutdown = flags.shutdown;
  mine.joined = flags.joined;
  mine.step = vv_.own();
  for (auto& r : fresh) {
    // A request equal to a cached one, at the step the message carries,
    // travels as its slot's bit. Receivers read the bits before the full
    // requests, so a name already sent in full this round (an announced
    // failure) is sent in full again: a rank's requests of one name must
    // arrive in the order it made them.
    const bool sent_in_full =
        !mine.requests.empty() &&
        std::any_of(mine.requests.begin(), mine.requests.end(),
                    [&](const Request& q) { return q.name == r.name; });
    if (r.error_kind == ErrorKind::kNone && r.step == mine.step && !sent_in_full) {
      if (auto slot = cache_.find(r)) {
        mine.cache_hits.push_back(*slot);
        cache_hits_sent_.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
    }
    if (r.error_kind == ErrorKind::kNone) requests_sent_.fetch_add(1, std::memory_order_relaxed);
    mine.requests.push_back(std::move(r));
  }
  mine.stall_failures = std::move(flags.stall_failures);

  std::vector<RoundMessage> msgs = exchange(mine);
  Agreement out;
  out.idle = std::all_of(msgs.begin(), msgs.end(), [](const RoundMessage& m) {
    return !m.shutdown && !m.joined && m.requests.empty() && m.cache_hits.empty() &&
           m.stall_failures.empty();
  });
  for (int r = 0; r < t_.size(); ++r) vv_.update(r, msgs[static_cast<std::size_t>(r)].step);
  out.agreed_at = Clock::now();
  RoundOutcome decided = coord_.process(msgs, cache_, out.agreed_at);
  out.responses = std::move(decided.responses);
  out.shutdown_rank = decided.shutdown_rank;
  out.join_completed = decided.join_completed;
  return out;
}

std::vector<RoundMessage> Negotiator::exchange(const RoundMessage& mine) {
  std::vector<std::byte> bytes = encode(mine);
  const int size = t_.size();
  std::vector<RoundMessage> out(static_cast<std::size_t>(size));
  if (size == 1) {
    out[0] = decode(bytes, 0, 1);
    return out;
  }
  const std::size_t n = static_cast<std::size_t>(size);
  collectives::AllgatherOptions ro;
  ro.chunk_bytes = opt_.chunk_bytes;
  ro.tag = opt_.tag;

  // Part 1: the first kInlineBytes of every message (with its length).
  std::vector<std::byte> block(kInlineBytes, std::byte{0});
  std::memcpy(block.data(), bytes.data(), std::min(kInlineBytes, bytes.size()));
  std::vector<std::byte> first(kInlineBytes * n);
  std::vector<std::size_t> sizes(n, kInlineBytes);
  collectives::ring_allgather(t_, block.data(), first.data(), sizes, ro);

  std::vector<std::size_t> lens(n), extra(n);
  bool more = false;
  for (std::size_t r = 0; r < n; ++r) {
    lens[r] = encoded_length(std::span<const std::byte>(first.data() + r * kInlineBytes, 4));
    // Checked before anything is allocated for the remainder.
    if (lens[r] < kMinMessageBytes || lens[r] > kMaxMessageBytes) {
      throw TransportError(fmt::format(
          "malformed negotiation message from rank {}: length {} (between {} and {})", r,
          lens[r], kMinMessageBytes, kMaxMessageBytes));
    }
    extra[r] = lens[r] > kInlineBytes ? lens[r] - kInlineBytes : 0;
    more = more || extra[r] > 0;
  }
  // Part 2, only when some message was longer: the remainders.
  std::vector<std::byte> rest;
  std::vector<std::size_t> rest_at(n, 0);
  if (more) {
    std::size_t total = 0;
    for (std::size_t r = 0; r < n; ++r) {
      rest_at[r] = total;
      total += extra[r];
    }
    rest.resize(total);
    const std::byte* tail = bytes.size() > kInlineBytes ? bytes.data() + kInlineBytes : nullptr;
    collectives::ring_allgather(t_, tail, rest.data(), extra, ro);
  }
  for (std::size_t r = 0; r < n; ++r) {
    std::vector<std::byte> msg(lens[r]);
    std::memcpy(msg.data(), first.data() + r * kInlineBytes, std::min(kInlineBytes, lens[r]));
    if (extra[r]) std::memcpy(msg.data() + kInlineBytes, rest.data() + rest_at[r], extra[r]);
    out[r] = decode(msg, static_cast<int>(r), size);
  }
  return out;
}

}  // namespace gyre::core
