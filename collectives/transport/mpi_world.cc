// MpiWorld: the process-level MPI set-up (initialisation and its thread
// level, a world restricted to some ranks, where the ranks sit on the hosts)
// and the transports made from the world's communicator (MpiTransport,
// mpi_transport.cc). Rebuilding after a failure is in mpi_elastic.cc, growing
// back in mpi_grow.cc, the shared-memory set-up in mpi_shm.cc.
//
// Threads: MpiWorld::instance() may be called from any thread (the first
// call initialises MPI); the other calls come from one thread at a time
// under the API's lock (init, rebuild, shutdown).
#include "gyre/collectives/mpi_transport.h"

#include "mpi_comm.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <thread>
#include <vector>

#include "gyre/collectives/cores.h"
#include "gyre/error.h"

namespace gyre::transport {

namespace {

using detail::check_mpi;
using detail::kDefaultPieceBytes;
using detail::kInterruptCheckPeriod;
using detail::make_mpi_transport;

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
  }
  return "unknown";
}

// How long MPI_Finalize may take after a rebuild (see MpiWorld::finalize).
constexpr int kFinalizeGraceS = 10;

// The duplication of the world's communicator that make_transport() waits
// for; left pending when a wait for it is given up (deadline, interrupt),
// and resumed by the next call. MpiWorld is one per process and
// make_transport() is called by one thread at a time (init() holds the
// API's lock). One for the whole world and one for a restricted world
// (MpiWorld::instance(ranks)): a duplication pairs only with the other
// ranks' duplication of the same communicator, so one left pending on the
// whole world waits while a restricted world runs, and one left pending on
// a restricted world is abandoned with it (MPI can neither cancel nor free
// a pending collective: it stays in g_abandoned_dups).
struct PendingDup {
  bool pending = false;
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Comm comm = MPI_COMM_NULL;
};
PendingDup g_dup;
PendingDup g_restricted_dup;
// Set by instance(ranks) around the world's first construction.
bool g_defer_layout = false;
std::vector<PendingDup> g_abandoned_dups;

void abandon_restricted_dup() {
  if (g_restricted_dup.pending) g_abandoned_dups.push_back(g_restricted_dup);
  g_restricted_dup = PendingDup{};
}

// MPI_Comm_create_group's tag for a restricted world (process sets' tags
// are 1000 and up, on the world made here).
constexpr int kRestrictTag = 999;

// MPI_Comm_idup of the world's communicator (`dup`: g_dup, or
// g_restricted_dup for a restricted world), waited for; see make_transport.
MPI_Comm duplicate_world(PendingDup& dup, int rank, std::chrono::milliseconds timeout,
                         const std::function<void()>& check) {
  // Non-blocking, polled: the duplication waits for every rank, which must
  // not be beyond the deadline or Ctrl-C. One given up stays pending (MPI
  // cannot cancel it) and pairs with the other ranks' next duplication, so
  // the next call here resumes it instead of starting another.
  if (!dup.pending) {
    check_mpi(MPI_Comm_idup(detail::world_comm(), &dup.comm, &dup.request), "MPI_Comm_idup");
    dup.pending = true;
  }
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto next_check = start + kInterruptCheckPeriod;
  for (;;) {
    int done = 0;
    check_mpi(MPI_Test(&dup.request, &done, MPI_STATUS_IGNORE), "MPI_Test (MPI_Comm_idup)");
    if (done) break;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    const auto now = Clock::now();
    if (timeout.count() > 0 && now - start > timeout) {
      throw TimeoutError(fmt::format(
          "rank {}: the other ranks did not all start gyre within {} ms (duplicating "
          "the world's communicator for its transport waits for every rank)", rank,
          timeout.count()));
    }
    if (check && now >= next_check) {
      next_check = now + kInterruptCheckPeriod;
      check();  // may throw: the duplication stays pending for the next call
    }
  }
  dup.pending = false;
  return dup.comm;
}

