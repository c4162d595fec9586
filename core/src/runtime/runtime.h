// Runtime: one rank's gyre instance: the queue, the background thread and
// everything it drives (negotiation, fusion, execution, timeline, stall
// inspection).
//
// The public API (operations.cc) holds one Runtime over an MPI transport;
// tests build several over LocalTransports, one per rank thread, in one
// process. User threads call enqueue(), request_join(), versions() and
// shutdown(); only the background thread touches the transport.
//
// The background loop: sleep until an enqueue (or join/shutdown request) or
// cycle_time_ms, then run one round: drain the queue, let the Negotiator
// agree on the responses with every rank, hand each response its local entry,
// let the Executor run them. A round is a collective, so every rank runs the
// same rounds; the loop ends in the round in which any rank's message carries
// the shutdown flag, on every rank alike.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backends/registry.h"
#include "execution/executor.h"
#include "gyre/collectives/counting_transport.h"
#include "gyre/collectives/shm_host.h"
#include "gyre/collectives/transport.h"
#include "gyre/options.h"
#include "negotiation/message.h"
#include "negotiation/negotiator.h"
#include "negotiation/version_vector.h"
#include "queue/tensor_queue.h"
#include "runtime/logging.h"
#include "runtime/p2p_engine.h"
#include "runtime/stall_inspector.h"
#include "runtime/timeline.h"

namespace gyre::core {

struct RuntimeInfo {
  int local_rank = 0;
  int local_size = 1;
  int cross_rank = 0;  // among the ranks with this local rank
  int cross_size = 1;
  // Called when the job cannot go on (a transfer timed out, the transport
  // failed): MpiWorld::abort for MPI. If it returns (tests), the runtime
  // fails every pending operation and stops.
  std::function<void(int code)> abort;
  // The host's shared-memory group when every rank is on one host and
  // GYRE_SHM is on (api/lifecycle.cc sets it up over MPI); host tensors then go over
  // shared memory instead of the transport.
  std::shared_ptr<transport::ShmHost> shm;
  // With `shm` a group per host (not the whole job): the transport among
  // the ranks with this local rank, for hierarchical allreduces.
  std::shared_ptr<transport::Transport> cross;
  // Why this rank cannot start, found before the Runtime was built (a
  // GYRE_* variable that does not parse); kNone: nothing. The start-up
  // agreement tells every rank, so init() fails everywhere at once.
  ErrorKind start_failure_kind = ErrorKind::kNone;
  std::string start_failure;
  // Sets up `shm` and `cross` (collective over MPI: api/lifecycle.cc), run by the
  // constructor only once the start-up agreement has succeeded on every
  // rank, so that no rank waits in that set-up for a rank whose init()
  // failed. Empty: `shm` and `cross` are used as given (tests).
  std::function<void(RuntimeInfo&)> connect_host;
  // Every rank's committed step at start: 0 for a new job, the step the
  // survivors agreed on for a runtime made by gyre::rebuild().
  std::uint64_t initial_step = 0;
  // Called about every 50 ms while the start-up agreement waits for the
  // other ranks, on the thread that builds the Runtime (init()); it may
  // throw to give up (the Python binding: Ctrl-C). Never called by the
  // background thread. Empty: none.
  std::function<void()> interrupt_check;
  // Called once by the background thread of the world's runtime when
  // another rank's shutdown() stops it (api/lifecycle.cc: the parameter
  // stores stop, so that calls waiting on a rank that is gone fail now, not
  // at their deadline). Empty: none.
  std::function<void()> on_peer_shutdown;
  // A process set's runtime: its id, which the errors of its stop name
  // ("process set 2 was removed"); 0: the world's runtime.
  int process_set = 0;
  // GYRE_P2P_ON_COORDINATOR=1: the point-to-point engine (Driver::kCaller)
  // this loop drives between its rounds and while it waits for work, and
  // stops when the loop ends. Null: the engine has its own thread.
  std::shared_ptr<P2pEngine> p2p;
};

// The deadline of the first contact between the ranks (the start-up
// agreement, the first round): GYRE_OP_TIMEOUT_S, but at least 60 s, since
// ranks may reach init() seconds apart; zero (forever) when it is 0.
std::chrono::milliseconds startup_deadline(const Options& opt);

class Runtime;

// The RoundDriver the runtime gives its operations (runtime/rounds.cc):
// `mu` is held by whichever thread runs a round, the background thread or a
// caller in Handle::wait(); `runtime` is null once the runtime has stopped.
class CallerRounds final : public RoundDriver {
 public:
  CallerRounds(Runtime* r, TensorQueue* q) : runtime(r), queue(q) {}
  void drive(const OpState& op) noexcept override;

