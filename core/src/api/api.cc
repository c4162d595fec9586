// The public API of gyre.h: the process's one Runtime (over MPI), its
// lifecycle, and forwarding to the operations of operations.h.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>

#include <pthread.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "gyre/collectives/mpi_transport.h"
#include "gyre/collectives/shm_host.h"
#include "gyre/gyre.h"
#include "gyre/collectives/mpi_p2p.h"
#include "store/parameter_store.h"
#include "api/operations.h"
#include "api/point_to_point.h"
#include "api/process_sets.h"
#include "runtime/process_set_table.h"
#include "store/store_totals.h"
#include "runtime/runtime.h"

namespace gyre {

namespace {

// Guards g_runtime (the pointer; the Runtime synchronises itself). User
// calls copy the shared_ptr, so a concurrent shutdown() cannot destroy the
// runtime under them.
std::mutex g_mu;
std::shared_ptr<core::Runtime> g_runtime;
// The point-to-point engine beside g_runtime (guarded by g_mu); null when
// MPI does not run at MPI_THREAD_MULTIPLE.
std::shared_ptr<core::P2pEngine> g_p2p;
bool g_atexit_registered = false;
// Set in the child of a fork() (see after_fork_in_child); guarded by g_mu.
bool g_forked_child = false;
// set_init_interrupt_check(); guarded by g_mu.
std::function<void()> g_init_interrupt_check;

// fork() copies only the calling thread. The child of a process running
// gyre has the Runtime object but not its background thread, and MPI's state
// but not the right to use it (its connections belong to the parent). So
// the child forgets both: it is a process in which gyre is not initialised
// (calls throw StateError, init() refuses), and its exit neither joins a
// thread it does not have nor finalises the parent's MPI. g_mu is held
// across fork() (pthread_atfork's prepare), so the child's copy is never
// left locked by a thread that does not exist there.
void before_fork() { g_mu.lock(); }
void after_fork_in_parent() { g_mu.unlock(); }
void after_fork_in_child() {
  g_forked_child = true;
  // Deliberately leaked: destroying it would join the missing thread and
  // free MPI objects that are the parent's.
  if (g_runtime) new std::shared_ptr<core::Runtime>(std::move(g_runtime));
  if (g_p2p) new std::shared_ptr<core::P2pEngine>(std::move(g_p2p));
  transport::MpiWorld::instance().forget_after_fork();
  g_mu.unlock();
}
// Between a rebuild() that stopped the old runtime and the new one running
// (a failure in between makes the next rebuild() start again from here).
struct PendingRebuild {
  Options options;
  std::uint64_t own_step = 0;
};
std::optional<PendingRebuild> g_rebuild;
// A replacement rank (MpiWorld::join_record) started its first runtime;
// guarded by g_mu.
bool g_replacement_started = false;

std::shared_ptr<core::Runtime> runtime(const char* call) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_runtime) {
    throw StateError(fmt::format("gyre::{}: gyre is not initialised ({})", call,
                                 g_forked_child
                                     ? "this process is the child of a fork() of a process "
                                       "running gyre, and gyre cannot run in it"
                                     : "call gyre::init() first"));
  }
  return g_runtime;
}

// The process sets of the running runtime (emptied at shutdown); it guards
// itself. g_sets_change_mu serialises add/remove on this rank: each is one
// agreement with the other ranks, which pair the calls by their order.
core::ProcessSetTable g_sets;
std::mutex g_sets_change_mu;

// The runtime serving `process_set` for this rank (InvalidArgument when the
// set is unknown or this rank is not in it).
std::shared_ptr<core::Runtime> runtime_for(const char* call, int process_set) {
  auto world = runtime(call);
  if (process_set == kGlobalProcessSet) return world;
  return g_sets.runtime_of(call, process_set, world->rank());
}

