// Rabenseifner's allreduce on the in-process transport, for every world size
// 1..16 (powers of two and not), counts of zero, one, fewer than the ranks,
// odd and larger, every dtype and op the ring supports, in place and out of
// place, with chunks small enough that every exchange is pipelined.
//
// What "right" means here:
// - against closed forms (test_support.h: small integers, which every type
//   and every op represents exactly): bit-identical wherever no scaling is
//   involved (every dtype, every op), within scaled_tolerance() for average
//   and pre/postscale on floating types;
// - against ring_allreduce on random data: bit-identical for the exact ops
//   (every op on integer and bool types; min and max on floating types),
//   within a relative tolerance of a few units in the last place of the sum
//   of magnitudes for floating sum, average and product (the two algorithms
//   add in different orders; float16 and bfloat16 round after every step);
// - every rank holds the same bits, also with NaN and signed zeros under
//   min and max;
// - allreduce() with large = kRabenseifner runs this algorithm above
//   small_bytes (its messages are counted) and the ring with kRing.
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gyre/collectives/algorithms.h"
#include "gyre/collectives/local_transport.h"
#include "gyre/error.h"
#include "gyre/collectives/counting_transport.h"
#include "test_support.h"

using namespace gyre;
using namespace gyre::collectives;
using gyre::transport::run_local_world;

