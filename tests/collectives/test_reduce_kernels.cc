// Reduction kernels against a scalar reference, for every (dtype, op) pair,
// through both entry points (2-operand reduce_kernel, 3-operand
// combine_kernel in its three aliasing forms), at lengths that exercise the
// vector loop's tail and at misaligned addresses; and scale().
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gyre/collectives/float16.h"
#include "gyre/collectives/reduce_kernels.h"
#include "gyre/error.h"
#include "test_support.h"

using namespace gyre;
using namespace gyre::collectives;

namespace {

// The reference: one element, written as plainly as possible.
template <class T>
T ref_op(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage: return a + b;
    case ReduceOp::kMin: return std::min(a, b);
    case ReduceOp::kMax: return std::max(a, b);
    case ReduceOp::kProduct: return a * b;
  }
  return a;
}

// Reference for element i of dtype dt (raw bytes in, raw bytes out).
void reference(DataType dt, ReduceOp op, const std::byte* a, const std::byte* b, std::byte* out,
               std::size_t i) {
  auto wrap = [](auto x, auto y, auto fn) {  // integers: compute wide, wrap to width
    return fn(static_cast<std::int64_t>(x), static_cast<std::int64_t>(y));
  };
  switch (dt) {
    case DataType::kFloat32: {
      float x, y;
      std::memcpy(&x, a + 4 * i, 4); std::memcpy(&y, b + 4 * i, 4);
      const float r = ref_op(op, x, y);
      std::memcpy(out + 4 * i, &r, 4);
      return;
    }
    case DataType::kFloat64: {
      double x, y;
      std::memcpy(&x, a + 8 * i, 8); std::memcpy(&y, b + 8 * i, 8);
      const double r = ref_op(op, x, y);
      std::memcpy(out + 8 * i, &r, 8);
      return;
    }
    case DataType::kFloat16:
    case DataType::kBFloat16: {
      std::uint16_t x, y;
      std::memcpy(&x, a + 2 * i, 2); std::memcpy(&y, b + 2 * i, 2);
      const bool half = dt == DataType::kFloat16;
      const float fx = half ? half_to_float(x) : bf16_to_float(x);
      const float fy = half ? half_to_float(y) : bf16_to_float(y);
      const float r = ref_op(op, fx, fy);  // accumulate in float32, round once
      const std::uint16_t rb = half ? float_to_half(r) : float_to_bf16(r);
      std::memcpy(out + 2 * i, &rb, 2);
      return;
    }
    default: break;
  }
  const std::size_t esz = dtype_size(dt);
  if (dt == DataType::kBool) {  // any non-zero byte is true; results are 0 or 1
    const bool x = a[i] != std::byte{0}, y = b[i] != std::byte{0};
    const bool any = op == ReduceOp::kSum || op == ReduceOp::kMax;
    out[i] = std::byte{static_cast<unsigned char>(any ? (x || y) : (x && y))};
    return;
  }
  std::int64_t x = 0, y = 0;
  // Sign-extend from the element width.
  auto get = [&](const std::byte* p) -> std::int64_t {
    switch (dt) {
      case DataType::kInt8: { std::int8_t v; std::memcpy(&v, p, 1); return v; }
      case DataType::kUInt8: { std::uint8_t v; std::memcpy(&v, p, 1); return v; }
      case DataType::kInt32: { std::int32_t v; std::memcpy(&v, p, 4); return v; }
      case DataType::kInt16: { std::int16_t v; std::memcpy(&v, p, 2); return v; }
      default: { std::int64_t v; std::memcpy(&v, p, 8); return v; }
    }
  };
  x = get(a + esz * i);
  y = get(b + esz * i);
  std::int64_t r = 0;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage: r = wrap(x, y, [](std::int64_t p, std::int64_t q) {
        return static_cast<std::int64_t>(static_cast<std::uint64_t>(p) + static_cast<std::uint64_t>(q)); }); break;
    case ReduceOp::kProduct: r = wrap(x, y, [](std::int64_t p, std::int64_t q) {
        return static_cast<std::int64_t>(static_cast<std::uint64_t>(p) * static_cast<std::uint64_t>(q)); }); break;
    case ReduceOp::kMin: r = std::min(x, y); break;
    case ReduceOp::kMax: r = std::max(x, y); break;
    default: break;
  }
  std::memcpy(out + esz * i, &r, esz);  // little-endian: the low bytes are the wrapped result
}

