// Gradient-set mode: one training step's gradients (a list of tensor sizes)
// reduced four ways in the same job, with the step time of each:
//   gyre runtime       allreduce_async for every tensor in backward order
//                      (last parameter first), then wait for all: the runtime
//                      negotiates, fuses and rings as it does in training;
//   MPI per tensor     one MPI_Allreduce per tensor, in backward order;
//   MPI fused          one MPI_Allreduce over the flat buffer that holds every
//                      gradient (no packing copies: the best case of fusing
//                      with MPI);
//   gyre ring fused    one collectives::allreduce over the same flat
//                      buffer (the ring over MPI alone, without the runtime);
//   gyre shm fused     one collectives::shm_allreduce over the same flat
//                      buffer when every rank is on one host (the
//                      shared-memory path alone, the runtime's on one host).
// The two MPI systems are timed twice: first before the runtime starts (MPI
// alone in the job: the reference), then beside the runtime.
#include <mpi.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench_common.h"
#include "bench_modes.h"
#include "gyre/collectives/shm.h"
#include "gyre/collectives/shm_host.h"
#include "gyre/gyre.h"

namespace gyre::bench {
namespace {

constexpr long kGradientSetWarmup = 3;
constexpr long kDefaultSteps = 20;

// One element count per line; blank lines and lines starting with '#' are
// skipped. Throws InvalidArgument naming the file and line.
std::vector<std::size_t> read_sizes(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw InvalidArgument(fmt::format("--gradients: cannot open '{}'", path));
  std::vector<std::size_t> sizes;
  std::string line;
  for (int lineno = 1; std::getline(f, line); ++lineno) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    const long v = parse_int(fmt::format("{}:{}", path, lineno), line, 1);
    sizes.push_back(static_cast<std::size_t>(v));
  }
  if (sizes.empty()) throw InvalidArgument(fmt::format("--gradients: '{}' lists no tensor", path));
  return sizes;
}

struct StepSystem {
  StepSystem(std::string k, std::string n, std::function<void()> fn)
      : key(std::move(k)), name(std::move(n)), step(std::move(fn)) {}
  std::string key;  // what --only names
  std::string name;
  std::function<void()> step;
  std::vector<double> times;  // seconds, this rank, then slowest rank
  std::uint64_t wrong = 0;
};

}  // namespace

