// ShmHost: the shared-memory group of the ranks of this host, set up over
// MPI (MPI_COMM_TYPE_SHARED): local rank 0 creates a job-private segment
// under a fresh name, the others map it, and the name is unlinked as soon as
// all have, so that nothing is left in /dev/shm whatever happens later.
//
// Collective over MPI_COMM_WORLD: every rank calls create() at the same
// point. Failure on any local rank (segment cannot be created or mapped) is
// a TransportError on every rank of the host, with the failing rank's reason.
#pragma once

#include <memory>
#include <optional>

#include "gyre/collectives/shm.h"

namespace gyre::transport {

class ShmHost {
 public:
  static std::unique_ptr<ShmHost> create(const collectives::ShmOptions& opt);
  collectives::ShmGroup& group() { return *group_; }
  // True when every rank of MPI_COMM_WORLD is on this host.
  bool whole_world() const { return whole_world_; }

 private:
  ShmHost() = default;
  collectives::ShmSegment segment_;
  std::optional<collectives::ShmGroup> group_;
  bool whole_world_ = false;
};

}  // namespace gyre::transport
