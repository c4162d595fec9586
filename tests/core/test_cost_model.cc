// The cost model that picks flat or hierarchical under
// GYRE_HIERARCHICAL_ALLREDUCE/_ALLGATHER=-1 and ring or Rabenseifner under
// GYRE_RABENSEIFNER_ALLREDUCE=-1 (backends/hierarchical/cost_model.h):
// its formulas at hand-computed points, and the choices it makes.
#include <catch2/catch.hpp>

#include <algorithm>

#include "backends/hierarchical/cost_model.h"
#include "backends/hierarchical/link_probe.h"

using namespace gyre::core;

namespace {

LayoutCost layout(int hosts, int per_host, double net_gbs, double shm_gbs) {
  LayoutCost c;
  c.hosts = hosts;
  c.per_host = per_host;
  c.net = {10e-6, 1.0 / (net_gbs * 1e9)};
  c.shm = {1e-6, 1.0 / (shm_gbs * 1e9)};
  c.small_bytes = 64 << 10;
  return c;
}

}  // namespace

TEST_CASE("cost model: the formulas at hand-computed points", "[cost_model]") {
  const LayoutCost c = layout(2, 2, 1.0, 10.0);  // 1 ns/B network, 0.1 ns/B shm
  // Ring over 4 ranks, 1 MB: 6 steps of (10 us + 250 KB * 1 ns).
  CHECK(flat_allreduce_s(c, 1e6) == Approx(6 * (10e-6 + 250e3 * 1e-9)));
  // Recursive doubling over 4 ranks, 1 KB: 2 steps of (10 us + 1 us).
  CHECK(flat_allreduce_s(c, 1e3) == Approx(2 * (10e-6 + 1e3 * 1e-9)));
  // Hierarchical, 1 MB: two shm passes (1 us + 100 us), then 2 steps of
  // (10 us + 2 shards of 250 KB over the link).
  CHECK(hierarchical_allreduce_s(c, 1e6, 1) == Approx(2 * (1e-6 + 100e-6) + 2 * (10e-6 + 500e3 * 1e-9)));
  // The same in 4 pieces of 250 KB, pipelined: the thread's start, the first
  // piece's two passes (1 us + 25 us each) and network phase (shards of
  // 125 KB, above the small size: a ring of 2 hosts, 2 steps of 10 us + two
  // shards' halves over the link), then 3 more pieces at the slower stage
  // (the network's 270 us), each handed over (piece_s).
  const double pass = 1e-6 + 250e3 * 0.1e-9, net = 2 * (10e-6 + 2 * 62.5e3 * 1e-9);
  CHECK(hierarchical_allreduce_s(c, 1e6, 4) ==
        Approx(kPipelineStartS + 2 * pass + net + 3 * (std::max(2 * pass, net) + c.piece_s)));
  // Allgather of 4 MB: flat 3 steps of one 1 MB block; hierarchical 1 step
  // of 2 blocks over the link, then one shm pass over the 4 MB.
  CHECK(flat_allgather_s(c, 4e6) == Approx(3 * (10e-6 + 1e6 * 1e-9)));
  CHECK(hierarchical_allgather_s(c, 4e6) == Approx((10e-6 + 2e6 * 1e-9) + (1e-6 + 4e6 * 0.1e-9)));
}

TEST_CASE("cost model: the defaults choose hierarchical on 2 hosts x 2 ranks at every size",
          "[cost_model]") {
  const LayoutCost c = default_layout_cost(2, 2, 64 << 10);
  for (double bytes = 8; bytes <= 1e9; bytes *= 4) {
    INFO(bytes << " bytes");
    CHECK(hierarchical_allreduce_s(c, bytes) <= flat_allreduce_s(c, bytes));
    CHECK(hierarchical_allgather_s(c, bytes) <= flat_allgather_s(c, bytes));
  }
}

TEST_CASE("cost model: a network faster than shared memory, or many ranks per host on few "
          "hosts with large buffers, choose flat",
          "[cost_model]") {
  // Shared memory slower than the network: never hierarchical for large buffers.
  const LayoutCost fast_net = layout(2, 2, 50.0, 5.0);
  CHECK(flat_allreduce_s(fast_net, 64e6) < hierarchical_allreduce_s(fast_net, 64e6));
  // 8 hosts x 8 ranks on 12.5 GB/s links, 20 GB/s shared memory: the ring
  // moves about as many bytes per link and has no shared-memory passes, so
  // it beats the unpipelined hierarchical form; pipelined, the passes run
  // beside the network phase and the hierarchical form wins.
  const LayoutCost dc = layout(8, 8, 12.5, 20.0);
  CHECK(flat_allreduce_s(dc, 64e6) < hierarchical_allreduce_s(dc, 64e6, 1));
  CHECK(hierarchical_allreduce_s(dc, 64e6) < flat_allreduce_s(dc, 64e6));
  // ... while on 512 hosts the ring's 2(N-1) latency terms make it slower.
  const LayoutCost big = layout(512, 8, 12.5, 20.0);
  CHECK(hierarchical_allreduce_s(big, 64e6) < flat_allreduce_s(big, 64e6));
}

