// LocalTransport: n ranks as threads of one process, for unit tests.
//
// Every send is copied eagerly into the receiver's mailbox, where it is
// matched against receives by (source, tag) in posting order, as MPI matches.
// A LocalWorld owns the mailboxes of all its ranks; each rank thread drives
// its own LocalTransport (one thread per transport, as Transport requires).
// When any rank of run_local_world() throws, the world is marked failed and
// every rank blocked in wait() gets a TransportError instead of hanging.
// A rank whose wait() throws, or whose transport is destroyed, withdraws its
// unmatched receives first, so later sends never write into freed buffers.
#pragma once

#include <functional>
#include <memory>

#include "gyre/collectives/transport.h"

namespace gyre::transport {

class LocalWorld;  // shared mailboxes; defined in local_transport.cc

class LocalTransport final : public Transport {
 public:
  LocalTransport(std::shared_ptr<LocalWorld> world, int rank);
  ~LocalTransport() override;

  int rank() const override { return rank_; }
  int size() const override;
  Transfer isend(int peer, int tag, std::span<const std::byte> data) override;
  Transfer irecv(int peer, int tag, std::span<std::byte> data) override;
  Transfer isend_message(int peer, int tag, std::span<const std::byte> data) override {
    return isend(peer, tag, data);  // eager: every message keeps its length
  }
  Transfer irecv_message(int peer, int tag, std::span<std::byte> room,
                         std::size_t* received) override;
  bool test(Transfer& req) override;
  void wait(Transfer& req) override;
  std::string name() const override { return "local"; }

 private:
  void cancel_pending();
  Transfer post_recv(int peer, int tag, std::span<std::byte> data, std::size_t* received);
  struct Slots;  // this rank's outstanding receives (see the .cc)
  std::shared_ptr<LocalWorld> world_;
  int rank_;
  std::unique_ptr<Slots> slots_;
};

// Creates an n-rank LocalWorld.
std::shared_ptr<LocalWorld> make_local_world(int n);

// Marks the world failed: every current and future wait() on it throws
// TransportError naming `rank` as the rank that failed.
void fail_local_world(LocalWorld& world, int rank);

// Runs fn(transport) on n threads, one per rank, each with its own
// LocalTransport (timeout `timeout`, zero = none) and joins them. Rethrows
// the first exception thrown by any rank (the others are released from
// their waits with TransportError, which is not the one rethrown).
void run_local_world(int n, const std::function<void(Transport&)>& fn,
                     std::chrono::milliseconds timeout = std::chrono::milliseconds{0});

}  // namespace gyre::transport
