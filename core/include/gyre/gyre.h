// The public C++ API of gyre: what a training job includes.
//
// Threads: every function here may be called from any user thread once
// init() has returned. Operations are executed by one background thread per
// rank; *_async calls validate their arguments on the caller's thread, enqueue
// the request and return a Handle at once.
//
// Buffers: the caller owns every buffer passed in a TensorView and must keep
// it alive and unchanged until the operation's handle completes.
//
// Names: every rank calls an operation under the same name (scoped by
// process set). On one rank a name is in use from the call until the
// operation has completed and either its Handle has seen that (wait()
// returned, or poll() returned true) or this rank has enqueued another
// operation on the set since. A call of a name in use throws
// InvalidArgument on this rank alone; it is not announced, so the
// operation holding the name stays valid everywhere. Two calls of a name
// with neither a wait nor another operation between them are therefore
// refused every time, however soon the first one completed.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gyre/error.h"
#include "gyre/options.h"
#include "gyre/sizes.h"
#include "gyre/types.h"

namespace gyre {

// A non-owning view of a dense, row-major tensor.
struct TensorView {
  void* data = nullptr;
  DataType dtype = DataType::kFloat32;
  std::vector<std::int64_t> shape;
  Device device{};
  // Why the caller could not describe its tensor, as a clause naming it
  // ("input has unsupported dtype int16"); empty when it could. A binding
  // sets it instead of throwing, so that the operation is refused here like
  // any other bad argument: on this rank, and announced to the other ranks,
  // whose matching operation then fails at once instead of waiting.
  std::string refusal{};

  std::int64_t numel() const { return gyre::numel(shape); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }
};

// A tensor whose storage gyre allocated: the result of collectives whose
// output size is known only after negotiation (allgather, alltoall,
// reducescatter).
struct OwnedTensor {
  std::vector<std::byte> data;
  DataType dtype = DataType::kFloat32;
  std::vector<std::int64_t> shape;
};

namespace core { struct OpState; }
struct FingerprintMismatch;

// The completion of one enqueued operation. Copies share the same state.
class Handle {
 public:
  Handle() = default;
  explicit Handle(std::shared_ptr<core::OpState> s) : state_(std::move(s)) {}

  // Blocks until the operation completes; rethrows its error if it failed.
  // Either way its name is free again (see Names above).
  void wait() const;
  // Waits at most `timeout` for the operation to complete (running rounds on
  // this thread as wait() does); true once it has. It never throws the
  // operation's error: wait() or poll() reports it. For a caller that must
  // wake now and then while it waits (a signal check, a deadline).
  bool wait_for(std::chrono::nanoseconds timeout) const;
  // True once the operation has completed (successfully or not); its name
  // is then free again.
  bool poll() const;
  // Registers `fn`, called once on completion with nullptr on success or the
  // operation's exception. Called on the thread that ran the round which
  // completed it (the background thread, or a thread waiting in wait():
  // GYRE_CALLER_ROUNDS), or at once on this thread if already complete. It
  // must not block on other handles; an exception it throws is reported on
  // stderr and otherwise ignored.
  void on_complete(std::function<void(std::exception_ptr)> fn) const;
  // The runtime-allocated output (allgather, alltoall, reducescatter); valid
  // after wait() returns.
  const OwnedTensor& output() const;
  // Rows this rank received from each rank (alltoall); valid after wait().
  const std::vector<std::int64_t>& received_splits() const;
  // The last rank to join (join_async); valid after wait().
  int join_last_rank() const;
  // The buffers that differ (fingerprint_check_async); valid after wait().
  const std::vector<FingerprintMismatch>& mismatches() const;
  // The world rank a recv_async received from (the one that matched
  // kAnySource), or a send_async's destination; valid after wait().
  int source_rank() const;

  bool valid() const { return state_ != nullptr; }

