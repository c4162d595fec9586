// Rounds run by waiting callers (GYRE_CALLER_ROUNDS, runtime/rounds.cc) with
// ranks as threads, so that ThreadSanitizer sees every thread (the CI's
// TSan stage runs this program): on each rank several user threads
// enqueue and wait at once while the background thread runs the rounds of
// asynchronous operations nobody waits for; every sum is right, and
// waiting callers did run rounds.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "local_job.h"

using namespace gyre;
using gyre::test::fast_options;
using gyre::test::LocalJob;

TEST_CASE("local: callers waiting at once run rounds beside the background thread",
          "[runtime][caller-rounds]") {
  constexpr int kRanks = 3, kThreads = 3, kEach = 40;
  LocalJob::run(kRanks, fast_options(), [&](int r, core::Runtime& rt) {
    std::atomic<int> wrong{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < kEach; ++i) {
          std::vector<float> g = {static_cast<float>(r + i), 1.0f};
          TensorView v{g.data(), DataType::kFloat32, {2}};
          core::allreduce_async(rt, fmt::format("t{}.{}", t, i), v, v, ReduceOp::kSum).wait();
          wrong += g[0] != static_cast<float>(kRanks * i + kRanks * (kRanks - 1) / 2);
          wrong += g[1] != static_cast<float>(kRanks);
        }
      });
    }
    std::vector<std::vector<float>> bufs(kEach, std::vector<float>(300));
    std::vector<Handle> handles;
    for (int i = 0; i < kEach; ++i) {
      for (auto& x : bufs[i]) x = static_cast<float>(r * i);
      TensorView v{bufs[i].data(), DataType::kFloat32, {300}};
      handles.push_back(core::allreduce_async(rt, fmt::format("async.{}", i), v, v,
                                              ReduceOp::kSum));
    }
    for (auto& h : handles) {
      while (!h.poll()) std::this_thread::yield();
    }
    for (auto& th : threads) th.join();
    GYRE_EXPECT(r, wrong.load() == 0);
    for (int i = 0; i < kEach; ++i) {
      const float want = static_cast<float>(i * kRanks * (kRanks - 1) / 2);
      for (float x : bufs[i]) GYRE_EXPECT(r, x == want);
    }
    GYRE_EXPECT(r, rt.caller_rounds() > 0);
    GYRE_EXPECT(r, rt.caller_rounds() <= rt.rounds());
  });
}

namespace {

// kEach allreduces waited for (a caller that may run the round) and
// kEach polled (the background thread must run theirs, passing the
// grace each time it wakes for one); every sum checked.
void waited_and_polled(int r, core::Runtime& rt, int ranks, const char* prefix) {
  constexpr int kEach = 30;
  for (int i = 0; i < kEach; ++i) {
    for (bool polled : {false, true}) {
      std::vector<float> g = {static_cast<float>(r + i)};
      TensorView v{g.data(), DataType::kFloat32, {1}};
      Handle h = core::allreduce_async(rt, fmt::format("{}.{}.{}", prefix, polled, i), v, v,
                                       ReduceOp::kSum);
      if (polled) {
        while (!h.poll()) std::this_thread::yield();
      } else {
        h.wait();
      }
      GYRE_EXPECT(r, g[0] == static_cast<float>(ranks * i + ranks * (ranks - 1) / 2));
    }
  }
}

}  // namespace

TEST_CASE("local: a rank that has used a CUDA tensor leaves every round to the background thread",
          "[runtime][caller-rounds]") {
  // A rank's CUDA tensors bind it to one device whose streams are the
  // background thread's, so its callers never run a round; the background
  // thread must then not hold back from rounds for them either (the grace
  // would delay every round for nothing). The device is only claimed
  // here, no CUDA call is made, so this runs without a GPU.
  constexpr int kRanks = 2;
  LocalJob::run(kRanks, fast_options(), [&](int r, core::Runtime& rt) {
    GYRE_EXPECT(r, rt.claim_cuda_device(0) == 0);
    waited_and_polled(r, rt, kRanks, "cuda-rank");
    GYRE_EXPECT(r, rt.rounds() > 0);
    GYRE_EXPECT(r, rt.caller_rounds() == 0);
    GYRE_EXPECT(r, rt.caller_graces() == 0);
  });
}

TEST_CASE("local: without CUDA the background thread leaves callers their grace",
          "[runtime][caller-rounds]") {
  // The counterpart of the case above: the same calls on ranks that use no
  // CUDA tensor; the background thread, woken for the polled ones, gives
  // the grace before their rounds.
  constexpr int kRanks = 2;
  LocalJob::run(kRanks, fast_options(), [&](int r, core::Runtime& rt) {
    waited_and_polled(r, rt, kRanks, "host-rank");
    GYRE_EXPECT(r, rt.caller_graces() > 0);
  });
}

