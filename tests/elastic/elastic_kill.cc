// Elastic recovery through the C++ API (gyre::elastic::State and run), under
// an MPI with ULFM and `mpirun --with-ft ulfm`: every rank runs a loop of allreduces, committing
// after each step; one rank (GYRE_TEST_KILL_RANK, default 1) SIGKILLs itself
// right after submitting the allreduce of step GYRE_TEST_KILL_STEP (default
// 7), so that it dies with the operation in flight. Every survivor must see
// RankFailedError; gyre::elastic::run calls gyre::rebuild() and rolls the
// state back to the agreed commit; every survivor must finish every step on the smaller world, with exact results. With
// GYRE_TEST_KILL_AFTER_US the rank dies that long after submitting, most
// likely with its ring transfers half done: some survivors may then have
// completed the step with its data and committed it, others not, and the
// agreed step is the lower one (the rank ahead rolls back). With
// GYRE_TEST_KILL_IN_RECOVERY_RANK=r, rank r dies too, as soon as it has
// seen the first failure, before it calls rebuild(): a failure during the
// recovery, which the others' rebuild() (or a second one) must absorb.
// With GYRE_TEST_PROCESS_SETS=1 two process sets are added before the loop
// (one of survivors, one with the rank that dies) and used once; after the
// recovery every operation on them must fail at once with StateError naming
// the set and saying the rebuild dropped it (a rebuild drops process sets).
// With GYRE_TEST_FUSED=K each step is K allreduces of kCount / K elements,
// one handle each, which the runtime fuses into one bucket; with
// GYRE_TEST_KILL_IN_SEND=1 as well, the rank dies inside that bucket's ring
// (kill_in_send.cc): at step 0 it counts the bucket's data sends, and at the
// kill step it dies just before posting the first send of the second half
// of them, the bucket half reduced on every rank. Every completed step's
// result is checked element by element before it is committed (no partial
// result may be reported as complete), and after the recovery each
// survivor's state must equal, bit for bit, the commit of the agreed step.
//
// The state is a running sum of the allreduce results. Rank p (its rank at
// start) contributes v(p, s, i) = (p + 1) * 1000 + s * 10 + i % 7 at step s,
// so the final sum is known in closed form from the set of ranks that took
// part in each committed step, which every survivor records. Sums are int64:
// exact, whatever the order of reduction.
//
// Prints "elastic: rank P PASS ..." per survivor (run_elastic.sh counts
// them) and the recovery time: from the failure seen by this rank to the
// first step completed after the rebuild. For benchmarks/elastic_recovery.sh
// the killed rank prints "elastic: rank P killed at T" and every survivor
// "elastic: rank P recovered at T", T in nanoseconds of steady_clock
// (CLOCK_MONOTONIC, common to the processes of one host): the job's recovery
// time is the latest survivor's T minus the kill's.
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gyre/elastic.h"
#include "gyre/gyre.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kSteps = 16;
constexpr std::int64_t kCount = 1 << 18;  // 2 MiB of int64: several ring chunks

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoi(v) : fallback;
}

long long mono_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

std::int64_t value(int start_rank, int step, std::int64_t i) {
  return (start_rank + 1) * 1000 + step * 10 + i % 7;
}

}  // namespace

// kill_in_send.cc, linked in.
extern "C" void gyre_test_arm_kill(long nth, long min_bytes, int rank);
extern "C" long gyre_test_sends(void);

namespace {

[[noreturn]] void fail(int me, const std::string& what) {
  std::fprintf(stderr, "elastic: rank %d FAIL: %s\n", me, what.c_str());
  std::fflush(stderr);
  std::exit(1);
}

}  // namespace

