// Soak test of the runtime through the public C++ API: many steps of a mixed
// gradient set, every result checked exactly, resident memory compared
// between a warm-up step and the end, the response-cache hit rate reported.
//
// Each step enqueues, on every rank and under the same names:
//   - two small tensors of every dtype (fused into buckets), ops cycling
//     through sum, max, min and product;
//   - two tensors just over GYRE_FUSION_MAX_TENSOR (reduced unfused, in place);
//   - a grouped allreduce of three tensors of different dtypes;
//   - an allgather whose first dimension changes every step on every rank;
// then waits for all of them and checks every element against a closed form.
// Inputs are small integers (0..3 for sum, max and min; 1..2 for product),
// so every result is exact in every dtype, float16 and bfloat16 included.
// Average is left out: x / 3 is not exact in floating types (other tests
// check it with tolerances).
//
// Memory: VmRSS after the warm-up step (step 1000, or a third of a shorter
// run) and after the last step. Growth beyond --rss-bound-mib (default 1 MiB)
// on any rank fails the run: a leak of b bytes per step grows RSS by about
// b * (steps - warm-up), so 20,000 steps expose leaks from ~60 bytes per
// step, the 1,000 steps of CTest (750 after the warm-up) from ~1.4 KiB per
// step. Runs measured 4-16 KiB of growth. Under AddressSanitizer, whose
// quarantine keeps freed memory resident, the figures are printed but not
// checked.
//
//   mpirun -np 3 gyre_core_soak [--steps N] [--warmup N] [--rss-bound-mib M]
//
// Exits 0 when every result was right and the RSS bound held on every rank.
// CTest runs 1,000 steps (tests/core/CMakeLists.txt); benchmarks/soak.sh the
// 20,000-step version whose figures are in docs/benchmarks.md.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "gyre/gyre.h"

#if defined(__SANITIZE_ADDRESS__)
#define GYRE_SOAK_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GYRE_SOAK_ASAN 1
#endif
#endif

namespace {

using gyre::DataType;
using gyre::ReduceOp;

constexpr int kDtypes = gyre::kNumDataTypes;
constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kProduct};
constexpr std::int64_t kGatherCols = 3;

long rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtol(line.c_str() + 6, nullptr, 10);
  }
  return -1;
}

