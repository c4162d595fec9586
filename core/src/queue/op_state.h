// OpState: the shared completion record behind a gyre::Handle.
//
// Created on the user thread at enqueue; completed (once) by the thread
// running the runtime's rounds (the background thread, or a thread waiting
// in Handle::wait(): RoundDriver), or by the user thread that shuts the
// runtime down. A grouped operation shares one OpState among its tensors:
// it completes when the last member does, with the first error any member
// had.
#pragma once

#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "gyre/gyre.h"

namespace gyre::core {

struct OpState;

// Lets a thread about to block in Handle::wait() run the runtime's rounds
// itself instead of waiting for the background thread to run them and wake
// it (two thread hand-offs per operation). Implemented by the Runtime
// (runtime/rounds.cc); a runtime that is gone, busy on another
// thread, or off (GYRE_CALLER_ROUNDS=0) returns at once.
class RoundDriver {
 public:
  virtual ~RoundDriver() = default;
  // Runs a few rounds on the calling thread while `op` is not done, if no
  // other thread is running one. Never throws; a round's failure is the
  // runtime's (fatal error: every pending operation fails).
  virtual void drive(const OpState& op) noexcept = 0;
};

struct OpState {
  explicit OpState(int members = 1) : remaining(members) {}

  // Called once per member. The last call publishes the result, wakes
  // waiters and runs the callbacks (outside the lock).
  void complete_one(std::exception_ptr err = nullptr);
  // Runs an on_complete callback; an exception it throws is reported on
  // stderr, never propagated.
  static void run_callback(const std::function<void(std::exception_ptr)>& fn,
                           std::exception_ptr err);

  // Guards everything below except `done`, which is also read without the
  // lock by poll().
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<bool> done{false};
  int remaining;
  std::exception_ptr error;
  std::vector<std::function<void(std::exception_ptr)>> callbacks;

  // Set once the caller has taken the completion: Handle::wait() returned
  // or Handle::poll() returned true. A flag of its own, shared with the
  // TensorQueue, which keeps the name of this rank's latest operation
  // reserved until then (tensor_queue.h) without keeping the OpState, and
  // its output, alive.
  std::shared_ptr<std::atomic<bool>> taken = std::make_shared<std::atomic<bool>>(false);

  // The runtime that may run its rounds on the waiting thread (set at
  // enqueue by the TensorQueue); null: none.
  std::shared_ptr<RoundDriver> driver;

  // Results, written by the background thread before completion.
  OwnedTensor output;
  std::vector<std::int64_t> received_splits;
  std::vector<FingerprintMismatch> mismatches;  // fingerprint_check
  int join_last_rank = -1;                      // join
  int source_rank = -1;                         // send_async / recv_async: the peer
};

}  // namespace gyre::core
