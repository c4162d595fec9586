// gyre::LocalSgd under elastic recovery (LocalSgd::add_to, gyre/elastic.h),
// under an MPI with ULFM and `mpirun --with-ft ulfm -n 3`: DiLoCo (Nesterov
// momentum) with period 2 on 1024 float64 parameters; rank 1 (its rank at
// start) SIGKILLs itself during inner step 7, after the round of step 6 was
// committed and before the round of step 8. The survivors' round of step 8
// fails (RankFailedError); gyre::elastic::run rebuilds the world and
// restores the State: the parameters, θ_synced, the momentum and the
// counters of the commit of step 6. Every survivor must then finish 20 inner
// steps (10 rounds) on 2 ranks with:
//  - the same parameters as the other survivor, bit for bit (an allreduce of
//    the parameters' bits with min and max);
//  - the parameters of a reference computed in this process: the same inner
//    steps and outer rounds on 3 ranks up to step 6 and on ranks {0, 2} from
//    there, from the commit of step 6 (within 1e-9: the allreduce sums in its
//    own order; measured: equal to the bit). Resuming from the wrong step
//    (counters not restored) or from the parameters of step 8 fails it. The
//    failed round itself changes nothing (LocalSgd writes θ_synced and the
//    momentum only after a round's allreduce succeeded), so here their
//    restore is a no-op; it is tested, with a round to undo, by
//    tests/training/test_local_sgd_mpi.cc ("an elastic State's restore").
// With GYRE_TEST_STREAMING=1, streaming: 2 fragments (2 tensors of 512),
// fragment 0's rounds at odd steps and fragment 1's at even ones, each
// completed one step after it starts (sync_delay 1), so that every commit
// falls while the other fragment's round is in flight: the commit holds
// θ_synced and the momentum from before it. The survivors' round of step 7
// cannot complete; whether fragment 1's round of step 6 completed on a
// survivor before the death decides whether it goes back to step 6 or 7
// (and the other with it), so the reference takes the step and the root of
// the recovery the survivors made; the rounds in flight are dropped, and
// each fragment's next round carries the steps since its last. At the end
// sync() completes the round in flight and runs one more of each fragment.
// Prints "elastic: rank P PASS ..." per survivor (run_elastic.sh counts them).
#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "gyre/elastic.h"
#include "gyre/gyre.h"
#include "gyre/local_sgd.h"
#include "gyre/view.h"
#include "local_sgd_kill_common.h"

namespace {

using namespace gyre_test_lsgd_kill;

constexpr int kDead = 1;

// The whole run computed in one process: every rank's parameters, the
// averaged pseudo-gradient, DiLoCo's outer step (torch.optim.SGD with
// Nesterov momentum), with rank kDead taking part up to step kKillStep - 1.
std::vector<double> reference(const gyre::OuterOptimizer& o) {
  std::vector<std::vector<double>> w(kRanks, std::vector<double>(kCount, 0.0));
  std::vector<double> synced(kCount, 0.0), buf(kCount, 0.0);
  for (int t = 1; t <= kSteps; ++t) {
    std::vector<int> alive;
    for (int p = 0; p < kRanks; ++p) {
      if (p != kDead || t < kKillStep) alive.push_back(p);
    }
    for (int p : alive) inner_step(w[static_cast<std::size_t>(p)], p, t);
    if (t % kPeriod != 0) continue;
    outer_round(o, alive, w, synced, buf);
  }
  return synced;
}

}  // namespace

int main() {
  gyre::init(gyre::Options::from_env());
  const int me = gyre::rank();  // rank at start, kept across rebuilds
  if (!gyre::elastic_enabled()) fail(me, "needs a ULFM build run with mpirun --with-ft ulfm");
  if (gyre::size() != kRanks) fail(me, fmt::format("needs {} ranks", kRanks));
  const gyre::OuterOptimizer outer = gyre::OuterOptimizer::diloco();

  const bool streaming = streaming_from_env();
  std::vector<double> w(kCount, 0.0);
  gyre::LocalSgd sgd({.period = kPeriod, .outer = outer, .name = "kill.lsgd", .commit = false,
                      .fragments = streaming ? kFragments : 1,
                      .sync_delay = streaming ? kDelay : 0},
                     params_of(w, streaming));
  gyre::elastic::State state;
  state.add("w", w);
  sgd.add_to(state);
  int recoveries = 0;
  int root_old = 0;  // the sync root of the recovery, by its rank at the start
  std::int64_t recovered_at = -1;  // the local step the recovery restored
  state.on_reset([&](const gyre::elastic::Recovery& r) {
    ++recoveries;
    root_old = r.info.previous_ranks.at(static_cast<std::size_t>(r.info.root));
  });
  gyre::elastic::run(state, [&](gyre::elastic::State& s) {
    if (recoveries > 0 && recovered_at < 0) recovered_at = sgd.local_steps();
    while (sgd.local_steps() < kSteps) {
      const int t = static_cast<int>(sgd.local_steps()) + 1;
      inner_step(w, me, t);
      if (me == kDead && t == kKillStep) {
        std::fprintf(stderr, "elastic: rank %d killed at inner step %d\n", me, t);
        std::fflush(stderr);
        std::raise(SIGKILL);
      }
      if (sgd.step()) s.commit();
    }
  });
  if (me == kDead) fail(me, "was not killed");
  if (recoveries != 1) fail(me, fmt::format("{} recoveries, expected 1", recoveries));
  if (gyre::size() != kRanks - 1) fail(me, fmt::format("{} ranks after the recovery", gyre::size()));
  std::vector<double> want;
  int rounds = kSteps / kPeriod;
  if (streaming) {
    check_recovered_step(me, recovered_at);
    sgd.sync();  // the round in flight, then one more of each fragment
    std::tie(want, rounds) =
        reference_streaming(outer, kDead, false, static_cast<int>(recovered_at), root_old,
                            /*new_stores=*/false, /*final_round=*/true);
  } else {
    want = reference(outer);
  }
  if (sgd.rounds() != rounds || sgd.local_steps() != kSteps) {
    fail(me, fmt::format("rounds {} and local steps {}, expected {} and {}", sgd.rounds(),
                         sgd.local_steps(), rounds, kSteps));
  }

  // Every rank holds the same bits, equal to the reference.
  const double worst = check_final(me, "kill.lsgd", w, want);
  gyre::shutdown();
  std::printf("elastic: rank %d PASS:%s %d rounds on 3 then 2 ranks, equal to the reference "
              "within %.3g\n", me,
              streaming ? fmt::format(" streaming (2 fragments, sync delay 1, back to step {} "
                                      "from rank {}):", recovered_at, root_old).c_str() : "",
              rounds, worst);
  std::fflush(stdout);
  return 0;
}