// Per rank of `comm` (whose ranks are all in the world): whether it runs on
// this rank's host, from `hosts` (every world rank's; empty while not known).
std::vector<char> same_host_flags(MPI_Comm comm, const std::vector<std::string>& hosts,
                                  int rank) {
  const int size = static_cast<int>(hosts.size());
  if (rank < 0 || rank >= size) return {};
  MPI_Group group = MPI_GROUP_NULL, world_group = MPI_GROUP_NULL;
  check_mpi(MPI_Comm_group(comm, &group), "MPI_Comm_group");
  check_mpi(MPI_Comm_group(detail::world_comm(), &world_group), "MPI_Comm_group");
  int n = 0;
  MPI_Group_size(group, &n);
  std::vector<int> ranks(static_cast<std::size_t>(n)), in_world(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) ranks[static_cast<std::size_t>(r)] = r;
  const int code = MPI_Group_translate_ranks(group, n, ranks.data(), world_group, in_world.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  check_mpi(code, "MPI_Group_translate_ranks");
  const std::string& mine = hosts[static_cast<std::size_t>(rank)];
  std::vector<char> flags(static_cast<std::size_t>(n), 1);
  for (int r = 0; r < n; ++r) {
    const int w = in_world[static_cast<std::size_t>(r)];
    // Not in the world (not expected): its own host for all we know, as
    // before this distinction. Both sides of a pair decide alike either way.
    if (w == MPI_UNDEFINED || w < 0 || w >= size) return {};
    flags[static_cast<std::size_t>(r)] = hosts[static_cast<std::size_t>(w)] == mine ? 1 : 0;
  }
  return flags;
}

// The transport over `comm`, which it owns; `local_size`: the ranks on this host.
std::unique_ptr<Transport> transport_of(MPI_Comm comm, int local_size,
                                        std::size_t max_message_bytes,
                                        std::vector<char> same_host) {
  // Errors come back as codes and become TransportError, instead of the
  // default handler ending the job without a word about the operation.
  check_mpi(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  // More ranks on this host than cores: waiting ranks must yield.
  return make_mpi_transport(comm, collectives::oversubscribed(local_size), max_message_bytes,
                            std::move(same_host));
}

}  // namespace

MpiWorld& MpiWorld::instance() {
  static MpiWorld world;
  return world;
}

MpiWorld::MpiWorld() {
  int initialized = 0;
  check_mpi(MPI_Initialized(&initialized), "MPI_Initialized");
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided),
              "MPI_Init_thread");
    owns_mpi_ = true;
  } else {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) throw TransportError("MPI was already finalized before gyre initialised it");
    check_mpi(MPI_Query_thread(&provided), "MPI_Query_thread");
  }
  // All transport calls come from the background thread, which is not the
  // thread that initialised MPI: FUNNELED is not enough, SERIALIZED is.
  if (provided < MPI_THREAD_SERIALIZED) {
    throw TransportError(fmt::format(
        "MPI thread level {} is too low: gyre calls MPI from its background thread and "
        "needs at least MPI_THREAD_SERIALIZED{}",
        thread_level_name(provided),
        owns_mpi_ ? "" : " (the job initialised MPI itself; use MPI_Init_thread)"));
  }
  thread_multiple_ = provided == MPI_THREAD_MULTIPLE;
  // A replacement started by the survivors' grow(): its world is theirs
  // and it, merged (mpi_grow.cc).
  MPI_Comm parent = MPI_COMM_NULL;
  check_mpi(MPI_Comm_get_parent(&parent), "MPI_Comm_get_parent");
  if (parent != MPI_COMM_NULL) join_survivors(&parent);
  // instance(ranks) makes the world without the collective layout: the
  // ranks outside the list are not there to take part. (A replacement
  // joins the survivors' world, which instance(ranks) then refuses.)
  if (g_defer_layout && !join_.replacement) {
    check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size");
    start_size_ = size_;
    return;
  }
  derive_layout();
  if (!join_.replacement) start_size_ = size_;
}

MpiWorld& MpiWorld::instance(const std::vector<int>& ranks) {
  MpiWorld* world = nullptr;
  g_defer_layout = !ranks.empty();
  try {
    world = &instance();
  } catch (...) {
    g_defer_layout = false;
    throw;
  }
  g_defer_layout = false;
  world->use_ranks(ranks);
  return *world;
}


MpiWorld::Layout MpiWorld::layout() const {
  return Layout{rank_, size_, local_rank_, local_size_, cross_rank_, cross_size_, uniform_hosts_,
                hosts_};
}

const std::vector<std::string>& MpiWorld::known_hosts() const {
  static const std::vector<std::string> none;
  return layout_known_ && hosts_.size() == static_cast<std::size_t>(size_) ? hosts_ : none;
}

void MpiWorld::set_layout(const Layout& l) {
  rank_ = l.rank;
  size_ = l.size;
  local_rank_ = l.local_rank;
  local_size_ = l.local_size;
  cross_rank_ = l.cross_rank;
  cross_size_ = l.cross_size;
  uniform_hosts_ = l.uniform_hosts;
  hosts_ = l.hosts;
}

