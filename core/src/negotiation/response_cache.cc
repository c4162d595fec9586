#include "negotiation/response_cache.h"

#include <fmt/format.h>

#include "gyre/error.h"

namespace gyre::core {

std::optional<std::uint32_t> ResponseCache::find(const Request& r) const {
  auto it = by_name_.find(r.name);
  if (it == by_name_.end()) return std::nullopt;
  const Request& cached = slots_[it->second].request;
  if (cached.seq + 1 != r.seq || !cached.same_operation(r)) return std::nullopt;
  return it->second;
}

Request ResponseCache::hit(std::uint32_t slot) const {
  if (slot >= slots_.size() || !slots_[slot].used) {
    throw TransportError(fmt::format(
        "response cache slot {} is empty on this rank: the ranks' caches diverged", slot));
  }
  Request r = slots_[slot].request;
  ++r.seq;
  return r;
}

void ResponseCache::put(const Request& r) {
  if (capacity_ == 0) return;
  auto it = by_name_.find(r.name);
  if (it != by_name_.end()) {
    Entry& e = slots_[it->second];
    e.request = r;
    e.request.step = 0;
    e.request.error_kind = ErrorKind::kNone;
    e.request.error.clear();
    lru_.splice(lru_.begin(), lru_, e.lru_pos);
    return;
  }
  std::uint32_t slot;
  if (by_name_.size() >= capacity_) {
    // Evict the least recently used entry and reuse its slot.
    slot = lru_.back();
    lru_.pop_back();
    by_name_.erase(slots_[slot].request.name);
  } else {
    slot = static_cast<std::uint32_t>(slots_.size());
    slots_.emplace_back();
  }
  Entry& e = slots_[slot];
  e.request = r;
  e.request.step = 0;
  e.request.error_kind = ErrorKind::kNone;
  e.request.error.clear();
  e.used = true;
  lru_.push_front(slot);
  e.lru_pos = lru_.begin();
  by_name_[r.name] = slot;
}

}  // namespace gyre::core
