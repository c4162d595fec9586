// LocalSgd (gyre/local_sgd.h): the argument checks, the start from the
// set's first rank, and the outer rounds of the fragments, written on
// gyre.h's public calls alone (broadcast, grouped allreduce or allgather,
// commit_step); the arithmetic on each parameter is local_sgd_wire.cc's. A
// round changes nothing until its collective has succeeded: the
// pseudo-gradients are computed into buffers of their own, and θ_synced,
// the momentum and the caller's parameters are written only after the wait
// returned. A fragment's round is started (start()) and completed
// (finish()), at once or sync_delay steps later; between the two its
// buffers (wire, int8 message, θ_local at the start) are not touched.
#include "gyre/local_sgd.h"

#include <cmath>
#include <cstring>
#include <exception>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "gyre/elastic.h"
#include "local_sgd_wire.h"
#include "training_checks.h"

namespace gyre {

using local_sgd_detail::Slot;

namespace {

// Waits for every handle, then rethrows the first failure: no operation is
// left in flight on buffers the caller may free once this throws.
void wait_all(const std::vector<Handle>& handles) {
  std::exception_ptr first;
  for (const auto& h : handles) {
    try {
      h.wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

void check_options(const LocalSgdOptions& o) {
  auto bad = [](const std::string& what) { throw InvalidArgument("LocalSgd: " + what); };
  if (o.period < 1) bad(fmt::format("period must be >= 1, got {}", o.period));
  if (o.warmup_steps < 0) bad(fmt::format("warmup_steps must be >= 0, got {}", o.warmup_steps));
  training_detail::check_outer_optimizer(o.outer, "LocalSgd");
  if (o.compression != LocalSgdCompression::kNone &&
      o.compression != LocalSgdCompression::kFloat16 &&
      o.compression != LocalSgdCompression::kBFloat16 &&
      o.compression != LocalSgdCompression::kInt8) {
    bad(fmt::format("unknown compression {}", static_cast<int>(o.compression)));
  }
  if (o.name.empty()) bad("name (the prefix of the operations' names) is empty");
  if (o.fragments < 1 || o.fragments > o.period) {
    bad(fmt::format("fragments must be between 1 and period ({}), got {}", o.period, o.fragments));
  }
  if (o.sync_delay < 0 || o.sync_delay >= o.period) {
    bad(fmt::format("sync_delay must be >= 0 and < period ({}), got {}", o.period, o.sync_delay));
  }
  if (!(o.mixing <= 1)) bad(fmt::format("mixing must be in [0, 1] or negative, got {}", o.mixing));
}

void check_params(const std::vector<TensorView>& params, int fragments) {
  training_detail::check_params(params, "LocalSgd");
  if (static_cast<std::size_t>(fragments) > params.size()) {
    throw InvalidArgument(fmt::format("LocalSgd: {} fragments but only {} parameters", fragments,
                                      params.size()));
  }
}

}  // namespace

// One fragment: slots [first, last) and its round in flight, if any.
struct LocalSgdFragment {
  std::size_t first = 0, last = 0;
  int offset = 0;                   // its rounds start at steps s with s % period == offset
  Handle handle;                    // the round in flight (invalid: none)
  std::vector<std::byte> int8_row;  // this rank's int8 message while in flight
  std::int64_t started = 0;         // the local step its round started at
  std::int64_t due = 0;             // the local step it completes at
  std::int64_t rounds = 0;
  std::uint64_t version = 0;
};

struct LocalSgd::State {
  LocalSgdOptions options;
  std::vector<Slot> slots;
  std::vector<LocalSgdFragment> fragments;
  std::vector<std::string> round_names;
  std::int64_t local_steps = 0;
  std::int64_t rounds = 0;
  std::uint64_t version = 0;

  std::vector<Slot*> slots_of(const LocalSgdFragment& f) {
    std::vector<Slot*> out;
    for (std::size_t i = f.first; i < f.last; ++i) out.push_back(&slots[i]);
    return out;
  }
  std::string int8_name(const LocalSgdFragment& f) const {
    const std::string base = options.name + ".round.int8";
    return fragments.size() == 1 ? base : fmt::format("{}.{}", base, f.first);
  }
  void start(LocalSgdFragment& f);
  // Completes f's round if one is in flight; true if it did.
  bool finish(LocalSgdFragment& f);
  void wait_for(LocalSgdFragment& f);
  // Waits for every round in flight, dropping them; errors are swallowed.
  void drop_in_flight() noexcept;
};

LocalSgd::LocalSgd(const LocalSgdOptions& options, std::vector<TensorView> params)
    : state_(std::make_unique<State>()) {
  check_options(options);
  check_params(params, options.fragments);
  State& st = *state_;
  st.options = options;

  // Every rank starts from the set's first rank's parameters.
  const auto members = process_set_ranks(options.process_set);
  if (members.empty()) {
    throw InvalidArgument(
        fmt::format("LocalSgd: process set {} has no ranks", options.process_set));
  }
  std::vector<Handle> started;
  for (std::size_t i = 0; i < params.size(); ++i) {
    started.push_back(broadcast_async(fmt::format("{}.init.{}", options.name, i), params[i],
                                      members.front(), options.process_set));
  }
  wait_all(started);

  std::vector<std::size_t> counts;
  for (std::size_t i = 0; i < params.size(); ++i) {
    Slot s;
    s.local = params[i];
    s.count = static_cast<std::size_t>(params[i].numel());
    const std::size_t bytes = s.local.nbytes();
    s.synced.resize(bytes);
    if (bytes > 0) std::memcpy(s.synced.data(), s.local.data, bytes);
    if (options.outer.momentum > 0) s.momentum.assign(bytes, std::byte{0});
    s.wire.resize(local_sgd_detail::wire_size(s, options.compression));
    if (options.sync_delay > 0) s.at_start.resize(bytes);
    counts.push_back(s.count);
    st.slots.push_back(std::move(s));
    st.round_names.push_back(fmt::format("{}.round.{}", options.name, i));
  }
  const auto cuts = local_sgd_detail::fragment_cuts(counts, options.fragments);
  for (int f = 0; f < options.fragments; ++f) {
    LocalSgdFragment frag;
    frag.first = cuts[static_cast<std::size_t>(f)];
    frag.last = cuts[static_cast<std::size_t>(f) + 1];
    frag.offset = (f + 1) * options.period / options.fragments % options.period;
    st.fragments.push_back(std::move(frag));
  }
}

LocalSgd::~LocalSgd() {
  if (state_) state_->drop_in_flight();
}
LocalSgd::LocalSgd(LocalSgd&&) noexcept = default;
LocalSgd& LocalSgd::operator=(LocalSgd&& other) noexcept {
  if (this != &other) {
    if (state_) state_->drop_in_flight();
    state_ = std::move(other.state_);
  }
  return *this;
}

void LocalSgd::State::start(LocalSgdFragment& f) {
  const LocalSgdCompression c = options.compression;
  const std::vector<Slot*> mine = slots_of(f);
  for (Slot* s : mine) {
    local_sgd_detail::pseudo_gradient(*s, c);
    if (!s->at_start.empty()) std::memcpy(s->at_start.data(), s->local.data, s->at_start.size());
  }
  if (c == LocalSgdCompression::kInt8) {
    const auto l = local_sgd_detail::int8_layout(mine);
    f.int8_row.resize(l.bytes);
    local_sgd_detail::quantize(mine, l, f.int8_row.data());
    f.handle = allgather_async(
        int8_name(f),
        TensorView{f.int8_row.data(), DataType::kUInt8, {1, static_cast<std::int64_t>(l.bytes)}},
        options.process_set);
  } else {
    std::vector<std::string> names(round_names.begin() + static_cast<std::ptrdiff_t>(f.first),
                                   round_names.begin() + static_cast<std::ptrdiff_t>(f.last));
    std::vector<TensorView> wires;
    for (Slot* s : mine) {
      void* data = s->wire.empty() ? nullptr : s->wire.data();
      wires.push_back(TensorView{data, local_sgd_detail::wire_dtype(*s, c), s->local.shape});
    }
    f.handle = grouped_allreduce_async(names, wires, wires, ReduceOp::kAverage, 1.0, 1.0,
                                       options.process_set);
  }
  f.started = local_steps;
  f.due = local_steps + options.sync_delay;
}

// Waits for f's round; on an error the round is dropped and rethrown.
void LocalSgd::State::wait_for(LocalSgdFragment& f) {
  Handle h = std::move(f.handle);
  f.handle = Handle{};
  h.wait();
  if (options.compression != LocalSgdCompression::kInt8) return;
  const std::vector<Slot*> mine = slots_of(f);
  const auto l = local_sgd_detail::int8_layout(mine);
  const OwnedTensor& rows = h.output();
  // Counted now, not at construction: after an elastic rebuild the set
  // holds the survivors.
  const std::size_t ranks = process_set_ranks(options.process_set).size();
  if (ranks == 0 || rows.data.size() != ranks * l.bytes) {
    // Every rank's parameter shapes were checked equal at construction (its
    // broadcasts): a different row size means a rank changed them since.
    throw MismatchError(fmt::format(
        "LocalSgd: the int8 round gathered {} bytes, expected {} ranks x {}: the ranks' "
        "parameters no longer have the same shapes",
        rows.data.size(), ranks, l.bytes));
  }
  local_sgd_detail::dequantize_average(mine, l, rows.data.data(), ranks);
}

bool LocalSgd::State::finish(LocalSgdFragment& f) {
  if (!f.handle.valid()) return false;
  wait_for(f);
  const bool drift = f.started != local_steps;
  for (Slot* s : slots_of(f)) {
    local_sgd_detail::outer_step(*s, options.compression, options.outer);
    local_sgd_detail::merge(*s, drift, options.mixing);
  }
  ++f.rounds;
  ++rounds;
  if (options.commit && options.process_set == kGlobalProcessSet) {
    commit_step();
    version = committed_steps();
    f.version = version;
  } else {
    f.version = static_cast<std::uint64_t>(f.rounds);
  }
  return true;
}

void LocalSgd::State::drop_in_flight() noexcept {
  for (LocalSgdFragment& f : fragments) {
    if (!f.handle.valid()) continue;
    try {
      f.handle.wait();
    } catch (...) {  // the round is dropped either way
    }
    f.handle = Handle{};
  }
}

bool LocalSgd::step() {
  State& st = *state_;
  st.local_steps += 1;
  const std::int64_t now = st.local_steps;
  bool completed = false;
  try {
    if (now <= st.options.warmup_steps) {
      for (LocalSgdFragment& f : st.fragments) {
        completed = st.finish(f) || completed;  // one started before the warm-up's end
        st.start(f);
        completed = st.finish(f) || completed;
      }
      return completed;
    }
    // Rounds due now complete before new ones start (a fragment's next round
    // starts a period after its last, and sync_delay < period).
    for (LocalSgdFragment& f : st.fragments) {
      if (f.handle.valid() && f.due <= now) completed = st.finish(f) || completed;
    }
    for (LocalSgdFragment& f : st.fragments) {
      if (now % st.options.period != f.offset) continue;
      st.start(f);
      if (st.options.sync_delay == 0) completed = st.finish(f) || completed;
    }
  } catch (...) {
    st.drop_in_flight();  // no round left in flight on a failed step
    throw;
  }
  return completed;
}

void LocalSgd::sync() {
  State& st = *state_;
  try {
    for (LocalSgdFragment& f : st.fragments) st.finish(f);
    for (LocalSgdFragment& f : st.fragments) {
      st.start(f);
      st.finish(f);
    }
  } catch (...) {
    st.drop_in_flight();
    throw;
  }
}

void LocalSgd::add_to(elastic::State& state) {
  State& st = *state_;
  const LocalSgdOptions& o = st.options;
  if (o.commit && o.process_set == kGlobalProcessSet) {
    throw InvalidArgument(
        "LocalSgd::add_to: this LocalSgd commits its rounds itself (.commit = true); with an "
        "elastic State the State's commit() is the round's commit: construct it with "
        ".commit = false and call state.commit() after each step() that ran a round");
  }
  for (std::size_t i = 0; i < st.slots.size(); ++i) {
    Slot& s = st.slots[i];
    // The State writes these buffers back on a recovery: LocalSgd owns them
    // (allocated once, never resized), the State only copies their bytes.
    state.add(fmt::format("{}.synced.{}", o.name, i), s.synced.data(), s.local.dtype,
              static_cast<std::int64_t>(s.count));
    if (!s.momentum.empty()) {
      state.add(fmt::format("{}.momentum.{}", o.name, i), s.momentum.data(), s.local.dtype,
                static_cast<std::int64_t>(s.count));
    }
  }
  state.add(o.name + ".local_steps", &st.local_steps, DataType::kInt64, 1);
  state.add(o.name + ".rounds", &st.rounds, DataType::kInt64, 1);
  // A round in flight (a sync delay: a commit may fall inside it) is not in
  // the commit: θ_synced and the momentum change only when it completes. On
  // a failure it goes with the old world; its fragment's next round carries
  // the steps since that fragment's last completed round.
  State* self = &st;  // stable: the LocalSgd holds it by pointer, also when moved
  state.on_failure([self](const RankFailedError&) { self->drop_in_flight(); });
  if (st.fragments.size() > 1) {
    for (std::size_t f = 0; f < st.fragments.size(); ++f) {
      state.add(fmt::format("{}.fragment_rounds.{}", o.name, f), &st.fragments[f].rounds,
                DataType::kInt64, 1);
      state.add(fmt::format("{}.fragment_versions.{}", o.name, f), &st.fragments[f].version,
                DataType::kInt64, 1);  // the bits of a uint64
    }
  }
}

std::int64_t LocalSgd::local_steps() const { return state_->local_steps; }
std::int64_t LocalSgd::rounds() const { return state_->rounds; }
std::uint64_t LocalSgd::version() const { return state_->version; }
const LocalSgdOptions& LocalSgd::options() const { return state_->options; }

std::vector<std::uint64_t> LocalSgd::fragment_versions() const {
  std::vector<std::uint64_t> out;
  for (const auto& f : state_->fragments) out.push_back(f.version);
  return out;
}

std::vector<std::int64_t> LocalSgd::fragment_rounds() const {
  std::vector<std::int64_t> out;
  for (const auto& f : state_->fragments) out.push_back(f.rounds);
  return out;
}

std::pair<std::size_t, std::size_t> LocalSgd::fragment_params(int f) const {
  const auto& frags = state_->fragments;
  if (f < 0 || static_cast<std::size_t>(f) >= frags.size()) {
    throw InvalidArgument(fmt::format("LocalSgd::fragment_params: fragment {} of {}", f,
                                      frags.size()));
  }
  return {frags[static_cast<std::size_t>(f)].first, frags[static_cast<std::size_t>(f)].last};
}

}  // namespace gyre
