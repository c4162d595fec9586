// Latency mode: the time of one 8-byte allreduce (two float32, sum), from
// the call to its completion, through gyre's runtime (gyre::allreduce, the
// blocking call), through the bare ring, and through MPI_Allreduce.
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench_common.h"
#include "bench_modes.h"
#include "gyre/gyre.h"

namespace gyre::bench {
namespace {

constexpr long kLatencyWarmup = 100;
constexpr long kDefaultSamples = 1000;
constexpr std::size_t kCount = 2;  // 8 bytes of float32

struct Sampled {
  System sys;
  std::vector<double> times;  // seconds per sample: this rank, then slowest rank
  float out[kCount] = {};
  std::uint64_t wrong = 0;
};

}  // namespace

int run_latency(const PerfOptions& o) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const long warmup = o.warmup >= 0 ? o.warmup : kLatencyWarmup;
  const long samples = o.iters > 0 ? o.iters : kDefaultSamples;
  const DataType dt = DataType::kFloat32;
  const ReduceOp op = ReduceOp::kSum;

  float in[kCount];
  fill_input(in, kCount, dt, op, rank, world);

  std::vector<Sampled> systems;
  // The ring's transport first (see gradient_set.cc), then the runtime.
  systems.push_back({make_bare_system(o), {}});
  init();
  systems.insert(systems.begin(), Sampled{make_runtime_system("latency.8B"), {}});
  systems.push_back({make_mpi_system(), {}});

  for (long s = 0; s < warmup + samples; ++s) {
    // Interleaved sample by sample, so that machine noise hits every system alike.
    for (Sampled& x : systems) {
      poison(x.out, sizeof(x.out));
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = now_s();
      x.sys.run(in, x.out, kCount, dt, op);
      const double t = now_s() - t0;
      if (s >= warmup) x.times.push_back(t);
      // Every sample's result is checked (it costs nothing at this size).
      x.wrong += count_wrong(x.out, kCount, dt, op, world);
    }
  }
  std::uint64_t total_wrong = 0;
  for (Sampled& x : systems) {
    x.times = max_across_ranks(x.times);
    std::uint64_t all = 0;
    MPI_Allreduce(&x.wrong, &all, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    x.wrong = all;
    total_wrong += all;
  }

  if (rank == 0) {
    fmt::print("# gyre-allreduce-perf latency: 8 bytes (2 x float32, sum), {} ranks\n", world);
    fmt::print("# per sample: barrier, then call to completion; slowest rank; {} samples after {} warm-up; "
               "systems interleaved\n#\n",
               samples, warmup);
    fmt::print("# {:<14} {:>10} {:>10} {:>10} {:>10} {:>10} {:>7}\n", "system", "median", "p10", "p90", "p99",
               "mean", "#wrong");
    fmt::print("# {:<14} {:>10} {:>10} {:>10} {:>10} {:>10} {:>7}\n", "", "(us)", "(us)", "(us)", "(us)", "(us)",
               "");
    std::string json = fmt::format(
        "{{\"benchmark\": \"latency\", \"bytes\": 8, \"ranks\": {}, \"samples\": {},\n \"rows\": [\n", world,
        samples);
    for (std::size_t j = 0; j < systems.size(); ++j) {
      const Sampled& x = systems[j];
      const double med = median(x.times) * 1e6, p10 = percentile(x.times, 10) * 1e6,
                   p90 = percentile(x.times, 90) * 1e6, p99 = percentile(x.times, 99) * 1e6,
                   avg = mean(x.times) * 1e6;
      fmt::print("  {:<14} {:>10.2f} {:>10.2f} {:>10.2f} {:>10.2f} {:>10.2f} {:>7}\n", x.sys.name, med, p10, p90,
                 p99, avg, x.wrong);
      json += fmt::format(
          "  {{\"system\": {}, \"median_us\": {}, \"p10_us\": {}, \"p90_us\": {}, \"p99_us\": {}, "
          "\"mean_us\": {}, \"wrong\": {}}}{}\n",
          json_string(x.sys.name), json_number(med), json_number(p10), json_number(p90), json_number(p99),
          json_number(avg), x.wrong, j + 1 < systems.size() ? "," : "");
    }
    json += " ]}\n";
    fmt::print("# Wrong elements in total: {} {}\n", total_wrong, total_wrong == 0 ? "OK" : "FAILED");
    const RuntimeStats st = runtime_stats();
    fmt::print("# rank 0's runtime: {} rounds, {} run by waiting callers, {} operations handed to "
               "the background thread, {} of its wake-ups left the rounds to the callers\n",
               st.rounds, st.caller_rounds, st.caller_handoffs, st.rounds_left_to_callers);
    if (!o.json_path.empty()) write_file(o.json_path, json);
  }
  return total_wrong == 0 ? 0 : 1;
}

}  // namespace gyre::bench