int main() {
  gyre::init(gyre::Options::from_env());
  const int me = gyre::rank();  // rank at start, kept across rebuilds
  const int kill_rank = env_int("GYRE_TEST_KILL_RANK", 1);
  const int kill_step = env_int("GYRE_TEST_KILL_STEP", 7);
  const int kill_after_us = env_int("GYRE_TEST_KILL_AFTER_US", 0);
  const int kill_in_recovery = env_int("GYRE_TEST_KILL_IN_RECOVERY_RANK", -1);
  const int fused = env_int("GYRE_TEST_FUSED", 1);
  const bool kill_in_send = env_int("GYRE_TEST_KILL_IN_SEND", 0) != 0;
  if (fused < 1 || kCount % fused != 0) fail(me, "GYRE_TEST_FUSED must divide the count");
  const std::int64_t part = kCount / fused;
  // The data sends of the fused bucket (2 MiB over 3 ranks: ring chunks of
  // about 233 KiB, under GYRE_RING_CHUNK_BYTES' 256 KiB) are at least half a
  // member's size; a member reduced alone would send a third of it at most.
  const long bucket_send_bytes = static_cast<long>(part * sizeof(std::int64_t)) / 2;
  long sends_per_step = 0;
  const int start_size = gyre::size();
  const int end_size = start_size - 1 - (kill_in_recovery >= 0 ? 1 : 0);
  if (!gyre::elastic_enabled()) {
    fail(me, "needs a ULFM build run with mpirun --with-ft ulfm");
  }
  // start_ranks[r]: the start rank of the rank now numbered r.
  std::vector<int> start_ranks;
  for (int r = 0; r < gyre::size(); ++r) start_ranks.push_back(r);

  std::vector<std::int64_t> acc(kCount, 0), buf(kCount);
  // This rank's last two commits of acc (its own count of commits, and the
  // values), to check the state after a recovery bit for bit.
  std::vector<std::int64_t> commit_now(acc), commit_before(acc);
  std::uint64_t commit_now_step = 0;
  // members[s]: the start ranks whose contributions step s committed.
  std::vector<std::set<int>> members;
  int failures = 0;
  double recovery_s = -1.0, rebuild_s = -1.0;
  Clock::time_point failed_at{};
  bool recovering = false;

  // The state (acc) is committed and restored by gyre::elastic::State, the
  // recovery driven by gyre::elastic::run; members and start_ranks, the
  // test's own records, roll back in the reset callback.
  gyre::elastic::State state;
  state.add("acc", acc);
  try {  // a second buffer of the same name is refused
    state.add("acc", buf);
    fail(me, "State::add accepted a duplicate name");
  } catch (const gyre::InvalidArgument&) {
  }
  state.on_failure([&](const gyre::RankFailedError& e) {
    ++failures;
    std::fprintf(stderr, "elastic: rank %d saw at step %llu: %.200s\n", me,
                 static_cast<unsigned long long>(gyre::committed_steps()), e.what());
    if (me == kill_in_recovery) std::raise(SIGKILL);
  });
  state.on_reset([&](const gyre::elastic::Recovery& r) {
    const gyre::RebuildInfo& info = r.info;
    rebuild_s = info.seconds;
    failed_at = r.failed_at;
    std::vector<int> next;
    for (int prev : info.previous_ranks) next.push_back(start_ranks.at(prev));
    start_ranks = next;
    std::fprintf(stderr,
                 "elastic: rank %d rebuilt in %.3f s: now rank %d of %d, agreed step %llu "
                 "(own commit %llu), state from rank %d, lost %zu rank(s)\n",
                 me, info.seconds, info.rank, info.size,
                 static_cast<unsigned long long>(info.step),
                 static_cast<unsigned long long>(r.own_commit), info.root, info.lost.size());
    members.resize(info.step);
    recovering = true;
    // The state now is the agreed commit: this rank's own when it holds that
    // step, else (one commit ahead) the one before its last.
    const std::vector<std::int64_t>* want = nullptr;
    if (commit_now_step == info.step) want = &commit_now;
    if (commit_now_step == info.step + 1) want = &commit_before;
    if (want == nullptr) fail(me, "the agreed step is not one of this rank's last two commits");
    if (std::memcmp(acc.data(), want->data(), kCount * sizeof(std::int64_t)) != 0) {
      fail(me, "after the recovery the state differs from the commit of step " +
                   std::to_string(info.step));
    }
    commit_now_step = info.step;
    commit_now = *want;
  });

  // Process sets made before the failure (GYRE_TEST_PROCESS_SETS).
  std::vector<int> old_sets;
  if (env_int("GYRE_TEST_PROCESS_SETS", 0) != 0) {
    if (start_size != 3 || kill_rank != 1) fail(me, "GYRE_TEST_PROCESS_SETS needs 3 ranks, rank 1 killed");
    for (const std::vector<int>& ranks : {std::vector<int>{0, 2}, std::vector<int>{0, 1}}) {
      const int id = gyre::add_process_set(ranks);
      old_sets.push_back(id);
      if (std::find(ranks.begin(), ranks.end(), me) != ranks.end()) {
        std::int64_t one = 1;
        gyre::TensorView v{&one, gyre::DataType::kInt64, {1}};
        gyre::allreduce_async("set.check", v, v, gyre::ReduceOp::kSum, 1.0, 1.0, id).wait();
        if (one != 2) fail(me, "allreduce on process set " + std::to_string(id) + " gave " +
                                   std::to_string(one));
      }
    }
  }

  gyre::elastic::run(state, [&](gyre::elastic::State& s) {
    for (int step = static_cast<int>(gyre::committed_steps()); step < kSteps; ++step) {
      for (std::int64_t i = 0; i < kCount; ++i) buf[i] = value(me, step, i);
      const bool dies_here = me == kill_rank && step == kill_step;
      if (kill_in_send && me == kill_rank) {
        // Step 0 counts the bucket's sends; the kill step dies at the first
        // send of its second half.
        const long nth = dies_here ? sends_per_step / 2 + 1 : 0;
        if (dies_here && sends_per_step < 2) {
          fail(me, "step 0 made " + std::to_string(sends_per_step) +
                       " data sends of the fused bucket: nothing to cut in half");
        }
        gyre_test_arm_kill(nth, bucket_send_bytes, me);
      }
      std::vector<gyre::Handle> handles;
      for (int j = 0; j < fused; ++j) {
        gyre::TensorView v{buf.data() + j * part, gyre::DataType::kInt64, {part}};
        const std::string name = fused == 1 ? "grad" : "grad." + std::to_string(j);
        handles.push_back(gyre::allreduce_async(name, v, v, gyre::ReduceOp::kSum));
      }
      if (dies_here && !kill_in_send) {
        // Fault injection, not a wait for a result.
        if (kill_after_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(kill_after_us));
        std::fprintf(stderr, "elastic: rank %d killed at %lld\n", me, mono_ns());
        std::fflush(stderr);
        std::raise(SIGKILL);
      }
      for (gyre::Handle& h : handles) h.wait();
      if (kill_in_send && me == kill_rank && step == 0) sends_per_step = gyre_test_sends();
      // Every completed result is exact: the sum over the ranks now in the
      // world (no partial result is reported as complete).
      for (std::int64_t i = 0; i < kCount; ++i) {
        std::int64_t want = 0;
        for (int p : start_ranks) want += value(p, step, i);
        if (buf[i] != want) {
          fail(me, "step " + std::to_string(step) + " completed with element " +
                       std::to_string(i) + " = " + std::to_string(buf[i]) + ", expected " +
                       std::to_string(want));
        }
      }
      for (std::int64_t i = 0; i < kCount; ++i) acc[i] += buf[i];
      members.emplace_back(start_ranks.begin(), start_ranks.end());
      s.commit();
      commit_before.swap(commit_now);
      commit_now = acc;
      commit_now_step = gyre::committed_steps();
      if (recovering) {
        recovering = false;
        const Clock::time_point now = Clock::now();
        recovery_s = std::chrono::duration<double>(now - failed_at).count();
        std::fprintf(stderr, "elastic: rank %d recovered at %lld\n", me,
                     static_cast<long long>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                now.time_since_epoch())
                                                .count()));
      }
    }
  });

  // Operations on the process sets from before the rebuild fail at once, on
  // every survivor, member or not, saying why.
  for (int id : old_sets) {
    const std::string set = "process set " + std::to_string(id);
    const auto expect_dropped = [&](const char* what, const std::function<void()>& call) {
      const Clock::time_point t0 = Clock::now();
      try {
        call();
        fail(me, std::string(what) + " on the dropped " + set + " did not fail");
      } catch (const gyre::StateError& e) {
        const std::string msg = e.what();
        if (msg.find(set) == std::string::npos || msg.find("dropped by gyre::rebuild()") ==
                                                      std::string::npos) {
          fail(me, std::string(what) + " on the dropped " + set + ": unclear error: " + msg);
        }
      } catch (const std::exception& e) {
        fail(me, std::string(what) + " on the dropped " + set + ": wrong error: " + e.what());
      }
      if (Clock::now() - t0 > std::chrono::seconds(10)) {
        fail(me, std::string(what) + " on the dropped " + set + " took over 10 s to fail");
      }
    };
    std::int64_t one = 1;
    gyre::TensorView v{&one, gyre::DataType::kInt64, {1}};
    expect_dropped("allreduce", [&] {
      gyre::allreduce_async("set.after", v, v, gyre::ReduceOp::kSum, 1.0, 1.0, id).wait();
    });
    expect_dropped("broadcast", [&] { gyre::broadcast_async("set.after.b", v, 0, id).wait(); });
    expect_dropped("barrier", [&] { gyre::barrier(id); });
    expect_dropped("process_set_ranks", [&] { gyre::process_set_ranks(id); });
  }
  if (!old_sets.empty()) {
    std::fprintf(stderr, "elastic: rank %d: operations on the %zu dropped process sets failed "
                         "as expected\n", me, old_sets.size());
  }

  // The closed form from the recorded membership of each committed step.
  if (static_cast<int>(members.size()) != kSteps) fail(me, "wrong number of committed steps");
  for (std::int64_t i = 0; i < kCount; ++i) {
    std::int64_t want = 0;
    for (int s = 0; s < kSteps; ++s) {
      for (int p : members[s]) want += value(p, s, i);
    }
    if (acc[i] != want) {
      fail(me, "element " + std::to_string(i) + " is " + std::to_string(acc[i]) + ", expected " +
                   std::to_string(want));
    }
  }
  // Before the kill every rank took part; from the step after it, only the
  // survivors; the killed step itself either completed with every rank (its
  // last data was out before it died) or was redone by the survivors.
  const auto all = static_cast<std::size_t>(start_size), rest = static_cast<std::size_t>(end_size);
  for (int s = 0; s < kSteps; ++s) {
    const std::size_t n = members[s].size();
    const bool ok = s < kill_step ? n == all : s > kill_step ? n == rest : n == all || n == rest;
    const bool dead_in = members[s].count(kill_rank) + members[s].count(kill_in_recovery) > 0;
    if (!ok || dead_in != (n == all)) {
      fail(me, "step " + std::to_string(s) + " committed with " + std::to_string(n) + " ranks");
    }
  }
  const int max_failures = kill_in_recovery >= 0 ? 2 : 1;
  if (failures < 1 || failures > max_failures) {
    fail(me, "expected 1 to " + std::to_string(max_failures) + " failures, saw " +
                 std::to_string(failures));
  }
  if (gyre::size() != end_size) fail(me, "wrong world size after the rebuild");
  std::printf("elastic: rank %d PASS: %d steps, now rank %d of %d, step %d committed by %zu "
              "ranks; rebuild %.3f s, recovery (failure to first step after it) %.3f s\n",
              me, kSteps, gyre::rank(), gyre::size(), kill_step, members[kill_step].size(),
              rebuild_s, recovery_s);
  std::fflush(stdout);
  gyre::shutdown();
  return 0;
}