 private:
  std::shared_ptr<core::OpState> state_;
};

// Lifecycle. init() initialises MPI if the job has not (with
// MPI_THREAD_MULTIPLE when available, else MPI_THREAD_SERIALIZED) and starts
// the background thread. init() may be called any number of times: while
// gyre runs, later calls do nothing (Horovod's semantics). Anything below
// before init(), and shutdown() when gyre is not running, throws StateError.
// shutdown() fails pending operations with
// StateError, on this rank and (through the next negotiation round) on
// every other rank, whose runtimes stop in the same round. MPI, if init()
// initialised it, is finalised at process exit, so that init() may be
// called again after shutdown().
// Every rank's set-up is agreed at the end of init(): if it fails on any
// rank (a GYRE_* variable that does not parse, a timeline file that cannot
// be created, options that must agree but differ), init() throws on every
// rank alike, at once, naming the failing ranks and their reasons.
// init() reads the options from the environment (Options::from_env()).
void init();
void init(const Options& options);
// Horovod's init(comm): gyre runs on `ranks` of MPI_COMM_WORLD alone, in
// that order (ranks[i] becomes rank i; size() is ranks.size(); local and
// cross ranks are counted among them). Called by exactly those ranks, with
// the same list; MPI_Comm_create_group makes their communicator, so the
// other ranks take no part and may do anything else (they may run their
// own gyre on a disjoint list), once they have initialised MPI (Open MPI's
// MPI_Init waits for every process of the job). On a process not in the
// list, or for ranks out of range or repeated, InvalidArgument at once (MPI
// is initialised, nothing else). All ranks in order is the same as init().
// While gyre runs, the same list does nothing and another list throws
// InvalidArgument. After shutdown(), init() without ranks runs on every
// rank again (every rank of MPI_COMM_WORLD calls it). Not with fault
// tolerance on (ULFM) nor after the world was rebuilt: StateError. The
// first form reads the options from the environment.
void init(const std::vector<int>& ranks);
void init(const Options& options, const std::vector<int>& ranks);
// `check` is called about every 50 ms on the thread in init() while init()
// waits for the other ranks (up to the start-up deadline: GYRE_OP_TIMEOUT_S,
// at least 60 s); an exception it throws ends init() on this rank with that
// exception. For bindings that let Ctrl-C interrupt init() (the Python
// package). What was left pending is resumed by the next init(), so the
// ranks still pair up once all of them call it. Empty: none.
void set_init_interrupt_check(std::function<void()> check);
void shutdown();
bool is_initialized();
int rank();
int size();
int local_rank();  // rank among the ranks on this host
int local_size();
// Among the ranks with this rank's local rank, one per host that has that
// many ranks, ordered by rank: taken from where the launcher placed the
// ranks (MPI_COMM_TYPE_SHARED), not assumed from a regular layout.
int cross_rank();
int cross_size();
// Whether this build takes CUDA tensors (the NCCL backend). Any time, also
// before init().
bool nccl_built();

// Process sets (Horovod's): a sorted list of world ranks whose members run
// collectives among themselves, with their own negotiation, fusion, response
// cache and background thread, so that collectives on different sets run
// concurrently. Id 0 (kGlobalProcessSet) is every rank. Every collective
// below takes the id of the set it runs on (default: the global set); names
// are scoped by set (the same name may be pending on two sets). A rank
// outside the set gets InvalidArgument at the call. Within a set, roots
// (broadcast) are world ranks, as in Horovod; splits (alltoall) and blocks
// (reducescatter) follow the set's ranks in order; ranks named in the
// errors of a set's operations are ranks within the set.
constexpr int kGlobalProcessSet = 0;
// Collective over every rank of the job: every rank calls add and remove
// with the same arguments in the same order (checked; InvalidArgument on
// every rank otherwise). Returns the new set's id. Needs MPI at
// MPI_THREAD_MULTIPLE. remove_process_set fails the set's pending
// operations with StateError on every member as soon as one member calls
// it (so a member waiting on the set is released to call it too); the
// global set cannot be removed.
int add_process_set(const std::vector<int>& ranks);
// The same made by the set's members alone (ranks outside never call it),
// in the same order on every member: torch's new_group on a subgroup's
// members. A member that does not call it within `timeout_s` (<= 0: 300 s),
// or calls it for other ranks, makes it fail on every member that did
// (TimeoutError / InvalidArgument naming them). Only the members know the
// set: remove_process_set on it is theirs alone too. Two such sets of the
// same ranks are two sets.
int add_process_set_of_members(const std::vector<int>& ranks, double timeout_s = 0);
void remove_process_set(int process_set);
std::vector<int> process_set_ids();              // 0 first, then the added sets
std::vector<int> process_set_ranks(int process_set);
int process_set_rank(int process_set);           // this rank's index; -1 outside
int process_set_size(int process_set);
bool process_set_included(int process_set);
// Operations on `process_set` whose names start with `name_prefix` fail
// with TimeoutError on every member after `seconds` stalled (some member
// never enqueued them), instead of GYRE_STALL_SHUTDOWN_S (never later than
// it); seconds <= 0 removes the prefix's timeout. Call it on every member
// (the set's rank 0 decides). torch.distributed's group timeout.
void set_operation_timeout(int process_set, const std::string& name_prefix, double seconds);

// Elastic training (docs/elastic.md). elastic_supported(): this build has
// ULFM (its MPI's mpi-ext.h declares it); any time. elastic_enabled(): and
// the job runs with fault tolerance on (`mpirun --with-ft ulfm`); any time.
// Only then does a rank's death fail the survivors' operations with
// RankFailedError instead of ending the job.
bool elastic_supported();
bool elastic_enabled();

// What rebuild() agreed, the same on every survivor.
struct RebuildInfo {
  int rank = 0, size = 1;     // this rank and the job's size from now on
  std::uint64_t step = 0;     // the last step every survivor committed
  int root = 0;               // lowest rank (new numbering) whose own commit is `step`
  std::vector<int> lost;      // ranks (old numbering) that failed
  std::vector<int> previous_ranks;  // [r]: rank r's rank before
  int attempts = 1;           // above 1: ranks also failed during the recovery
  double seconds = 0.0;       // time this rank spent in rebuild()
  int spawned = 0;            // replacement ranks started (GYRE_ELASTIC_RESPAWN): the last ones
  int rebuilds = 1;           // rebuilds of the world so far, this one included
};
// After a RankFailedError, on every surviving rank: stops this rank's
// runtime, shrinks the world to the survivors (ULFM), agrees on the last
// step every survivor committed (the version vectors: a survivor may be one
// commit ahead of another, never behind the agreed step), and starts a new
// runtime on the survivors with fresh ranks, local ranks, ring, response
// cache and per-name sequence numbers, every rank's committed_steps() set
// to `step`. The caller rolls its state back to its commit of `step` (a
// rank one commit ahead takes `root`'s by broadcast). A further failure
// during the recovery shrinks again. Calls of the API from other threads
// wait until it returns. Throws StateError without ULFM or with fault
// tolerance off at run time, saying how to get it.
//
// Bounds (docs/elastic.md): with GYRE_ELASTIC_RESPAWN=1 it first starts
// replacement ranks (MPI_Comm_spawn, same program and arguments) up to
// GYRE_ELASTIC_MAX_NP (default: the size at start), numbered after the
// survivors (previous_ranks -1); they join in their init() and take the
// agreed commit from `root`. Then, with fewer ranks than
// GYRE_ELASTIC_MIN_NP, it throws StateError on every survivor naming the
// count and the bound: the job cannot go on.
RebuildInfo rebuild();

// On a process started by a rebuild() to replace failed ranks (it finds
// the survivors in init()): true, and what that rebuild agreed: `step`,
// `root` (the rank to take the committed state from, e.g. State::sync),
// `rank`, `size`, `spawned`, `rebuilds`. elastic::run uses it. Any time
// after init(); replacement_info() throws StateError on other processes.
bool is_replacement();
RebuildInfo replacement_info();

// The program and arguments rebuild() starts replacements with; by default
// this process's own command line (/proc/self/cmdline). Any time.
void set_respawn_command(const std::vector<std::string>& argv);

// out may be the same view as in (in-place). Average divides by the number of
// ranks that contributed (joined ranks excluded). Integer average and
// pre/postscale truncate toward zero, as Horovod's do; bool reduces as
// logical or/and; Adasum: floating CPU tensors, a power-of-two number of
// ranks (types.h has the rules).
Handle allreduce_async(const std::string& name, const TensorView& in, const TensorView& out,
                       ReduceOp op = ReduceOp::kAverage, double prescale = 1.0,
                       double postscale = 1.0, int process_set = kGlobalProcessSet);
// The blocking form: allreduce_async(...).wait(), under a WaitFollows.
void allreduce(const std::string& name, const TensorView& in, const TensorView& out,
               ReduceOp op = ReduceOp::kAverage, double prescale = 1.0, double postscale = 1.0,
               int process_set = kGlobalProcessSet);
// A promise by the calling thread, for as long as this lives on it: it
// waits (Handle::wait() or wait_for()) for each operation it starts, at
// once. Its operations then do not wake gyre's background thread: the
// waiting thread runs the negotiation round itself, or wakes the
// background thread if it cannot. Waking a sleeping thread is a futex wake
// and, with more ranks than cores, a core taken from the ranks' own
// threads: a quarter of a small allreduce's time at 4 ranks on 2 cores
// (docs/benchmarks.md). The blocking calls (allreduce, barrier, and the
// Python package's blocking allreduces) make one. An operation not waited
// for still completes, at the background thread's next timed round (within
// 16 ms). Nests.
class WaitFollows {
 public:
  WaitFollows();
  ~WaitFollows();
  WaitFollows(const WaitFollows&) = delete;
  WaitFollows& operator=(const WaitFollows&) = delete;

