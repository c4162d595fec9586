// OpState completion and the gyre::Handle methods.
#include "queue/op_state.h"

#include <cstdio>

#include "gyre/error.h"

namespace gyre {
namespace core {

void OpState::complete_one(std::exception_ptr err) {
  std::vector<std::function<void(std::exception_ptr)>> to_call;
  std::exception_ptr final_error;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (done.load(std::memory_order_relaxed)) return;
    if (err && !error) error = err;
    if (--remaining > 0) return;
    final_error = error;
    to_call.swap(callbacks);
    done.store(true, std::memory_order_release);
  }
  cv.notify_all();
  for (auto& fn : to_call) run_callback(fn, final_error);
}

void OpState::run_callback(const std::function<void(std::exception_ptr)>& fn,
                           std::exception_ptr err) {
  // A throwing callback must not unwind into the background thread's loop
  // (which would end the job): report it and go on. The same when it runs
  // at once on the registering thread, so a callback behaves alike wherever
  // it runs.
  try {
    fn(err);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[gyre] an on_complete callback threw: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "[gyre] an on_complete callback threw a non-standard exception\n");
  }
}

}  // namespace core

namespace {
core::OpState& checked(const std::shared_ptr<core::OpState>& s) {
  if (!s) throw StateError("gyre::Handle is empty (default-constructed)");
  return *s;
}
}  // namespace

void Handle::wait() const {
  auto& s = checked(state_);
  if (!s.done.load(std::memory_order_acquire) && s.driver) s.driver->drive(s);
  if (!s.done.load(std::memory_order_acquire)) {
    std::unique_lock<std::mutex> lock(s.mu);
    s.cv.wait(lock, [&] { return s.done.load(std::memory_order_relaxed); });
  }
  std::exception_ptr err;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    err = s.error;
  }
  s.taken->store(true, std::memory_order_release);
  if (err) std::rethrow_exception(err);
}

bool Handle::wait_for(std::chrono::nanoseconds timeout) const {
  auto& s = checked(state_);
  if (!s.done.load(std::memory_order_acquire) && s.driver) s.driver->drive(s);
  if (!s.done.load(std::memory_order_acquire)) {
    std::unique_lock<std::mutex> lock(s.mu);
    if (!s.cv.wait_for(lock, timeout, [&] { return s.done.load(std::memory_order_relaxed); })) {
      return false;
    }
  }
  s.taken->store(true, std::memory_order_release);
  return true;
}

bool Handle::poll() const {
  auto& s = checked(state_);
  if (!s.done.load(std::memory_order_acquire)) return false;
  s.taken->store(true, std::memory_order_release);
  return true;
}

void Handle::on_complete(std::function<void(std::exception_ptr)> fn) const {
  auto& s = checked(state_);
  std::exception_ptr err;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.done.load(std::memory_order_relaxed)) {
      s.callbacks.push_back(std::move(fn));
      return;
    }
    err = s.error;
  }
  core::OpState::run_callback(fn, err);
}

const OwnedTensor& Handle::output() const { return checked(state_).output; }

const std::vector<std::int64_t>& Handle::received_splits() const {
  return checked(state_).received_splits;
}

int Handle::join_last_rank() const { return checked(state_).join_last_rank; }
int Handle::source_rank() const { return checked(state_).source_rank; }

const std::vector<FingerprintMismatch>& Handle::mismatches() const {
  return checked(state_).mismatches;
}

}  // namespace gyre
