// gyre::PartialLocalSgd under elastic recovery (PartialLocalSgd::add_to,
// gyre/elastic.h), under an MPI with ULFM and `mpirun --with-ft ulfm -n 3`:
// DiLoCo (Nesterov momentum) with period 2 on 1024 float64 parameters,
// rounds that wait for every rank (late_after_s 60 s). One rank
// (GYRE_TEST_KILL_RANK, default 1; 0 is the aggregator's rank) SIGKILLs
// itself during inner step 7, after the round of step 6 was committed by
// every rank (a barrier at step 7 makes sure of it) and before the round of
// step 8. The survivors' round of step 8 cannot close
// without it: their waits must end in RankFailedError from the store (not
// a hang, not the aggregator's StateError); gyre::elastic::run rebuilds the
// world, restores the State (the parameters and the counters of the commit
// of step 6), and the reset callback opens a new store over the survivors
// with a new aggregator on the new first rank. Every survivor must then
// finish 20 inner steps (10 rounds) on 2 ranks, close(), and hold:
//  - the same parameters as the other survivor, bit for bit (an allreduce of
//    the parameters' bits with min and max);
//  - the parameters of a reference computed in this process: the same inner
//    steps and outer rounds on 3 ranks up to step 6 and on the survivors
//    from there, from the commit of step 6, with the outer momentum starting
//    again from zero at the recovery (it was the old aggregator's alone),
//    within 1e-9 (the aggregator pushes the model as a difference);
//  - version() 10: the 3 rounds before the recovery and the new store's 7.
// With GYRE_ELASTIC_RESPAWN=1 (run_respawn.sh) the rebuild starts a
// replacement, this program again: its PartialLocalSgd has no store until
// its first sync (State::on_sync), where it opens one with the survivors;
// it joins at step 6 holding the commit, takes its own rank's targets, and
// the three finish on 3 ranks, equal to the reference with it from step 7.
// With GYRE_TEST_STREAMING=1, streaming: the parameters in 2 fragments (2
// tensors of 512), fragment 0's rounds at odd steps and fragment 1's at even
// ones, each merged one step after its post (sync_delay 1), so that a
// commit falls while the other fragment's round is in flight. The rank to
// die waits, after the barrier of step 7, until the round of fragment 1 it
// posted at step 6 has closed; the survivors' round of fragment 0 posted at
// step 7 cannot close. A survivor that adopts fragment 1's round at step 7
// before its store has seen the death commits there; one that sees the
// death first goes back to step 6 (and the other with it: the agreed commit
// is the lower, its root the first survivor that committed it), so the
// recovery's step is 6 or 7, and the reference takes the step and the root
// of the recovery the survivors made. The recovery drops the rounds in flight
// and opens a store per fragment holding the sync root's parameters; the
// reference does the same (19 fragment rounds in all either way).
// Prints "elastic: rank P PASS ..." per rank that finishes (run_elastic.sh
// and run_respawn.sh count them).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "gyre/elastic.h"
#include "gyre/gyre.h"
#include "gyre/partial_local_sgd.h"
#include "gyre/view.h"
#include "local_sgd_kill_common.h"

namespace {

using namespace gyre_test_lsgd_kill;


int kill_rank() {
  const char* v = std::getenv("GYRE_TEST_KILL_RANK");
  return v != nullptr ? std::atoi(v) : 1;
}

// The whole run in one process: every rank's parameters, the mean
// pseudo-gradient, DiLoCo's outer step (torch.optim.SGD with Nesterov
// momentum); rank `dead` takes part up to step kKillStep - 1 (a
// replacement, with `respawn`, from step kKillStep on, from the commit,
// with the targets of its rank: kRanks - 1), and the momentum restarts
// with the new aggregator at the first round after.
std::vector<double> reference(const gyre::OuterOptimizer& o, int dead, bool respawn) {
  // Each simulated rank: its targets' rank and its parameters.
  std::vector<int> target;
  for (int p = 0; p < kRanks; ++p) target.push_back(p);
  std::vector<std::vector<double>> w(kRanks, std::vector<double>(kCount, 0.0));
  std::vector<double> synced(kCount, 0.0), buf(kCount, 0.0);
  bool restarted = false;
  for (int t = 1; t <= kSteps; ++t) {
    if (t == kKillStep && respawn) {
      target[static_cast<std::size_t>(dead)] = kRanks - 1;  // the replacement's rank
      w[static_cast<std::size_t>(dead)] = synced;           // it starts from the commit
    }
    std::vector<int> alive;
    for (int p = 0; p < kRanks; ++p) {
      if (p != dead || t < kKillStep || respawn) alive.push_back(p);
    }
    for (int p : alive) {
      inner_step(w[static_cast<std::size_t>(p)], target[static_cast<std::size_t>(p)], t);
    }
    if (t % kPeriod != 0) continue;
    if (t > kKillStep && !restarted) {
      std::fill(buf.begin(), buf.end(), 0.0);
      restarted = true;
    }
    outer_round(o, alive, w, synced, buf);
  }
  return synced;
}


}  // namespace

