// Round trip of a lone small allreduce through the runtime: every rank
// enqueues the same 8-byte tensor, waits, repeats. Checks every result and
// prints the mean and median latency (not asserted: timings vary), and the
// negotiation's messages per round, share of log-depth rounds, and the
// allreduces reduced within the round itself (GYRE_SPECULATE_BYTES) with
// all the runtime's messages per call. A second argument "async" times
// allreduce_async(...).wait() instead of the blocking gyre::allreduce (no
// gyre::WaitFollows: the enqueue wakes the background thread); "barrier"
// puts a barrier before each call, as gyre-allreduce-perf --latency does.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gyre/gyre.h"

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 2000;
  const bool async = argc > 2 && std::string(argv[2]) == "async";
  const bool barrier = argc > 2 && std::string(argv[2]) == "barrier";
  gyre::init(gyre::Options::from_env());
  const int n = gyre::size();
  double x = 0;
  gyre::TensorView v{&x, gyre::DataType::kFloat64, {1}};
  std::vector<double> us;
  int wrong = 0;
  gyre::barrier();
  const gyre::RuntimeStats before = gyre::runtime_stats();
  for (int i = 0; i < iters; ++i) {
    x = gyre::rank() + i;
    if (barrier) gyre::barrier();
    auto t0 = std::chrono::steady_clock::now();
    if (async) {
      gyre::allreduce_async("latency", v, v, gyre::ReduceOp::kSum).wait();
    } else {
      gyre::allreduce("latency", v, v, gyre::ReduceOp::kSum);
    }
    auto t1 = std::chrono::steady_clock::now();
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    if (x != n * (n - 1) / 2.0 + static_cast<double>(n) * i) ++wrong;
  }
  const gyre::RuntimeStats after = gyre::runtime_stats();
  const double rounds = static_cast<double>(after.rounds - before.rounds);
  std::sort(us.begin(), us.end());
  double mean = 0;
  for (double u : us) mean += u;
  mean /= static_cast<double>(us.size());
  if (gyre::rank() == 0) {
    std::printf("8-byte allreduce through the runtime, %d ranks, %d iterations: mean %.1f us, "
                "median %.1f us, p90 %.1f us, p99 %.1f us, #wrong %d\n",
                n, iters, mean, us[us.size() / 2], us[us.size() * 9 / 10],
                us[us.size() * 99 / 100], wrong);
    std::printf("negotiation: %.0f rounds, %.2f messages per round from rank 0, %.0f%% of rounds "
                "in log depth; %llu of %d calls reduced within the round; %.2f transport messages "
                "per call from rank 0\n",
                rounds, static_cast<double>(after.negotiation_messages - before.negotiation_messages) /
                            std::max(rounds, 1.0),
                100.0 * static_cast<double>(after.log_depth_rounds - before.log_depth_rounds) /
                    std::max(rounds, 1.0),
                static_cast<unsigned long long>(after.speculated_allreduces -
                                                before.speculated_allreduces),
                iters,
                static_cast<double>(after.transport_messages - before.transport_messages) / iters);
    std::printf("rounds run by waiting callers %llu, operations they handed to the background "
                "thread %llu, its wake-ups that left the rounds to them %llu\n",
                static_cast<unsigned long long>(after.caller_rounds - before.caller_rounds),
                static_cast<unsigned long long>(after.caller_handoffs - before.caller_handoffs),
                static_cast<unsigned long long>(after.rounds_left_to_callers -
                                                before.rounds_left_to_callers));
  }
  gyre::shutdown();
  return wrong == 0 ? 0 : 1;
}