std::vector<int> ranks_of(const char* call, int process_set) {
  auto world = runtime(call);
  if (process_set == kGlobalProcessSet) {
    std::vector<int> all(static_cast<std::size_t>(world->size()));
    for (int r = 0; r < world->size(); ++r) all[static_cast<std::size_t>(r)] = r;
    return all;
  }
  auto e = g_sets.find(process_set);
  if (!e) {
    if (std::string dropped = g_sets.dropped_error(call, process_set); !dropped.empty()) {
      throw StateError(dropped);
    }
    throw InvalidArgument(fmt::format("{}: no process set has id {}", call, process_set));
  }
  return e->ranks;
}

// The point-to-point engine over a new duplicate of the world (collective:
// every rank calls it once its runtime has started); null without
// MPI_THREAD_MULTIPLE, where point-to-point calls are refused.
std::shared_ptr<core::P2pEngine> start_p2p(const Options& options) {
  auto& world = transport::MpiWorld::instance();
  // Not with fault tolerance on (ULFM): the engine's shutdown and its
  // communicator's duplication have not been made safe against a dead rank
  // (a survivor's rebuild() could then stall), so point-to-point is refused.
  if (!world.thread_multiple() || world.fault_tolerant()) return nullptr;
  return std::make_shared<core::P2pEngine>(transport::MpiP2pChannel::create(),
                                           options.stall_shutdown_s);
}

// Why point-to-point calls are refused when there is no engine.
std::string p2p_unavailable(const char* call) {
  if (transport::MpiWorld::instance().fault_tolerant()) {
    return fmt::format("{}: point-to-point operations are not available with fault tolerance "
                       "on (ULFM, mpirun --with-ft ulfm): not yet made safe against a failed "
                       "rank", call);
  }
  return fmt::format("{}: point-to-point operations need MPI at MPI_THREAD_MULTIPLE; this MPI "
                     "offers less", call);
}

// Stops the point-to-point engine, the process sets' runtimes, then the
// world's. For a rebuild the sets' ids stay known as dropped (operations on
// them then say so).
void stop_all(std::shared_ptr<core::Runtime> world,
              std::shared_ptr<core::P2pEngine> p2p = nullptr, bool for_rebuild = false) {
  core::store::stop_all_stores();
  if (p2p) p2p->stop();
  for (auto& rt : for_rebuild ? g_sets.drop_for_rebuild() : g_sets.clear()) rt->shutdown();
  if (world) world->shutdown();
}

// This rank's place among the ranks and its host backends, from the world
// as it is now (at init(), and after a rebuild()).
core::RuntimeInfo runtime_info(transport::MpiWorld& world, const Options& options) {
  core::RuntimeInfo info;
  info.local_rank = world.local_rank();
  info.local_size = world.local_size();
  info.cross_rank = world.cross_rank();
  info.cross_size = world.cross_size();
  info.abort = [&world](int code) { world.abort(code); };
  // With fault tolerance on, host tensors take the ring over MPI: the
  // shared-memory backends wait on memory a dead rank never writes, and
  // only MPI (ULFM) tells the survivors that it died.
  if (world.size() > 1 && !world.fault_tolerant()) {
    // Run by the Runtime once every rank has agreed to start (so no rank
    // waits here for one whose init() failed).
    info.connect_host = [&world, options](core::RuntimeInfo& ri) {
      collectives::ShmOptions so;
      so.slot_bytes = options.shm_slot_bytes;
      so.timeout = std::chrono::milliseconds(static_cast<long>(
          std::isfinite(options.op_timeout_s) ? std::clamp(options.op_timeout_s, 0.0, 1e7) * 1000.0
                                              : 0.0));
      so.spin = std::chrono::microseconds(static_cast<long>(
          std::isfinite(options.spin_wait_us) ? std::clamp(options.spin_wait_us, 0.0, 1e7) : 0.0));
      // Every rank sees the same layout, so all take the same branch; each
      // set-up is collective and votes, so all get a group or none do.
      const bool one_host = world.local_size() == world.size();
      if (one_host) {
        ri.shm = transport::ShmHost::create(so, options.shared_memory != 0);
      } else if (world.uniform_hosts() && world.local_size() > 1) {
        ri.shm = transport::ShmHost::create_per_host(
            so, options.shared_memory != 0 &&
                    (options.hierarchical_allreduce != 0 || options.hierarchical_allgather != 0));
        if (ri.shm) ri.cross = world.make_cross_transport();
      }
    };
  }
  return info;
}

}  // namespace