// Random raw bytes, with floats kept finite and non-NaN (min/max of NaN is
// not specified) and including subnormals and signed zeros for 16-bit types.
std::vector<std::byte> random_elems(DataType dt, std::size_t count, std::mt19937& gen) {
  const std::size_t esz = dtype_size(dt);
  std::vector<std::byte> v(count * esz);
  std::uniform_real_distribution<double> real(-100.0, 100.0);
  for (std::size_t i = 0; i < count; ++i) {
    if (dt == DataType::kFloat16 || dt == DataType::kBFloat16) {
      std::uint16_t h;
      do {
        h = static_cast<std::uint16_t>(gen());
      } while (dt == DataType::kFloat16 ? (h & 0x7c00) == 0x7c00 : (h & 0x7f80) == 0x7f80);
      std::memcpy(v.data() + 2 * i, &h, 2);
    } else if (is_floating(dt)) {
      test::store(dt, v.data(), i, (i % 17 == 0) ? 0.0 : real(gen));
    } else {
      const std::uint64_t raw = (static_cast<std::uint64_t>(gen()) << 32) | gen();
      std::memcpy(v.data() + esz * i, &raw, esz);  // full range: overflow wraps
    }
  }
  return v;
}

}  // namespace

TEST_CASE("reduce and combine kernels match the scalar reference for every dtype and op",
          "[kernels]") {
  std::mt19937 gen(42);
  for (KernelIsa isa : {KernelIsa::kBest, KernelIsa::kPortable})
  for (DataType dt : test::kAllTypes) {
    for (ReduceOp op : test::kAllOps) {
      if (!op_defined(dt, op)) {
        CHECK_THROWS_AS(reduce_kernel(dt, op, isa), InvalidArgument);
        CHECK_THROWS_AS(combine_kernel(dt, op, isa), InvalidArgument);
        continue;
      }
      const ReduceFn reduce = reduce_kernel(dt, op, isa);
      const CombineFn combine = combine_kernel(dt, op, isa);
      const std::size_t esz = dtype_size(dt);
      for (std::size_t count : {0, 1, 3, 7, 8, 9, 15, 16, 17, 63, 1027}) {
        for (std::size_t misalign : {std::size_t{0}, esz}) {
          INFO("isa " << (isa == KernelIsa::kBest ? "best" : "portable") << " dtype " << dtype_name(dt) << " op " << op_name(op) << " count " << count
                        << " offset " << misalign);
          const auto a = random_elems(dt, count + 1, gen);
          const auto b = random_elems(dt, count + 1, gen);
          std::vector<std::byte> want((count + 1) * esz);
          const std::byte* pa = a.data() + misalign;
          const std::byte* pb = b.data() + misalign;
          for (std::size_t i = 0; i < count; ++i) reference(dt, op, pa, pb, want.data(), i);
          const auto want_span = std::vector<std::byte>(want.begin(), want.begin() + count * esz);

          std::vector<std::byte> inout(a);  // reduce: inout = a (+) b
          reduce(inout.data() + misalign, pb, count);
          CHECK(std::vector<std::byte>(inout.begin() + misalign, inout.begin() + misalign + count * esz) == want_span);

          std::vector<std::byte> out((count + 1) * esz, std::byte{0x77});  // disjoint
          combine(out.data() + misalign, pa, pb, count);
          CHECK(std::vector<std::byte>(out.begin() + misalign, out.begin() + misalign + count * esz) == want_span);

          std::vector<std::byte> ia(a), ib(b);  // out == a, out == b
          combine(ia.data() + misalign, ia.data() + misalign, pb, count);
          CHECK(std::vector<std::byte>(ia.begin() + misalign, ia.begin() + misalign + count * esz) == want_span);
          combine(ib.data() + misalign, pa, ib.data() + misalign, count);
          CHECK(std::vector<std::byte>(ib.begin() + misalign, ib.begin() + misalign + count * esz) == want_span);
        }
      }
    }
  }
}

