// alloc_shared / free_shared (gyre.h): buffers from this rank's part of the
// host's pool, which the world runtime's shared-memory group mapped at init
// (transport::ShmHost, GYRE_SHM_POOL_BYTES).
#include <mutex>

#include "api/lifecycle.h"
#include "gyre/collectives/shm_host.h"
#include "gyre/gyre.h"

namespace gyre {

namespace {

// The allocator of the running world's pool; null without one (or without
// a running world). The host it belongs to is kept alive by `hold`.
collectives::ShmPoolAllocator* pool_allocator(std::shared_ptr<transport::ShmHost>& hold) {
  std::lock_guard<std::mutex> lock(api::g_mu);
  if (!api::g_runtime) return nullptr;
  hold = api::g_runtime->shm_host();
  return hold ? hold->allocator() : nullptr;
}

}  // namespace

void* alloc_shared(std::size_t bytes) {
  api::runtime("alloc_shared");  // StateError before init()
  std::shared_ptr<transport::ShmHost> host;
  collectives::ShmPoolAllocator* a = pool_allocator(host);
  return a != nullptr ? a->allocate(bytes) : nullptr;
}

void free_shared(void* p) {
  if (p == nullptr) return;
  std::shared_ptr<transport::ShmHost> host;
  // After shutdown() the pool is unmapped, and its buffers with it: nothing
  // is left to give back.
  if (collectives::ShmPoolAllocator* a = pool_allocator(host)) a->release(p);
}

}  // namespace gyre