namespace {

constexpr std::chrono::milliseconds kRabenseifnerTimeout{60000};

// test::expected, with integer sums and products wrapped to the type's
// width as the kernels wrap them (16 ranks overflow int8 and uint8), and an
// integer average the wrapped sum divided by n toward zero.
double want_for(DataType dt, ReduceOp op, int n, std::size_t i) {
  const bool wraps = dt == DataType::kInt8 || dt == DataType::kUInt8 || dt == DataType::kInt16 ||
                     dt == DataType::kInt32;
  if (!wraps || op == ReduceOp::kMin || op == ReduceOp::kMax) return test::expected(dt, op, n, i);
  const auto exact = static_cast<std::int64_t>(
      test::expected(op == ReduceOp::kAverage ? ReduceOp::kSum : op, n, i));
  double wrapped = 0;
  switch (dt) {
    case DataType::kInt8: wrapped = static_cast<std::int8_t>(exact); break;
    case DataType::kUInt8: wrapped = static_cast<std::uint8_t>(exact); break;
    case DataType::kInt16: wrapped = static_cast<std::int16_t>(exact); break;
    default: wrapped = static_cast<double>(static_cast<std::int32_t>(exact)); break;
  }
  return op == ReduceOp::kAverage ? std::trunc(wrapped / n) : wrapped;
}

std::vector<std::size_t> counts_for(int n) {
  const auto un = static_cast<std::size_t>(n);
  return {0, 1, un > 1 ? un - 1 : 2, un + 1, 2 * un + 3, 1009};
}

// Every dtype and op against the closed forms, for world size n: one world
// runs every count, in place and out of place, with the default chunk and
// with chunks of a few elements (many chunks per exchange, more than the
// window). Returns "" or the first wrong element.
std::string closed_forms(int n, DataType dt, ReduceOp op) {
  const std::size_t esz = dtype_size(dt);
  struct Call {
    std::size_t count;
    bool in_place;
    std::size_t chunk_bytes;
  };
  std::vector<Call> calls;
  for (std::size_t count : counts_for(n)) {
    for (bool in_place : {false, true}) {
      // Small chunks: 3 elements for the short buffers, 16 for the long
      // one (32 chunks in its first exchange, four windows' worth).
      const std::size_t small_chunk = (count > 100 ? 16 : 3) * esz;
      for (std::size_t chunk : {kDefaultChunkBytes, small_chunk}) calls.push_back({count, in_place, chunk});
    }
  }
  // results[call][rank], inputs[call][rank] (to check out-of-place inputs
  // stay unchanged).
  std::vector<std::vector<std::vector<std::byte>>> results(calls.size(),
                                                           std::vector<std::vector<std::byte>>(n));
  std::vector<std::vector<std::vector<std::byte>>> inputs = results;
  run_local_world(n, [&](transport::Transport& t) {
    const int r = t.rank();
    for (std::size_t k = 0; k < calls.size(); ++k) {
      const Call& c = calls[k];
      std::vector<std::byte>& in = inputs[k][r];
      std::vector<std::byte>& out = results[k][r];
      in.resize(c.count * esz);
      for (std::size_t i = 0; i < c.count; ++i) test::store(dt, in.data(), i, test::contribution(op, r, i));
      out = c.in_place ? in : std::vector<std::byte>(c.count * esz, std::byte{0x5a});
      RabenseifnerOptions o;
      o.chunk_bytes = c.chunk_bytes;
      o.tag = static_cast<int>(k % 3);
      rabenseifner_allreduce(t, c.in_place ? out.data() : in.data(), out.data(), c.count, dt, op, o);
    }
  }, kRabenseifnerTimeout);
  const double tol = op == ReduceOp::kAverage ? test::scaled_tolerance(dt) : 0.0;
  for (std::size_t k = 0; k < calls.size(); ++k) {
    const Call& c = calls[k];
    for (int r = 0; r < n; ++r) {
      for (std::size_t i = 0; i < c.count; ++i) {
        const double want = want_for(dt, op, n, i);
        const double got = test::load(dt, results[k][r].data(), i);
        if (!test::close_enough(got, want, tol)) {
          return "count " + std::to_string(c.count) + (c.in_place ? " in place" : " out of place") +
                 " chunk_bytes " + std::to_string(c.chunk_bytes) + ": rank " + std::to_string(r) +
                 " element " + std::to_string(i) + ": got " + std::to_string(got) + ", want " +
                 std::to_string(want);
        }
      }
      if (!c.in_place) {
        for (std::size_t i = 0; i < c.count; ++i) {
          if (test::load(dt, inputs[k][r].data(), i) != test::contribution(op, r, i) &&
              dt != DataType::kBool) {
            return "count " + std::to_string(c.count) + ": rank " + std::to_string(r) +
                   " input modified";
          }
        }
      }
      // (Count 0: empty buffers, whose data() may be null: nothing to compare.)
      if (!results[k][0].empty() &&
          std::memcmp(results[k][r].data(), results[k][0].data(), results[k][0].size()) != 0) {
        return "count " + std::to_string(c.count) + ": rank " + std::to_string(r) +
               " differs from rank 0";
      }
    }
  }
  return "";
}

// Random contributions for dtype dt: floating values in [-2, 2) (in [0.5,
// 1.5) for product, so that 16 ranks neither overflow nor underflow),
// integers in a small range (wrapping is exact anyway), bool 0/1.
void fill_random(DataType dt, ReduceOp op, void* buf, std::size_t count, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> real(op == ReduceOp::kProduct ? 0.5 : -2.0,
                                              op == ReduceOp::kProduct ? 1.5 : 2.0);
  std::uniform_int_distribution<int> small(-100, 100);
  for (std::size_t i = 0; i < count; ++i) {
    double v;
    if (is_floating(dt)) {
      v = real(rng);
    } else if (dt == DataType::kBool) {
      v = small(rng) > 0;
    } else if (dt == DataType::kUInt8) {
      v = small(rng) + 100;
    } else {
      v = small(rng);
    }
    test::store(dt, buf, i, v);
  }
}

bool exact_op(DataType dt, ReduceOp op) {
  if (!is_floating(dt)) return true;  // wrapping sums and products are associative
  return op == ReduceOp::kMin || op == ReduceOp::kMax;
}

// Relative tolerance (of the sum of magnitudes, per rank count) for the
// inexact floating ops: each rank's partial result rounds once per step.
double random_tolerance(DataType dt, int n) {
  const double ulp = dt == DataType::kFloat16    ? 1.0 / 1024
                     : dt == DataType::kBFloat16 ? 1.0 / 128
                     : dt == DataType::kFloat32  ? 1.2e-7
                                                 : 2.3e-16;
  return 2.0 * ulp * (n + 1);
}

// Rabenseifner against the ring on random data for world size n.
std::string against_ring(int n, DataType dt, ReduceOp op, std::uint64_t seed) {
  const std::size_t esz = dtype_size(dt);
  const std::vector<std::size_t> counts = counts_for(n);
  std::vector<std::vector<std::vector<std::byte>>> in(counts.size()), ring(counts.size()),
      rab(counts.size());
  std::mt19937_64 rng(seed);
  for (std::size_t k = 0; k < counts.size(); ++k) {
    in[k].resize(n);
    ring[k].resize(n);
    rab[k].resize(n);
    for (int r = 0; r < n; ++r) {
      in[k][r].resize(counts[k] * esz);
      fill_random(dt, op, in[k][r].data(), counts[k], rng);
      ring[k][r].resize(counts[k] * esz);
      rab[k][r].resize(counts[k] * esz);
    }
  }
  run_local_world(n, [&](transport::Transport& t) {
    const int r = t.rank();
    for (std::size_t k = 0; k < counts.size(); ++k) {
      const std::size_t chunk = (counts[k] > 100 ? 32 : 5) * esz;
      RingAllreduceOptions ro;
      ro.chunk_bytes = chunk;
      ring_allreduce(t, in[k][r].data(), ring[k][r].data(), counts[k], dt, op, ro);
      RabenseifnerOptions bo;
      bo.chunk_bytes = chunk;
      rabenseifner_allreduce(t, in[k][r].data(), rab[k][r].data(), counts[k], dt, op, bo);
    }
  }, kRabenseifnerTimeout);
  const bool exact = exact_op(dt, op);
  const double tol = random_tolerance(dt, n);
  for (std::size_t k = 0; k < counts.size(); ++k) {
    for (int r = 0; r < n; ++r) {
      if (exact) {
        if (rab[k][r] != ring[k][r]) {
          return "count " + std::to_string(counts[k]) + ": rank " + std::to_string(r) +
                 " not bit-identical to the ring";
        }
        continue;
      }
      for (std::size_t i = 0; i < counts[k]; ++i) {
        const double a = test::load(dt, rab[k][r].data(), i);
        const double b = test::load(dt, ring[k][r].data(), i);
        double magnitude = 0;  // bound on the size of every partial result
        if (op == ReduceOp::kProduct) {
          magnitude = std::fabs(b);  // factors in [0.5, 1.5): relative error
        } else {
          for (int q = 0; q < n; ++q) magnitude += std::fabs(test::load(dt, in[k][q].data(), i));
          if (op == ReduceOp::kAverage) magnitude /= n;
        }
        if (!(std::fabs(a - b) <= tol * std::max(magnitude, 1e-3))) {
          return "count " + std::to_string(counts[k]) + ": rank " + std::to_string(r) +
                 " element " + std::to_string(i) + ": rabenseifner " + std::to_string(a) +
                 ", ring " + std::to_string(b);
        }
      }
    }
  }
  return "";
}

}  // namespace

