// The alpha-beta cost model that chooses, under GYRE_HIERARCHICAL_ALLREDUCE
// (or _ALLGATHER) = -1, between the flat ring over all ranks and the
// hierarchical form, per call, and under GYRE_RABENSEIFNER_ALLREDUCE = -1
// between the ring and Rabenseifner's algorithm above the recursive-doubling
// size (for the flat allreduce and for the hierarchical one's network phase). A transfer of b bytes over a link costs
// alpha + b * beta; the algorithms' times are sums of such steps. The same
// model, with the derivations and the measurements of its parameters, is
// benchmarks/cost_model.py (docs/scaling.md).
//
// The choice depends only on the call's sizes and the job's layout, the same
// on every rank, so every rank takes the same branch.
#pragma once

#include <algorithm>
#include <bit>
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
  // Above small_bytes: 0 the ring, 1 Rabenseifner's algorithm, -1 whichever
  // the model predicts faster (GYRE_RABENSEIFNER_ALLREDUCE).
  long rabenseifner = -1;
  // What each piece of a pipelined hierarchical allreduce costs beyond its
  // bytes: handing it between the two threads, and waking them.
  double piece_s = 20e-6;
};

// Defaults measured on the simulated hosts of scripts/hosts.sh (10 Gbit/s
// tbf-shaped veth links) and this machine's shared memory; see
// docs/scaling.md for how. They only steer the choice: a real cluster's
// network is slower than its shared memory too, which is what decides.
inline LayoutCost default_layout_cost(int hosts, int per_host, std::size_t small_bytes,
                                      long rabenseifner = -1) {
  LayoutCost c;
  c.rabenseifner = rabenseifner;
  c.hosts = hosts;
  c.per_host = per_host;
  c.net = {12e-6, 1.0 / 1.2e9};
  c.shm = {0.5e-6, 1.0 / 20e9};
  c.small_bytes = small_bytes;
  return c;
}

inline double ceil_log2(int n) { return n <= 1 ? 0.0 : std::ceil(std::log2(n)); }

// The two large-buffer allreduces among n ranks, each step over `link`,
// which `share` such allreduces cross at once (each moving its own bytes).
// Ring: 2(n-1) steps of bytes/n. Rabenseifner with p = the largest power of
// two <= n: 2 log2 p steps moving 2(p-1)/p of the buffer in all, plus, when
// n is not a power of two, the folded pairs' two whole-buffer transfers
// (the odd rank's input, the result back).
inline double ring_allreduce_s(const LinkCost& l, int n, double bytes, int share = 1) {
  if (n <= 1) return 0;
  return 2.0 * (n - 1) * (l.alpha_s + share * (bytes / n) * l.beta_s_per_b);
}
inline double rabenseifner_allreduce_s(const LinkCost& l, int n, double bytes, int share = 1) {
  if (n <= 1) return 0;
  const int p = static_cast<int>(std::bit_floor(static_cast<unsigned>(n)));
  const double fold = p < n ? 2.0 * (l.alpha_s + share * bytes * l.beta_s_per_b) : 0.0;
  return fold + 2.0 * std::log2(p) * l.alpha_s +
         2.0 * (p - 1) / p * share * bytes * l.beta_s_per_b;
}

// Whether Rabenseifner's algorithm runs for an allreduce of `bytes` above
// small_bytes among n ranks (link shared by `share`): forced by
// c.rabenseifner = 0 or 1, else where the model predicts it strictly faster
// than the ring (a tie, as at n = 2, keeps the ring).
inline bool use_rabenseifner(const LayoutCost& c, int n, double bytes, int share = 1) {
  if (c.rabenseifner >= 0) return c.rabenseifner == 1;
  return rabenseifner_allreduce_s(c.net, n, bytes, share) < ring_allreduce_s(c.net, n, bytes, share);
}

// Recursive doubling among n ranks: ceil(log2 n) steps, each moving the
// whole buffer over `link` (shared by `share` such allreduces).
inline double recursive_doubling_s(const LinkCost& l, int n, double bytes, int share = 1) {
  return ceil_log2(n) * (l.alpha_s + share * bytes * l.beta_s_per_b);
}

// At or below small_bytes: recursive doubling, unless the model is free to
// choose (c.rabenseifner = -1) and predicts Rabenseifner's algorithm
// strictly faster. That happens where bytes * beta outweighs alpha: its
// 2 log2 p steps move 2(p-1)/p of the buffer in all, recursive doubling's
// log2 n steps the whole buffer each (at 4 ranks 1.5 against 2 buffers; at
// 8, 1.75 against 3).
inline bool small_uses_rabenseifner(const LayoutCost& c, int n, double bytes, int share = 1) {
  if (n <= 2 || c.rabenseifner >= 0 || bytes > static_cast<double>(c.small_bytes)) return false;
  return rabenseifner_allreduce_s(c.net, n, bytes, share) <
         recursive_doubling_s(c.net, n, bytes, share);
}

// The large-buffer allreduce among n ranks as chosen by use_rabenseifner.
inline double large_allreduce_s(const LayoutCost& c, int n, double bytes, int share = 1) {
  return use_rabenseifner(c, n, bytes, share) ? rabenseifner_allreduce_s(c.net, n, bytes, share)
                                              : ring_allreduce_s(c.net, n, bytes, share);
}

