// LocalSgd (gyre/local_sgd.h) under mpirun with 2 or 3 ranks, against
// references every rank computes from all ranks' values (allgathered):
// period 1 with plain averaging is synchronous SGD on the averaged gradient;
// between rounds the ranks' parameters differ and right after a round they
// are identical (with a warm-up); DiLoCo's Nesterov outer step over three
// rounds; the 16-bit and int8 transports within their rounding (a NaN in an
// int8 block reaching every rank as NaN); one commit per round; an elastic
// State's restore of the LocalSgd's own state;
// the start from a process set's first rank; bad arguments refused naming
// the problem. The model is a float32 tensor and a float64 one, so both
// dtypes go through every round.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gyre/elastic.h"
#include "gyre/gyre.h"
#include "gyre/local_sgd.h"
#include "gyre/view.h"

#include "local_sgd_model.h"

using namespace gyre;
using namespace gyre::test_lsgd;

TEST_CASE("local SGD: period 1 with plain averaging is synchronous SGD on the average gradient",
          "[mpi]") {
  Session s;
  Model m(rank());
  LocalSgd sgd({.period = 1}, m.views());
  // The broadcast: every rank starts from rank 0's values.
  check_close(m.flat(), Model(0).flat(), 0, 0, "after construction");

  // Reference: θ -= lr * mean over ranks of the gradients each rank used
  // (allgathered), in float64. Tolerance: 1e-5 for the float32 tensor (a few
  // float32 roundings of values near 1 per step), 1e-12 for the float64 one.
  std::vector<double> reference = m.flat();
  for (int t = 1; t <= 6; ++t) {
    const std::vector<double> g = inner_step(m, t);
    CHECK(sgd.step());
    const std::vector<double> avg = mean(gather("test.lsgd.grad", g));
    for (std::size_t k = 0; k < reference.size(); ++k) reference[k] -= kLr * avg[k];
    check_close(m.flat(), reference, 1e-5, 1e-12, fmt::format("step {}", t));
  }
  CHECK(sgd.rounds() == 6);
  CHECK(sgd.local_steps() == 6);
}

TEST_CASE("local SGD: the ranks differ between rounds and are identical right after one",
          "[mpi]") {
  Session s;
  Model m(rank());
  auto diloco = GENERATE(false, true);
  LocalSgdOptions o{.period = 3, .warmup_steps = 2};
  if (diloco) o.outer = OuterOptimizer::diloco();
  LocalSgd sgd(o, m.views());
  INFO(fmt::format("outer optimizer: {}", diloco ? "DiLoCo" : "averaging"));
  // Rounds: every step of the warm-up (1, 2), then every third (3, 6).
  const std::vector<bool> expected = {true, true, true, false, false, true, false, false};
  for (int t = 1; t <= static_cast<int>(expected.size()); ++t) {
    inner_step(m, t);
    const bool ran = sgd.step();
    INFO(fmt::format("step {}", t));
    CHECK(ran == expected[static_cast<std::size_t>(t - 1)]);
    const auto sums = gather("test.lsgd.checksum", {checksum(m)});
    bool all_equal = true;
    for (const auto& v : sums) all_equal = all_equal && v[0] == sums[0][0];
    CHECK(all_equal == ran);
  }
  CHECK(sgd.rounds() == 4);
}

TEST_CASE("local SGD: DiLoCo's Nesterov outer step equals a reference from every rank's parameters",
          "[mpi]") {
  Session s;
  Model m(rank());
  const OuterOptimizer outer = OuterOptimizer::diloco(0.7, 0.9, true);
  LocalSgd sgd({.period = 2, .outer = outer}, m.views());

  // Reference in float64: g = θ_synced − mean_r θ_r; buf = 0.9 buf + g;
  // θ_synced −= 0.7 (g + 0.9 buf). Three rounds, so the momentum of the
  // first two enters the later ones.
  std::vector<double> synced = m.flat(), buf(synced.size(), 0.0);
  int rounds = 0;
  for (int t = 1; t <= 6; ++t) {
    inner_step(m, t);
    if (t % 2 != 0) {
      CHECK_FALSE(sgd.step());
      continue;
    }
    const std::vector<double> avg = mean(gather("test.lsgd.local", m.flat()));
    for (std::size_t k = 0; k < synced.size(); ++k) {
      const double g = synced[k] - avg[k];
      buf[k] = outer.momentum * buf[k] + g;
      synced[k] -= outer.lr * (g + outer.momentum * buf[k]);
    }
    REQUIRE(sgd.step());
    ++rounds;
    // 1e-5: float32 pseudo-gradients and updates of values near 1.
    check_close(m.flat(), synced, 1e-5, 1e-12, fmt::format("round {}", rounds));
  }
  CHECK(rounds == 3);
  CHECK(sgd.rounds() == 3);
}

