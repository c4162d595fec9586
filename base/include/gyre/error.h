// The exceptions gyre throws. Every message names what was wrong: the tensor,
// the field, and the ranks involved where more than one rank is concerned.
// A failure on the background thread is stored in the handle of each
// operation it affects and rethrown by Handle::wait() on the caller's thread.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace gyre {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A bad argument detected on the calling rank (null buffer, unknown root,
// operation not defined for a type, ...).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// Ranks disagree on an operation: shape, dtype, op, root or collective.
class MismatchError : public Error {
 public:
  using Error::Error;
};

// Which ranks were at which committed step when an operation failed with
// DivergenceError (empty when the error did not come from a step check).
struct DivergenceDetail {
  std::string tensor;
  std::vector<int> ranks;             // the ranks that submitted the tensor
  std::vector<std::uint64_t> steps;   // steps[i]: committed step of ranks[i]
};

// Ranks are at different training steps, or hold different parameter values.
class DivergenceError : public Error {
 public:
  using Error::Error;
  DivergenceError(const std::string& what, DivergenceDetail detail)
      : Error(what), detail_(std::move(detail)) {}
  const DivergenceDetail& detail() const { return detail_; }

 private:
  DivergenceDetail detail_;
};

// An operation made no progress within its deadline.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// The transport (MPI, NCCL, ...) reported a failure.
class TransportError : public Error {
 public:
  using Error::Error;
};

// A rank of the job failed (its process died) while this rank communicated
// with it, seen by an MPI with ULFM run with fault tolerance on (see
// docs/elastic.md). Every operation pending on every surviving rank fails
// with it; gyre::rebuild() on every survivor makes a working world of them.
// Without ULFM a dead rank ends the whole job instead.
class RankFailedError : public TransportError {
 public:
  using TransportError::TransportError;
};

// The runtime is not in a state to take the call: not initialised, initialised
// twice, or shut down while the operation was pending.
class StateError : public Error {
 public:
  using Error::Error;
};

}  // namespace gyre
