// PartialLocalSgd (gyre/partial_local_sgd.h), the rank's side: the argument
// checks, the start from the model the store holds (or the fragments, each
// a PartialLocalSgd of its own), a round (post, wait, adopt), close(). The
// accessors of what the aggregator published: partial_local_sgd_published.cc;
// the store's layout and the aggregator: partial_local_sgd_state.h.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <utility>

#include <fmt/format.h>

#include "gyre/elastic.h"
#include "training/local_sgd_wire.h"
#include "training/partial_local_sgd_state.h"
#include "training/training_checks.h"

namespace gyre {

using core::partial::Aggregator;
using core::partial::Backoff;
using core::partial::Clock;
using core::partial::MetaLayout;
using core::partial::PartialStore;

namespace {

void check_options(const PartialLocalSgdOptions& o) {
  auto bad = [](const std::string& what) { throw InvalidArgument("PartialLocalSgd: " + what); };
  if (o.period < 1) bad(fmt::format("period must be >= 1, got {}", o.period));
  if (o.warmup_steps < 0) bad(fmt::format("warmup_steps must be >= 0, got {}", o.warmup_steps));
  if (!(o.late_after_s >= 0 && std::isfinite(o.late_after_s))) {
    bad(fmt::format("late_after_s must be >= 0 and finite, got {}", o.late_after_s));
  }
  if (o.max_staleness < 0) bad(fmt::format("max_staleness must be >= 0, got {}", o.max_staleness));
  training_detail::check_outer_optimizer(o.outer, "PartialLocalSgd");
  if (std::isnan(o.timeout_s)) bad("timeout_s is NaN");
  if (o.name.empty()) bad("name (the prefix of the store's tensors) is empty");
  if (o.fragments < 1 || o.fragments > o.period) {
    bad(fmt::format("fragments must be between 1 and period ({}), got {}", o.period, o.fragments));
  }
  if (o.sync_delay < 0 || o.sync_delay >= o.period) {
    bad(fmt::format("sync_delay must be >= 0 and < period ({}), got {}", o.period, o.sync_delay));
  }
}

void check_params(const std::vector<TensorView>& params) {
  training_detail::check_params(params, "PartialLocalSgd");
  std::int64_t total = 0;
  for (const TensorView& p : params) total += p.numel();
  if (total == 0) throw InvalidArgument("PartialLocalSgd: the parameters hold no elements");
}

// The parameters, one after the other, as float64.
std::vector<double> flatten(const std::vector<TensorView>& params) {
  std::vector<double> out;
  for (const TensorView& p : params) {
    const auto count = static_cast<std::size_t>(p.numel());
    if (p.dtype == DataType::kFloat32) {
      const auto* v = static_cast<const float*>(p.data);
      out.insert(out.end(), v, v + count);
    } else {
      const auto* v = static_cast<const double*>(p.data);
      out.insert(out.end(), v, v + count);
    }
  }
  return out;
}

void unflatten(const std::vector<double>& values, const std::vector<TensorView>& params) {
  std::size_t at = 0;
  for (const TensorView& p : params) {
    const auto count = static_cast<std::size_t>(p.numel());
    if (p.dtype == DataType::kFloat32) {
      auto* v = static_cast<float*>(p.data);
      for (std::size_t k = 0; k < count; ++k) v[k] = static_cast<float>(values[at + k]);
    } else if (count > 0) {
      std::memcpy(p.data, values.data() + at, count * sizeof(double));
    }
    at += count;
  }
}

double default_timeout(double timeout_s) {
  if (timeout_s > 0) return timeout_s;
  const double stall = Options::from_env().stall_shutdown_s;
  return stall > 0 ? stall : 600.0;
}

}  // namespace

PartialLocalSgd::PartialLocalSgd(const PartialLocalSgdOptions& options,
                                 std::vector<TensorView> params)
    : state_(std::make_unique<State>()) {
  check_options(options);
  check_params(params);
  State& st = *state_;
  st.options = options;
  st.timeout_s = default_timeout(options.timeout_s);
  st.params = std::move(params);
  st.log = core::Logger(rank(), Options::from_env().log_level);
  if (options.fragments > 1) {
    if (st.params.size() < static_cast<std::size_t>(options.fragments)) {
      throw InvalidArgument(fmt::format("PartialLocalSgd: {} fragments but only {} parameters",
                                        options.fragments, st.params.size()));
    }
    // A PartialLocalSgd of one fragment per fragment (collective, in order),
    // each with its store and aggregator; this one keeps none.
    std::vector<std::size_t> counts;
    for (const TensorView& p : st.params) counts.push_back(static_cast<std::size_t>(p.numel()));
    const auto cuts = local_sgd_detail::fragment_cuts(counts, options.fragments);
    for (int f = 0; f < options.fragments; ++f) {
      PartialLocalSgdOptions one = options;
      one.fragments = 1;
      one.warmup_steps = 0;
      one.name = fmt::format("{}.f{}", options.name, f);
      std::vector<TensorView> mine(st.params.begin() + static_cast<std::ptrdiff_t>(cuts[f]),
                                   st.params.begin() + static_cast<std::ptrdiff_t>(cuts[f + 1]));
      st.parts.push_back(std::make_unique<PartialLocalSgd>(one, std::move(mine)));
      st.parts.back()->state_->fragment_label = fmt::format(" of fragment {}", f);
      st.offsets.push_back((f + 1) * options.period / options.fragments % options.period);
    }
    return;
  }
  // A replacement rank (GYRE_ELASTIC_RESPAWN) joins survivors that are in
  // their recovery: they open the new store after the State's broadcasts
  // (add_to's sync callback), and so does this rank, in its first sync.
  if (!is_replacement()) st.open_store();
}

// Collective over the set as it is now: the store holding this rank's
// parameters as the model (the set's first rank's are registered), its
// version 0 adopted, and the aggregator on the set's first rank.
void PartialLocalSgd::State::open_store() {
  ranks = process_set_ranks(options.process_set);  // throws for an unknown set
  const int world = rank();
  const auto mine = std::find(ranks.begin(), ranks.end(), world);
  if (mine == ranks.end()) {
    throw InvalidArgument(fmt::format("PartialLocalSgd: rank {} is not in process set {}", world,
                                      options.process_set));
  }
  n = static_cast<int>(ranks.size());
  me = static_cast<int>(mine - ranks.begin());
  posted_at = {n};
  meta_at = {n};
  posted.assign(static_cast<std::size_t>(posted_at.size()), 0);
  seen_rejected = 0;
  bool any64 = false;
  for (const TensorView& p : params) any64 = any64 || p.dtype == DataType::kFloat64;
  const DataType wire = any64 ? DataType::kFloat64 : DataType::kFloat32;

  store = std::make_unique<PartialStore>(options, timeout_s, wire, n, flatten(params));
  pending_base.reset();
  at_post.clear();
  std::vector<double> model;
  const std::int64_t v = store->pull_model(model);
  version = 0;
  adopt(model, v);
  if (me == 0) aggregator = std::make_unique<Aggregator>(*this);
}

void PartialLocalSgd::State::check_store() const {
  if (!store) {
    throw StateError(
        "PartialLocalSgd: no store: after a member's failure, and on a replacement rank, the "
        "store is opened by the sync of the elastic State it was added to "
        "(PartialLocalSgd::add_to, elastic::run)");
  }
}

// Not collective: the aggregator stopped and the store dropped, as after a
// member's death (its calls fail on every member from then on).
void PartialLocalSgd::State::drop_store() {
  aggregator.reset();  // stops and joins its thread, which uses the store
  store.reset();
  // A round in flight (a failure inside its wait) went with the store: the
  // next store's rounds count from 0.
  pending_base.reset();
  at_post.clear();
}

PartialLocalSgd::~PartialLocalSgd() = default;
PartialLocalSgd::PartialLocalSgd(PartialLocalSgd&&) noexcept = default;
PartialLocalSgd& PartialLocalSgd::operator=(PartialLocalSgd&&) noexcept = default;

PartialLocalSgd::State::~State() { stop_aggregator(); }

void PartialLocalSgd::State::stop_aggregator() {
  if (aggregator) aggregator->stop();
}

std::vector<std::int64_t> PartialLocalSgd::State::meta() const {
  if (final_meta) return *final_meta;  // closed: what the aggregator left
  check_store();
  return store->pull_ints(store->meta_name());
}

// Polls <name>.meta until `ready` holds, bounded by timeout_s; raises the
// aggregator's failure as soon as it is published.
template <typename Ready>
std::vector<std::int64_t> PartialLocalSgd::State::wait(Ready ready, const std::string& what) const {
  const auto start = Clock::now();
  Backoff backoff;
  while (true) {
    if (!final_meta) store->check_members();  // the meta may be this rank's own shard
    std::vector<std::int64_t> m = meta();
    if (m[MetaLayout::kFailed] != 0) {
      throw StateError(fmt::format(
          "PartialLocalSgd: the aggregator on rank {} failed (its error is in its log); rank {} "
          "was waiting for {}",
          ranks.front(), ranks[static_cast<std::size_t>(me)], what));
    }
    if (ready(m)) return m;
    if (core::partial::seconds_since(start) > timeout_s) {
      throw TimeoutError(fmt::format(
          "PartialLocalSgd: rank {} waited {:g} s for {} (the aggregator runs on rank {})",
          ranks[static_cast<std::size_t>(me)], timeout_s, what, ranks.front()));
    }
    backoff.nap();
  }
}

// The model of round `v` into the parameters; θ_synced as they hold it (a
// float32 parameter rounds the model's value); one commit per round moved.
void PartialLocalSgd::State::adopt(const std::vector<double>& value, std::int64_t v) {
  std::vector<double> now;
  if (!at_post.empty()) now = flatten(params);
  unflatten(value, params);
  synced = flatten(params);
  if (!at_post.empty()) {
    // Under a sync delay: the inner steps since the post stay on top of the
    // round's model (LocalSgd's default merge).
    for (std::size_t k = 0; k < now.size(); ++k) now[k] = synced[k] + (now[k] - at_post[k]);
    unflatten(now, params);
  }
  if (options.commit && options.process_set == kGlobalProcessSet) {
    for (std::int64_t k = version; k < v; ++k) commit_step();
  }
  version = std::max(version, v);
  rounds_total = rounds_before + version;
}

void PartialLocalSgd::State::check_rejections(const std::vector<std::int64_t>& m) {
  const std::int64_t rejected = m[static_cast<std::size_t>(meta_at.rejected(me))];
  if (rejected > seen_rejected) {
    log.warn("PartialLocalSgd: rank {}: {} contribution(s) rejected as more than {} round(s) "
             "stale; it continues from the current model (round {})",
             ranks[static_cast<std::size_t>(me)], rejected - seen_rejected,
             options.max_staleness, rounds_total);
    seen_rejected = rejected;
  }
}

bool PartialLocalSgd::step() {
  State& st = *state_;
  ++st.local_steps;
  if (st.local_steps <= st.options.warmup_steps) {
    round();
    return true;
  }
  // Unfragmented, this State is the one fragment, its rounds at offset 0.
  std::vector<State*> parts;
  for (auto& p : st.parts) parts.push_back(p->state_.get());
  if (parts.empty()) parts.push_back(&st);
  // Rounds due now complete before new ones start (a fragment's next round
  // starts a period after its last, after sync_delay < period).
  bool adopted = false;
  for (State* ps : parts) {
    ps->local_steps = st.local_steps;
    if (ps->pending_base && ps->due <= ps->local_steps) {
      ps->finish();
      adopted = true;
    }
  }
  for (std::size_t f = 0; f < parts.size(); ++f) {
    const int offset = st.offsets.empty() ? 0 : st.offsets[f];
    if (st.local_steps % st.options.period != offset) continue;
    parts[f]->post();
    if (st.options.sync_delay == 0) {
      parts[f]->finish();
      adopted = true;
    }
  }
  return adopted;
}

void PartialLocalSgd::round() {
  State& st = *state_;
  if (st.closed) throw StateError("PartialLocalSgd: round() after close()");
  if (st.parts.empty()) {
    st.finish();
    st.post();
    st.finish();
    return;
  }
  for (auto& p : st.parts) p->state_->finish();
  for (auto& p : st.parts) {
    p->state_->local_steps = st.local_steps;
    p->state_->post();
    p->state_->finish();
  }
}

void PartialLocalSgd::State::post() {
  if (closed) throw StateError("PartialLocalSgd: a round after close()");
  check_store();
  PartialStore& st_store = *store;
  const std::int64_t already = posted[static_cast<std::size_t>(posted_at.count(me))];
  // The mailbox is free once the aggregator has consumed the last one.
  const auto consumed_at = static_cast<std::size_t>(meta_at.consumed(me));
  wait([&](const auto& meta) { return meta[consumed_at] >= already; },
       "its previous contribution to be consumed");

  // Into an empty mailbox (0 + x = x exactly): θ_synced − θ_local, then the
  // round it starts from + 1, so that an empty mailbox reads as none.
  std::vector<double> local = flatten(params);
  std::vector<double> contribution(local.size());
  for (std::size_t k = 0; k < local.size(); ++k) contribution[k] = synced[k] - local[k];
  contribution.push_back(static_cast<double>(version + 1));
  st_store.add(st_store.slot_name(me), contribution);
  std::vector<std::int64_t> delta(posted.size(), 0);
  delta[static_cast<std::size_t>(posted_at.count(me))] = 1;
  const auto base_at = static_cast<std::size_t>(posted_at.base(me));
  delta[base_at] = version - posted[base_at];
  st_store.add_ints(st_store.posted_name(), delta);
  for (std::size_t k = 0; k < delta.size(); ++k) posted[k] += delta[k];
  pending_base = version;
  due = local_steps + options.sync_delay;
  if (options.sync_delay > 0) at_post = std::move(local);
}

void PartialLocalSgd::State::finish() {
  if (!pending_base) return;
  const std::int64_t base = *pending_base;
  const auto m = wait([&](const auto& meta) { return meta[MetaLayout::kRounds] > base; },
                      fmt::format("round {}{} to close", base + 1, fragment_label));
  if (m[static_cast<std::size_t>(meta_at.merged_round(me))] != base + 1) {
    // Round base + 1 closed without this contribution.
    ++rounds_late;
    log.info("PartialLocalSgd: rank {} is late: {} round(s){} closed since round {}, which its "
             "contribution started from; it goes into a later one or is rejected",
             ranks[static_cast<std::size_t>(me)], m[MetaLayout::kRounds] - base, fragment_label,
             base);
  }
  std::vector<double> model;
  const std::int64_t v = store->pull_model(model);
  adopt(model, v);
  pending_base.reset();
  at_post.clear();
  check_rejections(meta());
}

void PartialLocalSgd::close() {
  State& st = *state_;
  if (st.closed) return;
  if (!st.parts.empty()) {
    st.closed = true;
    // Each fragment's rounds in flight complete in its own close(), in the
    // same order on every rank (each close is collective, so every one is
    // closed whatever an earlier one threw).
    std::exception_ptr first;
    for (auto& p : st.parts) {
      try {
        p->close();
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    if (first) std::rethrow_exception(first);
    return;
  }
  st.check_store();
  st.closed = true;
  PartialStore& store = *st.store;
  try {
    st.finish();  // this rank's round in flight (sync_delay > 0)
    std::vector<std::int64_t> delta(st.posted.size(), 0);
    delta[static_cast<std::size_t>(st.posted_at.stopped(st.me))] = 1;
    store.add_ints(store.posted_name(), delta);
    const auto m = st.wait([](const auto& meta) { return meta[MetaLayout::kFinished] == 1; },
                           "the aggregator to finish");
    std::vector<double> model;
    const std::int64_t version = store.pull_model(model);
    st.adopt(model, version);
    st.check_rejections(m);
    st.final_meta = m;
  } catch (...) {
    // The others close the store too (collective), whatever happened here.
    st.stop_aggregator();
    try {
      store.close();
    } catch (const std::exception& e) {
      st.log.warn("PartialLocalSgd: closing the store after an error failed too: {}", e.what());
    }
    throw;
  }
  st.stop_aggregator();  // it has finished: a join
  store.close();
}

void PartialLocalSgd::add_to(elastic::State& state) {
  State& st = *state_;
  const PartialLocalSgdOptions& o = st.options;
  if (o.process_set != kGlobalProcessSet) {
    throw InvalidArgument(fmt::format(
        "PartialLocalSgd::add_to: the PartialLocalSgd is on process set {}; a recovery drops "
        "every process set, so an elastic PartialLocalSgd is on the global one",
        o.process_set));
  }
  if (o.commit) {
    throw InvalidArgument(
        "PartialLocalSgd::add_to: this PartialLocalSgd commits its rounds itself (.commit = "
        "true); with an elastic State the State's commit() is the round's commit: construct it "
        "with .commit = false and call state.commit() after each step() that ran a round");
  }
  if (st.closed) throw StateError("PartialLocalSgd::add_to after close()");
  // The counters go back to the commit with the job's parameters, and come
  // from the sync's root after a recovery; θ_synced is the parameters as
  // they were when the round was adopted, which the State restores.
  // Streaming: the steps are this State's, the rounds each fragment's.
  state.add(o.name + ".local_steps", &st.local_steps, DataType::kInt64, 1);
  // Stable: each PartialLocalSgd holds its State by pointer, also when moved.
  std::vector<State*> parts;
  for (auto& p : st.parts) parts.push_back(p->state_.get());
  if (parts.empty()) parts.push_back(&st);
  for (State* ps : parts) {
    state.add(ps->options.name + ".rounds", &ps->rounds_total, DataType::kInt64, 1);
    state.add(ps->options.name + ".rounds_late", &ps->rounds_late, DataType::kInt64, 1);
  }
  state.on_failure([parts](const RankFailedError&) {
    // The stores are over the old world: their calls fail on every member.
    // A fragment's round in flight goes with its store.
    for (State* ps : parts) ps->drop_store();
  });
  state.on_sync([parts] {
    // After a recovery's sync (and a replacement's first): the parameters
    // and counters are the sync root's commit; a store per fragment over the
    // ranks now holds that model, its rounds counted on from there (in
    // fragment order on every rank: each opening is collective). The outer
    // optimizer's momentum was the old aggregator's alone: it restarts.
    // run()'s first sync on the other ranks finds the stores open.
    for (State* ps : parts) {
      if (ps->store) continue;
      ps->rounds_before = ps->rounds_total;
      ps->open_store();
    }
  });
}

}  // namespace gyre