TEST_CASE("local SGD: 16-bit pseudo-gradients average within their rounding", "[mpi]") {
  Session s;
  auto compression = GENERATE(LocalSgdCompression::kFloat16, LocalSgdCompression::kBFloat16);
  // Relative rounding of one 16-bit value: 2^-11 (float16), 2^-8 (bfloat16).
  const double unit = compression == LocalSgdCompression::kFloat16 ? 0x1p-11 : 0x1p-8;
  INFO(fmt::format("unit roundoff {}", unit));
  Model m(rank());
  LocalSgd sgd({.period = 2, .compression = compression}, m.views());
  std::vector<double> synced = m.flat();
  for (int t = 1; t <= 4; ++t) {
    inner_step(m, t);
    if (t % 2 != 0) {
      CHECK_FALSE(sgd.step());
      continue;
    }
    const auto locals = gather("test.lsgd.local16", m.flat());
    const std::vector<double> avg = mean(locals);
    // Bound: each rank's pseudo-gradient rounded once, their average once
    // more, plus float32's own rounding.
    std::vector<double> tol(synced.size());
    for (std::size_t k = 0; k < synced.size(); ++k) {
      double largest = 0;
      for (const auto& l : locals) largest = std::max(largest, std::abs(synced[k] - l[k]));
      tol[k] = 2 * unit * largest + 1e-6;
    }
    REQUIRE(sgd.step());
    const auto got = m.flat();
    for (std::size_t k = 0; k < got.size(); ++k) {
      INFO(fmt::format("step {} element {}: {:.9g}, exact average {:.9g}", t, k, got[k], avg[k]));
      CHECK(std::abs(got[k] - avg[k]) <= tol[k]);
    }
    const auto sums = gather("test.lsgd.checksum16", {checksum(m)});
    for (const auto& v : sums) CHECK(v[0] == sums[0][0]);
    synced = got;
  }
}

// The bound of an int8 round on one element: every rank's value is off by at
// most half its block's scale (absmax / 127), so their average by at most
// the largest such half, plus float32's rounding of the sums.
static std::vector<double> int8_tolerance(const std::vector<double>& synced,
                                   const std::vector<std::vector<double>>& locals,
                                   const std::vector<std::size_t>& blocks) {
  std::vector<double> tol(synced.size());
  for (std::size_t b = 0; b + 1 < blocks.size(); ++b) {
    double largest_half_scale = 0;
    for (const auto& l : locals) {
      double absmax = 0;
      for (std::size_t k = blocks[b]; k < blocks[b + 1]; ++k) {
        absmax = std::max(absmax, std::abs(synced[k] - l[k]));
      }
      largest_half_scale = std::max(largest_half_scale, absmax / 127.0 / 2.0);
    }
    for (std::size_t k = blocks[b]; k < blocks[b + 1]; ++k) {
      tol[k] = largest_half_scale * (1 + 1e-5) + 1e-6 * (1 + std::abs(synced[k]));
    }
  }
  return tol;
}

TEST_CASE("local SGD: int8 pseudo-gradients average within half a block's scale", "[mpi]") {
  Session s;
  Model m(rank());
  LocalSgd sgd({.period = 2, .compression = LocalSgdCompression::kInt8}, m.views());
  std::vector<double> synced = m.flat();
  for (int t = 1; t <= 6; ++t) {
    inner_step(m, t);
    if (t % 2 != 0) {
      CHECK_FALSE(sgd.step());
      continue;
    }
    const auto locals = gather("test.lsgd.local8", m.flat());
    const std::vector<double> avg = mean(locals);
    // One block per parameter here: w is elements 0..11, b 12..16.
    const auto tol = int8_tolerance(synced, locals, {0, 12, 17});
    REQUIRE(sgd.step());
    const auto got = m.flat();
    for (std::size_t k = 0; k < got.size(); ++k) {
      INFO(fmt::format("step {} element {}: {:.9g}, exact average {:.9g}, bound {:.3g}", t, k,
                       got[k], avg[k], tol[k]));
      CHECK(std::abs(got[k] - avg[k]) <= tol[k]);
    }
    const auto sums = gather("test.lsgd.checksum8", {checksum(m)});
    for (const auto& v : sums) CHECK(v[0] == sums[0][0]);
    synced = got;
  }
}

