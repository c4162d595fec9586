// Small allreduces reduced within the log-depth negotiation round
// (GYRE_SPECULATE_BYTES, negotiation/negotiator.h), with ranks as threads
// (the CI's TSan stage runs this program): the results are the same bits
// as the collective path gives (recursive doubling combines the same pairs
// in the same order), the same on every rank, for every op and with
// prescale and postscale; the runtime counts them; where the combine would
// not be exact (3 ranks) or the ranks' choices differ, nothing is
// speculated and the results are still right.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gyre/collectives/shm.h"
#include "gyre/collectives/shm_host.h"
#include "local_job.h"

using namespace gyre;
using gyre::test::fast_options;
using gyre::test::LocalJob;

namespace {

constexpr int kIters = 30;

struct Case {
  const char* name;
  DataType dt;
  ReduceOp op;
  double prescale, postscale;
};

const Case kCases[] = {
    {"sum", DataType::kFloat32, ReduceOp::kSum, 1.0, 1.0},
    {"average", DataType::kFloat32, ReduceOp::kAverage, 1.0, 1.0},
    {"min", DataType::kFloat32, ReduceOp::kMin, 1.0, 1.0},
    {"max", DataType::kFloat64, ReduceOp::kMax, 1.0, 1.0},
    {"scaled", DataType::kFloat64, ReduceOp::kSum, 0.1, 3.0},
    {"int64", DataType::kInt64, ReduceOp::kSum, 1.0, 1.0},
};

// Rank r's input at iteration i: values whose float sums round differently
// in different orders.
template <typename T>
std::vector<T> input(int r, int i, int elements = 5) {
  std::vector<T> v(static_cast<std::size_t>(elements));
  for (int k = 0; k < elements; ++k) {
    if constexpr (std::is_floating_point_v<T>) {
      v[static_cast<std::size_t>(k)] =
          static_cast<T>((r % 2 ? 1e7 : 1.0) * (0.1 * (r + 1) + 0.37 * i + 0.013 * k));
    } else {
      v[static_cast<std::size_t>(k)] = static_cast<T>((r + 1) * 1000003 * (i + 1) - k);
    }
  }
  return v;
}

// Runs every case kIters times on `ranks` ranks; returns the output bytes
// [rank][case][iteration] and each rank's count of speculated allreduces.
struct Outcome {
  std::vector<std::vector<std::vector<std::vector<std::byte>>>> out;
  std::vector<std::uint64_t> speculated;
};

// shm: the ranks share one shared-memory region (the ShmBackend, which
// reduces each element in rank order) instead of the transport's recursive
// doubling.
Outcome run_cases(int ranks, std::size_t speculate_bytes, bool shm = false, int elements = 5) {
  Options o = fast_options();
  o.speculate_bytes = speculate_bytes;
  collectives::ShmOptions so;
  so.timeout = std::chrono::milliseconds(60000);
  const std::size_t region_bytes = collectives::ShmGroup::region_bytes(ranks, so.slot_bytes);
  std::unique_ptr<std::byte, void (*)(void*)> region(
      static_cast<std::byte*>(std::aligned_alloc(64, (region_bytes + 63) / 64 * 64)), std::free);
  std::memset(region.get(), 0, region_bytes);
  LocalJob::Setup setup;
  if (shm) {
    setup = [&](int r, core::RuntimeInfo& info) {
      info.shm = transport::ShmHost::attach(region.get(), r, ranks, so);
    };
  }
  Outcome res;
  res.out.assign(static_cast<std::size_t>(ranks), {});
  res.speculated.assign(static_cast<std::size_t>(ranks), 0);
  LocalJob::run(ranks, o, [&](int r, core::Runtime& rt) {
    auto& mine = res.out[static_cast<std::size_t>(r)];
    mine.assign(std::size(kCases), {});
    for (int i = 0; i < kIters; ++i) {
      for (std::size_t c = 0; c < std::size(kCases); ++c) {
        const Case& k = kCases[c];
        std::vector<std::byte> bytes;
        auto go = [&](auto tag) {
          using T = decltype(tag);
          std::vector<T> in = input<T>(r, i, elements), out(in.size());
          TensorView vi{in.data(), k.dt, {static_cast<std::int64_t>(in.size())}};
          TensorView vo{out.data(), k.dt, {static_cast<std::int64_t>(out.size())}};
          core::allreduce_async(rt, k.name, vi, vo, k.op, k.prescale, k.postscale).wait();
          bytes.resize(out.size() * sizeof(T));
          std::memcpy(bytes.data(), out.data(), bytes.size());
        };
        if (k.dt == DataType::kFloat32) go(float{});
        else if (k.dt == DataType::kFloat64) go(double{});
        else go(std::int64_t{});
        mine[c].push_back(std::move(bytes));
      }
    }
    res.speculated[static_cast<std::size_t>(r)] = rt.negotiation_counters().speculated;
  }, setup);
  return res;
}

// With speculation (spec) every rank speculated and got the same bits as
// without (ref, which speculated nothing) and as rank 0. Every call but
// each case's first (not yet in the response cache) can be speculated; a
// round that holds more than one hit takes one.
void check_speculated_alike(const Outcome& spec, const Outcome& ref, int ranks) {
  for (int r = 0; r < ranks; ++r) {
    const auto q = static_cast<std::size_t>(r);
    CHECK(spec.speculated[q] > 0);
    CHECK(ref.speculated[q] == 0);
    for (std::size_t c = 0; c < std::size(kCases); ++c) {
      INFO("case " << kCases[c].name << ", rank " << r);
      CHECK(spec.out[q][c] == ref.out[q][c]);
      CHECK(spec.out[q][c] == spec.out[0][c]);
    }
  }
}

}  // namespace

