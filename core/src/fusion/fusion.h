// Fusion: which agreed responses share one collective call, and the buffer
// they are packed into.
//
// plan_buckets() is pure: every rank plans the same buckets from the same
// responses. Allreduces with the same dtype, reduce op, scale factors and
// device are packed greedily, in response order, into buckets of at most
// `threshold` bytes; the planner may pass over a response of another kind
// and keep filling a bucket. A tensor larger than the threshold, or alone in
// its bucket, is reduced in place without a copy. Buckets are returned in
// the order of their first member, so all ranks call the collectives in the
// same order.
//
// FusionBuffer is allocated once (grown to the largest bucket seen, at most
// the threshold) and reused. Thread: background thread only.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "gyre/types.h"

namespace gyre::core {

struct Response;  // coordinator.h

struct FusionItem {
  bool fusable = false;  // an allreduce that succeeded negotiation
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  Device device{};
  std::size_t bytes = 0;

  bool same_kind(const FusionItem& o) const {
    return fusable && o.fusable && dtype == o.dtype && op == o.op && prescale == o.prescale &&
           postscale == o.postscale && device == o.device;
  }
};

struct Bucket {
  std::vector<std::size_t> members;  // indices into the planned items
  std::size_t bytes = 0;
  bool fused() const { return members.size() > 1; }
};

std::vector<Bucket> plan_buckets(const std::vector<FusionItem>& items, std::size_t threshold);

// Where the members of a fused bucket lie in the fusion buffer: member i
// at offsets[i], sizes[i] bytes, each starting on a 64-byte boundary so the
// reduction kernels see aligned data. The bytes from the end of a member to
// end(i) are padding, which the packer zeroes so it reduces to zero.
struct FusedLayout {
  std::vector<std::size_t> offsets, sizes;
  std::size_t total = 0;
  std::size_t end(std::size_t i) const { return i + 1 < offsets.size() ? offsets[i + 1] : total; }
};
FusedLayout fused_layout(std::span<const std::size_t> member_bytes);
// The layout of the agreed responses of one bucket (host or device buffer).
FusedLayout fused_layout(const std::vector<Response*>& members);

// Offsets of a planned bucket's members (fused_layout of their sizes).
std::vector<std::size_t> bucket_offsets(const std::vector<FusionItem>& items, const Bucket& b,
                                        std::size_t* total_bytes);

class FusionBuffer {
 public:
  std::byte* get(std::size_t bytes);
  std::size_t capacity() const { return size_; }
  // Read by other threads (statistics), hence atomic.
  int allocations() const { return allocations_.load(); }

 private:
  struct Free {
    void operator()(std::byte* p) const;
  };
  std::unique_ptr<std::byte, Free> data_;
  std::size_t size_ = 0;
  std::atomic<int> allocations_{0};
};

}  // namespace gyre::core