// Flat allreduce of `bytes` over all H*p ranks, ranks host-major:
// recursive doubling at or below small_bytes, above it the ring (which
// crosses each host boundary once, so each step's slowest link is one
// network hop carrying one chunk) or Rabenseifner's algorithm, counted as if
// all p ranks of a host crossed its link at every step (its steps between
// partners on one host are cheaper: an upper bound when p > 1, exact at
// p = 1).
// At or below small_bytes, small_uses_rabenseifner decides (the flat
// allreduce then runs Rabenseifner's algorithm in place of recursive
// doubling).
inline bool flat_uses_rabenseifner(const LayoutCost& c, double bytes) {
  const int n = c.hosts * c.per_host;
  if (n <= 1) return false;
  if (bytes <= static_cast<double>(c.small_bytes)) {
    return small_uses_rabenseifner(c, n, bytes, c.per_host);
  }
  if (c.rabenseifner >= 0) return c.rabenseifner == 1;
  return rabenseifner_allreduce_s(c.net, n, bytes, c.per_host) < ring_allreduce_s(c.net, n, bytes);
}
// The largest buffer the flat allreduce reduces by recursive doubling: at
// most small_bytes, and below the first size the model gives to
// Rabenseifner's algorithm there (the difference between the two is linear
// in the size, so the choice switches once). The negotiation round's
// speculation, which gives recursive doubling's bits, stays within it.
inline std::size_t flat_recursive_doubling_bytes(const LayoutCost& c) {
  std::size_t hi = c.small_bytes;
  if (!flat_uses_rabenseifner(c, static_cast<double>(hi))) return hi;
  std::size_t lo = 0;  // flat_uses_rabenseifner(c, 0) is false: the latency terms decide
  while (hi - lo > 1) {
    const std::size_t mid = lo + (hi - lo) / 2;
    (flat_uses_rabenseifner(c, static_cast<double>(mid)) ? hi : lo) = mid;
  }
  return lo;
}

inline double flat_allreduce_s(const LayoutCost& c, double bytes) {
  const int n = c.hosts * c.per_host;
  if (n <= 1) return 0;
  if (flat_uses_rabenseifner(c, bytes)) {
    return rabenseifner_allreduce_s(c.net, n, bytes, c.per_host);
  }
  if (bytes <= static_cast<double>(c.small_bytes)) return recursive_doubling_s(c.net, n, bytes);
  return ring_allreduce_s(c.net, n, bytes);
}

// Hierarchical: a shared-memory reduce-scatter and allgather (one pass over
// the buffer each), and p concurrent allreduces of bytes/p across the H
// hosts that share each host's link (so each step moves p chunks over it),
// by recursive doubling, the ring or Rabenseifner's algorithm
// (cross_uses_rabenseifner).
inline bool cross_uses_rabenseifner(const LayoutCost& c, double bytes) {
  const double shard = bytes / c.per_host;
  if (c.hosts <= 1) return false;
  if (shard <= static_cast<double>(c.small_bytes)) {
    return small_uses_rabenseifner(c, c.hosts, shard, c.per_host);
  }
  return use_rabenseifner(c, c.hosts, shard, c.per_host);
}
// The network phase alone: p concurrent allreduces of shard bytes across
// the H hosts, sharing each host's link.
inline double cross_allreduce_s(const LayoutCost& c, double shard) {
  const int h = c.hosts, p = c.per_host;
  if (h <= 1) return 0;
  if (shard <= static_cast<double>(c.small_bytes)) {
    return small_uses_rabenseifner(c, h, shard, p) ? rabenseifner_allreduce_s(c.net, h, shard, p)
                                                   : recursive_doubling_s(c.net, h, shard, p);
  }
  return large_allreduce_s(c, h, shard, p);
}

// Starting the network phase's thread for a pipelined call (measured: tens
// of microseconds), so that small buffers are not cut into pieces.
inline constexpr double kPipelineStartS = 50e-6;

// Hierarchical in `pieces` pieces (pieces = 1: the three phases one after
// the other). Pipelined, the calling thread runs each piece's two
// shared-memory passes while another piece crosses the hosts: after the
// first piece's reduce-scatter, each of the pieces costs the slower of the
// two stages plus the hand-over (piece_s), and the last piece's network
// phase and allgather follow.
inline double hierarchical_allreduce_s(const LayoutCost& c, double bytes, int pieces) {
  const double piece = bytes / pieces;
  const double pass = c.per_host > 1 ? c.shm.t(piece) : 0.0;
  const double net = cross_allreduce_s(c, piece / c.per_host);
  if (pieces <= 1) return 2 * pass + net;
  return kPipelineStartS + 2 * pass + net + (pieces - 1) * (std::max(2 * pass, net) + c.piece_s);
}

// The number of pieces (a power of two up to kMaxPieces, each at least
// kMinPieceBytes) the model predicts fastest, and 1 (not pipelined) unless
// that is predicted at least kPipelineMinGain faster than one piece: a
// margin for parameters that are themselves measurements (link_probe.h),
// so that a noisy figure does not cut a buffer the pipeline barely helps.
inline constexpr int kMaxPieces = 64;
inline constexpr double kMinPieceBytes = 64 << 10;
inline constexpr double kPipelineMinGain = 0.05;
inline int hierarchical_pieces(const LayoutCost& c, double bytes) {
  int best = 1;
  const double one = hierarchical_allreduce_s(c, bytes, 1);
  double best_s = one;
  for (int k = 2; k <= kMaxPieces && bytes / k >= kMinPieceBytes; k *= 2) {
    const double s = hierarchical_allreduce_s(c, bytes, k);
    if (s < best_s) best = k, best_s = s;
  }
  return best_s <= (1 - kPipelineMinGain) * one ? best : 1;
}

// Hierarchical at the model's number of pieces.
inline double hierarchical_allreduce_s(const LayoutCost& c, double bytes) {
  return hierarchical_allreduce_s(c, bytes, hierarchical_pieces(c, bytes));
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