// Small non-negative integers to and from each dtype's bits (exact).
std::uint16_t to_half(int v) {
  if (v == 0) return 0;
  float f = static_cast<float>(v);
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  const std::uint32_t exp = ((b >> 23) & 0xff) - 127 + 15;
  return static_cast<std::uint16_t>((exp << 10) | ((b >> 13) & 0x3ff));
}
double from_half(std::uint16_t h) {
  const int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  if (exp == 0) return mant / 16777216.0;  // subnormal: mant * 2^-24
  std::uint32_t b = (static_cast<std::uint32_t>(exp - 15 + 127) << 23) |
                    (static_cast<std::uint32_t>(mant) << 13) |
                    (static_cast<std::uint32_t>(h & 0x8000) << 16);
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
std::uint16_t to_bf16(int v) {
  float f = static_cast<float>(v);
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  return static_cast<std::uint16_t>(b >> 16);
}
double from_bf16(std::uint16_t h) {
  std::uint32_t b = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

void store(DataType dt, void* base, std::int64_t i, int v) {
  switch (dt) {
    case DataType::kFloat32: static_cast<float*>(base)[i] = static_cast<float>(v); break;
    case DataType::kFloat64: static_cast<double*>(base)[i] = v; break;
    case DataType::kFloat16: static_cast<std::uint16_t*>(base)[i] = to_half(v); break;
    case DataType::kBFloat16: static_cast<std::uint16_t*>(base)[i] = to_bf16(v); break;
    case DataType::kInt8: static_cast<std::int8_t*>(base)[i] = static_cast<std::int8_t>(v); break;
    case DataType::kUInt8: static_cast<std::uint8_t*>(base)[i] = static_cast<std::uint8_t>(v); break;
    case DataType::kInt32: static_cast<std::int32_t*>(base)[i] = v; break;
    case DataType::kInt64: static_cast<std::int64_t*>(base)[i] = v; break;
    case DataType::kInt16: static_cast<std::int16_t*>(base)[i] = static_cast<std::int16_t>(v); break;
    case DataType::kBool: static_cast<std::uint8_t*>(base)[i] = v != 0; break;
  }
}

double load(DataType dt, const void* base, std::int64_t i) {
  switch (dt) {
    case DataType::kFloat32: return static_cast<const float*>(base)[i];
    case DataType::kFloat64: return static_cast<const double*>(base)[i];
    case DataType::kFloat16: return from_half(static_cast<const std::uint16_t*>(base)[i]);
    case DataType::kBFloat16: return from_bf16(static_cast<const std::uint16_t*>(base)[i]);
    case DataType::kInt8: return static_cast<const std::int8_t*>(base)[i];
    case DataType::kUInt8: return static_cast<const std::uint8_t*>(base)[i];
    case DataType::kInt32: return static_cast<const std::int32_t*>(base)[i];
    case DataType::kInt64: return static_cast<double>(static_cast<const std::int64_t*>(base)[i]);
    case DataType::kInt16: return static_cast<const std::int16_t*>(base)[i];
    case DataType::kBool: return static_cast<const std::uint8_t*>(base)[i];
  }
  return -1;
}

// Rank r's input element i of tensor k at step s.
int input(ReduceOp op, DataType dt, int r, std::int64_t i, long s, int k) {
  const long x = r + i + s + k;
  if (dt == DataType::kBool) return static_cast<int>(x % 2);
  return op == ReduceOp::kProduct ? static_cast<int>(1 + x % 2) : static_cast<int>(x % 4);
}

double expected(ReduceOp op, DataType dt, int world, std::int64_t i, long s, int k) {
  long acc = input(op, dt, 0, i, s, k);
  for (int r = 1; r < world; ++r) {
    const long v = input(op, dt, r, i, s, k);
    switch (op) {
      case ReduceOp::kSum: acc = dt == DataType::kBool ? (acc || v) : acc + v; break;
      case ReduceOp::kMax: acc = std::max(acc, v); break;
      case ReduceOp::kMin: acc = std::min(acc, v); break;
      case ReduceOp::kProduct: acc = dt == DataType::kBool ? (acc && v) : acc * v; break;
      default: break;
    }
  }
  return static_cast<double>(acc);
}

struct Tensor {
  std::string name;
  DataType dtype;
  ReduceOp op;
  std::int64_t count;
  int k;  // index in the set: varies the inputs between tensors
  std::vector<std::byte> buf;

  gyre::TensorView view() { return {buf.data(), dtype, {count}}; }
  void fill(int rank, long step) {
    for (std::int64_t i = 0; i < count; ++i) store(dtype, buf.data(), i, input(op, dtype, rank, i, step, k));
  }
  // Number of wrong elements; prints the first.
  long check(int world, long step, int rank) const {
    long wrong = 0;
    for (std::int64_t i = 0; i < count; ++i) {
      const double want = expected(op, dtype, world, i, step, k), got = load(dtype, buf.data(), i);
      if (got != want) {
        if (wrong++ == 0) {
          std::fprintf(stderr, "rank %d step %ld: %s (%s %s) element %lld is %g, expected %g\n",
                       rank, step, name.c_str(), std::string(gyre::dtype_name(dtype)).c_str(),
                       std::string(gyre::op_name(op)).c_str(), static_cast<long long>(i), got,
                       want);
        }
      }
    }
    return wrong;
  }
};

Tensor make(std::string name, DataType dt, ReduceOp op, std::int64_t count, int k) {
  Tensor t{std::move(name), dt, op, count, k, {}};
  t.buf.resize(static_cast<std::size_t>(count) * gyre::dtype_size(dt));
  return t;
}

// Rows rank r contributes to the allgather at step s: 1..5, different from
// the previous step's on every rank.
std::int64_t gather_rows(int r, long s) { return 1 + (s * 2 + r) % 5; }

long check_gather(const gyre::OwnedTensor& out, int world, long s, int rank) {
  std::int64_t rows = 0;
  for (int r = 0; r < world; ++r) rows += gather_rows(r, s);
  if (out.dtype != DataType::kInt32 || out.shape.size() != 2 || out.shape[0] != rows ||
      out.shape[1] != kGatherCols) {
    std::fprintf(stderr, "rank %d step %ld: allgather has the wrong shape or dtype\n", rank, s);
    return 1;
  }
  const auto* v = reinterpret_cast<const std::int32_t*>(out.data.data());
  long wrong = 0;
  std::int64_t at = 0;
  for (int r = 0; r < world; ++r) {
    for (std::int64_t row = 0; row < gather_rows(r, s); ++row, ++at) {
      for (std::int64_t c = 0; c < kGatherCols; ++c) {
        const auto want = static_cast<std::int32_t>(r * 1000000 + (s % 1000) * 1000 + row * 10 + c);
        if (v[at * kGatherCols + c] != want && wrong++ == 0) {
          std::fprintf(stderr, "rank %d step %ld: allgather row %lld col %lld is %d, expected %d\n",
                       rank, s, static_cast<long long>(at), static_cast<long long>(c),
                       v[at * kGatherCols + c], want);
        }
      }
    }
  }
  return wrong;
}

long arg(int argc, char** argv, const char* flag, long fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], flag) == 0) return std::strtol(argv[i + 1], nullptr, 10);
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const long steps = arg(argc, argv, "--steps", 1000);
  const long warm = arg(argc, argv, "--warmup", std::min(1000L, steps / 3));
  const long bound_mib = arg(argc, argv, "--rss-bound-mib", 1);
  if (steps < 2 || warm < 1 || warm >= steps) {
    std::fprintf(stderr, "usage: gyre_core_soak [--steps N>=2] [--warmup 1..N-1] [--rss-bound-mib M]\n");
    return 2;
  }
  const gyre::Options opt = gyre::Options::from_env();
  gyre::init(opt);
  const int rank = gyre::rank(), world = gyre::size();

  std::vector<Tensor> singles;
  int k = 0;
  for (int d = 0; d < kDtypes; ++d) {
    const auto dt = static_cast<DataType>(d);
    for (std::int64_t count : {33, 200}) {
      singles.push_back(make("small." + std::string(gyre::dtype_name(dt)) + "." + std::to_string(count),
                             dt, kOps[k % 4], count, k));
      ++k;
    }
  }
  // Just over the per-tensor fusion limit: reduced unfused, from the
  // caller's buffer (no limit: past a bucket of the threshold).
  const std::size_t limit = opt.fusion_max_tensor_bytes != 0 ? opt.fusion_max_tensor_bytes
                                                             : opt.fusion_threshold_bytes;
  singles.push_back(make("large.float32", DataType::kFloat32, ReduceOp::kSum,
                         static_cast<std::int64_t>(limit / 4 + 5), k++));
  singles.push_back(make("large.int32", DataType::kInt32, ReduceOp::kMax,
                         static_cast<std::int64_t>(limit / 4 + 17), k++));
  std::vector<Tensor> group;
  group.push_back(make("group.a", DataType::kFloat32, ReduceOp::kSum, 17, k++));
  group.push_back(make("group.b", DataType::kInt64, ReduceOp::kSum, 1000, k++));
  group.push_back(make("group.c", DataType::kBFloat16, ReduceOp::kSum, 3, k++));
  std::vector<std::string> group_names;
  for (auto& t : group) group_names.push_back(t.name);
  std::vector<std::int32_t> gather_in;

  long wrong = 0, rss_warm = -1;
  const auto start = std::chrono::steady_clock::now();
  auto warm_at = start;
  for (long s = 1; s <= steps; ++s) {
    std::vector<gyre::Handle> handles;
    for (auto& t : singles) {
      t.fill(rank, s);
      handles.push_back(gyre::allreduce_async(t.name, t.view(), t.view(), t.op));
    }
    std::vector<gyre::TensorView> views;
    for (auto& t : group) {
      t.fill(rank, s);
      views.push_back(t.view());
    }
    handles.push_back(gyre::grouped_allreduce_async(group_names, views, views, ReduceOp::kSum));
    const std::int64_t rows = gather_rows(rank, s);
    gather_in.resize(static_cast<std::size_t>(rows * kGatherCols));
    for (std::int64_t row = 0; row < rows; ++row) {
      for (std::int64_t c = 0; c < kGatherCols; ++c) {
        gather_in[static_cast<std::size_t>(row * kGatherCols + c)] =
            static_cast<std::int32_t>(rank * 1000000 + (s % 1000) * 1000 + row * 10 + c);
      }
    }
    gyre::Handle gather =
        gyre::allgather_async("gather", {gather_in.data(), DataType::kInt32, {rows, kGatherCols}});
    for (auto& h : handles) h.wait();
    gather.wait();
    for (const auto& t : singles) wrong += t.check(world, s, rank);
    for (const auto& t : group) wrong += t.check(world, s, rank);
    wrong += check_gather(gather.output(), world, s, rank);
    if (s == warm) {
      rss_warm = rss_kib();
      warm_at = std::chrono::steady_clock::now();
    }
  }
  const auto end = std::chrono::steady_clock::now();
  const long rss_end = rss_kib();
  const gyre::RuntimeStats stats = gyre::runtime_stats();

  // Every rank's figures to rank 0, through gyre itself.
  std::vector<std::int64_t> mine = {rss_warm, rss_end, wrong,
                                    static_cast<std::int64_t>(stats.cache_hits_sent),
                                    static_cast<std::int64_t>(stats.requests_sent),
                                    static_cast<std::int64_t>(stats.rounds)};
  const auto n = static_cast<std::int64_t>(mine.size());
  gyre::Handle all = gyre::allgather_async("soak.figures", {mine.data(), DataType::kInt64, {1, n}});
  all.wait();
  const auto* fig = reinterpret_cast<const std::int64_t*>(all.output().data.data());