TEST_CASE("rabenseifner_allreduce: every dtype and op against closed forms, 1..16 ranks",
          "[allreduce][rabenseifner]") {
  for (int n = 1; n <= 16; ++n) {
    for (DataType dt : test::kAllTypes) {
      for (ReduceOp op : test::kAllOps) {
        if (!op_defined(dt, op)) continue;
        INFO("n=" << n << " dtype=" << dtype_name(dt) << " op=" << op_name(op));
        CHECK(closed_forms(n, dt, op) == "");
      }
    }
  }
}

TEST_CASE("rabenseifner_allreduce: against ring_allreduce on random data, 1..16 ranks",
          "[allreduce][rabenseifner]") {
  std::uint64_t seed = 1;
  for (int n = 1; n <= 16; ++n) {
    for (DataType dt : test::kAllTypes) {
      for (ReduceOp op : test::kAllOps) {
        if (!op_defined(dt, op)) continue;
        INFO("n=" << n << " dtype=" << dtype_name(dt) << " op=" << op_name(op));
        CHECK(against_ring(n, dt, op, seed++) == "");
      }
    }
  }
}

TEST_CASE("rabenseifner_allreduce: prescale and postscale", "[allreduce][rabenseifner]") {
  for (int n : {1, 2, 3, 5, 6, 8, 13}) {
    for (DataType dt : {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                        DataType::kBFloat16, DataType::kInt32}) {
      for (bool in_place : {false, true}) {
        const std::size_t count = 301, esz = dtype_size(dt);
        std::vector<std::vector<std::byte>> in(n), out(n);
        run_local_world(n, [&](transport::Transport& t) {
          const int r = t.rank();
          in[r].resize(count * esz);
          for (std::size_t i = 0; i < count; ++i) {
            test::store(dt, in[r].data(), i, test::contribution(ReduceOp::kSum, r, i));
          }
          out[r] = in_place ? in[r] : std::vector<std::byte>(count * esz);
          RabenseifnerOptions o;
          o.chunk_bytes = 64;
          o.prescale = 2.0;
          o.postscale = 0.25;
          rabenseifner_allreduce(t, in_place ? out[r].data() : in[r].data(), out[r].data(), count,
                                 dt, ReduceOp::kAverage, o);
        }, kRabenseifnerTimeout);
        INFO("n=" << n << " dtype=" << dtype_name(dt) << (in_place ? " in place" : ""));
        for (int r = 0; r < n; ++r) {
          for (std::size_t i = 0; i < count; ++i) {
            double want;
            if (dt == DataType::kInt32) {
              // Horovod's integer scaling: each contribution truncated after
              // prescale, the sum after average's 1/n and after postscale.
              double sum = 0;
              for (int q = 0; q < n; ++q) sum += std::trunc(test::contribution(ReduceOp::kSum, q, i) * 2.0);
              want = std::trunc(std::trunc(sum / n) * 0.25);
              const double got = test::load(dt, out[r].data(), i);
              // The 1/n and 0.25 are applied as one factor: accept either
              // truncation order.
              const double once = std::trunc(sum * (0.25 / n));
              if (got != want && got != once) {
                FAIL_CHECK("rank " << r << " element " << i << ": got " << got << ", want " << want);
                break;
              }
              continue;
            }
            want = test::expected(ReduceOp::kAverage, n, i) * 2.0 * 0.25;
            const double got = test::load(dt, out[r].data(), i);
            if (!test::close_enough(got, want, test::scaled_tolerance(dt))) {
              FAIL_CHECK("rank " << r << " element " << i << ": got " << got << ", want " << want);
              break;
            }
          }
        }
      }
    }
  }
}