TEST_CASE("local: small allreduces reduced within the negotiation round match the collectives",
          "[runtime][speculation]") {
  for (int ranks : {2, 4}) {
    INFO("ranks " << ranks);
    const Outcome spec = run_cases(ranks, 64);
    check_speculated_alike(spec, run_cases(ranks, 0), ranks);
    // And the values are the reductions (within float rounding).
    for (int i = 0; i < kIters; ++i) {
      double want_sum = 0, want_min = 1e300, want_max = -1e300;
      for (int r = 0; r < ranks; ++r) {
        const double x = input<double>(r, i)[2];
        want_sum += x;
        want_min = std::min(want_min, static_cast<double>(input<float>(r, i)[2]));
        want_max = std::max(want_max, x);
      }
      auto at = [&](std::size_t c, auto tag) {
        using T = decltype(tag);
        T v[5];
        std::memcpy(v, spec.out[0][c][static_cast<std::size_t>(i)].data(), sizeof v);
        return static_cast<double>(v[2]);
      };
      CHECK(at(0, float{}) == Approx(want_sum).epsilon(1e-6));
      CHECK(at(1, float{}) == Approx(want_sum / ranks).epsilon(1e-6));
      CHECK(at(2, float{}) == want_min);
      CHECK(at(3, double{}) == want_max);
      CHECK(at(4, double{}) == Approx(want_sum * 0.1 * 3.0).epsilon(1e-12));
      std::int64_t isum = 0;
      for (int r = 0; r < ranks; ++r) isum += input<std::int64_t>(r, i)[2];
      std::int64_t got[5];
      std::memcpy(got, spec.out[0][5][static_cast<std::size_t>(i)].data(), sizeof got);
      CHECK(got[2] == isum);
    }
  }
}

TEST_CASE("local: inputs of KiBs travel as the tail of the round's messages and give the "
          "collectives' bits",
          "[runtime][speculation]") {
  // 512 elements: 2 KiB of float32, 4 KiB of float64 and int64; 2048: 8
  // and 16 KiB. The round's vector grows by the input only in rounds that
  // speculate, and a void speculation drops it.
  for (int ranks : {2, 4, 8}) {
    for (int elements : {512, 2048}) {
      INFO("ranks " << ranks << ", elements " << elements);
      check_speculated_alike(run_cases(ranks, 16u << 10, false, elements),
                             run_cases(ranks, 0, false, elements), ranks);
    }
  }
  // Nothing above the option's bytes: 200 elements are 800 bytes of
  // float32, 1,600 of float64 and int64.
  CHECK(run_cases(2, 1024, false, 200).speculated[0] > 0);  // the float32 cases
  CHECK(run_cases(2, 700, false, 200).speculated[0] == 0);
}

