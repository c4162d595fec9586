// TensorQueue: this rank's enqueued operations, keyed by name, and how many
// times this rank has submitted each name.
//
// User threads push entries (enqueue) and the background thread drains the
// requests enqueued since the previous round into its negotiation message.
// The queue is the one owner of a pending entry until its response is
// agreed; take_for() then moves the entry into the response, and from there
// the executor completes it. The background thread sleeps in
// wait_for_work() until an enqueue, a wake() or the cycle time.
//
// Names in use: a second enqueue of a name in use on this rank is refused
// (InvalidArgument; never announced). A name is in use while its entry is
// in the table, and also after, while it belongs to this rank's latest
// push() whose completion the caller has not taken (OpState::taken: a
// wait() or a poll() that saw it). Without the second rule a second call
// right after the first would be refused only when the first had not been
// agreed yet: on the last rank to enqueue a name, the first call completes
// the operation, which the background thread may take out of the table
// before the caller's next line runs. The latest push only: a caller who
// has gone on to another operation has moved past the first, so a name
// whose handle is dropped without a wait is held until the next push (or
// forget_latest(): a join), never for ever.
//
// Sequence numbers: push() and announce_failure() number each request with
// this rank's count of submissions of its name (1, 2, ...), so that the
// negotiation tells iterations of a reused name apart. A call refused as a
// duplicate is not a submission. Names with the internal prefix "__gyre."
// are unique by construction and always carry 1, so that they take no
// memory here; every other name keeps one counter (a few dozen bytes) until
// restart_sequences().
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "gyre/gyre.h"
#include "queue/request.h"
#include "queue/op_state.h"

namespace gyre::core {

struct LocalEntry {
  Request request;
  TensorView in;
  TensorView out;
  // fingerprint_check / resync: the buffers and their names.
  std::vector<TensorView> buffers;
  std::vector<std::string> buffer_names;
  std::shared_ptr<OpState> state;
  Clock::time_point enqueued{};
  Clock::time_point sent{};  // drained into a negotiation message
};

class TensorQueue {
 public:
  // Adds entries atomically (a grouped operation goes into one round).
  // Throws InvalidArgument if a name is in use on this rank (see above), or
  // is repeated in `entries`, and once closed the error of close()'s kind
  // (StateError after a shutdown, RankFailedError after a rank died). The
  // entries become the latest push; they share one OpState (a group).
  // Wakes the background thread, unless a gyre::WaitFollows lives on the
  // calling thread (gyre.h) and a RoundDriver is set: the thread is about to
  // wait for what it pushes, and Handle::wait() runs the round on it, or
  // wakes the loop if it cannot (RoundDriver). Should the thread not wait
  // after all, the loop's next timed round takes the operation (at most
  // kIdleCycleMax later, rounds.cc).
  void push(std::vector<LocalEntry> entries);
  // The pushes that woke the background thread (a statistic; any thread).
  std::uint64_t push_wakes() const { return push_wakes_.load(std::memory_order_relaxed); }
  // The runtime's RoundDriver, given to every OpState pushed from now on
  // (Handle::wait() may then run rounds itself). Set once, before any push.
  void set_driver(std::shared_ptr<RoundDriver> driver) { driver_ = std::move(driver); }
  // Throws the InvalidArgument of push() if `r.name` is in use on this
  // rank. Called before a call's arguments are checked: a second call of a
  // name in use is refused as a duplicate, whatever else is wrong with it,
  // and never announced.
  void check_not_pending(const Request& r) const;
  // Whether `name` is in use on this rank (see above).
  bool in_use(const std::string& name) const;
  // Queues a request that failed on this rank so the other ranks fail it
  // too; it has no local entry. Not queued (returns false) while the name
  // is in use on this rank: that operation is valid, and the announcement
  // would fail it on the other ranks (or their next one of that name).
  bool announce_failure(Request r);
  // This rank has enqueued another operation that is no push (a join): the
  // latest push's names are no longer held once completed.
  void forget_latest();

  // Background thread: the requests enqueued since the last call.
  std::vector<Request> drain_new();
  // Background thread: removes and returns the entry that answers the
  // agreed operation `name`, whose request from this rank was `mine` (none:
  // this rank sent none). None when this rank takes part without an entry:
  // it joined (`joined`), it never enqueued the name (a stall failure), or
  // its request was a failure it announced (refused at enqueue: such
  // requests have no entry, and an entry of that name now belongs to a
  // later enqueue, which a coming round answers).
  // A rank that took part as a joined rank counts the operation as a
  // submission of its own, numbered `latest_seq` (the highest any rank
  // sent), so that its later submissions of the name carry the numbers the
  // other ranks' do. execution/executor.h's take_entry() reads these
  // from a Response.
  std::optional<LocalEntry> take_for(const std::string& name, const std::optional<Request>& mine,
                                     bool joined, std::uint64_t latest_seq);
  // Background thread: copies the input of the entry request `r` (drained,
  // not yet answered) stands for into `out`, if that entry is in host
  // memory and `out` is its size; false otherwise (a round's speculation:
  // negotiation/negotiator.h).
  bool copy_input(const Request& r, std::span<std::byte> out) const;
  // Background thread: every name starts again at 1 (an agreed resync: the
  // ranks have repaired their state and count iterations afresh).
  void restart_sequences();
  // Removes every entry and refuses further pushes with `reason`.
  std::vector<LocalEntry> close(const std::string& reason, ErrorKind kind = ErrorKind::kState);

  // Background thread: sleeps until new work, wake(), or `timeout`. For the
  // first `spin` of it (at most `timeout`) it polls instead, yielding the
  // core between polls: an enqueue right after a completion (a loop of
  // small operations) is then seen without the caller waking this thread
  // through the condition variable, which costs a system call and a
  // scheduler wake-up on both sides.
  void wait_for_work(std::chrono::microseconds timeout,
                     std::chrono::microseconds spin = std::chrono::microseconds(0));
  // Ends the current wait_for_work() (a round is then due: see has_work()).
  void wake();
  // Ends the current (or next) wait_for_work() without making a round due:
  // point-to-point work for a loop that drives the engine (p2p_engine.h).
  void nudge();
  // Enqueued work or a wake() since the last drain: a round is due.
  bool has_work() const { return has_work_.load(std::memory_order_acquire); }

  std::vector<std::string> pending_names() const;
  std::size_t size() const;

 private:
  std::shared_ptr<RoundDriver> driver_;  // set before the first push, read-only after
  // Stamps r.seq with the next submission number of r.name. Caller holds mu_.
  void number(Request& r);
  // in_use() with mu_ held.
  bool in_use_locked(const std::string& name) const;

  // Guards table_, latest_, fresh_, submitted_, woken_, nudged_ and closed_reason_.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<std::string, LocalEntry> table_;
  // The names of the latest push() (internal names left out: never
  // enqueued twice) and the taken flag of their OpState.
  std::unordered_set<std::string> latest_names_;
  std::shared_ptr<const std::atomic<bool>> latest_taken_;
  std::vector<Request> fresh_;  // enqueued since the last drain
  std::unordered_map<std::string, std::uint64_t> submitted_;  // name -> submissions
  bool woken_ = false;
  std::atomic<std::uint64_t> push_wakes_{0};
  bool nudged_ = false;  // nudge() since the last wait_for_work() returned
  // !fresh_.empty() || woken_, readable without mu_ (wait_for_work's polls).
  std::atomic<bool> has_work_{false};
  std::optional<std::string> closed_reason_;
  ErrorKind closed_kind_ = ErrorKind::kState;  // what push() throws once closed
};

}  // namespace gyre::core
