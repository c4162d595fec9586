// CpuRingBackend (cpu_ring_backend.h): the collectives of collectives/ on
// host buffers, with the runtime's chunk size and small-allreduce threshold.
#include "backends/cpu/cpu_ring_backend.h"

#include <cstring>

#include "gyre/collectives/algorithms.h"
#include "negotiation/message_tags.h"

namespace gyre::core {

std::byte* CpuRingBackend::zeros(std::size_t bytes, const OpLabel&) {
  if (zeros_.size() < bytes) zeros_.resize(bytes);
  std::memset(zeros_.data(), 0, bytes);  // the previous call's user may have written to it
  return zeros_.data();
}

void CpuRingBackend::copy(void* dst, const void* src, std::size_t bytes, const OpLabel&) {
  if (bytes > 0 && dst != src) std::memcpy(dst, src, bytes);
}

void CpuRingBackend::zero_ranges(std::byte* buf, std::span<const ByteRange> ranges,
                                 const OpLabel&) {
  for (const ByteRange& r : ranges) std::memset(buf + r.offset, 0, r.bytes);
}

collectives::AllreduceOptions CpuRingBackend::allreduce_options(const Reduction& red) const {
  collectives::AllreduceOptions o;
  o.chunk_bytes = opt_.ring_chunk_bytes;
  o.small_bytes = opt_.allreduce_small_bytes;
  o.tag = kTagData;
  o.prescale = red.prescale;
  o.postscale = red.postscale;
  return o;
}

CpuRingBackend::CpuRingBackend(transport::Transport& t, const Options& opt,
                               std::optional<LayoutCost> layout)
    : t_(t),
      opt_(opt),
      layout_(layout ? *layout
                     : default_layout_cost(t.size(), 1, opt.allreduce_small_bytes,
                                           opt.rabenseifner_allreduce)) {}

collectives::LargeAllreduce CpuRingBackend::flat_large_allreduce(std::size_t bytes) const {
  return flat_uses_rabenseifner(layout_, static_cast<double>(bytes))
             ? collectives::LargeAllreduce::kRabenseifner
             : collectives::LargeAllreduce::kRing;
}

void CpuRingBackend::allreduce(const void* in, void* out, std::size_t count, DataType dt,
                               const Reduction& red, const OpLabel&) {
  collectives::AllreduceOptions o = allreduce_options(red);
  const std::size_t bytes = count * dtype_size(dt);
  o.large = flat_large_allreduce(bytes);
  // The model may prefer Rabenseifner's algorithm to recursive doubling at
  // or below the small size too (small_uses_rabenseifner).
  if (bytes <= o.small_bytes && o.large == collectives::LargeAllreduce::kRabenseifner) {
    o.small_bytes = 0;
  }
  collectives::allreduce(t_, in, out, count, dt, red.op, o);
}

void CpuRingBackend::adasum(const void* in, void* out, std::size_t count, DataType dt,
                            const Reduction& red, std::span<const ByteRange> tensors,
                            const OpLabel&) {
  adasum_on_host(t_, in, out, count, dt, red, tensors);
}

void adasum_on_host(transport::Transport& t, const void* in, void* out, std::size_t count,
                    DataType dt, const Reduction& red, std::span<const ByteRange> tensors) {
  const std::size_t esize = dtype_size(dt);
  std::vector<collectives::TensorExtent> extents;
  extents.reserve(tensors.size());
  for (const ByteRange& r : tensors) extents.push_back({r.offset / esize, r.bytes / esize});
  collectives::AdasumOptions o;
  o.tag = kTagData;
  o.prescale = red.prescale;
  o.postscale = red.postscale;
  collectives::adasum_allreduce(t, in, out, count, dt, extents, o);
}

void CpuRingBackend::broadcast(void* buf, std::size_t bytes, int root, const OpLabel&) {
  collectives::BroadcastOptions o;
  o.chunk_bytes = opt_.ring_chunk_bytes;
  o.tag = kTagData;
  collectives::ring_broadcast(t_, buf, bytes, root, o);
}

void CpuRingBackend::allgather(const void* in, std::span<const std::size_t> block_bytes,
                               void* out, const OpLabel&) {
  collectives::AllgatherOptions o;
  o.chunk_bytes = opt_.ring_chunk_bytes;
  o.tag = kTagData;
  collectives::ring_allgather(t_, in, out, block_bytes, o);
}

void CpuRingBackend::alltoall(const void* in, std::span<const std::size_t> send_bytes,
                              void* out, std::span<const std::size_t> recv_bytes, std::size_t,
                              const OpLabel&) {
  collectives::AlltoallOptions o;
  o.tag = kTagData;
  collectives::alltoall(t_, in, send_bytes, out, recv_bytes, o);
}

void CpuRingBackend::reducescatter(const void* in, std::span<const std::size_t> counts,
                                   void* out, DataType dt, const Reduction& red,
                                   const OpLabel&) {
  collectives::ReduceScatterOptions o;
  o.chunk_bytes = opt_.ring_chunk_bytes;
  o.tag = kTagData;
  o.prescale = red.prescale;
  o.postscale = red.postscale;
  collectives::ring_reduce_scatter(t_, in, out, counts, dt, red.op, o);
}

}  // namespace gyre::core
