// The public API of gyre.h: the process's one Runtime (over MPI), its
// lifecycle, and forwarding to the operations of operations.h.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <optional>

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
// Between a rebuild() that stopped the old runtime and the new one running
// (a failure in between makes the next rebuild() start again from here).
struct PendingRebuild {
  Options options;
  std::uint64_t own_step = 0;
};
std::optional<PendingRebuild> g_rebuild;

std::shared_ptr<core::Runtime> runtime(const char* call) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_runtime) {
    throw StateError(fmt::format("gyre::{}: gyre is not initialised (call gyre::init() first)", call));
  }
  return g_runtime;
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
    // Collective: every rank takes part, and all get a group or none do.
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
      info.shm = transport::ShmHost::create(so, options.shared_memory != 0);
    } else if (world.uniform_hosts() && world.local_size() > 1) {
      info.shm = transport::ShmHost::create_per_host(
          so, options.shared_memory != 0 && options.hierarchical_allreduce != 0);
      if (info.shm) info.cross = world.make_cross_transport();
    }
  }
  return info;
}

}  // namespace

void init(const Options& options) {
  std::lock_guard<std::mutex> lock(g_mu);
  // Horovod's semantics: init() may be called any number of times; while a
  // runtime runs, later calls do nothing (their options are not applied).
  if (g_runtime) return;
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
    g_atexit_registered = true;
  }
  core::RuntimeInfo info = runtime_info(world, options);
  g_runtime = std::make_shared<core::Runtime>(options, world.make_transport(), std::move(info));
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

bool elastic_supported() { return transport::MpiWorld::ulfm_built(); }

bool elastic_enabled() {
  return transport::MpiWorld::fault_tolerant();
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
    // After a failure its loop has ended; otherwise this ends it (the other
    // ranks' runtimes stop in the same round, or fail if a rank is gone).
    old->shutdown();
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
      core::RuntimeInfo ri = runtime_info(world, g_rebuild->options);
      // Every survivor stands at the agreed commit from its first round on:
      // the caller rolls its state back to it.
      ri.initial_step = info.step;
      auto rt = std::make_shared<core::Runtime>(g_rebuild->options, world.make_transport(),
                                                std::move(ri));
      g_runtime = std::move(rt);
      g_rebuild.reset();
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

}  // namespace gyre
