#include "negotiation/response_cache.h"

#include <algorithm>

#include <fmt/format.h>

#include "gyre/error.h"

namespace gyre::core {

std::optional<ResponseCache::Numbered> ResponseCache::numbered(std::string_view name) {
  const std::size_t dot = name.rfind('.');
  if (dot == std::string_view::npos || dot == 0) return std::nullopt;
  const std::string_view digits = name.substr(dot + 1);
  if (digits.empty() || digits.size() > 18 || (digits.size() > 1 && digits[0] == '0')) {
    return std::nullopt;
  }
  std::uint64_t n = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + static_cast<std::uint64_t>(c - '0');
  }
  return Numbered{name.substr(0, dot), n};
}

std::optional<std::uint32_t> ResponseCache::find(const Request& r) const {
  if (auto it = by_name_.find(r.name); it != by_name_.end()) {
    const Request& cached = slots_[it->second].request;
    if (cached.seq + 1 == r.seq && cached.same_operation(r)) return it->second;
  }
  if (r.seq != 1) return std::nullopt;
  const auto num = numbered(r.name);
  if (!num) return std::nullopt;
  auto it = streams_.find(std::string(num->stream));
  if (it == streams_.end() || it->second.last + 1 != num->n) return std::nullopt;
  for (std::uint32_t slot : it->second.slots) {
    if (slots_[slot].request.same_signature(r)) return slot;
  }
  return std::nullopt;
}

Request ResponseCache::hit(std::uint32_t slot) const {
  if (slot >= slots_.size() || !slots_[slot].used) {
    throw TransportError(fmt::format(
        "response cache slot {} is empty on this rank: the ranks' caches diverged", slot));
  }
  const Entry& e = slots_[slot];
  Request r = e.request;
  if (e.stream.empty()) {
    ++r.seq;
  } else {
    r.name = fmt::format("{}.{}", e.stream, streams_.at(e.stream).last + 1);
    r.seq = 1;
  }
  return r;
}

std::uint32_t ResponseCache::take_slot() {
  if (used_ < capacity_) {
    ++used_;  // below capacity no slot was ever emptied: a new one
    slots_.emplace_back();
    return static_cast<std::uint32_t>(slots_.size() - 1);
  }
  // Evict the least recently used entry and reuse its slot.
  const std::uint32_t slot = lru_.back();
  lru_.pop_back();
  Entry& e = slots_[slot];
  if (e.stream.empty()) {
    by_name_.erase(e.request.name);
  } else {
    auto it = streams_.find(e.stream);
    std::erase(it->second.slots, slot);
    if (it->second.slots.empty()) streams_.erase(it);
  }
  e.used = false;
  return slot;
}

void ResponseCache::fill(std::uint32_t slot, const Request& r) {
  Entry& e = slots_[slot];
  e.request = r;
  e.request.step = 0;
  e.request.error_kind = ErrorKind::kNone;
  e.request.error.clear();
  if (!e.used) {
    e.used = true;
    lru_.push_front(slot);
    e.lru_pos = lru_.begin();
  } else {
    lru_.splice(lru_.begin(), lru_, e.lru_pos);
  }
}

void ResponseCache::put(const Request& r) {
  if (capacity_ == 0) return;
  // A numbered name's first submission enters its stream and, like any
  // other name, its own entry: whether the name is a stream's call or a
  // name the caller reuses ("layer.3" every step) shows only later.
  if (r.seq == 1) {
    if (auto num = numbered(r.name)) put_numbered(r, *num);
  }
  if (auto it = by_name_.find(r.name); it != by_name_.end()) {
    fill(it->second, r);
    return;
  }
  const std::uint32_t slot = take_slot();
  slots_[slot].stream.clear();
  fill(slot, r);
  by_name_[r.name] = slot;
}

void ResponseCache::put_numbered(const Request& r, const Numbered& num) {
  const std::string stream(num.stream);
  auto it = streams_.find(stream);
  if (it != streams_.end()) {
    Stream& s = it->second;
    s.last = num.n;
    for (auto pos = s.slots.begin(); pos != s.slots.end(); ++pos) {
      const std::uint32_t slot = *pos;
      if (!slots_[slot].request.same_signature(r)) continue;
      s.slots.erase(pos);
      s.slots.push_back(slot);
      fill(slot, r);
      return;
    }
    if (s.slots.size() >= kPerStream) {
      // The stream's least recently used signature makes way.
      const std::uint32_t old = s.slots.front();
      s.slots.erase(s.slots.begin());
      s.slots.push_back(old);
      fill(old, r);
      return;
    }
  }
  const std::uint32_t slot = take_slot();  // may evict (and erase) this very stream
  Stream& s = streams_[stream];
  s.last = num.n;
  s.slots.push_back(slot);
  slots_[slot].stream = stream;
  fill(slot, r);
}

}  // namespace gyre::core
