// Ranks as threads for the Negotiator's unit tests (test_negotiation.cc,
// test_negotiation_log_depth.cc): a LocalTransport world of n ranks, each
// with its own VersionVector and Negotiator.
#pragma once

#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "gyre/collectives/local_transport.h"
#include "gyre/collectives/shm.h"
#include "negotiation/negotiator.h"
#include "transport_ranks.h"

namespace gyre::core::test {

// Runs fn(rank, negotiator) or fn(rank, negotiator, version vector) on n
// rank threads (on_transport_ranks).
template <typename F>
void on_ranks(int n, const NegotiatorOptions& opt, F&& fn) {
  on_transport_ranks(n, [&](int r, transport::LocalTransport& t) {
    VersionVector vv(r, n);
    Negotiator neg(t, opt, vv);
    if constexpr (std::is_invocable_v<F, int, Negotiator&, VersionVector&>) fn(r, neg, vv);
    else fn(r, neg);
  });
}

// The same over hosts x per_host ranks (host-major) whose negotiators run
// log-depth rounds in two tiers: each host's ranks share a group over a
// region of their own, each local rank's ranks across the hosts a
// LocalTransport world. fn(rank, local rank, negotiator).
template <typename F>
void on_host_ranks(int hosts, int per_host, const NegotiatorOptions& opt, F&& fn) {
  const int n = hosts * per_host;
  auto world = transport::make_local_world(n);
  std::vector<std::shared_ptr<transport::LocalWorld>> cross;
  for (int l = 0; l < per_host; ++l) cross.push_back(transport::make_local_world(hosts));
  collectives::ShmOptions so;
  so.slot_bytes = 4096;
  so.timeout = std::chrono::seconds(30);
  const std::size_t region_bytes = collectives::ShmGroup::region_bytes(per_host, so.slot_bytes);
  std::vector<std::unique_ptr<std::byte, void (*)(void*)>> regions;
  for (int h = 0; h < hosts; ++h) {
    auto* p = static_cast<std::byte*>(std::aligned_alloc(64, (region_bytes + 63) / 64 * 64));
    std::memset(p, 0, region_bytes);
    regions.emplace_back(p, std::free);
  }
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      const int h = r / per_host, l = r % per_host;
      try {
        transport::LocalTransport t(world, r);
        t.set_timeout(std::chrono::seconds(30));
        transport::LocalTransport c(cross[static_cast<std::size_t>(l)], h);
        c.set_timeout(std::chrono::seconds(30));
        collectives::ShmGroup g(regions[static_cast<std::size_t>(h)].get(), l, per_host, so);
        VersionVector vv(r, n);
        Negotiator neg(t, opt, vv);
        neg.set_host_tier(g, c);
        fn(r, l, neg);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
        transport::fail_local_world(*world, r);
        for (auto& w : cross) transport::fail_local_world(*w, h);
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
