// gyre-allreduce-perf: allreduce bandwidth, gradient-set step time and
// latency of gyre beside MPI_Allreduce, in the same job. Launch with
// `mpirun -np N`; rank 0 prints. See docs/benchmarks.md.
#include <mpi.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "bench_common.h"
#include "bench_modes.h"
#include "gyre/collectives/mpi_transport.h"
#include "gyre/collectives/shm_host.h"
#include "gyre/error.h"
#include "gyre/gyre.h"

namespace gyre::bench {

System make_bare_system(const PerfOptions& o) {
  std::shared_ptr<transport::Transport> t = transport::MpiWorld::instance().make_transport();
  collectives::AllreduceOptions opt;
  opt.chunk_bytes = o.chunk_bytes;
  opt.small_bytes = o.small_bytes;
  opt.large = o.large;
  return {o.large == collectives::LargeAllreduce::kRing ? "gyre bare" : "gyre bare rabenseifner", [t, opt](const void* in, void* out, std::size_t count, DataType dt, ReduceOp op) {
            collectives::allreduce(*t, in, out, count, dt, op, opt);
          }};
}

System make_shm_system(const PerfOptions& o) {
  collectives::ShmOptions so;
  so.slot_bytes = o.chunk_bytes;
  so.spin = std::chrono::seconds(10);  // poll: the benchmark owns its cores
  std::shared_ptr<transport::ShmHost> host = transport::ShmHost::create(so);
  if (!host) throw InvalidArgument("--shm: the ranks are not all on one host");
  return {"gyre shm", [host](const void* in, void* out, std::size_t count, DataType dt, ReduceOp op) {
            collectives::shm_allreduce(host->group(), in, out, count, dt, op);
          }};
}

System make_runtime_system(std::string tensor_name) {
  return {"gyre runtime",
          [name = std::move(tensor_name)](const void* in, void* out, std::size_t count, DataType dt,
                                          ReduceOp op) {
            const std::vector<std::int64_t> shape{static_cast<std::int64_t>(count)};
            const TensorView vin{const_cast<void*>(in), dt, shape, {}};
            const TensorView vout{out, dt, shape, {}};
            allreduce(name, vin, vout, op);  // blocking: gyre::WaitFollows
          }};
}

System make_runtime_shared_system(std::string tensor_name, void* shared) {
  return {"gyre runtime, shared buffer",
          [name = std::move(tensor_name), shared](const void*, void*, std::size_t count,
                                                  DataType dt, ReduceOp op) {
            const std::vector<std::int64_t> shape{static_cast<std::int64_t>(count)};
            const TensorView v{shared, dt, shape, {}};
            allreduce(name, v, v, op);
          }};
}

System make_mpi_system() {
  return {"MPI_Allreduce", [](const void* in, void* out, std::size_t count, DataType dt, ReduceOp op) {
            mpi_allreduce(in, out, count, dt, op);
          }};
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw InvalidArgument(fmt::format("--json: cannot open '{}' for writing", path));
  f << text;
  if (!f.flush()) throw InvalidArgument(fmt::format("--json: cannot write '{}'", path));
}

namespace {

constexpr const char* kUsage = R"(usage: mpirun -np N gyre-allreduce-perf [options]

Modes (default: the size sweep):
  --gradients FILE      replay one training step's gradients (one element count
                        per line, e.g. benchmarks/data/resnet50_sizes.txt)
  --latency             time one 8-byte allreduce
Sweep options (nccl-tests style):
  -b, --minbytes SIZE   smallest message (default 8); sizes take K, M, G
  -e, --maxbytes SIZE   largest message (default 64M)
  -f, --stepfactor N    multiply the size by N each row (default 2)
  -i, --stepbytes SIZE  add SIZE each row instead of multiplying
  -d, --datatype TYPE   float32 (default), float64, float16, bfloat16, int8,
                        uint8, int32, int64
  -o, --op OP           sum (default; average in gradient-set mode), average,
                        min, max, prod
  --runtime             time gyre::allreduce (blocking) instead of the bare
                        collectives::allreduce (no runtime)
  --shared-buffers      with --runtime: gyre's buffer from gyre::alloc_shared,
                        reduced in place (set GYRE_SHM_POOL_BYTES to at least
                        --maxbytes); MPI keeps its private buffers
  --shm                 time the shared-memory allreduce (ranks on one host;
                        slots of --chunk bytes) instead of the ring over MPI
  --bound               add the machine's single-copy bound per size: the data
                        already in memory all ranks map, each rank reducing its
                        share from every rank's copy and writing it into all
  --chunk SIZE          ring chunk size (default 256K; the runtime reads
                        GYRE_RING_CHUNK_BYTES instead)
  --small SIZE          largest buffer reduced by recursive doubling rather
                        than the ring (default 64K, 0: ring only; the runtime
                        reads GYRE_ALLREDUCE_SMALL_BYTES instead)
  --large ALGO          the bare system's algorithm above --small: ring
                        (default) or rabenseifner (reduce-scatter by recursive
                        halving, allgather by recursive doubling; the runtime
                        reads GYRE_RABENSEIFNER_ALLREDUCE instead)
  --hugepages           sweep, gradients: allocate every system's buffers on
                        transparent huge pages (2 MiB, MADV_HUGEPAGE), as
                        PyTorch does under THP_MEM_ALLOC_ENABLE=1
Timing:
  -w, --warmup N        untimed iterations first (default 5; gradients 3; latency 100)
  -n, --iters N         sweep: iterations per timed block (default 10);
                        gradients: timed steps (default 20);
                        latency: timed samples (default 1000)
  --blocks N            sweep: timed blocks per size and system (default 5)
Output:
  --json FILE           also write the rows as JSON (for benchmarks/plot_bandwidth.py)
  --only SYSTEM         run one system alone, e.g. under a profiler (sweep: gyre
                        or mpi; --gradients: runtime, per-tensor, fused or ring)
  -h, --help
)";