 private:
  bool outer_;
};
// Reduced together and completed together: one handle for the group.
Handle grouped_allreduce_async(const std::vector<std::string>& names,
                               const std::vector<TensorView>& ins,
                               const std::vector<TensorView>& outs,
                               ReduceOp op = ReduceOp::kAverage, double prescale = 1.0,
                               double postscale = 1.0, int process_set = kGlobalProcessSet);
// Concatenates along the first dimension; ranks may differ in that dimension
// only. Output in Handle::output().
Handle allgather_async(const std::string& name, const TensorView& in,
                       int process_set = kGlobalProcessSet);
// In place: root's contents are copied into every rank's buffer. `root` is
// a world rank (in the set).
Handle broadcast_async(const std::string& name, const TensorView& buf, int root,
                       int process_set = kGlobalProcessSet);
// splits[p] rows of `in` (first dimension) go to rank p; empty splits: an
// even split. Output in Handle::output(), rows per source in received_splits().
Handle alltoall_async(const std::string& name, const TensorView& in,
                      const std::vector<std::int64_t>& splits = {},
                      int process_set = kGlobalProcessSet);
// Reduces across ranks, then rank r keeps block r of the first dimension
// (earlier ranks take one extra row when it does not divide evenly).
Handle reducescatter_async(const std::string& name, const TensorView& in,
                           ReduceOp op = ReduceOp::kAverage, double prescale = 1.0,
                           double postscale = 1.0, int process_set = kGlobalProcessSet);

void barrier(int process_set = kGlobalProcessSet);
// This rank has no more data: it takes part in others' allreduces with zeros
// until every rank (of the set) has joined. Returns the last rank to join
// (a world rank).
int join(int process_set = kGlobalProcessSet);
// barrier() and join() as operations: each returns at once, and its
// Handle's wait() returns when the blocking call would have (rethrowing its
// error). For callers that wait in their own way: the Python package waits
// in slices, so that Ctrl-C interrupts it. An operation whose waiter gave up
// stays in flight. join_async(): Handle::join_last_rank() after wait() is
// the last rank to join counted in the set (process_set_ranks() gives its
// world rank).
Handle barrier_async(int process_set = kGlobalProcessSet);
Handle join_async(int process_set = kGlobalProcessSet);

// Point-to-point: one rank's tensor to another rank of a process set, as
// torch.distributed's send/recv. `peer` and the returned source are world
// ranks (as every root of gyre's API), both in `process_set`; this rank must
// be in it too (else InvalidArgument at the call). A send pairs with the
// oldest pending recv on the peer with the same process set and tag (and
// source, or kAnySource), in the order each rank posted them, as MPI's
// matching does. CPU tensors only. The element count and dtype of a send
// and its recv must agree (shapes may differ): otherwise both fail with
// MismatchError naming both, and nothing is written into the recv's
// buffer. They run on a communicator of their own (made at init(); needs
// MPI at MPI_THREAD_MULTIPLE), beside the collectives, never paired with
// them. A send or recv whose peer does not come fails with TimeoutError
// naming it after GYRE_STALL_SHUTDOWN_S; a peer's death under ULFM is
// RankFailedError. The buffer must stay alive until the handle completes;
// a send whose receiver came but whose data could not leave before its
// deadline leaves the buffer to MPI (the job should stop). A send refused
// at the call is announced to `dst`, whose recv that would have taken it
// fails with the reason (InvalidArgument).
constexpr int kAnySource = -1;
Handle send_async(const TensorView& t, int dst, std::int64_t tag = 0,
                  int process_set = kGlobalProcessSet);
Handle recv_async(const TensorView& t, int src, std::int64_t tag = 0,
                  int process_set = kGlobalProcessSet);

// Horovod's timeline at run time: records this rank's operations as a
// Chrome trace (chrome://tracing, Perfetto) in `path` from now until
// stop_timeline() or shutdown(). "{rank}" in `path` gives each rank its own
// file; without it only rank 0 writes (as GYRE_TIMELINE). mark_cycles adds
// an instant event per negotiation round. Starting again switches files.
// Throws InvalidArgument if the file cannot be created.
void start_timeline(const std::string& path, bool mark_cycles = false);
// Ends the recording (the file is complete JSON); nothing if none runs.
void stop_timeline();

// Counters of this rank's runtime since init(), for tests and benchmarks.
// Each valid request this rank negotiates is sent either in full or, when it
// repeats the previous request of its name unchanged, as one response-cache
// bit: the hit rate is cache_hits_sent / (requests_sent + cache_hits_sent).
// A round in which every rank's requests are cache hits at one step is
// decided by a log-depth exchange alone (log_depth_rounds; docs/scaling.md):
// ceil(log2 n) messages from this rank instead of the ring allgather's n - 1
// or more; negotiation_messages counts both kinds (global set only). These
// five are as of the last round this rank completed, read together, so they
// agree with each other; a round in progress is not in them.
//
// The version vector (the global set's) and, per rank, how many committed
// steps it is behind the most advanced one; and the parameter stores' push
// outcomes, summed over every store this process made (gyre/store.h; each
// store's own are its stats()).
struct RuntimeStats {
  std::uint64_t rounds = 0;           // negotiation rounds run
  std::uint64_t requests_sent = 0;    // requests sent in full
  std::uint64_t cache_hits_sent = 0;  // requests sent as a cache bit
  std::uint64_t log_depth_rounds = 0;      // rounds decided in log depth
  // Allreduces reduced within a log-depth round (GYRE_SPECULATE_BYTES): no
  // collective ran for them after the round.
  std::uint64_t speculated_allreduces = 0;
  // Whether this job reduces them so: where the round gives the bits the
  // backend's own allreduce would (2 ranks; a power of two of ranks on the
  // flat transport; one host over shared memory; docs/architecture.md).
  bool speculation = false;
  std::uint64_t negotiation_messages = 0;  // messages this rank sent negotiating
  // Of `rounds`, those run by a thread waiting in Handle::wait() instead of
  // the background thread (GYRE_CALLER_ROUNDS).
  std::uint64_t caller_rounds = 0;
  // The background thread's wake-ups that found callers running the rounds
  // (one running now, or some run meanwhile that left nothing open on this
  // rank) and slept on without a round of its own; and the operations
  // waiting callers handed over to it (a caller that could not complete
  // its operation in its own rounds).
  std::uint64_t rounds_left_to_callers = 0;
  std::uint64_t caller_handoffs = 0;
  // Across hosts of several ranks each (GYRE_HOST_NEGOTIATION=1): the
  // hosts a log-depth round is combined over, by local rank 0 of each
  // (ceil(log2 hosts) messages; the other local ranks send none); 0 when
  // rounds are not tiered (ceil(log2 ranks) messages from every rank).
  int negotiation_tier_hosts = 0;
  // Everything this rank's runtime sent over its transports (MPI): the
  // negotiation, the collectives' data and, across hosts, the hierarchical
  // allreduce's network phase. Shared memory within a host is not counted:
  // on simulated or real hosts these are the bytes this rank put on the
  // network (plus those to ranks of its own host when it runs without
  // shared memory). Global set only; point-to-point and stores not included.
  std::uint64_t transport_messages = 0;
  std::uint64_t transport_bytes = 0;
  std::vector<std::uint64_t> versions;  // version_vector()
  std::vector<std::uint64_t> behind;    // max(versions) - versions[r]
  std::int64_t store_pushes = 0;        // shard pushes by this process
  std::int64_t store_pushes_applied = 0;
  std::int64_t store_pushes_rejected = 0;
  std::int64_t store_pushes_scaled = 0;  // applied with a factor below 1
  std::int64_t store_max_lag = 0;        // largest lag among them
  // Allreduces of buffers from alloc_shared reduced straight from one
  // another (GYRE_SHM_POOL_BYTES), global set only.
  std::uint64_t pool_allreduces = 0;
  // The parameters the cost model chooses the host allreduce's algorithm
  // with (docs/scaling.md), the same on every rank: "built-in", or, across
  // hosts of several ranks each or of one rank each with GYRE_LINK_PROBE=1
  // (there the network alone: shared memory stays built in), "probed" at
  // start-up or "cached" (GYRE_LINK_PROBE_CACHE). Network: per message and
  // per host link; shared memory: one pass over a buffer.
  std::string link_source;
  double net_alpha_s = 0, net_bytes_per_s = 0;
  double shm_alpha_s = 0, shm_bytes_per_s = 0;
  // GYRE_AUTOTUNE's choices so far, one per size class decided, in the
  // order decided, the same on every rank: the slowest rank's mean seconds
  // per MiB of each form over its trials, and the form chosen beside the
  // cost model's.
  struct TunedAllreduce {
    std::size_t min_bytes = 0;  // buffers of [min_bytes, 2 * min_bytes)
    int trials = 0;             // timed calls of each form
    double flat_s_per_mib = 0;
    double hierarchical_s_per_mib = 0;
    bool model_hierarchical = false;
    bool hierarchical = false;
  };
  std::vector<TunedAllreduce> autotune;
};
RuntimeStats runtime_stats();

// Host memory every rank of this host maps, from this rank's part of the
// host's pool (GYRE_SHM_POOL_BYTES bytes per rank, set up by init() when all
// ranks are on one host and share memory): `bytes` (rounded up to 64) at a
// 64-byte boundary, or nullptr when the pool has no free range that large,
// or there is no pool. Any thread, not collective. An allreduce in place of
// a buffer from here, of 64 KiB or more, on every rank of the global set
// (each its own buffer) reduces the buffers straight from one another: no
// copy through the shared-memory slots (docs/architecture.md, "Shared
// buffers"); any other use of the memory is ordinary host memory. It stays
// mapped until free_shared() gives it back, shutdown() or not
// (InvalidArgument for a pointer alloc_shared did not return).
void* alloc_shared(std::size_t bytes);
void free_shared(void* p);
// Whether [p, p + bytes) lies in a part of a host pool that alloc_shared
// has buffers out from (any thread).
bool is_shared(const void* p, std::size_t bytes);

// Version vectors: see docs/architecture.md.
void commit_step();                        // this rank finished one training step
std::uint64_t committed_steps();           // this rank's own count
std::vector<std::uint64_t> version_vector();  // this rank's view of all ranks

struct NamedBuffer {
  std::string name;
  TensorView tensor;
};

struct FingerprintMismatch {
  std::string name;
  // digest -> ranks holding that value, in ascending digest order.
  std::vector<std::pair<std::uint64_t, std::vector<int>>> groups;
};

// Hashes every buffer on every rank and compares the digests. Returns the
// buffers that differ (empty: all agree). Collective: every rank passes the
// same names in the same order.
std::vector<FingerprintMismatch> fingerprint_check(const std::vector<NamedBuffer>& buffers);
// As an operation (see barrier_async): Handle::mismatches() after wait().
Handle fingerprint_check_async(const std::vector<NamedBuffer>& buffers);

enum class ResyncPolicy {
  kNewest,   // broadcast from the rank with the highest step (ties: lowest rank)
  kAverage,  // average across ranks ("merge")
};
// Repairs `buffers` and sets every rank's committed step to the agreed one.
void resync(const std::vector<NamedBuffer>& buffers, ResyncPolicy policy);
// As an operation (see barrier_async); the buffers must stay alive and
// untouched until the Handle completes, even if its waiter gives up.
Handle resync_async(const std::vector<NamedBuffer>& buffers, ResyncPolicy policy);

}  // namespace gyre