namespace {

// Once per process, with MPI up (under g_mu): MPI finalised at exit, and
// the fork handlers.
void register_exit_handlers() {
  if (!g_atexit_registered) {
    // MPI is finalised at process exit rather than in shutdown(), so a
    // process may init() again after shutdown(), which builds a new runtime
    // (a new communicator, version vector and caches) on the same MPI: MPI
    // cannot be re-initialised once finalised. Only MPI that gyre itself
    // initialised is finalised (MpiWorld::finalize).
    // A process that exits without shutdown() stops its runtime first (which
    // also stops the other ranks' runtimes in the same round), so MPI is
    // never finalised under a running background thread.
    std::atexit([] {
      std::shared_ptr<core::Runtime> rt;
      std::shared_ptr<core::P2pEngine> p2p;
      {
        std::lock_guard<std::mutex> lock(g_mu);
        rt.swap(g_runtime);
        p2p.swap(g_p2p);
      }
      stop_all(std::move(rt), std::move(p2p));
      transport::MpiWorld::instance().finalize();
    });
    pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child);
    g_atexit_registered = true;
  }
}

// init() while a runtime runs: a list of ranks other than those it runs on
// is refused (shutdown() first), anything else does nothing.
void check_running_on(const std::vector<int>& ranks) {
  if (ranks.empty()) return;
  const auto& world = transport::MpiWorld::instance();
  std::vector<int> current = world.restricted_to();
  if (current.empty()) {
    current.resize(static_cast<std::size_t>(world.size()));
    for (int r = 0; r < world.size(); ++r) current[static_cast<std::size_t>(r)] = r;
  }
  if (ranks != current) {
    throw InvalidArgument(fmt::format(
        "gyre::init(ranks): gyre runs already, on ranks [{}] of MPI_COMM_WORLD, not [{}]; call "
        "shutdown() first to run on other ranks",
        fmt::join(current, ", "), fmt::join(ranks, ", ")));
  }
}

// init(): `failure` is why this rank cannot start (its options did not
// parse), told to every rank by the Runtime's start-up agreement.
void start(const Options& options, const std::string& failure,
           const std::vector<int>& ranks = {}) {
  std::lock_guard<std::mutex> lock(g_mu);
  // Horovod's semantics: init() may be called any number of times; while a
  // runtime runs, later calls do nothing (their options are not applied),
  // unless they name other ranks to run on.
  if (g_runtime) {
    check_running_on(ranks);
    return;
  }
  if (g_forked_child) {
    throw StateError(
        "gyre::init(): this process is the child of a fork() of a process running gyre: MPI "
        "belongs to the parent, so gyre cannot run in the child");
  }
  // The world this runtime runs on: `ranks` of MPI_COMM_WORLD, or all
  // (MpiWorld::instance(ranks)). On a process not among `ranks` MPI is up
  // (the listed ranks' MPI_Init may wait for it) and is finalised at exit.
  transport::MpiWorld* chosen = nullptr;
  try {
    chosen = &transport::MpiWorld::instance(ranks);
  } catch (const InvalidArgument&) {
    register_exit_handlers();
    throw;
  }
  auto& world = *chosen;
  register_exit_handlers();
  core::RuntimeInfo info = runtime_info(world, options);
  if (!failure.empty()) {
    info.start_failure_kind = core::ErrorKind::kInvalidArgument;
    info.start_failure = failure;
  }
  // The first waits for the other ranks: bounded by the start-up deadline,
  // and interruptible (set_init_interrupt_check).
  info.interrupt_check = g_init_interrupt_check;
  // A replacement's first runtime starts at the survivors' agreed commit.
  if (world.join_record().replacement && !g_replacement_started) {
    info.initial_step = world.join_record().step;
    g_replacement_started = true;
  }
  auto transport = world.make_transport(core::startup_deadline(options), g_init_interrupt_check);
  // The point-to-point communicator is duplicated before the runtime's
  // thread starts, never beside its first rounds: with the duplication
  // (a blocking MPI_Comm_dup) in this thread and the negotiation in the
  // other, Open MPI 4.1 was seen to hold a round's messages for tens of
  // seconds under CPU load (and past GYRE_OP_TIMEOUT_S once, across two
  // simulated hosts); measured in docs/architecture.md.
  std::shared_ptr<core::P2pEngine> p2p = start_p2p(options);
  std::shared_ptr<core::Runtime> rt;
  try {
    rt = std::make_shared<core::Runtime>(options, std::move(transport), std::move(info));
  } catch (...) {
    if (p2p) p2p->stop();
    throw;
  }
  g_p2p = std::move(p2p);
  g_runtime = std::move(rt);
}

