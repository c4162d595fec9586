// CUDA tensors through the public API under mpirun: allreduce (single and
// fused, several dtypes and ops, pre/postscale), broadcast, allgather and
// reducescatter with uneven first dimensions, alltoall with uneven splits,
// each checked against closed forms or against the same operation on CPU
// tensors (the ring over MPI), and the refusal of host memory posing as
// device memory.
//
// Needs one CUDA device per rank of a host (NCCL does not allow two ranks
// of a communicator on one device). Without enough devices it prints
// "SKIPPED: ..." and exits with kSkipCode, which CTest's SKIP_RETURN_CODE
// maps to "skipped"; `--probe N` does only that check for N ranks on this
// host (run_gpu_mpi.sh calls it before mpirun).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "gyre/collectives/float16.h"
#include "gyre/gyre.h"

namespace {

constexpr int kSkipCode = 77;
int g_failures = 0;
int g_rank = 0;

#define EXPECT(cond)                                                                \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "rank %d: %s:%d: expected %s\n", g_rank, __FILE__, __LINE__, \
                   #cond);                                                          \
      ++g_failures;                                                                 \
    }                                                                               \
  } while (0)

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "rank %d: %s: %s\n", g_rank, what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// A device copy of host bytes, freed at scope exit.
struct DeviceCopy {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  DeviceCopy(const void* host, std::size_t n) : bytes(n) {
    cuda_ok(cudaMalloc(&ptr, n ? n : 1), "cudaMalloc");
    if (n) cuda_ok(cudaMemcpy(ptr, host, n, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  ~DeviceCopy() { cudaFree(ptr); }
  template <typename T>
  std::vector<T> read() const {
    std::vector<T> out(bytes / sizeof(T));
    if (bytes) {
      cuda_ok(cudaMemcpy(out.data(), ptr, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    }
    return out;
  }
};

gyre::TensorView view(void* p, gyre::DataType dt, std::vector<std::int64_t> shape,
                      gyre::Device dev) {
  return gyre::TensorView{p, dt, std::move(shape), dev};
}

// The same allreduce on CPU and CUDA copies of `host`; both must agree
// bit for bit (2 ranks: one addition per element, the same rounding).
template <typename T>
std::vector<T> allreduce_both(const std::string& name, std::vector<T> host, gyre::DataType dt,
                              gyre::ReduceOp op, gyre::Device dev, double pre = 1.0,
                              double post = 1.0) {
  DeviceCopy d(host.data(), host.size() * sizeof(T));
  const std::int64_t n = static_cast<std::int64_t>(host.size());
  auto hg = gyre::allreduce_async(name + ".cuda", view(d.ptr, dt, {n}, dev),
                                  view(d.ptr, dt, {n}, dev), op, pre, post);
  auto hc = gyre::allreduce_async(name + ".cpu", view(host.data(), dt, {n}, {}),
                                  view(host.data(), dt, {n}, {}), op, pre, post);
  hg.wait();
  hc.wait();
  std::vector<T> gpu = d.read<T>();
  EXPECT(std::memcmp(gpu.data(), host.data(), host.size() * sizeof(T)) == 0);
  return gpu;
}

int run(gyre::Device dev) {
  const int r = gyre::rank();
  const int n = gyre::size();
  const std::size_t count = 1031;  // a prime: uneven segments

  {  // float32 sum: closed form sum over ranks of (q + i % 7)
    std::vector<float> x(count);
    for (std::size_t i = 0; i < count; ++i) x[i] = static_cast<float>(r + i % 7);
    auto got = allreduce_both("f32.sum", x, gyre::DataType::kFloat32, gyre::ReduceOp::kSum, dev);
    for (std::size_t i = 0; i < count; ++i) {
      EXPECT(got[i] == static_cast<float>(n * (n - 1) / 2 + n * static_cast<int>(i % 7)));
    }
  }
  {  // float64 average with prescale and postscale
    std::vector<double> x(count);
    for (std::size_t i = 0; i < count; ++i) x[i] = r + static_cast<double>(i % 5);
    auto got = allreduce_both("f64.avg", x, gyre::DataType::kFloat64, gyre::ReduceOp::kAverage,
                              dev, 2.0, 0.5);
    for (std::size_t i = 0; i < count; ++i) {
      double expect = (n - 1) / 2.0 + static_cast<double>(i % 5);  // 2 * 0.5 cancel
      EXPECT(std::fabs(got[i] - expect) < 1e-12);
    }
  }
  if ((n & (n - 1)) == 0) {  // Adasum: staged through host memory, the CPU algorithm's bits
    std::vector<float> x(count);
    for (std::size_t i = 0; i < count; ++i) {
      x[i] = static_cast<float>(std::sin(0.3 * static_cast<double>(i) + r));
    }
    auto got = allreduce_both("f32.adasum", x, gyre::DataType::kFloat32, gyre::ReduceOp::kAdasum,
                              dev);
    bool finite = true;
    for (float v : got) finite = finite && std::isfinite(v);
    EXPECT(finite);
  }
  {  // int32 min and max, int64 product
    std::vector<std::int32_t> x(count);
    for (std::size_t i = 0; i < count; ++i) x[i] = static_cast<std::int32_t>(i) - 10 * r;
    auto lo = allreduce_both("i32.min", x, gyre::DataType::kInt32, gyre::ReduceOp::kMin, dev);
    auto hi = allreduce_both("i32.max", x, gyre::DataType::kInt32, gyre::ReduceOp::kMax, dev);
    for (std::size_t i = 0; i < count; ++i) {
      EXPECT(lo[i] == static_cast<std::int32_t>(i) - 10 * (n - 1));
      EXPECT(hi[i] == static_cast<std::int32_t>(i));
    }
    std::vector<std::int64_t> p(count, r + 1);
    auto prod =
        allreduce_both("i64.prod", p, gyre::DataType::kInt64, gyre::ReduceOp::kProduct, dev);
    std::int64_t fact = 1;
    for (int q = 1; q <= n; ++q) fact *= q;
    for (auto v : prod) EXPECT(v == fact);
  }
  {  // float16 and bfloat16 sums of small integers (exact)
    std::vector<std::uint16_t> h(count), b(count);
    for (std::size_t i = 0; i < count; ++i) {
      h[i] = gyre::collectives::float_to_half(static_cast<float>(r + i % 3));
      b[i] = gyre::collectives::float_to_bf16(static_cast<float>(r + i % 3));
    }
    auto hs = allreduce_both("f16.sum", h, gyre::DataType::kFloat16, gyre::ReduceOp::kSum, dev);
    auto bs = allreduce_both("bf16.sum", b, gyre::DataType::kBFloat16, gyre::ReduceOp::kSum, dev);
    for (std::size_t i = 0; i < count; ++i) {
      const float expect = static_cast<float>(n * (n - 1) / 2 + n * static_cast<int>(i % 3));
      EXPECT(gyre::collectives::half_to_float(hs[i]) == expect);
      EXPECT(gyre::collectives::bf16_to_float(bs[i]) == expect);
    }
  }
  {  // several small tensors in one round: fused in the device fusion buffer
    constexpr int kTensors = 12;
    std::vector<std::vector<float>> host(kTensors);
    std::vector<std::unique_ptr<DeviceCopy>> dev_bufs;
    std::vector<gyre::Handle> handles;
    for (int k = 0; k < kTensors; ++k) {
      host[k].assign(static_cast<std::size_t>(5 + 3 * k), static_cast<float>(r + k));
      dev_bufs.push_back(std::make_unique<DeviceCopy>(host[k].data(), host[k].size() * 4));
      auto v = view(dev_bufs.back()->ptr, gyre::DataType::kFloat32,
                    {static_cast<std::int64_t>(host[k].size())}, dev);
      handles.push_back(gyre::allreduce_async("fused." + std::to_string(k), v, v,
                                              gyre::ReduceOp::kSum));
    }
    for (auto& h : handles) h.wait();
    for (int k = 0; k < kTensors; ++k) {
      for (float v : dev_bufs[k]->read<float>()) {
        EXPECT(v == static_cast<float>(n * (n - 1) / 2 + n * k));
      }
    }
  }
  {  // broadcast from the last rank
    std::vector<std::int64_t> x(count);
    for (std::size_t i = 0; i < count; ++i) x[i] = static_cast<std::int64_t>(i) * 1000 + r;
    DeviceCopy d(x.data(), x.size() * 8);
    gyre::broadcast_async("bcast", view(d.ptr, gyre::DataType::kInt64,
                                        {static_cast<std::int64_t>(count)}, dev), n - 1).wait();
    auto got = d.read<std::int64_t>();
    for (std::size_t i = 0; i < count; ++i) {
      EXPECT(got[i] == static_cast<std::int64_t>(i) * 1000 + (n - 1));
    }
  }
  {  // allgather, rank q contributes q + 1 rows of 3: compare with the CPU result
    const std::int64_t rows = r + 1;
    std::vector<float> x(static_cast<std::size_t>(rows * 3));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(r * 100 + i);
    DeviceCopy d(x.data(), x.size() * 4);
    auto hg = gyre::allgather_async("gather.cuda", view(d.ptr, gyre::DataType::kFloat32,
                                                        {rows, 3}, dev));
    auto hc = gyre::allgather_async("gather.cpu",
                                    view(x.data(), gyre::DataType::kFloat32, {rows, 3}, {}));
    hg.wait();
    hc.wait();
    const auto& g = hg.output();
    const auto& c = hc.output();
    EXPECT(g.shape == c.shape);
    EXPECT(g.shape.size() == 2 && g.shape[0] == static_cast<std::int64_t>(n * (n + 1) / 2));
    EXPECT(g.data.size() == c.data.size() &&
           std::memcmp(g.data.data(), c.data.data(), c.data.size()) == 0);
  }
  {  // reducescatter of 2n + 1 rows of 4 (uneven blocks), average with a prescale, vs the CPU
    const std::int64_t rows = 2 * n + 1;
    std::vector<float> x(static_cast<std::size_t>(rows * 4));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(r + i % 11);
    DeviceCopy d(x.data(), x.size() * 4);
    auto hg = gyre::reducescatter_async("rs.cuda", view(d.ptr, gyre::DataType::kFloat32,
                                                        {rows, 4}, dev),
                                        gyre::ReduceOp::kAverage, 2.0);
    auto hc = gyre::reducescatter_async("rs.cpu", view(x.data(), gyre::DataType::kFloat32,
                                                       {rows, 4}, {}),
                                        gyre::ReduceOp::kAverage, 2.0);
    hg.wait();
    hc.wait();
    const auto& g = hg.output();
    const auto& c = hc.output();
    EXPECT(g.shape == c.shape);
    EXPECT(g.shape.size() == 2 && g.shape[0] == (r == 0 ? 3 : 2));
    EXPECT(g.data.size() == c.data.size() &&
           std::memcmp(g.data.data(), c.data.data(), c.data.size()) == 0);
  }
  {  // alltoall: rank q sends p + q + 1 rows of 2 to rank p; compare with the CPU path
    std::vector<std::int64_t> splits(static_cast<std::size_t>(n));
    std::int64_t rows = 0;
    for (int p = 0; p < n; ++p) rows += splits[static_cast<std::size_t>(p)] = p + r + 1;
    std::vector<std::int32_t> x(static_cast<std::size_t>(rows * 2));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<std::int32_t>(r * 1000 + i);
    DeviceCopy d(x.data(), x.size() * 4);
    auto hg = gyre::alltoall_async("a2a.cuda", view(d.ptr, gyre::DataType::kInt32, {rows, 2}, dev),
                                   splits);
    auto hc = gyre::alltoall_async("a2a.cpu", view(x.data(), gyre::DataType::kInt32, {rows, 2}, {}),
                                   splits);
    hg.wait();
    hc.wait();
    EXPECT(hg.output().shape == hc.output().shape);
    EXPECT(hg.received_splits() == hc.received_splits());
    EXPECT(hg.output().data == hc.output().data);
  }
  {  // host memory that claims to be on the GPU
    std::vector<float> x(static_cast<std::size_t>(n), 1.0f);
    bool refused = false;
    try {
      gyre::allreduce_async("liar", view(x.data(), gyre::DataType::kFloat32, {n}, dev),
                            view(x.data(), gyre::DataType::kFloat32, {n}, dev),
                            gyre::ReduceOp::kSum);
    } catch (const gyre::InvalidArgument& e) {
      refused = std::string(e.what()).find("its buffer is host memory") != std::string::npos;
    }
    EXPECT(refused);
  }
  return g_failures;
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no CUDA device found (%s)\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount returned 0");
    return kSkipCode;
  }
  if (argc > 1 && std::strcmp(argv[1], "--probe") == 0) {
    const int ranks = argc > 2 ? std::atoi(argv[2]) : 1;
    if (devices < ranks) {
      std::printf("SKIPPED: %d ranks on this host need %d CUDA devices, found %d\n", ranks,
                  ranks, devices);
      return kSkipCode;
    }
    std::printf("%d CUDA device(s) found\n", devices);
    return 0;
  }
  gyre::init();
  g_rank = gyre::rank();
  if (gyre::local_size() > devices) {
    // Every rank of the host sees the same count, so all skip alike.
    std::printf("SKIPPED: %d ranks on this host need %d CUDA devices, found %d\n",
                gyre::local_size(), gyre::local_size(), devices);
    gyre::shutdown();
    return kSkipCode;
  }
  const int device = gyre::local_rank();
  cuda_ok(cudaSetDevice(device), "cudaSetDevice");
  int failures = run(gyre::Device{gyre::DeviceType::kCUDA, device});
  gyre::shutdown();
  if (failures) std::fprintf(stderr, "rank %d: %d failed checks\n", g_rank, failures);
  else std::printf("rank %d: all GPU checks passed\n", g_rank);
  return failures ? 1 : 0;
}
