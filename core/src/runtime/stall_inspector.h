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
// An operation may have a shorter deadline of its own: set_deadline()
// registers one for the names that start with a prefix (torch.distributed's
// group timeout: the names of a group share its prefix). Each process set
// has its own runtime and inspector, whose rank 0 is a member of the set,
// so registering on the set's members is enough.
//
// Thread: inspect() on the background thread only; set_deadline() on any.
#pragma once

#include <map>
#include <mutex>
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

  // Operations named `prefix`... fail after `seconds` (the longest matching
  // prefix's; never later than GYRE_STALL_SHUTDOWN_S where that is set).
  // seconds <= 0 removes the prefix's deadline.
  void set_deadline(const std::string& prefix, double seconds);

  // The deadline of an operation named `name`: 0 when it never fails.
  static double deadline_of(const std::map<std::string, double>& deadlines,
                            double shutdown_s, const std::string& name);

 private:
  int rank_;
  double warning_s_;
  double shutdown_s_;
  std::mutex deadlines_mu_;  // guards deadlines_
  std::map<std::string, double> deadlines_;  // name prefix -> seconds
  std::unordered_map<std::string, Clock::time_point> last_warned_;
  std::set<std::string> failing_;  // already sent for failure, awaiting the round
};

}  // namespace gyre::core
