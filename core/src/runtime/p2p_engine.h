// P2pEngine: gyre's point-to-point operations (send_async / recv_async of
// gyre.h) over an MpiP2pChannel, the communicator of their own made at
// init(), so that they never pair with collective traffic.
//
// The protocol, for one send of `count` elements to a receiver:
//   1. the sender posts a small header {sequence, process set, tag, dtype,
//      count} (control tag kHeaderTag);
//   2. the receiver's engine receives every header as it arrives and keeps
//      it until a recv of the same process set and tag (and source, unless
//      any source) takes it, oldest first. It compares dtype and count with
//      its recv's: a difference fails the recv (MismatchError naming both)
//      and is acknowledged as refused, so the sender fails too and the
//      payload is never sent (nothing to drain). Otherwise it posts the
//      payload's receives into the caller's buffer, then acknowledges;
//   3. the sender, on the acknowledgement, sends the payload (in pieces of
//      at most 1 GiB) on kPayloadTag.
// Acknowledgements from one receiver reach a sender in the order they were
// sent, and the sender sends payloads in that order, so payloads pair with
// the receives the receiver posted in the same order. Since the payload is
// sent only into a posted receive, a send whose receiver never comes ends
// at its deadline without leaving MPI holding the caller's buffer; if the
// receiver comes later, its acknowledgement is answered with an empty
// payload that tells it the send was withdrawn (an error there too).
//
// A send refused at its call is announced instead: a header carrying the
// reason, which fails the recv that takes it (InvalidArgument), so the
// receiver does not wait for its deadline.
//
// Deadline: every operation not complete `deadline_s` after it was
// submitted (GYRE_STALL_SHUTDOWN_S; 0: none) fails with TimeoutError naming
// the peer. A failure of MPI itself (a peer's death under ULFM:
// RankFailedError) fails every pending operation and every later one.
//
// Who drives it: its own thread (the default), or, with
// GYRE_P2P_ON_COORDINATOR=1, the world runtime's background loop, which
// calls service() between its rounds and while it waits for work. The
// second is kept to measure the choice: docs/architecture.md ("Point to
// point: a thread of its own") gives the figures.
//
// Threads: submit() and stop() on any thread; everything else on the
// driving thread, the only one that drives the channel.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gyre/collectives/mpi_p2p.h"
#include "gyre/gyre.h"
#include "queue/op_state.h"

namespace gyre::core {

struct P2pOp {
  bool is_send = false;
  TensorView view;           // the caller's buffer (CPU), kept alive by the caller
  int peer = kAnySource;     // world rank; kAnySource only for a receive
  std::int64_t tag = 0;
  int process_set = kGlobalProcessSet;
  std::shared_ptr<OpState> state;
  // Non-empty: a send refused at the call, announced to `peer` (whose recv
  // that would have taken it fails with this reason); no view, no state.
  std::string refusal;
};

class P2pEngine {
 public:
  enum class Driver { kOwnThread, kCaller };
  P2pEngine(std::unique_ptr<transport::MpiP2pChannel> channel, double deadline_s,
            Driver driver = Driver::kOwnThread);
  ~P2pEngine();  // stop()
  P2pEngine(const P2pEngine&) = delete;
  P2pEngine& operator=(const P2pEngine&) = delete;

  int rank() const { return rank_; }
  // Queues `op` for the engine's thread; its state completes there (with the
  // source rank of a receive in OpState::source_rank).
  void submit(P2pOp op);
  // Stops the engine (joins its thread, if it has one); what is pending
  // fails with StateError. Idempotent.
  void stop();

  // Driver::kCaller only. set_wake: called (under the engine's lock) by
  // every submit() until stop(), to wake the driving loop; set before the
  // first submit. service(): one pass over the protocol on the driving
  // thread; `pending` while operations wait for progress, `moved` when
  // this pass changed something (the caller polls sooner).
  struct Pass {
    bool pending = false;
    bool moved = false;
  };
  void set_wake(std::function<void()> wake);
  Pass service();

 private:
  struct Engine;  // the driving thread's state (p2p_engine.cc)
  void loop();
  // One pass over `incoming` and what is pending; true if it changed anything.
  bool pass(std::vector<P2pOp> incoming);
  // After the last pass: fails what is left, quiesces and frees the channel.
  void teardown();

  const int rank_;
  const Driver driver_;
  std::unique_ptr<Engine> engine_;  // touched by the driving thread only
  // Driver::kCaller: guards engine_ and torn_down_ (service() against stop()).
  std::mutex drive_mu_;
  bool torn_down_ = false;
  // Guards inbox_, stopping_, broken_ and wake_.
  std::mutex mu_;
  std::function<void()> wake_;
  std::condition_variable cv_;
  std::vector<P2pOp> inbox_;
  bool stopping_ = false;
  std::exception_ptr broken_;  // MPI failed: every later operation fails with it
  std::thread thread_;
};

}  // namespace gyre::core