  std::mutex mu;
  Runtime* runtime;  // guarded by mu
  // The runtime's queue, to wake its loop when a caller cannot complete
  // its operation itself; a mutex of its own, so that waking never waits
  // for a round.
  std::mutex wake_mu;
  TensorQueue* queue;  // guarded by wake_mu
  // Callers that could not complete their operation and left it to the
  // background thread (each nudges the queue; while the operation is open
  // the loop runs rounds even after callers ran some). A statistic.
  std::atomic<std::uint64_t> handoffs{0};
};

class Runtime {
 public:
  Runtime(const Options& opt, std::unique_ptr<transport::Transport> t, RuntimeInfo info);
  ~Runtime();  // shutdown() if not done
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return info_.local_rank; }
  int local_size() const { return info_.local_size; }
  int cross_rank() const { return info_.cross_rank; }
  int cross_size() const { return info_.cross_size; }
  const Options& options() const { return opt_; }
  const Logger& log() const { return log_; }
  // Per-operation deadlines (set_operation_timeout); any thread.
  StallInspector& stall_inspector() { return stall_; }

  TensorQueue& queue() { return queue_; }
  VersionVector& versions() { return vv_; }
  // A fresh name for an internal collective ("__gyre.barrier.3"): every
  // rank makes the same calls in the same order, so the names match.
  std::string internal_name(const char* what);

  // The CUDA device of this rank's CUDA tensors: the first call binds
  // `index` and returns it; later calls return the bound device (gyre's
  // NCCL communicator uses one GPU per rank). Any thread.
  int claim_cuda_device(int index);
  // A CUDA tensor of a call (`what`, naming it `which` in the message):
  // throws InvalidArgument unless this build has a backend for it, its
  // device exists, and it is the device this rank's earlier CUDA tensors
  // used (claim_cuda_device). Any thread.
  void check_cuda_tensor(const std::string& what, const char* which, const TensorView& t);

  // join(): this rank's next messages carry the joined flag until every
  // rank has joined; the returned state completes with the last rank.
  std::shared_ptr<OpState> request_join();

  // Asks the background loop to stop (it stops on every rank in the same
  // round), waits for it, fails what is still pending with StateError.
  void shutdown();

  // Horovod's start_timeline / stop_timeline: see Timeline::start (a path
  // with "{rank}" gives every rank a file; without it rank 0 records). Any
  // thread, while the runtime runs.
  void start_timeline(const std::string& path, bool mark_cycles);
  void stop_timeline();

  // The shared-memory group of this rank's host (nullptr without one): its
  // pool serves gyre::alloc_shared. Any thread; fixed once constructed.
  const std::shared_ptr<transport::ShmHost>& shm_host() const { return info_.shm; }

  // Statistics for tests and benchmarks (background-thread counters).
  std::uint64_t rounds() const { return rounds_.load(); }
  // Of them, those run by a thread waiting in Handle::wait() (rounds.cc).
  std::uint64_t caller_rounds() const { return caller_rounds_run_.load(); }
  // Times the background thread held back from a round to leave it to a
  // caller about to wait (the grace in Runtime::loop).
  std::uint64_t caller_graces() const { return caller_graces_.load(); }
  // Times the background thread woke to find that callers were running
  // the rounds (one running now, or some run meanwhile that left it
  // nothing) and went back to sleep without a round of its own
  // (Runtime::loop).
  std::uint64_t rounds_left_to_callers() const { return rounds_left_to_callers_.load(); }
  // Operations waiting callers handed over to the background thread.
  std::uint64_t caller_handoffs() const { return callers_->handoffs.load(); }
  // Whether this rank reduces small cached allreduces within the
  // negotiation round (GYRE_SPECULATE_BYTES and the layout: runtime.cc).
  bool speculation() const { return speculation_; }
  // The negotiation's counters as of the last round this rank completed,
  // read together: the messages of a round still in progress are not in
  // them, so messages and rounds agree with each other (each counter read
  // alone may be part-way through a round).
  struct NegotiationCounters {
    std::uint64_t rounds = 0;
    std::uint64_t requests_sent = 0;
    std::uint64_t cache_hits_sent = 0;
    std::uint64_t log_depth_rounds = 0;
    std::uint64_t speculated = 0;
    std::uint64_t messages = 0;
  };
  NegotiationCounters negotiation_counters() const;
  // Hosts of the two-tier log-depth rounds (0: not tiered). Any thread.
  int negotiation_tier_hosts() const { return negotiator_.tier_hosts(); }
  const char* host_backend() const { return backends_.host_backend(); }
  // The host backend's cost-model parameters and their source (set at
  // start-up, read-only after): any thread.
  const LayoutCost& link_cost() const { return backends_.host_layout_cost(); }
  const std::string& link_source() const { return backends_.link_source(); }
  std::vector<TunedAllreduce> tuned_allreduces() const { return backends_.tuned_allreduces(); }
  int fusion_allocations() const { return backends_.host_fusion_buffer().allocations(); }
  // Messages and bytes this rank sent over its transports: negotiation, the
  // collectives' data, and the hierarchical allreduce's cross-host
  // transport (shared memory is not a transport and not counted).
  std::uint64_t transport_messages() const;
  std::uint64_t transport_bytes() const;

