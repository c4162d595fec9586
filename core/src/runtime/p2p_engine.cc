// P2pEngine: the protocol of p2p_engine.h on its driving thread.
#include "runtime/p2p_engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "gyre/error.h"
#include "runtime/p2p_wire.h"

namespace gyre::core {

namespace {

using Clock = std::chrono::steady_clock;
using Channel = transport::MpiP2pChannel;
// The wire messages and their helpers (p2p_wire.h).
using namespace p2p;

}  // namespace

struct P2pEngine::Engine {
  // One operation on the engine's thread.
  struct Active {
    P2pOp op;
    Clock::time_point deadline;
    bool bound = false;     // send: acknowledged; recv: matched to a header
    int source = -1;        // recv: the rank it was matched to
    std::uint64_t seq = 0;  // send: its header's; recv: the matched header's
    std::vector<Channel::Request> pieces;
    std::vector<std::size_t> piece_bytes;
  };
  struct Arrived {
    int source;
    Header h;
    std::string refusal;  // a refused send's reason
    bool withdrawn = false;
  };
  struct ControlSend {
    Channel::Request req;
    std::unique_ptr<std::vector<std::byte>> buf;
  };

  std::unique_ptr<Channel> ch;
  double deadline_s;
  std::uint64_t next_seq = 0;
  std::deque<Active> sends;     // in submission order
  std::deque<Active> recvs;     // in submission order (MPI's matching order)
  std::deque<Arrived> arrived;  // headers no recv has taken yet, oldest first
  std::deque<ControlSend> control;
  std::vector<std::byte> scratch;

  bool busy() const { return !sends.empty() || !recvs.empty() || !control.empty(); }

  Clock::time_point deadline_from(Clock::time_point now) const {
    if (!(deadline_s > 0) || !std::isfinite(deadline_s)) return Clock::time_point::max();
    return now + std::chrono::duration_cast<Clock::duration>(
                     std::chrono::duration<double>(deadline_s));
  }

  void send_control(int peer, int tag, std::vector<std::byte> bytes) {
    auto buf = std::make_unique<std::vector<std::byte>>(std::move(bytes));
    const Channel::Request r = ch->isend(peer, tag, *buf);
    control.push_back(ControlSend{r, std::move(buf)});
  }

  void post_pieces(Active& a, int peer) {
    auto* base = static_cast<std::byte*>(a.op.view.data);
    const std::size_t n = a.op.view.nbytes();
    for (std::size_t off = 0; off < n; off += kPieceBytes) {
      const std::size_t len = std::min(kPieceBytes, n - off);
      a.piece_bytes.push_back(len);
      a.pieces.push_back(a.op.is_send ? ch->isend(peer, kPayloadTag, {base + off, len})
                                      : ch->irecv(peer, kPayloadTag, {base + off, len}));
    }
  }

  void start(P2pOp op, Clock::time_point now) {
    if (!op.refusal.empty()) {
      // A send refused at the call: its receiver's recv fails with the reason.
      const Header h{next_seq++, op.tag, kRefusedCount, op.process_set, 0};
      auto bytes = bytes_of(h);
      const auto* text = reinterpret_cast<const std::byte*>(op.refusal.data());
      bytes.insert(bytes.end(), text, text + op.refusal.size());
      send_control(op.peer, kHeaderTag, std::move(bytes));
      return;
    }
    Active a;
    a.op = std::move(op);
    a.deadline = deadline_from(now);
    if (a.op.is_send) {
      a.seq = next_seq++;
      const Header h{a.seq, a.op.tag, a.op.view.numel(), a.op.process_set,
                     static_cast<std::int32_t>(a.op.view.dtype)};
      const int peer = a.op.peer;
      // Listed first: if MPI fails, fail_all() finds it.
      sends.push_back(std::move(a));
      send_control(peer, kHeaderTag, bytes_of(h));
    } else {
      recvs.push_back(std::move(a));
    }
  }

  // Receives the headers and acknowledgements that have arrived.
  void receive_control() {
    while (auto src = ch->receive_any(kHeaderTag, scratch)) {
      if (scratch.size() < sizeof(Header)) continue;
      Arrived a{*src, {}, {}};
      std::memcpy(&a.h, scratch.data(), sizeof(Header));
      if (a.h.count == kWithdrawnCount) {
        withdraw(a.source, a.h.seq);
        continue;
      }
      a.refusal.assign(reinterpret_cast<const char*>(scratch.data()) + sizeof(Header),
                       scratch.size() - sizeof(Header));
      arrived.push_back(std::move(a));
    }
    while (auto src = ch->receive_any(kAckTag, scratch)) {
      if (auto ack = parse<Ack>(scratch)) on_ack(*src, *ack);
    }
  }

