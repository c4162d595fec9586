// TensorQueue: pending entries, failure announcements, submission counts.
#include "queue/tensor_queue.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <unordered_set>

#include <fmt/format.h>

#include "gyre/error.h"

namespace gyre::core {

namespace {

constexpr std::string_view kInternalPrefix = "__gyre.";

[[noreturn]] void throw_duplicate(const Request& r) {
  throw InvalidArgument(fmt::format(
      "{} '{}': an operation with this name is already pending on this rank (its handle not "
      "waited yet); wait for it before enqueueing the name again",
      collective_name(r.collective), r.name));
}

bool is_internal(const std::string& name) { return name.rfind(kInternalPrefix, 0) == 0; }

}  // namespace

void TensorQueue::number(Request& r) {
  if (is_internal(r.name)) {
    r.seq = 1;
    return;
  }
  r.seq = ++submitted_[r.name];
}

bool TensorQueue::in_use_locked(const std::string& name) const {
  if (table_.count(name)) return true;
  return latest_taken_ && !latest_taken_->load(std::memory_order_acquire) &&
         latest_names_.count(name);
}

bool TensorQueue::in_use(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_locked(name);
}

void TensorQueue::check_not_pending(const Request& r) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (in_use_locked(r.name)) throw_duplicate(r);
}

void TensorQueue::forget_latest() {
  std::lock_guard<std::mutex> lock(mu_);
  latest_names_.clear();
  latest_taken_.reset();
}

namespace {
thread_local bool t_wait_follows = false;  // a gyre::WaitFollows lives on this thread
}  // namespace

void TensorQueue::push(std::vector<LocalEntry> entries) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_reason_) std::rethrow_exception(make_error(closed_kind_, *closed_reason_));
    if (entries.size() == 1) {  // the common case: no set of names to build
      if (in_use_locked(entries[0].request.name)) throw_duplicate(entries[0].request);
    } else {
      std::unordered_set<std::string> seen;
      for (const auto& e : entries) {
        if (in_use_locked(e.request.name) || !seen.insert(e.request.name).second) {
          throw_duplicate(e.request);
        }
      }
    }
    latest_names_.clear();
    latest_taken_.reset();
    if (!entries.empty() && entries[0].state) {
      latest_taken_ = entries[0].state->taken;
      if (driver_) entries[0].state->driver = driver_;
    }
    auto now = Clock::now();
    for (auto& e : entries) {
      if (latest_taken_ && !is_internal(e.request.name)) latest_names_.insert(e.request.name);
      e.enqueued = now;
      number(e.request);
      fresh_.push_back(e.request);
      has_work_.store(true, std::memory_order_release);
      std::string name = e.request.name;
      table_.emplace(std::move(name), std::move(e));
    }
  }
  if (t_wait_follows && driver_) return;
  push_wakes_.fetch_add(1, std::memory_order_relaxed);
  cv_.notify_one();
}

bool TensorQueue::announce_failure(Request r) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_reason_ || in_use_locked(r.name)) return false;
    number(r);
    fresh_.push_back(std::move(r));
    has_work_.store(true, std::memory_order_release);
  }
  cv_.notify_one();
  return true;
}

std::vector<Request> TensorQueue::drain_new() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Request> out;
  out.swap(fresh_);
  woken_ = false;
  has_work_.store(false, std::memory_order_release);
  auto now = Clock::now();
  for (const auto& r : out) {
    auto it = table_.find(r.name);
    if (it != table_.end()) it->second.sent = now;
  }
  return out;
}

std::optional<LocalEntry> TensorQueue::take_for(const std::string& name,
                                                const std::optional<Request>& mine, bool joined,
                                                std::uint64_t latest_seq) {
  if (!mine && joined) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!is_internal(name)) {
      auto& count = submitted_[name];
      count = std::max(count, latest_seq);
    }
    return std::nullopt;
  }
  if (!mine || mine->error_kind != ErrorKind::kNone) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = table_.find(name);
  // An entry of another number is a later submission of the name.
  if (it == table_.end() || it->second.request.seq != mine->seq) return std::nullopt;
  LocalEntry e = std::move(it->second);
  table_.erase(it);
  return e;
}

bool TensorQueue::copy_input(const Request& r, std::span<std::byte> out) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = table_.find(r.name);
  if (it == table_.end() || it->second.request.seq != r.seq) return false;
  const TensorView& in = it->second.in;
  if (in.device.type != DeviceType::kCPU || in.data == nullptr ||
      static_cast<std::size_t>(numel(in.shape)) * dtype_size(in.dtype) != out.size()) {
    return false;
  }
  std::memcpy(out.data(), in.data, out.size());
  return true;
}

void TensorQueue::restart_sequences() {
  std::lock_guard<std::mutex> lock(mu_);
  submitted_.clear();
}

std::vector<LocalEntry> TensorQueue::close(const std::string& reason, ErrorKind kind) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!closed_reason_) {  // the first reason is the cause
    closed_reason_ = reason;
    closed_kind_ = kind;
  }
  std::vector<LocalEntry> out;
  for (auto& [name, e] : table_) out.push_back(std::move(e));
  table_.clear();
  fresh_.clear();
  latest_names_.clear();
  latest_taken_.reset();
  return out;
}

void TensorQueue::wait_for_work(std::chrono::microseconds timeout,
                                std::chrono::microseconds spin) {
  const auto deadline = Clock::now() + timeout;
  if (spin.count() > 0) {
    const auto end = std::min(Clock::now() + spin, deadline);
    while (!has_work_.load(std::memory_order_acquire)) {
      if (Clock::now() >= end) break;
      std::this_thread::yield();
    }
  }
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_until(lock, deadline, [&] { return !fresh_.empty() || woken_ || nudged_; });
  nudged_ = false;
}

void TensorQueue::nudge() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    nudged_ = true;
  }
  cv_.notify_one();
}

void TensorQueue::wake() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    woken_ = true;
    has_work_.store(true, std::memory_order_release);
  }
  cv_.notify_one();
}

std::vector<std::string> TensorQueue::pending_names() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const auto& [name, e] : table_) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

std::size_t TensorQueue::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return table_.size();
}

}  // namespace gyre::core

gyre::WaitFollows::WaitFollows() : outer_(gyre::core::t_wait_follows) {
  gyre::core::t_wait_follows = true;
}
gyre::WaitFollows::~WaitFollows() { gyre::core::t_wait_follows = outer_; }
