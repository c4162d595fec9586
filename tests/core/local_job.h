// LocalJob: n gyre runtimes in one process, one per rank thread, over a
// LocalTransport world. Catch2 assertions are not thread-safe, so rank
// functions report failures by throwing (expect(), expect_throw()); run()
// rethrows the root-cause exception on the test's thread. A rank that fails
// shuts its runtime down, which stops every rank's runtime in the same
// round and fails their pending waits: nothing hangs. (A rank function
// that throws has already unwound its buffers when its runtime stops, so a
// failing test may report follow-on errors; the first failure is the one
// to read. Tests must therefore not race their own expectations.)
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "gyre/collectives/local_transport.h"
#include "gyre/gyre.h"
#include "api/operations.h"
#include "runtime/runtime.h"
#include "transport_ranks.h"

namespace gyre::test {

struct LocalJob {
  // Fills in a rank's RuntimeInfo before its runtime is built (e.g. a
  // shared-memory group over a region the test owns).
  using Setup = std::function<void(int rank, core::RuntimeInfo& info)>;

  static void run(int n, const Options& opt,
                  const std::function<void(int rank, core::Runtime& rt)>& fn,
                  const Setup& setup = {}) {
    auto world = transport::make_local_world(n);
    const auto errors = core::test::run_rank_threads(n, [&](int r) {
      core::RuntimeInfo info;
      info.abort = [](int) {};  // in-process: the runtime fails its handles instead
      if (setup) setup(r, info);
      core::Runtime rt(opt, std::make_unique<transport::LocalTransport>(world, r), info);
      fn(r, rt);
      rt.shutdown();
    });
    // The root cause: a rank's own failure rather than the StateError the
    // others see when its runtime stops.
    std::exception_ptr first;
    for (auto& e : errors) {
      if (!e) continue;
      try {
        std::rethrow_exception(e);
      } catch (const StateError&) {
        if (!first) first = e;
      } catch (...) {
        std::rethrow_exception(e);
      }
    }
    if (first) std::rethrow_exception(first);
  }
};

// Options for in-process runs: short rounds, and a deadline that a failing
// test reaches in bounded time instead of hanging.
inline Options fast_options() {
  Options o;
  o.cycle_time_ms = 0.5;
  o.op_timeout_s = 60;
  return o;
}

inline void expect(bool ok, int rank, const std::string& what) {
  if (!ok) throw std::runtime_error(fmt::format("rank {}: expected {}", rank, what));
}
#define GYRE_EXPECT(rank, cond) ::gyre::test::expect((cond), (rank), #cond)

// Waits for h with a deadline; rethrows the operation's error.
inline void wait_for(const Handle& h, double seconds = 60.0) {
  auto done = std::make_shared<std::promise<void>>();
  auto fut = done->get_future();
  h.on_complete([done](std::exception_ptr) { done->set_value(); });
  if (fut.wait_for(std::chrono::duration<double>(seconds)) != std::future_status::ready) {
    throw std::runtime_error(fmt::format("operation did not complete within {} s", seconds));
  }
  h.wait();
}

// Runs fn, expects an exception of type E; returns its message.
template <typename E, typename F>
std::string expect_throw(int rank, F&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    throw std::runtime_error(
        fmt::format("rank {}: expected another exception type, got: {}", rank, e.what()));
  }
  throw std::runtime_error(fmt::format("rank {}: expected an exception, none thrown", rank));
}

inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

inline TensorView view(std::vector<float>& v) {
  TensorView t;
  t.data = v.data();
  t.dtype = DataType::kFloat32;
  t.shape = {static_cast<std::int64_t>(v.size())};
  return t;
}

}  // namespace gyre::test