 private:
  void loop();
  // The wait between rounds: queue_.wait_for_work(), or with info_.p2p,
  // serving the engine until a round is due (work, or `timeout` passed).
  void wait_for_work(std::chrono::microseconds timeout, std::chrono::microseconds spin);
  std::chrono::microseconds spin_time() const;
  // The start-up agreement, the first exchange between the ranks: each
  // rank's local failure (start_failure, a timeline file that cannot be
  // created) and its options travel in one allgather. Throws on every rank
  // alike: the failing ranks' error with their numbers and reasons, or
  // InvalidArgument when the options that every rank must share differ or
  // any rank's option is out of range (see runtime.cc and options_table.h).
  void agree_at_start(ErrorKind failure_kind, const std::string& failure);
  bool round();  // false: leave the loop
  // rounds.cc: rounds on a caller's thread (callers_->mu held) while `op`
  // is not done; whether callers may run them at all (GYRE_CALLER_ROUNDS).
  friend class CallerRounds;
  void drive_for(const OpState& op);
  bool callers_may_run_rounds() const;
  // Whether a waiting caller may run a round now: callers_may_run_rounds()
  // held after the first round, and this rank has used no CUDA tensor.
  // Under callers_->mu or on the background thread.
  bool callers_run_rounds_now() const;
  // A VERSION_LAG counter event when the version vector changed (timeline on).
  void record_versions();
  void fail_all(ErrorKind kind, const std::string& why);
  void fatal(const std::exception& e);

  Options opt_;
  std::unique_ptr<transport::Transport> t_;
  // t_ as the executor uses it, counting the data it sends.
  transport::CountingTransport data_t_;
  RuntimeInfo info_;
  int rank_, size_;
  Logger log_;
  TensorQueue queue_;
  VersionVector vv_;
  // The version vector the timeline last recorded (background thread).
  std::vector<std::uint64_t> timeline_versions_;
  Negotiator negotiator_;
  StallInspector stall_;
  Timeline timeline_;
  // The backends the executor runs on; the host's is chosen from the host
  // layout once the start-up agreement has succeeded.
  BackendRegistry backends_;
  Executor executor_;

  std::atomic<bool> shutdown_requested_{false};
  std::atomic<bool> join_requested_{false};
  // Guards join_state_ and shutdown_done_.
  std::mutex mu_;
  std::shared_ptr<OpState> join_state_;
  bool shutdown_done_ = false;

  std::vector<std::string> stall_failures_;  // background thread: for the next message
  // Background thread: what it is doing, for the message of a fatal error.
  // Kept as its parts and formatted only then (phase()): every round sets
  // it, and formatting cost each round about a fifth of a small
  // allreduce's instructions on this thread.
  struct Phase {
    std::uint64_t round = 0;
    std::size_t responses = 0;  // 0: negotiating
    std::string first;          // the first response's name
  } phase_;
  std::string phase() const;
  bool last_round_idle_ = false;             // background thread: see loop()
  bool last_round_ran_ = false;              // background thread: it ran responses
  std::atomic<bool> stopped_{false};         // the background loop has ended
  std::atomic<std::uint64_t> rounds_{0};
  mutable std::mutex counters_mu_;  // guards counters_
  NegotiationCounters counters_;    // published at the end of each round
  std::atomic<std::uint64_t> internal_seq_{0};
  std::atomic<int> cuda_device_{-1};         // claim_cuda_device(); -1: none yet
  bool speculation_ = false;                 // set before the thread starts
  // info_.cross wrapped to count its traffic; set before the thread starts.
  std::shared_ptr<transport::CountingTransport> cross_counted_;
  // Rounds run by a waiting caller (rounds.cc); the fields below it are
  // guarded by callers_->mu.
  std::shared_ptr<CallerRounds> callers_ = std::make_shared<CallerRounds>(this, &queue_);
  bool rounds_finished_ = false;     // the last round was run (shutdown, fatal error)
  bool callers_run_rounds_ = false;  // after the first round, if callers may
  std::atomic<std::uint64_t> caller_rounds_run_{0};  // rounds run by waiting callers
  std::chrono::microseconds caller_grace_{0};        // background thread only
  std::atomic<std::uint64_t> caller_graces_{0};      // graces given (loop)
  std::atomic<std::uint64_t> rounds_left_to_callers_{0};  // see rounds_left_to_callers()
  std::thread thread_;
};

}  // namespace gyre::core
