// What the elastic local-SGD tests in C++ share (local_sgd_kill.cc,
// partial_local_sgd_kill.cc): the failure report, each rank's inner step,
// the one-process reference's outer round, and the final checks (the
// ranks hold the same bits; they equal the reference).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gyre/gyre.h"
#include "gyre/local_sgd.h"
#include "gyre/view.h"

namespace gyre_test_lsgd_kill {

// The run both tests make: 3 ranks, a round every kPeriod inner steps,
// kSteps inner steps of kCount float64 parameters, a death at kKillStep.
constexpr int kRanks = 3;
constexpr int kKillStep = 7;
constexpr int kSteps = 20;
constexpr int kPeriod = 2;
constexpr std::size_t kCount = 1024;

[[noreturn]] inline void fail(int me, const std::string& what) {
  std::fprintf(stderr, "elastic: rank %d FAIL: %s\n", me, what.c_str());
  std::fflush(stderr);
  std::exit(1);
}

// Rank p's inner step t: a pull toward its own target, and a drift.
inline void inner_step(std::vector<double>& w, int p, int t) {
  for (std::size_t i = 0; i < w.size(); ++i) {
    const double target = (p + 1) * (1.0 + static_cast<double>(i % 5));
    w[i] -= 0.1 * (w[i] - target) + 0.01 * t;
  }
}

// The reference's outer round over the ranks `alive`: the mean
// pseudo-gradient, the outer step (torch.optim.SGD, Nesterov momentum in
// `buf`), and every alive rank continuing from the new θ_synced.
inline void outer_round(const gyre::OuterOptimizer& o, const std::vector<int>& alive,
                        std::vector<std::vector<double>>& w, std::vector<double>& synced,
                        std::vector<double>& buf) {
  for (std::size_t i = 0; i < synced.size(); ++i) {
    double g = 0;
    for (int p : alive) g += synced[i] - w[static_cast<std::size_t>(p)][i];
    g /= static_cast<double>(alive.size());
    buf[i] = o.momentum * buf[i] + g;
    const double d = o.nesterov ? g + o.momentum * buf[i] : buf[i];
    synced[i] -= o.lr * d;
  }
  for (int p : alive) w[static_cast<std::size_t>(p)] = synced;
}

// Fails unless every rank holds the same bits in `w` (min and max of them
// agree: two allreduces named `<name>.min` and `<name>.max`) and `w` equals
// `want` within 1e-9; returns the largest difference.
inline double check_final(int me, const std::string& name, const std::vector<double>& w,
                          const std::vector<double>& want) {
  const std::size_t n = w.size();
  std::vector<std::int64_t> bits(n), lo(n), hi(n);
  std::memcpy(bits.data(), w.data(), n * sizeof(double));
  gyre::allreduce_async(name + ".min", gyre::view(bits), gyre::view(lo), gyre::ReduceOp::kMin)
      .wait();
  gyre::allreduce_async(name + ".max", gyre::view(bits), gyre::view(hi), gyre::ReduceOp::kMax)
      .wait();
  for (std::size_t i = 0; i < n; ++i) {
    if (lo[i] != hi[i]) fail(me, fmt::format("the ranks' parameter {} differs", i));
  }
  double worst = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double err = std::abs(w[i] - want[i]);
    worst = std::max(worst, err);
    if (!(err <= 1e-9)) {
      fail(me, fmt::format("parameter {} is {:.17g}, the reference {:.17g}", i, w[i], want[i]));
    }
  }
  return worst;
}

}  // namespace gyre_test_lsgd_kill