TEST_CASE("cost model: Rabenseifner's algorithm against the ring, at hand-computed points",
          "[cost_model][rabenseifner]") {
  const LinkCost l{10e-6, 1e-9};  // 10 us, 1 GB/s
  // 8 ranks, 1 MB: ring 14 steps of (10 us + 125 KB); Rabenseifner 6 steps,
  // 2 * 7/8 of the buffer.
  CHECK(ring_allreduce_s(l, 8, 1e6) == Approx(14 * (10e-6 + 125e3 * 1e-9)));
  CHECK(rabenseifner_allreduce_s(l, 8, 1e6) == Approx(6 * 10e-6 + 1.75e6 * 1e-9));
  // 6 ranks: p = 4, plus the fold (two whole-buffer transfers).
  CHECK(rabenseifner_allreduce_s(l, 6, 1e6) ==
        Approx(2 * (10e-6 + 1e6 * 1e-9) + 4 * 10e-6 + 1.5e6 * 1e-9));
  // Two allreduces sharing the link: twice the bytes per step.
  CHECK(rabenseifner_allreduce_s(l, 4, 1e6, 2) == Approx(4 * 10e-6 + 2 * 1.5e6 * 1e-9));
  CHECK(ring_allreduce_s(l, 1, 1e6) == 0);
  CHECK(rabenseifner_allreduce_s(l, 1, 1e6) == 0);
}

