// MpiTransport: point-to-point over a duplicated communicator, the
// Transport the runtime's collectives run on when ranks are processes.
// MpiWorld (mpi_world.cc) makes it, through make_mpi_transport().
//
// Threads: a transport is driven by one thread at a time, the runtime's
// background thread; MPI_THREAD_MULTIPLE also lets the job's own threads use
// MPI concurrently with it.
#include "mpi_comm.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <fmt/format.h>
#include <thread>
#include <vector>

#include "gyre/collectives/naps.h"
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
using detail::kInterruptCheckPeriod;
using detail::mpi_error_string;

// A message just above the shared-memory transport's eager limit (Open MPI's
// vader and sm: 4096 bytes, header included) goes by rendezvous and a
// single-copy read (process_vm_readv): about 2 us more than an eager send on
// 2 ranks here, so a 4 KiB allreduce took 2.4-2.8 us against 0.6 us at 3 KiB.
// Messages up to kSplitLimit to a peer on this host are sent as equal pieces
// of at most kEagerPiece bytes instead, each eager (docs/benchmarks.md, "The
// 4 KiB step"). Not to a peer on another host: TCP's eager limit is 64 KiB,
// and each piece there is a message of its own through the network stack (a
// 16 KiB allreduce across 4 simulated hosts took 194 us in 5 pieces a hop
// against 70 us whole; docs/benchmarks.md, "Eager pieces only within a host").
constexpr std::size_t kEagerPiece = 4000;
constexpr std::size_t kSplitLimit = 64 * 1024;

// First sleep of a napping wait (doubled per poll up to the policy's cap).
constexpr std::chrono::microseconds kFirstNap{5};

class MpiTransport final : public Transport {
 public:
  // `yield_when_idle`: give the core away now and then while waiting; right
  // when the host runs more ranks than it has cores, costly otherwise (a
  // yielding rank can lose its core to any other process for a time slice).
  MpiTransport(MPI_Comm comm, bool yield_when_idle, std::size_t max_piece_bytes,
               std::vector<char> same_host)
      : comm_(comm), made_at_(detail::failure_epoch()), yield_(yield_when_idle),
        max_piece_(max_piece_bytes),
        same_host_(std::move(same_host)) {
    check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    if (!same_host_.empty() && same_host_.size() != static_cast<std::size_t>(size_)) {
      throw TransportError(fmt::format(
          "mpi transport: {} host flags for a communicator of {} ranks", same_host_.size(),
          size_));
    }
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
    bool cut_short = peer_failed_;
    for (auto* ops : {&ops_, &abandoned_}) {
      for (Op& op : *ops) {
        if (!op.in_use) continue;
        cut_short = true;
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
    // Transfers cut short (an error, a timeout, an interrupt) leave the
    // peers' side of them on their way: the communicator is kept, as after
    // a failure (MpiWorld::retire_communicators says why).
    detail::free_comm(comm_, made_at_, cut_short);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }

  Transfer isend(int peer, int tag, std::span<const std::byte> data) override {
    // MPI_Isend takes a non-const buffer in old bindings; it does not write it.
    return start(peer, tag, const_cast<std::byte*>(data.data()), data.size(), true, false);
  }

  Transfer irecv(int peer, int tag, std::span<std::byte> data) override {
    return start(peer, tag, data.data(), data.size(), false, false);
  }

  Transfer isend_message(int peer, int tag, std::span<const std::byte> data) override {
    return start(peer, tag, const_cast<std::byte*>(data.data()), data.size(), true, true);
  }

  Transfer irecv_message(int peer, int tag, std::span<std::byte> room,
                         std::size_t* received) override {
    return start(peer, tag, room.data(), room.size(), false, true, received);
  }

  std::size_t pieces(int peer, std::size_t bytes) const override {
    check_peer(peer, "pieces for");
    std::size_t n = 0;
    for_each_piece(peer, bytes, [&](std::size_t, int) { ++n; });
    return n;
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
    collectives::PreciseNaps precise;  // naps.h
    auto next_check = start + kInterruptCheckPeriod;
    for (unsigned spins = 1;; ++spins) {
      if (test(req)) return;
      if (nap.count() > 0) {
        precise.begin();
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
    std::size_t* received = nullptr;  // irecv_message: its length goes here
    bool is_send = false;
    bool in_use = false;
  };

  // The pieces of a message of `bytes` with `peer`: the same on the sending
  // and the receiving side (whether two ranks share a host is the same fact
  // on each), which post one MPI message per piece in order.
  template <class F>
  void for_each_piece(int peer, std::size_t bytes, F&& f) const {
    if (bytes == 0) {
      f(0, 0);
      return;
    }
    std::size_t piece = max_piece_;
    const bool local = same_host_.empty() || same_host_[static_cast<std::size_t>(peer)] != 0;
    if (local && bytes > kEagerPiece && bytes <= kSplitLimit && kEagerPiece < max_piece_) {
      const std::size_t n = (bytes + kEagerPiece - 1) / kEagerPiece;
      piece = (bytes + n - 1) / n;
    }
    for (std::size_t off = 0; off < bytes; off += piece) {
      f(off, static_cast<int>(std::min(piece, bytes - off)));
    }
  }

  // Posts the transfer of `bytes` at `base` to or from `peer`: in the
  // pieces of for_each_piece, or as one message (`whole`: the *_message
  // calls, whose receiver cannot know how a message of unknown length was
  // cut), whose length then goes to `received`.
  Transfer start(int peer, int tag, std::byte* base, std::size_t bytes, bool is_send, bool whole,
                 std::size_t* received = nullptr) {
    check_peer(peer, is_send ? "send" : "receive");
    const int whole_len = whole ? detail::byte_count(bytes, "mpi transport") : 0;
    const std::int64_t slot = allocate(peer, tag, bytes, is_send);
    Op& op = ops_[static_cast<std::size_t>(slot)];
    op.received = received;
    auto one = [&](std::size_t off, int len) {
      MPI_Request r;
      if (is_send) {
        post(MPI_Isend(base + off, len, MPI_BYTE, peer, tag, comm_, &r), "MPI_Isend", op);
      } else {
        post(MPI_Irecv(base + off, len, MPI_BYTE, peer, tag, comm_, &r), "MPI_Irecv", op);
      }
      op.reqs.push_back(r);
    };
    if (whole) {
      one(0, whole_len);
    } else {
      for_each_piece(peer, bytes, one);
    }
    return Transfer{slot};
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
    op.received = nullptr;
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
    if (op.received != nullptr) {
      *op.received = got;  // a longer message failed above (MPI_ERR_TRUNCATE)
      return;
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
  std::uint64_t made_at_;  // detail::failure_epoch() when made
  const bool yield_;
  const std::size_t max_piece_;  // largest single MPI message
  const std::vector<char> same_host_;  // per rank of comm_; empty: all on this host
  int rank_ = 0, size_ = 1;
  std::vector<Op> ops_;            // indexed by Transfer::slot
  std::vector<std::int64_t> free_;  // released slots, reused first
  std::vector<Op> abandoned_;       // pieces left posted by a peer's failure
  bool peer_failed_ = false;        // a peer died (ULFM): the communicator is revoked
};

}  // namespace

std::unique_ptr<Transport> detail::make_mpi_transport(MPI_Comm comm, bool yield_when_idle,
                                                      std::size_t max_piece_bytes,
                                                      std::vector<char> same_host) {
  return std::make_unique<MpiTransport>(comm, yield_when_idle, max_piece_bytes,
                                        std::move(same_host));
}

}  // namespace gyre::transport
