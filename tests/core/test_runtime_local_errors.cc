// The runtime's answers to a rank's own mistakes, with ranks as threads of
// this process over LocalTransport: refused calls, reused names.
#include <catch2/catch.hpp>

#include <array>
#include <atomic>
#include <future>
#include <thread>

#include "local_job.h"

using namespace gyre;
using namespace gyre::test;
using core::Runtime;

TEST_CASE("local: a refused call of a pending name leaves the pending operation valid",
          "[runtime][errors]") {
  std::promise<void> refused;
  auto refused_seen = refused.get_future().share();
  LocalJob::run(2, fast_options(), [&](int r, Runtime& rt) {
    std::vector<float> c(4, 1.0f);
    Handle h;
    if (r == 0) {
      h = core::allreduce_async(rt, "x", view(c), view(c), ReduceOp::kSum);
      // The same name again, with a bad buffer: refused as a duplicate,
      // not announced, so it cannot fail or replace the pending "x".
      TensorView null_view{nullptr, DataType::kFloat32, {4}};
      auto msg = expect_throw<InvalidArgument>(r, [&] {
        core::allreduce_async(rt, "x", null_view, null_view, ReduceOp::kSum);
      });
      GYRE_EXPECT(r, contains(msg, "'x'") && contains(msg, "already pending"));
      refused.set_value();
    } else {
      GYRE_EXPECT(r, refused_seen.wait_for(std::chrono::seconds(30)) ==
                         std::future_status::ready);
      h = core::allreduce_async(rt, "x", view(c), view(c), ReduceOp::kSum);
    }
    wait_for(h, 20.0);
    GYRE_EXPECT(r, c == std::vector<float>(4, 2.0f));
  });
}

