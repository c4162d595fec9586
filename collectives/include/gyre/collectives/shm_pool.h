// ShmPool: memory that every rank of a host maps, one part per rank, from
// which each rank allocates buffers its peers can read and write where they
// lie (gyre::alloc_shared); and the allreduce that reduces such buffers
// straight from one another, with no copy through the group's slots.
//
// Why: an allreduce of private buffers over shared memory has to move every
// byte through the slots (in, reduced, out). When every rank's buffer is in
// memory the others map, each rank reduces its share of all the buffers and
// writes the result into all of them: the single-copy bound's traffic (each
// rank reads its share of every buffer once and writes it once). MPI's
// MPI_Win_allocate_shared and NCCL's registered user buffers rest on the
// same idea.
//
// Who owns what: the pool's memory belongs to the ShmHost that mapped it
// (transport/mpi_shm.cc) and lives until it is destroyed (gyre::shutdown);
// the allocator is shared by every thread of the rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

#include "gyre/collectives/shm.h"

namespace gyre::collectives {

// Bytes at the start of each rank's part that are not allocated: the rank's
// mailbox, where shm_allreduce_registered publishes where its buffer lies.
inline constexpr std::size_t kShmPoolHeader = 64;
// Every buffer allocated from a pool starts on this boundary.
inline constexpr std::size_t kShmPoolAlign = 64;

struct ShmPool {
  std::byte* base = nullptr;   // `size` parts of `part_bytes`, every rank's mapped here
  std::size_t part_bytes = 0;  // a multiple of kShmPoolAlign, header included
  int size = 0;
  bool empty() const { return base == nullptr || part_bytes <= kShmPoolHeader; }
  std::byte* part(int q) const { return base + static_cast<std::size_t>(q) * part_bytes; }
};

// First-fit allocation from one rank's part of a pool (after its header).
// Any thread; releases coalesce with their free neighbours.
class ShmPoolAllocator {
 public:
  ShmPoolAllocator(std::byte* begin, std::size_t bytes);
  // `bytes` rounded up to kShmPoolAlign; nullptr when no free range is
  // large enough (or bytes is 0).
  void* allocate(std::size_t bytes);
  // A pointer allocate() returned and not yet released; anything else
  // throws InvalidArgument.
  void release(void* p);
  // Whether [p, p + bytes) lies in this allocator's range.
  bool contains(const void* p, std::size_t bytes) const;
  std::size_t free_bytes() const;

 private:
  std::byte* const begin_;
  const std::size_t bytes_;
  mutable std::mutex mu_;                    // guards free_ and used_
  std::map<std::size_t, std::size_t> free_;  // offset -> bytes, not touching each other
  std::map<std::size_t, std::size_t> used_;  // offset -> bytes
};

// Allreduce of `count` elements in place between buffers that lie in the
// pool, one per rank, each in its own rank's part: every rank reduces its
// share (the shares of shm_allreduce, 64-byte lines) from every rank's
// buffer in rank order and writes the result into every buffer, in pieces
// that stay in cache; the same bits as shm_allreduce. Collective over the
// group; every rank passes the same count, dtype, op and scales. Returns
// true when it has reduced, false on every rank (having only published and
// read the ranks' mailboxes, with one barrier) when some rank's buffer is
// not in place (in != out) or not in its part of the pool, or the pool is
// empty or not the group's size: the caller then runs shm_allreduce.
bool shm_allreduce_registered(ShmGroup& g, const ShmPool& pool, const void* in, void* out,
                              std::size_t count, DataType dt, ReduceOp op,
                              double prescale = 1.0, double postscale = 1.0);

}  // namespace gyre::collectives
