// The whole runtime (negotiation, fusion, execution) with 2-4 ranks as
// threads of this process over LocalTransport.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>

#include <unistd.h>

#include "local_job.h"

using namespace gyre;
using namespace gyre::test;
using core::Runtime;

namespace {


// Rank r fills element i of tensor t with r + (i + t) % 7: the sum over n
// ranks is n * ((i + t) % 7) + n (n - 1) / 2, exact in float32.
float fill(int r, std::size_t i, int t) { return static_cast<float>(r + (i + t) % 7); }
float expected_sum(int n, std::size_t i, int t) {
  return static_cast<float>(n * static_cast<int>((i + t) % 7) + n * (n - 1) / 2);
}

// Hundreds of tensors, each rank enqueueing them in its own random order;
// returns rank 0's results for comparison between configurations.
std::vector<std::vector<float>> random_order_run(int n, std::size_t fusion_threshold) {
  constexpr int kTensors = 300;
  Options opt = fast_options();
  opt.fusion_threshold_bytes = fusion_threshold;
  std::vector<std::vector<float>> rank0;
  LocalJob::run(n, opt, [&](int r, Runtime& rt) {
    std::vector<std::vector<float>> bufs(kTensors);
    std::vector<int> order(kTensors);
    for (int t = 0; t < kTensors; ++t) {
      std::size_t len = 1 + (static_cast<std::size_t>(t) * 7919) % 3000;
      bufs[t].resize(len);
      for (std::size_t i = 0; i < len; ++i) bufs[t][i] = fill(r, i, t);
      order[t] = t;
    }
    std::mt19937 rng(1234 + r);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<Handle> handles(kTensors);
    for (int t : order) {
      // Every third tensor is averaged, the others summed.
      ReduceOp op = t % 3 == 0 ? ReduceOp::kAverage : ReduceOp::kSum;
      handles[t] = core::allreduce_async(rt, fmt::format("grad.{}", t), view(bufs[t]),
                                         view(bufs[t]), op);
    }
    for (int t = 0; t < kTensors; ++t) {
      wait_for(handles[t]);
      for (std::size_t i = 0; i < bufs[t].size(); ++i) {
        float want = expected_sum(n, i, t);
        if (t % 3 == 0) want /= static_cast<float>(n);
        if (std::fabs(bufs[t][i] - want) > 1e-5f * std::max(1.0f, std::fabs(want))) {
          throw std::runtime_error(fmt::format("rank {} tensor {} element {}: {} != {}", r, t, i,
                                               bufs[t][i], want));
        }
      }
    }
    if (r == 0) rank0 = bufs;
  });
  return rank0;
}

}  // namespace

TEST_CASE("local: hundreds of tensors in a different order on every rank", "[runtime]") {
  auto fused = random_order_run(3, 64 << 10);
  auto unfused = random_order_run(3, 0);
  REQUIRE(fused.size() == unfused.size());
  for (std::size_t t = 0; t < fused.size(); ++t) {
    INFO("tensor " << t);
    REQUIRE(fused[t] == unfused[t]);  // bit-identical with fusion on and off
  }
  random_order_run(2, 4 << 20);
}

