// MpiWorld (process-level MPI set-up) and MpiTransport (point-to-point over
// a duplicated communicator). MPI itself is seen only in collectives/transport/
// (here, mpi_elastic.cc for ULFM recovery, mpi_shm.cc for the shared-memory
// set-up).
//
// Threads: MpiWorld::instance() may be called from any thread (the first
// call initialises MPI). A transport is driven by one thread at a time, the
// runtime's background thread; MPI_THREAD_MULTIPLE also lets the job's own
// threads use MPI concurrently with it.
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

namespace detail {

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return fmt::format("MPI error {}", code);
  return std::string(text, static_cast<std::size_t>(len));
}

void check_mpi(int code, const char* call) {
  if (code != MPI_SUCCESS) {
    throw TransportError(fmt::format("{} failed: {}", call, mpi_error_string(code)));
  }
}

void check_peer_call(int code, MPI_Comm comm, const char* who, const char* call, int peer) {
  if (code == MPI_SUCCESS) return;
  std::string what =
      fmt::format("{}: {} with rank {} failed: {}", who, call, peer, mpi_error_string(code));
  if (process_failure(code, comm)) throw RankFailedError(what);
  throw TransportError(what);
}

int byte_count(std::size_t bytes, const char* who) {
  if (bytes > static_cast<std::size_t>(INT_MAX)) {
    throw InvalidArgument(fmt::format("{}: a message of {} bytes is over INT_MAX", who, bytes));
  }
  return static_cast<int>(bytes);
}

MPI_Comm comm_of_ranks(MPI_Comm parent, const std::vector<int>& ranks, int tag) {
  MPI_Group parent_group, group;
  check_mpi(MPI_Comm_group(parent, &parent_group), "MPI_Comm_group");
  const int rc = MPI_Group_incl(parent_group, static_cast<int>(ranks.size()), ranks.data(), &group);
  MPI_Group_free(&parent_group);
  check_mpi(rc, "MPI_Group_incl");
  MPI_Comm comm = MPI_COMM_NULL;
  const int rc2 = MPI_Comm_create_group(parent, group, tag, &comm);
  MPI_Group_free(&group);
  check_mpi(rc2, "MPI_Comm_create_group");
  return comm;
}

MPI_Comm& world_comm() {
  static MPI_Comm comm = MPI_COMM_WORLD;
  return comm;
}

}  // namespace detail

namespace {

using detail::check_mpi;
using detail::mpi_error_string;

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
  }
  return "unknown";
}

// MPI counts are int: a message above this size is sent as several pieces
// with the same tag. Both sides cut a message of a given size the same way,
// and MPI keeps messages of one (source, tag) in order, so the pieces match.
constexpr std::size_t kDefaultPieceBytes = std::size_t{1} << 30;
// A message just above the shared-memory transport's eager limit (Open MPI's
// vader and sm: 4096 bytes, header included) goes by rendezvous and a
// single-copy read (process_vm_readv): about 2 us more than an eager send on
// 2 ranks here, so a 4 KiB allreduce took 2.4-2.8 us against 0.6 us at 3 KiB.
// Messages up to kSplitLimit are sent as equal pieces of at most kEagerPiece
// bytes instead, each eager (docs/benchmarks.md, "The 4 KiB step").
constexpr std::size_t kEagerPiece = 4000;
constexpr std::size_t kSplitLimit = 64 * 1024;

// How long MPI_Finalize may take after a rebuild (see MpiWorld::finalize).
constexpr int kFinalizeGraceS = 10;

// First sleep of a napping wait (doubled per poll up to the policy's cap).
constexpr std::chrono::microseconds kFirstNap{5};
// How often a wait calls its interrupt check (Transport::set_interrupt_check).
constexpr std::chrono::milliseconds kInterruptCheckPeriod{50};

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

