// Transport: moves byte ranges between the ranks of one communicator.
//
// Collective algorithms see only this interface, never MPI or NCCL. A
// transport is driven from one thread at a time (the runtime's background
// thread, or a test's rank thread); it is not internally synchronised for
// concurrent callers.
//
// Ordering: messages between one (sender, receiver, tag) triple are matched
// in the order they were posted, as MPI guarantees. Algorithms rely on this
// and on every rank running the same sequence of collectives.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

namespace gyre::transport {

// An outstanding non-blocking send or receive. The value is owned by the
// transport that created it; a default-constructed Transfer is complete.
struct Transfer {
  std::int64_t slot = -1;
  bool pending() const { return slot >= 0; }
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Starts sending `data` to `peer`. `data` must stay valid and unchanged
  // until the transfer completes.
  virtual Transfer isend(int peer, int tag, std::span<const std::byte> data) = 0;
  // Starts receiving exactly data.size() bytes from `peer` into `data`.
  virtual Transfer irecv(int peer, int tag, std::span<std::byte> data) = 0;

  // A message whose length its receiver does not know in advance (the
  // log-depth negotiation round's vector, whose tail carries a speculated
  // allreduce's input only where there is one): sent as one message of
  // data.size() bytes and received into `room`, which may be longer; when
  // the receive completes, *received (valid until then) holds the length.
  // A message sent by isend_message is received by irecv_message, and only
  // by it. The default refuses (TransportError naming the transport).
  virtual Transfer isend_message(int peer, int tag, std::span<const std::byte> data);
  virtual Transfer irecv_message(int peer, int tag, std::span<std::byte> room,
                                 std::size_t* received);

  // Returns true and resets `req` if it has completed; never blocks.
  virtual bool test(Transfer& req) = 0;
  // Blocks until `req` completes. Throws TimeoutError naming the peer when
  // it does not complete within timeout() (if one is set), and
  // TransportError when the underlying library reports a failure.
  virtual void wait(Transfer& req) = 0;

  // The longest wait() may block without progress; zero means forever.
  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // How wait() passes the time. A waiting thread polls without pause for
  // `spin`, then sleeps between polls, the naps doubling up to `max_nap`.
  // Spinning forever (the default) gives the lowest latency when the caller
  // owns its core; napping returns the core to the other threads of the
  // process when the peer is late (the runtime's background thread beside a
  // training loop, or beside the caller's own MPI calls). A zero `max_nap`
  // means spin forever. Transports that block in the kernel ignore it.
  struct WaitPolicy {
    std::chrono::microseconds spin{0};
    std::chrono::microseconds max_nap{0};
  };
  void set_wait_policy(WaitPolicy p) { wait_policy_ = p; }
  WaitPolicy wait_policy() const { return wait_policy_; }

  // Called by wait() (MpiTransport, LocalTransport) about every 50 ms while
  // it waits; it may throw to stop waiting (MpiTransport leaves the transfer
  // pending, LocalTransport cancels this rank's pending receives). For a
  // caller's thread that must stay interruptible (init() under Ctrl-C), or a
  // helper thread its owner may stop (the pipelined hierarchical
  // allreduce); empty: none. Transports that block in the kernel ignore it.
  void set_interrupt_check(std::function<void()> check) { interrupt_check_ = std::move(check); }
  const std::function<void()>& interrupt_check() const { return interrupt_check_; }

  // A short description used in log and error messages ("mpi", "local").
  virtual std::string name() const = 0;

  // How many messages of the library underneath an isend or irecv of
  // `bytes` with `peer` posts (MpiTransport cuts small messages to peers on
  // its own host into eager pieces, and large ones at its piece limit).
  virtual std::size_t pieces(int peer, std::size_t bytes) const {
    (void)peer;
    (void)bytes;
    return 1;
  }

 protected:
  std::chrono::milliseconds timeout_{0};
  WaitPolicy wait_policy_;
  std::function<void()> interrupt_check_;
};

// Convenience: ring neighbours.
inline int ring_next(const Transport& t) { return (t.rank() + 1) % t.size(); }
inline int ring_prev(const Transport& t) { return (t.rank() + t.size() - 1) % t.size(); }

}  // namespace gyre::transport
