// ShmHost: the shared-memory group of the ranks of this host, set up over
// MPI (MPI_COMM_TYPE_SHARED): local rank 0 creates a job-private segment
// under a fresh name, the others map it, and the name is unlinked as soon as
// all have, so that nothing is left in /dev/shm whatever happens later.
//
// With ShmOptions::pool_bytes, the segment also holds the host's pool
// (shm_pool.h): one part of that many bytes per local rank, after the
// group's region; this rank allocates from its own part (allocator()).
//
// Collective over MPI_COMM_WORLD: every rank calls create() at the same
// point. It returns nullptr on every rank unless every rank `wanted` it with
// the same slot size and pool size and all ranks are on this one host
// (several hosts need a hierarchical backend). Failure on any rank (segment cannot be created or
// mapped) is a TransportError on every rank, with the failing rank's reason.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>

#include "gyre/collectives/shm.h"
#include "gyre/collectives/shm_pool.h"

namespace gyre::transport {

class ShmHost {
 public:
  static std::unique_ptr<ShmHost> create(const collectives::ShmOptions& opt, bool wanted = true);
  // The same for the ranks of each host, whether or not all ranks are on
  // one: every host gets a group of its own ranks (hierarchical collectives).
  static std::unique_ptr<ShmHost> create_per_host(const collectives::ShmOptions& opt,
                                                  bool wanted = true);
  // A group over a region the caller owns and every rank maps (ranks as
  // threads of one process in tests: zero-filled,
  // ShmGroup::region_bytes(size, opt.slot_bytes) bytes, 64-byte aligned),
  // with the caller's pool if it gives one. Not collective.
  static std::unique_ptr<ShmHost> attach(void* region, int rank, int size,
                                         const collectives::ShmOptions& opt,
                                         const collectives::ShmPool& pool = {});
  collectives::ShmGroup& group() { return *group_; }
  // The host's pool (empty without ShmOptions::pool_bytes) and the
  // allocator of this rank's part of it (nullptr without a pool).
  const collectives::ShmPool& pool() const { return pool_; }
  collectives::ShmPoolAllocator* allocator() { return allocator_.get(); }
  // Allreduces that ran on buffers in the pool (shm_allreduce_registered;
  // counted by the backend, read by any thread).
  void count_pool_allreduce() { pool_allreduces_.fetch_add(1, std::memory_order_relaxed); }
  std::uint64_t pool_allreduces() const { return pool_allreduces_.load(); }

 private:
  ShmHost() = default;
  static std::unique_ptr<ShmHost> set_up(const collectives::ShmOptions& opt, bool wanted,
                                         bool whole_world_only);
  collectives::ShmSegment segment_;
  std::optional<collectives::ShmGroup> group_;
  collectives::ShmPool pool_;
  std::unique_ptr<collectives::ShmPoolAllocator> allocator_;
  std::atomic<std::uint64_t> pool_allreduces_{0};
};

}  // namespace gyre::transport
