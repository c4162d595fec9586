#include "fusion.h"

#include <cstdlib>
#include <new>

namespace gyre::core {

namespace {
constexpr std::size_t kAlign = 64;
std::size_t align_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

std::vector<Bucket> plan_buckets(const std::vector<FusionItem>& items, std::size_t threshold) {
  std::vector<Bucket> buckets;
  std::vector<bool> taken(items.size(), false);
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (taken[i]) continue;
    taken[i] = true;
    Bucket b;
    b.members.push_back(i);
    b.bytes = align_up(items[i].bytes);
    if (items[i].fusable && b.bytes < threshold) {
      for (std::size_t j = i + 1; j < items.size(); ++j) {
        if (taken[j] || !items[i].same_kind(items[j])) continue;
        std::size_t grown = b.bytes + align_up(items[j].bytes);
        if (grown > threshold) continue;  // may still fit a smaller later one
        b.bytes = grown;
        b.members.push_back(j);
        taken[j] = true;
      }
    }
    if (!b.fused()) b.bytes = items[i].bytes;
    buckets.push_back(std::move(b));
  }
  return buckets;
}

std::vector<std::size_t> bucket_offsets(const std::vector<FusionItem>& items, const Bucket& b,
                                        std::size_t* total_bytes) {
  std::vector<std::size_t> offsets;
  std::size_t at = 0;
  for (auto m : b.members) {
    offsets.push_back(at);
    at += align_up(items[m].bytes);
  }
  if (total_bytes) *total_bytes = at;
  return offsets;
}

void FusionBuffer::Free::operator()(std::byte* p) const { std::free(p); }

std::byte* FusionBuffer::get(std::size_t bytes) {
  if (bytes > size_) {
    std::size_t want = align_up(bytes);
    auto* p = static_cast<std::byte*>(std::aligned_alloc(kAlign, want));
    if (!p) throw std::bad_alloc();
    data_.reset(p);
    size_ = want;
    ++allocations_;
  }
  return data_.get();
}

}  // namespace gyre::core
