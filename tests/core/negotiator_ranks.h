// Ranks as threads for the Negotiator's unit tests (test_negotiation.cc,
// test_negotiation_log_depth.cc): a LocalTransport world of n ranks, each
// with its own VersionVector and Negotiator.
#pragma once

#include <exception>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "gyre/collectives/local_transport.h"
#include "negotiation/negotiator.h"

namespace gyre::core::test {

// Runs fn(rank, negotiator) or fn(rank, negotiator, version vector) on n
// rank threads; rethrows the first failure (a failing rank fails the world,
// so the others stop waiting for it).
template <typename F>
void on_ranks(int n, const NegotiatorOptions& opt, F&& fn) {
  auto world = transport::make_local_world(n);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        transport::LocalTransport t(world, r);
        t.set_timeout(std::chrono::seconds(30));
        VersionVector vv(r, n);
        Negotiator neg(t, opt, vv);
        if constexpr (std::is_invocable_v<F, int, Negotiator&, VersionVector&>) fn(r, neg, vv);
        else fn(r, neg);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
        transport::fail_local_world(*world, r);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

inline void expect(bool ok, int rank, const std::string& what) {
  if (!ok) throw std::runtime_error(fmt::format("rank {}: expected {}", rank, what));
}

}  // namespace gyre::core::test
