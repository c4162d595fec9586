// gyre-p2p-perf: the latency of a send/recv pair and of an allreduce, each
// alone and both in flight at once, through gyre's public API. Run it
// twice, with GYRE_P2P_ON_COORDINATOR=0 (point-to-point on a thread of its
// own, the default) and =1 (driven by the runtime's background loop between
// its rounds), to compare the two designs: docs/architecture.md ("Point to
// point: a thread of its own") holds the commands and the figures.
//
// Launch with `mpirun -np N` (N >= 2); rank 0 prints. Ranks 0 and 1
// ping-pong; every rank allreduces. Three phases, one after the other:
//   p2p alone        ranks 0 and 1: send then recv (rank 1: recv then send)
//                    of --p2p bytes; a sample is half the round trip;
//   allreduce alone  every rank: allreduce_async + wait of --allreduce bytes;
//   both             a thread on every rank runs the allreduces back to back
//                    while ranks 0 and 1 ping-pong as above; an allreduce
//                    sample counts when it started and ended within the
//                    ping-pong. The allreduces stop together: rank 0 raises a
//                    flag element in its input once its ping-pong is done,
//                    and every rank stops after the allreduce that carried it.
// Every payload is checked; wrong elements are counted and fail the run.
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "bench_common.h"
#include "gyre/error.h"
#include "gyre/gyre.h"

