// Elastic recovery in gyre.h (docs/elastic.md): rebuild() replaces the
// runtime of a world that lost ranks by one on the survivors (MpiWorld's
// shrink over ULFM), grows it back with replacement ranks where asked
// (GYRE_ELASTIC_RESPAWN), and what a replacement rank is told.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "api/lifecycle.h"
#include "gyre/gyre.h"

namespace gyre {

using api::g_mu;
using api::g_p2p;
using api::g_runtime;
using api::runtime_info;
using api::start_p2p;
using api::stop_all;

namespace {

// Between a rebuild() that stopped the old runtime and the new one running
// (a failure in between makes the next rebuild() start again from here).
struct PendingRebuild {
  Options options;
  std::uint64_t own_step = 0;
};
std::optional<PendingRebuild> g_rebuild;

// Bounds one rebuild(): its MPI calls (the old transports' pending requests,
// the shrink and agreement, the spawn and merge, the new communicators)
// cannot be interrupted, and Open MPI's ULFM can stay blocked in them for
// ever (docs/elastic.md, "Limits"). Past the deadline a thread of its own
// logs the step the recovery was blocked in and ends this process (exit
// status 1), so that nothing hangs: every survivor has the same deadline,
// and one whose recovery did finish sees the ended ones as failed ranks.
// Not MPI_Abort: after a spawned replacement's failure Open MPI's launcher
// was seen to stay behind for ever in its abort path (prterun deadlocked),
// while processes that exit are ordinary failures to it.
class RecoveryDeadline {
 public:
  RecoveryDeadline(double seconds, int rank) {
    if (!(seconds > 0)) return;
    const auto limit = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(std::min(seconds, 1e7)));
    thread_ = std::thread([this, seconds, rank, limit] {
      std::unique_lock<std::mutex> lock(mu_);
      if (cv_.wait_for(lock, limit, [this] { return done_; })) return;
      std::fprintf(stderr,
                   "[gyre %d ERROR] gyre::rebuild(): the recovery has not finished after %g s "
                   "(GYRE_ELASTIC_RECOVERY_TIMEOUT_S): blocked while %s. Open MPI's ULFM can "
                   "stay blocked for ever when a replacement started by an earlier rebuild "
                   "fails (docs/elastic.md, \"Limits\"); ending this process\n",
                   rank, seconds, phase_);
      std::fflush(stderr);
      std::_Exit(1);
    });
  }
  RecoveryDeadline(const RecoveryDeadline&) = delete;
  RecoveryDeadline& operator=(const RecoveryDeadline&) = delete;
  ~RecoveryDeadline() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  // What the recovery does now, for the message.
  void phase(const char* what) {
    std::lock_guard<std::mutex> lock(mu_);
    phase_ = what;
  }

 private:
  std::mutex mu_;  // guards done_, phase_
  std::condition_variable cv_;
  bool done_ = false;
  const char* phase_ = "stopping the old runtime (its transfers still posted)";
  std::thread thread_;
};

}  // namespace

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
  RecoveryDeadline deadline(
      (g_runtime ? g_runtime->options() : g_rebuild->options).elastic_recovery_timeout_s,
      world.rank());
  // The old runtime's communicators may still have messages on their way
  // (the failure cut their traffic short): they are kept, not freed, when it
  // stops, so that no new communicator takes their context ids.
  transport::MpiWorld::retire_communicators();
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
    deadline.phase("shrinking the world to the survivors (MPIX_Comm_shrink, MPIX_Comm_agree, "
                   "the new world's communicators)");
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
      deadline.phase("starting replacement ranks (MPI_Comm_spawn_multiple, MPI_Intercomm_merge)");
      grow_back(world, g_rebuild->options, info);
      deadline.phase("starting the new runtime");
      core::RuntimeInfo ri = runtime_info(world, g_rebuild->options);
      // Every survivor stands at the agreed commit from its first round on:
      // the caller rolls its state back to it.
      ri.initial_step = info.step;
      auto rt = std::make_shared<core::Runtime>(g_rebuild->options, world.make_transport(),
                                                std::move(ri));
      // Made after the runtime, so nothing drives it but a thread of its
      // own (GYRE_P2P_ON_COORDINATOR applies to init()'s runtime only).
      Options own_thread = g_rebuild->options;
      own_thread.p2p_on_coordinator = 0;
      g_p2p = start_p2p(own_thread);
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

}  // namespace gyre
