// Negotiator: the framing of a round and the steps from requests to
// responses.
#include "negotiation/negotiator.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <map>

#include <fmt/format.h>

#include "gyre/collectives/algorithms.h"
#include "gyre/collectives/reduce_kernels.h"
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
      counted_(t),
      opt_(opt),
      vv_(vv),
      cache_(opt.cache_capacity),
      coord_(t.size(), opt.max_version_lag, opt.stall_shutdown_s) {}

Agreement Negotiator::round(std::vector<Request> fresh, RoundFlags flags) {
  // Hits held from the last round go first: a rank's requests of one name
  // must arrive in the order it made them. They were counted when first sent.
  const std::size_t resent = held_.size();
  const auto now = Clock::now();
  std::vector<Hit> all = std::move(held_);
  held_.clear();
  for (Request& r : fresh) all.push_back({std::move(r), now});

  RoundMessage mine;
  mine.shutdown = flags.shutdown;
  mine.joined = flags.joined;
  mine.step = vv_.own();
  std::vector<Hit> hits;  // the requests mine.cache_hits stand for
  for (std::size_t i = 0; i < all.size(); ++i) {
    Request& r = all[i].request;
    const bool first_time = i >= resent;
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
        if (first_time) cache_hits_sent_.fetch_add(1, std::memory_order_relaxed);
        hits.push_back(std::move(all[i]));
        continue;
      }
    }
    if (r.error_kind == ErrorKind::kNone && first_time) {
      requests_sent_.fetch_add(1, std::memory_order_relaxed);
    }
    mine.requests.push_back(std::move(r));
  }
  mine.stall_failures = std::move(flags.stall_failures);

  if (log_depth_possible()) {
    if (std::optional<Agreement> fast = log_depth_round(mine, hits, now)) {
      log_depth_rounds_.fetch_add(1, std::memory_order_relaxed);
      return std::move(*fast);
    }
  }

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
  collectives::ring_allgather(counted_, block.data(), first.data(), sizes, ro);

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
    collectives::ring_allgather(counted_, tail, rest.data(), extra, ro);
  }
  for (std::size_t r = 0; r < n; ++r) {
    std::vector<std::byte> msg(lens[r]);
    std::memcpy(msg.data(), first.data() + r * kInlineBytes, std::min(kInlineBytes, lens[r]));
    if (extra[r]) std::memcpy(msg.data() + kInlineBytes, rest.data() + rest_at[r], extra[r]);
    out[r] = decode(msg, static_cast<int>(r), size);
  }
  return out;
}

void Negotiator::set_host_tier(collectives::ShmGroup& local, transport::Transport& cross) {
  local_ = &local;
  tier_hosts_ = cross.size();
  if (local.rank() == 0) leaders_ = std::make_unique<transport::CountingTransport>(cross);
}

void Negotiator::combine_all(std::vector<std::uint64_t>& v, std::size_t max_words,
                             const Combine& combine) {
  collectives::DisseminationOptions o;
  o.tag = opt_.tag;
  constexpr std::size_t kWord = sizeof(std::uint64_t);
  // The largest vector follows from the cache's slots and the options,
  // alike on every rank: every rank takes the same branch. In a slot: the
  // vector's length in words, then the vector.
  if (!local_ || (1 + max_words) * kWord > local_->slot_bytes()) {
    collectives::dissemination_allreduce(counted_, v, max_words, combine, o);
    return;
  }
  collectives::ShmGroup& g = *local_;
  auto put = [&](int q) {
    auto* at = reinterpret_cast<std::uint64_t*>(g.slot(q));
    at[0] = v.size();
    std::memcpy(at + 1, v.data(), v.size() * kWord);
  };
  auto take = [&](int q) {
    const auto* at = reinterpret_cast<const std::uint64_t*>(g.slot(q));
    return std::span<const std::uint64_t>(at + 1, std::min<std::uint64_t>(at[0], max_words));
  };
  try {
    put(g.rank());
    g.barrier();
    if (g.rank() == 0) {
      for (int q = 1; q < g.size(); ++q) combine(v, take(q));
      if (leaders_->size() > 1) {
        collectives::dissemination_allreduce(*leaders_, v, max_words, combine, o);
      }
      put(0);
    }
    g.barrier();
    if (g.rank() != 0) {
      const std::span<const std::uint64_t> all = take(0);
      v.assign(all.begin(), all.end());
    }
    // Slot 0 is read before anyone writes a slot again.
    g.barrier();
  } catch (...) {
    g.fail();  // the host's other ranks stop waiting for this one
    throw;
  }
}

