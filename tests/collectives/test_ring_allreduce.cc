// The allreduce algorithms on the in-process transport: ring_allreduce,
// recursive_doubling_allreduce and the size-based allreduce, every dtype and
// op, world sizes 1..8, awkward counts, in place and out of place, many
// chunks, and one few-million-element case. Expectations are closed forms
// (test_support.h), checked element by element on every rank.
#include <catch2/catch.hpp>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gyre/collectives/algorithms.h"
#include "gyre/collectives/local_transport.h"
#include "test_support.h"

using namespace gyre;
using namespace gyre::collectives;
using gyre::transport::run_local_world;

namespace {

constexpr std::chrono::milliseconds kRingAllreduceTimeout{60000};

enum class Algo { kRing, kRecursiveDoubling, kBySize };

const char* algo_name(Algo a) {
  switch (a) {
    case Algo::kRing: return "ring";
    case Algo::kRecursiveDoubling: return "recursive doubling";
    case Algo::kBySize: return "by size";
  }
  return "?";
}

struct Case {
  int n;
  std::size_t count;
  DataType dt;
  ReduceOp op;
  bool in_place;
  std::size_t chunk_bytes = kDefaultChunkBytes;
  double prescale = 1.0, postscale = 1.0;
  Algo algo = Algo::kRing;
  std::size_t small_bytes = kDefaultSmallBytes;
};

std::string describe(const Case& c) {
  return "n=" + std::to_string(c.n) + " count=" + std::to_string(c.count) + " dtype=" +
         std::string(dtype_name(c.dt)) + " op=" + std::string(op_name(c.op)) +
         (c.in_place ? " in-place" : " out-of-place") + " chunk_bytes=" +
         std::to_string(c.chunk_bytes) + " prescale=" + std::to_string(c.prescale) +
         " postscale=" + std::to_string(c.postscale) + " algorithm=" + algo_name(c.algo) +
         " small_bytes=" + std::to_string(c.small_bytes);
}

// Runs the case; returns "" when every element of every rank is right,
// otherwise a description of the first wrong element.
std::string run_case(const Case& c) {
  const std::size_t esz = dtype_size(c.dt);
  std::vector<std::vector<std::byte>> in(c.n), out(c.n);
  for (int r = 0; r < c.n; ++r) {
    in[r].resize(c.count * esz);
    for (std::size_t i = 0; i < c.count; ++i) test::store(c.dt, in[r].data(), i, test::contribution(c.op, r, i));
    out[r] = c.in_place ? in[r] : std::vector<std::byte>(c.count * esz, std::byte{0x5a});
  }
  const std::vector<std::vector<std::byte>> original = in;
  run_local_world(c.n, [&](transport::Transport& t) {
    auto& o = out[t.rank()];
    const void* src = c.in_place ? o.data() : in[t.rank()].data();
    switch (c.algo) {
      case Algo::kRing: {
        RingAllreduceOptions opt;
        opt.chunk_bytes = c.chunk_bytes;
        opt.prescale = c.prescale;
        opt.postscale = c.postscale;
        ring_allreduce(t, src, o.data(), c.count, c.dt, c.op, opt);
        break;
      }
      case Algo::kRecursiveDoubling: {
        RecursiveDoublingOptions opt;
        opt.prescale = c.prescale;
        opt.postscale = c.postscale;
        recursive_doubling_allreduce(t, src, o.data(), c.count, c.dt, c.op, opt);
        break;
      }
      case Algo::kBySize: {
        AllreduceOptions opt;
        opt.chunk_bytes = c.chunk_bytes;
        opt.prescale = c.prescale;
        opt.postscale = c.postscale;
        opt.small_bytes = c.small_bytes;
        allreduce(t, src, o.data(), c.count, c.dt, c.op, opt);
        break;
      }
    }
  }, kRingAllreduceTimeout);
  const bool scaled = c.op == ReduceOp::kAverage || c.prescale != 1.0 || c.postscale != 1.0;
  const double tol = scaled ? test::scaled_tolerance(c.dt) : 0.0;
  double factor = c.postscale;
  if (c.op != ReduceOp::kProduct) factor *= c.prescale;  // linear ops only in these tests
  for (int r = 0; r < c.n; ++r) {
    for (std::size_t i = 0; i < c.count; ++i) {
      const double want = test::expected(c.dt, c.op, c.n, i) * factor;
      const double got = test::load(c.dt, out[r].data(), i);
      if (!test::close_enough(got, want, tol)) {
        return "rank " + std::to_string(r) + " element " + std::to_string(i) + ": got " +
               std::to_string(got) + ", want " + std::to_string(want);
      }
    }
    if (!c.in_place && in[r] != original[r]) return "rank " + std::to_string(r) + ": input was modified";
  }
  return "";
}

void check(const Case& c) {
  INFO(describe(c));
  CHECK(run_case(c) == "");
}

}  // namespace

