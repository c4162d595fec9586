// PartialLocalSgd (gyre/partial_local_sgd.h) under mpirun with 2 or 3 ranks:
// with every rank on time a round is the mean of the ranks' parameters
// (allgathered), identical on every rank, one commit each; DiLoCo's
// Nesterov outer step equals a reference that simulates every rank in one
// process; a straggler (the last rank sleeps 3 × late_after_s per step in
// its first round) does not hold the others, its late contribution is merged
// (max_staleness 10) or rejected (max_staleness 0) and counted, and after
// close() every rank holds the same model; waits end in TimeoutError or the
// aggregator's failure in StateError, never a hang; every step of a
// warm-up ends in a round; bad arguments are refused naming the problem; on
// a process set that leaves rank 0 out, the set's first rank aggregates and
// rounds are no commits; streaming (2 fragments, delays 0-2) with every rank
// on time equals LocalSgd's streaming, and a straggler's fragment rounds
// close without it. The model is a
// float32 tensor and a float64 one (so the store's tensors are float64).
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "gyre/gyre.h"
#include "gyre/elastic.h"
#include "gyre/local_sgd.h"
#include "gyre/partial_local_sgd.h"
#include "gyre/view.h"

#include "local_sgd_model.h"

using namespace gyre;
using namespace gyre::test_lsgd;

namespace {

// As the Model holds θ: elements 0..11 rounded to float32.
std::vector<double> as_held(std::vector<double> theta) {
  for (std::size_t k = 0; k < 12; ++k) theta[k] = static_cast<float>(theta[k]);
  return theta;
}

// Rank r's inner SGD step t on θ (local_sgd_model.h's gradient), as the
// Model would hold the result.
void inner_update(std::vector<double>& theta, int r, int t) {
  const std::vector<double> g = gradient(theta, r, t);
  for (std::size_t k = 0; k < theta.size(); ++k) theta[k] -= kLr * g[k];
  theta = as_held(std::move(theta));
}

// Whether every rank passed the same values.
bool same_on_every_rank(const std::string& name, const std::vector<double>& mine) {
  const auto all = gather(name, mine);
  for (const auto& v : all) {
    if (v != all.front()) return false;
  }
  return true;
}

std::vector<double> as_doubles(const std::vector<std::int64_t>& v) {
  return {v.begin(), v.end()};
}

}  // namespace

TEST_CASE("partial local SGD: with every rank on time a round is the mean of the ranks' models",
          "[mpi]") {
  Session s;
  Model m(rank());
  const std::uint64_t start = committed_steps();
  // late_after_s far away: every round closes when every rank has posted.
  PartialLocalSgd sgd({.period = 3, .late_after_s = 30, .timeout_s = 30, .name = "test.pls.mean"},
                      m.views());
  check_close(m.flat(), as_held(Model(0).flat()), 0, 0, "after construction (rank 0's model)");
  for (int t = 1; t <= 9; ++t) {
    inner_step(m, t);
    INFO(fmt::format("step {}", t));
    std::vector<double> mean;
    if (t % 3 == 0) {
      // Every rank holds the same round here (none closes without all of
      // them): the same committed steps, so a collective between them is fine.
      const auto locals = gather("test.pls.locals", m.flat());
      mean.assign(locals.front().size(), 0.0);
      for (const auto& l : locals) {
        for (std::size_t k = 0; k < mean.size(); ++k) mean[k] += l[k] / static_cast<double>(size());
      }
    }
    const bool ran = sgd.step();
    CHECK(ran == (t % 3 == 0));
    if (!ran) continue;
    // 1e-5: float32 parameters near 1, rounded when adopted.
    check_close(m.flat(), mean, 1e-5, 1e-12, fmt::format("round {}", t / 3));
    CHECK(same_on_every_rank("test.pls.after", m.flat()));
    CHECK(sgd.version() == t / 3);
    CHECK(committed_steps() == start + static_cast<std::uint64_t>(t / 3));
    CHECK(sgd.rounds_late() == 0);
  }
  CHECK(sgd.local_steps() == 9);
  sgd.close();
  const PartialLocalSgdCounters c = sgd.counters();
  CHECK(c.rounds == 3);
  CHECK(c.merged_late_by_rank == std::vector<std::int64_t>(static_cast<std::size_t>(size()), 0));
  CHECK(c.rejected_by_rank == std::vector<std::int64_t>(static_cast<std::size_t>(size()), 0));
  CHECK(sgd.merged_rounds() == std::vector<std::int64_t>(static_cast<std::size_t>(size()), 3));
  CHECK(sgd.version() == 3);
  if (rank() == 0) {
    const auto history = sgd.round_history();
    REQUIRE(history.size() == 3);
    for (const auto& r : history) CHECK(r.merged.size() == static_cast<std::size_t>(size()));
  } else {
    CHECK(sgd.round_history().empty());
  }
}