  static std::string withdrawn_text(const P2pOp& op, int source) {
    return fmt::format(
        "{}: rank {} withdrew its send (its deadline passed before this recv was posted)",
        describe(op), source);
  }

  // `source`'s send `seq` gave up: a recv already matched to it fails; a
  // header still waiting fails the recv that takes it (headers from one
  // rank arrive in order, so the withdrawn one is here or taken).
  void withdraw(int source, std::uint64_t seq) {
    for (Arrived& x : arrived) {
      if (x.source == source && x.h.seq == seq) x.withdrawn = true;
    }
    for (auto it = recvs.begin(); it != recvs.end(); ++it) {
      if (!it->bound || it->source != source || it->seq != seq) continue;
      for (auto r : it->pieces) ch->cancel(r);
      fail(*it, std::make_exception_ptr(TimeoutError(withdrawn_text(it->op, source))));
      recvs.erase(it);
      return;
    }
  }

  void on_ack(int source, const Ack& ack) {
    auto it = std::find_if(sends.begin(), sends.end(), [&](const Active& a) {
      return !a.bound && a.seq == ack.seq && a.op.peer == source;
    });
    // A send that gave up has withdrawn its header (expire()): the
    // receiver fails its recv on that, and this late ack is dropped.
    if (it == sends.end()) return;
    Active& a = *it;
    if (!ack.accepted) {
      fail(a, std::make_exception_ptr(MismatchError(fmt::format(
          "{}: rank {}'s recv takes {} x {}, but this rank sends {} x {} (the element count and "
          "dtype of a send and its recv must agree)", describe(a.op), source, ack.count,
          dtype_text(ack.dtype), a.op.view.numel(), dtype_name(a.op.view.dtype)))));
      sends.erase(it);
      return;
    }
    a.bound = true;
    post_pieces(a, source);
  }

  // Gives every waiting recv, oldest first, the oldest header it can take.
  void match() {
    for (auto it = recvs.begin(); it != recvs.end();) {
      Active& a = *it;
      if (a.bound) {
        ++it;
        continue;
      }
      auto h = std::find_if(arrived.begin(), arrived.end(), [&](const Arrived& x) {
        return x.h.process_set == a.op.process_set && x.h.tag == a.op.tag &&
               (a.op.peer == kAnySource || a.op.peer == x.source);
      });
      if (h == arrived.end()) {
        ++it;
        continue;
      }
      const Arrived got = *h;
      arrived.erase(h);
      a.source = got.source;
      a.seq = got.h.seq;
      if (got.withdrawn) {
        fail(a, std::make_exception_ptr(TimeoutError(withdrawn_text(a.op, got.source))));
        it = recvs.erase(it);
        continue;
      }
      if (got.h.count == kRefusedCount) {
        fail(a, std::make_exception_ptr(InvalidArgument(fmt::format(
            "{}: rank {} refused its send: {}", describe(a.op), got.source, got.refusal))));
        it = recvs.erase(it);
        continue;
      }
      const auto my_dtype = static_cast<std::int32_t>(a.op.view.dtype);
      const bool ok = got.h.dtype == my_dtype && got.h.count == a.op.view.numel();
      // The payload's receive is posted before the acknowledgement leaves.
      if (ok) post_pieces(a, got.source);
      send_control(got.source, kAckTag,
                   bytes_of(Ack{got.h.seq, a.op.view.numel(), my_dtype, ok ? 1 : 0}));
      if (!ok) {
        fail(a, std::make_exception_ptr(MismatchError(fmt::format(
            "{}: rank {} sent {} x {}, but this rank's tensor takes {} x {} (the element count "
            "and dtype of a send and its recv must agree)", describe(a.op), got.source,
            got.h.count, dtype_text(got.h.dtype), a.op.view.numel(),
            dtype_name(a.op.view.dtype)))));
        it = recvs.erase(it);
        continue;
      }
      a.bound = true;
      ++it;
    }
  }

