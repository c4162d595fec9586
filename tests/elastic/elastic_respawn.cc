// Growing back and the lower bound, through the C++ API (gyre::elastic::State
// and run), under an MPI with ULFM and `mpirun --with-ft ulfm`.
//
// Every rank runs kSteps allreduces of int64, committing after each. Rank
// GYRE_TEST_KILL_RANK (default 1) SIGKILLs itself right after submitting
// step GYRE_TEST_KILL_STEP (default 7). With GYRE_TEST_KILL_REPLACEMENT_STEP
// = s, the first replacement rank (started by the first rebuild) SIGKILLs
// itself right after submitting step s: a respawned rank failing again.
//
// With GYRE_ELASTIC_RESPAWN=1 the survivors start replacements, and the job
// must finish on the size it started with. A rank contributes
// v(r, s, i) = (r + 1) * 1000 + s * 10 + i % 7 at step s, r its rank *at
// that step*; so when every step is committed by as many ranks as at the
// start, the final sum is that of a run without failure, whatever ranks
// died, in closed form, exact in int64. A replacement also checks that the
// state it received before its first step is the closed form of the steps
// committed before it. Each finishing rank prints "elastic: rank P PASS".
// With GYRE_ELASTIC_MAX_NP=4 and GYRE_TEST_NP_AFTER=4 the world grows past
// its start size: the steps from the first rebuild's agreed step on count
// 4 ranks.
//
// With GYRE_ELASTIC_MIN_NP above the survivors (and no respawn), every
// survivor must end with StateError naming the count and the bound: it
// prints "elastic: rank P ENDED: <message>" and exits with status 3.
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gyre/elastic.h"
#include "gyre/gyre.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kSteps = 14;
constexpr std::int64_t kCount = 1 << 16;  // 512 KiB of int64: several ring chunks

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

std::int64_t value(int rank, int step, std::int64_t i) {
  return (rank + 1) * 1000 + step * 10 + i % 7;
}

// The sum of the first `steps` steps, each committed by `ranks` ranks before
// step `grown_at` and by `ranks_after` from there on.
std::int64_t expected(int ranks, int ranks_after, int grown_at, int steps, std::int64_t i) {
  std::int64_t want = 0;
  for (int s = 0; s < steps; ++s) {
    for (int r = 0; r < (s < grown_at ? ranks : ranks_after); ++r) want += value(r, s, i);
  }
  return want;
}

// steady_clock (CLOCK_MONOTONIC, common to the processes of one host), for
// the time from a kill to the survivors' end below min_np.
long long mono_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

[[noreturn]] void fail(const std::string& who, const std::string& what) {
  std::fprintf(stderr, "elastic: rank %s FAIL: %s\n", who.c_str(), what.c_str());
  std::fflush(stderr);
  std::exit(1);
}

}  // namespace