TEST_CASE("local SGD: int8 blocks of a large parameter, and a NaN reaches every rank",
          "[mpi]") {
  Session s;
  // 600 float32 values: blocks 0..255, 256..511 and a partial 512..599.
  constexpr std::size_t kN = 600;
  std::vector<float> p(kN);
  for (std::size_t k = 0; k < kN; ++k) p[k] = 0.001f * static_cast<float>(k);
  LocalSgd sgd({.period = 1, .compression = LocalSgdCompression::kInt8, .name = "test.lsgd.big"},
               {view(p)});
  std::vector<double> synced(p.begin(), p.end());
  // Each block of each rank moves by a different amount, so that the blocks'
  // scales differ.
  for (std::size_t k = 0; k < kN; ++k) {
    p[k] -= static_cast<float>(0.01 * std::sin(0.1 * static_cast<double>(k) + rank()) *
                               (1 + static_cast<double>(k / 256)));
  }
  std::vector<double> mine(p.begin(), p.end());
  const auto locals = gather("test.lsgd.big.local", mine);
  const auto tol = int8_tolerance(synced, locals, {0, 256, 512, kN});
  const std::vector<double> avg = mean(locals);
  REQUIRE(sgd.step());
  for (std::size_t k = 0; k < kN; ++k) {
    INFO(fmt::format("element {}: {:.9g}, exact average {:.9g}, bound {:.3g}", k, p[k], avg[k],
                     tol[k]));
    CHECK(std::abs(p[k] - avg[k]) <= tol[k]);
  }
  synced.assign(p.begin(), p.end());
  // A NaN on the last rank only, in the middle block: that block is NaN on
  // every rank after the round (not a number from a cast of NaN to int8),
  // the other blocks stay finite and equal on every rank.
  if (rank() == size() - 1) p[300] = std::numeric_limits<float>::quiet_NaN();
  REQUIRE(sgd.step());
  std::vector<double> after(p.begin(), p.end());
  for (std::size_t k = 0; k < kN; ++k) {
    INFO(fmt::format("element {} after the NaN round: {}", k, after[k]));
    CHECK(std::isnan(after[k]) == (k >= 256 && k < 512));
  }
  std::vector<double> finite(after.begin(), after.begin() + 256);
  finite.insert(finite.end(), after.begin() + 512, after.end());
  const auto all = gather("test.lsgd.big.after", finite);
  for (const auto& v : all) CHECK(v == all[0]);
}

TEST_CASE("local SGD: every round is one commit and version() is the commit", "[mpi]") {
  Session s;
  Model m(rank());
  LocalSgd sgd({.period = 2}, m.views());
  CHECK(sgd.version() == 0);
  const std::uint64_t start = committed_steps();
  for (int t = 1; t <= 7; ++t) {
    inner_step(m, t);
    const bool ran = sgd.step();
    INFO(fmt::format("step {}", t));
    CHECK(committed_steps() == start + static_cast<std::uint64_t>(t / 2));
    CHECK(sgd.version() == (t >= 2 ? committed_steps() : 0));
    CHECK(version_vector().at(static_cast<std::size_t>(rank())) == committed_steps());
    CHECK(ran == (t % 2 == 0));
  }
  sgd.sync();  // a round off the schedule commits too
  CHECK(committed_steps() == start + 4);
  CHECK(sgd.version() == committed_steps());
  CHECK(sgd.rounds() == 4);
}

