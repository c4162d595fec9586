// LocalTransport: eager-copy mailboxes shared by the rank threads of one
// process. Small on purpose: one mutex for the whole world and one condition
// variable per rank (a completed receive wakes only the rank that posted it,
// not every rank thread of a 16-rank world); the unit tests it serves move
// at most a few tens of MB.
#include "gyre/collectives/local_transport.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <fmt/format.h>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "gyre/error.h"

namespace gyre::transport {

// A posted receive; shared between the receiving rank's slot table and the
// mailbox it waits in, so that a sender can complete it. Outside the
// anonymous namespace: members of this file's classes are of its type.
struct RecvOp {
  int src = 0;
  int tag = 0;
  std::span<std::byte> buf;
  std::size_t* received = nullptr;  // irecv_message: any length up to buf's
  bool done = false;
  std::string error;  // set instead of copying when the sizes disagree
};

namespace {

// How often a waiting receive runs the interrupt check (as MpiTransport).
constexpr std::chrono::milliseconds kLocalInterruptPeriod{50};

// Delivers `msg` into `op` (both under the world mutex).
void deliver(RecvOp& op, const std::vector<std::byte>& msg, int dst) {
  if (op.received != nullptr && msg.size() > op.buf.size()) {
    op.error = fmt::format(
        "local transport: rank {} had room for {} bytes from rank {} (tag {}) but a "
        "message of {} bytes arrived",
        dst, op.buf.size(), op.src, op.tag, msg.size());
  } else if (op.received == nullptr && msg.size() != op.buf.size()) {
    op.error = fmt::format(
        "local transport: rank {} expected {} bytes from rank {} (tag {}) but a "
        "message of {} bytes arrived",
        dst, op.buf.size(), op.src, op.tag, msg.size());
  } else {
    if (!msg.empty()) std::memcpy(op.buf.data(), msg.data(), msg.size());
    if (op.received != nullptr) *op.received = msg.size();
  }
  op.done = true;
}

}  // namespace

class LocalWorld {
 public:
  explicit LocalWorld(int n) : n_(n), boxes_(static_cast<std::size_t>(n)) {}

  int size() const { return n_; }

  // Mailbox of one receiving rank, keyed by (source, tag). At most one of
  // `messages` and `recvs` is non-empty for a key: whichever side arrives
  // first waits for the other, so both are matched in posting order.
  struct Queue {
    std::deque<std::vector<std::byte>> messages;
    std::deque<std::shared_ptr<RecvOp>> recvs;
  };
  struct Mailbox {
    std::map<std::pair<int, int>, Queue> queues;
    // Signalled when a receive of this rank completes or the world fails.
    std::condition_variable cv;
  };

