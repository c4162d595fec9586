// Horovod's dtypes, integer semantics, Adasum and run-time timeline through
// the whole runtime (negotiation, fusion, execution), ranks as threads over
// LocalTransport.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "local_job.h"

using namespace gyre;
using namespace gyre::test;
using core::Runtime;

namespace {


template <typename T>
TensorView view_of(std::vector<T>& v, DataType dt) {
  return TensorView{v.data(), dt, {static_cast<std::int64_t>(v.size())}};
}

// The Adasum pairwise rule on one tensor, and its tree over the ranks.
std::vector<double> adasum_pair(const std::vector<double>& a, const std::vector<double>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ab += a[i] * b[i];
    aa += a[i] * a[i];
    bb += b[i] * b[i];
  }
  const double ca = aa == 0 ? 1 : 1 - ab / (2 * aa), cb = bb == 0 ? 1 : 1 - ab / (2 * bb);
  std::vector<double> out(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) out[i] = ca * a[i] + cb * b[i];
  return out;
}
std::vector<double> adasum_tree(std::vector<std::vector<double>> parts) {
  for (std::size_t d = 1; d < parts.size(); d *= 2) {
    for (std::size_t r = 0; r < parts.size(); r += 2 * d) parts[r] = adasum_pair(parts[r], parts[r + d]);
  }
  return parts[0];
}