  // Tests the payload pieces of bound operations; completes the finished.
  void progress(std::deque<Active>& list) {
    for (auto it = list.begin(); it != list.end();) {
      Active& a = *it;
      if (!a.bound) {
        ++it;
        continue;
      }
      std::optional<std::string> withdrawn;
      std::size_t i = 0;
      while (i < a.pieces.size()) {
        std::size_t got = 0;
        if (!ch->test(a.pieces[i], &got)) break;
        if (!a.op.is_send && got != a.piece_bytes[i]) {
          withdrawn = withdrawn_text(a.op, a.source);
          a.pieces.erase(a.pieces.begin(), a.pieces.begin() + static_cast<long>(i) + 1);
          a.piece_bytes.clear();
          for (auto r : a.pieces) ch->cancel(r);
          a.pieces.clear();
          break;
        }
        ++i;
      }
      if (withdrawn) {
        fail(a, std::make_exception_ptr(TimeoutError(*withdrawn)));
        it = list.erase(it);
        continue;
      }
      a.pieces.erase(a.pieces.begin(), a.pieces.begin() + static_cast<long>(i));
      a.piece_bytes.erase(a.piece_bytes.begin(), a.piece_bytes.begin() + static_cast<long>(i));
      if (!a.pieces.empty()) {
        ++it;
        continue;
      }
      a.op.state->source_rank = a.op.is_send ? a.op.peer : a.source;
      a.op.state->complete_one();
      it = list.erase(it);
    }
  }

  void expire(std::deque<Active>& list, Clock::time_point now) {
    for (auto it = list.begin(); it != list.end();) {
      Active& a = *it;
      if (now < a.deadline) {
        ++it;
        continue;
      }
      for (auto r : a.pieces) ch->cancel(r);
      std::string what;
      if (a.op.is_send && !a.bound) {
        what = fmt::format("no matching recv was posted on rank {}", a.op.peer);
        send_control(a.op.peer, kHeaderTag,
                     bytes_of(Header{a.seq, a.op.tag, kWithdrawnCount, a.op.process_set, 0}));
      } else if (!a.op.is_send && !a.bound) {
        what = a.op.peer == kAnySource ? std::string("no rank sent a matching message")
                                       : fmt::format("rank {} sent no matching message",
                                                     a.op.peer);
      } else {
        what = fmt::format("the data did not arrive from / leave for rank {}",
                           a.op.is_send ? a.op.peer : a.source);
      }
      fail(a, std::make_exception_ptr(TimeoutError(fmt::format(
          "{}: {} within {} s (GYRE_STALL_SHUTDOWN_S)", describe(a.op), what, deadline_s))));
      it = list.erase(it);
    }
  }

  void reap_control() {
    for (auto it = control.begin(); it != control.end();) {
      if (ch->test(it->req)) {
        it = control.erase(it);
      } else {
        ++it;
      }
    }
  }

  static void fail(Active& a, std::exception_ptr e) { a.op.state->complete_one(std::move(e)); }

  // Fails everything pending with `e` (StateError at stop, MPI's failure).
  void fail_all(const std::exception_ptr& e) {
    for (auto* list : {&sends, &recvs}) {
      for (auto& a : *list) fail(a, e);
      list->clear();
    }
  }

  // The buffers of control messages MPI may still read after the channel
  // is gone (sends cannot be cancelled) are left allocated.
  void abandon_control() {
    for (auto& c : control) (void)c.buf.release();
    control.clear();
  }
};

P2pEngine::P2pEngine(std::unique_ptr<transport::MpiP2pChannel> channel, double deadline_s,
                     Driver driver)
    : rank_(channel->rank()), driver_(driver), engine_(std::make_unique<Engine>()) {
  engine_->ch = std::move(channel);
  engine_->deadline_s = deadline_s;
  if (driver_ == Driver::kOwnThread) thread_ = std::thread([this] { loop(); });
}

P2pEngine::~P2pEngine() { stop(); }

void P2pEngine::submit(P2pOp op) {
  std::exception_ptr refuse;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      refuse = std::make_exception_ptr(
          StateError(fmt::format("{}: gyre is shutting down", describe(op))));
    } else if (broken_) {
      refuse = broken_;
    } else {
      inbox_.push_back(std::move(op));
      // Under mu_: once stop() has set stopping_, the driving loop (and
      // what wake_ touches) may be gone.
      if (wake_) wake_();
    }
  }
  if (refuse) {
    if (op.state) op.state->complete_one(refuse);
    return;
  }
  cv_.notify_one();
}

