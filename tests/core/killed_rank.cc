// A rank killed (SIGKILL) in the middle of a stream of allreduces must make
// the whole job end, non-zero, in bounded time, leaving nothing in /dev/shm.
// Run by run_killed_rank.sh, which measures the time and checks /dev/shm.
// GYRE_TEST_KILL_RANK names the rank that dies (default 1; across simulated
// hosts, a rank on the other host).
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gyre/gyre.h"

int main() {
  const char* env = std::getenv("GYRE_TEST_KILL_RANK");
  const int victim = env ? std::atoi(env) : 1;
  gyre::init(gyre::Options::from_env());
  if (gyre::rank() == 0) std::printf("rank 0 pid %d\n", static_cast<int>(::getpid()));
  std::fflush(stdout);
  std::vector<float> g(1 << 20, 1.0f);  // 4 MiB: several shared-memory chunks
  gyre::TensorView v{g.data(), gyre::DataType::kFloat32, {1 << 20}};
  for (int step = 0; step < 100000; ++step) {
    gyre::Handle h = gyre::allreduce_async("grad." + std::to_string(step % 4), v, v,
                                           gyre::ReduceOp::kSum);
    // The victim dies with its operation in flight (the others are inside
    // the same collective or the negotiation round around it).
    if (gyre::rank() == victim && step == 50) std::raise(SIGKILL);
    h.wait();
  }
  std::fprintf(stderr, "rank %d: 100000 allreduces completed although rank %d was killed\n",
               gyre::rank(), victim);
  gyre::shutdown();
  return 0;
}