void MpiWorld::use_ranks(const std::vector<int>& requested) {
  if (finalized_) throw StateError("MpiWorld::instance(ranks) after finalize()");
  std::vector<int> ranks = requested;
  if (!ranks.empty()) {
    int world_size = 0, world_rank = 0;
    check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &world_size), "MPI_Comm_size");
    check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank), "MPI_Comm_rank");
    const std::string listed = fmt::format("[{}]", fmt::join(ranks, ", "));
    std::vector<int> sorted = ranks;
    std::sort(sorted.begin(), sorted.end());
    if (sorted.front() < 0 || sorted.back() >= world_size) {
      throw InvalidArgument(fmt::format(
          "init(ranks): ranks {} are not all ranks of MPI_COMM_WORLD (0 to {})", listed,
          world_size - 1));
    }
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
      throw InvalidArgument(fmt::format("init(ranks): ranks {} repeat a rank", listed));
    }
    if (!std::binary_search(sorted.begin(), sorted.end(), world_rank)) {
      throw InvalidArgument(fmt::format(
          "init(ranks): this process (rank {} of MPI_COMM_WORLD) is not among ranks {}: gyre "
          "runs on those ranks alone, and only they call init() with them",
          world_rank, listed));
    }
    bool identity = static_cast<int>(ranks.size()) == world_size;
    for (int i = 0; identity && i < world_size; ++i) {
      identity = ranks[static_cast<std::size_t>(i)] == i;
    }
    if (identity && !rebuilt_ && !join_.replacement) {
      ranks.clear();  // every rank in order: the whole world
    } else if (fault_tolerant() || rebuilt_ || join_.replacement) {
      throw StateError(fmt::format(
          "init(ranks): running on ranks {} of MPI_COMM_WORLD is not supported {}", listed,
          fault_tolerant() ? "with fault tolerance on (ULFM)"
                           : "after the world was rebuilt (its ranks are not MPI_COMM_WORLD's)"));
    }
  }
  if (ranks == restricted_to_ && layout_known_) return;  // the world as it is
  // Leave the current restriction: its communicator is freed (only its
  // ranks hold it; a duplication still pending on it completes or not, and
  // is never waited for again).
  if (!restricted_to_.empty()) {
    abandon_restricted_dup();
    MPI_Comm_free(&detail::world_comm());
    detail::world_comm() = MPI_COMM_WORLD;
    restricted_to_.clear();
    if (world_layout_saved_) {
      set_layout(world_layout_);
      world_layout_saved_ = false;
    } else {
      layout_known_ = false;
    }
  }
  if (ranks.empty()) {
    if (!layout_known_) derive_layout();  // collective over MPI_COMM_WORLD
    return;
  }
  if (layout_known_) {
    world_layout_ = layout();
    world_layout_saved_ = true;
  }
  detail::world_comm() = detail::comm_of_ranks(MPI_COMM_WORLD, ranks, kRestrictTag);
  restricted_to_ = ranks;
  derive_layout();  // collective over the listed ranks
}

