// The public API of gyre.h: the process's one Runtime (over MPI), its
// lifecycle, and forwarding to the operations of operations.h.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <mutex>

#include <pthread.h>

#include <fmt/format.h>

#include "gyre/collectives/mpi_transport.h"
#include "gyre/collectives/shm_host.h"
#include "gyre/gyre.h"
#include "api/operations.h"
#include "runtime/runtime.h"

namespace gyre {

namespace {

// Guards g_runtime (the pointer; the Runtime synchronises itself). User
// calls copy the shared_ptr, so a concurrent shutdown() cannot destroy the
// runtime under them.
std::mutex g_mu;
std::shared_ptr<core::Runtime> g_runtime;
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
  transport::MpiWorld::instance().forget_after_fork();
  g_mu.unlock();
}

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

}  // namespace

namespace {

// init(): `failure` is why this rank cannot start (its options did not
// parse), told to every rank by the Runtime's start-up agreement.
void start(const Options& options, const std::string& failure) {
  std::lock_guard<std::mutex> lock(g_mu);
  // Horovod's semantics: init() may be called any number of times; while a
  // runtime runs, later calls do nothing (their options are not applied).
  if (g_runtime) return;
  if (g_forked_child) {
    throw StateError(
        "gyre::init(): this process is the child of a fork() of a process running gyre: MPI "
        "belongs to the parent, so gyre cannot run in the child");
  }
  auto& world = transport::MpiWorld::instance();
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
      {
        std::lock_guard<std::mutex> lock(g_mu);
        rt.swap(g_runtime);
      }
      if (rt) rt->shutdown();
      transport::MpiWorld::instance().finalize();
    });
    pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child);
    g_atexit_registered = true;
  }
  core::RuntimeInfo info;
  info.local_rank = world.local_rank();
  info.local_size = world.local_size();
  info.cross_rank = world.cross_rank();
  info.cross_size = world.cross_size();
  info.abort = [&world](int code) { world.abort(code); };
  if (!failure.empty()) {
    info.start_failure_kind = core::ErrorKind::kInvalidArgument;
    info.start_failure = failure;
  }
  if (world.size() > 1) {
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
            so, options.shared_memory != 0 && options.hierarchical_allreduce != 0);
        if (ri.shm) ri.cross = world.make_cross_transport();
      }
    };
  }
  // The first waits for the other ranks: bounded by the start-up deadline,
  // and interruptible (set_init_interrupt_check).
  info.interrupt_check = g_init_interrupt_check;
  auto transport = world.make_transport(core::startup_deadline(options), g_init_interrupt_check);
  g_runtime = std::make_shared<core::Runtime>(options, std::move(transport), std::move(info));
}

}  // namespace

void init() {
  // A variable that does not parse fails init() on every rank (through the
  // start-up agreement), not on this rank alone while the others wait.
  Options options;
  std::string failure;
  try {
    options = Options::from_env();
  } catch (const InvalidArgument& e) {
    failure = e.what();
  }
  start(options, failure);
}

void init(const Options& options) { start(options, {}); }

void set_init_interrupt_check(std::function<void()> check) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_init_interrupt_check = std::move(check);
}

void shutdown() {
  std::shared_ptr<core::Runtime> rt;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_runtime) throw StateError("gyre::shutdown(): gyre is not initialised");
    rt.swap(g_runtime);
  }
  rt->shutdown();
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
                       ReduceOp op, double prescale, double postscale) {
  return core::allreduce_async(*runtime("allreduce_async"), name, in, out, op, prescale,
                               postscale);
}
Handle grouped_allreduce_async(const std::vector<std::string>& names,
                               const std::vector<TensorView>& ins,
                               const std::vector<TensorView>& outs, ReduceOp op, double prescale,
                               double postscale) {
  return core::grouped_allreduce_async(*runtime("grouped_allreduce_async"), names, ins, outs, op,
                                       prescale, postscale);
}
Handle allgather_async(const std::string& name, const TensorView& in) {
  return core::allgather_async(*runtime("allgather_async"), name, in);
}
Handle broadcast_async(const std::string& name, const TensorView& buf, int root) {
  return core::broadcast_async(*runtime("broadcast_async"), name, buf, root);
}
Handle alltoall_async(const std::string& name, const TensorView& in,
                      const std::vector<std::int64_t>& splits) {
  return core::alltoall_async(*runtime("alltoall_async"), name, in, splits);
}
Handle reducescatter_async(const std::string& name, const TensorView& in, ReduceOp op,
                           double prescale, double postscale) {
  return core::reducescatter_async(*runtime("reducescatter_async"), name, in, op, prescale,
                                   postscale);
}
void barrier() { core::barrier(*runtime("barrier")); }
int join() { return core::join(*runtime("join")); }
Handle barrier_async() { return core::barrier_async(*runtime("barrier")); }
Handle join_async() { return core::join_async(*runtime("join")); }
void start_timeline(const std::string& path, bool mark_cycles) {
  runtime("start_timeline")->start_timeline(path, mark_cycles);
}
void stop_timeline() { runtime("stop_timeline")->stop_timeline(); }

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