TEST_CASE("cost model: which large allreduce the defaults choose, and the forced choices",
          "[cost_model][rabenseifner]") {
  // One rank per host (the flat allreduce of CpuRingBackend).
  for (int n = 2; n <= 64; ++n) {
    const LayoutCost c = default_layout_cost(n, 1, 64 << 10);
    const bool pow2 = (n & (n - 1)) == 0;
    for (double bytes : {70e3, 1e6, 64e6, 1e9}) {
      INFO("n=" << n << " bytes=" << bytes);
      const double ring = ring_allreduce_s(c.net, n, bytes);
      const double rab = rabenseifner_allreduce_s(c.net, n, bytes);
      CHECK(flat_uses_rabenseifner(c, bytes) == (rab < ring));
      CHECK(flat_allreduce_s(c, bytes) == Approx(std::min(ring, rab)));
      // Powers of two from 4 on: same bandwidth term, fewer latency terms.
      if (pow2) CHECK(flat_uses_rabenseifner(c, bytes) == (n >= 4));
    }
    // At or below the small size: recursive doubling, unless the model
    // predicts Rabenseifner's algorithm strictly faster (never at 2 ranks,
    // never for a small buffer, where the latency terms decide).
    const double small = 64 << 10;
    const bool rab_small = n > 2 && rabenseifner_allreduce_s(c.net, n, small) <
                                        recursive_doubling_s(c.net, n, small);
    CHECK(flat_uses_rabenseifner(c, small) == rab_small);
    CHECK(flat_allreduce_s(c, small) ==
          Approx(rab_small ? rabenseifner_allreduce_s(c.net, n, small)
                           : ceil_log2(n) * c.net.t(small)));
    CHECK_FALSE(flat_uses_rabenseifner(c, 1024));
  }
  // The defaults (12 us, 1.2 GB/s), by hand: at 4 ranks 64 KiB is 2 steps of
  // (12 + 54.6 us) = 133.2 us by recursive doubling against 4 * 12 + 1.5 *
  // 54.6 = 129.9 us, 32 KiB 78.6 against 88.9 us; at 8 ranks 32 KiB 117.9
  // against 119.8 us, 48 KiB 158.9 against 143.4 us.
  CHECK(flat_uses_rabenseifner(default_layout_cost(4, 1, 64 << 10), 64 << 10));
  CHECK_FALSE(flat_uses_rabenseifner(default_layout_cost(4, 1, 64 << 10), 32 << 10));
  CHECK_FALSE(flat_uses_rabenseifner(default_layout_cost(8, 1, 64 << 10), 32 << 10));
  CHECK(flat_uses_rabenseifner(default_layout_cost(8, 1, 64 << 10), 48 << 10));
  CHECK(recursive_doubling_s(default_layout_cost(4, 1, 64 << 10).net, 4, 64 << 10) ==
        Approx(2 * (12e-6 + 65536 / 1.2e9)));
  // Where recursive doubling ends (the negotiation round's speculation stays
  // within it): the small size itself at 2 ranks and where the model never
  // switches below it; else the last size before the switch.
  CHECK(flat_recursive_doubling_bytes(default_layout_cost(2, 1, 64 << 10)) == (64u << 10));
  CHECK(flat_recursive_doubling_bytes(default_layout_cost(4, 1, 16 << 10)) == (16u << 10));
  for (int n : {4, 8, 16, 64}) {
    for (double gbs : {1.2, 0.125}) {
      LayoutCost c = default_layout_cost(n, 1, 64 << 10);
      c.net.beta_s_per_b = 1.0 / (gbs * 1e9);
      const std::size_t rd = flat_recursive_doubling_bytes(c);
      INFO("n=" << n << " GB/s=" << gbs << " limit=" << rd);
      CHECK_FALSE(flat_uses_rabenseifner(c, static_cast<double>(rd)));
      if (rd < c.small_bytes) CHECK(flat_uses_rabenseifner(c, static_cast<double>(rd + 1)));
      // 1 Gbit/s: the switch comes well below the 16 KiB speculation limit
      // at 8 ranks and more (3 * 12 us against 1.25 * 8 ns/B: ~3.5 KB).
      if (gbs < 1 && n >= 8) CHECK(rd < (16u << 10));
    }
  }
  // Forced either way (GYRE_RABENSEIFNER_ALLREDUCE = 1 / 0), the small size
  // keeps recursive doubling.
  CHECK_FALSE(flat_uses_rabenseifner(default_layout_cost(8, 1, 64 << 10, 1), 64 << 10));
  CHECK_FALSE(flat_uses_rabenseifner(default_layout_cost(8, 1, 64 << 10, 0), 64 << 10));
  // Not a power of two: the fold's two whole-buffer transfers cost more than
  // the latency saved at 3 ranks always, at 12 ranks above ~105 KB
  // (14 alpha against 1.92 bytes * beta) but not just above 64 KiB.
  CHECK_FALSE(flat_uses_rabenseifner(default_layout_cost(3, 1, 64 << 10), 1e5));
  CHECK(flat_uses_rabenseifner(default_layout_cost(12, 1, 64 << 10), 80e3));
  CHECK_FALSE(flat_uses_rabenseifner(default_layout_cost(12, 1, 64 << 10), 128e3));
  // GYRE_RABENSEIFNER_ALLREDUCE = 1 / 0 force it either way above the small size.
  CHECK(flat_uses_rabenseifner(default_layout_cost(3, 1, 64 << 10, 1), 1e6));
  CHECK_FALSE(flat_uses_rabenseifner(default_layout_cost(3, 1, 64 << 10, 1), 1e3));
  CHECK_FALSE(flat_uses_rabenseifner(default_layout_cost(8, 1, 64 << 10, 0), 1e6));
  // The hierarchical allreduce's network phase: 8 hosts x 2 ranks, shards of
  // half the buffer, both local ranks on the host's link.
  const LayoutCost h = default_layout_cost(8, 2, 64 << 10);
  CHECK(cross_uses_rabenseifner(h, 64e6));
  // A 50 KB shard, at or below the small size, both local ranks on the
  // link: recursive doubling 3 * (12 + 83.3 us) = 286 us against 6 * 12 +
  // 1.75 * 83.3 = 218 us: Rabenseifner. A 4 KB shard: recursive doubling.
  CHECK(cross_uses_rabenseifner(h, 100e3));
  CHECK(cross_allreduce_s(h, 50e3) == Approx(rabenseifner_allreduce_s(h.net, 8, 50e3, 2)));
  CHECK_FALSE(cross_uses_rabenseifner(h, 8e3));
  CHECK(cross_allreduce_s(h, 4e3) == Approx(recursive_doubling_s(h.net, 8, 4e3, 2)));
  CHECK(hierarchical_allreduce_s(h, 64e6, 1) ==
        Approx(2 * h.shm.t(64e6) + rabenseifner_allreduce_s(h.net, 8, 32e6, 2)));
  CHECK_FALSE(cross_uses_rabenseifner(default_layout_cost(8, 2, 64 << 10, 0), 64e6));
}