// start() with the environment's options. A variable that does not parse
// fails init() on every rank (through the start-up agreement), not on this
// rank alone while the others wait.
void start_from_env(const std::vector<int>& ranks) {
  Options options;
  std::string failure;
  try {
    options = Options::from_env();
  } catch (const InvalidArgument& e) {
    failure = e.what();
  }
  start(options, failure, ranks);
}

}  // namespace

void init() {
  // MPI first: a replacement rank receives the survivors' GYRE_* variables
  // when it joins them, before they are read here.
  transport::MpiWorld::instance();
  start_from_env({});
}

void init(const Options& options) { start(options, {}); }

void init(const std::vector<int>& ranks) { start_from_env(ranks); }

void init(const Options& options, const std::vector<int>& ranks) { start(options, {}, ranks); }

void set_init_interrupt_check(std::function<void()> check) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_init_interrupt_check = std::move(check);
}

void shutdown() {
  std::shared_ptr<core::Runtime> rt;
  std::shared_ptr<core::P2pEngine> p2p;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_runtime) throw StateError("gyre::shutdown(): gyre is not initialised");
    rt.swap(g_runtime);
    p2p.swap(g_p2p);
  }
  stop_all(std::move(rt), std::move(p2p));
}

bool elastic_supported() { return transport::MpiWorld::ulfm_built(); }

bool elastic_enabled() {
  return transport::MpiWorld::fault_tolerant();
}

namespace {

// After the shrink of rebuild(): replacements up to the bound
// (GYRE_ELASTIC_RESPAWN), then the lower bound (GYRE_ELASTIC_MIN_NP),
// which every survivor checks on the same size.
void grow_back(transport::MpiWorld& world, const Options& options, RebuildInfo& info) {
  if (options.elastic_respawn != 0) {
    transport::GrowRequest req;
    req.target_size = static_cast<int>(options.elastic_max_np > 0 ? options.elastic_max_np
                                                                   : world.start_size());
    req.discovery_script = options.elastic_host_discovery_script;
    req.step = info.step;
    req.root = info.root;
    if (world.size() < req.target_size) {
      transport::GrowOutcome g = world.grow(req);
      if (!g.problem.empty()) {
        std::fprintf(stderr, "gyre::rebuild(): started %d of %d replacement rank(s): %s\n",
                     g.spawned, req.target_size - info.size, g.problem.c_str());
      }
      if (g.spawned > 0 && world.rank() == 0) {
        std::fprintf(stderr, "gyre::rebuild(): started %d replacement rank(s) on [%s]\n",
                     g.spawned, fmt::format("{}", fmt::join(g.hosts, ", ")).c_str());
      }
      info.spawned = g.spawned;
      info.size = world.size();
      info.previous_ranks.resize(static_cast<std::size_t>(info.size), -1);
    }
  }
  if (world.size() < options.elastic_min_np) {
    throw StateError(fmt::format(
        "gyre::rebuild(): {} rank(s) left after the failure of rank(s) [{}]{}, fewer than "
        "GYRE_ELASTIC_MIN_NP={}: the job cannot go on",
        world.size(), fmt::join(info.lost, ", "),
        options.elastic_respawn != 0 ? fmt::format(" ({} replacement(s) started)", info.spawned)
                                     : std::string(),
        options.elastic_min_np));
  }
}

}  // namespace

