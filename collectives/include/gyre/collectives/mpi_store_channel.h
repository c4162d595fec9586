// MpiStoreChannel: request and reply messages between the ranks of one
// parameter store (core/src/store), over a communicator of their own (made
// from gyre's world communicator for the store's ranks alone), so that they
// never pair with collective traffic, point-to-point operations or the job's
// own MPI messages. The store's protocol (headers, versions, policies) is
// core/src/store's; this class only moves bytes, with deadlines.
//
// Threads: create() is collective over the listed ranks and is called by
// one thread of each. Afterwards every call is safe from any thread at once
// (each keeps its MPI request to itself; MPI runs at MPI_THREAD_MULTIPLE):
// the store's server thread receives requests and sends replies while user
// threads send requests and wait for replies. Destroy it before MPI is
// finalised, once no call is in progress.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

namespace gyre::transport {

class MpiStoreChannel {
 public:
  using Clock = std::chrono::steady_clock;

  // A communicator of `world_ranks` (ranks of gyre's world, in that order:
  // world_ranks[i] is the channel's rank i), collective over those ranks
  // alone (MPI_Comm_create_group; `tag` keeps concurrent creations apart).
  // Throws TransportError when MPI does not run at MPI_THREAD_MULTIPLE.
  static std::unique_ptr<MpiStoreChannel> create(const std::vector<int>& world_ranks, int tag);
  ~MpiStoreChannel();
  MpiStoreChannel(const MpiStoreChannel&) = delete;
  MpiStoreChannel& operator=(const MpiStoreChannel&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // A receive posted before the message that answers it is sent, so that
  // the answer never waits for the receiver. wait() returns the bytes
  // received; at `deadline` (or when `interrupt` throws) the receive is
  // cancelled and TimeoutError (or `interrupt`'s exception) propagates.
  class Receive {
   public:
    ~Receive();  // cancels the receive if it was not waited for
    std::size_t wait(Clock::time_point deadline, const std::function<void()>& interrupt = {});

   private:
    friend class MpiStoreChannel;
    struct State;
    explicit Receive(std::unique_ptr<State> s);
    std::unique_ptr<State> state_;
  };
  std::unique_ptr<Receive> post_receive(int peer, int tag, std::span<std::byte> out);
  // The same into several places: the message's bytes fill `parts` one
  // after the other (an MPI datatype of their addresses: no copy on the
  // way), and it must be exactly their total size. The parts stay alive
  // and untouched until the receive is waited for or destroyed.
  std::unique_ptr<Receive> post_receive(int peer, int tag,
                                        std::span<const std::span<std::byte>> parts);

  // Sends `parts` as one message (gathered into a buffer of the channel's)
  // and waits for the send to complete, at most until `deadline` (then
  // TimeoutError; the message is left to MPI, and the channel keeps its
  // buffer, and its communicator, for the rest of its life).
  void send(int peer, int tag, std::span<const std::span<const std::byte>> parts,
            Clock::time_point deadline);
  // The same for a message already in one buffer of the caller's, which
  // the channel takes (no copy).
  void send(int peer, int tag, std::vector<std::byte>&& message, Clock::time_point deadline);

  // One whole message of `tag` from any rank, if one has arrived (matched
  // probe): its source, its bytes in `out`. Never blocks.
  std::optional<int> receive_any(int tag, std::vector<std::byte>& out);

  // The channel's ranks this process knows to have died (ULFM's failure
  // detector), in increasing order; empty without ULFM or with fault
  // tolerance off. Under ULFM the first call that sees a death revokes the
  // channel (every member's pending and later calls then fail): this says
  // which member it was, whichever peer the failed call was with.
  std::vector<int> failed_ranks() const;

 private:
  struct Impl;
  explicit MpiStoreChannel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  int rank_ = 0, size_ = 1;
};

}  // namespace gyre::transport
