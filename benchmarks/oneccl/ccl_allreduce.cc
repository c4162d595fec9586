// ccl-allreduce: Intel oneCCL's allreduce beside MPI_Allreduce, in the same
// job, in the table format of gyre-allreduce-perf's sweep, so the rows can be
// put beside gyre's. Optional peer: built and run by benchmarks/oneccl/run.sh
// against a oneCCL installed at run time into a venv of its own; gyre neither
// builds nor links it.
//
//   mpirun -np 2 ccl-allreduce [-b 8] [-e 64M] [-f 2] [-w 5] [-n 10] [--blocks 5]
//                              [--json FILE]
//
// Timing as gyre-allreduce-perf's sweep: per size, `blocks` timed blocks per
// system, each the mean of `iters` back-to-back calls started after a
// barrier; the oneCCL and MPI blocks alternate; the time is the median over
// the blocks of the slowest rank's block time. float32 sum, out of place;
// rank r holds (r + i) % n + i % 7 at element i, so the expected sum is known
// and every result is checked after timing (#wrong).
//
// Built with CCL_BENCH_WITH_GYRE (CMakeLists.txt beside this file, given an
// installed gyre), the same job also times gyre's runtime allreduce
// (the blocking gyre::allreduce, as gyre-allreduce-perf --runtime) on the
// same input: three systems whose blocks rotate, and every ratio from one run.
//
// Threads: the main thread of every rank calls everything (oneCCL's own
// worker threads aside, see CCL_WORKER_OFFLOAD in run.sh; with gyre, its
// background thread does gyre's transfers). Rank 0 prints.
#include <mpi.h>

#include <oneapi/ccl.hpp>

#ifdef CCL_BENCH_WITH_GYRE
#include "gyre/gyre.h"
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace {

struct Options {
  std::size_t min_bytes = 8, max_bytes = 64u << 20;
  long factor = 2, warmup = 5, iters = 10, blocks = 5;
  std::string json_path;
};

std::size_t parse_size(std::string_view text) {
  std::size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0) throw std::invalid_argument("not a size: " + std::string(text));
  std::size_t v = std::stoull(std::string(text.substr(0, digits)));
  const std::string_view unit = text.substr(digits);
  if (unit == "K" || unit == "k") v <<= 10;
  else if (unit == "M" || unit == "m") v <<= 20;
  else if (unit == "G" || unit == "g") v <<= 30;
  else if (!unit.empty() && unit != "B") throw std::invalid_argument("unknown unit in " + std::string(text));
  return v;
}

long parse_long(std::string_view text, long min) {
  std::size_t used = 0;
  const long v = std::stol(std::string(text), &used);
  if (used != text.size() || v < min) throw std::invalid_argument("bad number: " + std::string(text));
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int k = 1; k < argc; ++k) {
    const std::string_view a = argv[k];
    auto value = [&]() -> std::string_view {
      if (k + 1 >= argc) throw std::invalid_argument("option " + std::string(a) + " needs a value");
      return argv[++k];
    };
    if (a == "-b" || a == "--minbytes") o.min_bytes = parse_size(value());
    else if (a == "-e" || a == "--maxbytes") o.max_bytes = parse_size(value());
    else if (a == "-f" || a == "--stepfactor") o.factor = parse_long(value(), 2);
    else if (a == "-w" || a == "--warmup") o.warmup = parse_long(value(), 0);
    else if (a == "-n" || a == "--iters") o.iters = parse_long(value(), 1);
    else if (a == "--blocks") o.blocks = parse_long(value(), 1);
    else if (a == "--json") o.json_path = std::string(value());
    else throw std::invalid_argument("unknown option " + std::string(a));
  }
  if (o.min_bytes < sizeof(float) || o.min_bytes > o.max_bytes) throw std::invalid_argument("bad -b/-e");
  return o;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A collective ends when its slowest rank does.
std::vector<double> max_across_ranks(std::vector<double> v) {
  MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return v;
}

// Page-aligned and touched once, as gyre's HostBuffer (4 KiB pages).
struct Buffer {
  explicit Buffer(std::size_t bytes) {
    const std::size_t rounded = (bytes + 4095) / 4096 * 4096;
    p = static_cast<float*>(std::aligned_alloc(4096, rounded));
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, rounded);
  }
  ~Buffer() { std::free(p); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  float* p;
};

