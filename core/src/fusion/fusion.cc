#include "fusion/fusion.h"

#include "gyre/sizes.h"
#include "negotiation/coordinator.h"

#include <cstdlib>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace gyre::core {

namespace {
constexpr std::size_t kAlign = 64;
constexpr std::size_t kHugePage = std::size_t{2} << 20;
}  // namespace

std::vector<Bucket> plan_buckets(const std::vector<FusionItem>& items, std::size_t threshold) {
  std::vector<Bucket> buckets;
  std::vector<bool> taken(items.size(), false);
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (taken[i]) continue;
    taken[i] = true;
    Bucket b;
    b.members.push_back(i);
    b.bytes = gyre::align_up(items[i].bytes, kAlign);
    if (items[i].fusable && b.bytes < threshold) {
      for (std::size_t j = i + 1; j < items.size(); ++j) {
        if (taken[j] || !items[i].same_kind(items[j])) continue;
        std::size_t grown = b.bytes + gyre::align_up(items[j].bytes, kAlign);
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

FusedLayout fused_layout(std::span<const std::size_t> member_bytes) {
  FusedLayout l;
  for (std::size_t bytes : member_bytes) {
    l.offsets.push_back(l.total);
    l.sizes.push_back(bytes);
    l.total += gyre::align_up(bytes, kAlign);
  }
  return l;
}

FusedLayout fused_layout(const std::vector<Response*>& members) {
  std::vector<std::size_t> bytes;
  for (const Response* r : members) bytes.push_back(r->agreed.nbytes());
  return fused_layout(bytes);
}

std::vector<std::size_t> bucket_offsets(const std::vector<FusionItem>& items, const Bucket& b,
                                        std::size_t* total_bytes) {
  std::vector<std::size_t> bytes;
  for (auto m : b.members) bytes.push_back(items[m].bytes);
  FusedLayout l = fused_layout(bytes);
  if (total_bytes) *total_bytes = l.total;
  return l.offsets;
}

void FusionBuffer::Free::operator()(std::byte* p) const { std::free(p); }

std::byte* FusionBuffer::get(std::size_t bytes) {
  if (bytes > size_) {
    // A buffer of half a megabyte or more is allocated in whole huge pages and
    // marked for transparent huge pages: the peer's single-copy read
    // (process_vm_readv under Open MPI's shared-memory transport) pins the
    // pages it reads, per 4 KiB page otherwise, and that pinning was a
    // quarter of a large ring allreduce's time (docs/benchmarks.md).
    const bool huge = bytes >= kHugePage / 4;
    const std::size_t align = huge ? kHugePage : kAlign;
    const std::size_t want = gyre::align_up(bytes, align);
    auto* p = static_cast<std::byte*>(std::aligned_alloc(align, want));
    if (!p) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
    // A hint: where THP is off the buffer simply keeps small pages.
    if (huge) (void)madvise(p, want, MADV_HUGEPAGE);
#endif
    data_.reset(p);
    size_ = want;
    ++allocations_;
  }
  return data_.get();
}

}  // namespace gyre::core
