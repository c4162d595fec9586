// What the elastic local-SGD tests in C++ share (local_sgd_kill.cc,
// partial_local_sgd_kill.cc): the failure report, each rank's inner step,
// the one-process reference's outer round, its streaming run, and the final
// checks (the ranks hold the same bits; they equal the reference).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <utility>
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

// Streaming: the recovery goes back to the commit of step kKillStep - 1 or
// kKillStep (whether a survivor completed the round of kKillStep - 1 before
// it saw the death); fails on any other.
inline void check_recovered_step(int me, std::int64_t recovered_at) {
  if (recovered_at != kKillStep - 1 && recovered_at != kKillStep) {
    fail(me, fmt::format("the recovery restored local step {}, expected {} or {}", recovered_at,
                         kKillStep - 1, kKillStep));
  }
}

// Streaming (GYRE_TEST_STREAMING=1): 2 fragments, sync delay 1.
constexpr int kFragments = 2;
constexpr int kDelay = 1;

// Whether this run is the streaming form (GYRE_TEST_STREAMING=1).
inline bool streaming_from_env() {
  const char* v = std::getenv("GYRE_TEST_STREAMING");
  return v != nullptr && std::string(v) == "1";
}

// The parameters as the test hands them over: `w` whole, or streaming as two
// tensors of kCount / 2 (a fragment each).
inline std::vector<gyre::TensorView> params_of(std::vector<double>& w, bool streaming) {
  if (!streaming) return {gyre::view(w)};
  const std::span<double> all(w);
  return {gyre::view(all.first(kCount / 2)), gyre::view(all.subspan(kCount / 2))};
}

struct Fragment {
  std::size_t lo = 0, hi = 0;
  int offset = 0;
  std::vector<double> synced, buf, result;
  bool pending = false;
  int due = 0;
  std::vector<int> posters;
  std::vector<std::vector<double>> at_post;
};

// A fragment's round in flight merged into its posters' parameters: the
// round's model plus each one's steps since the post.
inline void merge(Fragment& f, std::vector<std::vector<double>>& w) {
  for (int p : f.posters) {
    auto& wp = w[static_cast<std::size_t>(p)];
    const auto& at = f.at_post[static_cast<std::size_t>(p)];
    for (std::size_t i = f.lo; i < f.hi; ++i) wp[i] = f.result[i - f.lo] + (wp[i] - at[i - f.lo]);
  }
  f.synced = f.result;
  f.pending = false;
}