// Rank r's value of element i of tensor t.
double grad(int r, int t, std::size_t i) {
  return std::cos(0.3 * static_cast<double>(i + t)) + 0.25 * ((r * 7 + t * 3 + i) % 5) - 0.5;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("local: Adasum of a fused bucket combines each tensor on its own", "[runtime][adasum]") {
  for (int n : {2, 4}) {
    // Sizes that do not fill 64-byte slots, so the bucket has padding.
    const std::vector<std::size_t> sizes = {3, 100, 1, 257, 40};
    LocalJob::run(n, fast_options(), [&](int r, Runtime& rt) {
      std::vector<std::vector<double>> bufs(sizes.size());
      std::vector<std::string> names;
      std::vector<TensorView> views;
      for (std::size_t t = 0; t < sizes.size(); ++t) {
        bufs[t].resize(sizes[t]);
        for (std::size_t i = 0; i < sizes[t]; ++i) bufs[t][i] = grad(r, static_cast<int>(t), i);
        names.push_back(fmt::format("adasum.{}", t));
        views.push_back(view_of(bufs[t], DataType::kFloat64));
      }
      // Grouped: negotiated in one round, so fused into one bucket.
      wait_for(core::grouped_allreduce_async(rt, names, views, views, ReduceOp::kAdasum));
      // A lone tensor (no fusion) too.
      std::vector<double> lone(33);
      for (std::size_t i = 0; i < lone.size(); ++i) lone[i] = grad(r, 9, i);
      wait_for(core::allreduce_async(rt, "adasum.lone", view_of(lone, DataType::kFloat64),
                                     view_of(lone, DataType::kFloat64), ReduceOp::kAdasum));
      bufs.push_back(lone);
      std::vector<std::size_t> all = sizes;
      all.push_back(33);
      for (std::size_t t = 0; t < all.size(); ++t) {
        const int id = t < sizes.size() ? static_cast<int>(t) : 9;
        std::vector<std::vector<double>> parts(static_cast<std::size_t>(n));
        for (int q = 0; q < n; ++q) {
          for (std::size_t i = 0; i < all[t]; ++i) parts[static_cast<std::size_t>(q)].push_back(grad(q, id, i));
        }
        const auto want = adasum_tree(parts);
        for (std::size_t i = 0; i < all[t]; ++i) {
          if (std::fabs(bufs[t][i] - want[i]) > 1e-12 * std::max(1.0, std::fabs(want[i]))) {
            throw std::runtime_error(fmt::format("rank {} n {} tensor {} element {}: {} != {}", r,
                                                 n, t, i, bufs[t][i], want[i]));
          }
        }
      }
    });
  }
}

TEST_CASE("local: Adasum is refused alike on every rank of a world that is not a power of two",
          "[runtime][adasum]") {
  LocalJob::run(3, fast_options(), [&](int r, Runtime& rt) {
    std::vector<float> a(4, 1.0f);
    const std::string msg = expect_throw<InvalidArgument>(r, [&] {
      core::allreduce_async(rt, "adasum.three", view(a), view(a), ReduceOp::kAdasum);
    });
    GYRE_EXPECT(r, contains(msg, "power-of-two number of ranks") && contains(msg, "has 3"));
    std::vector<std::int32_t> ints(4, 1);
    const std::string typed = expect_throw<InvalidArgument>(r, [&] {
      core::allreduce_async(rt, "adasum.int", view_of(ints, DataType::kInt32),
                            view_of(ints, DataType::kInt32), ReduceOp::kAdasum);
    });
    GYRE_EXPECT(r, contains(typed, "Adasum needs float32"));
    // The runtime goes on.
    wait_for(core::allreduce_async(rt, "after.adasum", view(a), view(a), ReduceOp::kSum));
    GYRE_EXPECT(r, a[0] == 3.0f);
  });
}

TEST_CASE("local: integer average and scaling, int16 and bool in every collective",
          "[runtime][dtypes]") {
  const int n = 3;
  LocalJob::run(n, fast_options(), [&](int r, Runtime& rt) {
    // Average of 1 + r over 3 ranks: 6 / 3 = 2; of 0, -2, -3: -5 / 3 -> -1 (toward zero).
    std::vector<std::int32_t> avg = {1 + r, r == 0 ? 0 : -(r + 1)};
    Handle ha = core::allreduce_async(rt, "int.avg", view_of(avg, DataType::kInt32),
                                      view_of(avg, DataType::kInt32), ReduceOp::kAverage);
    // Prescale 0.5 truncates 5 + r to 2, 3, 3; postscale 0.75 of 8 is 6.
    std::vector<std::int64_t> sc(5, 5 + r);
    Handle hs = core::allreduce_async(rt, "int.scaled", view_of(sc, DataType::kInt64),
                                      view_of(sc, DataType::kInt64), ReduceOp::kSum, 0.5, 0.75);
    // int16 sum and bool or/and.
    std::vector<std::int16_t> s16(7, static_cast<std::int16_t>(1000 * (r + 1)));
    Handle h16 = core::allreduce_async(rt, "int16.sum", view_of(s16, DataType::kInt16),
                                       view_of(s16, DataType::kInt16), ReduceOp::kSum);
    std::vector<std::uint8_t> bor = {static_cast<std::uint8_t>(r == 1), 0};
    std::vector<std::uint8_t> band = {1, static_cast<std::uint8_t>(r != 2)};
    Handle hor = core::allreduce_async(rt, "bool.or", view_of(bor, DataType::kBool),
                                       view_of(bor, DataType::kBool), ReduceOp::kSum);
    Handle hand = core::allreduce_async(rt, "bool.and", view_of(band, DataType::kBool),
                                        view_of(band, DataType::kBool), ReduceOp::kProduct);
    // Byte moves: allgather, broadcast, alltoall of bool and int16.
    std::vector<std::uint8_t> gb(static_cast<std::size_t>(r + 1), static_cast<std::uint8_t>(r % 2));
    Handle hg = core::allgather_async(rt, "bool.gather", view_of(gb, DataType::kBool));
    std::vector<std::int16_t> bc(4, static_cast<std::int16_t>(r == 1 ? -300 : 0));
    Handle hb = core::broadcast_async(rt, "int16.bcast", view_of(bc, DataType::kInt16), 1);
    std::vector<std::int16_t> a2a = {static_cast<std::int16_t>(10 * r), static_cast<std::int16_t>(10 * r + 1),
                                     static_cast<std::int16_t>(10 * r + 2)};
    Handle hx = core::alltoall_async(rt, "int16.a2a", view_of(a2a, DataType::kInt16));
    std::vector<std::int16_t> rs(6, static_cast<std::int16_t>(r));
    Handle hr = core::reducescatter_async(rt, "int16.rs", TensorView{rs.data(), DataType::kInt16, {3, 2}},
                                          ReduceOp::kAverage);

    for (const Handle& h : {ha, hs, h16, hor, hand, hg, hb, hx, hr}) wait_for(h);
    GYRE_EXPECT(r, avg[0] == 2 && avg[1] == -1);
    GYRE_EXPECT(r, sc == std::vector<std::int64_t>(5, 6));
    GYRE_EXPECT(r, s16 == std::vector<std::int16_t>(7, 6000));
    GYRE_EXPECT(r, bor[0] == 1 && bor[1] == 0);
    GYRE_EXPECT(r, band[0] == 1 && band[1] == 0);
    const OwnedTensor& g = hg.output();
    GYRE_EXPECT(r, g.dtype == DataType::kBool && g.shape == std::vector<std::int64_t>{6});
    GYRE_EXPECT(r, g.data.size() == 6 && g.data[0] == std::byte{0} && g.data[1] == std::byte{1} &&
                       g.data[5] == std::byte{0});
    GYRE_EXPECT(r, bc == std::vector<std::int16_t>(4, -300));
    const OwnedTensor& x = hx.output();
    std::vector<std::int16_t> got(x.data.size() / 2);
    std::memcpy(got.data(), x.data.data(), x.data.size());
    GYRE_EXPECT(r, x.dtype == DataType::kInt16 &&
                       got == (std::vector<std::int16_t>{static_cast<std::int16_t>(r),
                                                         static_cast<std::int16_t>(10 + r),
                                                         static_cast<std::int16_t>(20 + r)}));
    const OwnedTensor& s = hr.output();
    std::int16_t first = 0;
    std::memcpy(&first, s.data.data(), 2);
    GYRE_EXPECT(r, s.dtype == DataType::kInt16 && first == 1);  // (0 + 1 + 2) / 3

    // Refused: average and scaling of bool, Adasum in reducescatter.
    GYRE_EXPECT(r, contains(expect_throw<InvalidArgument>(r, [&] {
      core::allreduce_async(rt, "bool.avg", view_of(bor, DataType::kBool),
                            view_of(bor, DataType::kBool), ReduceOp::kAverage);
    }), "not defined for bool"));
    GYRE_EXPECT(r, contains(expect_throw<InvalidArgument>(r, [&] {
      core::allreduce_async(rt, "bool.scaled", view_of(bor, DataType::kBool),
                            view_of(bor, DataType::kBool), ReduceOp::kSum, 2.0, 1.0);
    }), "scaling is not defined for bool"));
    std::vector<float> f(6, 1.0f);
    GYRE_EXPECT(r, contains(expect_throw<InvalidArgument>(r, [&] {
      core::reducescatter_async(rt, "rs.adasum", TensorView{f.data(), DataType::kFloat32, {3, 2}},
                                ReduceOp::kAdasum);
    }), "Adasum is an allreduce op"));
  });
}

TEST_CASE("local: start_timeline / stop_timeline record only what runs in between",
          "[runtime][timeline]") {
  const std::string stem = fmt::format("gyre_core_dyn_timeline_{}", ::getpid());
  LocalJob::run(2, fast_options(), [&](int r, Runtime& rt) {
    std::vector<float> a(10, 1.0f);
    wait_for(core::allreduce_async(rt, "before.start", view(a), view(a), ReduceOp::kSum));
    rt.start_timeline(stem + "_{rank}.json", true);
    wait_for(core::allreduce_async(rt, "while.recording", view(a), view(a), ReduceOp::kSum));
    rt.stop_timeline();
    rt.stop_timeline();  // nothing when not recording
    wait_for(core::allreduce_async(rt, "after.stop", view(a), view(a), ReduceOp::kSum));
    GYRE_EXPECT(r, a[0] == 8.0f);
    // A second recording in another file; a path without {rank}: rank 0's.
    rt.start_timeline(stem + "_second.json", false);
    wait_for(core::allreduce_async(rt, "second.recording", view(a), view(a), ReduceOp::kSum));
    rt.stop_timeline();
    const std::string bad = expect_throw<InvalidArgument>(r, [&] {
      rt.start_timeline("/nonexistent-dir/{rank}.json", false);
    });
    GYRE_EXPECT(r, contains(bad, "cannot create the timeline file"));
  });
  for (int r = 0; r < 2; ++r) {
    const std::string path = fmt::format("{}_{}.json", stem, r);
    INFO(path);
    const std::string text = read_file(path);
    CHECK_THAT(text, Catch::Contains("while.recording") && Catch::Contains("CYCLE_START"));
    CHECK_THAT(text, !Catch::Contains("before.start") && !Catch::Contains("after.stop") &&
                         !Catch::Contains("second.recording"));
    const std::string cmd = fmt::format(
        "python3 -c \"import json,sys; ev=json.load(open(sys.argv[1]))['traceEvents']; "
        "sys.exit(0 if all(e.get('ts', 0) >= 0 for e in ev) and "
        "{{'ALLREDUCE','CYCLE_START'}} <= {{e['name'] for e in ev}} else 1)\" {}", path);
    CHECK(std::system(cmd.c_str()) == 0);
    std::remove(path.c_str());
  }
  const std::string second = stem + "_second.json";
  CHECK_THAT(read_file(second), Catch::Contains("second.recording") &&
                                    !Catch::Contains("while.recording") &&
                                    !Catch::Contains("CYCLE_START"));
  std::remove(second.c_str());
}