bool Negotiator::log_depth_possible() const {
  const std::vector<bool>& joined = coord_.joined();
  return opt_.log_depth && t_.size() > 1 && cache_.capacity() > 0 &&
         coord_.pending().empty() && std::none_of(joined.begin(), joined.end(), [](bool j) {
           return j;
         });
}

namespace {

// The vector of a log-depth round: [needs full exchange (OR)] [min step]
// [max step] [AND of the hit bits: words] [OR of the hit bits: words], then
// where the layout allows speculation (Negotiator::speculation_words)
// [speculated slot + 1; 0: none; kVoid: ranks differ] and, only while a
// slot is speculated, the tail: its input (in pairs: the input so far
// reduced; in rank order: every rank's input in its own place). A void
// speculation drops the tail, so the messages after it are short again.
constexpr std::size_t kNeedsFull = 0, kMinStep = 1, kMaxStep = 2, kBits = 3;
constexpr std::uint64_t kVoid = ~std::uint64_t{0};

// The most a rank-order speculation adds to the vector (every rank's input).
constexpr std::size_t kMaxRankOrderBytes = 4096;

std::size_t words_of(std::size_t bytes) { return (bytes + 7) / 8; }

bool bit(const std::vector<std::uint64_t>& v, std::size_t at, std::uint32_t slot) {
  return (v[at + slot / 64] >> (slot % 64)) & 1u;
}

}  // namespace

std::size_t Negotiator::speculation_words() const {
  const std::size_t bytes = std::min(opt_.speculate_bytes, speculate_max_);
  if (!source_ || bytes == 0) return 0;
  const std::size_t words = words_of(bytes);
  if (order_ == SpeculationOrder::kRankOrder) {
    // Every rank's input in its own place; OR combines them exactly for
    // any number of ranks and any dissemination.
    const std::size_t all = words * static_cast<std::size_t>(t_.size());
    return all * sizeof(std::uint64_t) <= kMaxRankOrderBytes ? all : 0;
  }
  const std::size_t bits = (cache_.slot_count() + 63) / 64;
  const std::size_t most = kBits + 2 * bits + 1 + words;
  // The combine_all path this vector takes, and whether its dissemination
  // is recursive doubling (see the header).
  const bool tiered = local_ && (1 + most) * sizeof(std::uint64_t) <= local_->slot_bytes();
  return std::has_single_bit(static_cast<unsigned>(tiered ? tier_hosts_ : t_.size())) ? words : 0;
}

