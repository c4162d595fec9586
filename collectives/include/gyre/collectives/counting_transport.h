// CountingTransport: a transport that forwards everything to another one and
// counts the messages (and their bytes) this rank sends through it.
//
// The negotiation counts its own traffic with it (runtime_stats(): messages
// per round), and tests count an algorithm's messages with it. The counters
// are atomics: the thread that sends updates them, any thread may read them.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "gyre/collectives/transport.h"

namespace gyre::transport {

class CountingTransport final : public Transport {
 public:
  explicit CountingTransport(Transport& inner) : inner_(inner) { set_timeout(inner.timeout()); }
  // Owns the transport it wraps.
  explicit CountingTransport(std::shared_ptr<Transport> owned)
      : owned_(std::move(owned)), inner_(*owned_) {
    set_timeout(inner_.timeout());
  }

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  Transfer isend(int peer, int tag, std::span<const std::byte> data) override {
    messages_.fetch_add(1, std::memory_order_relaxed);
    bytes_.fetch_add(data.size(), std::memory_order_relaxed);
    return inner_.isend(peer, tag, data);
  }
  Transfer irecv(int peer, int tag, std::span<std::byte> data) override {
    return inner_.irecv(peer, tag, data);
  }
  Transfer isend_message(int peer, int tag, std::span<const std::byte> data) override {
    messages_.fetch_add(1, std::memory_order_relaxed);
    bytes_.fetch_add(data.size(), std::memory_order_relaxed);
    return inner_.isend_message(peer, tag, data);
  }
  Transfer irecv_message(int peer, int tag, std::span<std::byte> room,
                         std::size_t* received) override {
    return inner_.irecv_message(peer, tag, room, received);
  }
  bool test(Transfer& req) override { return inner_.test(req); }
  // The wrapped transport's deadline is the one that counts: it may change
  // after this wrapper was made (the runtime shortens it after start-up).
  void wait(Transfer& req) override { inner_.wait(req); }
  std::string name() const override { return inner_.name(); }
  std::size_t pieces(int peer, std::size_t bytes) const override {
    return inner_.pieces(peer, bytes);
  }

  // Messages and bytes sent so far.
  std::uint64_t messages() const { return messages_.load(std::memory_order_relaxed); }
  std::uint64_t bytes() const { return bytes_.load(std::memory_order_relaxed); }

 private:
  std::shared_ptr<Transport> owned_;  // empty when the wrapped one is owned elsewhere
  Transport& inner_;
  std::atomic<std::uint64_t> messages_{0};
  std::atomic<std::uint64_t> bytes_{0};
};

}  // namespace gyre::transport