bool is_replacement() { return transport::MpiWorld::instance().join_record().replacement; }

RebuildInfo replacement_info() {
  auto& world = transport::MpiWorld::instance();
  const transport::JoinRecord& j = world.join_record();
  if (!j.replacement) {
    throw StateError("gyre::replacement_info(): this process was not started by a rebuild()");
  }
  RebuildInfo info;
  info.rank = rank();
  info.size = size();
  info.step = j.step;
  info.root = j.root;
  info.spawned = info.size - j.survivors;
  info.rebuilds = j.rebuilds;
  info.previous_ranks.assign(static_cast<std::size_t>(info.size), -1);
  return info;
}

void set_respawn_command(const std::vector<std::string>& argv) {
  transport::MpiWorld::set_spawn_command(argv);
}

RebuildInfo rebuild() {
  const auto start = std::chrono::steady_clock::now();
  // Held throughout: the API's other calls wait here for the new world.
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_runtime && !g_rebuild) throw StateError("gyre::rebuild(): gyre is not initialised");
  auto& world = transport::MpiWorld::instance();
  if (!world.fault_tolerant()) {
    // The same words as MpiWorld::rebuild(), which says how to get ULFM.
    world.rebuild(0);
  }
  if (g_runtime) {
    g_rebuild = PendingRebuild{g_runtime->options(), g_runtime->versions().own()};
    std::shared_ptr<core::Runtime> old;
    old.swap(g_runtime);
    std::shared_ptr<core::P2pEngine> old_p2p;
    old_p2p.swap(g_p2p);
    // After a failure its loop has ended; otherwise this ends it (the other
    // ranks' runtimes stop in the same round, or fail if a rank is gone).
    // Process sets and the point-to-point engine end with it: their
    // communicators hold the old ranks.
    stop_all(std::move(old), std::move(old_p2p), /*for_rebuild=*/true);
  }
  for (int attempt = 1;; ++attempt) {
    transport::RebuildOutcome o = world.rebuild(g_rebuild->own_step);
    RebuildInfo info;
    info.rank = o.rank;
    info.size = o.size;
    info.step = *std::min_element(o.steps.begin(), o.steps.end());
    info.root = static_cast<int>(std::find(o.steps.begin(), o.steps.end(), info.step) -
                                 o.steps.begin());
    info.lost = std::move(o.lost);
    info.previous_ranks = std::move(o.previous_ranks);
    info.attempts = o.attempts + attempt - 1;
    try {
      grow_back(world, g_rebuild->options, info);
      core::RuntimeInfo ri = runtime_info(world, g_rebuild->options);
      // Every survivor stands at the agreed commit from its first round on:
      // the caller rolls its state back to it.
      ri.initial_step = info.step;
      auto rt = std::make_shared<core::Runtime>(g_rebuild->options, world.make_transport(),
                                                std::move(ri));
      g_p2p = start_p2p(g_rebuild->options);
      g_runtime = std::move(rt);
      g_rebuild.reset();
      info.rebuilds = world.rebuilds();
      info.seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      return info;
    } catch (const RankFailedError&) {
      // Another rank died while the new runtime started: shrink again.
      if (attempt >= 4) throw;
    }
  }
}

