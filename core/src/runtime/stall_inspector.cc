#include "runtime/stall_inspector.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace gyre::core {

void StallInspector::set_deadline(const std::string& prefix, double seconds) {
  std::lock_guard<std::mutex> lock(deadlines_mu_);
  if (seconds > 0) deadlines_[prefix] = seconds;
  else deadlines_.erase(prefix);
}

double StallInspector::deadline_of(const std::map<std::string, double>& deadlines,
                                   double shutdown_s, const std::string& name) {
  const std::string* best = nullptr;
  double limit = 0;
  for (const auto& [prefix, seconds] : deadlines) {
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    if (best == nullptr || prefix.size() > best->size()) {
      best = &prefix;
      limit = seconds;
    }
  }
  if (best == nullptr) return shutdown_s;
  return shutdown_s > 0 ? std::min(limit, shutdown_s) : limit;
}

std::vector<std::string> StallInspector::inspect(const Coordinator& coord, Clock::time_point now,
                                                 const Logger& log) {
  std::vector<std::string> expire;
  const auto& pending = coord.pending();
  std::map<std::string, double> deadlines;
  {
    std::lock_guard<std::mutex> lock(deadlines_mu_);
    deadlines = deadlines_;
  }
  // Forget tensors that completed.
  std::erase_if(last_warned_, [&](const auto& kv) { return !pending.count(kv.first); });
  std::erase_if(failing_, [&](const std::string& n) { return !pending.count(n); });

  for (const auto& [name, p] : pending) {
    double age = std::chrono::duration<double>(now - p.first_seen).count();
    const double limit = deadlines.empty() ? shutdown_s_ : deadline_of(deadlines, shutdown_s_, name);
    if (age < warning_s_ && (limit <= 0 || age < limit)) continue;
    std::vector<int> missing, present;
    for (int r = 0; r < coord.size(); ++r) {
      if (p.per_rank[static_cast<std::size_t>(r)]) present.push_back(r);
      else if (!coord.joined()[static_cast<std::size_t>(r)]) missing.push_back(r);
    }
    if (limit > 0 && age >= limit && rank_ == 0 && !failing_.count(name)) {
      failing_.insert(name);
      expire.push_back(name);
    }
    bool mine = p.per_rank[static_cast<std::size_t>(rank_)].has_value();
    if (!mine || age < warning_s_) continue;
    auto it = last_warned_.find(name);
    if (it != last_warned_.end() &&
        std::chrono::duration<double>(now - it->second).count() < warning_s_) {
      continue;
    }
    last_warned_[name] = now;
    log.warn("stall: tensor '{}' was enqueued by ranks [{}] {:.1f} s ago but ranks [{}] have "
             "not enqueued it; ranks are running different code paths or are stuck{}",
             name, fmt::join(present, ", "), age, fmt::join(missing, ", "),
             limit > 0 ? fmt::format(" (it fails after {} s)", limit)
                             : std::string(" (GYRE_STALL_SHUTDOWN_S=0: waiting forever)"));
  }
  return expire;
}

}  // namespace gyre::core
