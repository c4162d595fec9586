// GYRE_AUTOTUNE's tuner (backends/hierarchical/autotune.h): the order of its
// trials, and one decision on every rank from the slowest rank's times even
// where each rank's own times point the other way. Ranks as threads over a
// LocalTransport world; the "calls" are fed times, not run.
#include <catch2/catch.hpp>

#include <vector>

#include "backends/hierarchical/autotune.h"
#include "gyre/collectives/local_transport.h"
#include "transport_ranks.h"

using gyre::core::AllreduceTuner;
using gyre::core::TunedAllreduce;
namespace transport = gyre::transport;

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

// Runs fn(rank, tuner, transport) on n rank threads.
template <typename F>
void on_ranks(int n, F&& fn) {
  gyre::core::test::on_transport_ranks(n, [&](int r, transport::LocalTransport& t) {
    AllreduceTuner tuner(3);
    fn(r, tuner, t);
  });
}

// One class's trials (a warm-up, then `blocks` blocks of A B B A) at `bytes`, each "taking" flat_s or hier_s on
// this rank; returns the forms run and what every later call runs.
struct Trials {
  std::vector<bool> ran;  // hierarchical?
  bool after = false;
  std::vector<TunedAllreduce> decisions;
};
Trials run_class(AllreduceTuner& tuner, transport::Transport& t, std::size_t bytes, bool model,
                 double flat_s, double hier_s, int blocks = 1) {
  Trials out;
  for (int i = 0; i < 1 + blocks * AllreduceTuner::kBlockTrials; ++i) {
    const bool h = tuner.choose(bytes, model);
    out.ran.push_back(h);
    tuner.record(t, bytes, h, h ? hier_s : flat_s);
  }
  out.after = tuner.choose(bytes, model);
  out.decisions = tuner.decisions();
  return out;
}

}  // namespace

TEST_CASE("autotune: trials run a warm-up, model, other, other, model; then the faster for good",
          "[autotune]") {
  std::vector<Trials> got(2);
  std::vector<int> later(2, -1), agreed_again(2, -1);  // Catch2 checks on the main thread
  on_ranks(2, [&](int r, AllreduceTuner& tuner, transport::Transport& t) {
    // The model says hierarchical; flat is twice as fast on both ranks.
    got[static_cast<std::size_t>(r)] = run_class(tuner, t, 4 * kMiB, true, 0.01, 0.02);
    // Later calls of the class, of other sizes in it too, stay flat and
    // run no more agreements (they would wait for a peer that sends none).
    later[static_cast<std::size_t>(r)] = tuner.choose(4 * kMiB + 4096, true);
    agreed_again[static_cast<std::size_t>(r)] =
        tuner.record(t, 4 * kMiB + 4096, false, 1.0).has_value();
  });
  CHECK(later == std::vector<int>{0, 0});
  CHECK(agreed_again == std::vector<int>{0, 0});
  for (const Trials& g : got) {
    CHECK(g.ran == std::vector<bool>{true, true, false, false, true});
    CHECK_FALSE(g.after);
    REQUIRE(g.decisions.size() == 1);
    const TunedAllreduce& d = g.decisions[0];
    CHECK(d.min_bytes == 4 * kMiB);
    CHECK(d.model_hierarchical);
    CHECK_FALSE(d.hierarchical);
    // Seconds per MiB of each form: 0.01 s for 4 MiB, 0.02 s for 4 MiB.
    CHECK(d.flat_s_per_mib == Approx(0.0025));
    CHECK(d.hierarchical_s_per_mib == Approx(0.005));
  }
}

TEST_CASE("autotune: every rank takes the slowest rank's figures, whatever its own say",
          "[autotune]") {
  // 3 ranks (the agreement's dissemination at a size that is not a power
  // of two). Rank 0 alone sees hierarchical faster; rank 2 sees it the
  // slower by far: the max over ranks is flat 3 s, hierarchical 4 s.
  const double flat[3] = {2.0, 1.0, 3.0};
  const double hier[3] = {1.0, 0.5, 4.0};
  std::vector<Trials> got(3);
  on_ranks(3, [&](int r, AllreduceTuner& tuner, transport::Transport& t) {
    got[static_cast<std::size_t>(r)] = run_class(tuner, t, 64 * kMiB, false, flat[r], hier[r]);
  });
  for (const Trials& g : got) {
    CHECK_FALSE(g.after);
    REQUIRE(g.decisions.size() == 1);
    CHECK_FALSE(g.decisions[0].hierarchical);
    CHECK(g.decisions[0].flat_s_per_mib == Approx(3.0 / 64));
    CHECK(g.decisions[0].hierarchical_s_per_mib == Approx(4.0 / 64));
  }
  // The other way round: the slowest rank's hierarchical is now the faster.
  const double flat2[3] = {1.0, 5.0, 1.0};
  const double hier2[3] = {2.0, 1.0, 3.0};
  on_ranks(3, [&](int r, AllreduceTuner& tuner, transport::Transport& t) {
    got[static_cast<std::size_t>(r)] = run_class(tuner, t, 64 * kMiB, false, flat2[r], hier2[r]);
  });
  for (const Trials& g : got) CHECK(g.after);
}