TEST_CASE("kernels: integer wrap-around and float16 accumulation in float32", "[kernels]") {
  std::int32_t a[2] = {std::numeric_limits<std::int32_t>::max(), -7};
  const std::int32_t b[2] = {1, 3};
  reduce_kernel(DataType::kInt32, ReduceOp::kSum)(a, b, 2);
  CHECK(a[0] == std::numeric_limits<std::int32_t>::min());
  CHECK(a[1] == -4);
  std::uint8_t u[1] = {200};
  const std::uint8_t v[1] = {100};
  reduce_kernel(DataType::kUInt8, ReduceOp::kSum)(u, v, 1);
  CHECK(u[0] == 44);
  // 2048 + 1 is not a half; the float32 sum 2049 rounds to even (2048), the
  // sum of 2048 + 3 = 2051 rounds up to 2052.
  std::uint16_t h[2] = {float_to_half(2048.0f), float_to_half(2048.0f)};
  const std::uint16_t k[2] = {float_to_half(1.0f), float_to_half(3.0f)};
  reduce_kernel(DataType::kFloat16, ReduceOp::kSum)(h, k, 2);
  CHECK(half_to_float(h[0]) == 2048.0f);
  CHECK(half_to_float(h[1]) == 2052.0f);
  // Overflow of the 16-bit range gives infinity; inf + finite stays inf.
  std::uint16_t big[1] = {float_to_half(60000.0f)};
  const std::uint16_t more[1] = {float_to_half(60000.0f)};
  reduce_kernel(DataType::kFloat16, ReduceOp::kSum)(big, more, 1);
  CHECK(std::isinf(half_to_float(big[0])));
  // NaN propagates through sum and product.
  float f[2] = {std::numeric_limits<float>::quiet_NaN(), 2.0f};
  const float g[2] = {1.0f, std::numeric_limits<float>::quiet_NaN()};
  reduce_kernel(DataType::kFloat32, ReduceOp::kProduct)(f, g, 2);
  CHECK(std::isnan(f[0]));
  CHECK(std::isnan(f[1]));
}

TEST_CASE("16-bit scale: hardware and portable loops agree bit for bit", "[kernels]") {
  std::mt19937 gen(9);
  for (DataType dt : {DataType::kFloat16, DataType::kBFloat16}) {
    for (double factor : {0.5, 1.0 / 3.0, 3.0, 1e-3, 70000.0}) {
      std::vector<std::uint16_t> a(1003);
      for (auto& x : a) x = static_cast<std::uint16_t>(gen());  // every class, NaN and inf too
      std::vector<std::uint16_t> b = a;
      scale(a.data(), a.size(), dt, factor, KernelIsa::kBest);
      scale(b.data(), b.size(), dt, factor, KernelIsa::kPortable);
      std::size_t differ = 0;  // bit for bit, NaN payloads included
      for (std::size_t i = 0; i < a.size(); ++i) differ += a[i] != b[i];
      INFO("dtype " << dtype_name(dt) << " factor " << factor);
      CHECK(differ == 0);
    }
  }
}

