// Runtime options. Every field has a default and an environment variable;
// Options::from_env() is the only place gyre reads the environment. One table
// (core/src/runtime/options_table.h) names each variable with its field,
// parser, bounds, default, whether every rank must share it and its doc line;
// docs/environment.md shows it, and a test keeps the two equal.
#pragma once

#include <cstddef>
#include <string>

namespace gyre {

enum class LogLevel { kTrace = 0, kDebug, kInfo, kWarning, kError, kFatal };

struct Options {
  // GYRE_FUSION_THRESHOLD: bytes per fusion buffer; 0 disables fusion.
  std::size_t fusion_threshold_bytes = 64u << 20;
  // GYRE_FUSION_MAX_TENSOR: only tensors up to this many bytes are copied
  // into fusion buffers; larger ones are bandwidth-bound already, so they
  // are reduced in place, saving two copies. 0: no limit besides the
  // threshold.
  std::size_t fusion_max_tensor_bytes = 1u << 20;
  // GYRE_CYCLE_TIME_MS: longest the background thread sleeps between
  // negotiation rounds when no work is enqueued (it wakes at once on enqueue).
  // Values below 0.1 (0 included) count as 0.1.
  double cycle_time_ms = 1.0;
  // GYRE_SPIN_WAIT_US: how long the background thread polls a pending
  // transfer before it sleeps between polls (naps of 5 us doubling up to
  // 200 us), so that a late peer does not cost this rank a core.
  double spin_wait_us = 100.0;
  // GYRE_CACHE_CAPACITY: entries of the response cache; 0 disables it.
  std::size_t cache_capacity = 1024;
  // GYRE_LOG_NEGOTIATION: 1 decides a round in which every rank's requests
  // are cache hits at one step by a log-depth exchange (ceil(log2 n)
  // messages per rank); 0 always runs the full exchange.
  long log_negotiation = 1;
  // GYRE_HOST_NEGOTIATION: 1 combines a log-depth round within each host
  // over shared memory first, then among one rank per host, in a job across
  // hosts of several ranks each; 0 over every rank.
  long host_negotiation = 1;
  // GYRE_SPECULATE_BYTES: an allreduce of host memory of at most this many
  // bytes (at most 64 KiB; and GYRE_ALLREDUCE_SMALL_BYTES; over shared
  // memory 64) that every rank submits as a cache hit is reduced within the
  // log-depth round itself (docs/architecture.md); 0 never.
  std::size_t speculate_bytes = 16u << 10;
  // GYRE_RING_CHUNK_BYTES: pipelined chunk size of the ring algorithms (> 0).
  std::size_t ring_chunk_bytes = 256u << 10;
  // GYRE_ALLREDUCE_SMALL_BYTES: allreduces (single tensors or fused buckets)
  // of at most this many bytes use recursive doubling, larger ones the ring;
  // 0: always the ring.
  std::size_t allreduce_small_bytes = 64u << 10;
  // GYRE_RABENSEIFNER_ALLREDUCE: above allreduce_small_bytes, 1 always runs
  // Rabenseifner's algorithm (reduce-scatter by recursive halving, allgather
  // by recursive doubling), 0 always the ring; -1 (default) chooses per call
  // by the alpha-beta cost model (backends/hierarchical/cost_model.h), for
  // the flat allreduce and the hierarchical one's network phase.
  long rabenseifner_allreduce = -1;
  // GYRE_SHM: 1 runs the collectives of CPU tensors over shared memory when
  // every rank of the job is on one host; 0 keeps the ring over MPI.
  long shared_memory = 1;
  // GYRE_SHM_SLOT_BYTES: each rank's slot in the shared segment, the chunk
  // of the shared-memory collectives.
  std::size_t shm_slot_bytes = 256u << 10;
  // GYRE_SHM_POOL_BYTES: each rank's part of the host's shared pool
  // (gyre::alloc_shared); 0: none.
  std::size_t shm_pool_bytes = 0;
  // GYRE_HIERARCHICAL_ALLREDUCE: when the job spans hosts that each hold the
  // same number (more than one) of ranks, 1 reduces host tensors
  // hierarchically, 0 with one flat ring; -1 (default) chooses per call by
  // an alpha-beta cost model (backends/hierarchical/cost_model.h).
  long hierarchical_allreduce = -1;
  // GYRE_HIERARCHICAL_PIPELINE: the hierarchical allreduce cut into this
  // many pieces, the shared-memory passes of one piece running beside the
  // network phase of another (0 or 1: not pipelined); -1 (default): the
  // number the cost model predicts fastest for each call.
  long hierarchical_pipeline = -1;
  // GYRE_LINK_PROBE: 1 measures the cost model's parameters (network and
  // shared-memory alpha and beta) at start-up on the job's own links when
  // it spans hosts of several ranks each (network only across hosts of one
  // rank each: the flat allreduce's choice); 0 (default) keeps the built-in
  // ones. GYRE_LINK_PROBE_CACHE: a file rank 0 reads them from (a line for
  // this layout) instead of measuring, and writes them to after measuring.
  long link_probe = 0;
  std::string link_probe_cache;
  // GYRE_AUTOTUNE: 1 times the flat and the hierarchical allreduce on the
  // job's own calls where GYRE_HIERARCHICAL_ALLREDUCE is -1 (each size class
  // of 256 KiB and more: a warm-up, two to six calls of each form, then the faster
  // for the rest of the job, agreed by every rank;
  // backends/hierarchical/autotune.h); 0
  // (default) leaves the choice to the cost model alone.
  long autotune = 0;
  // GYRE_HIERARCHICAL_ALLGATHER: the same for allgather (a ring across hosts
  // among the ranks with the same local rank, then shared memory within).
  long hierarchical_allgather = -1;
  // GYRE_TIMELINE: path of a Chrome trace-event JSON file; empty: off.
  std::string timeline_path;
  // GYRE_TIMELINE_MAX_BYTES: largest size of a timeline file; recording
  // stops (with one warning) before an event would pass it. 0: no limit.
  std::size_t timeline_max_bytes = std::size_t{1} << 30;
  // GYRE_LOG_LEVEL: trace, debug, info, warning, error, fatal.
  LogLevel log_level = LogLevel::kWarning;
  // GYRE_STALL_WARNING_S: warn about tensors some ranks have not enqueued.
  double stall_warning_s = 60.0;
  // GYRE_STALL_SHUTDOWN_S: fail stalled operations after this; 0: never.
  // Finite by default: a rank that never enqueues a tensor (a user's code
  // path that differs between ranks) must not leave the others waiting
  // forever.
  double stall_shutdown_s = 600.0;
  // GYRE_OP_TIMEOUT_S: a transfer with no progress for this long aborts the
  // job (MPI_Abort) after logging who was waited for; 0: never.
  double op_timeout_s = 300.0;
  // GYRE_P2P_ON_COORDINATOR: 1 drives send_async/recv_async from the world
  // runtime's background loop (between its rounds) instead of a thread of
  // their own; kept to measure that choice (docs/architecture.md).
  long p2p_on_coordinator = 0;
  // GYRE_CALLER_ROUNDS: 1 lets a thread waiting in Handle::wait() (or wait_for()) run its
  // runtime's rounds itself when no other thread is (runtime/rounds.cc).
  long caller_rounds = 1;
  // GYRE_MAX_VERSION_LAG: largest difference of committed steps allowed
  // between the ranks taking part in one operation.
  long max_version_lag = 0;
  // Elastic training (docs/elastic.md), read by gyre::rebuild().
  // GYRE_ELASTIC_MIN_NP: the fewest ranks the job goes on with after a
  // rank's failure; fewer make rebuild() fail on every survivor.
  long elastic_min_np = 1;
  // GYRE_ELASTIC_MAX_NP: the most ranks GYRE_ELASTIC_RESPAWN grows the world
  // back to; 0: the job's size at start.
  long elastic_max_np = 0;
  // GYRE_ELASTIC_RESPAWN: 1 starts replacement ranks (MPI_Comm_spawn) in
  // rebuild(), up to GYRE_ELASTIC_MAX_NP.
  long elastic_respawn = 0;
  // GYRE_ELASTIC_HOST_DISCOVERY_SCRIPT: a command printing `host:slots`
  // lines, choosing where replacements start; empty: on the hosts of the
  // ranks that failed.
  std::string elastic_host_discovery_script;
  // GYRE_ELASTIC_RECOVERY_TIMEOUT_S: a survivor whose rebuild() has not
  // finished after this many seconds (blocked inside MPI's recovery calls)
  // logs where it was blocked and exits with status 1; 0: never.
  double elastic_recovery_timeout_s = 120.0;

  // Reads every GYRE_* variable of the table; throws InvalidArgument naming
  // a variable whose value does not parse or is out of range. init() checks
  // Options set in code against the same bounds.
  static Options from_env();
};

}  // namespace gyre
