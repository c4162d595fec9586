// A rank stopped (SIGSTOP) with a collective in flight (in negotiation or
// in the data transfer): the other ranks must
// end with the deadline error (GYRE_OP_TIMEOUT_S), each logging what it
// waited for, and the job must end non-zero. Run by run_stopped_rank.sh,
// which checks every surviving rank's message, the time, and that no
// process of the job is left behind.
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "gyre/gyre.h"

// Usage: gyre_core_stopped_rank [DELAY_US]: rank 1 stops DELAY_US after
// enqueueing its 51st allreduce (0: at once, mostly while its background
// thread negotiates; a few ms: mostly while it transfers data).
int main(int argc, char** argv) {
  const long delay_us = argc > 1 ? std::strtol(argv[1], nullptr, 10) : 0;
  gyre::init(gyre::Options::from_env());
  std::printf("rank %d pid %d\n", gyre::rank(), static_cast<int>(::getpid()));
  std::fflush(stdout);
  // STOPPED_RANK_FUSED=1: a grouped allreduce of 16 tensors of 1 MiB per
  // step, one fused bucket of 16 MiB (in the shared segment's fusion buffers
  // when they are on: a few ms of reduction to stop in); else one unfused
  // 4 MiB tensor: several shared-memory chunks.
  const char* fused_env = std::getenv("STOPPED_RANK_FUSED");
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
    // Rank 1 stops, all its threads with it, while its operation is in
    // flight (the others are inside the collective or the negotiation
    // round around it).
    if (gyre::rank() == 1 && step == 50) {
      std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
      // When it stopped, for the script's bound (wall clock, as `date`).
      const auto now = std::chrono::system_clock::now().time_since_epoch();
      std::fprintf(stderr, "rank 1 stops at %lld ms\n",
                   static_cast<long long>(
                       std::chrono::duration_cast<std::chrono::milliseconds>(now).count()));
      std::fflush(stderr);
      std::raise(SIGSTOP);
    }
    h.wait();
  }
  std::fprintf(stderr, "rank %d: 100000 allreduces completed although rank 1 stopped\n",
               gyre::rank());
  gyre::shutdown();
  return 0;
}
