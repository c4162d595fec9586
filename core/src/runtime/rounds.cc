// Who runs the negotiation rounds: the background thread's loop, and a
// thread about to block in Handle::wait() (CallerRounds, the RoundDriver
// of queue/op_state.h).
//
// A round is collective: every rank runs the same rounds in the same order,
// whichever of its threads runs them. One mutex (CallerRounds::mu) makes the
// rounds of a rank one at a time: the background thread takes it for each
// round, a waiting caller only if no round is running (try_lock), so a
// caller never waits for it. A caller that gets it runs up to
// kCallerRounds rounds, fewer once its operation is done, then waits as
// before: the usual case, a caller that waits at once for the operation it
// just enqueued, completes it on its own thread, without handing it to the
// background thread and being woken (two thread hand-offs, most of the
// runtime's per-call cost on a busy machine). Everything a round touches is
// under the mutex; the background thread's own pacing (idle backoff, the
// spin after a round that ran operations) is computed under it too.
#include <algorithm>
#include <chrono>
#include <thread>

#include "gyre/collectives/naps.h"
#include "runtime/options_table.h"
#include "runtime/runtime.h"

namespace gyre::core {

namespace {

// Longest sleep between idle negotiation rounds (see loop()).
constexpr std::chrono::microseconds kIdleCycleMax{16000};
// Most rounds a waiting caller runs before it waits as before: a few, so
// that a request that missed a peer's round is taken by the next.
constexpr int kCallerRounds = 4;
// How long the background thread, finding work, leaves the round to a
// caller who may be about to wait for it (see loop()).
constexpr std::chrono::microseconds kCallerGrace{20};

// Set while this thread runs a round: a Handle::wait() inside one (an
// on_complete callback's) never runs rounds itself (the mutex is not
// recursive).
thread_local bool t_in_round = false;

struct InRound {
  InRound() { t_in_round = true; }
  ~InRound() { t_in_round = false; }
};

}  // namespace

void CallerRounds::drive(const OpState& op) noexcept {
  if (t_in_round) return;
  {
    std::unique_lock<std::mutex> lock(mu, std::try_to_lock);
    if (lock.owns_lock()) {
      if (runtime == nullptr) return;
      InRound in_round;
      runtime->drive_for(op);
      if (op.done.load(std::memory_order_acquire)) return;
    }
  }
  // The caller now waits for the background thread (or for another thread
  // running a round now): an operation pushed without waking the loop
  // (WaitFollows, tensor_queue.h) must not wait for its idle timeout.
  handoffs.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(wake_mu);
  if (queue != nullptr) queue->nudge();
}

bool Runtime::callers_may_run_rounds() const {
  // Not with the point-to-point engine on this loop (the loop services it
  // between rounds).
  return opt_.caller_rounds != 0 && !info_.p2p;
}

bool Runtime::callers_run_rounds_now() const {
  // Not once this rank has used a CUDA tensor: a round may then run NCCL
  // operations, whose device and streams are the background thread's.
  return callers_run_rounds_ && cuda_device_.load() < 0;
}

void Runtime::drive_for(const OpState& op) {
  if (rounds_finished_ || !callers_run_rounds_now()) return;
  try {
    for (int i = 0; i < kCallerRounds && !op.done.load(std::memory_order_acquire); ++i) {
      caller_rounds_run_.fetch_add(1, std::memory_order_relaxed);
      if (!round()) {
        rounds_finished_ = true;
        queue_.wake();  // the loop ends
        return;
      }
    }
  } catch (const std::exception& e) {
    rounds_finished_ = true;
    fatal(e);
    queue_.wake();
  }
}

void Runtime::loop() {
  collectives::precise_naps_for_this_thread();  // its transfers' naps (naps.h)
  // Floored (options_table.h): a cycle of 0 would run rounds back to back.
  const auto cycle = std::chrono::microseconds(
      static_cast<long>(std::max(opt_.cycle_time_ms, kMinCycleTimeMs) * 1000.0));
  // Idle rounds (nothing enqueued, pending or said by any rank) come
  // further apart, the sleep doubling from the cycle time up to
  // kIdleCycleMax: each round is an exchange with every rank, and a rank
  // waiting for a peer busy elsewhere contends with its own process's MPI
  // calls and computation. Latency does not suffer: an enqueue wakes its
  // rank at once, and a round can complete nothing before every rank has
  // enqueued the tensor anyway. A joined rank keeps the cycle time, since
  // the others' tensors wait for its rounds.
  auto idle_sleep = cycle;
  const auto spin = spin_time();
  const auto idle_max = std::max(cycle, kIdleCycleMax);
  auto next_spin = std::chrono::microseconds(0);
  bool first = true;
  // A wake-up that finds the callers running the rounds (below): no round
  // of this thread's own, and the sleep backs off as after an idle round.
  auto leave_to_callers = [&] {
    rounds_left_to_callers_.fetch_add(1, std::memory_order_relaxed);
    idle_sleep = std::min(2 * idle_sleep, idle_max);
  };
  // The first round doubles as the start-up barrier: ranks may reach init()
  // seconds apart, so it gets at least kStartupTimeoutS; a rank whose init()
  // failed after creating its transport still ends the job then.
  if (opt_.op_timeout_s > 0) t_->set_timeout(startup_deadline(opt_));
  while (true) {
    // After a round that ran operations the caller's next one often
    // follows at once: poll for it first (see TensorQueue).
    std::uint64_t callers_before = 0;
    if (!first) {
      callers_before = caller_rounds_run_.load(std::memory_order_acquire);
      wait_for_work(idle_sleep, next_spin);
      // Only while a caller can take the round: on a rank that has used a
      // CUDA tensor nobody would, and the grace would only delay it.
      if (caller_grace_.count() > 0 && callers_run_rounds_now()) {
        caller_graces_.fetch_add(1, std::memory_order_relaxed);
        // Work has come: the caller who enqueued it may be about to wait
        // for it and run the round itself (its thread is running already;
        // this one would hand the result back to it). Give it a moment.
        const auto until = std::chrono::steady_clock::now() + caller_grace_;
        while (queue_.has_work() && !shutdown_requested_.load() &&
               std::chrono::steady_clock::now() < until) {
          std::this_thread::yield();
        }
      }
    }
    std::unique_lock<std::mutex> lock(callers_->mu, std::defer_lock);
    if (first) {
      lock.lock();
    } else if (!lock.try_lock()) {
      // A waiting caller runs a round: it takes what was enqueued, and
      // hands its operation over (a nudge) if it cannot complete it; until
      // then this thread sleeps on, backing off (see below).
      if (!queue_.has_work()) leave_to_callers();
      next_spin = std::chrono::microseconds(0);
      std::this_thread::yield();
      continue;
    }
    InRound in_round;
    if (rounds_finished_) break;
    // Waiting callers ran rounds while this thread slept, and the rounds
    // so far (theirs or this thread's) left nothing enqueued, held or
    // pending on this rank, so no operation handed over to this thread is
    // still open (read under the rounds' mutex, so no round is running):
    // the callers drive the rounds, as in a loop of blocking
    // calls. A round of this thread's own would only be one more that every
    // rank has to answer, meeting the callers' rounds at random, and its
    // wake-ups, every cycle, take a core from ranks that poll (across 8
    // simulated hosts on 2 cores an 8-byte allreduce between other work
    // took 1.5-1.8x as long; docs/architecture.md). So it sleeps on, backing
    // off as after an idle round; work, a hand-over or a flag ends the
    // sleep, and once callers stop running rounds it runs them again.
    if (!first && caller_rounds_run_.load(std::memory_order_acquire) != callers_before &&
        !queue_.has_work() && !shutdown_requested_.load() && !join_requested_.load() &&
        stall_failures_.empty() && queue_.size() == 0 && negotiator_.holds_nothing()) {
      leave_to_callers();
      next_spin = std::chrono::microseconds(0);
      continue;
    }
    bool go_on = false;
    try {
      go_on = round();
    } catch (const std::exception& e) {
      rounds_finished_ = true;
      fatal(e);
      break;
    }
    if (!go_on) {
      rounds_finished_ = true;
      break;
    }
    if (first) {
      first = false;
      if (opt_.op_timeout_s > 0) {
        t_->set_timeout(std::chrono::milliseconds(
            std::max<long>(1, static_cast<long>(opt_.op_timeout_s * 1000.0))));
      }
      callers_run_rounds_ = callers_may_run_rounds();
      if (callers_run_rounds_) caller_grace_ = kCallerGrace;
    }
    idle_sleep = last_round_idle_ ? std::min(2 * idle_sleep, idle_max) : cycle;
    next_spin = last_round_ran_ ? spin : std::chrono::microseconds(0);
  }
  stopped_ = true;
  // Nothing drives the engine any more: what is pending fails, later
  // operations are refused (StateError), none waits for a loop that is gone.
  if (info_.p2p) info_.p2p->stop();
}

void Runtime::wait_for_work(std::chrono::microseconds timeout, std::chrono::microseconds spin) {
  if (!info_.p2p) {
    queue_.wait_for_work(timeout, spin);
    return;
  }
  // The engine's own thread's policy (p2p_engine.cc): while operations are
  // pending, a few passes back to back, then naps doubling from 10 us to
  // 1 ms; with none, sleep until a submission nudges the queue.
  const auto round_due = std::chrono::steady_clock::now() + timeout;
  int quiet = 0;
  for (;;) {
    const P2pEngine::Pass p = info_.p2p->service();
    quiet = p.moved ? 0 : quiet + 1;
    const auto now = std::chrono::steady_clock::now();
    if (queue_.has_work() || now >= round_due) return;
    auto wait = std::chrono::duration_cast<std::chrono::microseconds>(round_due - now);
    if (p.pending) {
      wait = std::min(wait, quiet <= 16 ? std::chrono::microseconds(0)
                                        : std::chrono::microseconds(std::min(
                                              1000, 10 << std::min(quiet - 16, 7))));
    }
    if (wait.count() == 0) {
      std::this_thread::yield();
    } else {
      queue_.wait_for_work(wait, spin);
      spin = std::chrono::microseconds(0);
    }
  }
}

}  // namespace gyre::core
