// PartialLocalSgd's aggregator (partial_local_sgd_state.h): the thread on the
// set's first rank that decides when a round closes, merges or rejects each
// contribution by its lag, steps the outer optimizer, and publishes the
// model and the counters in the store. Every failure on this thread is
// published in <name>.meta, so that every rank's next wait raises it.
#include <exception>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "training/partial_local_sgd_state.h"

namespace gyre::core::partial {

Aggregator::Aggregator(const PartialLocalSgd::State& owner)
    : o_(owner),
      synced_(owner.store->np(), 0.0),
      meta_(static_cast<std::size_t>(owner.meta_at.size()), 0),
      consumed_(static_cast<std::size_t>(owner.n), 0) {
  if (o_.options.outer.momentum > 0) momentum_.assign(synced_.size(), 0.0);
  thread_ = std::thread([this] { run(); });
}

Aggregator::~Aggregator() { stop(); }

void Aggregator::stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

std::vector<PartialLocalSgdRound> Aggregator::history() const {
  std::lock_guard<std::mutex> lock(history_mu_);
  return history_;
}

void Aggregator::run() {
  try {
    loop();
    if (stop_.load()) return;  // stopped by the owner: nobody waits for "finished"
    std::vector<std::int64_t> delta(meta_.size(), 0);
    delta[MetaLayout::kFinished] = 1;
    push_meta(delta);
  } catch (const RankFailedError& e) {
    // A member died: every rank's own store calls raise it too (an elastic
    // run then recovers and opens a new store with a new aggregator).
    // Publishing a failure here could reach a rank before its own store
    // has seen the death, and turn its RankFailedError into a StateError.
    o_.log.info("PartialLocalSgd: the aggregator stops: {}", e.what());
  } catch (const std::exception& e) {
    // Every rank must hear of it, not only this thread.
    o_.log.error("PartialLocalSgd: the aggregator failed: {}", e.what());
    try {
      std::vector<std::int64_t> delta(meta_.size(), 0);
      delta[MetaLayout::kFailed] = 1;
      push_meta(delta);
    } catch (const std::exception& again) {
      o_.log.error("PartialLocalSgd: the aggregator could not publish its failure: {}",
                   again.what());
    }
  }
}

void Aggregator::loop() {
  const int n = o_.n;
  const PostedLayout& at = o_.posted_at;
  // Since the first on-time contribution of the round now open, and since a
  // contribution has been pending with no round closing (valid when set).
  bool has_first_on_time = false, waiting = false;
  Clock::time_point first_on_time{}, waiting_since{};
  Backoff backoff;
  while (!stop_.load()) {
    const std::vector<std::int64_t> posted = o_.store->pull_ints(o_.store->posted_name());
    const std::int64_t version = meta_[MetaLayout::kRounds];
    std::vector<int> pending;
    bool everyone = true;  // every rank still training has a contribution pending
    bool any_active = false, any_on_time = false;
    for (int i = 0; i < n; ++i) {
      const bool is_pending = posted[at.count(i)] > consumed_[static_cast<std::size_t>(i)];
      const bool active = posted[at.stopped(i)] == 0;
      if (is_pending) pending.push_back(i);
      if (is_pending && posted[at.base(i)] == version) any_on_time = true;
      if (active && !is_pending) everyone = false;
      any_active = any_active || active;
    }
    if (!any_active && pending.empty()) return;
    if (any_on_time && !has_first_on_time) {
      has_first_on_time = true;
      first_on_time = Clock::now();
    }
    const bool overdue =
        has_first_on_time && seconds_since(first_on_time) > o_.options.late_after_s;
    if (!pending.empty() && (everyone || overdue)) {
      close_round(pending);
      has_first_on_time = waiting = false;
      backoff.reset();
      continue;
    }
    if (!pending.empty() && !waiting) {
      waiting = true;
      waiting_since = Clock::now();
    }
    if (waiting && seconds_since(waiting_since) > o_.timeout_s) {
      std::vector<int> silent;  // still training, nothing posted
      for (int i = 0; i < n; ++i) {
        const auto u = static_cast<std::size_t>(i);
        if (posted[at.stopped(i)] == 0 && posted[at.count(i)] <= consumed_[u]) {
          silent.push_back(o_.ranks[u]);
        }
      }
      throw TimeoutError(fmt::format(
          "PartialLocalSgd: no round {} could close for {:g} s (timeout_s): ranks {}, still "
          "training, posted nothing, and late_after_s ({:g} s) had not passed since an on-time "
          "contribution",
          version + 1, o_.timeout_s, fmt::join(silent, ", "), o_.options.late_after_s));
    }
    backoff.nap();
  }
}

// Takes every pending contribution out of its mailbox (emptied with its
// negation), merges those at most max_staleness rounds old, and closes a
// round with them if there is any.
void Aggregator::close_round(const std::vector<int>& pending) {
  const MetaLayout& at = o_.meta_at;
  PartialStore& store = *o_.store;
  const std::size_t np = store.np();
  const std::int64_t version = meta_[MetaLayout::kRounds];
  std::vector<std::string> names;
  for (int i : pending) names.push_back(store.slot_name(i));
  std::vector<std::vector<double>> slots;
  store.pull_many(names, slots);

  PartialLocalSgdRound record;
  std::vector<int> taken, late, rejected;  // indices in the set
  std::vector<double> pseudo_sum(np, 0.0);
  for (std::size_t p = 0; p < pending.size(); ++p) {
    const int i = pending[p];
    std::vector<double>& value = slots[p];
    const std::int64_t base = static_cast<std::int64_t>(value[np]) - 1;
    const int world = o_.ranks[static_cast<std::size_t>(i)];
    if (base < 0) {  // posted is pushed after the mailbox: a bug, not a race
      throw StateError(fmt::format(
          "PartialLocalSgd: rank {} posted a contribution but its mailbox is empty", world));
    }
    for (double& v : value) v = -v;
    store.add(names[p], value);  // empty again: x + (-x) = 0 exactly
    ++consumed_[static_cast<std::size_t>(i)];
    const std::int64_t lag = version - base;
    if (lag > o_.options.max_staleness) {
      rejected.push_back(i);
      record.rejected.push_back(world);
      o_.log.warn("PartialLocalSgd: rank {}'s contribution, made from round {}, is {} round(s) "
                  "old (max_staleness {}): rejected",
                  world, base, lag, o_.options.max_staleness);
      continue;
    }
    if (lag == 0) {
      record.merged.push_back(world);
    } else {
      late.push_back(i);
      record.late.push_back(world);
    }
    taken.push_back(i);
    for (std::size_t k = 0; k < np; ++k) pseudo_sum[k] -= value[k];  // value is negated
  }

  std::vector<std::int64_t> delta(meta_.size(), 0);
  auto at_index = [](int index) { return static_cast<std::size_t>(index); };
  for (int i : pending) delta[at_index(at.consumed(i))] = 1;
  if (!taken.empty()) {
    // θ_synced as the store holds it, stepped with the mean pseudo-gradient
    // (torch.optim.SGD's update, in float64), pushed as a difference.
    std::vector<double> model;
    store.pull(store.model_name(), model);
    synced_ = model;
    const OuterOptimizer& outer = o_.options.outer;
    const double scale = 1.0 / static_cast<double>(taken.size());
    for (std::size_t k = 0; k < np; ++k) {
      const double g = pseudo_sum[k] * scale;
      double d = g;
      if (!momentum_.empty()) {
        momentum_[k] = outer.momentum * momentum_[k] + g;
        d = outer.nesterov ? g + outer.momentum * momentum_[k] : momentum_[k];
      }
      synced_[k] -= outer.lr * d;
      model[k] = synced_[k] - model[k];
    }
    store.add(store.model_name(), model);
    delta[MetaLayout::kRounds] = 1;
    for (int i : taken) {
      delta[at_index(at.merged_round(i))] = version + 1 - meta_[at_index(at.merged_round(i))];
    }
    for (int i : late) delta[at_index(at.merged_late(i))] = 1;
    record.round = version + 1;
  }
  for (int i : rejected) delta[at_index(at.rejected(i))] = 1;
  push_meta(delta);
  o_.log.debug("PartialLocalSgd: round {} closed: merged [{}], late [{}], rejected [{}]",
               record.round, fmt::join(record.merged, ", "), fmt::join(record.late, ", "),
               fmt::join(record.rejected, ", "));
  std::lock_guard<std::mutex> lock(history_mu_);
  history_.push_back(std::move(record));
}

void Aggregator::push_meta(const std::vector<std::int64_t>& delta) {
  o_.store->add_ints(o_.store->meta_name(), delta);
  for (std::size_t k = 0; k < meta_.size(); ++k) meta_[k] += delta[k];
}

}  // namespace gyre::core::partial