TEST_CASE("partial local SGD: DiLoCo's Nesterov step equals a one-process reference", "[mpi]") {
  Session s;
  Model m(rank());
  const OuterOptimizer outer = OuterOptimizer::diloco(0.7, 0.9, true);
  PartialLocalSgd sgd(
      {.period = 2, .late_after_s = 30, .outer = outer, .timeout_s = 30, .name = "test.pls.diloco"},
      m.views());

  // Every rank simulated here: each starts a round from θ_synced as its
  // parameters hold it, takes its two inner steps; g = mean of the
  // pseudo-gradients; buf = 0.9 buf + g; θ_synced −= 0.7 (g + 0.9 buf). Three
  // rounds, so the momentum of the first two enters the later ones.
  std::vector<double> synced = as_held(Model(0).flat()), buf(synced.size(), 0.0);
  for (int round = 1; round <= 3; ++round) {
    std::vector<double> g(synced.size(), 0.0);
    for (int r = 0; r < size(); ++r) {
      std::vector<double> theta = as_held(synced);
      for (int t = 2 * round - 1; t <= 2 * round; ++t) inner_update(theta, r, t);
      const std::vector<double> start = as_held(synced);
      for (std::size_t k = 0; k < g.size(); ++k) g[k] += (start[k] - theta[k]) / size();
    }
    for (std::size_t k = 0; k < synced.size(); ++k) {
      buf[k] = outer.momentum * buf[k] + g[k];
      synced[k] -= outer.lr * (g[k] + outer.momentum * buf[k]);
    }
    inner_step(m, 2 * round - 1);
    CHECK_FALSE(sgd.step());
    inner_step(m, 2 * round);
    REQUIRE(sgd.step());
    // 1e-5: float32 parameters near 1.
    check_close(m.flat(), synced, 1e-5, 1e-12, fmt::format("round {}", round));
    CHECK(sgd.version() == round);
  }
  sgd.close();
  check_close(m.flat(), synced, 1e-5, 1e-12, "after close()");
  CHECK(same_on_every_rank("test.pls.diloco.final", m.flat()));
}