int run_gradient_set(const PerfOptions& o) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const long warmup = o.warmup >= 0 ? o.warmup : kGradientSetWarmup;
  const long steps = o.iters > 0 ? o.iters : kDefaultSteps;
  const ReduceOp op = o.op_given ? o.op : ReduceOp::kAverage;  // Horovod's default for gradients
  const DataType dt = DataType::kFloat32;

  const std::vector<std::size_t> sizes = read_sizes(o.gradients_path);
  std::vector<std::size_t> offset(sizes.size() + 1, 0);
  for (std::size_t k = 0; k < sizes.size(); ++k) offset[k + 1] = offset[k] + sizes[k];
  const std::size_t total = offset.back();
  const std::size_t bytes = total * sizeof(float);

  // Every rank must replay the same list: compare its length and total.
  std::uint64_t mine[2] = {sizes.size(), total}, lo[2], hi[2];
  MPI_Allreduce(mine, lo, 2, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(mine, hi, 2, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  if (lo[0] != hi[0] || lo[1] != hi[1]) {
    throw InvalidArgument(fmt::format("--gradients '{}': ranks read different lists (rank {}: {} tensors)",
                                      o.gradients_path, rank, sizes.size()));
  }

  HostBuffer in_buf(total * sizeof(float), o.huge_pages), out_buf(total * sizeof(float), o.huge_pages);
  float* const in = reinterpret_cast<float*>(in_buf.data());
  float* const out = reinterpret_cast<float*>(out_buf.data());
  // Each tensor gets the closed-form pattern from its own offset, so a
  // result written to the wrong tensor is caught.
  fill_input(in, total, dt, op, rank, world);

  // The ring's transport is made before the runtime starts, so that its
  // communicator duplication (collective on MPI_COMM_WORLD) happens in the
  // same order on every rank whatever the runtime's start-up does.
  const System ring = make_bare_system(o);
  // Collective too; null (and the system left out) unless every rank is on
  // this host.
  collectives::ShmOptions shm_opt;
  shm_opt.slot_bytes = o.chunk_bytes;
  shm_opt.spin = std::chrono::seconds(10);  // poll, as the bare ring does
  const std::shared_ptr<transport::ShmHost> shm = transport::ShmHost::create(shm_opt);
  std::vector<std::string> names(sizes.size());
  for (std::size_t k = 0; k < sizes.size(); ++k) names[k] = fmt::format("grad.{}", k);
  auto per_tensor = [&] {
    for (std::size_t k = sizes.size(); k-- > 0;) {
      mpi_allreduce(in + offset[k], out + offset[k], sizes[k], dt, op);
    }
  };
  auto fused = [&] { mpi_allreduce(in, out, total, dt, op); };

  // Runs warm-up and timed steps of `group`, rotating the order every step
  // so that no system always runs first.
  auto run_steps = [&](std::vector<StepSystem>& group) {
    for (long s = 0; s < warmup + steps; ++s) {
      for (std::size_t j = 0; j < group.size(); ++j) {
        StepSystem& sys = group[(j + static_cast<std::size_t>(s)) % group.size()];
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = now_s();
        sys.step();
        const double t = now_s() - t0;
        if (s >= warmup) sys.times.push_back(t);
      }
    }
  };

  // Phase 1, before gyre's runtime starts: MPI alone in the job. Measured on
  // this machine, the runtime's background thread (its negotiation polling)
  // slows an MPI_Allreduce of the main thread even when it has no work of
  // its own, so the MPI figures of phase 2 flatter gyre; the reference for
  // the "vs" columns is therefore phase 1's.
  std::vector<StepSystem> alone;
  if (o.only.empty()) {
    alone.emplace_back("per-tensor", "MPI_Allreduce per tensor, no runtime", per_tensor);
    alone.emplace_back("fused", "MPI_Allreduce fused, no runtime", fused);
    run_steps(alone);
  }

  // Phase 2: the runtime beside MPI and the bare ring, interleaved.
  if (o.only.empty() || o.only == "runtime") init();
  std::vector<StepSystem> systems;
  systems.emplace_back("runtime", "gyre runtime (allreduce_async x N, wait all)", [&] {
                       std::vector<Handle> handles;
                       handles.reserve(sizes.size());
                       for (std::size_t k = sizes.size(); k-- > 0;) {
                         const std::vector<std::int64_t> shape{static_cast<std::int64_t>(sizes[k])};
                         handles.push_back(allreduce_async(names[k], TensorView{in + offset[k], dt, shape, {}},
                                                           TensorView{out + offset[k], dt, shape, {}}, op));
                       }
                       for (const Handle& h : handles) h.wait();
                     });
  systems.emplace_back("per-tensor", "MPI_Allreduce per tensor, beside runtime", per_tensor);
  systems.emplace_back("fused", "MPI_Allreduce fused, beside runtime", fused);
  systems.emplace_back("ring", "gyre ring fused (1 call)", [&] { ring.run(in, out, total, dt, op); });
  if (shm) {
    systems.emplace_back("shm", "gyre shm fused (1 call)", [&] {
      collectives::shm_allreduce(shm->group(), in, out, total, dt, op);
    });
  }

  if (!o.only.empty()) {
    std::erase_if(systems, [&](const StepSystem& x) { return x.key != o.only; });
  }
  run_steps(systems);
  for (StepSystem& x : alone) systems.push_back(std::move(x));

  // Correctness: after timing, each system runs once more into a poisoned
  // output (the same code path as the timed steps), then every element is checked.
  std::uint64_t total_wrong = 0;
  for (StepSystem& sys : systems) {
    sys.times = max_across_ranks(sys.times);
    poison(out, bytes);
    MPI_Barrier(MPI_COMM_WORLD);
    sys.step();
    std::uint64_t local = count_wrong(out, total, dt, op, world);
    MPI_Allreduce(&local, &sys.wrong, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    total_wrong += sys.wrong;
  }

  if (rank == 0) {
    // References left out by --only give NaN ratios.
    // The last system with the key: phase 1's when it ran (see above).
    auto median_of = [&](const char* key) {
      double m = std::numeric_limits<double>::quiet_NaN();
      for (const StepSystem& x : systems) {
        if (x.key == key) m = median(x.times);
      }
      return m;
    };
    const double ref_per_tensor = median_of("per-tensor");
    const double ref_fused = median_of("fused");
    fmt::print("# gyre-allreduce-perf gradient set: {}, buffers on {}\n", o.gradients_path,
               o.huge_pages ? "transparent huge pages" : "4 KiB pages");
    fmt::print("# {} tensors, {} float32 elements ({:.1f} MB), {}, {} ranks, backward order (last tensor first)\n",
               sizes.size(), total, bytes / 1e6, op_name(op), world);
    fmt::print("# step time: slowest rank, over {} steps after {} warm-up; systems rotate each step\n", steps,
               warmup);
    fmt::print("# busbw from the whole set: bytes * 2(n-1)/n / median step time\n#\n");
    fmt::print("# {:<46} {:>10} {:>10} {:>10} {:>8} {:>9} {:>9} {:>7}\n", "system", "median", "min", "max",
               "busbw", "vs MPI", "vs MPI", "#wrong");
    fmt::print("# {:<46} {:>10} {:>10} {:>10} {:>8} {:>9} {:>9} {:>7}\n", "", "(ms)", "(ms)", "(ms)", "(GB/s)",
               "per-tens", "fused", "");
    std::string json = fmt::format(
        "{{\"benchmark\": \"gradient-set\", \"file\": {}, \"tensors\": {}, \"elements\": {}, \"ranks\": {}, "
        "\"op\": {}, \"pages\": {}, \"steps\": {},\n \"rows\": [\n",
        json_string(o.gradients_path), sizes.size(), total, world, json_string(op_name(op)),
        json_string(o.huge_pages ? "huge" : "4K"), steps);
    for (std::size_t j = 0; j < systems.size(); ++j) {
      const StepSystem& sys = systems[j];
      const double med = median(sys.times);
      const double lo_t = percentile(sys.times, 0), hi_t = percentile(sys.times, 100);
      // "vs": the reference's time over this system's: above 1 is faster than the reference.
      fmt::print("  {:<46} {:>10.2f} {:>10.2f} {:>10.2f} {:>8.3f} {:>9.2f} {:>9.2f} {:>7}\n", sys.name, med * 1e3,
                 lo_t * 1e3, hi_t * 1e3, allreduce_busbw_gbs(bytes, med, world), ref_per_tensor / med,
                 ref_fused / med, sys.wrong);
      json += fmt::format(
          "  {{\"system\": {}, \"median_ms\": {}, \"min_ms\": {}, \"max_ms\": {}, \"busbw_gbs\": {}, "
          "\"speedup_vs_mpi_per_tensor\": {}, \"speedup_vs_mpi_fused\": {}, \"wrong\": {}}}{}\n",
          json_string(sys.name), json_number(med * 1e3), json_number(lo_t * 1e3), json_number(hi_t * 1e3),
          json_number(allreduce_busbw_gbs(bytes, med, world)), json_number(ref_per_tensor / med),
          json_number(ref_fused / med), sys.wrong, j + 1 < systems.size() ? "," : "");
    }
    json += " ]}\n";
    fmt::print("# vs = reference median / this median (above 1: faster than the reference); the references\n"
               "# are the MPI rows measured before the runtime started (\"no runtime\"), when they ran\n");
    fmt::print("# Wrong elements in total: {} {}\n", total_wrong, total_wrong == 0 ? "OK" : "FAILED");
    if (!o.json_path.empty()) write_file(o.json_path, json);
  }
  return total_wrong == 0 ? 0 : 1;
}

}  // namespace gyre::bench
