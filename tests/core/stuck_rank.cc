// A rank that stops responding (SIGSTOP on itself) must make the job end
// with a non-zero status, the waiting ranks logging what they waited for,
// within GYRE_OP_TIMEOUT_S. Run by run_stuck_rank.sh, which checks both.
#include <csignal>
#include <cstdio>
#include <vector>

#include "gyre/gyre.h"

int main() {
  gyre::init(gyre::Options::from_env());
  std::vector<float> g(16, 1.0f);
  gyre::TensorView v{g.data(), gyre::DataType::kFloat32, {16}};
  gyre::allreduce_async("before.stop", v, v).wait();
  if (gyre::rank() == 1) std::raise(SIGSTOP);
  // The other ranks wait for rank 1 until the deadline aborts the job.
  gyre::allreduce_async("never.completes", v, v).wait();
  std::fprintf(stderr, "rank %d: the allreduce completed without rank 1\n", gyre::rank());
  gyre::shutdown();
  return 0;
}
