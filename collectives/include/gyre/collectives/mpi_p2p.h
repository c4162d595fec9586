// MpiP2pChannel: tagged point-to-point messages between the ranks of the
// world, over a communicator of their own (a duplicate of gyre's world
// communicator), so that they can never pair with a collective's traffic or
// with the job's own MPI messages. The protocol on top of it (headers,
// acknowledgements, matching, deadlines) is the runtime's
// (core/src/runtime/p2p_engine.h); this class only moves bytes.
//
// Threads: create() is collective over the world and is called by one
// thread of each rank (gyre::init). Afterwards the channel is driven by one
// thread at a time (the point-to-point engine's thread); MPI must run at
// MPI_THREAD_MULTIPLE, since the runtime's background threads call MPI
// beside it. Destroy it before MPI is finalised.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

namespace gyre::transport {

class MpiP2pChannel {
 public:
  // Duplicates the world communicator (collective over every rank of the
  // world as it is now, also after MpiWorld::rebuild()). Throws
  // TransportError when MPI does not run at MPI_THREAD_MULTIPLE.
  static std::unique_ptr<MpiP2pChannel> create();
  ~MpiP2pChannel();  // cancels what is still posted, frees the communicator
  MpiP2pChannel(const MpiP2pChannel&) = delete;
  MpiP2pChannel& operator=(const MpiP2pChannel&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // An outstanding send or receive; -1: none.
  using Request = std::int64_t;
  // `data` must stay valid until test() reports completion or cancel().
  // A message is at most INT_MAX bytes (the caller cuts larger ones).
  // Errors throw TransportError, or RankFailedError when the peer died
  // (ULFM, fault tolerance on), naming the call and the peer.
  Request isend(int peer, int tag, std::span<const std::byte> data);
  Request irecv(int peer, int tag, std::span<std::byte> data);
  // True once `r` has completed; it is then forgotten. `bytes`: how many
  // bytes a receive got (a shorter message than posted completes too).
  bool test(Request r, std::size_t* bytes = nullptr);
  // Gives `r` up: a receive is cancelled; a send is left to MPI (MPI cannot
  // reliably cancel sends), so its buffer must outlive the channel.
  void cancel(Request r);
  // Receives one whole message of `tag` from any rank if one has arrived
  // (matched probe): its source, its bytes in `out`. Never blocks.
  std::optional<int> receive_any(int tag, std::vector<std::byte>& out);
  // Before the channel goes (gyre's shutdown, on every rank): waits, at most
  // `limit`, for every rank to get here (a non-blocking barrier) and for
  // this rank's sends to complete, receiving and discarding every message
  // that arrives meanwhile, so that none is left behind on the
  // communicator when it is freed.
  void quiesce(std::chrono::milliseconds limit);

 private:
  struct Impl;
  explicit MpiP2pChannel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  int rank_ = 0, size_ = 1;
};

}  // namespace gyre::transport
