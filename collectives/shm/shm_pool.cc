// ShmPoolAllocator (shm_pool.h): first-fit over one rank's part of a pool.
#include <fmt/format.h>

#include "gyre/collectives/shm_pool.h"
#include "gyre/error.h"

namespace gyre::collectives {

ShmPoolAllocator::ShmPoolAllocator(std::byte* begin, std::size_t bytes)
    : begin_(begin), bytes_(bytes / kShmPoolAlign * kShmPoolAlign) {
  if (bytes_ > 0) free_.emplace(0, bytes_);
}

void* ShmPoolAllocator::allocate(std::size_t bytes) {
  if (bytes == 0 || bytes > bytes_) return nullptr;
  const std::size_t want = (bytes + kShmPoolAlign - 1) / kShmPoolAlign * kShmPoolAlign;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < want) continue;
    const auto [at, room] = *it;
    free_.erase(it);
    if (room > want) free_.emplace(at + want, room - want);
    used_.emplace(at, want);
    return begin_ + at;
  }
  return nullptr;
}

void ShmPoolAllocator::release(void* p) {
  const auto* b = static_cast<const std::byte*>(p);
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = b >= begin_ && b < begin_ + bytes_
                      ? used_.find(static_cast<std::size_t>(b - begin_))
                      : used_.end();
  if (it == used_.end()) {
    throw InvalidArgument(fmt::format(
        "free_shared: {} was not returned by alloc_shared on this rank, or was freed already",
        p));
  }
  std::size_t at = it->first, size = it->second;
  used_.erase(it);
  // Coalesce with the free range after it and the one before it.
  if (auto next = free_.find(at + size); next != free_.end()) {
    size += next->second;
    free_.erase(next);
  }
  if (auto prev = free_.lower_bound(at); prev != free_.begin()) {
    --prev;
    if (prev->first + prev->second == at) {
      at = prev->first;
      size += prev->second;
      free_.erase(prev);
    }
  }
  free_.emplace(at, size);
}

bool ShmPoolAllocator::contains(const void* p, std::size_t bytes) const {
  const auto* b = static_cast<const std::byte*>(p);
  return b >= begin_ && bytes <= bytes_ &&
         b - begin_ <= static_cast<std::ptrdiff_t>(bytes_ - bytes);
}

std::size_t ShmPoolAllocator::free_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::size_t n = 0;
  for (const auto& [at, size] : free_) n += size;
  return n;
}

}  // namespace gyre::collectives