bool is_initialized() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_runtime != nullptr;
}
int rank() { return runtime("rank")->rank(); }
int size() { return runtime("size")->size(); }
int local_rank() { return runtime("local_rank")->local_rank(); }
int local_size() { return runtime("local_size")->local_size(); }
int cross_rank() { return runtime("cross_rank")->cross_rank(); }
int cross_size() { return runtime("cross_size")->cross_size(); }

Handle allreduce_async(const std::string& name, const TensorView& in, const TensorView& out,
                       ReduceOp op, double prescale, double postscale, int process_set) {
  return core::allreduce_async(*runtime_for("allreduce_async", process_set), name, in, out, op,
                               prescale, postscale);
}
Handle grouped_allreduce_async(const std::vector<std::string>& names,
                               const std::vector<TensorView>& ins,
                               const std::vector<TensorView>& outs, ReduceOp op, double prescale,
                               double postscale, int process_set) {
  return core::grouped_allreduce_async(*runtime_for("grouped_allreduce_async", process_set),
                                       names, ins, outs, op, prescale, postscale);
}
Handle allgather_async(const std::string& name, const TensorView& in, int process_set) {
  return core::allgather_async(*runtime_for("allgather_async", process_set), name, in);
}
Handle broadcast_async(const std::string& name, const TensorView& buf, int root,
                       int process_set) {
  auto rt = runtime_for("broadcast_async", process_set);
  if (process_set == kGlobalProcessSet) return core::broadcast_async(*rt, name, buf, root);
  // Roots are world ranks (Horovod's); the set's runtime counts its own.
  const std::vector<int> ranks = ranks_of("broadcast_async", process_set);
  auto it = std::find(ranks.begin(), ranks.end(), root);
  if (it != ranks.end()) {
    return core::broadcast_async(*rt, name, buf, static_cast<int>(it - ranks.begin()));
  }
  // Refused there, and announced to the set's other ranks with the reason.
  TensorView refused = buf;
  if (refused.refusal.empty()) {
    refused.refusal = fmt::format("root rank {} is not in process set {} (ranks [{}])", root,
                                  process_set, fmt::join(ranks, ", "));
  }
  return core::broadcast_async(*rt, name, refused, 0);
}
Handle alltoall_async(const std::string& name, const TensorView& in,
                      const std::vector<std::int64_t>& splits, int process_set) {
  return core::alltoall_async(*runtime_for("alltoall_async", process_set), name, in, splits);
}
Handle reducescatter_async(const std::string& name, const TensorView& in, ReduceOp op,
                           double prescale, double postscale, int process_set) {
  return core::reducescatter_async(*runtime_for("reducescatter_async", process_set), name, in,
                                   op, prescale, postscale);
}
namespace {
// send_async and recv_async: the engine (or why there is none), then the op.
Handle point_to_point(const char* call, bool is_send, const TensorView& t, int peer,
                      std::int64_t tag, int process_set) {
  auto world = runtime(call);
  std::shared_ptr<core::P2pEngine> engine;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    engine = g_p2p;
  }
  if (!engine) throw InvalidArgument(p2p_unavailable(call));
  return core::point_to_point_async(*engine, is_send, t, peer, tag, process_set,
                                    ranks_of(call, process_set), world->rank());
}
}  // namespace

Handle send_async(const TensorView& t, int dst, std::int64_t tag, int process_set) {
  return point_to_point("send_async", true, t, dst, tag, process_set);
}
Handle recv_async(const TensorView& t, int src, std::int64_t tag, int process_set) {
  return point_to_point("recv_async", false, t, src, tag, process_set);
}
void barrier(int process_set) { core::barrier(*runtime_for("barrier", process_set)); }
int join(int process_set) {
  const int last = core::join(*runtime_for("join", process_set));
  if (process_set == kGlobalProcessSet || last < 0) return last;
  return ranks_of("join", process_set).at(static_cast<std::size_t>(last));
}
Handle barrier_async(int process_set) {
  return core::barrier_async(*runtime_for("barrier", process_set));
}
Handle join_async(int process_set) { return core::join_async(*runtime_for("join", process_set)); }