PerfOptions parse_args(int argc, char** argv, bool* help) {
  PerfOptions o;
  std::vector<std::string_view> args(argv + 1, argv + argc);
  for (std::size_t k = 0; k < args.size(); ++k) {
    const std::string_view a = args[k];
    auto value = [&]() -> std::string_view {
      if (k + 1 >= args.size()) throw InvalidArgument(fmt::format("option {} needs a value", a));
      return args[++k];
    };
    if (a == "-h" || a == "--help") *help = true;
    else if (a == "-b" || a == "--minbytes") o.min_bytes = parse_size(a, value());
    else if (a == "-e" || a == "--maxbytes") o.max_bytes = parse_size(a, value());
    else if (a == "-f" || a == "--stepfactor") o.step_factor = parse_int(a, value(), 1);
    else if (a == "-i" || a == "--stepbytes") o.step_bytes = parse_size(a, value());
    else if (a == "-d" || a == "--datatype") o.dtype = parse_dtype(value());
    else if (a == "-o" || a == "--op") { o.op = parse_op(value()); o.op_given = true; }
    else if (a == "-w" || a == "--warmup") o.warmup = parse_int(a, value(), 0);
    else if (a == "-n" || a == "--iters") o.iters = parse_int(a, value(), 1);
    else if (a == "--blocks") o.blocks = parse_int(a, value(), 1);
    else if (a == "--runtime") o.runtime = true;
    else if (a == "--shared-buffers") o.shared_buffers = true;
    else if (a == "--shm") o.shm = true;
    else if (a == "--bound") o.bound = true;
    else if (a == "--chunk") o.chunk_bytes = parse_size(a, value());
    else if (a == "--small") o.small_bytes = parse_size(a, value());
    else if (a == "--large") {
      const std::string_view v = value();
      if (v == "ring") o.large = gyre::collectives::LargeAllreduce::kRing;
      else if (v == "rabenseifner") o.large = gyre::collectives::LargeAllreduce::kRabenseifner;
      else throw InvalidArgument(fmt::format("--large '{}': ring or rabenseifner", v));
    }
    else if (a == "--hugepages") o.huge_pages = true;
    else if (a == "--gradients") o.gradients_path = std::string(value());
    else if (a == "--latency") o.latency = true;
    else if (a == "--json") o.json_path = std::string(value());
    else if (a == "--only") o.only = std::string(value());
    else throw InvalidArgument(fmt::format("unknown option '{}' (see --help)", a));
  }
  if (o.min_bytes > o.max_bytes) {
    throw InvalidArgument(fmt::format("-b {} is larger than -e {}", o.min_bytes, o.max_bytes));
  }
  if (o.step_factor < 2 && o.step_bytes == 0) {
    throw InvalidArgument("-f must be at least 2 unless -i gives an additive step");
  }
  if (o.chunk_bytes == 0) throw InvalidArgument("--chunk must be positive");
  if (!o.gradients_path.empty() && o.latency) {
    throw InvalidArgument("--gradients and --latency are separate modes; give one");
  }
  if (!o.only.empty()) {
    const bool sweep_ok = o.gradients_path.empty() && !o.latency && (o.only == "gyre" || o.only == "mpi");
    const bool grad_ok = !o.gradients_path.empty() && (o.only == "runtime" || o.only == "per-tensor" ||
                                                       o.only == "fused" || o.only == "ring" ||
                                                       o.only == "shm");
    if (!sweep_ok && !grad_ok) {
      throw InvalidArgument(fmt::format(
          "--only '{}': the sweep takes gyre or mpi, --gradients takes runtime, per-tensor, fused, ring "
          "or shm",
          o.only));
    }
  }
  if (!op_defined(o.dtype, o.op)) {
    throw InvalidArgument(fmt::format("--op {} is not defined on --datatype {}", op_name(o.op),
                                      dtype_name(o.dtype)));
  }
  return o;
}

}  // namespace
}  // namespace gyre::bench

int main(int argc, char** argv) {
  using namespace gyre::bench;
  // MPI is initialised here, not by gyre, because this program calls MPI
  // itself (the peer) while gyre's background thread may be transferring:
  // that needs MPI_THREAD_MULTIPLE.
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int status = 0;
  try {
    if (provided < MPI_THREAD_MULTIPLE) {
      throw gyre::TransportError("the MPI library does not offer MPI_THREAD_MULTIPLE");
    }
    bool help = false;
    PerfOptions o;
    try {
      o = parse_args(argc, argv, &help);
    } catch (const gyre::InvalidArgument& e) {
      // Every rank parses the same arguments and fails alike: say it once
      // and leave cleanly instead of aborting the job.
      if (rank == 0) std::fprintf(stderr, "gyre-allreduce-perf: %s\n", e.what());
      MPI_Finalize();
      return 2;
    }
    if (help) {
      if (rank == 0) std::fputs(kUsage, stdout);
    } else if (o.latency) {
      status = run_latency(o);
    } else if (!o.gradients_path.empty()) {
      status = run_gradient_set(o);
    } else {
      status = run_sweep(o);
    }
  } catch (const std::exception& e) {
    // Every rank parses the same arguments, but a failure on one rank only
    // (a file it cannot read, a wrong result) must not leave the others
    // waiting in a collective: end the whole job.
    std::fprintf(stderr, "gyre-allreduce-perf (rank %d): %s\n", rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  if (gyre::is_initialized()) gyre::shutdown();
  MPI_Finalize();
  return status;
}