TEST_CASE("local SGD: a process set starts from its first rank's parameters", "[mpi]") {
  Session s;
  if (size() < 3) return;  // a set that leaves rank 0 out needs three ranks
  const int set = add_process_set({1, 2});
  const std::uint64_t start = committed_steps();
  if (process_set_included(set)) {
    Model m(rank());
    // Rounds on a set are not commits (commit stays at its default): rank 0
    // makes none, and the global set's collectives below
    // (remove_process_set) compare every rank's committed steps.
    LocalSgd sgd({.period = 1, .process_set = set}, m.views());
    check_close(m.flat(), Model(1).flat(), 0, 0, "after construction on the set {1, 2}");
    inner_step(m, 1);
    REQUIRE(sgd.step());
    const std::vector<double> mine{checksum(m)};
    Handle h = allgather_async("test.lsgd.set", view(mine), set);
    h.wait();
    std::vector<double> sums(2);
    std::memcpy(sums.data(), h.output().data.data(), sizeof(double) * 2);
    CHECK(sums[0] == sums[1]);
    CHECK(sgd.rounds() == 1);
    CHECK(sgd.version() == 0);
  }
  CHECK(committed_steps() == start);
  barrier();
  remove_process_set(set);
}

TEST_CASE("local SGD: an elastic State's restore returns θ_synced, the momentum and the counters",
          "[mpi]") {
  // add_to() puts the LocalSgd's own state into an elastic State beside the
  // job's parameters: restoring the State after more steps and a round must
  // make the run continue exactly as one that never took them (DiLoCo's
  // momentum and θ_synced included: a round replayed on a stale one would
  // give other numbers). The reference is a second LocalSgd that runs the
  // same steps straight through.
  Session s;
  const auto outer = OuterOptimizer::diloco();
  Model m(rank());
  LocalSgd sgd({.period = 2, .outer = outer, .name = "test.lsgd.elastic", .commit = false},
               m.views());
  elastic::State state;
  state.add("w", m.w);
  state.add("b", m.b);
  sgd.add_to(state);
  for (int t = 1; t <= 4; ++t) {
    inner_step(m, t);
    if (sgd.step()) state.commit();
  }
  REQUIRE(sgd.rounds() == 2);
  // Steps and a round that a failure will undo.
  for (int t = 5; t <= 7; ++t) {
    inner_step(m, t);
    sgd.step();
  }
  REQUIRE(sgd.rounds() == 3);
  state.restore();
  CHECK(sgd.rounds() == 2);
  CHECK(sgd.local_steps() == 4);
  for (int t = 5; t <= 8; ++t) {
    inner_step(m, t);
    if (sgd.step()) state.commit();
  }
  CHECK(sgd.rounds() == 4);

  Model ref(rank());
  LocalSgd straight({.period = 2, .outer = outer, .name = "test.lsgd.straight", .commit = false},
                    ref.views());
  for (int t = 1; t <= 8; ++t) {
    inner_step(ref, t);
    straight.step();
  }
  const auto got = m.flat(), want = ref.flat();
  for (std::size_t k = 0; k < got.size(); ++k) {
    INFO(fmt::format("element {}: {:.17g} after the restore, {:.17g} straight through", k, got[k],
                     want[k]));
    CHECK(got[k] == want[k]);
  }

  // A LocalSgd that commits its rounds itself cannot join a State (two
  // commits per round).
  LocalSgd committing({.name = "test.lsgd.committing"}, {view(ref.w)});
  elastic::State other;
  CHECK_THROWS_WITH(committing.add_to(other), Catch::Contains(".commit = false"));
}

TEST_CASE("local SGD: bad arguments are refused, naming the problem", "[mpi]") {
  Session s;
  Model m(rank());
  auto refused = [&](LocalSgdOptions o, std::vector<TensorView> params, const std::string& says) {
    INFO(fmt::format("expected a refusal saying '{}'", says));
    CHECK_THROWS_WITH(LocalSgd(o, std::move(params)), Catch::Contains(says));
  };
  refused({.period = 0}, m.views(), "period must be >= 1, got 0");
  refused({.period = 2, .warmup_steps = -1}, m.views(), "warmup_steps must be >= 0");
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
  CHECK_THROWS_AS(LocalSgd({.period = 0}, m.views()), InvalidArgument);

  // Ranks whose parameters differ in dtype: the start's broadcast fails on
  // every rank.
  std::vector<float> f(4);
  std::vector<double> d(4);
  CHECK_THROWS_AS(LocalSgd({.name = "test.lsgd.mismatch"}, {rank() == 0 ? view(f) : view(d)}),
                  MismatchError);
}
