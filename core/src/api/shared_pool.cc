// alloc_shared / free_shared (gyre.h): buffers from this rank's part of the
// host's pool, which the world runtime's shared-memory group mapped at init
// (transport::ShmHost, GYRE_SHM_POOL_BYTES). A host with buffers out is
// kept (mapped) here until the last of them is freed, so that a buffer
// outlives shutdown() as ordinary memory (a tensor read after shutdown, a
// pool from before a second init()).
#include <map>
#include <memory>
#include <mutex>

#include <fmt/format.h>

#include "api/lifecycle.h"
#include "gyre/collectives/shm_host.h"
#include "gyre/error.h"
#include "gyre/gyre.h"

namespace gyre {

namespace {

struct Held {
  std::shared_ptr<transport::ShmHost> host;
  std::size_t buffers = 0;
};

// Guards g_held. Lock order: api::g_mu before it.
std::mutex g_held_mu;
// The hosts with buffers out, by their allocator.
std::map<collectives::ShmPoolAllocator*, Held> g_held;

}  // namespace

void* alloc_shared(std::size_t bytes) {
  std::shared_ptr<transport::ShmHost> host = api::runtime("alloc_shared")->shm_host();
  collectives::ShmPoolAllocator* a = host ? host->allocator() : nullptr;
  void* p = a != nullptr ? a->allocate(bytes) : nullptr;
  if (p != nullptr) {
    std::lock_guard<std::mutex> lock(g_held_mu);
    Held& h = g_held[a];
    h.host = std::move(host);
    ++h.buffers;
  }
  return p;
}

bool is_shared(const void* p, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(g_held_mu);
  for (const auto& [allocator, held] : g_held) {
    if (allocator->contains(p, bytes)) return true;
  }
  return false;
}

void free_shared(void* p) {
  if (p == nullptr) return;
  std::shared_ptr<transport::ShmHost> last;  // unmapped outside the lock
  std::lock_guard<std::mutex> lock(g_held_mu);
  for (auto it = g_held.begin(); it != g_held.end(); ++it) {
    if (!it->first->contains(p, 1)) continue;
    it->first->release(p);  // InvalidArgument if p is not one of its buffers
    if (--it->second.buffers == 0) {
      last = std::move(it->second.host);
      g_held.erase(it);
    }
    return;
  }
  throw InvalidArgument(
      fmt::format("free_shared: {} was not returned by alloc_shared, or was freed already", p));
}

}  // namespace gyre