void P2pEngine::set_wake(std::function<void()> wake) {
  std::lock_guard<std::mutex> lock(mu_);
  wake_ = std::move(wake);
}

void P2pEngine::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !thread_.joinable() && driver_ == Driver::kOwnThread) return;
    stopping_ = true;
    wake_ = nullptr;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
  if (driver_ == Driver::kCaller) {
    std::lock_guard<std::mutex> lock(drive_mu_);
    if (torn_down_) return;
    torn_down_ = true;
    teardown();
  }
}

P2pEngine::Pass P2pEngine::service() {
  std::lock_guard<std::mutex> drive(drive_mu_);
  if (torn_down_) return {};
  std::vector<P2pOp> incoming;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || broken_) return {};
    incoming.swap(inbox_);
  }
  // As the own thread's loop: with nothing pending, no MPI call at all.
  if (incoming.empty() && !engine_->busy()) return {};
  Pass p;
  p.moved = pass(std::move(incoming));
  p.pending = engine_->busy();
  return p;
}

bool P2pEngine::pass(std::vector<P2pOp> incoming) {
  Engine& e = *engine_;
  const auto now = Clock::now();
  const std::size_t before = e.sends.size() + e.recvs.size() + e.arrived.size();
  try {
    for (auto& op : incoming) e.start(std::move(op), now);
    e.receive_control();
    e.match();
    e.progress(e.sends);
    e.progress(e.recvs);
    e.reap_control();
    e.expire(e.sends, now);
    e.expire(e.recvs, now);
  } catch (...) {
    // MPI failed (a peer died under ULFM, a revoked communicator): this
    // and every later operation fail with its error.
    const auto err = std::current_exception();
    {
      std::lock_guard<std::mutex> lock(mu_);
      broken_ = err;
      for (auto& op : inbox_) {
        if (op.state) op.state->complete_one(err);
      }
      inbox_.clear();
    }
    for (auto& op : incoming) {
      if (op.state) op.state->complete_one(err);
    }
    e.fail_all(err);
    e.abandon_control();
  }
  const std::size_t after = e.sends.size() + e.recvs.size() + e.arrived.size();
  return !incoming.empty() || after != before;
}

void P2pEngine::loop() {
  Engine& e = *engine_;
  // Waiting passes the core to the other threads: a few yields, then naps
  // that double up to 1 ms while operations are pending; with none, the
  // thread sleeps until a submission and makes no MPI call at all. Headers,
  // refusals and late acknowledgements that arrive meanwhile wait in MPI's
  // queue for the next operation (or stop()'s quiesce). An idle engine that
  // probed every 50 ms, beside the runtime's thread, was seen to let Open
  // MPI 4.1 hold negotiation messages for tens of seconds under CPU load.
  int idle_passes = 0;
  for (;;) {
    std::vector<P2pOp> incoming;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (broken_) {
        // MPI failed: submit() refuses everything; wait for stop().
        cv_.wait(lock, [&] { return stopping_; });
      } else if (!stopping_ && inbox_.empty()) {
        if (!e.busy()) {
          cv_.wait(lock, [&] { return stopping_ || !inbox_.empty(); });
        } else if (idle_passes > 16) {
          const auto nap = std::chrono::microseconds(
              std::min(1000, 10 << std::min(idle_passes - 16, 7)));
          cv_.wait_for(lock, nap);
        }
      }
      if (stopping_) break;
      incoming.swap(inbox_);
    }
    if (incoming.empty() && idle_passes <= 16) std::this_thread::yield();
    idle_passes = pass(std::move(incoming)) ? 0 : idle_passes + 1;
  }
  teardown();
}

void P2pEngine::teardown() {
  Engine& e = *engine_;
  e.fail_all(std::make_exception_ptr(
      StateError("point-to-point operation: gyre shut down while it was pending")));
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& op : inbox_) {
      if (!op.state) continue;
      op.state->complete_one(std::make_exception_ptr(
          StateError("point-to-point operation: gyre shut down while it was pending")));
    }
    inbox_.clear();
  }
  // Every rank stops its engine at shutdown: wait for the others (bounded)
  // so that no message is left on the communicator when it is freed (left
  // there, Open MPI was seen to let a later init() hang in its set-up).
  bool failed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    failed = broken_ != nullptr;
  }
  if (!failed) {
    try {
      e.ch->quiesce(std::chrono::seconds(2));
    } catch (...) {
    }
  }
  e.abandon_control();
  e.ch.reset();
}

}  // namespace gyre::core
