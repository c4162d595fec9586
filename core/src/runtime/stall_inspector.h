// StallInspector: finds tensors some ranks enqueued long ago and others
// never did (the rank-dependent control flow that makes jobs hang).
//
// Every rank warns, once per tensor and again every warning period, about
// tensors it enqueued itself that are still missing on other ranks, naming
// the tensor and the missing ranks. Failing stalled tensors must happen on
// every rank in the same round, so only rank 0 decides: it returns the
// names past GYRE_STALL_SHUTDOWN_S, which travel in its next negotiation
// message and are failed by every rank's Coordinator.
//
// Thread: background thread only.
#pragma once

#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "negotiation/coordinator.h"
#include "runtime/logging.h"

namespace gyre::core {

class StallInspector {
 public:
  StallInspector(int rank, double warning_s, double shutdown_s)
      : rank_(rank), warning_s_(warning_s), shutdown_s_(shutdown_s) {}

  // Logs warnings; returns (on rank 0) the tensors to fail now.
  std::vector<std::string> inspect(const Coordinator& coord, Clock::time_point now,
                                   const Logger& log);

 private:
  int rank_;
  double warning_s_;
  double shutdown_s_;
  std::unordered_map<std::string, Clock::time_point> last_warned_;
  std::set<std::string> failing_;  // already sent for failure, awaiting the round
};

}  // namespace gyre::core