TEST_CASE("scale multiplies floating types, truncates integers, refuses bool", "[kernels]") {
  std::vector<float> f = {1.0f, -2.0f, 3.5f};
  scale(f.data(), f.size(), DataType::kFloat32, 0.5);
  CHECK(f == std::vector<float>{0.5f, -1.0f, 1.75f});
  std::vector<double> d = {1.0, 3.0};
  scale(d.data(), d.size(), DataType::kFloat64, 1.0 / 3.0);
  CHECK(d[1] == 1.0);
  CHECK(d[0] == 1.0 / 3.0);
  std::vector<std::uint16_t> h = {float_to_half(3.0f), float_to_bf16(3.0f)};
  scale(h.data(), 1, DataType::kFloat16, 0.25);
  scale(h.data() + 1, 1, DataType::kBFloat16, 4.0);
  CHECK(half_to_float(h[0]) == 0.75f);
  CHECK(bf16_to_float(h[1]) == 12.0f);
  std::int32_t i[2] = {5, 6};
  scale(i, 2, DataType::kInt32, 1.0);  // factor 1: a no-op on any type
  CHECK(i[0] == 5);
  CHECK_THROWS_AS(scale(nullptr, 2, DataType::kFloat32, 2.0), InvalidArgument);

  // Integers, as Horovod scales them: the float64 product truncated toward zero.
  std::int32_t k[6] = {3, -3, 7, -7, 1, 0};
  scale(k, 6, DataType::kInt32, 0.5);
  CHECK(std::vector<std::int32_t>(k, k + 6) == std::vector<std::int32_t>{1, -1, 3, -3, 0, 0});
  std::int64_t big[2] = {1'000'000'007, -5};
  scale(big, 2, DataType::kInt64, 2.5);
  CHECK(big[0] == 2'500'000'017);  // 2500000017.5 truncated
  CHECK(big[1] == -12);
  std::uint8_t u[2] = {200, 9};
  scale(u, 2, DataType::kUInt8, 0.3);
  CHECK(u[0] == 60);  // 200 * 0.3 = 60.000000000000007 (float64) -> 60
  CHECK(u[1] == 2);   // 2.7 -> 2
  // Saturation beyond the type's range (C++ leaves that conversion undefined).
  std::int8_t s8[3] = {100, -100, 5};
  scale(s8, 3, DataType::kInt8, 3.0);
  CHECK(std::vector<int>(s8, s8 + 3) == std::vector<int>{127, -128, 15});
  std::int16_t s16[2] = {20000, -20000};
  scale(s16, 2, DataType::kInt16, 2.0);
  CHECK(s16[0] == 32767);
  CHECK(s16[1] == -32768);
  std::uint8_t neg[1] = {4};
  scale(neg, 1, DataType::kUInt8, -1.0);
  CHECK(neg[0] == 0);
  // 1/n divides: an exact multiple of n stays exact where the float64
  // product falls short (49 * fl(1/49) = 0.99999999999999989).
  REQUIRE(49.0 * (1.0 / 49.0) < 1.0);
  std::int32_t avg[3] = {49, 98, -49};
  scale(avg, 3, DataType::kInt32, 1.0 / 49.0);
  CHECK(std::vector<std::int32_t>(avg, avg + 3) == std::vector<std::int32_t>{1, 2, -1});

  std::uint8_t b[2] = {1, 0};
  scale(b, 2, DataType::kBool, 1.0);  // factor 1: a no-op
  CHECK_THROWS_AS(scale(b, 2, DataType::kBool, 0.5), InvalidArgument);
}

TEST_CASE("an average's 1/n divides floats by n, as torch's t / n does", "[kernels]") {
  // x * fl(1/3) is one ulp off x / 3 for 132 of the integers -200..200 in
  // float32 (and 1332 of -2000..2000 in float64); a sum averaged over 3 ranks
  // must equal what the user computes as sum / 3.
  std::vector<float> f, want_f;
  std::vector<double> d, want_d;
  for (int x = -2000; x <= 2000; ++x) {
    f.push_back(static_cast<float>(x));
    want_f.push_back(static_cast<float>(x) / 3.0f);
    d.push_back(static_cast<double>(x));
    want_d.push_back(static_cast<double>(x) / 3.0);
  }
  REQUIRE(-200.0f * static_cast<float>(1.0 / 3.0) != -200.0f / 3.0f);
  for (KernelIsa isa : {KernelIsa::kBest, KernelIsa::kPortable}) {
    auto g = f;
    auto e = d;
    scale(g.data(), g.size(), DataType::kFloat32, 1.0 / 3.0, isa);
    scale(e.data(), e.size(), DataType::kFloat64, 1.0 / 3.0, isa);
    CHECK(g == want_f);
    CHECK(e == want_d);
  }
  // Not a reciprocal of an integer: still a product.
  std::vector<float> p = {3.0f};
  scale(p.data(), 1, DataType::kFloat32, 0.3);
  CHECK(p[0] == 3.0f * static_cast<float>(0.3));
}