namespace gyre::bench {
namespace {

struct P2pPerfOptions {
  std::size_t p2p_bytes = 8;
  std::size_t allreduce_bytes = 16u << 20;
  long samples = 300;  // per phase (ping-pong round trips; allreduces alone)
  long warmup = 20;
};

TensorView f32(std::vector<float>& v) {
  return TensorView{v.data(), DataType::kFloat32, {static_cast<std::int64_t>(v.size())}, {}};
}

// One ping-pong round trip on rank 0 or 1; returns half its time (s).
// Round `k`'s payload is k on the way there, k + 1 on the way back.
double ping_pong(int rank, std::vector<float>& buf, long k, std::uint64_t* wrong) {
  const double t0 = now_s();
  if (rank == 0) {
    std::fill(buf.begin(), buf.end(), static_cast<float>(k));
    send_async(f32(buf), 1).wait();
    recv_async(f32(buf), 1).wait();
    for (float x : buf) *wrong += x != static_cast<float>(k + 1);
  } else {
    recv_async(f32(buf), 0).wait();
    for (float& x : buf) {
      *wrong += x != static_cast<float>(k);
      x = static_cast<float>(k + 1);
    }
    send_async(f32(buf), 0).wait();
  }
  return (now_s() - t0) / 2;
}

// Every input element is 1 but element 0 (the stop flag, 0 or 1 on rank 0).
void allreduce_once(std::vector<float>& in, std::vector<float>& out, int world,
                    std::uint64_t* wrong) {
  allreduce_async("p2p_perf.allreduce", f32(in), f32(out), ReduceOp::kSum).wait();
  for (std::size_t i = 1; i < out.size(); ++i) *wrong += out[i] != static_cast<float>(world);
}

struct Row {
  std::string what;
  std::vector<double> t;  // seconds
};

void print_row(const Row& r) {
  if (r.t.empty()) {
    fmt::print("  {:<26} {:>8}\n", r.what, "no samples");
    return;
  }
  fmt::print("  {:<26} {:>8} {:>10.1f} {:>10.1f} {:>10.1f} {:>10.1f}\n", r.what, r.t.size(),
             median(r.t) * 1e6, percentile(r.t, 10) * 1e6, percentile(r.t, 90) * 1e6,
             mean(r.t) * 1e6);
}

int run(const P2pPerfOptions& o) {
  init();
  const int rank = gyre::rank(), world = gyre::size();
  if (world < 2) throw InvalidArgument("gyre-p2p-perf needs at least 2 ranks");
  const bool pinger = rank < 2;
  std::vector<float> pp(std::max<std::size_t>(1, o.p2p_bytes / sizeof(float)));
  std::vector<float> in(std::max<std::size_t>(2, o.allreduce_bytes / sizeof(float)), 1.0f);
  std::vector<float> out(in.size());
  in[0] = 0;
  std::uint64_t wrong = 0;
  Row p2p_alone{"send/recv alone (one way)", {}}, ar_alone{"allreduce alone", {}};
  Row p2p_both{"send/recv beside allreduce", {}}, ar_both{"allreduce beside send/recv", {}};

  // Phase 1: ping-pong alone.
  MPI_Barrier(MPI_COMM_WORLD);
  if (pinger) {
    for (long k = 0; k < o.warmup + o.samples; ++k) {
      const double t = ping_pong(rank, pp, k, &wrong);
      if (k >= o.warmup) p2p_alone.t.push_back(t);
    }
  }
  // Phase 2: allreduce alone.
  MPI_Barrier(MPI_COMM_WORLD);
  for (long k = 0; k < o.warmup + o.samples; ++k) {
    const double t0 = now_s();
    allreduce_once(in, out, world, &wrong);
    if (k >= o.warmup) ar_alone.t.push_back(now_s() - t0);
  }
  // Phase 3: both.
  MPI_Barrier(MPI_COMM_WORLD);
  std::atomic<bool> pp_started{false}, pp_done{false}, first_done{false};
  std::uint64_t ar_wrong = 0;
  std::thread reducer([&] {
    for (;;) {
      if (rank == 0 && pp_done.load()) in[0] = 1;  // the last allreduce
      const bool during = pp_started.load();
      const double t0 = now_s();
      allreduce_once(in, out, world, &ar_wrong);
      const double t = now_s() - t0;
      first_done = true;
      if (during && !pp_done.load()) ar_both.t.push_back(t);
      if (out[0] != 0) break;  // every rank sees rank 0's flag in the same allreduce
    }
  });
  if (pinger) {
    while (!first_done.load()) std::this_thread::yield();
    pp_started = true;
    for (long k = 0; k < o.samples; ++k) p2p_both.t.push_back(ping_pong(rank, pp, k, &wrong));
  }
  pp_done = true;
  reducer.join();
  in[0] = 0;
  wrong += ar_wrong;

  std::uint64_t all_wrong = 0;
  MPI_Allreduce(&wrong, &all_wrong, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) {
    const Options opt = Options::from_env();
    fmt::print("# gyre-p2p-perf: {} ranks, send/recv of {} B between ranks 0 and 1, allreduce of "
               "{} B (float32, sum) on every rank\n",
               world, o.p2p_bytes, o.allreduce_bytes);
    fmt::print("# point-to-point driven by: {} (GYRE_P2P_ON_COORDINATOR={})\n",
               opt.p2p_on_coordinator ? "the runtime's background loop" : "its own thread",
               opt.p2p_on_coordinator);
    fmt::print("# rank 0's samples; {} per phase alone after {} warm-up\n#\n", o.samples,
               o.warmup);
    fmt::print("# {:<26} {:>8} {:>10} {:>10} {:>10} {:>10}\n", "phase", "samples", "median",
               "p10", "p90", "mean");
    fmt::print("# {:<26} {:>8} {:>10} {:>10} {:>10} {:>10}\n", "", "", "(us)", "(us)", "(us)",
               "(us)");
    for (const Row* r : {&p2p_alone, &ar_alone, &p2p_both, &ar_both}) print_row(*r);
    fmt::print("# Wrong elements in total: {} {}\n", all_wrong, all_wrong == 0 ? "OK" : "FAILED");
  }
  shutdown();
  return all_wrong == 0 ? 0 : 1;
}

constexpr const char* kUsage = R"(usage: mpirun -np N gyre-p2p-perf [options]   (N >= 2)
  -p, --p2p SIZE         bytes of each send/recv (default 8); sizes take K, M, G
  -a, --allreduce SIZE   bytes of each allreduce (default 16M)
  -n, --iters N          samples per phase (default 300)
  -w, --warmup N         untimed samples first, phases alone (default 20)
  -h, --help
Set GYRE_P2P_ON_COORDINATOR=1 to drive point-to-point from the runtime's loop.
)";

}  // namespace
}  // namespace gyre::bench

int main(int argc, char** argv) {
  using namespace gyre::bench;
  P2pPerfOptions o;
  try {
    std::vector<std::string_view> args(argv + 1, argv + argc);
    for (std::size_t k = 0; k < args.size(); ++k) {
      const std::string_view a = args[k];
      auto value = [&]() -> std::string_view {
        if (k + 1 >= args.size()) {
          throw gyre::InvalidArgument(fmt::format("option {} needs a value", a));
        }
        return args[++k];
      };
      if (a == "-h" || a == "--help") {
        std::fputs(kUsage, stdout);
        return 0;
      }
      if (a == "-p" || a == "--p2p") o.p2p_bytes = parse_size(a, value());
      else if (a == "-a" || a == "--allreduce") o.allreduce_bytes = parse_size(a, value());
      else if (a == "-n" || a == "--iters") o.samples = parse_int(a, value(), 1);
      else if (a == "-w" || a == "--warmup") o.warmup = parse_int(a, value(), 0);
      else throw gyre::InvalidArgument(fmt::format("unknown option '{}'\n{}", a, kUsage));
    }
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gyre-p2p-perf: %s\n", e.what());
    return 2;
  }
}