int main() {
  // init() reads the options after a replacement has received the
  // survivors' GYRE_* variables (init(Options::from_env()) would read them
  // before).
  gyre::init();
  const int me = gyre::rank();  // rank at start, kept across rebuilds
  const int dead = kill_rank();
  const bool replacement = gyre::is_replacement();
  // (A replacement, started by MPI_Comm_spawn, need not see the variable.)
  const char* respawn_env = std::getenv("GYRE_ELASTIC_RESPAWN");
  const bool respawn = replacement || (respawn_env != nullptr && std::string(respawn_env) == "1");
  const int after = respawn ? kRanks : kRanks - 1;
  if (!gyre::elastic_enabled()) fail(me, "needs a ULFM build run with mpirun --with-ft ulfm");
  if (gyre::size() != kRanks) fail(me, fmt::format("needs {} ranks", kRanks));
  const gyre::OuterOptimizer outer = gyre::OuterOptimizer::diloco();

  const bool streaming = streaming_from_env();
  std::vector<double> w(kCount, 0.0);
  gyre::PartialLocalSgd sgd({.period = kPeriod, .late_after_s = 60, .outer = outer,
                             .timeout_s = 60, .name = "kill.plsgd", .commit = false,
                             .fragments = streaming ? kFragments : 1,
                             .sync_delay = streaming ? kDelay : 0},
                            params_of(w, streaming));
  gyre::elastic::State state;
  state.add("w", w);
  sgd.add_to(state);
  int recoveries = 0;
  std::int64_t recovered_at = -1;  // the local step the recovery restored
  std::string failure;
  state.on_failure([&](const gyre::RankFailedError& e) { failure = e.what(); });
  int root_old = 0;  // the sync root of the recovery, by its rank at the start
  state.on_reset([&](const gyre::elastic::Recovery& r) {
    ++recoveries;
    root_old = r.info.previous_ranks.at(static_cast<std::size_t>(r.info.root));
  });
  bool first_entry = true;
  gyre::elastic::run(state, [&](gyre::elastic::State& s) {
    if (replacement && first_entry && !streaming &&
        (sgd.local_steps() != kKillStep - 1 || sgd.version() != 3)) {
      fail(me, fmt::format("joined at local step {}, round {}; expected the commit of step {} "
                           "(round 3)", sgd.local_steps(), sgd.version(), kKillStep - 1));
    }
    first_entry = false;
    if ((recoveries > 0 || replacement) && recovered_at < 0) recovered_at = sgd.local_steps();
    while (sgd.local_steps() < kSteps) {
      const int t = static_cast<int>(sgd.local_steps()) + 1;
      inner_step(w, me, t);
      // The round of step 6 is every rank's before the death: a rank still
      // pulling it when the store fails would go back to step 4's commit.
      if (t == kKillStep) gyre::barrier();
      if (me == dead && t == kKillStep && !replacement) {
        if (streaming) {
          // Fragment 1's round of step 6 (its third) holds every rank's
          // contribution: this rank dies once it has closed, so that every
          // survivor adopts it at step 7.
          const auto start = std::chrono::steady_clock::now();
          while (sgd.merged_rounds(1)[static_cast<std::size_t>(me)] < 3) {
            if (std::chrono::steady_clock::now() - start > std::chrono::seconds(30)) {
              fail(me, "fragment 1's round of step 6 did not close within 30 s");
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
        }
        std::fprintf(stderr, "elastic: rank %d killed at inner step %d\n", me, t);
        std::fflush(stderr);
        std::raise(SIGKILL);
      }
      if (sgd.step()) s.commit();
    }
  });
  sgd.close();
  if (me == dead && !replacement) fail(me, "was not killed");
  if (!replacement) {
    if (recoveries != 1) fail(me, fmt::format("{} recoveries, expected 1", recoveries));
    if (failure.find(std::to_string(dead)) == std::string::npos) {
      fail(me, fmt::format("the failure seen does not name rank {}: {}", dead, failure));
    }
  }
  if (gyre::size() != after) fail(me, fmt::format("{} ranks after the recovery", gyre::size()));
  std::vector<double> want;
  int rounds = kSteps / kPeriod;
  if (streaming) {
    check_recovered_step(me, recovered_at);
    std::tie(want, rounds) =
        reference_streaming(outer, dead, respawn, static_cast<int>(recovered_at), root_old,
                            /*new_stores=*/true, /*final_round=*/false);
  } else {
    want = reference(outer, dead, respawn);
  }
  if (sgd.version() != rounds || sgd.local_steps() != kSteps) {
    fail(me, fmt::format("version {} and local steps {}, expected {} and {}", sgd.version(),
                         sgd.local_steps(), rounds, kSteps));
  }

  // Every rank holds the same bits, equal to the reference.
  const double worst = check_final(me, "kill.plsgd", w, want);
  gyre::shutdown();
  std::printf("elastic: rank %d PASS:%s%s %d rounds on 3 then %d ranks (rank %d killed), equal "
              "to the reference within %.3g\n", me, replacement ? " (the replacement)" : "",
              streaming ? fmt::format(" streaming (2 fragments, sync delay 1, back to step {} "
                                      "from rank {}):", recovered_at, root_old).c_str() : "",
              rounds, after, dead, worst);
  std::fflush(stdout);
  return 0;
}
