// The size sweep: one row per message size with gyre's time, algbw, busbw
// and #wrong beside MPI_Allreduce's time and busbw on the same input.
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench_common.h"
#include "bench_modes.h"
#include "gyre/collectives/shm.h"
#include "gyre/collectives/shm_host.h"
#include "gyre/error.h"
#include "gyre/gyre.h"

namespace gyre::bench {
namespace {

constexpr long kSweepWarmup = 5;
constexpr long kDefaultIters = 10;

struct Row {
  std::size_t bytes = 0, count = 0;
  double time_s = 0, mpi_time_s = 0;  // mpi_time_s < 0: no MPI datatype
  double bound_time_s = -1;           // < 0: not measured (no --bound)
  std::uint64_t wrong = 0, mpi_wrong = 0;
};

std::vector<std::size_t> sweep_sizes(const PerfOptions& o) {
  std::vector<std::size_t> sizes;
  for (std::size_t b = o.min_bytes; b <= o.max_bytes;) {
    sizes.push_back(b);
    const std::size_t next = o.step_bytes ? b + o.step_bytes : b * static_cast<std::size_t>(o.step_factor);
    if (next <= b) break;  // min_bytes of 0 with a factor
    b = next;
  }
  return sizes;
}

// Mean time of `iters` back-to-back calls, started together after a barrier.
double time_block(const System& s, const void* in, void* out, std::size_t count, const PerfOptions& o,
                  long iters) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = now_s();
  for (long k = 0; k < iters; ++k) s.run(in, out, count, o.dtype, o.op);
  return (now_s() - t0) / static_cast<double>(iters);
}

std::uint64_t wrong_on_all_ranks(const void* out, std::size_t count, const PerfOptions& o, int world) {
  std::uint64_t local = count_wrong(out, count, o.dtype, o.op, world), all = 0;
  MPI_Allreduce(&local, &all, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  return all;
}

std::string row_json(const Row& r, const PerfOptions& o, int world) {
  if (r.time_s < 0) {  // --only mpi
    return fmt::format(
        "{{\"bytes\": {}, \"count\": {}, \"dtype\": {}, \"op\": {}, \"mpi_time_us\": {}, "
        "\"mpi_busbw_gbs\": {}, \"mpi_wrong\": {}}}",
        r.bytes, r.count, json_string(dtype_name(o.dtype)), json_string(op_name(o.op)),
        json_number(r.mpi_time_s * 1e6), json_number(allreduce_busbw_gbs(r.bytes, r.mpi_time_s, world)),
        r.mpi_wrong);
  }
  const double busbw = allreduce_busbw_gbs(r.bytes, r.time_s, world);
  std::string s = fmt::format(
      "{{\"bytes\": {}, \"count\": {}, \"dtype\": {}, \"op\": {}, \"time_us\": {}, \"algbw_gbs\": {}, "
      "\"busbw_gbs\": {}, \"wrong\": {}",
      r.bytes, r.count, json_string(dtype_name(o.dtype)), json_string(op_name(o.op)),
      json_number(r.time_s * 1e6), json_number(algbw_gbs(r.bytes, r.time_s)), json_number(busbw), r.wrong);
  if (r.mpi_time_s >= 0 && r.time_s >= 0) {
    const double mpi_busbw = allreduce_busbw_gbs(r.bytes, r.mpi_time_s, world);
    s += fmt::format(", \"mpi_time_us\": {}, \"mpi_busbw_gbs\": {}, \"mpi_wrong\": {}, \"ratio\": {}",
                     json_number(r.mpi_time_s * 1e6), json_number(mpi_busbw), r.mpi_wrong,
                     json_number(r.mpi_time_s / r.time_s));
  }
  if (r.bound_time_s > 0) {
    s += fmt::format(", \"bound_time_us\": {}, \"bound_busbw_gbs\": {}",
                     json_number(r.bound_time_s * 1e6),
                     json_number(allreduce_busbw_gbs(r.bytes, r.bound_time_s, world)));
  }
  return s + "}";
}

}  // namespace

int run_sweep(const PerfOptions& o) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const long warmup = o.warmup >= 0 ? o.warmup : kSweepWarmup;
  const long iters = o.iters > 0 ? o.iters : kDefaultIters;
  const std::size_t elem = dtype_size(o.dtype);