void fill(float* p, std::size_t count, int rank, int world) {
  for (std::size_t i = 0; i < count; ++i)
    p[i] = static_cast<float>((static_cast<std::size_t>(rank) + i) % static_cast<std::size_t>(world) + i % 7);
}

std::uint64_t wrong_on_all_ranks(const float* p, std::size_t count, int world) {
  std::uint64_t wrong = 0;
  const std::size_t n = static_cast<std::size_t>(world);
  for (std::size_t i = 0; i < count; ++i) {
    double want = 0;
    for (std::size_t r = 0; r < n; ++r) want += static_cast<double>((r + i) % n + i % 7);
    if (static_cast<double>(p[i]) != want) ++wrong;
  }
  MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  return wrong;
}

template <typename Fn>
double time_block(Fn&& fn, long iters) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = now_s();
  for (long k = 0; k < iters; ++k) fn();
  return (now_s() - t0) / static_cast<double>(iters);
}

double busbw_gbs(std::size_t bytes, double s, int world) {
  return static_cast<double>(bytes) / s / 1e9 * 2.0 * (world - 1) / world;
}

// oneCCL reads its node-local rank and size from CCL_LOCAL_RANK and
// CCL_LOCAL_SIZE (or Intel MPI's MPI_LOCALRANKID/MPI_LOCALNRANKS); Open MPI
// sets neither, so they are set here from a shared-memory split of the world.
void set_local_rank_env() {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int local_rank = 0, local_size = 1;
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_size(node, &local_size);
  MPI_Comm_free(&node);
  setenv("CCL_LOCAL_RANK", std::to_string(local_rank).c_str(), 0);
  setenv("CCL_LOCAL_SIZE", std::to_string(local_size).c_str(), 0);
}

struct Row {
  std::size_t bytes, count;
  double ccl_s, mpi_s, gyre_s;  // gyre_s < 0: not timed
  std::uint64_t ccl_wrong, mpi_wrong, gyre_wrong;
};

#ifdef CCL_BENCH_WITH_GYRE
constexpr bool kWithGyre = true;
void gyre_allreduce(const float* in, float* out, std::size_t count) {
  const std::vector<std::int64_t> shape{static_cast<std::int64_t>(count)};
  const gyre::TensorView vin{const_cast<float*>(in), gyre::DataType::kFloat32, shape, {}};
  const gyre::TensorView vout{out, gyre::DataType::kFloat32, shape, {}};
  gyre::allreduce("ccl-allreduce", vin, vout, gyre::ReduceOp::kSum);
}
#else
constexpr bool kWithGyre = false;
void gyre_allreduce(const float*, float*, std::size_t) {}
#endif