TEST_CASE("cost model: the pipelined hierarchical allreduce's number of pieces",
          "[cost_model][pipeline]") {
  // Small buffers are not cut (the thread's start costs more than it saves,
  // and pieces stay at least kMinPieceBytes).
  const LayoutCost c = default_layout_cost(2, 2, 64 << 10);
  for (double bytes : {8.0, 1e3, 64e3, 128e3}) {
    INFO(bytes << " bytes");
    CHECK(hierarchical_pieces(c, bytes) == 1);
  }
  // Large ones are, and the prediction is then below the unpipelined one
  // and never below the network phase alone.
  for (double bytes : {16e6, 64e6, 256e6}) {
    INFO(bytes << " bytes");
    const int k = hierarchical_pieces(c, bytes);
    CHECK(k > 1);
    CHECK(k <= kMaxPieces);
    CHECK(bytes / k >= kMinPieceBytes);
    CHECK(hierarchical_allreduce_s(c, bytes) <=
          (1 - kPipelineMinGain) * hierarchical_allreduce_s(c, bytes, 1));
    CHECK(hierarchical_allreduce_s(c, bytes) > cross_allreduce_s(c, bytes / 2));
    for (int other = 1; other <= kMaxPieces; other *= 2) {
      if (bytes / other < kMinPieceBytes) break;
      CHECK(hierarchical_allreduce_s(c, bytes) <= hierarchical_allreduce_s(c, bytes, other));
    }
  }
  // A gain below the margin keeps one piece: shared memory so fast that the
  // passes are a small part of the time.
  LayoutCost fast_shm = c;
  fast_shm.shm = {0.1e-6, 1.0 / 400e9};
  CHECK(hierarchical_allreduce_s(fast_shm, 64e6, 2) < hierarchical_allreduce_s(fast_shm, 64e6, 1));
  CHECK(hierarchical_pieces(fast_shm, 64e6) == 1);
  // One rank per host: no shared-memory passes, nothing to overlap.
  CHECK(hierarchical_pieces(default_layout_cost(4, 1, 64 << 10), 64e6) == 1);
}

TEST_CASE("link probe: alpha and beta fitted from round trips, the cache line read back",
          "[cost_model][link_probe]") {
  // 8-byte round trips of 40 us; 1 and 4 MiB ones with two flows on the
  // link, the first 512 KiB of each flow let through at once (a burst), the
  // rest at 62.5 MB/s per flow: 20 us, 125 MB/s for the link.
  const double mib = 1 << 20;
  auto rtt = [&](double bytes) { return 40e-6 + 2 * (bytes - mib / 2) / 62.5e6; };
  const LinkCost l = fit_link(40e-6, rtt(mib), mib, rtt(4 * mib), 4 * mib, 2);
  CHECK(l.alpha_s == Approx(20e-6));
  CHECK(1.0 / l.beta_s_per_b == Approx(125e6));
  // Timings that would give nothing or less: floored, never zero or negative.
  const LinkCost floor = fit_link(0.0, 1e-3, mib, 0.5e-3, 4 * mib, 2);
  CHECK(floor.alpha_s > 0);
  CHECK(floor.beta_s_per_b > 0);

  LayoutCost c = default_layout_cost(2, 2, 64 << 10);
  c.net = {35e-6, 1 / 118e6};
  c.shm = {4e-6, 1 / 2.5e9};
  c.piece_s = 300e-6;
  const std::string line = link_cache_line(c);
  auto back = parse_link_cache_line(line, default_layout_cost(2, 2, 64 << 10));
  REQUIRE(back.has_value());
  CHECK(back->net.alpha_s == Approx(35e-6));
  CHECK(back->net.beta_s_per_b == Approx(1 / 118e6));
  CHECK(back->shm.alpha_s == Approx(4e-6));
  CHECK(back->shm.beta_s_per_b == Approx(1 / 2.5e9));
  CHECK(back->piece_s == Approx(300e-6));
  // Another layout's line, or a damaged one, is not used.
  CHECK_FALSE(parse_link_cache_line(line, default_layout_cost(4, 2, 64 << 10)).has_value());
  CHECK_FALSE(parse_link_cache_line(line.substr(0, line.size() / 2), c).has_value());
  CHECK_FALSE(parse_link_cache_line("gyre-link-cost hosts=2 per_host=2 net_alpha_s=-1 "
                                    "net_beta_s_per_b=1 shm_alpha_s=1 shm_beta_s_per_b=1 piece_s=1",
                                    c).has_value());
}