TEST_CASE("autotune: classes are tuned apart; below 256 KiB and on a tie the model decides",
          "[autotune]") {
  // Per rank: below the tuned size with the model hierarchical, then flat;
  // an agreement there; 1 MiB's choice after its trials, 16 MiB's, 1 MiB's
  // again; the number of classes decided.
  std::vector<std::vector<int>> got(2);
  on_ranks(2, [&](int r, AllreduceTuner& tuner, transport::Transport& t) {
    auto& g = got[static_cast<std::size_t>(r)];
    // Below the tuned sizes: the model's choice, no trial, no agreement.
    g.push_back(tuner.choose(AllreduceTuner::kTuneMinBytes - 1, true));
    g.push_back(tuner.choose(AllreduceTuner::kTuneMinBytes - 1, false));
    g.push_back(tuner.record(t, AllreduceTuner::kTuneMinBytes - 1, true, 9.0).has_value());
    // 1 MiB: hierarchical faster; 16 MiB: a tie, after kMaxBlocks blocks,
    // keeps the model's flat.
    g.push_back(run_class(tuner, t, kMiB, false, 0.02, 0.01).after);
    g.push_back(run_class(tuner, t, 16 * kMiB, false, 0.5, 0.5, AllreduceTuner::kMaxBlocks).after);
    g.push_back(tuner.choose(kMiB, false));
    g.push_back(static_cast<int>(tuner.decisions().size()));
  });
  for (const auto& g : got) CHECK(g == std::vector<int>{1, 0, 0, 1, 0, 1, 2});
}

TEST_CASE("autotune: the warm-up is not counted; each form's mean of two decides",
          "[autotune]") {
  // The model says flat. First: the warm-up (flat) takes 100 s, flat's
  // trials 1 s each, hierarchical's 2 s: flat (counting the warm-up would
  // choose hierarchical). Then, at 4 MiB: flat's trials 1 s and 9 s (one
  // slow call), hierarchical's 2 s and 2 s: the means, 5 s against 2 s,
  // choose hierarchical (the best of two would choose flat).
  const double first[AllreduceTuner::kTrials] = {100.0, 1.0, 2.0, 2.0, 1.0};
  const double second[AllreduceTuner::kTrials] = {0.5, 1.0, 2.0, 2.0, 9.0};
  std::vector<std::vector<int>> got(2);
  std::vector<std::vector<TunedAllreduce>> decided(2);
  on_ranks(2, [&](int r, AllreduceTuner& tuner, transport::Transport& t) {
    auto& g = got[static_cast<std::size_t>(r)];
    for (std::size_t bytes : {kMiB, 4 * kMiB}) {
      const double* times = bytes == kMiB ? first : second;
      for (int i = 0; i < AllreduceTuner::kTrials; ++i) {
        const bool h = tuner.choose(bytes, false);
        g.push_back(h);
        tuner.record(t, bytes, h, times[i] * static_cast<double>(bytes / kMiB));
      }
      g.push_back(tuner.choose(bytes, false));
    }
    decided[static_cast<std::size_t>(r)] = tuner.decisions();
  });
  for (int r = 0; r < 2; ++r) {
    CHECK(got[static_cast<std::size_t>(r)] == std::vector<int>{0, 0, 1, 1, 0, 0,  //
                                                               0, 0, 1, 1, 0, 1});
    const auto& d = decided[static_cast<std::size_t>(r)];
    REQUIRE(d.size() == 2);
    CHECK(d[0].flat_s_per_mib == Approx(1.0));
    CHECK(d[0].hierarchical_s_per_mib == Approx(2.0));
    CHECK(d[1].flat_s_per_mib == Approx(5.0));
    CHECK(d[1].hierarchical_s_per_mib == Approx(2.0));
  }
}

TEST_CASE("autotune: forms closer than the decisive gap get another block, up to the last",
          "[autotune]") {
  // Block 1: flat 1.0 s, hierarchical 1.05 s a call (5 % apart): no choice
  // yet. Block 2: flat 1.0, hierarchical 2.0: the sums (4.0 against 6.1)
  // decide flat, from 4 calls of each form. Then at 4 MiB forms 2 % apart
  // in every block: chosen after kMaxBlocks blocks all the same.
  std::vector<std::vector<int>> got(2);
  std::vector<std::vector<TunedAllreduce>> decided(2);
  on_ranks(2, [&](int r, AllreduceTuner& tuner, transport::Transport& t) {
    auto& g = got[static_cast<std::size_t>(r)];
    const double hier_by_block[2] = {1.05, 2.0};
    for (int b = -1; b < 2; ++b) {  // the warm-up, then two blocks
      const int calls = b < 0 ? 1 : AllreduceTuner::kBlockTrials;
      for (int i = 0; i < calls; ++i) {
        const bool h = tuner.choose(kMiB, true);
        g.push_back(h);
        tuner.record(t, kMiB, h, h ? hier_by_block[std::max(b, 0)] : 1.0);
      }
      g.push_back(static_cast<int>(tuner.decisions().size()));
    }
    g.push_back(tuner.choose(kMiB, true));
    run_class(tuner, t, 4 * kMiB, true, 1.0, 1.02, AllreduceTuner::kMaxBlocks);
    decided[static_cast<std::size_t>(r)] = tuner.decisions();
  });
  for (int r = 0; r < 2; ++r) {
    // The warm-up (model: hierarchical), decisions 0; A B B A, 0; A B B A, 1;
    // then flat.
    CHECK(got[static_cast<std::size_t>(r)] ==
          std::vector<int>{1, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 1, 0});
    const auto& d = decided[static_cast<std::size_t>(r)];
    REQUIRE(d.size() == 2);
    CHECK(d[0].trials == 4);
    CHECK_FALSE(d[0].hierarchical);
    CHECK(d[0].flat_s_per_mib == Approx(1.0));
    CHECK(d[0].hierarchical_s_per_mib == Approx(6.1 / 4));
    CHECK(d[1].trials == 2 * AllreduceTuner::kMaxBlocks);
    CHECK_FALSE(d[1].hierarchical);  // hierarchical 2 % slower: flat, after the last block
  }
}
