// CountingTransport: a test double that counts the messages a rank sends
// and the bytes in them, forwarding every call to the transport it wraps.
// Shared by the tests that check an algorithm's message count against its
// closed form (test_rabenseifner.cc, tests/core/test_cpu_backend.cc).
// Threads: one rank's thread, like the transport it wraps.
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "gyre/collectives/transport.h"

namespace gyre::test {

class CountingTransport final : public transport::Transport {
 public:
  explicit CountingTransport(transport::Transport& inner) : inner_(inner) {
    set_timeout(inner.timeout());
  }
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  transport::Transfer isend(int peer, int tag, std::span<const std::byte> data) override {
    ++messages;
    bytes += data.size();
    return inner_.isend(peer, tag, data);
  }
  transport::Transfer irecv(int peer, int tag, std::span<std::byte> data) override {
    return inner_.irecv(peer, tag, data);
  }
  bool test(transport::Transfer& req) override { return inner_.test(req); }
  void wait(transport::Transfer& req) override { inner_.wait(req); }
  std::string name() const override { return "counting"; }

  std::size_t messages = 0;  // isend calls
  std::size_t bytes = 0;     // bytes handed to isend

 private:
  transport::Transport& inner_;
};

}  // namespace gyre::test