void every_dtype_and_op(Algo algo) {
  for (int n = 1; n <= 8; ++n) {
    const std::size_t counts[] = {0, 1, static_cast<std::size_t>(n - 1),
                                  static_cast<std::size_t>(n + 1), 1009};
    for (DataType dt : test::kAllTypes) {
      for (ReduceOp op : test::kAllOps) {
        if (!op_defined(dt, op)) continue;
        for (std::size_t count : counts) {
          for (bool in_place : {false, true}) {
            Case c{n, count, dt, op, in_place};
            c.algo = algo;
            check(c);
          }
        }
      }
    }
  }
}

TEST_CASE("ring_allreduce: every dtype and op for world sizes 1..8 and awkward counts",
          "[allreduce]") {
  every_dtype_and_op(Algo::kRing);
}

TEST_CASE("recursive_doubling_allreduce: every dtype and op for world sizes 1..8 and awkward counts",
          "[allreduce]") {
  every_dtype_and_op(Algo::kRecursiveDoubling);
}

TEST_CASE("recursive_doubling_allreduce: prescale, postscale and a large buffer", "[allreduce]") {
  for (int n : {2, 3, 5, 6}) {
    for (DataType dt : {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16}) {
      for (bool in_place : {false, true}) {
        Case c{n, 301, dt, ReduceOp::kAverage, in_place, kDefaultChunkBytes, 2.0, 0.25};
        c.algo = Algo::kRecursiveDoubling;
        check(c);
      }
    }
  }
  Case big{7, 200'003, DataType::kInt32, ReduceOp::kSum, false};
  big.algo = Algo::kRecursiveDoubling;
  check(big);
}

TEST_CASE("allreduce: recursive doubling up to small_bytes, the ring above, and ring only with 0",
          "[allreduce]") {
  for (int n : {2, 3, 4, 7}) {
    for (std::size_t small : {std::size_t{0}, std::size_t{64}, kDefaultSmallBytes}) {
      for (std::size_t count : {std::size_t{15}, std::size_t{16}, std::size_t{17}, std::size_t{5000}}) {
        Case c{n, count, DataType::kFloat32, ReduceOp::kSum, count % 2 == 0, 1024};
        c.algo = Algo::kBySize;
        c.small_bytes = small;
        check(c);
      }
    }
  }
}

// Every rank must hold the same bits, also where an op is not commutative
// bit for bit: min and max between NaN and a number, or +0 and -0.
TEST_CASE("recursive_doubling_allreduce: bit-identical results on every rank", "[allreduce]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int n = 2; n <= 7; ++n) {
    for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kSum}) {
      std::vector<std::vector<float>> buf(n);
      for (int r = 0; r < n; ++r) {
        buf[r] = {r % 2 ? nan : 1.0f, r % 2 ? 0.0f : -0.0f, r == n - 1 ? nan : float(r),
                  r == 0 ? -nan : 2.0f};
      }
      run_local_world(n, [&](transport::Transport& t) {
        auto& b = buf[t.rank()];
        recursive_doubling_allreduce(t, b.data(), b.data(), b.size(), DataType::kFloat32, op);
      }, kRingAllreduceTimeout);
      INFO("n=" << n << " op=" << op_name(op));
      for (int r = 1; r < n; ++r) {
        CHECK(std::memcmp(buf[r].data(), buf[0].data(), buf[0].size() * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("ring_allreduce: many chunks per segment, including chunks of one element",
          "[allreduce]") {
  for (int n = 1; n <= 8; ++n) {
    for (DataType dt : test::kAllTypes) {
      const std::size_t esz = dtype_size(dt);
      for (bool in_place : {false, true}) {
        // ~13 chunks of 7 elements per segment, the last ones uneven.
        check({n, static_cast<std::size_t>(90 * n + 3), dt, ReduceOp::kSum, in_place, 7 * esz});
        // One element per chunk; a chunk size that is not a multiple of the
        // element size is rounded down to whole elements.
        check({n, static_cast<std::size_t>(3 * n + 2), dt, ReduceOp::kMax, in_place, esz + esz / 2});
        check({n, 257, dt, ReduceOp::kSum, in_place, 1});
      }
    }
  }
}

TEST_CASE("ring_allreduce: prescale and postscale on floating types", "[allreduce]") {
  for (int n : {1, 2, 3, 5}) {
    for (DataType dt : {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16}) {
      for (bool in_place : {false, true}) {
        check({n, 301, dt, ReduceOp::kSum, in_place, 64, 0.5, 1.0});
        check({n, 301, dt, ReduceOp::kAverage, in_place, 64, 2.0, 0.25});
        check({n, 301, dt, ReduceOp::kMax, in_place, 64, 1.0, 4.0});
      }
    }
  }
}

TEST_CASE("ring_allreduce: a few million elements", "[allreduce][large]") {
  check({4, 3'000'017, DataType::kFloat32, ReduceOp::kSum, false});
  check({3, 2'000'003, DataType::kInt32, ReduceOp::kSum, true, 64 * 1024});
  check({2, 4'000'037, DataType::kBFloat16, ReduceOp::kMax, false});
}

TEST_CASE("allreduce: integer average, prescale and postscale truncate as Horovod's",
          "[allreduce]") {
  // Rank r holds 5 + r + i % 3. Each algorithm: prescale 0.5 truncates each
  // contribution, postscale 0.75 truncates the sum; average divides the sum
  // by n toward zero.
  for (int n : {1, 2, 3, 4}) {
    for (int algo = 0; algo < 2; ++algo) {
      for (DataType dt : {DataType::kInt8, DataType::kUInt8, DataType::kInt16, DataType::kInt32,
                          DataType::kInt64}) {
        INFO("n " << n << (algo ? " ring" : " recursive doubling") << " " << dtype_name(dt));
        const std::size_t count = 50, esz = dtype_size(dt);
        std::vector<std::vector<std::byte>> scaled(n), avg(n);
        run_local_world(n, [&](transport::Transport& t) {
          auto& s = scaled[t.rank()];
          auto& a = avg[t.rank()];
          s.resize(count * esz);
          a.resize(count * esz);
          for (std::size_t i = 0; i < count; ++i) {
            test::store(dt, s.data(), i, 5 + t.rank() + static_cast<double>(i % 3));
            test::store(dt, a.data(), i, (i % 2 ? -1.0 : 1.0) * (5 + t.rank() + i % 3));
          }
          if (dt == DataType::kUInt8) std::memcpy(a.data(), s.data(), a.size());
          AllreduceOptions o;
          o.small_bytes = algo == 0 ? std::size_t{1} << 20 : 0;
          o.prescale = 0.5;
          o.postscale = 0.75;
          allreduce(t, s.data(), s.data(), count, dt, ReduceOp::kSum, o);
          allreduce(t, a.data(), a.data(), count, dt, ReduceOp::kAverage,
                    AllreduceOptions{.small_bytes = o.small_bytes});
        }, kRingAllreduceTimeout);
        for (std::size_t i = 0; i < count; ++i) {
          double sum = 0, plain = 0;
          for (int r = 0; r < n; ++r) {
            sum += std::trunc((5 + r + static_cast<double>(i % 3)) * 0.5);
            plain += 5 + r + static_cast<double>(i % 3);
          }
          const double sign = (dt == DataType::kUInt8 || i % 2 == 0) ? 1.0 : -1.0;
          for (int r = 0; r < n; ++r) {
            CHECK(test::load(dt, scaled[r].data(), i) == std::trunc(sum * 0.75));
            CHECK(test::load(dt, avg[r].data(), i) == sign * std::trunc(plain / n));
          }
        }
      }
    }
  }
}
