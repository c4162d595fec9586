// The lifecycle of gyre.h: init() and shutdown() of the process's one
// Runtime (over MPI) and the point-to-point engine beside it, the handlers
// at exit and around fork(), and the queries of the running runtime (rank,
// size, ...). The state is declared in lifecycle.h; rebuild() is in
// elastic_rebuild.cc, the operations' forwarders in api.cc.
#include "api/lifecycle.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <mutex>

#include <pthread.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "gyre/collectives/mpi_p2p.h"
#include "gyre/collectives/shm_host.h"
#include "gyre/gyre.h"
#include "store/parameter_store.h"

namespace gyre {

namespace api {

std::mutex g_mu;
std::shared_ptr<core::Runtime> g_runtime;
std::shared_ptr<core::P2pEngine> g_p2p;
core::ProcessSetTable g_sets;
std::mutex g_sets_change_mu;

namespace {

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

// A replacement rank (MpiWorld::join_record) started its first runtime;
// guarded by g_mu.
bool g_replacement_started = false;

}  // namespace

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

std::shared_ptr<core::P2pEngine> start_p2p(const Options& options) {
  auto& world = transport::MpiWorld::instance();
  // Not with fault tolerance on (ULFM): the engine's shutdown and its
  // communicator's duplication have not been made safe against a dead rank
  // (a survivor's rebuild() could then stall), so point-to-point is refused.
  if (!world.thread_multiple() || world.fault_tolerant()) return nullptr;
  return std::make_shared<core::P2pEngine>(
      transport::MpiP2pChannel::create(), options.stall_shutdown_s,
      options.p2p_on_coordinator != 0 ? core::P2pEngine::Driver::kCaller
                                       : core::P2pEngine::Driver::kOwnThread);
}

std::string p2p_unavailable(const char* call) {
  if (transport::MpiWorld::instance().fault_tolerant()) {
    return fmt::format("{}: point-to-point operations are not available with fault tolerance "
                       "on (ULFM, mpirun --with-ft ulfm): not yet made safe against a failed "
                       "rank", call);
  }
  return fmt::format("{}: point-to-point operations need MPI at MPI_THREAD_MULTIPLE; this MPI "
                     "offers less", call);
}

void stop_all(std::shared_ptr<core::Runtime> world,
              std::shared_ptr<core::P2pEngine> p2p, bool for_rebuild) {
  core::store::stop_all_stores();
  if (p2p) p2p->stop();
  for (auto& rt : for_rebuild ? g_sets.drop_for_rebuild() : g_sets.clear()) rt->shutdown();
  if (world) world->shutdown();
}

core::RuntimeInfo runtime_info(transport::MpiWorld& world, const Options& options) {
  core::RuntimeInfo info;
  info.local_rank = world.local_rank();
  info.local_size = world.local_size();
  info.cross_rank = world.cross_rank();
  info.cross_size = world.cross_size();
  info.abort = [&world](int code) { world.abort(code); };
  // A store call waiting on a rank that shut down (and may have exited)
  // would wait for its deadline: the stores stop with the runtime.
  info.on_peer_shutdown = [] { core::store::stop_all_stores(); };
  // With fault tolerance on, host tensors take the ring over MPI: the
  // shared-memory backends wait on memory a dead rank never writes, and
  // only MPI (ULFM) tells the survivors that it died.
  if (world.size() > 1 && !world.fault_tolerant()) {
    // Run by the Runtime once every rank has agreed to start (so no rank
    // waits here for one whose init() failed).
    info.connect_host = [&world, options](core::RuntimeInfo& ri) {
      collectives::ShmOptions so;
      so.slot_bytes = options.shm_slot_bytes;
      so.pool_bytes = options.shm_pool_bytes;
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
        if (ri.shm) {
          ri.cross = world.make_cross_transport();
          // The network phase's transfers have the same deadline as every
          // other transfer of the background thread (GYRE_OP_TIMEOUT_S).
          ri.cross->set_timeout(so.timeout);
        }
      }
    };
  }
  return info;
}

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
  if (options.p2p_on_coordinator != 0) info.p2p = p2p;
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

}  // namespace api

using api::g_init_interrupt_check;
using api::g_mu;
using api::g_p2p;
using api::g_runtime;
using api::runtime;
using api::start;
using api::start_from_env;
using api::stop_all;

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

}  // namespace gyre
