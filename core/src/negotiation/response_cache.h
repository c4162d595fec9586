// ResponseCache: the requests of recently completed operations, by slot.
//
// Every rank holds an identical copy: it is only changed by the background
// thread while it processes the agreed responses of a round, in the agreed
// order, so the same inserts, touches and evictions happen everywhere. A
// rank that enqueues a request equal to a cached one, as its next
// submission of that name (sequence number one more than the cached
// one's), sends the slot number (one bit) instead of the request; receivers
// look the slot up in their own copy and take the sequence number as the
// cached one's plus one. A request of any other number travels in full and
// is compared. Eviction is least-recently-used. Capacity 0 disables the
// cache.
//
// Thread: background thread only.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "negotiation/message.h"

namespace gyre::core {

class ResponseCache {
 public:
  explicit ResponseCache(std::size_t capacity) : capacity_(capacity) {}

  // The slot holding a request equal to `r` (same_operation) whose
  // sequence number is r.seq - 1, if any.
  std::optional<std::uint32_t> find(const Request& r) const;
  // The request cached in `slot` with the sequence number a hit on it
  // stands for (one more than the cached one's); throws TransportError for an empty slot
  // (a peer referring to a slot this rank does not hold: caches diverged).
  Request hit(std::uint32_t slot) const;
  // Inserts or refreshes the entry for r.name (replacing a different
  // request of the same name) and marks it most recently used.
  void put(const Request& r);
  std::size_t size() const { return by_name_.size(); }
  // Slots in use or used before (eviction reuses them): the same on every
  // rank, so it sizes the bit vectors of a log-depth round.
  std::size_t slot_count() const { return slots_.size(); }
  std::size_t capacity() const { return capacity_; }

 private:
  struct Entry {
    Request request;
    std::list<std::uint32_t>::iterator lru_pos;
    bool used = false;
  };
  std::size_t capacity_;
  std::vector<Entry> slots_;
  std::unordered_map<std::string, std::uint32_t> by_name_;
  std::list<std::uint32_t> lru_;  // front: most recently used
};

}  // namespace gyre::core