// A streaming run in one process with every rank on time (PartialLocalSgd's
// aggregators and LocalSgd's allreduces then agree): each fragment's round
// posted at its steps, DiLoCo's outer step per fragment, the merge a step
// later; the recovery at the commit of step `recovered`: the parameters of
// `root` (the sync root, by its rank at the start) everywhere, the rounds in
// flight dropped, and with `new_stores` (PartialLocalSgd) each fragment's
// model the root's parameters and its momentum restarting (LocalSgd keeps
// the committed θ_synced and momentum, the same on every rank). At the end
// the rounds in flight merge, then with `final_round` (LocalSgd::sync()) one
// more round of every fragment, else (PartialLocalSgd::close()) every
// fragment takes its model. Returns the final parameters and the fragment
// rounds merged over the whole run.
inline std::pair<std::vector<double>, int> reference_streaming(const gyre::OuterOptimizer& o,
                                                                int dead, bool respawn,
                                                                int recovered, int root,
                                                                bool new_stores,
                                                                bool final_round) {
  std::vector<int> target;
  for (int p = 0; p < kRanks; ++p) target.push_back(p);
  std::vector<std::vector<double>> w(kRanks, std::vector<double>(kCount, 0.0));
  std::vector<Fragment> frags(kFragments);
  for (int f = 0; f < kFragments; ++f) {
    Fragment& fr = frags[static_cast<std::size_t>(f)];
    fr.lo = kCount * static_cast<std::size_t>(f) / kFragments;
    fr.hi = kCount * static_cast<std::size_t>(f + 1) / kFragments;
    fr.offset = (f + 1) * kPeriod / kFragments % kPeriod;
    fr.synced.assign(fr.hi - fr.lo, 0.0);
    fr.buf.assign(fr.hi - fr.lo, 0.0);
    fr.at_post.assign(kRanks, {});
  }
  int adopted = 0;
  // A round of `fr` posted at step t by `posters`: its model, and each
  // poster's parameters at the post.
  auto post = [&](Fragment& fr, const std::vector<int>& posters, int t) {
    std::vector<double> g(fr.hi - fr.lo, 0.0);
    for (int p : posters) {
      const auto& wp = w[static_cast<std::size_t>(p)];
      for (std::size_t i = fr.lo; i < fr.hi; ++i) g[i - fr.lo] += fr.synced[i - fr.lo] - wp[i];
      fr.at_post[static_cast<std::size_t>(p)].assign(
          wp.begin() + static_cast<std::ptrdiff_t>(fr.lo),
          wp.begin() + static_cast<std::ptrdiff_t>(fr.hi));
    }
    fr.result = fr.synced;
    for (std::size_t i = 0; i < g.size(); ++i) {
      g[i] /= static_cast<double>(posters.size());
      fr.buf[i] = o.momentum * fr.buf[i] + g[i];
      fr.result[i] -= o.lr * (o.nesterov ? g[i] + o.momentum * fr.buf[i] : fr.buf[i]);
    }
    fr.posters = posters;
    fr.pending = true;
    fr.due = t + kDelay;
  };
  for (int t = 1; t <= kSteps; ++t) {
    std::vector<int> alive;
    for (int p = 0; p < kRanks; ++p) {
      if (p != dead || t < kKillStep || (respawn && t > recovered)) alive.push_back(p);
    }
    for (int p : alive) {
      inner_step(w[static_cast<std::size_t>(p)], target[static_cast<std::size_t>(p)], t);
    }
    for (Fragment& fr : frags) {
      if (fr.pending && fr.due <= t) {
        merge(fr, w);
        ++adopted;
      }
    }
    if (t == recovered) {
      // The commit of this step, then the failure: every rank of the new
      // world from the root's commit, no round in flight.
      const std::vector<double> commit = w[static_cast<std::size_t>(root)];
      if (respawn) target[static_cast<std::size_t>(dead)] = kRanks - 1;
      for (auto& wp : w) wp = commit;
      for (Fragment& fr : frags) {
        if (new_stores) {
          fr.synced.assign(commit.begin() + static_cast<std::ptrdiff_t>(fr.lo),
                           commit.begin() + static_cast<std::ptrdiff_t>(fr.hi));
          std::fill(fr.buf.begin(), fr.buf.end(), 0.0);
        }
        fr.pending = false;
      }
      continue;
    }
    for (Fragment& fr : frags) {
      if (t % kPeriod == fr.offset) post(fr, alive, t);
    }
  }
  std::vector<int> survivors;
  for (int p = 0; p < kRanks; ++p) {
    if (p != dead || respawn) survivors.push_back(p);
  }
  for (Fragment& fr : frags) {
    if (fr.pending) {
      merge(fr, w);
      ++adopted;
    }
  }
  if (final_round) {
    for (Fragment& fr : frags) {
      post(fr, survivors, kSteps);
      merge(fr, w);  // no steps since: every survivor takes the round's model
      ++adopted;
    }
  }
  std::vector<double> out = w[static_cast<std::size_t>(root)];
  for (const Fragment& fr : frags) {
    std::copy(fr.synced.begin(), fr.synced.end(), out.begin() + static_cast<std::ptrdiff_t>(fr.lo));
  }
  return {out, adopted};
}

}  // namespace gyre_test_lsgd_kill