TEST_CASE("local: operations started under WaitFollows do not wake the background thread",
          "[runtime][caller-rounds]") {
  // Each rank's caller starts its allreduce under a gyre::WaitFollows and
  // waits at once: its push does not wake the background thread, and the
  // wait runs the round (or wakes the loop if it cannot). Without the
  // promise every push wakes it. Both complete with the right sums.
  constexpr int kRanks = 2, kCalls = 100;
  LocalJob::run(kRanks, fast_options(), [&](int r, core::Runtime& rt) {
    auto blocking_calls = [&](const char* prefix, bool promise) {
      const std::uint64_t before = rt.queue().push_wakes();
      for (int i = 0; i < kCalls; ++i) {
        std::vector<float> g = {static_cast<float>(r + i)};
        TensorView v{g.data(), DataType::kFloat32, {1}};
        Handle h;
        if (promise) {
          WaitFollows wait_follows;
          h = core::allreduce_async(rt, fmt::format("{}.{}", prefix, i), v, v, ReduceOp::kSum);
        } else {
          h = core::allreduce_async(rt, fmt::format("{}.{}", prefix, i), v, v, ReduceOp::kSum);
        }
        h.wait();
        GYRE_EXPECT(r, g[0] == static_cast<float>(kRanks * i + kRanks * (kRanks - 1) / 2));
      }
      return rt.queue().push_wakes() - before;
    };
    GYRE_EXPECT(r, blocking_calls("promised", true) == 0);
    GYRE_EXPECT(r, blocking_calls("woken", false) == kCalls);
    GYRE_EXPECT(r, rt.caller_rounds() > 0);
  });
}

TEST_CASE("local: an operation started under WaitFollows and never waited for still completes",
          "[runtime][caller-rounds]") {
  // The promise broken: nobody waits (poll() runs no round), so nothing
  // wakes the background thread for it; its timed round takes it.
  constexpr int kRanks = 3;
  LocalJob::run(kRanks, fast_options(), [&](int r, core::Runtime& rt) {
    for (int i = 0; i < 5; ++i) {
      std::vector<float> g = {static_cast<float>(r + i)};
      TensorView v{g.data(), DataType::kFloat32, {1}};
      Handle h;
      {
        WaitFollows wait_follows;
        h = core::allreduce_async(rt, fmt::format("unwaited.{}", i), v, v, ReduceOp::kSum);
      }
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (!h.poll() && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      GYRE_EXPECT(r, h.poll());
      GYRE_EXPECT(r, g[0] == static_cast<float>(kRanks * i + kRanks * (kRanks - 1) / 2));
    }
  });
}

TEST_CASE("local: while waiting callers drive the rounds the background thread runs none of "
          "its own", "[runtime][caller-rounds]") {
  // Blocking calls with some work between them, each gap shorter than the
  // loop's cycle, for many cycles. The callers run every round; the
  // background thread, waking each cycle (0.5 ms here) to find the rounds
  // run and nothing left to it, sleeps on instead of running a round that
  // every rank would have to answer (before: a round of its own at about
  // every other wake-up, which a caller arriving meanwhile then had to hand
  // its operation over to). Afterwards an operation that nobody waits for
  // is still taken by the background thread's own round.
  constexpr int kRanks = 2;
  LocalJob::run(kRanks, fast_options(), [&](int r, core::Runtime& rt) {
    using Clock = std::chrono::steady_clock;
    const std::uint64_t rounds0 = rt.rounds(), callers0 = rt.caller_rounds();
    const std::uint64_t left0 = rt.rounds_left_to_callers();
    // 400 calls, the same on every rank, over at least 80 cycles (the gaps
    // alone take 40 ms): a background thread that ran a round at each
    // wake-up would run dozens.
    constexpr int kCalls = 400;
    int calls = 0;
    while (calls < kCalls) {
      std::vector<float> g = {static_cast<float>(r + calls)};
      TensorView v{g.data(), DataType::kFloat32, {1}};
      {
        WaitFollows wait_follows;
        core::allreduce_async(rt, "driven", v, v, ReduceOp::kSum).wait();
      }
      GYRE_EXPECT(r, g[0] == static_cast<float>(kRanks * calls + kRanks * (kRanks - 1) / 2));
      ++calls;
      // The gap: work of about 100 us (not a wait for any result).
      const auto until = Clock::now() + std::chrono::microseconds(100);
      while (Clock::now() < until) {
      }
    }
    const std::uint64_t own = (rt.rounds() - rounds0) - (rt.caller_rounds() - callers0);
    const std::string counts = fmt::format(
        "{} calls, {} rounds, {} of them the background thread's, {} wake-ups left to the "
        "callers", calls, rt.rounds() - rounds0, own, rt.rounds_left_to_callers() - left0);
    // A caller descheduled for a whole cycle lets one through; far fewer
    // than one per cycle.
    gyre::test::expect(own * 10 <= static_cast<std::uint64_t>(calls), r,
                       "at most a tenth of the rounds the background thread's: " + counts);
    gyre::test::expect(rt.rounds_left_to_callers() > left0, r,
                       "wake-ups that left the rounds to the callers: " + counts);
    // An operation nobody waits for: the background thread takes it.
    std::vector<float> g = {static_cast<float>(r)};
    TensorView v{g.data(), DataType::kFloat32, {1}};
    Handle h = core::allreduce_async(rt, "unwaited", v, v, ReduceOp::kSum);
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    while (!h.poll() && Clock::now() < deadline) std::this_thread::yield();
    GYRE_EXPECT(r, h.poll());
    GYRE_EXPECT(r, g[0] == 1.0f);
  });
}
