// ResponseCache: the requests of recently completed operations, by slot.
//
// Every rank holds an identical copy: it is only changed by the background
// thread while it processes the agreed responses of a round, in the agreed
// order, so the same inserts, touches and evictions happen everywhere. A
// rank that enqueues a request the cache can stand for sends the slot
// number (one bit) instead of the request; receivers look the slot up in
// their own copy and rebuild the request from it. A request the cache
// cannot stand for travels in full and is compared. Eviction is
// least-recently-used over all slots. Capacity 0 disables the cache.
//
// Two kinds of entry:
// - A reused name (Horovod's case: a training loop submits "grad.fc1"
//   every step): the entry holds the name's last request; a hit is the
//   name's next submission (sequence number one more) of the same
//   operation.
// - A numbered name, "<stream>.<n>" with n in canonical decimal, submitted
//   once (sequence number 1): names that callers number themselves so that
//   no two are alike, such as the torch.distributed backend's
//   "torch.<group>.<call>" or gyre.torch's "allreduce.noname.<k>" and the
//   runtime's "__gyre.barrier.<k>". Keyed by name they would never repeat
//   and never hit. They are also kept per stream (a numbered name's first
//   submission enters both kinds of entry, since whether the caller reuses
//   it shows only later, as "layer.3" every step would): one entry per
//   signature (collective, dtype, shape, op, ...; up to kPerStream, least
//   recently used first out) and the n of its call agreed last (not the
//   highest: a caller that numbers afresh, a process group made again under
//   its old name, is followed at once). A
//   request of the stream hits when its n is that n plus one and an
//   entry has its signature; a receiver rebuilds the name from the stream's
//   n, which every copy holds alike, so the rebuilt request is exactly the
//   sender's. A stream whose calls are several signatures in turn (a
//   broadcast, then an allreduce, ...) hits on each of them from its second
//   occurrence. Calls of a stream that overlap (the next enqueued before the
//   previous one is agreed) travel in full, as before: the stream's n is not
//   yet the one before theirs.
//
// Thread: background thread only.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "negotiation/message.h"

namespace gyre::core {

class ResponseCache {
 public:
  // Entries of one stream of numbered names at most (see above).
  // 64: a loop that allreduces every parameter's gradient in turn hits on
  // each (ResNet-50's 161 gradients have 22 distinct sizes, so at least 22
  // shapes: benchmarks/data/resnet50_sizes.txt); with fewer entries than
  // the cycle's signatures, least-recently-used order would evict each one
  // just before its next use.
  static constexpr std::size_t kPerStream = 64;

  explicit ResponseCache(std::size_t capacity) : capacity_(capacity) {}

  // The slot that can stand for `r`, if any (see above).
  std::optional<std::uint32_t> find(const Request& r) const;
  // The request a hit on `slot` stands for: the cached one with the next
  // sequence number, or for a stream, the stream's next name. Throws
  // TransportError for an empty slot (a peer referring to a slot this rank
  // does not hold: caches diverged).
  Request hit(std::uint32_t slot) const;
  // Inserts or refreshes the entry `r` belongs to (replacing a different
  // request of the same name, or of the same stream and signature) and
  // marks it most recently used.
  void put(const Request& r);
  std::size_t size() const { return used_; }
  // Slots in use or used before (eviction reuses them): the same on every
  // rank, so it sizes the bit vectors of a log-depth round.
  std::size_t slot_count() const { return slots_.size(); }
  std::size_t capacity() const { return capacity_; }

  // "<stream>.<n>" split, for n in canonical decimal (no sign, no leading
  // zero, at most 18 digits) after a non-empty stream; nullopt otherwise.
  struct Numbered {
    std::string_view stream;
    std::uint64_t n = 0;
  };
  static std::optional<Numbered> numbered(std::string_view name);

 private:
  struct Entry {
    Request request;
    std::list<std::uint32_t>::iterator lru_pos;
    bool used = false;
    std::string stream;  // empty: an entry of a reused name
  };
  struct Stream {
    std::uint64_t last = 0;            // n of the call agreed last
    std::vector<std::uint32_t> slots;  // most recently used last
  };
  // A slot for a new entry: a fresh one, or the least recently used one,
  // emptied.
  std::uint32_t take_slot();
  void fill(std::uint32_t slot, const Request& r);
  void put_numbered(const Request& r, const Numbered& num);

  std::size_t capacity_;
  std::size_t used_ = 0;
  std::vector<Entry> slots_;
  std::unordered_map<std::string, std::uint32_t> by_name_;
  std::unordered_map<std::string, Stream> streams_;
  std::list<std::uint32_t> lru_;  // front: most recently used
};

}  // namespace gyre::core
