// PartialLocalSgd's accessors (gyre/partial_local_sgd.h): its counters, and
// what the aggregators have published in the store (rounds, merged and
// rejected contributions), per fragment or summed over the fragments.
#include <fmt/format.h>

#include "training/partial_local_sgd_state.h"

namespace gyre {

using core::partial::MetaLayout;

std::int64_t PartialLocalSgd::local_steps() const { return state_->local_steps; }
std::int64_t PartialLocalSgd::version() const {
  if (state_->parts.empty()) return state_->rounds_total;
  std::int64_t sum = 0;
  for (const auto& p : state_->parts) sum += p->version();
  return sum;
}
std::int64_t PartialLocalSgd::rounds_late() const {
  std::int64_t sum = state_->rounds_late;
  for (const auto& p : state_->parts) sum += p->rounds_late();
  return sum;
}
const PartialLocalSgdOptions& PartialLocalSgd::options() const { return state_->options; }

std::vector<std::int64_t> PartialLocalSgd::fragment_versions() const {
  if (state_->parts.empty()) return {state_->rounds_total};
  std::vector<std::int64_t> out;
  for (const auto& p : state_->parts) out.push_back(p->version());
  return out;
}

PartialLocalSgdCounters PartialLocalSgd::counters() const {
  const State& st = *state_;
  if (!st.parts.empty()) {
    PartialLocalSgdCounters sum;
    for (const auto& p : st.parts) {
      const PartialLocalSgdCounters c = p->counters();
      sum.rounds += c.rounds;
      sum.merged_late += c.merged_late;
      sum.rejected += c.rejected;
      sum.rounds_late += c.rounds_late;
      sum.merged_late_by_rank.resize(c.merged_late_by_rank.size());
      sum.rejected_by_rank.resize(c.rejected_by_rank.size());
      for (std::size_t i = 0; i < c.merged_late_by_rank.size(); ++i) {
        sum.merged_late_by_rank[i] += c.merged_late_by_rank[i];
        sum.rejected_by_rank[i] += c.rejected_by_rank[i];
      }
    }
    return sum;
  }
  const std::vector<std::int64_t> m = st.meta();
  PartialLocalSgdCounters c;
  c.rounds = m[MetaLayout::kRounds];
  for (int i = 0; i < st.n; ++i) {
    c.merged_late_by_rank.push_back(m[static_cast<std::size_t>(st.meta_at.merged_late(i))]);
    c.rejected_by_rank.push_back(m[static_cast<std::size_t>(st.meta_at.rejected(i))]);
  }
  const auto mine = static_cast<std::size_t>(st.me);
  c.merged_late = c.merged_late_by_rank[mine];
  c.rejected = c.rejected_by_rank[mine];
  c.rounds_late = st.rounds_late;
  return c;
}

// The PartialLocalSgd of `fragment` (this one when unfragmented).
const PartialLocalSgd& PartialLocalSgd::fragment(int fragment) const {
  const State& st = *state_;
  const int count = st.parts.empty() ? 1 : static_cast<int>(st.parts.size());
  if (fragment < 0 || fragment >= count) {
    throw InvalidArgument(fmt::format("PartialLocalSgd: fragment {} of {}", fragment, count));
  }
  return st.parts.empty() ? *this : *st.parts[static_cast<std::size_t>(fragment)];
}

std::vector<std::int64_t> PartialLocalSgd::merged_rounds(int fragment) const {
  const State& st = *this->fragment(fragment).state_;
  const std::vector<std::int64_t> m = st.meta();
  std::vector<std::int64_t> out;
  for (int i = 0; i < st.n; ++i) {
    out.push_back(m[static_cast<std::size_t>(st.meta_at.merged_round(i))]);
  }
  return out;
}

std::vector<PartialLocalSgdRound> PartialLocalSgd::round_history(int fragment) const {
  const State& st = *this->fragment(fragment).state_;
  return st.aggregator ? st.aggregator->history() : std::vector<PartialLocalSgdRound>{};
}

}  // namespace gyre
