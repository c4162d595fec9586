#include "runtime/process_set_table.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "gyre/error.h"

namespace gyre::core {

std::shared_ptr<Runtime> ProcessSetTable::runtime_of(const char* call, int id, int rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sets_.find(id);
  if (it == sets_.end()) {
    if (std::string dropped = dropped_error_locked(call, id); !dropped.empty()) {
      throw StateError(dropped);
    }
    throw InvalidArgument(fmt::format(
        "{}: no process set has id {} (registered: 0 (global){}{}); add it with "
        "add_process_set() on every rank first",
        call, id, sets_.empty() ? "" : ", ",
        fmt::join([&] {
          std::vector<int> v;
          for (const auto& [k, e] : sets_) v.push_back(k);
          return v;
        }(), ", ")));
  }
  if (!it->second.runtime) {
    throw InvalidArgument(fmt::format(
        "{}: rank {} is not in process set {} (ranks [{}]); only its ranks may call its "
        "collectives",
        call, rank, id, fmt::join(it->second.ranks, ", ")));
  }
  return it->second.runtime;
}

std::optional<ProcessSetEntry> ProcessSetTable::find(int id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sets_.find(id);
  if (it == sets_.end()) return std::nullopt;
  return it->second;
}

std::optional<int> ProcessSetTable::find_ranks(const std::vector<int>& ranks,
                                               bool members_only) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, e] : sets_) {
    if (e.ranks == ranks && e.members_only == members_only) return id;
  }
  return std::nullopt;
}

std::vector<int> ProcessSetTable::ids() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int> v;
  for (const auto& [id, e] : sets_) v.push_back(id);
  return v;
}

int ProcessSetTable::next_id() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_id_;
}

int ProcessSetTable::insert(int id, std::vector<int> ranks, std::shared_ptr<Runtime> runtime,
                            bool members_only) {
  std::lock_guard<std::mutex> lock(mu_);
  if (id < next_id_ || sets_.count(id)) {
    throw StateError(fmt::format("process set id {} is taken here (next free: {})", id, next_id_));
  }
  next_id_ = id + 1;
  sets_[id] = ProcessSetEntry{id, std::move(ranks), std::move(runtime), members_only};
  return id;
}

std::shared_ptr<Runtime> ProcessSetTable::erase(int id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sets_.find(id);
  if (it == sets_.end()) return nullptr;
  auto rt = std::move(it->second.runtime);
  sets_.erase(it);
  return rt;
}

std::vector<std::shared_ptr<Runtime>> ProcessSetTable::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<Runtime>> v;
  for (auto& [id, e] : sets_) {
    if (e.runtime) v.push_back(std::move(e.runtime));
  }
  sets_.clear();
  dropped_.clear();
  // The next runtime numbers its sets from 1 again, on every rank alike:
  // ranks whose previous runtimes differed (init() on a subset of the
  // ranks, then on all) must give a new set the same id (its transport's
  // MPI tag).
  next_id_ = 1;
  return v;
}

std::vector<std::shared_ptr<Runtime>> ProcessSetTable::drop_for_rebuild() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<Runtime>> v;
  for (auto& [id, e] : sets_) {
    if (e.runtime) v.push_back(std::move(e.runtime));
    dropped_[id] = std::move(e.ranks);
  }
  sets_.clear();
  return v;
}

std::string ProcessSetTable::dropped_error(const char* call, int id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_error_locked(call, id);
}

std::string ProcessSetTable::dropped_error_locked(const char* call, int id) const {
  auto it = dropped_.find(id);
  if (it == dropped_.end()) return {};
  return fmt::format(
      "{}: process set {} (ranks [{}] of the world before the rebuild) was dropped by "
      "gyre::rebuild() after a rank's failure: process sets do not survive a rebuild; add it "
      "again with add_process_set() on every rank, with the ranks as the rebuild renumbered them",
      call, id, fmt::join(it->second, ", "));
}

}  // namespace gyre::core
