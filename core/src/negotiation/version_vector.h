// VersionVector: this rank's view of how many steps every rank committed.
//
// Entry r is the step rank r reported in its latest negotiation message, so
// the vector is refreshed every round at no extra cost. This rank's own
// count is kept separately (an atomic advanced by commit_step() on a user
// thread) and overlaid on the snapshot. check_lag() is the rule applied to
// the steps carried by the requests of one tensor.
//
// Threads: update()/set_all() on the background thread; snapshot() and the
// own-step accessors on any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace gyre::core {

class VersionVector {
 public:
  VersionVector(int rank, int size) : rank_(rank), steps_(size, 0) {}

  void commit() { own_.fetch_add(1, std::memory_order_relaxed); }
  std::uint64_t own() const { return own_.load(std::memory_order_relaxed); }

  void update(int r, std::uint64_t step);
  // Every rank agreed on `step` (resync): the own count and all entries.
  void set_all(std::uint64_t step);
  std::vector<std::uint64_t> snapshot() const;

 private:
  int rank_;
  std::atomic<std::uint64_t> own_{0};
  // Guards steps_.
  mutable std::mutex mu_;
  std::vector<std::uint64_t> steps_;
};

// Per rank: how many committed steps it is behind the most advanced rank
// of `steps` (a snapshot()): what runtime_stats() and the timeline report.
std::vector<std::uint64_t> steps_behind(const std::vector<std::uint64_t>& steps);

// The steps of the ranks that submitted one tensor (nullopt: did not).
// Returns the DivergenceError text when they differ by more than max_lag.
std::optional<std::string> check_lag(const std::string& what,
                                     const std::vector<std::optional<std::uint64_t>>& steps,
                                     long max_lag);

}  // namespace gyre::core