int run(const Options& o, int rank, int world) {
  set_local_rank_env();
  ccl::init();
  // The main KVS lives on rank 0; its address reaches the others over MPI.
  ccl::shared_ptr_class<ccl::kvs> kvs;
  ccl::kvs::address_type address;
  if (rank == 0) {
    kvs = ccl::create_main_kvs();
    address = kvs->get_address();
  }
  MPI_Bcast(address.data(), static_cast<int>(address.size()), MPI_BYTE, 0, MPI_COMM_WORLD);
  if (rank != 0) kvs = ccl::create_kvs(address);
  ccl::communicator comm = ccl::create_communicator(world, rank, kvs);

  const std::size_t max_count = o.max_bytes / sizeof(float);
  Buffer in(max_count * sizeof(float)), out(max_count * sizeof(float)), mpi_out(max_count * sizeof(float));
  Buffer gyre_out(kWithGyre ? max_count * sizeof(float) : 4096);

  if (rank == 0) {
    const ccl::library_version v = ccl::get_library_version();
    auto env = [](const char* name) { return std::getenv(name) ? std::getenv(name) : "(unset)"; };
    std::printf("# ccl-allreduce: %d ranks, float32 sum, out-of-place, buffers on 4 KiB pages\n", world);
    std::printf("# oneCCL %u.%u.%u: ccl::allreduce(...).wait(); CCL_ATL_TRANSPORT=%s CCL_ATL_SHM=%s "
                "FI_PROVIDER=%s CCL_WORKER_OFFLOAD=%s\n",
                v.major, v.minor, v.update, env("CCL_ATL_TRANSPORT"), env("CCL_ATL_SHM"), env("FI_PROVIDER"),
                env("CCL_WORKER_OFFLOAD"));
    std::printf("# peer: MPI_Allreduce on MPI_COMM_WORLD\n");
    if (kWithGyre) {
      std::printf("# gyre: runtime (gyre::allreduce, blocking; options from GYRE_* environment), "
                  "same job\n");
    }
    std::printf("# time: median over %ld blocks of the mean of %ld back-to-back iterations, slowest rank; "
                "%ld warm-up iterations; the systems' blocks rotate\n",
                o.blocks, o.iters, o.warmup);
    std::printf("# busbw = algbw * 2(n-1)/n; ratio = oneCCL busbw / MPI busbw%s; #wrong checked after timing\n#\n",
                kWithGyre ? "; g/ccl, g/mpi = gyre busbw / oneCCL, MPI busbw" : "");
    std::printf("# %10s %12s %8s %7s %10s %8s %8s %7s %10s %8s %7s %8s", "size", "count", "type", "redop",
                "time", "algbw", "busbw", "#wrong", "mpi-time", "mpi-bw", "mpi#wr", "ratio");
    if (kWithGyre) std::printf(" %10s %8s %7s %6s %6s", "gyre-time", "gyre-bw", "gyre#wr", "g/ccl", "g/mpi");
    std::printf("\n# %10s %12s %8s %7s %10s %8s %8s %7s %10s %8s %7s %8s", "(B)", "(elements)", "", "", "(us)",
                "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "", "ccl/mpi");
    if (kWithGyre) std::printf(" %10s %8s %7s %6s %6s", "(us)", "(GB/s)", "", "", "");
    std::printf("\n");
    std::fflush(stdout);
  }

  std::vector<Row> rows;
  std::uint64_t total_wrong = 0;
  for (std::size_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= static_cast<std::size_t>(o.factor)) {
    const std::size_t count = bytes / sizeof(float);
    fill(in.p, count, rank, world);
    std::memset(out.p, 0xff, count * sizeof(float));  // NaN: a result never written is caught
    std::memset(mpi_out.p, 0xff, count * sizeof(float));
    if (kWithGyre) std::memset(gyre_out.p, 0xff, count * sizeof(float));
    auto ccl_call = [&] { ccl::allreduce(in.p, out.p, count, ccl::reduction::sum, comm).wait(); };
    auto mpi_call = [&] {
      MPI_Allreduce(in.p, mpi_out.p, static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    };
    auto gyre_call = [&] { gyre_allreduce(in.p, gyre_out.p, count); };
    for (long w = 0; w < o.warmup; ++w) {
      ccl_call();
      mpi_call();
      if (kWithGyre) gyre_call();
    }
    // Blocks rotate: block b starts with system b % k, so none always
    // follows another.
    const int k = kWithGyre ? 3 : 2;
    std::vector<double> t[3];
    for (long b = 0; b < o.blocks; ++b) {
      for (int j = 0; j < k; ++j) {
        const int s = static_cast<int>((b + j) % k);
        if (s == 0) t[0].push_back(time_block(ccl_call, o.iters));
        else if (s == 1) t[1].push_back(time_block(mpi_call, o.iters));
        else t[2].push_back(time_block(gyre_call, o.iters));
      }
    }
    Row r{count * sizeof(float), count, median(max_across_ranks(t[0])), median(max_across_ranks(t[1])),
          kWithGyre ? median(max_across_ranks(t[2])) : -1.0, 0, 0, 0};
    r.ccl_wrong = wrong_on_all_ranks(out.p, count, world);
    r.mpi_wrong = wrong_on_all_ranks(mpi_out.p, count, world);
    if (kWithGyre) r.gyre_wrong = wrong_on_all_ranks(gyre_out.p, count, world);
    total_wrong += r.ccl_wrong + r.mpi_wrong + r.gyre_wrong;
    rows.push_back(r);
    if (rank == 0) {
      std::printf("  %10zu %12zu %8s %7s %10.2f %8.3f %8.3f %7llu %10.2f %8.3f %7llu %8.2f", r.bytes, r.count,
                  "float32", "sum", r.ccl_s * 1e6, r.bytes / r.ccl_s / 1e9, busbw_gbs(r.bytes, r.ccl_s, world),
                  static_cast<unsigned long long>(r.ccl_wrong), r.mpi_s * 1e6, busbw_gbs(r.bytes, r.mpi_s, world),
                  static_cast<unsigned long long>(r.mpi_wrong), r.mpi_s / r.ccl_s);
      if (kWithGyre) {
        std::printf(" %10.2f %8.3f %7llu %6.2f %6.2f", r.gyre_s * 1e6, busbw_gbs(r.bytes, r.gyre_s, world),
                    static_cast<unsigned long long>(r.gyre_wrong), r.ccl_s / r.gyre_s, r.mpi_s / r.gyre_s);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
    if (bytes > o.max_bytes / static_cast<std::size_t>(o.factor)) break;
  }

  if (rank == 0) {
    double sum_ccl = 0, sum_mpi = 0, sum_gyre = 0;
    for (const Row& r : rows) {
      sum_ccl += busbw_gbs(r.bytes, r.ccl_s, world);
      sum_mpi += busbw_gbs(r.bytes, r.mpi_s, world);
      if (kWithGyre) sum_gyre += busbw_gbs(r.bytes, r.gyre_s, world);
    }
    std::printf("# Avg bus bandwidth: oneCCL %.3f GB/s, MPI %.3f GB/s", sum_ccl / rows.size(), sum_mpi / rows.size());
    if (kWithGyre) std::printf(", gyre %.3f GB/s", sum_gyre / rows.size());
    std::printf("\n");
    std::printf("# Wrong elements in total: %llu %s\n", static_cast<unsigned long long>(total_wrong),
                total_wrong == 0 ? "OK" : "FAILED");
    if (!o.json_path.empty()) {
      FILE* f = std::fopen(o.json_path.c_str(), "w");
      if (!f) throw std::runtime_error("--json: cannot open " + o.json_path);
      std::fprintf(f,
                   "{\"benchmark\": \"allreduce-sweep\", \"system\": \"oneCCL\", \"peer\": \"MPI_Allreduce\", "
                   "\"ranks\": %d, \"dtype\": \"float32\", \"op\": \"sum\", \"pages\": \"4K\", "
                   "\"timing\": \"median of %ld blocks x %ld iterations\",\n \"rows\": [\n",
                   world, o.blocks, o.iters);
      for (std::size_t k = 0; k < rows.size(); ++k) {
        const Row& r = rows[k];
        std::fprintf(f,
                     "  {\"bytes\": %zu, \"count\": %zu, \"dtype\": \"float32\", \"op\": \"sum\", "
                     "\"time_us\": %.6g, \"algbw_gbs\": %.6g, \"busbw_gbs\": %.6g, \"wrong\": %llu, "
                     "\"mpi_time_us\": %.6g, \"mpi_busbw_gbs\": %.6g, \"mpi_wrong\": %llu, \"ratio\": %.6g",
                     r.bytes, r.count, r.ccl_s * 1e6, r.bytes / r.ccl_s / 1e9, busbw_gbs(r.bytes, r.ccl_s, world),
                     static_cast<unsigned long long>(r.ccl_wrong), r.mpi_s * 1e6,
                     busbw_gbs(r.bytes, r.mpi_s, world), static_cast<unsigned long long>(r.mpi_wrong),
                     r.mpi_s / r.ccl_s);
        if (kWithGyre) {
          std::fprintf(f, ", \"gyre_time_us\": %.6g, \"gyre_busbw_gbs\": %.6g, \"gyre_wrong\": %llu",
                       r.gyre_s * 1e6, busbw_gbs(r.bytes, r.gyre_s, world),
                       static_cast<unsigned long long>(r.gyre_wrong));
        }
        std::fprintf(f, "}%s\n", k + 1 < rows.size() ? "," : "");
      }
      std::fprintf(f, " ]}\n");
      std::fclose(f);
    }
  }
  return total_wrong == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  // gyre's background thread calls MPI beside this thread's MPI_Allreduce.
  int provided = 0;
  MPI_Init_thread(&argc, &argv, kWithGyre ? MPI_THREAD_MULTIPLE : MPI_THREAD_SINGLE, &provided);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  int status = 0;
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const std::exception& e) {
    if (rank == 0) std::fprintf(stderr, "ccl-allreduce: %s\n", e.what());
    MPI_Finalize();
    return 2;
  }
  try {
#ifdef CCL_BENCH_WITH_GYRE
    if (provided < MPI_THREAD_MULTIPLE) throw std::runtime_error("MPI does not offer MPI_THREAD_MULTIPLE");
    gyre::init();
#endif
    status = run(o, rank, world);
#ifdef CCL_BENCH_WITH_GYRE
    gyre::shutdown();
#endif
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ccl-allreduce (rank %d): %s\n", rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  MPI_Finalize();
  return status;
}
