// Ranks as threads over one LocalTransport world, for unit tests of parts
// that talk over a Transport (the negotiator: negotiator_ranks.h; the
// autotuner: test_autotune.cc).
#pragma once

#include <chrono>
#include <exception>
#include <thread>
#include <vector>

#include "gyre/collectives/local_transport.h"

namespace gyre::core::test {

// Runs body(rank) on n threads and joins them: each rank's exception, or
// null (local_job.h's LocalJob runs its runtimes so too).
template <typename F>
std::vector<std::exception_ptr> run_rank_threads(int n, F&& body) {
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// Runs fn(rank, transport) on n rank threads, each transport with a 30 s
// deadline; rethrows the first failure (a failing rank fails the world, so
// the others stop waiting for it).
template <typename F>
void on_transport_ranks(int n, F&& fn) {
  auto world = transport::make_local_world(n);
  const auto errors = run_rank_threads(n, [&](int r) {
    try {
      transport::LocalTransport t(world, r);
      t.set_timeout(std::chrono::seconds(30));
      fn(r, t);
    } catch (...) {
      transport::fail_local_world(*world, r);
      throw;
    }
  });
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace gyre::core::test