int add_process_set(const std::vector<int>& ranks) {
  auto world = runtime("add_process_set");
  std::lock_guard<std::mutex> lock(g_sets_change_mu);
  return core::add_process_set(*world, g_sets, ranks);
}
int add_process_set_of_members(const std::vector<int>& ranks, double timeout_s) {
  auto world = runtime("add_process_set");
  std::lock_guard<std::mutex> lock(g_sets_change_mu);
  return core::add_process_set_of_members(*world, g_sets, ranks, timeout_s);
}
void remove_process_set(int process_set) {
  auto world = runtime("remove_process_set");
  std::lock_guard<std::mutex> lock(g_sets_change_mu);
  core::remove_process_set(*world, g_sets, process_set);
}
std::vector<int> process_set_ids() {
  runtime("process_set_ids");
  std::vector<int> ids{kGlobalProcessSet};
  for (int id : g_sets.ids()) ids.push_back(id);
  return ids;
}
std::vector<int> process_set_ranks(int process_set) {
  return ranks_of("process_set_ranks", process_set);
}
int process_set_rank(int process_set) {
  const auto ranks = ranks_of("process_set_rank", process_set);
  auto it = std::find(ranks.begin(), ranks.end(), rank());
  return it == ranks.end() ? -1 : static_cast<int>(it - ranks.begin());
}
int process_set_size(int process_set) {
  return static_cast<int>(ranks_of("process_set_size", process_set).size());
}
bool process_set_included(int process_set) { return process_set_rank(process_set) >= 0; }
void set_operation_timeout(int process_set, const std::string& name_prefix, double seconds) {
  runtime_for("set_operation_timeout", process_set)
      ->stall_inspector()
      .set_deadline(name_prefix, seconds);
}
void start_timeline(const std::string& path, bool mark_cycles) {
  runtime("start_timeline")->start_timeline(path, mark_cycles);
}
void stop_timeline() { runtime("stop_timeline")->stop_timeline(); }

RuntimeStats runtime_stats() {
  auto rt = runtime("runtime_stats");
  RuntimeStats st;
  st.rounds = rt->rounds();
  st.requests_sent = rt->requests_sent();
  st.cache_hits_sent = rt->cache_hits_sent();
  st.versions = rt->versions().snapshot();
  const std::uint64_t top =
      st.versions.empty() ? 0 : *std::max_element(st.versions.begin(), st.versions.end());
  for (std::uint64_t v : st.versions) st.behind.push_back(top - v);
  const core::StoreTotals& totals = core::store_totals();
  st.store_pushes = totals.pushes.load();
  st.store_pushes_applied = totals.applied.load();
  st.store_pushes_rejected = totals.rejected.load();
  st.store_pushes_scaled = totals.scaled.load();
  st.store_max_lag = totals.max_lag.load();
  return st;
}

void commit_step() { runtime("commit_step")->versions().commit(); }
std::uint64_t committed_steps() { return runtime("committed_steps")->versions().own(); }
std::vector<std::uint64_t> version_vector() {
  return runtime("version_vector")->versions().snapshot();
}
std::vector<FingerprintMismatch> fingerprint_check(const std::vector<NamedBuffer>& buffers) {
  return core::fingerprint_check(*runtime("fingerprint_check"), buffers);
}
void resync(const std::vector<NamedBuffer>& buffers, ResyncPolicy policy) {
  core::resync(*runtime("resync"), buffers, policy);
}
Handle fingerprint_check_async(const std::vector<NamedBuffer>& buffers) {
  return core::fingerprint_check_async(*runtime("fingerprint_check"), buffers);
}
Handle resync_async(const std::vector<NamedBuffer>& buffers, ResyncPolicy policy) {
  return core::resync_async(*runtime("resync"), buffers, policy);
}

}  // namespace gyre