  if (o.runtime) init();
  void* shared = nullptr;
  if (o.shared_buffers) {
    if (!o.runtime) throw InvalidArgument("--shared-buffers needs --runtime");
    shared = alloc_shared(o.max_bytes);
    if (shared == nullptr) {
      throw InvalidArgument(fmt::format(
          "--shared-buffers: no {} buffer from gyre::alloc_shared (GYRE_SHM_POOL_BYTES too small, "
          "or the ranks are not on one host)", format_size(o.max_bytes)));
    }
  }
  const System gyre_sys = shared != nullptr
                              ? make_runtime_shared_system("gyre-allreduce-perf", shared)
                          : o.runtime ? make_runtime_system("gyre-allreduce-perf")
                          : o.shm   ? make_shm_system(o)
                                    : make_bare_system(o);
  // The bound: one slot per rank large enough for the largest size.
  std::shared_ptr<transport::ShmHost> bound_host;
  if (o.bound) {
    collectives::ShmOptions so;
    so.slot_bytes = o.max_bytes;
    so.spin = std::chrono::seconds(10);  // poll (unless the host is oversubscribed)
    bound_host = transport::ShmHost::create(so);
    if (!bound_host) throw InvalidArgument("--bound: the ranks are not all on one host");
  }
  // --only runs one side alone (to profile it); its rows have n/a for the other.
  const bool have_mpi = mpi_datatype(o.dtype) != MPI_DATATYPE_NULL && o.only != "gyre";
  const bool have_gyre = o.only != "mpi";
  const System mpi_sys = make_mpi_system();

  const std::vector<std::size_t> sizes = sweep_sizes(o);
  const std::size_t max_count = o.max_bytes / elem;
  HostBuffer in(max_count * elem, o.huge_pages), out(max_count * elem, o.huge_pages),
      mpi_out(max_count * elem, o.huge_pages);

  if (rank == 0) {
    fmt::print("# gyre-allreduce-perf: {} ranks, {} {}, out-of-place, buffers on {}\n", world,
               dtype_name(o.dtype), op_name(o.op),
               o.huge_pages ? "transparent huge pages" : "4 KiB pages");
    if (shared != nullptr) {
      fmt::print("# gyre: runtime (gyre::allreduce, blocking), in place on a buffer from "
                 "gyre::alloc_shared (the values grow while timed; checked from a fresh input)\n");
    } else if (o.runtime) {
      fmt::print("# gyre: runtime (gyre::allreduce, blocking; options from GYRE_* environment)\n");
    } else if (o.shm) {
      fmt::print("# gyre: bare shm_allreduce over the host's shared-memory group, slots of {}\n",
                 format_size(o.chunk_bytes));
    } else {
      fmt::print("# gyre: bare collectives::allreduce over MpiWorld's transport, no runtime: recursive "
                 "doubling up to {}, {} above in chunks of {}\n",
                 format_size(o.small_bytes), collectives::large_allreduce_name(o.large),
                 format_size(o.chunk_bytes));
    }
    fmt::print("# peer: MPI_Allreduce on MPI_COMM_WORLD{}\n",
               o.op == ReduceOp::kAverage ? " (MPI_SUM, then a 1/n scaling pass, timed)" : "");
    fmt::print("# time: median over {} blocks of the mean of {} back-to-back iterations, slowest rank; "
               "{} warm-up iterations; gyre and MPI blocks alternate\n",
               o.blocks, iters, warmup);
    fmt::print("# busbw = algbw * 2(n-1)/n; ratio = gyre busbw / MPI busbw; #wrong checked after timing\n");
    if (o.bound) {
      fmt::print("# bound: the single-copy in-place reduce over shared memory (data already in every "
                 "rank's mapped copy), busbw; gyre/bnd = gyre busbw / bound busbw\n");
    }
    fmt::print("#\n");
    fmt::print("# {:>10} {:>12} {:>8} {:>7} {:>10} {:>8} {:>8} {:>7} {:>10} {:>8} {:>7} {:>8}{}\n", "size",
               "count", "type", "redop", "time", "algbw", "busbw", "#wrong", "mpi-time", "mpi-bw",
               "mpi#wr", "ratio", o.bound ? fmt::format(" {:>8} {:>8}", "bound-bw", "gyre/bnd") : "");
    fmt::print("# {:>10} {:>12} {:>8} {:>7} {:>10} {:>8} {:>8} {:>7} {:>10} {:>8} {:>7} {:>8}{}\n", "(B)",
               "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "", "gyre/mpi",
               o.bound ? fmt::format(" {:>8} {:>8}", "(GB/s)", "") : "");
    std::fflush(stdout);
  }