TEST_CASE("local: a completed name stays reserved until its handle is waited or another "
          "operation is enqueued", "[runtime][errors]") {
  // Outside the ranks: on a failure the calls not refused are in flight
  // until the job stops.
  std::vector<std::vector<float>> cs(3, std::vector<float>(4, 1.0f)), ds = cs;
  LocalJob::run(3, fast_options(), [&](int r, Runtime& rt) {
    auto& c = cs[static_cast<std::size_t>(r)];
    auto& d = ds[static_cast<std::size_t>(r)];
    auto done = std::make_shared<std::promise<void>>();
    auto completed = done->get_future();
    {
      // Dropped without a wait: the call a script makes and forgets.
      Handle h = core::allreduce_async(rt, "x", view(c), view(c), ReduceOp::kSum);
      h.on_complete([done](std::exception_ptr) { done->set_value(); });
    }
    GYRE_EXPECT(r, completed.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
    GYRE_EXPECT(r, c == std::vector<float>(4, 3.0f));
    // Completed, but nothing waited and nothing enqueued since: the second
    // call is refused as if the first were still pending (however fast the
    // first completed), on this rank alone.
    auto msg = expect_throw<InvalidArgument>(r, [&] {
      core::allreduce_async(rt, "x", view(d), view(d), ReduceOp::kSum);
    });
    GYRE_EXPECT(r, contains(msg, "'x'") && contains(msg, "already pending"));
    // Another operation releases it; the refused call consumed no number.
    wait_for(core::allreduce_async(rt, "y", view(d), view(d), ReduceOp::kSum));
    Handle again = core::allreduce_async(rt, "x", view(d), view(d), ReduceOp::kSum);
    // Waited: reusable at once.
    wait_for(again);
    wait_for(core::allreduce_async(rt, "x", view(d), view(d), ReduceOp::kSum));
    GYRE_EXPECT(r, d == std::vector<float>(4, 27.0f));
  });
}

TEST_CASE("local: a rank one iteration behind on a reused name is a MismatchError everywhere",
          "[runtime][errors][sequence]") {
  Options opt = fast_options();
  // Iteration 2 of "g" stalls (rank 1 is late) and fails on ranks 0 and 2;
  // both enqueue iteration 3 while rank 1 at last enqueues its iteration 2.
  opt.stall_warning_s = 0.2;
  opt.stall_shutdown_s = 1.0;
  std::promise<void> stalled[2];
  std::shared_future<void> stall_seen[2] = {stalled[0].get_future().share(),
                                            stalled[1].get_future().share()};
  LocalJob::run(3, opt, [&](int r, Runtime& rt) {
    std::vector<float> g(4, 1.0f);
    auto step = [&] {
      return core::allreduce_async(rt, "g", view(g), view(g), ReduceOp::kSum);
    };
    g.assign(4, 1.0f);
    wait_for(step());  // iteration 1 on every rank; "g" is cached now
    GYRE_EXPECT(r, g[0] == 3.0f);
    if (r != 1) {
      auto msg = expect_throw<TimeoutError>(r, [&] { wait_for(step()); });
      GYRE_EXPECT(r, contains(msg, "'g'") && contains(msg, "rank 1 never enqueued"));
      stalled[r == 0 ? 0 : 1].set_value();
    } else {
      for (auto& f : stall_seen) {
        GYRE_EXPECT(r, f.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
      }
    }
    // No commit_step() anywhere: only the sequence numbers can tell.
    auto msg = expect_throw<MismatchError>(r, [&] { wait_for(step()); });
    GYRE_EXPECT(r, contains(msg, "'g'") && contains(msg, "iteration") &&
                       contains(msg, "rank 1 has 2") && contains(msg, "ranks 0, 2 have 3"));
    // A resync, the documented repair, makes the ranks count afresh.
    core::resync(rt, {{"g", view(g)}}, ResyncPolicy::kNewest);
    g.assign(4, 1.0f);
    wait_for(step());
    GYRE_EXPECT(r, g[0] == 3.0f);
  });
}

TEST_CASE("local: a joined rank keeps count of a reused name", "[runtime][join][sequence]") {
  LocalJob::run(3, fast_options(), [&](int r, Runtime& rt) {
    // Rank r runs r + 1 steps of "w", then joins; the joined ranks take part
    // in the others' steps, which count for them as well.
    for (int s = 0; s <= r; ++s) {
      std::vector<float> w(3, 1.0f);
      wait_for(core::allreduce_async(rt, "w", view(w), view(w), ReduceOp::kSum));
      GYRE_EXPECT(r, w[0] == static_cast<float>(3 - s));
    }
    GYRE_EXPECT(r, core::join(rt) == 2);
    // The next epoch reuses the name on every rank: the same iteration.
    std::vector<float> w(3, 1.0f);
    wait_for(core::allreduce_async(rt, "w", view(w), view(w), ReduceOp::kSum));
    GYRE_EXPECT(r, w[0] == 3.0f);
  });
}

TEST_CASE("local: a rank-local failure inside a collective ends the job with its cause",
          "[runtime][errors]") {
  // Rank 0's allreduce has an input and output that partly overlap. The
  // API refuses that at enqueue (and announces it); here the entry is put
  // in the queue directly, as if a rank-local condition had escaped the
  // enqueue checks: the algorithm refuses it on rank 0 alone, after every
  // rank agreed to run it. Rank 0 must not go on (its peer waits in the
  // collective): it ends the job naming the cause (its handle carries it),
  // and rank 1 reaches its deadline instead of reading rank 0's next
  // messages as data.
  auto world = transport::make_local_world(2);
  std::atomic<int> aborts{0};
  std::array<std::string, 2> errors;
  Options opt = fast_options();
  opt.op_timeout_s = 2;
  opt.fusion_threshold_bytes = 0;  // reduced from the caller's buffers
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      core::RuntimeInfo info;
      info.abort = [&](int) { aborts.fetch_add(1); };  // returns: the runtime fails its handles
      Runtime rt(opt, std::make_unique<transport::LocalTransport>(world, r), info);
      // Past the first round, whose transfers get the start-up deadline
      // (at least 60 s) rather than op_timeout_s.
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (rt.rounds() < 2 && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      std::vector<float> buf(8, 1.0f);
      Handle h;
      if (r == 0) {
        core::LocalEntry e;
        e.request.name = "x";
        e.request.collective = core::Collective::kAllreduce;
        e.request.shape = {4};
        e.in = TensorView{buf.data(), DataType::kFloat32, {4}};
        e.out = TensorView{buf.data() + 2, DataType::kFloat32, {4}};
        e.state = std::make_shared<core::OpState>();
        h = Handle(e.state);
        std::vector<core::LocalEntry> v;
        v.push_back(std::move(e));
        rt.queue().push(std::move(v));
      } else {
        buf.resize(4);
        h = core::allreduce_async(rt, "x", view(buf), view(buf), ReduceOp::kSum);
      }
      try {
        wait_for(h, 30.0);
      } catch (const std::exception& ex) {
        errors[static_cast<std::size_t>(r)] = ex.what();
      }
      rt.shutdown();
    });
  }
  for (auto& t : threads) t.join();
  INFO("rank 0: " << errors[0] << "\nrank 1: " << errors[1]);
  CHECK(contains(errors[0], "input and output overlap"));  // the cause, on the rank that failed
  CHECK(contains(errors[1], "from rank 0"));  // its peer: the deadline, not a result
  CHECK(aborts.load() == 2);                  // both ended the job
}