class MpiTransport final : public Transport {
 public:
  // `yield_when_idle`: give the core away now and then while waiting; right
  // when the host runs more ranks than it has cores, costly otherwise (a
  // yielding rank can lose its core to any other process for a time slice).
  MpiTransport(MPI_Comm comm, bool yield_when_idle, std::size_t max_piece_bytes)
      : comm_(comm), yield_(yield_when_idle), max_piece_(max_piece_bytes) {
    check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  }

  ~MpiTransport() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    // Transfers still pending here were abandoned by an error (those a
    // peer's failure left posted are in abandoned_); receives are cancelled
    // so they cannot write into buffers their owners free. After a peer's
    // failure (ULFM, the communicator revoked) every request is completed
    // rather than freed: a freed send to the dead rank would stay active
    // for ever, and MPI_Finalize waits for active requests (measured: the
    // job hung at exit). On a revoked communicator the wait returns at once.
    for (Op& op : abandoned_) op.in_use = true;
    for (auto* ops : {&ops_, &abandoned_}) {
      for (Op& op : *ops) {
        if (!op.in_use) continue;
        for (MPI_Request& r : op.reqs) {
          if (r == MPI_REQUEST_NULL) continue;
          if (!op.is_send) MPI_Cancel(&r);
          if (peer_failed_) {
            MPI_Wait(&r, MPI_STATUS_IGNORE);
          } else {
            MPI_Request_free(&r);
          }
        }
      }
    }
    MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }

  Transfer isend(int peer, int tag, std::span<const std::byte> data) override {
    check_peer(peer, "send");
    const std::int64_t slot = allocate(peer, tag, data.size(), /*is_send=*/true);
    Op& op = ops_[static_cast<std::size_t>(slot)];
    // MPI_Isend takes a non-const buffer in old bindings; it does not write it.
    auto* base = const_cast<std::byte*>(data.data());
    for_each_piece(data.size(), [&](std::size_t off, int len) {
      MPI_Request r;
      post(MPI_Isend(base + off, len, MPI_BYTE, peer, tag, comm_, &r), "MPI_Isend", op);
      op.reqs.push_back(r);
    });
    return Transfer{slot};
  }

  Transfer irecv(int peer, int tag, std::span<std::byte> data) override {
    check_peer(peer, "receive");
    const std::int64_t slot = allocate(peer, tag, data.size(), /*is_send=*/false);
    Op& op = ops_[static_cast<std::size_t>(slot)];
    for_each_piece(data.size(), [&](std::size_t off, int len) {
      MPI_Request r;
      post(MPI_Irecv(data.data() + off, len, MPI_BYTE, peer, tag, comm_, &r), "MPI_Irecv", op);
      op.reqs.push_back(r);
    });
    return Transfer{slot};
  }

  bool test(Transfer& req) override {
    if (!req.pending()) return true;
    Op& op = lookup(req);
    int flag = 0;
    int code = MPI_Testall(static_cast<int>(op.reqs.size()), op.reqs.data(), &flag,
                           op.statuses.data());
    if (code != MPI_SUCCESS) fail(req, op, code);
    if (!flag) return false;
    if (!op.is_send) check_received(req, op);
    release(req);
    return true;
  }

  void wait(Transfer& req) override {
    if (!req.pending()) return;
    // Polling rather than MPI_Wait lets a deadline be enforced, and the
    // wait policy decide when to stop burning the core (transport.h).
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    const bool bounded = timeout_.count() > 0;
    const auto deadline = start + timeout_;
    const bool may_nap = wait_policy_.max_nap.count() > 0;
    const auto nap_from = start + wait_policy_.spin;
    std::chrono::microseconds nap{0};
    auto next_check = start + kInterruptCheckPeriod;
    for (unsigned spins = 1;; ++spins) {
      if (test(req)) return;
      if (nap.count() > 0) {
        std::this_thread::sleep_for(nap);
        nap = std::min(2 * nap, wait_policy_.max_nap);
      } else if ((spins & 63) != 0) {
        continue;
      } else if (yield_) {
        std::this_thread::yield();
      }
      const auto now = Clock::now();
      if (may_nap && nap.count() == 0 && now >= nap_from) {
        nap = std::min(kFirstNap, wait_policy_.max_nap);
      }
      if (interrupt_check_ && now >= next_check) {
        next_check = now + kInterruptCheckPeriod;
        interrupt_check_();  // may throw: the transfer stays pending
      }
      if (bounded && now > deadline) {
        const Op& op = lookup(req);
        throw TimeoutError(fmt::format(
            "mpi transport: rank {} made no progress for {} ms {} {} bytes {} rank {} (tag {})",
            rank_, timeout_.count(), op.is_send ? "sending" : "receiving", op.bytes,
            op.is_send ? "to" : "from", op.peer, op.tag));
      }
    }
  }

 private:
  struct Op {
    std::vector<MPI_Request> reqs;  // one per piece
    std::vector<MPI_Status> statuses;
    int peer = -1, tag = 0;
    std::size_t bytes = 0;
    bool is_send = false;
    bool in_use = false;
  };

  // The pieces of a message of `bytes`: the same on the sending and the
  // receiving side, which post one MPI message per piece in order.
  template <class F>
  void for_each_piece(std::size_t bytes, F&& f) const {
    if (bytes == 0) {
      f(0, 0);
      return;
    }
    std::size_t piece = max_piece_;
    if (bytes > kEagerPiece && bytes <= kSplitLimit && kEagerPiece < max_piece_) {
      const std::size_t n = (bytes + kEagerPiece - 1) / kEagerPiece;
      piece = (bytes + n - 1) / n;
    }
    for (std::size_t off = 0; off < bytes; off += piece) {
      f(off, static_cast<int>(std::min(piece, bytes - off)));
    }
  }

  void check_peer(int peer, const char* what) const {
    if (peer < 0 || peer >= size_) {
      throw InvalidArgument(
          fmt::format("mpi transport: {} peer {} outside world of size {}", what, peer, size_));
    }
  }

  std::int64_t allocate(int peer, int tag, std::size_t bytes, bool is_send) {
    std::int64_t slot;
    if (!free_.empty()) {
      slot = free_.back();
      free_.pop_back();
    } else {
      slot = static_cast<std::int64_t>(ops_.size());
      ops_.emplace_back();
    }
    Op& op = ops_[static_cast<std::size_t>(slot)];
    op.reqs.clear();
    op.peer = peer;
    op.tag = tag;
    op.bytes = bytes;
    op.is_send = is_send;
    op.in_use = true;
    return slot;
  }

  void post(int code, const char* call, Op& op) {
    if (code != MPI_SUCCESS) {
      std::string what = fmt::format("mpi transport: {} of {} bytes {} rank {} (tag {}): {}",
                                     call, op.bytes, op.is_send ? "to" : "from", op.peer,
                                     op.tag, mpi_error_string(code));
      if (detail::process_failure(code, comm_)) {
        peer_failed_ = true;
        throw RankFailedError(what);
      }
      throw TransportError(what);
    }
  }

  Op& lookup(const Transfer& req) {
    auto idx = static_cast<std::size_t>(req.slot);
    if (idx >= ops_.size() || !ops_[idx].in_use) {
      throw InvalidArgument(fmt::format("mpi transport: unknown transfer {}", req.slot));
    }
    Op& op = ops_[idx];
    op.statuses.resize(op.reqs.size());
    return op;
  }

  void release(Transfer& req) {
    ops_[static_cast<std::size_t>(req.slot)].in_use = false;
    free_.push_back(req.slot);
    req.slot = -1;
  }

  // A longer message than posted fails in MPI (MPI_ERR_TRUNCATE); a shorter
  // one completes quietly, so it is checked here: both mean that the ranks
  // disagree on a size (a count, a dtype, a block), which must not pass as
  // a result.
  void check_received(Transfer& req, Op& op) {
    std::size_t got = 0;
    for (const MPI_Status& st : op.statuses) {
      int n = 0;
      MPI_Get_count(&st, MPI_BYTE, &n);
      got += static_cast<std::size_t>(n);
    }
    if (got == op.bytes) return;
    const std::string what = fmt::format(
        "mpi transport: rank {} received {} bytes from rank {} (tag {}) where it expected {}: the "
        "ranks disagree on the size of this transfer (different counts, dtypes or block sizes)",
        rank_, got, op.peer, op.tag, op.bytes);
    release(req);
    throw TransportError(what);
  }

  [[noreturn]] void fail(Transfer& req, Op& op, int code) {
    // With MPI_ERR_IN_STATUS the cause is in the per-request statuses.
    if (code == MPI_ERR_IN_STATUS) {
      for (const MPI_Status& s : op.statuses) {
        if (s.MPI_ERROR != MPI_SUCCESS && s.MPI_ERROR != MPI_ERR_PENDING) {
          code = s.MPI_ERROR;
          break;
        }
      }
    }
    std::string what = fmt::format("mpi transport: {} {} bytes {} rank {} (tag {}) failed: {}",
                                   op.is_send ? "sending" : "receiving", op.bytes,
                                   op.is_send ? "to" : "from", op.peer, op.tag,
                                   mpi_error_string(code));
    // The pieces still posted are left to the destructor, which cancels
    // receives and frees the requests.
    if (detail::process_failure(code, comm_)) {
      peer_failed_ = true;
      abandoned_.push_back(op);
      op.reqs.clear();
      release(req);
      throw RankFailedError(what);
    }
    release(req);
    throw TransportError(what);
  }

  MPI_Comm comm_;
  const bool yield_;
  const std::size_t max_piece_;  // largest single MPI message
  int rank_ = 0, size_ = 1;
  std::vector<Op> ops_;            // indexed by Transfer::slot
  std::vector<std::int64_t> free_;  // released slots, reused first
  std::vector<Op> abandoned_;       // pieces left posted by a peer's failure
  bool peer_failed_ = false;        // a peer died (ULFM): the communicator is revoked
};

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
  PendingDup& dup = restricted_to_.empty() ? g_dup : g_restricted_dup;
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
          "the world's communicator for its transport waits for every rank)", rank_,
          timeout.count()));
    }
    if (check && now >= next_check) {
      next_check = now + kInterruptCheckPeriod;
      check();  // may throw: the duplication stays pending for the next call
    }
  }
  dup.pending = false;
  MPI_Comm comm = dup.comm;
  // Errors come back as codes and become TransportError, instead of the
  // default handler ending the job without a word about the operation.
  check_mpi(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  // More ranks on this host than cores: waiting ranks must yield.
  return std::make_unique<MpiTransport>(comm, collectives::oversubscribed(local_size_),
                                        max_message_bytes);
}

