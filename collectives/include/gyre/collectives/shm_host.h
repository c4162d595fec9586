// ShmHost: the shared-memory group of the ranks of this host, set up over
// MPI (MPI_COMM_TYPE_SHARED): local rank 0 creates a job-private segment
// under a fresh name, the others map it, and the name is unlinked as soon as
// all have, so that nothing is left in /dev/shm whatever happens later.
//
// Collective over MPI_COMM_WORLD: every rank calls create() at the same
// point. It returns nullptr on every rank unless every rank `wanted` it with
// the same slot size and all ranks are on this one host (several hosts need
// a hierarchical backend). Failure on any rank (segment cannot be created or
// mapped) is a TransportError on every rank, with the failing rank's reason.
#pragma once

#include <memory>
#include <optional>

#include "gyre/collectives/shm.h"

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
  // ShmGroup::region_bytes(size, opt.slot_bytes) bytes, 64-byte aligned). Not
  // collective.
  static std::unique_ptr<ShmHost> attach(void* region, int rank, int size,
                                         const collectives::ShmOptions& opt);
  collectives::ShmGroup& group() { return *group_; }

 private:
  ShmHost() = default;
  static std::unique_ptr<ShmHost> set_up(const collectives::ShmOptions& opt, bool wanted,
                                         bool whole_world_only);
  collectives::ShmSegment segment_;
  std::optional<collectives::ShmGroup> group_;
};

}  // namespace gyre::transport