// Every rank must hold the same bits, also where an op is not commutative
// bit for bit: min and max between NaN and a number, or +0 and -0.
TEST_CASE("rabenseifner_allreduce: bit-identical results on every rank",
          "[allreduce][rabenseifner]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int n = 2; n <= 16; ++n) {
    for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kSum}) {
      std::vector<std::vector<float>> buf(n);
      for (int r = 0; r < n; ++r) {
        for (int rep = 0; rep < 9; ++rep) {
          buf[r].insert(buf[r].end(), {r % 2 ? nan : 1.0f, r % 2 ? 0.0f : -0.0f,
                                       r == n - 1 ? nan : float(r), r == 0 ? -nan : 2.0f});
        }
      }
      run_local_world(n, [&](transport::Transport& t) {
        auto& b = buf[t.rank()];
        RabenseifnerOptions o;
        o.chunk_bytes = 8;
        rabenseifner_allreduce(t, b.data(), b.data(), b.size(), DataType::kFloat32, op, o);
      }, kRabenseifnerTimeout);
      INFO("n=" << n << " op=" << op_name(op));
      for (int r = 1; r < n; ++r) {
        CHECK(std::memcmp(buf[r].data(), buf[0].data(), buf[0].size() * sizeof(float)) == 0);
      }
    }
  }
}

