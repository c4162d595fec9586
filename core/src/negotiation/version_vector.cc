#include "negotiation/version_vector.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace gyre::core {

void VersionVector::update(int r, std::uint64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  steps_[static_cast<std::size_t>(r)] = step;
}

void VersionVector::set_all(std::uint64_t step) {
  own_.store(step, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(mu_);
  std::fill(steps_.begin(), steps_.end(), step);
}

std::vector<std::uint64_t> VersionVector::snapshot() const {
  std::vector<std::uint64_t> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out = steps_;
  }
  out[static_cast<std::size_t>(rank_)] = own();
  return out;
}

std::optional<std::string> check_lag(const std::string& what,
                                     const std::vector<std::optional<std::uint64_t>>& steps,
                                     long max_lag) {
  std::uint64_t lo = UINT64_MAX, hi = 0;
  for (const auto& s : steps) {
    if (!s) continue;
    lo = std::min(lo, *s);
    hi = std::max(hi, *s);
  }
  if (lo == UINT64_MAX || hi - lo <= static_cast<std::uint64_t>(std::max(0L, max_lag))) {
    return std::nullopt;
  }
  // Group ranks by step so the message reads "ranks [0, 2] at step 5, rank 1 at step 4".
  std::map<std::uint64_t, std::vector<int>> by_step;
  for (std::size_t r = 0; r < steps.size(); ++r) {
    if (steps[r]) by_step[*steps[r]].push_back(static_cast<int>(r));
  }
  std::string parts;
  for (auto it = by_step.rbegin(); it != by_step.rend(); ++it) {
    if (!parts.empty()) parts += "; ";
    parts += fmt::format("{} {} at step {}", it->second.size() == 1 ? "rank" : "ranks",
                         fmt::join(it->second, ", "), it->first);
  }
  return fmt::format(
      "{}: ranks diverged, committed steps differ by {} (more than the allowed version lag {}): {}",
      what, hi - lo, max_lag, parts);
}

std::vector<std::uint64_t> steps_behind(const std::vector<std::uint64_t>& steps) {
  const std::uint64_t top = steps.empty() ? 0 : *std::max_element(steps.begin(), steps.end());
  std::vector<std::uint64_t> behind;
  behind.reserve(steps.size());
  for (std::uint64_t s : steps) behind.push_back(top - s);
  return behind;
}

}  // namespace gyre::core