std::unique_ptr<Transport> MpiWorld::make_cross_transport() {
  if (finalized_) throw StateError("MpiWorld::make_cross_transport after finalize()");
  MPI_Comm comm;
  check_mpi(MPI_Comm_split(detail::world_comm(), local_rank_, rank_, &comm), "MPI_Comm_split");
  check_mpi(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  return std::make_unique<MpiTransport>(comm, collectives::oversubscribed(local_size_),
                                        kDefaultPieceBytes);
}

std::unique_ptr<Transport> MpiWorld::make_group_transport(const std::vector<int>& ranks,
                                                         int tag) {
  if (finalized_) throw StateError("MpiWorld::make_group_transport after finalize()");
  if (!std::binary_search(ranks.begin(), ranks.end(), rank_)) return nullptr;
  MPI_Comm comm = detail::comm_of_ranks(detail::world_comm(), ranks, tag);
  check_mpi(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  return std::make_unique<MpiTransport>(comm, collectives::oversubscribed(local_size_),
                                        kDefaultPieceBytes);
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
  if (rebuilt_) {
    // After a rank's death, Open MPI 5.0's MPI_Finalize sometimes waits for
    // ever in its closing fence, which includes the dead process (seen in
    // about one run in three of tests/elastic under load). The survivors'
    // work is done by now (gyre is shut down): after a grace period the
    // process ends with status 0 instead of hanging.
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