// The message counts of the algorithm, per rank, with one chunk per
// exchange: 2 log2(p) for the p ranks of the power of two, 2 more for each
// folded pair's even rank and 2 in all for its odd rank (its input, then
// nothing: it only receives); the ring's 2(n - 1) for comparison, through
// allreduce() with each value of `large`.
TEST_CASE("allreduce: large = kRabenseifner runs Rabenseifner's algorithm above small_bytes",
          "[allreduce][rabenseifner]") {
  for (int n = 2; n <= 16; ++n) {
    const int p = 1 << static_cast<int>(std::floor(std::log2(n)));
    const int extra = n - p, log_p = static_cast<int>(std::log2(p));
    for (LargeAllreduce large : {LargeAllreduce::kRing, LargeAllreduce::kRabenseifner}) {
      const std::size_t count = 64 * static_cast<std::size_t>(n);
      std::vector<std::size_t> messages(n);
      std::vector<std::vector<float>> buf(n, std::vector<float>(count));
      run_local_world(n, [&](transport::Transport& inner) {
        transport::CountingTransport t(inner);
        auto& b = buf[t.rank()];
        for (std::size_t i = 0; i < count; ++i) b[i] = static_cast<float>(t.rank() + i % 5);
        AllreduceOptions o;
        o.small_bytes = 16;
        o.large = large;
        allreduce(t, b.data(), b.data(), count, DataType::kFloat32, ReduceOp::kSum, o);
        messages[t.rank()] = t.messages();
      }, kRabenseifnerTimeout);
      INFO("n=" << n << " large=" << large_allreduce_name(large));
      for (int r = 0; r < n; ++r) {
        for (std::size_t i = 0; i < count; ++i) {
          const float want = static_cast<float>(n * (i % 5) + n * (n - 1) / 2);
          if (buf[r][i] != want) {
            FAIL_CHECK("rank " << r << " element " << i << ": got " << buf[r][i]);
            break;
          }
        }
        std::size_t want;
        if (large == LargeAllreduce::kRing) {
          want = 2 * static_cast<std::size_t>(n - 1);
        } else if (r < 2 * extra && r % 2 == 1) {
          want = 1;
        } else {
          want = 2 * static_cast<std::size_t>(log_p) + (r < 2 * extra ? 1 : 0);
        }
        CHECK(messages[r] == want);
      }
    }
  }
}

TEST_CASE("rabenseifner_allreduce: bad arguments are refused before any transfer",
          "[allreduce][rabenseifner]") {
  // Catch's assertions are not thread-safe (ThreadSanitizer reported a race
  // in Catch's own state when the ranks' threads asserted at once): each
  // rank counts its refusals, checked once the ranks have joined.
  constexpr int kRanks = 3;
  std::vector<int> refused(kRanks, 0);
  run_local_world(kRanks, [&](transport::Transport& t) {
    std::vector<float> b(10);
    auto refuses = [&](auto&& call) {
      try {
        call();
      } catch (const InvalidArgument&) {
        ++refused[static_cast<std::size_t>(t.rank())];
      }
    };
    refuses([&] {
      rabenseifner_allreduce(t, b.data(), b.data(), b.size(), DataType::kFloat32,
                             ReduceOp::kAdasum);
    });
    refuses([&] {
      rabenseifner_allreduce(t, nullptr, b.data(), b.size(), DataType::kFloat32, ReduceOp::kSum);
    });
    RabenseifnerOptions o;
    o.chunk_bytes = 0;
    refuses([&] {
      rabenseifner_allreduce(t, b.data(), b.data(), b.size(), DataType::kFloat32, ReduceOp::kSum,
                             o);
    });
    refuses([&] {
      rabenseifner_allreduce(t, b.data(), b.data() + 1, 5, DataType::kFloat32, ReduceOp::kSum);
    });
  }, kRabenseifnerTimeout);
  for (int r = 0; r < kRanks; ++r) CHECK(refused[static_cast<std::size_t>(r)] == 4);
}
