// The link probe: the cost model's parameters (cost_model.h) measured at
// start-up on the job's own links instead of the built-in ones, so that the
// choice between the flat and hierarchical allreduce, the ring and
// Rabenseifner's algorithm, and the pipeline's number of pieces follows the
// cluster the job runs on (GYRE_LINK_PROBE=1).
//
// What it times, on every rank at once:
// - the network: ping-pongs between cross-host partners (cross rank r and
//   r ^ 1), every local rank of a host at once, as the hierarchical
//   allreduce's network phase shares the host's link: 8-byte round trips
//   give alpha, 1 and 4 MiB ones the link's seconds per byte (beta);
// - shared memory: a reduce-scatter and an allgather over the host's group
//   of a small and a 4 MiB buffer give one pass's alpha and beta;
// - the pipeline: a hierarchical allreduce of a few elements in 16 pieces
//   gives what a piece costs beyond its bytes (the hand-over between the
//   two threads, their wake-ups, the network phase's latency), which on a
//   host with fewer cores than threads is far above the built-in figure.
// The slowest rank's figures are agreed by an allreduce (max) over the
// world, so every rank holds the same parameters and takes the same branch.
// GYRE_LINK_PROBE_CACHE names a file: rank 0 reads the parameters from it
// when it holds a line for this layout (hosts x ranks per host), and writes
// them there after a probe; the other ranks get them in the agreement.
//
// Also for a job across hosts of one rank each: there the flat allreduce's
// choice between recursive doubling, Rabenseifner's algorithm and the ring
// follows the probed network.
//
// Thread: the caller's (init, before the background thread starts); it is
// a collective over the world, the cross transport and the host's group.
#pragma once

#include <optional>
#include <string>

#include "backends/hierarchical/cost_model.h"
#include "gyre/collectives/shm.h"
#include "gyre/collectives/transport.h"
#include "gyre/options.h"
#include "runtime/logging.h"

namespace gyre::core {

// alpha and beta of a link from round trips (medians, seconds) of a small
// message and of two large sizes a < b, `share` flows crossing it at once:
// alpha is half the small round trip, beta the slope of the one-way time
// between the two large sizes per byte of all the flows (a slope, so that a
// burst the link lets through at a higher rate, as a token bucket or a
// switch's buffer does, is not taken for its sustained rate). Never
// negative or zero.
LinkCost fit_link(double small_rtt_s, double a_rtt_s, double a_bytes, double b_rtt_s,
                  double b_bytes, int share);

// One line of the cache file for `c` and back; nullopt for a line that is
// not for this layout or not well formed.
std::string link_cache_line(const LayoutCost& c);
std::optional<LayoutCost> parse_link_cache_line(const std::string& line, const LayoutCost& layout);

// `base` (the built-in parameters of this layout) with its net and shm
// links measured, or read from the cache; `source` receives "probed" or
// "cached". `local` null: hosts of one rank each (the flat allreduce across
// them), `cross` the world's transport; only the network is measured and
// the shared-memory parameters stay `base`'s. Throws what the transports
// throw (the job's start fails).
LayoutCost probe_links(transport::Transport& world, transport::Transport& cross,
                       collectives::ShmGroup* local, const Options& opt, const Logger& log,
                       const LayoutCost& base, std::string& source);

}  // namespace gyre::core
