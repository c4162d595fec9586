#include "ring_pipeline.h"

#include <memory>
#include <new>
#include <span>

namespace gyre::collectives {

RingPipeline::RingPipeline(transport::Transport& t, const SegmentPlan& plan, int steps,
                           int first_send_segment, int tag)
    : t_(t),
      plan_(plan),
      n_(t.size()),
      steps_(steps),
      first_send_(first_send_segment),
      tag_(tag),
      next_(transport::ring_next(t)),
      prev_(transport::ring_prev(t)),
      sends_(units()),
      recvs_(units()) {}

void RingPipeline::post_send(int k, std::size_t j, const std::byte* data) {
  const std::size_t bytes = chunk_bytes(send_segment(k), j);
  if (bytes == 0) return;
  sends_[unit(k, j)] = t_.isend(next_, tag_for(k), std::span<const std::byte>(data, bytes));
}

void RingPipeline::post_recv(int k, std::size_t j, std::byte* data) {
  const std::size_t bytes = chunk_bytes(recv_segment(k), j);
  if (bytes == 0) return;
  recvs_[unit(k, j)] = t_.irecv(prev_, tag_for(k), std::span<std::byte>(data, bytes));
}

void RingPipeline::wait_send(int k, std::size_t j) { t_.wait(sends_[unit(k, j)]); }
bool RingPipeline::test_send(int k, std::size_t j) { return t_.test(sends_[unit(k, j)]); }
void RingPipeline::wait_recv(int k, std::size_t j) { t_.wait(recvs_[unit(k, j)]); }

void RingPipeline::finish() {
  for (auto& r : sends_) t_.wait(r);
}

void RingPipeline::start_own_sends(const std::byte* own_segment) {
  own_segment_ = own_segment;
  for (std::size_t j = 0; j < kRecvWindow; ++j) send_own_chunk(j);
}

void RingPipeline::send_own_chunk(std::size_t j) {
  if (j >= plan_.chunks) return;
  const int own = send_segment(0);
  post_send(0, j, own_segment_ + chunk_byte_offset(own, j) - chunk_byte_offset(own, 0));
}

namespace {

struct AlignedFree {
  void operator()(std::byte* p) const { ::operator delete[](p, std::align_val_t{64}); }
};

}  // namespace

std::byte* thread_scratch(std::size_t bytes) {
  thread_local std::unique_ptr<std::byte[], AlignedFree> buf;
  thread_local std::size_t capacity = 0;
  if (bytes > capacity) {
    buf.reset();
    buf.reset(static_cast<std::byte*>(::operator new[](bytes, std::align_val_t{64})));
    capacity = bytes;
  }
  return buf.get();
}

}  // namespace gyre::collectives