int main() {
  gyre::init();
  const bool replacement = gyre::is_replacement();
  // Names in the output: start rank, or "r<rank>@<rebuilds>" for a replacement.
  const std::string who = replacement ? "r" + std::to_string(gyre::rank()) + "@" +
                                            std::to_string(gyre::replacement_info().rebuilds)
                                      : std::to_string(gyre::rank());
  if (!gyre::elastic_enabled()) fail(who, "needs a ULFM build run with mpirun --with-ft ulfm");
  const int kill_rank = env_int("GYRE_TEST_KILL_RANK", 1);
  const int kill_step = env_int("GYRE_TEST_KILL_STEP", 7);
  const int kill_replacement_step = env_int("GYRE_TEST_KILL_REPLACEMENT_STEP", -1);
  const bool respawn = env_int("GYRE_ELASTIC_RESPAWN", 0) == 1;
  // The size a run without failure has: the replacements' starters tell it
  // through the environment they pass on.
  const int full_size = env_int("GYRE_TEST_NP", gyre::size());
  const bool first_replacement = replacement && gyre::replacement_info().rebuilds == 1;
  // With GYRE_ELASTIC_MAX_NP above the size at start, the world grows to
  // GYRE_TEST_NP_AFTER ranks from the agreed step of the first rebuild.
  const int size_after = env_int("GYRE_TEST_NP_AFTER", full_size);
  int grown_at = first_replacement ? static_cast<int>(gyre::replacement_info().step) : kSteps;

  std::vector<std::int64_t> acc(kCount, 0), buf(kCount);
  gyre::elastic::State state;
  state.add("acc", acc);
  int failures = 0, rebuilds = 0, spawned = 0;
  double recovery_s = -1.0;
  Clock::time_point failed_at{};
  bool recovering = false, first_entry = true;
  state.on_failure([&](const gyre::RankFailedError&) {
    ++failures;
    failed_at = Clock::now();
  });
  state.on_reset([&](const gyre::elastic::Recovery& r) {
    if (rebuilds++ == 0) grown_at = static_cast<int>(r.info.step);
    spawned += r.info.spawned;
    recovering = true;
    std::fprintf(stderr,
                 "elastic: rank %s rebuilt in %.3f s: now rank %d of %d (%d started), agreed "
                 "step %llu, lost %zu rank(s)\n",
                 who.c_str(), r.info.seconds, r.info.rank, r.info.size, r.info.spawned,
                 static_cast<unsigned long long>(r.info.step), r.info.lost.size());
  });

  try {
    gyre::elastic::run(state, [&](gyre::elastic::State& s) {
      const int from = static_cast<int>(gyre::committed_steps());
      if (replacement && first_entry) {
        // The committed state arrived before this rank's first step.
        for (std::int64_t i = 0; i < kCount; ++i) {
          const std::int64_t want = expected(full_size, size_after, grown_at, from, i);
          if (acc[i] != want) {
            fail(who, "joined at step " + std::to_string(from) + " with element " +
                          std::to_string(i) + " = " + std::to_string(acc[i]) + ", expected " +
                          std::to_string(want));
          }
        }
        std::fprintf(stderr, "elastic: rank %s joined as rank %d of %d at step %d\n",
                     who.c_str(), gyre::rank(), gyre::size(), from);
      }
      first_entry = false;
      for (int step = from; step < kSteps; ++step) {
        const int r = gyre::rank();
        for (std::int64_t i = 0; i < kCount; ++i) buf[i] = value(r, step, i);
        gyre::TensorView v{buf.data(), gyre::DataType::kInt64, {kCount}};
        gyre::Handle h = gyre::allreduce_async("grad", v, v, gyre::ReduceOp::kSum);
        // Fault injection, not a wait for a result.
        if ((!replacement && r == kill_rank && step == kill_step && rebuilds == 0) ||
            (first_replacement && step == kill_replacement_step)) {
          std::fprintf(stderr, "elastic: rank %s killed at step %d at %lld ns\n", who.c_str(),
                       step, mono_ns());
          std::fflush(stderr);
          std::raise(SIGKILL);
        }
        h.wait();
        for (std::int64_t i = 0; i < kCount; ++i) acc[i] += buf[i];
        s.commit();
        if (recovering) {
          recovering = false;
          recovery_s = std::chrono::duration<double>(Clock::now() - failed_at).count();
        }
      }
    });
  } catch (const gyre::StateError& e) {
    std::printf("elastic: rank %s ENDED: %s (at %lld ns)\n", who.c_str(), e.what(), mono_ns());
    std::fflush(stdout);
    return 3;
  }

  for (std::int64_t i = 0; i < kCount; ++i) {
    const std::int64_t want = expected(full_size, size_after, grown_at, kSteps, i);
    if (acc[i] != want) {
      fail(who, "element " + std::to_string(i) + " is " + std::to_string(acc[i]) +
                    ", expected " + std::to_string(want) + " (steps before " +
                    std::to_string(grown_at) + " on " + std::to_string(full_size) +
                    " ranks, then on " + std::to_string(size_after) + ")");
    }
  }
  if (respawn && gyre::size() != size_after) {
    fail(who, "the world has " + std::to_string(gyre::size()) + " ranks at the end, not " +
                  std::to_string(size_after));
  }
  if (!replacement && failures < 1) fail(who, "saw no failure");
  std::printf("elastic: rank %s PASS: %d steps, rank %d of %d at the end, %d failure(s) seen, "
              "%d replacement(s) started; recovery (failure to first step after it, spawn "
              "included) %.3f s\n",
              who.c_str(), kSteps, gyre::rank(), gyre::size(), failures, spawned, recovery_s);
  std::fflush(stdout);
  gyre::shutdown();
  return 0;
}
