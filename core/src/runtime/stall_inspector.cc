#include "runtime/stall_inspector.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace gyre::core {

std::vector<std::string> StallInspector::inspect(const Coordinator& coord, Clock::time_point now,
                                                 const Logger& log) {
  std::vector<std::string> expire;
  const auto& pending = coord.pending();
  // Forget tensors that completed.
  std::erase_if(last_warned_, [&](const auto& kv) { return !pending.count(kv.first); });
  std::erase_if(failing_, [&](const std::string& n) { return !pending.count(n); });

  for (const auto& [name, p] : pending) {
    double age = std::chrono::duration<double>(now - p.first_seen).count();
    if (age < warning_s_ && (shutdown_s_ <= 0 || age < shutdown_s_)) continue;
    std::vector<int> missing, present;
    for (int r = 0; r < coord.size(); ++r) {
      if (p.per_rank[static_cast<std::size_t>(r)]) present.push_back(r);
      else if (!coord.joined()[static_cast<std::size_t>(r)]) missing.push_back(r);
    }
    if (shutdown_s_ > 0 && age >= shutdown_s_ && rank_ == 0 && !failing_.count(name)) {
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
             shutdown_s_ > 0 ? fmt::format(" (it fails after {} s)", shutdown_s_)
                             : std::string(" (GYRE_STALL_SHUTDOWN_S=0: waiting forever)"));
  }
  return expire;
}

}  // namespace gyre::core