TEST_CASE("partial local SGD: a straggler's rounds close without it; merged late or rejected",
          "[mpi]") {
  Session s;
  const int staleness = GENERATE(10, 0);
  INFO(fmt::format("max_staleness {}", staleness));
  constexpr double kLate = 0.25;
  const int slow = size() - 1;
  const std::uint64_t start = committed_steps();
  Model m(rank());
  PartialLocalSgd sgd({.period = 2,
                       .late_after_s = kLate,
                       .max_staleness = staleness,
                       .timeout_s = 30,
                       .name = "test.pls.straggler"},
                      m.views());
  for (int t = 1; t <= 6; ++t) {
    // The straggler: 3 × late_after_s per step in its first round.
    if (rank() == slow && t <= 2) {
      std::this_thread::sleep_for(std::chrono::duration<double>(3 * kLate));
    }
    inner_step(m, t);
    const bool ran = sgd.step();
    CHECK(ran == (t % 2 == 0));
    if (t != 2) continue;
    if (rank() == slow) {
      // Round 1 had closed without it when it came.
      CHECK(sgd.rounds_late() == 1);
      CHECK(sgd.version() >= 1);
    } else {
      CHECK(sgd.version() == 1);
      CHECK(sgd.merged_rounds().at(static_cast<std::size_t>(slow)) == 0);
    }
  }
  sgd.close();

  const PartialLocalSgdCounters c = sgd.counters();
  for (int r = 0; r < size(); ++r) {
    INFO(fmt::format("rank {}: merged late {}, rejected {}", r, c.merged_late_by_rank[r],
                     c.rejected_by_rank[r]));
    if (r != slow) {
      CHECK(c.merged_late_by_rank[r] == 0);
      CHECK(c.rejected_by_rank[r] == 0);
    } else if (staleness > 0) {
      CHECK(c.merged_late_by_rank[r] >= 1);
      CHECK(c.rejected_by_rank[r] == 0);
    } else {
      CHECK(c.merged_late_by_rank[r] == 0);
      CHECK(c.rejected_by_rank[r] >= 1);
    }
  }
  CHECK(c.rounds_late == (rank() == slow ? sgd.rounds_late() : 0));
  if (rank() == slow) CHECK(c.rounds_late >= 1);
  // One model, one round, one commit count and the same counters everywhere.
  CHECK(same_on_every_rank("test.pls.final", m.flat()));
  CHECK(same_on_every_rank("test.pls.version", {static_cast<double>(sgd.version())}));
  CHECK(committed_steps() == start + static_cast<std::uint64_t>(sgd.version()));
  CHECK(same_on_every_rank("test.pls.late", as_doubles(c.merged_late_by_rank)));
  CHECK(same_on_every_rank("test.pls.rejected", as_doubles(c.rejected_by_rank)));
  CHECK(c.rounds == sgd.version());
  if (rank() == 0) {
    // Round 1 merged every rank but the straggler; every contribution (3
    // per rank) was merged on time, merged late or rejected exactly once.
    const auto history = sgd.round_history();
    REQUIRE_FALSE(history.empty());
    CHECK(history.front().round == 1);
    CHECK(history.front().merged.size() == static_cast<std::size_t>(size() - 1));
    for (int r : history.front().merged) CHECK(r != slow);
    std::vector<int> seen(static_cast<std::size_t>(size()), 0);
    for (const auto& round : history) {
      for (const auto* ranks : {&round.merged, &round.late, &round.rejected}) {
        for (int r : *ranks) ++seen[static_cast<std::size_t>(r)];
      }
    }
    CHECK(seen == std::vector<int>(static_cast<std::size_t>(size()), 3));
  }
}

