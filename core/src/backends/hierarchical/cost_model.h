// The alpha-beta cost model that chooses, under GYRE_HIERARCHICAL_ALLREDUCE
// (or _ALLGATHER) = -1, between the flat ring over all ranks and the
// hierarchical form, per call. A transfer of b bytes over a link costs
// alpha + b * beta; the algorithms' times are sums of such steps. The same
// model, with the derivations and the measurements of its parameters, is
// benchmarks/cost_model.py (docs/scaling.md).
//
// The choice depends only on the call's sizes and the job's layout, the same
// on every rank, so every rank takes the same branch.
#pragma once

#include <cmath>
#include <cstddef>

namespace gyre::core {

struct LinkCost {
  double alpha_s = 0;         // seconds per message (latency)
  double beta_s_per_b = 0;    // seconds per byte (1 / bandwidth)
  double t(double bytes) const { return alpha_s + bytes * beta_s_per_b; }
};

struct LayoutCost {
  int hosts = 1;              // H
  int per_host = 1;           // p ranks on each host
  LinkCost net;               // between hosts (one host's NIC)
  LinkCost shm;               // a pass over shared memory within a host
  std::size_t small_bytes = 64u << 10;  // recursive doubling at or below
};

// Defaults measured on the simulated hosts of scripts/hosts.sh (10 Gbit/s
// tbf-shaped veth links) and this machine's shared memory; see
// docs/scaling.md for how. They only steer the choice: a real cluster's
// network is slower than its shared memory too, which is what decides.
inline LayoutCost default_layout_cost(int hosts, int per_host, std::size_t small_bytes) {
  LayoutCost c;
  c.hosts = hosts;
  c.per_host = per_host;
  c.net = {12e-6, 1.0 / 1.2e9};
  c.shm = {0.5e-6, 1.0 / 20e9};
  c.small_bytes = small_bytes;
  return c;
}

inline double ceil_log2(int n) { return n <= 1 ? 0.0 : std::ceil(std::log2(n)); }

// Flat allreduce of `bytes` over all H*p ranks, ranks host-major (the ring
// crosses each host boundary once, so each step's slowest link is one
// network hop carrying one chunk): recursive doubling at or below
// small_bytes, the ring above.
inline double flat_allreduce_s(const LayoutCost& c, double bytes) {
  const int n = c.hosts * c.per_host;
  if (n <= 1) return 0;
  if (bytes <= static_cast<double>(c.small_bytes)) return ceil_log2(n) * c.net.t(bytes);
  return 2.0 * (n - 1) * c.net.t(bytes / n);
}

// Hierarchical: a shared-memory reduce-scatter and allgather (one pass over
// the buffer each), and p concurrent allreduces of bytes/p across the H
// hosts that share each host's link (so each step moves p chunks over it).
inline double hierarchical_allreduce_s(const LayoutCost& c, double bytes) {
  const int h = c.hosts, p = c.per_host;
  const double shm = p > 1 ? 2.0 * c.shm.t(bytes) : 0.0;
  if (h <= 1) return shm;
  const double shard = bytes / p;
  const double cross = shard <= static_cast<double>(c.small_bytes)
                           ? ceil_log2(h) * (c.net.alpha_s + p * shard * c.net.beta_s_per_b)
                           : 2.0 * (h - 1) * (c.net.alpha_s + p * (shard / h) * c.net.beta_s_per_b);
  return shm + cross;
}

// Allgather of `bytes` in all (bytes / (H*p) from each rank). Flat ring:
// H*p - 1 steps of one block, the slowest link a network hop. Hierarchical:
// H - 1 steps across hosts of p concurrent blocks over each host's link,
// then one shared-memory pass over the whole result.
inline double flat_allgather_s(const LayoutCost& c, double bytes) {
  const int n = c.hosts * c.per_host;
  return n <= 1 ? 0.0 : (n - 1) * c.net.t(bytes / n);
}
inline double hierarchical_allgather_s(const LayoutCost& c, double bytes) {
  const int n = c.hosts * c.per_host;
  const double block = bytes / n;
  return (c.hosts - 1) * (c.net.alpha_s + c.per_host * block * c.net.beta_s_per_b) +
         (c.per_host > 1 ? c.shm.t(bytes) : 0.0);
}

}  // namespace gyre::core