  // Guards boxes_ and failed_rank_, and every RecvOp reachable from them.
  std::mutex mu_;
  const int n_;
  std::vector<Mailbox> boxes_;
  int failed_rank_ = -1;
};

struct LocalTransport::Slots {
  std::map<std::int64_t, std::shared_ptr<RecvOp>> ops;  // only this rank's thread touches it
  std::int64_t next = 0;
};

std::shared_ptr<LocalWorld> make_local_world(int n) {
  if (n < 1) throw InvalidArgument(fmt::format("local world: size must be >= 1, got {}", n));
  return std::make_shared<LocalWorld>(n);
}

void fail_local_world(LocalWorld& world, int rank) {
  {
    std::lock_guard<std::mutex> lock(world.mu_);
    if (world.failed_rank_ < 0) world.failed_rank_ = rank;
  }
  for (auto& box : world.boxes_) box.cv.notify_all();
}

LocalTransport::LocalTransport(std::shared_ptr<LocalWorld> world, int rank)
    : world_(std::move(world)), rank_(rank), slots_(std::make_unique<Slots>()) {
  if (rank < 0 || rank >= world_->size()) {
    throw InvalidArgument(
        fmt::format("local transport: rank {} outside world of size {}", rank, world_->size()));
  }
}

LocalTransport::~LocalTransport() { cancel_pending(); }

// Withdraws this rank's unmatched receives from its mailbox, so that no later
// send copies into buffers its owner is about to free. Called when the rank
// stops (destructor) and before wait() throws: a rank released from a failed
// world unwinds its buffers while other ranks may still be sending.
void LocalTransport::cancel_pending() {
  std::lock_guard<std::mutex> lock(world_->mu_);
  auto& queues = world_->boxes_[static_cast<std::size_t>(rank_)].queues;
  for (auto& [slot, op] : slots_->ops) {
    if (op->done) continue;
    auto it = queues.find({op->src, op->tag});
    if (it == queues.end()) continue;
    auto& recvs = it->second.recvs;
    recvs.erase(std::remove(recvs.begin(), recvs.end(), op), recvs.end());
  }
}

int LocalTransport::size() const { return world_->size(); }

static void check_peer(int peer, int n, const char* what) {
  if (peer < 0 || peer >= n) {
    throw InvalidArgument(fmt::format("local transport: {} peer {} outside world of size {}",
                                      what, peer, n));
  }
}

Transfer LocalTransport::isend(int peer, int tag, std::span<const std::byte> data) {
  check_peer(peer, size(), "send");
  std::vector<std::byte> msg(data.begin(), data.end());  // copied outside the lock
  bool completed = false;
  {
    std::lock_guard<std::mutex> lock(world_->mu_);
    auto& q = world_->boxes_[static_cast<std::size_t>(peer)].queues[{rank_, tag}];
    if (!q.recvs.empty()) {
      deliver(*q.recvs.front(), msg, peer);
      q.recvs.pop_front();
      completed = true;
    } else {
      q.messages.push_back(std::move(msg));
    }
  }
  if (completed) world_->boxes_[static_cast<std::size_t>(peer)].cv.notify_one();
  return Transfer{};  // eager: the data is already copied, the send is complete
}

Transfer LocalTransport::irecv(int peer, int tag, std::span<std::byte> data) {
  return post_recv(peer, tag, data, nullptr);
}

Transfer LocalTransport::irecv_message(int peer, int tag, std::span<std::byte> room,
                                       std::size_t* received) {
  return post_recv(peer, tag, room, received);
}

Transfer LocalTransport::post_recv(int peer, int tag, std::span<std::byte> data,
                                   std::size_t* received) {
  check_peer(peer, size(), "receive");
  auto op = std::make_shared<RecvOp>();
  op->src = peer;
  op->tag = tag;
  op->buf = data;
  op->received = received;
  {
    std::lock_guard<std::mutex> lock(world_->mu_);
    auto& q = world_->boxes_[static_cast<std::size_t>(rank_)].queues[{peer, tag}];
    if (!q.messages.empty()) {
      deliver(*op, q.messages.front(), rank_);
      q.messages.pop_front();
    } else {
      q.recvs.push_back(op);
    }
  }
  std::int64_t slot = slots_->next++;
  slots_->ops.emplace(slot, std::move(op));
  return Transfer{slot};
}

bool LocalTransport::test(Transfer& req) {
  if (!req.pending()) return true;
  auto it = slots_->ops.find(req.slot);
  if (it == slots_->ops.end()) {
    throw InvalidArgument(fmt::format("local transport: unknown request {}", req.slot));
  }
  std::string error;
  {
    std::lock_guard<std::mutex> lock(world_->mu_);
    if (!it->second->done) return false;
    error = it->second->error;
  }
  slots_->ops.erase(it);
  req.slot = -1;
  if (!error.empty()) throw TransportError(error);
  return true;
}

void LocalTransport::wait(Transfer& req) {
  if (!req.pending()) return;
  auto it = slots_->ops.find(req.slot);
  if (it == slots_->ops.end()) {
    throw InvalidArgument(fmt::format("local transport: unknown request {}", req.slot));
  }
  RecvOp& op = *it->second;
  std::condition_variable& cv = world_->boxes_[static_cast<std::size_t>(rank_)].cv;
  using Clock = std::chrono::steady_clock;
  const bool bounded = timeout_.count() > 0;
  const auto deadline = bounded ? Clock::now() + timeout_ : Clock::time_point::max();
  {
    std::unique_lock<std::mutex> lock(world_->mu_);
    auto ready = [&] { return op.done || world_->failed_rank_ >= 0; };
    while (!ready()) {
      if (!bounded && !interrupt_check_) {
        cv.wait(lock, ready);
        break;
      }
      // Woken at the deadline, and every kLocalInterruptPeriod to run the
      // interrupt check (outside the lock: it may throw, or take time).
      auto until = deadline;
      if (interrupt_check_) until = std::min(until, Clock::now() + kLocalInterruptPeriod);
      if (cv.wait_until(lock, until, ready)) break;
      if (bounded && Clock::now() >= deadline) {
        lock.unlock();
        cancel_pending();
        throw TimeoutError(fmt::format(
            "local transport: rank {} waited {} ms to receive {} bytes from rank {} (tag {})",
            rank_, timeout_.count(), op.buf.size(), op.src, op.tag));
      }
      if (interrupt_check_) {
        lock.unlock();
        try {
          interrupt_check_();
        } catch (...) {
          cancel_pending();
          throw;
        }
        lock.lock();
      }
    }
    if (!op.done) {
      const int failed = world_->failed_rank_;
      lock.unlock();
      cancel_pending();
      throw TransportError(fmt::format(
          "local transport: rank {} gave up receiving {} bytes from rank {} (tag {}): rank {} failed",
          rank_, op.buf.size(), op.src, op.tag, failed));
    }
  }
  test(req);  // releases the slot and reports a size mismatch
}

void run_local_world(int n, const std::function<void(Transport&)>& fn,
                     std::chrono::milliseconds timeout) {
  auto world = make_local_world(n);
  std::mutex first_mu;  // guards first
  std::exception_ptr first;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        LocalTransport t(world, r);
        t.set_timeout(timeout);
        fn(t);
      } catch (...) {
        {
          std::lock_guard<std::mutex> lock(first_mu);
          if (!first) first = std::current_exception();
        }
        fail_local_world(*world, r);
      }
    });
  }
  for (auto& th : threads) th.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace gyre::transport