std::optional<Agreement> Negotiator::log_depth_round(const RoundMessage& mine,
                                                     std::vector<Hit>& hits,
                                                     Clock::time_point now) {
  const bool held_too_long = std::any_of(hits.begin(), hits.end(), [&](const Hit& h) {
    return now - h.since > std::chrono::duration<double>(opt_.hold_limit_s);
  });
  const bool needs_full = mine.shutdown || mine.joined || !mine.requests.empty() ||
                          !mine.stall_failures.empty() || held_too_long;
  const std::size_t slots = cache_.slot_count();  // alike on every rank
  const std::size_t words = (slots + 63) / 64;
  const std::size_t and_at = kBits, or_at = kBits + words;
  // The most words of the speculation's tail (0: this round speculates on
  // nothing, and its vector has no slot word either), alike on every rank.
  const std::size_t spec_words = speculation_words();
  const std::size_t spec_at = kBits + 2 * words, input_at = spec_at + 1;
  const std::size_t head = kBits + 2 * words + (spec_words ? 1 : 0);
  std::vector<std::uint64_t> v;
  v.reserve(head + spec_words);  // the tail below, if any, without a reallocation
  v.assign(head, 0);
  v[kNeedsFull] = needs_full ? 1 : 0;
  v[kMinStep] = v[kMaxStep] = mine.step;
  for (std::uint32_t slot : mine.cache_hits) {
    v[and_at + slot / 64] |= std::uint64_t{1} << (slot % 64);
    v[or_at + slot / 64] |= std::uint64_t{1} << (slot % 64);
  }
  // The speculation: this rank's qualifying hit of the lowest slot, so that
  // ranks holding the same hits choose the same one, whatever the order in
  // which each enqueued them.
  // The hit whose input this rank speculates; hits.size(): none.
  std::size_t chosen = hits.size();
  collectives::CombineFn kernel = nullptr;
  std::size_t count = 0, nbytes = 0;
  const bool rank_order = order_ == SpeculationOrder::kRankOrder;
  const auto ranks = static_cast<std::size_t>(t_.size());
  const std::size_t max_input =
      (rank_order ? spec_words / ranks : spec_words) * sizeof(std::uint64_t);
  std::size_t each_words = 0;  // one rank's input in the tail
  if (spec_words && !needs_full) {
    // One pass: the lowest slot among the hits that qualify, then its
    // input. The input of a hit drained this round is always in the queue,
    // so the source failing (a hit completed meanwhile) just leaves the
    // speculation out of this round.
    std::size_t lowest = hits.size();
    for (std::size_t i = 0; i < hits.size(); ++i) {
      const Request& r = hits[i].request;
      const std::size_t b = r.nbytes();
      if (r.collective != Collective::kAllreduce || r.group_size >= 2 ||
          r.op == ReduceOp::kAdasum || r.device.type != DeviceType::kCPU || b == 0 ||
          b > max_input) {
        continue;
      }
      if (lowest == hits.size() || mine.cache_hits[i] < mine.cache_hits[lowest]) lowest = i;
    }
    if (lowest < hits.size()) {
      const Request& r = hits[lowest].request;
      collectives::CombineFn k = nullptr;
      try {
        k = collectives::combine_kernel(r.dtype, r.op);
      } catch (const InvalidArgument&) {
        // refused at enqueue; the executor refuses it alike
      }
      each_words = words_of(r.nbytes());
      v.resize(head + (rank_order ? each_words * ranks : each_words), 0);
      const std::size_t place = rank_order ? each_words * static_cast<std::size_t>(t_.rank()) : 0;
      auto* input = reinterpret_cast<std::byte*>(v.data() + input_at + place);
      if (k && source_(r, std::span(input, r.nbytes()))) {
        chosen = lowest;
        kernel = k;
        nbytes = r.nbytes();
        count = nbytes / dtype_size(r.dtype);
        v[spec_at] = std::uint64_t{mine.cache_hits[chosen]} + 1;
      } else {
        v.resize(head);
      }
    }
  }
  combine_all(v, head + spec_words,
              [&](std::vector<std::uint64_t>& acc, std::span<const std::uint64_t> in) {
    if (in.size() < head) {
      throw TransportError(fmt::format(
          "malformed log-depth negotiation vector: {} words where every rank sends at least {}",
          in.size(), head));
    }
    acc[kNeedsFull] |= in[kNeedsFull];
    acc[kMinStep] = std::min(acc[kMinStep], in[kMinStep]);
    acc[kMaxStep] = std::max(acc[kMaxStep], in[kMaxStep]);
    for (std::size_t w = 0; w < words; ++w) {
      acc[and_at + w] &= in[and_at + w];
      acc[or_at + w] |= in[or_at + w];
    }
    if (spec_words) {
      // Equal valid slots are this rank's own (acc or in is always what
      // this rank holds), so `kernel` is theirs; `acc` comes first. In rank
      // order each place is one rank's and the others' are zero: OR. A
      // void speculation carries no input further.
      if (acc[spec_at] != in[spec_at]) {
        acc[spec_at] = kVoid;
        acc.resize(head);
      } else if (acc[spec_at] != 0 && acc[spec_at] != kVoid && kernel) {
        if (in.size() != acc.size()) {
          throw TransportError(fmt::format(
              "malformed log-depth negotiation vector: a speculated input of {} words where "
              "this rank's is {}", in.size() - head, acc.size() - head));
        }
        if (rank_order) {
          for (std::size_t w = input_at; w < acc.size(); ++w) acc[w] |= in[w];
        } else {
          kernel(acc.data() + input_at, acc.data() + input_at, in.data() + input_at, count);
        }
      }
    }
  });
  if (v[kNeedsFull] != 0 || v[kMinStep] != v[kMaxStep]) return std::nullopt;

  // The slots every rank set, less the members of a grouped allreduce whose
  // group is not complete among them (its members run together or not at
  // all). Every rank computes this from the same bits and the same cache.
  std::vector<std::uint32_t> run;
  std::map<std::pair<std::string, std::uint32_t>, std::uint32_t> group_ready;
  for (std::uint32_t slot = 0; slot < slots; ++slot) {
    if (!bit(v, and_at, slot)) continue;
    const Request cached = cache_.hit(slot);
    if (cached.group_size >= 2) ++group_ready[{cached.group, cached.group_size}];
    run.push_back(slot);
  }
  if (!group_ready.empty()) {
    std::erase_if(run, [&](std::uint32_t slot) {
      const Request cached = cache_.hit(slot);
      return cached.group_size >= 2 &&
             group_ready[{cached.group, cached.group_size}] < cached.group_size;
    });
  }
  Agreement out;
  if (chosen < hits.size() && v[spec_at] == std::uint64_t{mine.cache_hits[chosen]} + 1 &&
      v.size() == input_at + (rank_order ? each_words * ranks : each_words) &&
      std::binary_search(run.begin(), run.end(), mine.cache_hits[chosen])) {
    const auto* result = reinterpret_cast<const std::byte*>(v.data() + input_at);
    std::vector<std::byte> reduced(result, result + nbytes);
    if (rank_order) {
      // Rank 0's with rank 1's, then each further rank's in turn: the order
      // in which the shared-memory allreduce reduces every element.
      const std::size_t stride = each_words * sizeof(std::uint64_t);
      const Request& r = hits[chosen].request;
      kernel(reduced.data(), result, result + stride, count);
      const collectives::ReduceFn more = collectives::reduce_kernel(r.dtype, r.op);
      for (int q = 2; q < t_.size(); ++q) {
        more(reduced.data(), result + static_cast<std::size_t>(q) * stride, count);
      }
    }
    out.speculated = Speculated{hits[chosen].request.name, std::move(reduced)};
    speculated_.fetch_add(1, std::memory_order_relaxed);
  }
  // This rank's other hits wait for the next round.
  for (std::size_t i = 0; i < hits.size(); ++i) {
    if (!std::binary_search(run.begin(), run.end(), mine.cache_hits[i])) {
      held_.push_back(std::move(hits[i]));
    }
  }

  bool any_hit = false;
  for (std::size_t w = 0; w < words && !any_hit; ++w) any_hit = v[or_at + w] != 0;
  out.idle = !any_hit;
  for (int r = 0; r < t_.size(); ++r) vv_.update(r, v[kMinStep]);
  // Every rank's message as the full exchange would have carried it, had
  // each rank sent exactly the slots that run: the Coordinator decides (and
  // updates the cache) as in any other round.
  RoundMessage each;
  each.step = v[kMinStep];
  each.cache_hits = std::move(run);
  out.agreed_at = Clock::now();
  RoundOutcome decided = coord_.process_alike(each, cache_, out.agreed_at);
  out.responses = std::move(decided.responses);
  return out;
}

}  // namespace gyre::core