// Rank, size and where the ranks sit, from the world communicator: at
// start-up, again after a rebuild, and for a restricted world (over its
// ranks alone).
void MpiWorld::derive_layout() {
  const MPI_Comm world = detail::world_comm();
  check_mpi(MPI_Comm_rank(world, &rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(world, &size_), "MPI_Comm_size");
  MPI_Comm local;
  check_mpi(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL,
                                &local),
            "MPI_Comm_split_type");
  check_mpi(MPI_Comm_rank(local, &local_rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(local, &local_size_), "MPI_Comm_size");
  MPI_Comm_free(&local);
  // Ranks with this rank's local rank on the other hosts, in world order:
  // taken from where the launcher placed the ranks, not assumed from a
  // regular layout (hosts may hold different numbers of ranks).
  MPI_Comm cross;
  check_mpi(MPI_Comm_split(world, local_rank_, rank_, &cross), "MPI_Comm_split");
  check_mpi(MPI_Comm_rank(cross, &cross_rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(cross, &cross_size_), "MPI_Comm_size");
  MPI_Comm_free(&cross);
  // Every rank's host, for choosing where replacements start (grow()).
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  check_mpi(MPI_Get_processor_name(name, &len), "MPI_Get_processor_name");
  std::vector<char> names(static_cast<std::size_t>(size_) * MPI_MAX_PROCESSOR_NAME);
  check_mpi(MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(),
                          MPI_MAX_PROCESSOR_NAME, MPI_CHAR, world),
            "MPI_Allgather");
  hosts_.clear();
  for (int r = 0; r < size_; ++r) {
    const char* n = names.data() + static_cast<std::size_t>(r) * MPI_MAX_PROCESSOR_NAME;
    hosts_.emplace_back(n, strnlen(n, MPI_MAX_PROCESSOR_NAME));
  }
  int sizes[2] = {local_size_, -local_size_}, extremes[2] = {0, 0};
  check_mpi(MPI_Allreduce(sizes, extremes, 2, MPI_INT, MPI_MIN, world), "MPI_Allreduce");
  uniform_hosts_ = extremes[0] == -extremes[1];
  layout_known_ = true;
}

std::unique_ptr<Transport> MpiWorld::make_transport() { return make_transport(kDefaultPieceBytes); }

std::unique_ptr<Transport> MpiWorld::make_transport(std::chrono::milliseconds timeout,
                                                    const std::function<void()>& check) {
  return make_transport(kDefaultPieceBytes, timeout, check);
}

std::unique_ptr<Transport> MpiWorld::make_transport(std::size_t max_message_bytes) {
  return make_transport(max_message_bytes, std::chrono::milliseconds(0), {});
}

std::unique_ptr<Transport> MpiWorld::make_transport(std::size_t max_message_bytes,
                                                    std::chrono::milliseconds timeout,
                                                    const std::function<void()>& check) {
  if (max_message_bytes == 0 || max_message_bytes > static_cast<std::size_t>(INT_MAX)) {
    throw InvalidArgument(fmt::format("MpiWorld::make_transport: max_message_bytes {} outside [1, {}]",
                                      max_message_bytes, INT_MAX));
  }
  if (finalized_) throw StateError("MpiWorld::make_transport after finalize()");
  if (!layout_known_) {
    throw StateError("MpiWorld::make_transport: the world is not set up (instance(ranks) failed)");
  }
  // After a rebuild (survivors and replacements alike: rebuilt_ is set on
  // every member of the new world) the duplicate comes from MPIX_Comm_shrink
  // of the new world, not MPI_Comm_idup. Under Open MPI 5.0.11 with ULFM, an
  // idup of the shrunk world at times never completed in the parameter
  // store's kill tests (tests/elastic/store_kill.cc; docs/elastic.md): both
  // survivors polling it for ever, while a barrier on the same communicator
  // just before it completed. Shrink's agreement is ULFM's fault-tolerant
  // one, and with no failed member its result is a duplicate. It blocks,
  // without a deadline of its own: the recovery's
  // (GYRE_ELASTIC_RECOVERY_TIMEOUT_S) bounds it.
  MPI_Comm comm = MPI_COMM_NULL;
  if (!(rebuilt_ && detail::ft_duplicate(detail::world_comm(), &comm))) {
    PendingDup& dup = restricted_to_.empty() ? g_dup : g_restricted_dup;
    comm = duplicate_world(dup, rank_, timeout, check);
  }
  return transport_of(comm, local_size_, max_message_bytes,
                      same_host_flags(comm, known_hosts(), rank_));
}

std::unique_ptr<Transport> MpiWorld::make_cross_transport() {
  if (finalized_) throw StateError("MpiWorld::make_cross_transport after finalize()");
  MPI_Comm comm;
  check_mpi(MPI_Comm_split(detail::world_comm(), local_rank_, rank_, &comm), "MPI_Comm_split");
  return transport_of(comm, local_size_, kDefaultPieceBytes,
                      same_host_flags(comm, known_hosts(), rank_));
}

std::unique_ptr<Transport> MpiWorld::make_group_transport(const std::vector<int>& ranks,
                                                         int tag) {
  if (finalized_) throw StateError("MpiWorld::make_group_transport after finalize()");
  if (!std::binary_search(ranks.begin(), ranks.end(), rank_)) return nullptr;
  const MPI_Comm comm = detail::comm_of_ranks(detail::world_comm(), ranks, tag);
  return transport_of(comm, local_size_, kDefaultPieceBytes,
                      same_host_flags(comm, known_hosts(), rank_));
}


void MpiWorld::abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();  // MPI_Abort should not return; make sure the process ends
}

void MpiWorld::finalize() {
  if (finalized_) return;
  finalized_ = true;
  if (!owns_mpi_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  // Also for a failure known to ULFM's detector without a rebuild: the
  // job's failed processes of MPI_COMM_WORLD (e.g. survivors that end on a
  // parameter store's error instead of rebuilding).
  if (rebuilt_ || !detail::failed_ranks(MPI_COMM_WORLD).empty()) {
    // After a rank's death, Open MPI 5.0's MPI_Finalize sometimes waits for
    // ever in its closing fence, which includes the dead process (seen in
    // about one run in three of tests/elastic under load, after rebuilds).
    // The survivors' work is done by now (gyre is shut down): after a grace
    // period the process ends with status 0 instead of hanging.
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::seconds(kFinalizeGraceS));
      std::fprintf(stderr,
                   "gyre: MPI_Finalize did not return within %d s after a rank's failure "
                   "(Open MPI waits for the dead process); exiting without it\n",
                   kFinalizeGraceS);
      std::fflush(stderr);
      std::_Exit(0);
    }).detach();
  }
  MPI_Finalize();
}

}  // namespace gyre::transport
