// Rounds run by a waiting caller (GYRE_CALLER_ROUNDS, core/src/runtime/
// rounds.cc) under mpirun with 2-4 ranks: a caller that waits at once for
// what it enqueued runs the rounds itself (counted by runtime_stats()), and
// with the option off never does; several threads enqueueing and waiting at
// once, beside asynchronous operations completed by the background thread,
// all get the right sums; a caller waiting for an operation the other
// ranks never enqueue gets the shutdown's error, not a hang.
// Handle::wait_for returns false at its timeout and true once done.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "gyre/gyre.h"
#include "gyre/view.h"
#include "mpi_session.h"

using namespace gyre;
using test::Session;
using test::test_options;

namespace {

// `count` allreduces of 2 floats, each waited for at once; returns the
// elements that were wrong.
int allreduce_and_wait(const std::string& prefix, int count) {
  const int n = size(), r = rank();
  int wrong = 0;
  for (int i = 0; i < count; ++i) {
    std::vector<float> g = {static_cast<float>(r + i), 1.0f};
    allreduce_async(fmt::format("{}.{}", prefix, i), view(g), view(g), ReduceOp::kSum).wait();
    const float want = static_cast<float>(n * i + n * (n - 1) / 2);
    wrong += (g[0] != want) + (g[1] != static_cast<float>(n));
  }
  return wrong;
}

}  // namespace

TEST_CASE("caller rounds: a caller waiting at once runs the rounds itself", "[mpi]") {
  const bool on = GENERATE(true, false);
  INFO(fmt::format("GYRE_CALLER_ROUNDS={}", on ? 1 : 0));
  Options o = test_options();
  o.caller_rounds = on ? 1 : 0;
  Session s(o);
  const std::uint64_t before = runtime_stats().caller_rounds;
  CHECK(allreduce_and_wait("lone", 300) == 0);
  const RuntimeStats st = runtime_stats();
  INFO(fmt::format("rounds {}, by waiting callers {}", st.rounds, st.caller_rounds - before));
  if (on) {
    // Each caller may lose the race for a round to the background thread
    // (it then waits as before): most do not, but a loaded machine decides.
    CHECK(st.caller_rounds > before);
    CHECK(st.caller_rounds <= st.rounds);
  } else {
    CHECK(st.caller_rounds == 0);
  }
}

TEST_CASE("caller rounds: threads waiting at once beside asynchronous operations", "[mpi]") {
  Session s;
  const int n = size(), r = rank();
  constexpr int kThreads = 4, kEach = 60;
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] { wrong += allreduce_and_wait(fmt::format("thread{}", t), kEach); });
  }
  // Meanwhile this thread's operations are never waited for: polled until
  // done, so the background thread (or a waiting caller's round) runs them.
  std::vector<std::vector<float>> bufs(kEach, std::vector<float>(1000));
  std::vector<Handle> handles;
  for (int i = 0; i < kEach; ++i) {
    for (auto& x : bufs[i]) x = static_cast<float>(r + i);
    handles.push_back(allreduce_async(fmt::format("async.{}", i), view(bufs[i]), view(bufs[i]),
                                      ReduceOp::kSum));
  }
  for (auto& h : handles) {
    while (!h.poll()) std::this_thread::yield();
  }
  for (auto& th : threads) th.join();
  CHECK(wrong.load() == 0);
  for (int i = 0; i < kEach; ++i) {
    const float want = static_cast<float>(n * i + n * (n - 1) / 2);
    int bad = 0;
    for (float x : bufs[i]) bad += x != want;
    INFO(fmt::format("async.{}", i));
    CHECK(bad == 0);
  }
}

TEST_CASE("caller rounds: a waiting caller gets the shutdown's error", "[mpi]") {
  Session s;
  std::vector<float> g(4, 1.0f);
  allreduce_async("warm", view(g), view(g)).wait();
  barrier();
  if (rank() == size() - 1) {
    // Never enqueued elsewhere: this wait runs rounds until a shutdown
    // (rank 0's, the others' at the end of the test case) reaches them.
    Handle h = allreduce_async("only.last", view(g), view(g));
    CHECK_THROWS_WITH(h.wait(), Catch::Contains("gyre was shut down by rank"));
  } else if (rank() == 0) {
    shutdown();
  }
}

TEST_CASE("caller rounds: wait_for returns at its timeout, then once the operation completes",
          "[mpi]") {
  using namespace std::chrono_literals;
  Session s;
  const int n = size(), r = rank();
  std::vector<float> g(3, static_cast<float>(r + 1));
  const bool last = r == n - 1;
  Handle h;
  if (last) {
    // The other ranks enqueue it only after the barrier below, which needs
    // this rank: it cannot complete within the timeout.
    h = allreduce_async("late", view(g), view(g), ReduceOp::kSum);
    CHECK_FALSE(h.wait_for(20ms));
    CHECK_FALSE(h.poll());
  }
  barrier();
  if (!last) h = allreduce_async("late", view(g), view(g), ReduceOp::kSum);
  CHECK(h.wait_for(60s));
  CHECK(h.wait_for(0ms));  // done: true at once
  h.wait();
  const float want = static_cast<float>(n * (n + 1) / 2);
  CHECK(g == std::vector<float>(3, want));
}
