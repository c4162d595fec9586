// One rank fails in the middle of a stream of allreduces, with its operation
// in flight (the others are inside the same collective or the negotiation
// round around it), and the job must end non-zero in bounded time:
//
//   gyre_core_failing_rank kill
//       the rank is killed (SIGKILL). run_killed_rank.sh measures the time
//       from the kill to the end of the job and checks that the dead rank is named and /dev/shm is clean.
//   gyre_core_failing_rank stop [DELAY_US]
//       the rank stops (SIGSTOP), all its threads with it, DELAY_US after
//       enqueueing (0: mostly while its background thread negotiates; a few
//       ms: mostly while it transfers data). run_stopped_rank.sh checks that
//       every other rank logs the deadline error (GYRE_OP_TIMEOUT_S) naming
//       whom it waited for, the time, and that no process is left behind.
//
// GYRE_TEST_KILL_RANK names the failing rank (default 1; across simulated
// hosts, a rank on the other host). GYRE_TEST_FUSED=1: each step is a
// grouped allreduce of 16 tensors of 1 MiB, one fused bucket of 16 MiB (in
// the shared segment's fusion buffers when they are on: a few ms of
// reduction to fail in); else one unfused 4 MiB tensor (several
// shared-memory chunks). Every rank prints its pid first.
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gyre/gyre.h"

namespace {

// Says when the rank fails, for the script's bound (wall clock, as `date`),
// then raises the signal.
void fail_now(int victim, bool stop) {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  std::fprintf(stderr, "rank %d %s at %lld ms\n", victim, stop ? "stops" : "dies",
               static_cast<long long>(
                   std::chrono::duration_cast<std::chrono::milliseconds>(now).count()));
  std::fflush(stderr);
  std::raise(stop ? SIGSTOP : SIGKILL);
}

}  // namespace

int main(int argc, char** argv) {
  const bool stop = argc > 1 && std::strcmp(argv[1], "stop") == 0;
  if (argc < 2 || (!stop && std::strcmp(argv[1], "kill") != 0)) {
    std::fprintf(stderr, "usage: %s kill | stop [DELAY_US]\n", argv[0]);
    return 2;
  }
  const long delay_us = stop && argc > 2 ? std::strtol(argv[2], nullptr, 10) : 0;
  const char* env = std::getenv("GYRE_TEST_KILL_RANK");
  const int victim = env ? std::atoi(env) : 1;
  gyre::init(gyre::Options::from_env());
  std::printf("rank %d pid %d\n", gyre::rank(), static_cast<int>(::getpid()));
  std::fflush(stdout);
  const char* fused_env = std::getenv("GYRE_TEST_FUSED");
  const bool fused = fused_env != nullptr && std::string(fused_env) == "1";
  std::vector<float> g(1 << 22, 1.0f);
  gyre::TensorView v{g.data(), gyre::DataType::kFloat32, {1 << 20}};
  std::vector<gyre::TensorView> parts;
  std::vector<std::string> names;
  for (int k = 0; k < 16; ++k) {
    parts.push_back({g.data() + k * (1 << 18), gyre::DataType::kFloat32, {1 << 18}});
    names.push_back("part." + std::to_string(k));
  }
  for (int step = 0; step < 100000; ++step) {
    gyre::Handle h =
        fused ? gyre::grouped_allreduce_async(names, parts, parts, gyre::ReduceOp::kSum)
              : gyre::allreduce_async("grad." + std::to_string(step % 4), v, v,
                                      gyre::ReduceOp::kSum);
    if (gyre::rank() == victim && step == 50) {
      if (stop) std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
      fail_now(victim, stop);
    }
    h.wait();
  }
  std::fprintf(stderr, "rank %d: 100000 allreduces completed although rank %d %s\n",
               gyre::rank(), victim, stop ? "stopped" : "was killed");
  gyre::shutdown();
  return 0;
}