TEST_CASE("local: every collective, grouped allreduce and barrier", "[runtime]") {
  const int n = 3;
  LocalJob::run(n, fast_options(), [&](int r, Runtime& rt) {
    // allgather: rank r contributes r + 1 rows of 2 int32.
    std::vector<std::int32_t> rows(static_cast<std::size_t>(2 * (r + 1)), r);
    TensorView g{rows.data(), DataType::kInt32, {r + 1, 2}};
    Handle hg = core::allgather_async(rt, "gather", g);
    // broadcast from rank 2.
    std::vector<double> b(5, r == 2 ? 7.5 : -1.0);
    Handle hb = core::broadcast_async(rt, "bcast", TensorView{b.data(), DataType::kFloat64, {5}}, 2);
    // alltoall: rank r sends p + 1 rows to rank p, row value 10 r + p.
    std::vector<std::int64_t> splits;
    std::vector<std::int64_t> data;
    for (int p = 0; p < n; ++p) {
      splits.push_back(p + 1);
      for (int k = 0; k <= p; ++k) data.push_back(10 * r + p);
    }
    Handle ha = core::alltoall_async(
        rt, "a2a", TensorView{data.data(), DataType::kInt64, {static_cast<std::int64_t>(data.size())}},
        splits);
    // reducescatter of 7 rows x 2: rows split 3, 2, 2.
    std::vector<float> rs(14);
    for (std::size_t i = 0; i < rs.size(); ++i) rs[i] = static_cast<float>(i + r);
    Handle hr = core::reducescatter_async(rt, "rs", TensorView{rs.data(), DataType::kFloat32, {7, 2}},
                                          ReduceOp::kSum);
    // grouped allreduce: one handle for both.
    std::vector<float> x(4, 1.0f), y(3, 2.0f);
    Handle hx = core::grouped_allreduce_async(rt, {"gx", "gy"}, {view(x), view(y)},
                                              {view(x), view(y)}, ReduceOp::kSum);
    core::barrier(rt);
    wait_for(hg);
    const OwnedTensor& go = hg.output();
    GYRE_EXPECT(r, (go.shape == std::vector<std::int64_t>{6, 2}));
    const auto* gi = reinterpret_cast<const std::int32_t*>(go.data.data());
    GYRE_EXPECT(r, gi[0] == 0 && gi[2] == 1 && gi[4] == 1 && gi[6] == 2 && gi[11] == 2);
    wait_for(hb);
    GYRE_EXPECT(r, b == std::vector<double>(5, 7.5));
    wait_for(ha);
    GYRE_EXPECT(r, (ha.received_splits() == std::vector<std::int64_t>(n, r + 1)));
    const auto* ai = reinterpret_cast<const std::int64_t*>(ha.output().data.data());
    for (int p = 0; p < n; ++p) {
      for (int k = 0; k <= r; ++k) GYRE_EXPECT(r, ai[p * (r + 1) + k] == 10 * p + r);
    }
    wait_for(hr);
    const OwnedTensor& ro = hr.output();
    std::int64_t my_rows = r == 0 ? 3 : 2, first_row = r == 0 ? 0 : (r == 1 ? 3 : 5);
    GYRE_EXPECT(r, (ro.shape == std::vector<std::int64_t>{my_rows, 2}));
    const auto* rf = reinterpret_cast<const float*>(ro.data.data());
    for (std::int64_t i = 0; i < my_rows * 2; ++i) {
      GYRE_EXPECT(r, rf[i] == static_cast<float>(3 * (first_row * 2 + i) + 3));
    }
    wait_for(hx);
    GYRE_EXPECT(r, x == std::vector<float>(4, 3.0f) && y == std::vector<float>(3, 6.0f));
  });
}

