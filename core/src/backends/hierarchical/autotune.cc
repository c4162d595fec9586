// AllreduceTuner (autotune.h).
#include "backends/hierarchical/autotune.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "gyre/collectives/algorithms.h"

namespace gyre::core {

namespace {

// The order of the trials: the warm-up (0), then blocks of A B B A, A
// being the model's choice.
bool trial_runs_model(int trial) {
  if (trial == 0) return true;
  const int i = (trial - 1) % AllreduceTuner::kBlockTrials;
  return i == 0 || i == AllreduceTuner::kBlockTrials - 1;
}

// Seconds per byte as a word that orders like the double: both are
// non-negative, whose IEEE-754 bits compare as unsigned integers do.
std::uint64_t as_word(double v) {
  if (!(v >= 0)) v = 0;
  std::uint64_t w;
  std::memcpy(&w, &v, sizeof w);
  return w;
}
double from_word(std::uint64_t w) {
  double v;
  std::memcpy(&v, &w, sizeof v);
  return v;
}

}  // namespace

int AllreduceTuner::class_of(std::size_t bytes) {
  return static_cast<int>(std::bit_width(bytes)) - 1;
}

bool AllreduceTuner::choose(std::size_t bytes, bool model_hierarchical) {
  if (bytes < kTuneMinBytes) return model_hierarchical;
  const auto k = static_cast<std::size_t>(class_of(bytes));
  if (classes_.size() <= k) classes_.resize(k + 1);
  Class& c = classes_[k];
  if (c.decided) return c.hierarchical;
  // The class's first call fixes which form is A: calls of one class may
  // differ in size, and so in the model's choice, but every rank sees the
  // same first call.
  if (c.trials == 0) c.model_hierarchical = model_hierarchical;
  return trial_runs_model(c.trials) ? c.model_hierarchical : !c.model_hierarchical;
}

std::optional<TunedAllreduce> AllreduceTuner::record(transport::Transport& world,
                                                     std::size_t bytes, bool hierarchical,
                                                     double seconds) {
  if (bytes < kTuneMinBytes) return std::nullopt;
  Class& c = classes_[static_cast<std::size_t>(class_of(bytes))];
  if (c.decided) return std::nullopt;
  // The warm-up's time is not counted: a class's first call pays for what
  // its size touches first (pages of fresh buffers, a new cache entry).
  // The sum of each form's two, not the best: the expected time decides,
  // a form's slow calls included (the best would favour the form whose
  // times vary more).
  if (c.trials > 0) c.s_per_b[hierarchical ? 1 : 0] += seconds / static_cast<double>(bytes);
  ++c.trials;
  if (c.trials == 1 || (c.trials - 1) % kBlockTrials != 0) return std::nullopt;
  // A block is complete. The slowest rank's sums decide: a form is as fast
  // as its slowest rank.
  std::array<std::uint64_t, 2> words = {as_word(c.s_per_b[0]), as_word(c.s_per_b[1])};
  collectives::DisseminationOptions o;
  o.tag = tag_;
  collectives::dissemination_allreduce(
      world, words,
      [](std::span<std::uint64_t> acc, std::span<const std::uint64_t> in) {
        for (std::size_t i = 0; i < acc.size(); ++i) acc[i] = std::max(acc[i], in[i]);
      },
      o);
  const double flat = from_word(words[0]), hier = from_word(words[1]);
  const int blocks = (c.trials - 1) / kBlockTrials;
  // Forms closer than kDecisiveGap: another block, up to kMaxBlocks (every
  // rank has the same figures, so every rank goes on alike).
  const double gap = std::abs(hier - flat) / std::max(std::min(hier, flat), 1e-300);
  if (gap < kDecisiveGap && blocks < kMaxBlocks) return std::nullopt;
  c.decided = true;
  c.hierarchical = hier == flat ? c.model_hierarchical : hier < flat;
  TunedAllreduce t;
  t.min_bytes = std::size_t{1} << class_of(bytes);
  t.trials = 2 * blocks;  // of each form
  t.flat_s_per_mib = flat / t.trials * (1 << 20);
  t.hierarchical_s_per_mib = hier / t.trials * (1 << 20);
  t.model_hierarchical = c.model_hierarchical;
  t.hierarchical = c.hierarchical;
  std::lock_guard<std::mutex> lock(mu_);
  decided_.push_back(t);
  return t;
}

std::vector<TunedAllreduce> AllreduceTuner::decisions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return decided_;
}

}  // namespace gyre::core
