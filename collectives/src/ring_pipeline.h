// RingPipeline: the bookkeeping shared by the ring algorithms (allreduce,
// reduce-scatter, allgather), so that each of them reads as its phases.
//
// The ring moves units. Unit (k, j) is step k, chunk j: this rank sends
// chunk j of segment send_segment(k) to the next rank and receives chunk j
// of segment recv_segment(k) = send_segment(k) - 1 from the previous one.
// What is received at step k is what is sent at step k + 1, so data flows
// around the ring one segment per step. Both neighbours enumerate units in
// the same order (k major, j minor) and post sends and receives in that
// order; the transport matches messages of one (source, tag) in posting
// order, so every message lands in the receive meant for it. Step 0 (data
// from the caller's input, ready at once) travels on `tag`, every later step
// (forwarded data) on `tag + 1`: each stream is posted in unit order by the
// sender and received in unit order by the receiver, but the two streams
// may interleave freely, which lets step-0 sends be paced independently.
// Empty chunks (segments shorter than the chunk count) are skipped by both
// sides.
//
// The set-up every ring algorithm shares lives here too: step 0 sends this
// rank's own segment straight from the caller's input, kept kRecvWindow
// chunks ahead of the processing (a message that reaches the peer before its
// receive is posted costs MPI an extra copy), and kRecvWindow receives stay
// posted ahead of the one being waited for, so that the transfer of the
// next chunk overlaps the work on this one. run_in_order() is the whole
// loop for algorithms that process units in posting order (allgather,
// reduce-scatter); ring allreduce orders its units in wavefronts and keeps
// its own receive window, but starts and paces its own sends here.
//
// Internal to collectives/; used by one thread at a time (the caller's).
#pragma once

#include <cstddef>
#include <vector>

#include "gyre/collectives/segment_plan.h"
#include "gyre/collectives/transport.h"

namespace gyre::collectives {

// Receives kept posted ahead of the one being waited for, and own step-0
// sends posted ahead of the processing.
inline constexpr std::size_t kRecvWindow = 4;

class RingPipeline {
 public:
  // `steps` steps over `plan`; step 0 sends segment `first_send_segment`.
  RingPipeline(transport::Transport& t, const SegmentPlan& plan, int steps,
               int first_send_segment, int tag);
  // Waits for outstanding sends only on the normal path (finish()); after an
  // exception the transport is not reusable and the requests are abandoned.
  ~RingPipeline() = default;

  int steps() const { return steps_; }
  std::size_t chunks() const { return plan_.chunks; }
  std::size_t units() const { return static_cast<std::size_t>(steps_) * plan_.chunks; }
  int send_segment(int k) const { return wrap(first_send_ - k); }
  int recv_segment(int k) const { return wrap(first_send_ - k - 1); }

  // Offset (bytes, from the start of a buffer laid out as the plan) and size
  // of chunk j of segment s.
  std::size_t chunk_byte_offset(int s, std::size_t j) const {
    return plan_.chunk_offset(s, j) * plan_.elem_size;
  }
  std::size_t chunk_count(int s, std::size_t j) const { return plan_.chunk_count(s, j); }
  std::size_t chunk_bytes(int s, std::size_t j) const {
    return plan_.chunk_count(s, j) * plan_.elem_size;
  }

  // Posts the send of unit (k, j) from `data` (chunk_bytes(send_segment(k), j) bytes).
  void post_send(int k, std::size_t j, const std::byte* data);
  // Posts the receive of unit (k, j) into `data`.
  void post_recv(int k, std::size_t j, std::byte* data);
  void wait_send(int k, std::size_t j);
  // Whether the send of unit (k, j) has completed (or was never posted).
  bool test_send(int k, std::size_t j);
  void wait_recv(int k, std::size_t j);
  // Waits for every send posted so far.
  void finish();

  // Posts the first kRecvWindow step-0 sends of this rank's own segment,
  // which starts at `own_segment` (chunk j lies at its in-segment offset).
  void start_own_sends(const std::byte* own_segment);
  // Unit (0, j) has been processed: posts own chunk j + kRecvWindow, if any.
  void pace_own_send(std::size_t j) { send_own_chunk(j + kRecvWindow); }

  // The whole ring for algorithms that process units in posting order:
  // starts the own sends, keeps kRecvWindow receives posted into
  // recv_buffer(k, j), and calls process(k, j) once unit (k, j) has
  // arrived (process forwards it with post_send(k + 1, j, ...) if k + 1 <
  // steps()). Returns after every send has completed.
  template <class RecvBuffer, class Process>
  void run_in_order(const std::byte* own_segment, RecvBuffer&& recv_buffer, Process&& process) {
    start_own_sends(own_segment);
    auto post = [&](std::size_t u) {
      if (u >= units()) return;
      const int k = static_cast<int>(u / chunks());
      const std::size_t j = u % chunks();
      post_recv(k, j, recv_buffer(k, j));
    };
    for (std::size_t u = 0; u < kRecvWindow; ++u) post(u);
    for (int k = 0; k < steps_; ++k) {
      for (std::size_t j = 0; j < chunks(); ++j) {
        wait_recv(k, j);
        process(k, j);
        if (k == 0) pace_own_send(j);
        post(unit(k, j) + kRecvWindow);
      }
    }
    finish();
  }

 private:
  int wrap(int s) const { return ((s % n_) + n_) % n_; }
  int tag_for(int k) const { return k == 0 ? tag_ : tag_ + 1; }
  std::size_t unit(int k, std::size_t j) const {
    return static_cast<std::size_t>(k) * plan_.chunks + j;
  }
  void send_own_chunk(std::size_t j);

  transport::Transport& t_;
  const SegmentPlan& plan_;
  const int n_, steps_, first_send_, tag_;
  const int next_, prev_;
  std::vector<transport::Transfer> sends_, recvs_;  // indexed by unit
  const std::byte* own_segment_ = nullptr;          // start_own_sends()
};

// A per-thread scratch area of at least `bytes` bytes, 64-byte aligned and
// reused across calls (staging chunks, reduce-scatter intermediates), so a
// collective does not fault in fresh pages every time. Valid until the
// calling thread asks again.
std::byte* thread_scratch(std::size_t bytes);

}  // namespace gyre::collectives