TEST_CASE("local: the round speculates only sizes the backend reduces by recursive doubling",
          "[runtime][speculation]") {
  // 4 ranks, speculation allowed up to 64 KiB: with the built-in link
  // parameters the backend's cost model gives a 64 KiB buffer to
  // Rabenseifner's algorithm (cost_model.h, small_uses_rabenseifner), whose
  // bits are not recursive doubling's, so the round must not speculate it;
  // 32 KiB stays recursive doubling and is speculated. 8,192 elements:
  // 32 KiB of float32, 64 KiB of float64 and int64.
  const Outcome spec = run_cases(4, 64u << 10, false, 8192);
  check_speculated_alike(spec, run_cases(4, 0, false, 8192), 4);
  // Every iteration after the first of the three float32 cases (sum,
  // average, min), none of the 64 KiB ones.
  CHECK(spec.speculated[0] == 3 * (kIters - 1));
}

TEST_CASE("local: over shared memory the round reduces in rank order, as the backend does",
          "[runtime][speculation]") {
  // The shared-memory allreduce reduces each element in rank order
  // (((x0+x1)+x2)+x3); the round gathers every rank's input and reduces
  // them in that order, so speculated calls give the backend's bits, at 3
  // ranks too (not a power of two).
  for (int ranks : {3, 4}) {
    INFO("ranks " << ranks);
    check_speculated_alike(run_cases(ranks, 64, true), run_cases(ranks, 0, true), ranks);
  }
}

TEST_CASE("local: no speculation where the round's combine is not recursive doubling",
          "[runtime][speculation]") {
  // 3 ranks: the dissemination combines some ranks' words twice, which an
  // idempotent AND or min tolerates and a sum does not.
  const Outcome spec = run_cases(3, 64);
  const Outcome ref = run_cases(3, 0);
  for (std::size_t q = 0; q < 3; ++q) {
    CHECK(spec.speculated[q] == 0);
    for (std::size_t c = 0; c < std::size(kCases); ++c) CHECK(spec.out[q][c] == ref.out[q][c]);
  }
}

TEST_CASE("local: ranks that enqueue the same small operations in different orders speculate alike",
          "[runtime][speculation]") {
  // Two cached allreduces in flight at once, enqueued in opposite orders on
  // the two ranks: each rank speculates on its hit of the lowest cache
  // slot, so ranks holding the same hits choose the same one (choosing by
  // enqueue order, they would differ and every speculation would be void);
  // a round where the ranks' hits differ voids it, and every operation
  // still completes, right.
  std::vector<std::uint64_t> speculated(2);
  LocalJob::run(2, fast_options(), [&](int r, core::Runtime& rt) {
    for (int i = 0; i < kIters; ++i) {
      float a = static_cast<float>(r + i), b = static_cast<float>(10 * r + i);
      TensorView va{&a, DataType::kFloat32, {1}}, vb{&b, DataType::kFloat32, {1}};
      Handle ha, hb;
      if (r == 0) {
        ha = core::allreduce_async(rt, "a", va, va, ReduceOp::kSum);
        hb = core::allreduce_async(rt, "b", vb, vb, ReduceOp::kSum);
      } else {
        hb = core::allreduce_async(rt, "b", vb, vb, ReduceOp::kSum);
        ha = core::allreduce_async(rt, "a", va, va, ReduceOp::kSum);
      }
      ha.wait();
      hb.wait();
      GYRE_EXPECT(r, a == static_cast<float>(1 + 2 * i));
      GYRE_EXPECT(r, b == static_cast<float>(10 + 2 * i));
    }
    speculated[static_cast<std::size_t>(r)] = rt.negotiation_counters().speculated;
  });
  CHECK(speculated[0] > 0);
  CHECK(speculated[0] == speculated[1]);
}
