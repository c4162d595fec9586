// Run on every rank of a job across several (simulated) hosts: allgather and
// allreduce of every dtype through the public API, once with the
// hierarchical forms forced (GYRE_HIERARCHICAL_ALLGATHER/_ALLREDUCE = 1) and
// once with the flat ring (= 0). Each result is checked against its closed
// form (allgather: every rank's rows; allreduce: the sum), and the two
// paths' results must be byte-identical for allgather. Exits non-zero on any
// rank that saw a difference; prints one summary line on rank 0.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <iterator>
#include <vector>

#include "gyre/gyre.h"

using namespace gyre;

namespace {

constexpr DataType kTypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                               DataType::kBFloat16, DataType::kInt8,   DataType::kUInt8,
                               DataType::kInt16,   DataType::kInt32,   DataType::kInt64,
                               DataType::kBool};

// Small non-negative integers every type holds exactly; float16 and bfloat16
// are written from their bit patterns of integers 0..7.
void store(DataType dt, std::byte* p, std::size_t i, int v) {
  switch (dt) {
    case DataType::kFloat32: { float x = static_cast<float>(v); std::memcpy(p + 4 * i, &x, 4); break; }
    case DataType::kFloat64: { double x = v; std::memcpy(p + 8 * i, &x, 8); break; }
    case DataType::kFloat16: {  // 0..7 exactly: 0x0000, 0x3c00 (1), 0x4000 (2), ...
      static const std::uint16_t h[] = {0x0000, 0x3c00, 0x4000, 0x4200, 0x4400, 0x4500, 0x4600, 0x4700};
      std::memcpy(p + 2 * i, &h[v & 7], 2);
      break;
    }
    case DataType::kBFloat16: {
      static const std::uint16_t b[] = {0x0000, 0x3f80, 0x4000, 0x4040, 0x4080, 0x40a0, 0x40c0, 0x40e0};
      std::memcpy(p + 2 * i, &b[v & 7], 2);
      break;
    }
    case DataType::kInt8: case DataType::kUInt8: p[i] = static_cast<std::byte>(v & 7); break;
    case DataType::kBool: p[i] = static_cast<std::byte>(v & 1); break;
    case DataType::kInt16: { std::int16_t x = static_cast<std::int16_t>(v & 7); std::memcpy(p + 2 * i, &x, 2); break; }
    case DataType::kInt32: { std::int32_t x = v & 7; std::memcpy(p + 4 * i, &x, 4); break; }
    case DataType::kInt64: { std::int64_t x = v & 7; std::memcpy(p + 8 * i, &x, 8); break; }
  }
}

int value(int rank, std::size_t i) { return static_cast<int>((rank * 3 + i) % 8); }
std::int64_t rows_of(int rank) { return rank % 3 == 1 ? 0 : 3 + 5 * rank; }  // rank 1 gives none
constexpr std::int64_t kCols = 37;

struct Result {
  std::vector<std::vector<std::byte>> gathered;  // per dtype
  int wrong = 0;
};

Result run(long hierarchical) {
  Options o = Options::from_env();
  o.hierarchical_allgather = hierarchical;
  o.hierarchical_allreduce = hierarchical;
  o.op_timeout_s = 120;
  init(o);
  const int n = size(), me = rank();
  Result res;
  for (DataType dt : kTypes) {
    const std::size_t esz = dtype_size(dt);
    // Allgather: rows_of(r) x kCols from rank r.
    std::vector<std::byte> in(static_cast<std::size_t>(rows_of(me) * kCols) * esz);
    for (std::size_t i = 0; i < in.size() / esz; ++i) store(dt, in.data(), i, value(me, i));
    Handle h = allgather_async("ag." + std::string(dtype_name(dt)),
                               TensorView{in.data(), dt, {rows_of(me), kCols}});
    h.wait();
    std::vector<std::byte> want;
    for (int r = 0; r < n; ++r) {
      std::vector<std::byte> block(static_cast<std::size_t>(rows_of(r) * kCols) * esz);
      for (std::size_t i = 0; i < block.size() / esz; ++i) store(dt, block.data(), i, value(r, i));
      want.insert(want.end(), block.begin(), block.end());
    }
    if (h.output().data != want) {
      std::fprintf(stderr, "rank %d: allgather %s (hierarchical=%ld) differs from every rank's rows\n",
                   me, dtype_name(dt).data(), hierarchical);
      ++res.wrong;
    }
    res.gathered.push_back(h.output().data);
    // Allreduce (max: exact in every type, bool included): 4099 elements.
    constexpr std::size_t kCount = 4099;
    std::vector<std::byte> buf(kCount * esz), expect(kCount * esz);
    for (std::size_t i = 0; i < kCount; ++i) {
      store(dt, buf.data(), i, value(me, i));
      int m = 0;
      for (int r = 0; r < n; ++r) m = std::max(m, dt == DataType::kBool ? value(r, i) & 1 : value(r, i));
      store(dt, expect.data(), i, m);
    }
    TensorView v{buf.data(), dt, {static_cast<std::int64_t>(kCount)}};
    allreduce_async("ar." + std::string(dtype_name(dt)), v, v, ReduceOp::kMax).wait();
    if (buf != expect) {
      std::fprintf(stderr, "rank %d: allreduce max %s (hierarchical=%ld) is wrong\n", me,
                   dtype_name(dt).data(), hierarchical);
      ++res.wrong;
    }
  }
  shutdown();
  return res;
}

}  // namespace

int main() {
  const Result hier = run(1);
  const Result flat = run(0);
  int wrong = hier.wrong + flat.wrong;
  for (std::size_t d = 0; d < hier.gathered.size(); ++d) {
    if (hier.gathered[d] != flat.gathered[d]) ++wrong;
  }
  init();
  const int me = rank(), n = size();
  // Every rank's count of differences, so rank 0's line covers the job.
  std::int32_t total = wrong;
  TensorView tv{&total, DataType::kInt32, {1}};
  allreduce("wrong", tv, tv, ReduceOp::kSum);
  const int hosts = cross_size();
  shutdown();
  if (me == 0) {
    std::printf("hierarchical_check: %d hosts x %d ranks, %zu dtypes, hierarchical and flat: %d "
                "differences\n", hosts, n / hosts, std::size(kTypes), total);
  }
  return total == 0 ? 0 : 1;
}