  std::vector<Row> rows;
  std::uint64_t total_wrong = 0;
  for (const std::size_t bytes : sizes) {
    const std::size_t count = bytes / elem;
    if (count == 0) continue;  // smaller than one element of this type
    fill_input(in.data(), count, o.dtype, o.op, rank, world);
    poison(out.data(), count * elem);
    poison(mpi_out.data(), count * elem);

    for (long w = 0; w < warmup; ++w) {
      if (have_gyre) gyre_sys.run(in.data(), out.data(), count, o.dtype, o.op);
      if (have_mpi) mpi_sys.run(in.data(), mpi_out.data(), count, o.dtype, o.op);
    }
    std::vector<double> t_gyre, t_mpi;
    for (long b = 0; b < o.blocks; ++b) {
      // Alternate which system goes first, so neither always follows the other.
      const bool gyre_first = b % 2 == 0;
      if (have_mpi && !gyre_first) t_mpi.push_back(time_block(mpi_sys, in.data(), mpi_out.data(), count, o, iters));
      if (have_gyre) t_gyre.push_back(time_block(gyre_sys, in.data(), out.data(), count, o, iters));
      if (have_mpi && gyre_first) t_mpi.push_back(time_block(mpi_sys, in.data(), mpi_out.data(), count, o, iters));
    }
    Row r;
    r.bytes = count * elem;
    r.count = count;
    r.time_s = have_gyre ? median(max_across_ranks(t_gyre)) : -1.0;
    r.mpi_time_s = have_mpi ? median(max_across_ranks(t_mpi)) : -1.0;
    if (bound_host) {
      collectives::ShmGroup& g = bound_host->group();
      fill_input(g.slot(rank), count, o.dtype, o.op, rank, world);
      const System bound{"bound", [&g](const void*, void*, std::size_t n, DataType dt, ReduceOp op) {
                           collectives::shm_reduce_slots(g, n, dt, op);
                         }};
      std::vector<double> t_bound;
      for (long b = 0; b < o.blocks; ++b) t_bound.push_back(time_block(bound, nullptr, nullptr, count, o, iters));
      r.bound_time_s = median(max_across_ranks(t_bound));
    }
    if (shared != nullptr && have_gyre) {
      // Timed in place, the buffer holds repeated sums: once more from the input.
      std::memcpy(shared, in.data(), count * elem);
      gyre_sys.run(nullptr, nullptr, count, o.dtype, o.op);
      std::memcpy(out.data(), shared, count * elem);
    }
    r.wrong = have_gyre ? wrong_on_all_ranks(out.data(), count, o, world) : 0;
    r.mpi_wrong = have_mpi ? wrong_on_all_ranks(mpi_out.data(), count, o, world) : 0;
    total_wrong += r.wrong + r.mpi_wrong;
    rows.push_back(r);

    if (rank == 0) {
      std::string line = fmt::format("  {:>10} {:>12} {:>8} {:>7}", r.bytes, r.count, dtype_name(o.dtype),
                                     op_name(o.op));
      if (have_gyre) {
        line += fmt::format(" {:>10.2f} {:>8.3f} {:>8.3f} {:>7}", r.time_s * 1e6, algbw_gbs(r.bytes, r.time_s),
                            allreduce_busbw_gbs(r.bytes, r.time_s, world), r.wrong);
      } else {
        line += fmt::format(" {:>10} {:>8} {:>8} {:>7}", "n/a", "n/a", "n/a", "n/a");
      }
      if (have_mpi && have_gyre) {
        line += fmt::format(" {:>10.2f} {:>8.3f} {:>7} {:>8.2f}", r.mpi_time_s * 1e6,
                            allreduce_busbw_gbs(r.bytes, r.mpi_time_s, world), r.mpi_wrong,
                            r.mpi_time_s / r.time_s);
      } else if (have_mpi) {
        line += fmt::format(" {:>10.2f} {:>8.3f} {:>7} {:>8}", r.mpi_time_s * 1e6,
                            allreduce_busbw_gbs(r.bytes, r.mpi_time_s, world), r.mpi_wrong, "n/a");
      } else {
        line += fmt::format(" {:>10} {:>8} {:>7} {:>8}", "n/a", "n/a", "n/a", "n/a");
      }
      if (o.bound) {
        const double bound_bw = allreduce_busbw_gbs(r.bytes, r.bound_time_s, world);
        line += fmt::format(" {:>8.3f} {:>8.2f}", bound_bw,
                            have_gyre ? allreduce_busbw_gbs(r.bytes, r.time_s, world) / bound_bw : 0.0);
      }
      fmt::print("{}\n", line);
      std::fflush(stdout);
    }
  }

