// The link probe (link_probe.h).
#include "backends/hierarchical/link_probe.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <vector>

#include <fmt/format.h>

#include "gyre/collectives/algorithms.h"
#include "negotiation/message_tags.h"

namespace gyre::core {

namespace {

using Clock = std::chrono::steady_clock;

constexpr double kSmallBytes = 8;
constexpr std::size_t kMidBytes = 1u << 20, kLargeBytes = 4u << 20;
constexpr int kSmallTrips = 16, kLargeTrips = 3;
constexpr std::size_t kShmSmallCount = 1024, kShmLargeCount = 1u << 20;  // float32: 4 KiB, 4 MiB
constexpr int kShmReps = 3;
constexpr double kFloorS = 1e-9;  // no parameter is zero or negative

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Round trips of `bytes` with `partner` (the lower rank sends first), each
// started together with the host's other local ranks; median seconds.
double round_trips(transport::Transport& cross, collectives::ShmGroup* local, int partner,
                   std::size_t bytes, int trips) {
  std::vector<std::byte> out(bytes, std::byte{1}), in(bytes);
  std::vector<double> rtt;
  const bool first = cross.rank() < partner;
  for (int i = 0; i <= trips; ++i) {  // trip 0 warms the connection up
    if (local) local->barrier();
    const auto t0 = Clock::now();
    for (int leg = 0; leg < 2; ++leg) {
      transport::Transfer x = (leg == 0) == first ? cross.isend(partner, kTagData, out)
                                                  : cross.irecv(partner, kTagData, in);
      cross.wait(x);
    }
    if (i > 0) rtt.push_back(seconds_since(t0));
  }
  return median(rtt);
}

// One step of an 8-byte recursive-doubling allreduce over `world`, every
// rank at once (the median of kSmallTrips calls over ceil(log2 n) steps):
// what a step of the flat allreduce costs beyond its bytes, the ranks'
// wake-ups and the cores they share included, which a ping-pong between two
// ranks with the others idle does not meet.
double allreduce_step(transport::Transport& world) {
  collectives::AllreduceOptions o;
  o.tag = kTagData;
  double x = 1.0;
  std::vector<double> t;
  for (int i = 0; i <= kSmallTrips; ++i) {  // call 0 warms up
    const auto t0 = Clock::now();
    collectives::allreduce(world, &x, &x, 1, DataType::kFloat64, ReduceOp::kMax, o);
    if (i > 0) t.push_back(seconds_since(t0));
  }
  return median(t) / ceil_log2(world.size());
}

// One shared-memory pass (half a reduce-scatter + allgather) over `count`
// float32 per rank; median seconds.
double shm_pass(collectives::ShmGroup& local, std::size_t count) {
  std::vector<float> buf(count, 1.0f);
  const collectives::ShmShards s =
      collectives::shm_shards(count, local.size(), local.rank(), sizeof(float));
  float* mine = buf.data() + s.mine_at;
  std::vector<double> t;
  for (int i = 0; i <= kShmReps; ++i) {
    local.barrier();
    const auto t0 = Clock::now();
    collectives::shm_reduce_scatter(local, buf.data(), mine, s.counts, DataType::kFloat32,
                                    ReduceOp::kMax);
    collectives::shm_allgather(local, mine, buf.data(), s.blocks);
    if (i > 0) t.push_back(seconds_since(t0) / 2);
  }
  return median(t);
}

// What a piece of a pipelined hierarchical allreduce costs beyond its bytes:
// one of kPieces pieces of a few elements, the median over kShmReps calls.
double piece_cost(transport::Transport& cross, collectives::ShmGroup& local) {
  constexpr std::size_t kPieces = 16;
  std::vector<float> buf(kPieces * static_cast<std::size_t>(local.size()), 1.0f);
  collectives::AllreduceOptions o;
  o.tag = kTagData;
  std::vector<double> t;
  for (int i = 0; i <= kShmReps; ++i) {
    local.barrier();
    const auto t0 = Clock::now();
    collectives::hierarchical_allreduce(local, cross, buf.data(), buf.data(), buf.size(),
                                        DataType::kFloat32, ReduceOp::kMax, 1.0, 1.0, o, kPieces);
    if (i > 0) t.push_back(seconds_since(t0) / kPieces);
  }
  return median(t);
}

// Every rank's figures, the largest of each (the slowest link decides).
void agree_max(transport::Transport& world, std::vector<double>& v) {
  collectives::AllreduceOptions o;
  o.tag = kTagData;
  collectives::allreduce(world, v.data(), v.data(), v.size(), DataType::kFloat64, ReduceOp::kMax, o);
}

}  // namespace

LinkCost fit_link(double small_rtt_s, double a_rtt_s, double a_bytes, double b_rtt_s,
                  double b_bytes, int share) {
  LinkCost l;
  l.alpha_s = std::max(small_rtt_s / 2, kFloorS);
  const double per_byte = (b_rtt_s - a_rtt_s) / 2 / (b_bytes - a_bytes);
  l.beta_s_per_b = std::max(per_byte / std::max(share, 1), 1e-13);
  return l;
}

std::string link_cache_line(const LayoutCost& c) {
  return fmt::format("gyre-link-cost hosts={} per_host={} net_alpha_s={:.9g} net_beta_s_per_b={:.9g} "
                     "shm_alpha_s={:.9g} shm_beta_s_per_b={:.9g} piece_s={:.9g}",
                     c.hosts, c.per_host, c.net.alpha_s, c.net.beta_s_per_b, c.shm.alpha_s,
                     c.shm.beta_s_per_b, c.piece_s);
}

std::optional<LayoutCost> parse_link_cache_line(const std::string& line, const LayoutCost& layout) {
  int hosts = 0, per_host = 0;
  double v[5];
  if (std::sscanf(line.c_str(),
                  "gyre-link-cost hosts=%d per_host=%d net_alpha_s=%lg net_beta_s_per_b=%lg "
                  "shm_alpha_s=%lg shm_beta_s_per_b=%lg piece_s=%lg",
                  &hosts, &per_host, &v[0], &v[1], &v[2], &v[3], &v[4]) != 7) {
    return std::nullopt;
  }
  if (hosts != layout.hosts || per_host != layout.per_host) return std::nullopt;
  for (double x : v) {
    if (!std::isfinite(x) || x <= 0) return std::nullopt;
  }
  LayoutCost c = layout;
  c.net = {v[0], v[1]};
  c.shm = {v[2], v[3]};
  c.piece_s = v[4];
  return c;
}

LayoutCost probe_links(transport::Transport& world, transport::Transport& cross,
                       collectives::ShmGroup* local, const Options& opt, const Logger& log,
                       const LayoutCost& base, std::string& source) {
  // Rank 0's cache line, if any, reaches every rank through the agreement:
  // [found, net alpha, net beta, shm alpha, shm beta, piece], zeros elsewhere.
  std::vector<double> cached(6, 0.0);
  if (world.rank() == 0 && !opt.link_probe_cache.empty()) {
    std::ifstream f(opt.link_probe_cache);
    for (std::string line; std::getline(f, line);) {
      if (auto c = parse_link_cache_line(line, base)) {
        cached = {1.0, c->net.alpha_s, c->net.beta_s_per_b, c->shm.alpha_s, c->shm.beta_s_per_b,
                  c->piece_s};
      }
    }
  }
  agree_max(world, cached);
  LayoutCost c = base;
  if (cached[0] != 0.0) {
    c.net = {cached[1], cached[2]};
    c.shm = {cached[3], cached[4]};
    c.piece_s = cached[5];
    source = "cached";
  } else {
    const auto t0 = Clock::now();
    // [net alpha, net beta, shm alpha, shm beta, piece]: zeros from a rank
    // without a partner (an odd host count's last host) leave the others'.
    std::vector<double> mine(5, 0.0);
    // Hosts of one rank each: alpha is what a step of the flat allreduce
    // itself costs (a collective: every rank, also an odd count's last),
    // in place of the 8-byte round trips.
    const double flat_step_s = local ? 0.0 : allreduce_step(world);
    // Every local rank of a host has the host's cross rank: all of them
    // probe, or none.
    const int partner = cross.rank() ^ 1;
    if (partner < cross.size()) {
      const double small =
          local ? round_trips(cross, local, partner, static_cast<std::size_t>(kSmallBytes),
                              kSmallTrips)
                : 2 * flat_step_s;
      const double mid = round_trips(cross, local, partner, kMidBytes, kLargeTrips);
      const double large = round_trips(cross, local, partner, kLargeBytes, kLargeTrips);
      const LinkCost net =
          fit_link(small, mid, kMidBytes, large, kLargeBytes, local ? local->size() : 1);
      mine[0] = net.alpha_s;
      mine[1] = net.beta_s_per_b;
    }
    if (!local) mine[0] = std::max(flat_step_s, kFloorS);  // a rank without a partner too
    if (local && local->size() > 1) {
      const double small = shm_pass(*local, kShmSmallCount);
      const double large = shm_pass(*local, kShmLargeCount);
      const double bytes = static_cast<double>(kShmLargeCount * sizeof(float));
      mine[2] = std::max(small, kFloorS);
      mine[3] = std::max((large - small) / (bytes - kShmSmallCount * sizeof(float)), 1e-13);
      // A collective over every rank of the cross transport and the group.
      mine[4] = std::max(piece_cost(cross, *local), kFloorS);
    }
    agree_max(world, mine);
    if (mine[0] > 0) c.net = {mine[0], mine[1]};
    if (mine[2] > 0) c.shm = {mine[2], mine[3]};
    if (mine[4] > 0) c.piece_s = mine[4];
    source = "probed";
    log.debug("link probe took {:.1f} ms", seconds_since(t0) * 1e3);
    if (world.rank() == 0 && !opt.link_probe_cache.empty()) {
      std::ofstream f(opt.link_probe_cache, std::ios::trunc);
      f << link_cache_line(c) << '\n';
      if (!f) log.warn("link probe: could not write {}", opt.link_probe_cache);
    }
  }
  if (world.rank() == 0) {
    log.info("link parameters ({}): network {:.1f} us, {:.3f} GB/s per host; shared memory "
             "{:.1f} us, {:.2f} GB/s per pass; {:.1f} us per piece of a pipelined allreduce",
             source, c.net.alpha_s * 1e6, 1e-9 / c.net.beta_s_per_b, c.shm.alpha_s * 1e6,
             1e-9 / c.shm.beta_s_per_b, c.piece_s * 1e6);
  }
  return c;
}

}  // namespace gyre::core