#ifdef GYRE_SOAK_ASAN
  const bool check_rss = false;
#else
  const bool check_rss = true;
#endif
  const long bound_kib = bound_mib * 1024;
  bool ok = true;
  const double total_s = std::chrono::duration<double>(end - start).count();
  const double after_warm_s = std::chrono::duration<double>(end - warm_at).count();
  if (rank == 0) {
    std::printf("soak: %d ranks, %ld steps of %zu allreduces, a group of %zu and an allgather: "
                "%.1f s (%.3f ms per step after the warm-up)\n",
                world, steps, singles.size(), group.size(), total_s,
                1000.0 * after_warm_s / static_cast<double>(steps - warm));
    std::printf("%4s %14s %14s %10s %8s %12s %10s %9s\n", "rank", "rss@warm KiB", "rss@end KiB",
                "growth", "wrong", "cache hits", "in full", "hit rate");
  }
  for (int r = 0; r < world; ++r) {
    const std::int64_t* f = fig + r * n;
    const std::int64_t growth = f[1] - f[0];
    const double rate = static_cast<double>(f[3]) / static_cast<double>(std::max<std::int64_t>(1, f[3] + f[4]));
    if (rank == 0) {
      std::printf("%4d %14lld %14lld %10lld %8lld %12lld %10lld %8.2f%%\n", r,
                  static_cast<long long>(f[0]), static_cast<long long>(f[1]),
                  static_cast<long long>(growth), static_cast<long long>(f[2]),
                  static_cast<long long>(f[3]), static_cast<long long>(f[4]), 100.0 * rate);
    }
    if (f[2] != 0) ok = false;
    if (check_rss && (f[0] < 0 || growth > bound_kib)) ok = false;
  }
  if (rank == 0) {
    std::printf("rss measured after step %ld and after step %ld; bound %ld KiB %s\n", warm, steps,
                bound_kib, check_rss ? "(checked)" : "(not checked under AddressSanitizer)");
    std::printf("negotiation rounds: %lld (%.2f per step)\n", static_cast<long long>(fig[5]),
                static_cast<double>(fig[5]) / static_cast<double>(steps));
    std::printf("%s\n", ok ? "PASS" : "FAIL");
  }
  std::fflush(stdout);
  gyre::shutdown();
  return ok ? 0 : 1;
}