TEST_CASE("partial local SGD: a wait past timeout_s throws TimeoutError naming it", "[mpi]") {
  // Rank 0 closes at once, the others 1.5 s later: rank 0 gives up waiting
  // for the aggregator after 0.5 s (and stops it), so the others, when they
  // come, wait for an aggregator that never finishes, 0.5 s too.
  Session s;
  Model m(rank());
  PartialLocalSgd sgd({.period = 1, .late_after_s = 30, .timeout_s = 0.5, .name = "test.pls.wait"},
                      m.views());
  if (rank() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(sgd.close(), TimeoutError);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(waited < 20);  // bounded, not a hang (the store's barrier included)
  sgd.close();         // idempotent: nothing more
}

TEST_CASE("partial local SGD: the aggregator's failure reaches every rank as StateError",
          "[mpi]") {
  // Only rank 0 posts: with late_after_s far away no round can close, and
  // the aggregator gives up after timeout_s, publishing its failure.
  Session s;
  Model m(rank());
  PartialLocalSgd sgd(
      {.period = 1, .late_after_s = 1000, .timeout_s = 0.5, .name = "test.pls.fail"}, m.views());
  inner_step(m, 1);
  if (rank() == 0) {
    // Its own wait ends at the same bound: whichever comes first.
    try {
      sgd.step();
      FAIL("the round closed without the other ranks");
    } catch (const StateError& e) {
      CHECK_THAT(e.what(), Catch::Contains("the aggregator on rank 0 failed"));
    } catch (const TimeoutError& e) {
      CHECK_THAT(e.what(), Catch::Contains("round 1 to close"));
    }
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    CHECK_THROWS_WITH(sgd.step(), Catch::Contains("the aggregator on rank 0 failed"));
  }
  CHECK_THROWS_AS(sgd.close(), StateError);
}

TEST_CASE("partial local SGD: every step of the warm-up ends in a round", "[mpi]") {
  Session s;
  Model m(rank());
  PartialLocalSgd sgd({.period = 4, .warmup_steps = 3, .late_after_s = 30}, m.views());
  // Rounds after steps 1, 2, 3 (the warm-up), then 4 and 8.
  const std::vector<bool> rounds = {true, true, true, true, false, false, false, true, false};
  std::int64_t version = 0;
  for (int t = 1; t <= static_cast<int>(rounds.size()); ++t) {
    inner_step(m, t);
    INFO(fmt::format("step {}", t));
    const bool ran = rounds[static_cast<std::size_t>(t - 1)];
    CHECK(sgd.step() == ran);
    version += ran;
    CHECK(sgd.version() == version);
    CHECK(same_on_every_rank(fmt::format("test.pls.warmup.{}", t), m.flat()) == ran);
  }
  sgd.close();
}

TEST_CASE("partial local SGD: bad arguments are refused, naming the problem", "[mpi]") {
  Session s;
  Model m(rank());
  auto refused = [&](PartialLocalSgdOptions o, std::vector<TensorView> params,
                     const std::string& says) {
    INFO(fmt::format("expected a refusal saying '{}'", says));
    CHECK_THROWS_WITH(PartialLocalSgd(o, std::move(params)), Catch::Contains(says));
  };
  refused({.period = 0}, m.views(), "period must be >= 1, got 0");
  refused({.warmup_steps = -1}, m.views(), "warmup_steps must be >= 0, got -1");
  refused({.late_after_s = -1}, m.views(), "late_after_s must be >= 0");
  refused({.late_after_s = std::nan("")}, m.views(), "late_after_s must be >= 0");
  refused({.max_staleness = -1}, m.views(), "max_staleness must be >= 0, got -1");
  refused({.outer = {.lr = 0}}, m.views(), "lr must be positive");
  refused({.outer = {.momentum = 1.0}}, m.views(), "momentum must be in [0, 1)");
  refused({.outer = {.nesterov = true}}, m.views(), "Nesterov correction needs a momentum");
  refused({.name = ""}, m.views(), "name");
  refused({}, {}, "no parameters");
  std::vector<std::int32_t> ints(4);
  refused({}, {view(m.w), view(ints)}, "parameter 1 has dtype int32");
  refused({}, {view(m.w), view(m.b), view(m.w)}, "parameter 2 is the same buffer as parameter 0");
  TensorView gpu = view(m.w);
  gpu.device = Device{DeviceType::kCUDA, 0};
  refused({}, {gpu}, "parameter 0 is on cuda");
  refused({}, {TensorView{nullptr, DataType::kFloat32, {3}}}, "parameter 0 has a null buffer");
  std::vector<float> none;
  refused({}, {view(none)}, "hold no elements");
  refused({.period = 2, .fragments = 3}, m.views(), "fragments must be between 1 and period (2)");
  refused({.period = 4, .fragments = 3}, m.views(), "3 fragments but only 2 parameters");
  refused({.period = 2, .sync_delay = 2}, m.views(), "sync_delay must be >= 0 and < period (2)");
  CHECK_THROWS_AS(PartialLocalSgd({.max_staleness = -1}, m.views()), InvalidArgument);

  // Ranks whose models differ in size: the registration fails on every rank.
  std::vector<float> sized(static_cast<std::size_t>(4 + rank()));
  CHECK_THROWS_AS(PartialLocalSgd({.name = "test.pls.mismatch"}, {view(sized)}), MismatchError);
}

TEST_CASE("partial local SGD: on a process set, its first rank aggregates; no commits",
          "[mpi]") {
  Session s;
  if (size() < 3) return;  // a set that leaves rank 0 out needs three ranks
  const int set = add_process_set({1, 2});
  const std::uint64_t start = committed_steps();
  if (process_set_included(set)) {
    Model m(rank());
    PartialLocalSgd sgd({.period = 1, .late_after_s = 30, .process_set = set, .timeout_s = 30,
                         .name = "test.pls.set"},
                        m.views());
    check_close(m.flat(), as_held(Model(1).flat()), 0, 0, "after construction on the set {1, 2}");
    inner_step(m, 1);
    REQUIRE(sgd.step());
    sgd.close();
    const std::vector<double> mine = m.flat();
    Handle h = allgather_async("test.pls.set.after", view(mine), set);
    h.wait();
    std::vector<double> both(2 * mine.size());
    std::memcpy(both.data(), h.output().data.data(), sizeof(double) * both.size());
    const auto second = both.begin() + static_cast<std::ptrdiff_t>(mine.size());
    CHECK(std::equal(mine.begin(), mine.end(), both.begin()));
    CHECK(std::equal(mine.begin(), mine.end(), second));
    CHECK(sgd.version() == 1);
    CHECK(sgd.merged_rounds() == std::vector<std::int64_t>{1, 1});
    CHECK(sgd.round_history().size() == (rank() == 1 ? 1u : 0u));  // rank 1 aggregates
  }
  CHECK(committed_steps() == start);
  barrier();
  remove_process_set(set);
}

TEST_CASE("partial local SGD: an elastic State restores its counters, streaming too; add_to's "
          "refusals",
          "[mpi]") {
  // add_to() puts the step and round counters into an elastic State beside
  // the job's parameters (the reopening of the store after a member's death
  // is tests/elastic/partial_local_sgd_kill.cc's, under ULFM): restoring the
  // State after more steps and a round returns both, and a round from there
  // continues from the restored parameters.
  Session s;
  Model m(rank());
  PartialLocalSgd sgd({.period = 2, .late_after_s = 30, .timeout_s = 30,
                       .name = "test.pls.elastic", .commit = false},
                      m.views());
  elastic::State state;
  state.add("w", m.w);
  state.add("b", m.b);
  sgd.add_to(state);
  const std::uint64_t start = committed_steps();
  for (int t = 1; t <= 2; ++t) {
    inner_step(m, t);
    if (sgd.step()) state.commit();
  }
  REQUIRE(sgd.version() == 1);
  CHECK(committed_steps() == start + 1);  // the State's commit only
  const std::vector<double> committed = m.flat();
  for (int t = 3; t <= 5; ++t) {  // a round (step 4) and a step the restore undoes
    inner_step(m, t);
    sgd.step();
  }
  REQUIRE(sgd.version() == 2);
  REQUIRE(sgd.local_steps() == 5);
  state.restore();
  CHECK(sgd.version() == 1);
  CHECK(sgd.local_steps() == 2);
  CHECK(m.flat() == committed);
  sgd.close();
  CHECK(same_on_every_rank("test.pls.elastic.final", m.flat()));

  // Refusals: one that commits its rounds itself (two commits per round),
  // and one on a process set other than the global one (a rebuild drops it).
  PartialLocalSgd committing({.late_after_s = 30, .timeout_s = 30, .name = "test.pls.committing"},
                             m.views());
  elastic::State other;
  CHECK_THROWS_WITH(committing.add_to(other), Catch::Contains(".commit = false"));
  committing.close();
  // Streaming: each fragment's round counter goes back with the steps (a
  // commit inside fragment 1's sync delay; its round in flight completes).
  PartialLocalSgd streaming({.period = 2, .late_after_s = 30, .timeout_s = 30,
                             .name = "test.pls.streaming", .commit = false, .fragments = 2,
                             .sync_delay = 1},
                            m.views());
  elastic::State streamed;
  streamed.add("w", m.w);
  streamed.add("b", m.b);
  streaming.add_to(streamed);
  for (int t = 1; t <= 3; ++t) {  // fragment 0 at steps 1 and 3, fragment 1 at step 2
    inner_step(m, t);
    if (streaming.step()) streamed.commit();
  }
  REQUIRE(streaming.fragment_versions() == std::vector<std::int64_t>{1, 1});
  const std::vector<double> at_commit = m.flat();
  for (int t = 4; t <= 5; ++t) {
    inner_step(m, t);
    streaming.step();
  }
  REQUIRE(streaming.fragment_versions() == std::vector<std::int64_t>{2, 2});
  streamed.restore();
  CHECK(streaming.fragment_versions() == std::vector<std::int64_t>{1, 1});
  CHECK(streaming.version() == 2);
  CHECK(streaming.local_steps() == 3);
  CHECK(m.flat() == at_commit);
  streaming.close();
  CHECK(same_on_every_rank("test.pls.streaming.final", m.flat()));
  if (size() >= 3) {  // a set of fewer ranks than the job's
    const int set = add_process_set({0, 1});
    if (process_set_included(set)) {
      PartialLocalSgd on_set({.late_after_s = 30, .process_set = set, .timeout_s = 30,
                              .name = "test.pls.elastic.set", .commit = false},
                             m.views());
      CHECK_THROWS_WITH(on_set.add_to(other), Catch::Contains("on the global one"));
      on_set.close();
    }
    barrier();
    remove_process_set(set);
  }
}

TEST_CASE("partial local SGD, streaming: with every rank on time it equals LocalSgd's streaming",
          "[mpi]") {
  Session s;
  const int delay = GENERATE(0, 1, 2);
  INFO(fmt::format("sync_delay {}", delay));
  const std::uint64_t start = committed_steps();
  Model m(rank()), twin(rank());
  PartialLocalSgd sgd({.period = 4,
                       .late_after_s = 30,
                       .outer = OuterOptimizer::diloco(),
                       .timeout_s = 30,
                       .name = "test.pls.stream",
                       .fragments = 2,
                       .sync_delay = delay},
                      m.views());
  LocalSgd ref({.period = 4,
                .outer = OuterOptimizer::diloco(),
                .name = "test.pls.stream.ref",
                .commit = false,
                .fragments = 2,
                .sync_delay = delay},
               twin.views());
  for (int t = 1; t <= 10; ++t) {
    inner_step(m, t);
    inner_step(twin, t);
    sgd.step();
    ref.step();
    check_close(m.flat(), twin.flat(), 1e-5, 1e-12, fmt::format("step {}", t));
    CHECK(sgd.fragment_versions() == ref.fragment_rounds());
  }
  // Every fragment round adopted is one commit (LocalSgd's are not).
  CHECK(committed_steps() == start + static_cast<std::uint64_t>(sgd.version()));
  const PartialLocalSgdCounters before = sgd.counters();
  CHECK(before.rounds >= sgd.version());
  CHECK(before.merged_late + before.rejected + before.rounds_late == 0);
  sgd.close();  // completes the rounds in flight
  const PartialLocalSgdCounters c = sgd.counters();
  CHECK(c.rounds == sgd.version());
  CHECK(committed_steps() == start + static_cast<std::uint64_t>(sgd.version()));
  CHECK(same_on_every_rank("test.pls.stream.final", m.flat()));
  for (int f = 0; f < 2; ++f) {
    CHECK(sgd.merged_rounds(f) ==
          std::vector<std::int64_t>(static_cast<std::size_t>(size()),
                                    sgd.fragment_versions()[static_cast<std::size_t>(f)]));
  }
  CHECK_THROWS_AS(sgd.merged_rounds(2), InvalidArgument);
}

TEST_CASE("partial local SGD, streaming: a straggler's fragment rounds close without it",
          "[mpi]") {
  Session s;
  constexpr double kLate = 0.25;
  const int slow = size() - 1;
  Model m(rank());
  PartialLocalSgd sgd({.period = 2,
                       .late_after_s = kLate,
                       .max_staleness = 10,
                       .timeout_s = 30,
                       .name = "test.pls.stream.straggler",
                       .fragments = 2,
                       .sync_delay = 1},
                      m.views());
  constexpr int kSteps = 8;
  for (int t = 1; t <= kSteps; ++t) {
    if (rank() == slow && t == 3) {
      std::this_thread::sleep_for(std::chrono::duration<double>(4 * kLate));
    }
    inner_step(m, t);
    sgd.step();
  }
  sgd.close();
  const PartialLocalSgdCounters c = sgd.counters();
  CHECK(c.merged_late_by_rank[static_cast<std::size_t>(slow)] >= 1);
  for (int r = 0; r < size(); ++r) CHECK(c.rejected_by_rank[static_cast<std::size_t>(r)] == 0);
  CHECK(same_on_every_rank("test.pls.stream.straggler.final", m.flat()));
  if (rank() == 0) {
    for (int f = 0; f < 2; ++f) {
      const auto history = sgd.round_history(f);
      // Some round of the fragment closed without the straggler, and every
      // contribution (one per period) was taken exactly once.
      bool without = false;
      std::vector<int> seen(static_cast<std::size_t>(size()), 0);
      for (const auto& round : history) {
        const bool in = std::count(round.merged.begin(), round.merged.end(), slow) +
                            std::count(round.late.begin(), round.late.end(), slow) >
                        0;
        if (!round.merged.empty() && !in) without = true;
        for (const auto* ranks : {&round.merged, &round.late, &round.rejected}) {
          for (int r : *ranks) ++seen[static_cast<std::size_t>(r)];
        }
      }
      CHECK(without);
      CHECK(seen == std::vector<int>(static_cast<std::size_t>(size()), kSteps / 2));
    }
  }
}