TEST_CASE("local: mismatches fail on every rank, the runtime goes on", "[runtime]") {
  std::promise<void> second_refused;
  auto refused = second_refused.get_future().share();
  LocalJob::run(3, fast_options(), [&](int r, Runtime& rt) {
    std::vector<float> a(r == 1 ? 5 : 4, 1.0f), b(4, 1.0f);
    auto msg = expect_throw<MismatchError>(r, [&] {
      wait_for(core::allreduce_async(rt, "bad.shape", view(a), view(a)));
    });
    GYRE_EXPECT(r, contains(msg, "'bad.shape'") && contains(msg, "shape") &&
                       contains(msg, "ranks 0, 2 have [4]") && contains(msg, "rank 1 has [5]"));
    std::vector<double> d(4, 1.0);
    TensorView dv = r == 2 ? TensorView{d.data(), DataType::kFloat64, {4}} : view(b);
    msg = expect_throw<MismatchError>(r, [&] {
      wait_for(core::allreduce_async(rt, "bad.dtype", dv, dv));
    });
    GYRE_EXPECT(r, contains(msg, "dtype") && contains(msg, "rank 2 has float64"));
    msg = expect_throw<MismatchError>(r, [&] {
      wait_for(core::allreduce_async(rt, "bad.op", view(b), view(b),
                                     r == 0 ? ReduceOp::kMax : ReduceOp::kSum));
    });
    GYRE_EXPECT(r, contains(msg, "reduce op") && contains(msg, "rank 0 has max"));
    msg = expect_throw<MismatchError>(r, [&] {
      wait_for(core::broadcast_async(rt, "bad.root", view(b), r == 0 ? 1 : 0));
    });
    GYRE_EXPECT(r, contains(msg, "root"));
    // A rank's own bad argument reaches the others with its reason.
    if (r == 1) {
      TensorView null_view{nullptr, DataType::kFloat32, {4}};
      msg = expect_throw<InvalidArgument>(r, [&] {
        core::allreduce_async(rt, "bad.buffer", null_view, null_view);
      });
      GYRE_EXPECT(r, contains(msg, "null"));
    } else {
      msg = expect_throw<InvalidArgument>(r, [&] {
        wait_for(core::allreduce_async(rt, "bad.buffer", view(b), view(b)));
      });
      GYRE_EXPECT(r, contains(msg, "failed on rank 1") && contains(msg, "null"));
    }
    // A name enqueued twice while pending: refused on that rank only. The
    // other ranks enqueue it only after rank 0's second attempt, so it is
    // certainly still pending then.
    std::vector<float> c(4, 1.0f);
    Handle h;
    if (r == 0) {
      h = core::allreduce_async(rt, "twice", view(c), view(c), ReduceOp::kSum);
      msg = expect_throw<InvalidArgument>(r, [&] {
        core::allreduce_async(rt, "twice", view(b), view(b), ReduceOp::kSum);
      });
      GYRE_EXPECT(r, contains(msg, "'twice'") && contains(msg, "already pending"));
      second_refused.set_value();
    } else {
      GYRE_EXPECT(r, refused.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
      h = core::allreduce_async(rt, "twice", view(c), view(c), ReduceOp::kSum);
    }
    wait_for(h);
    GYRE_EXPECT(r, c == std::vector<float>(4, 3.0f));
  });
}

TEST_CASE("local: a skipped step is a DivergenceError on every rank", "[runtime][version]") {
  LocalJob::run(3, fast_options(), [&](int r, Runtime& rt) {
    std::vector<float> g(8, 1.0f);
    for (int step = 0; step < 3; ++step) {
      wait_for(core::allreduce_async(rt, "grad", view(g), view(g), ReduceOp::kSum));
      if (!(r == 2 && step == 2)) rt.versions().commit();  // rank 2 skips its last commit
    }
    auto msg = expect_throw<DivergenceError>(r, [&] {
      wait_for(core::allreduce_async(rt, "grad", view(g), view(g)));
    });
    GYRE_EXPECT(r, contains(msg, "'grad'") && contains(msg, "ranks 0, 1 at step 3") &&
                       contains(msg, "rank 2 at step 2"));
    try {
      wait_for(core::allreduce_async(rt, "grad", view(g), view(g)));
      GYRE_EXPECT(r, false);
    } catch (const DivergenceError& e) {
      GYRE_EXPECT(r, e.detail().tensor == "grad");
      GYRE_EXPECT(r, (e.detail().ranks == std::vector<int>{0, 1, 2}));
      GYRE_EXPECT(r, (e.detail().steps == std::vector<std::uint64_t>{3, 3, 2}));
    }
    // Every rank's view of the version vector has seen the steps.
    auto vv = rt.versions().snapshot();
    GYRE_EXPECT(r, (vv == std::vector<std::uint64_t>{3, 3, 2}));
  });
}

TEST_CASE("local: fingerprint_check finds a perturbed element, resync repairs it",
          "[runtime][version]") {
  for (auto policy : {ResyncPolicy::kNewest, ResyncPolicy::kAverage}) {
    LocalJob::run(3, fast_options(), [&](int r, Runtime& rt) {
      std::vector<float> w(1000), v(10);
      for (std::size_t i = 0; i < w.size(); ++i) w[i] = 0.001f * static_cast<float>(i);
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
      if (r == 2) w[517] += 1.0f;
      for (int s = 0; s < (r == 1 ? 5 : 4); ++s) rt.versions().commit();  // rank 1 newest
      std::vector<NamedBuffer> bufs = {{"w", view(w)}, {"v", view(v)}};
      auto mm = core::fingerprint_check(rt, bufs);
      GYRE_EXPECT(r, mm.size() == 1 && mm[0].name == "w" && mm[0].groups.size() == 2);
      bool split_ok = false;
      for (auto& [digest, ranks] : mm[0].groups) {
        if (ranks == std::vector<int>{2}) split_ok = true;
      }
      GYRE_EXPECT(r, split_ok);
      core::resync(rt, bufs, policy);
      GYRE_EXPECT(r, core::fingerprint_check(rt, bufs).empty());
      float want = 0.001f * 517.0f + (policy == ResyncPolicy::kNewest ? 0.0f : 1.0f / 3.0f);
      GYRE_EXPECT(r, std::fabs(w[517] - want) < 1e-5f);
      GYRE_EXPECT(r, rt.versions().own() == 5);
      // After the next round every view agrees.
      std::vector<float> g(2, 1.0f);
      wait_for(core::allreduce_async(rt, "after", view(g), view(g)));
      GYRE_EXPECT(r, (rt.versions().snapshot() == std::vector<std::uint64_t>{5, 5, 5}));
    });
  }
}

TEST_CASE("local: join with uneven step counts", "[runtime][join]") {
  const int n = 3;
  LocalJob::run(n, fast_options(), [&](int r, Runtime& rt) {
    const int my_steps = 2 * (r + 1);  // 2, 4, 6
    for (int s = 0; s < my_steps; ++s) {
      std::vector<float> g(5, static_cast<float>(r + 1));
      std::vector<float> h(3, 1.0f);
      Handle a = core::allreduce_async(rt, fmt::format("g.{}", s), view(g), view(g));
      Handle b = core::allreduce_async(rt, fmt::format("h.{}", s), view(h), view(h), ReduceOp::kSum);
      // Joined ranks give zeros to a reduce-scatter; an allgather or a
      // broadcast fails while any rank has joined (Horovod's join).
      const bool all_running = s < 2;
      std::vector<float> rows(2, static_cast<float>(r));
      Handle c = core::allgather_async(rt, fmt::format("ag.{}", s), TensorView{rows.data(), DataType::kFloat32, {1, 2}});
      std::vector<float> bc(4, r == n - 1 ? 9.0f : 0.0f);
      Handle d = core::broadcast_async(rt, fmt::format("bc.{}", s), view(bc), n - 1);
      std::vector<float> rs(static_cast<std::size_t>(n), 1.0f);
      Handle e = core::reducescatter_async(rt, fmt::format("rs.{}", s),
                                           TensorView{rs.data(), DataType::kFloat32, {n}}, ReduceOp::kSum);
      wait_for(a);
      wait_for(b);
      if (all_running) {
        wait_for(c);
        wait_for(d);
      } else {
        expect_throw<StateError>(r, [&] { wait_for(c); });
        expect_throw<StateError>(r, [&] { wait_for(d); });
      }
      wait_for(e);
      GYRE_EXPECT(r, bc == std::vector<float>(4, all_running || r == n - 1 ? 9.0f : 0.0f));
      // Ranks still running step s: those with 2 (r' + 1) > s; the average
      // divides by every rank, the joined ones' zeros included.
      float sum = 0, count = 0;
      for (int q = 0; q < n; ++q) {
        if (2 * (q + 1) > s) {
          sum += static_cast<float>(q + 1);
          count += 1;
        }
      }
      GYRE_EXPECT(r, std::fabs(g[0] - sum / n) < 1e-6f);
      GYRE_EXPECT(r, h[0] == count);
      if (all_running) GYRE_EXPECT(r, c.output().shape[0] == n);
      const auto* ro = reinterpret_cast<const float*>(e.output().data.data());
      GYRE_EXPECT(r, e.output().shape[0] == 1 && ro[0] == count);
    }
    GYRE_EXPECT(r, core::join(rt) == 2);
    // After the join everyone takes part again.
    std::vector<float> z(2, 1.0f);
    wait_for(core::allreduce_async(rt, "after.join", view(z), view(z), ReduceOp::kSum));
    GYRE_EXPECT(r, z[0] == 3.0f);
  });
}

TEST_CASE("local: shutdown fails pending work with StateError on every rank", "[runtime]") {
  LocalJob::run(2, fast_options(), [&](int r, Runtime& rt) {
    std::vector<float> g(4, 1.0f);
    wait_for(core::allreduce_async(rt, "warmup", view(g), view(g)));
    if (r == 0) {
      Handle h = core::allreduce_async(rt, "never.on.rank1", view(g), view(g));
      rt.shutdown();
      auto msg = expect_throw<StateError>(r, [&] { wait_for(h); });
      GYRE_EXPECT(r, contains(msg, "never.on.rank1") && contains(msg, "shut down"));
      expect_throw<StateError>(r, [&] { core::allreduce_async(rt, "late", view(g), view(g)); });
    } else {
      // Rank 0's shutdown stops this rank's runtime too: a later operation
      // fails naming rank 0 instead of waiting forever.
      std::string msg;
      for (int i = 0; msg.empty(); ++i) {
        try {
          wait_for(core::allreduce_async(rt, fmt::format("r1.{}", i), view(g), view(g)));
        } catch (const StateError& e) {
          msg = e.what();
        }
      }
      GYRE_EXPECT(r, contains(msg, "shut down by rank 0"));
    }
  });
}

TEST_CASE("local: the stall inspector fails a tensor one rank never enqueues", "[runtime]") {
  Options opt = fast_options();
  // Long enough that the second tensor, enqueued by both ranks at about the
  // same time, never stalls even on a loaded machine.
  opt.stall_warning_s = 0.2;
  opt.stall_shutdown_s = 1.5;
  std::promise<void> failed;
  auto failed_seen = failed.get_future().share();
  LocalJob::run(2, opt, [&](int r, Runtime& rt) {
    std::vector<float> g(4, 1.0f);
    if (r == 1) {
      auto msg = expect_throw<TimeoutError>(r, [&] {
        wait_for(core::allreduce_async(rt, "only.rank1", view(g), view(g)));
      });
      GYRE_EXPECT(r, contains(msg, "'only.rank1'") && contains(msg, "rank 0 never enqueued"));
      failed.set_value();
    } else {
      // Enqueue the next tensor only once rank 1 saw the failure, so that
      // it does not stall itself.
      GYRE_EXPECT(r, failed_seen.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
    }
    g.assign(4, 1.0f);
    wait_for(core::allreduce_async(rt, "still.works", view(g), view(g), ReduceOp::kSum));
    GYRE_EXPECT(r, g[0] == 2.0f);
  });
}

TEST_CASE("local: a small response cache evicts and stays correct", "[runtime][cache]") {
  Options opt = fast_options();
  opt.cache_capacity = 5;
  LocalJob::run(2, opt, [&](int r, Runtime& rt) {
    for (int iter = 0; iter < 6; ++iter) {
      std::vector<std::vector<float>> bufs(12);
      std::vector<Handle> hs;
      for (int t = 0; t < 12; ++t) {
        bufs[t].assign(static_cast<std::size_t>(t + 1), static_cast<float>(r + t));
        hs.push_back(core::allreduce_async(rt, fmt::format("c.{}", t), view(bufs[t]),
                                           view(bufs[t]), ReduceOp::kSum));
      }
      for (int t = 0; t < 12; ++t) {
        wait_for(hs[t]);
        GYRE_EXPECT(r, bufs[t][0] == static_cast<float>(2 * t + 1));
      }
    }
  });
}

TEST_CASE("local: timeline is Chrome trace JSON with the phases", "[runtime][timeline]") {
  Options opt = fast_options();
  // The pid keeps concurrent runs of this binary apart.
  const std::string stem = fmt::format("gyre_core_timeline_{}", ::getpid());
  opt.timeline_path = stem + "_{rank}.json";
  LocalJob::run(2, opt, [&](int r, Runtime& rt) {
    std::vector<float> a(100, 1.0f), b(100, 1.0f);
    Handle x = core::allreduce_async(rt, "tl.a", view(a), view(a));
    Handle y = core::allreduce_async(rt, "tl.b", view(b), view(b));
    wait_for(x);
    wait_for(y);
  });
  for (int r = 0; r < 2; ++r) {
    std::string path = fmt::format("{}_{}.json", stem, r);
    std::string cmd = fmt::format(
        "python3 -c \"import json,sys; ev=json.load(open(sys.argv[1]))['traceEvents']; "
        "names={{e['name'] for e in ev}}; "
        "sys.exit(0 if {{'QUEUE','NEGOTIATE','ALLREDUCE'}} <= names else 1)\" {}", path);
    INFO(path);
    CHECK(std::system(cmd.c_str()) == 0);
    std::remove(path.c_str());
  }
}

TEST_CASE("local: large tensors bypass the fusion buffer, small ones share it", "[runtime][fusion]") {
  for (std::size_t max_tensor : {std::size_t{1} << 20, std::size_t{0}}) {
    Options opt = fast_options();
    opt.fusion_max_tensor_bytes = max_tensor;
    std::vector<int> allocations(2, -1);
    LocalJob::run(2, opt, [&](int r, Runtime& rt) {
      // Two 2 MiB tensors, grouped so that they are ready in the same round.
      std::vector<float> a(512 << 10, 1.0f), b(512 << 10, 2.0f);
      wait_for(core::grouped_allreduce_async(rt, {"big.a", "big.b"}, {view(a), view(b)},
                                             {view(a), view(b)}, ReduceOp::kSum));
      GYRE_EXPECT(r, a.back() == 2.0f && b.front() == 4.0f);
      allocations[static_cast<std::size_t>(r)] = rt.fusion_allocations();
    });
    INFO("fusion_max_tensor_bytes " << max_tensor);
    CHECK(allocations[0] == (max_tensor ? 0 : 1));
    CHECK(allocations[1] == allocations[0]);
  }
}

TEST_CASE("local: a throwing on_complete callback does not stop the runtime", "[runtime]") {
  LocalJob::run(2, fast_options(), [&](int r, Runtime& rt) {
    std::vector<float> a(3, 1.0f);
    Handle h = core::allreduce_async(rt, "cb", view(a), view(a), ReduceOp::kSum);
    std::promise<bool> called;
    auto fut = called.get_future();
    h.on_complete([&called](std::exception_ptr e) {
      called.set_value(e == nullptr);
      throw std::runtime_error("callback failure");
    });
    GYRE_EXPECT(r, fut.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
    GYRE_EXPECT(r, fut.get());
    wait_for(core::allreduce_async(rt, "after.cb", view(a), view(a), ReduceOp::kSum));
    GYRE_EXPECT(r, a[0] == 4.0f);
  });
}

TEST_CASE("local: options that differ between ranks fail start-up on every rank, named",
          "[runtime]") {
  const int n = 3;
  auto world = transport::make_local_world(n);
  std::vector<std::string> messages(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      Options o = fast_options();
      if (r == 1) o.fusion_threshold_bytes = 1 << 20;
      if (r == 2) o.allreduce_small_bytes = 0;
      core::RuntimeInfo info;
      info.abort = [](int) {};
      try {
        Runtime rt(o, std::make_unique<transport::LocalTransport>(world, r), info);
        messages[r] = "started";
      } catch (const InvalidArgument& e) {
        messages[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << messages[r]);
    CHECK(messages[r].find("GYRE_FUSION_THRESHOLD (rank 0: 67108864, rank 1: 1048576, rank 2: "
                           "67108864)") != std::string::npos);
    CHECK(messages[r].find("GYRE_ALLREDUCE_SMALL_BYTES (rank 0: 65536, rank 1: 65536, rank 2: 0)") !=
          std::string::npos);
    CHECK(messages[r].find("GYRE_RING_CHUNK_BYTES") == std::string::npos);  // agrees
  }
}