  if (rank == 0) {
    double sum_bw = 0, sum_mpi_bw = 0;
    for (const Row& r : rows) {
      if (have_gyre) sum_bw += allreduce_busbw_gbs(r.bytes, r.time_s, world);
      if (have_mpi) sum_mpi_bw += allreduce_busbw_gbs(r.bytes, r.mpi_time_s, world);
    }
    const double n_rows = rows.empty() ? 1.0 : static_cast<double>(rows.size());
    fmt::print("# Avg bus bandwidth:");
    if (have_gyre) fmt::print(" gyre {:.3f} GB/s", sum_bw / n_rows);
    if (have_mpi) fmt::print("{} MPI {:.3f} GB/s", have_gyre ? "," : "", sum_mpi_bw / n_rows);
    fmt::print("\n# Wrong elements in total: {} {}\n", total_wrong, total_wrong == 0 ? "OK" : "FAILED");
    if (!o.json_path.empty()) {
      std::string j = fmt::format(
          "{{\"benchmark\": \"allreduce-sweep\", \"system\": {}, \"peer\": \"MPI_Allreduce\", \"ranks\": {}, "
          "\"dtype\": {}, \"op\": {}, \"pages\": {}, \"timing\": \"median of {} blocks x {} iterations\",\n"
          " \"rows\": [\n",
          json_string(gyre_sys.name), world, json_string(dtype_name(o.dtype)),
          json_string(op_name(o.op)), json_string(o.huge_pages ? "huge" : "4K"), o.blocks, iters);
      for (std::size_t k = 0; k < rows.size(); ++k) {
        j += "  " + row_json(rows[k], o, world) + (k + 1 < rows.size() ? ",\n" : "\n");
      }
      j += " ]}\n";
      write_file(o.json_path, j);
    }
  }
  free_shared(shared);
  return total_wrong == 0 ? 0 : 1;
}

}  // namespace gyre::bench
