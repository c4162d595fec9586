// Request: names of the collectives, the error of each kind, and the
// request's own comparisons.
#include "queue/request.h"

#include "gyre/error.h"

namespace gyre::core {

std::string_view collective_name(Collective c) {
  switch (c) {
    case Collective::kAllreduce: return "allreduce";
    case Collective::kAllgather: return "allgather";
    case Collective::kBroadcast: return "broadcast";
    case Collective::kAlltoall: return "alltoall";
    case Collective::kReducescatter: return "reducescatter";
    case Collective::kBarrier: return "barrier";
    case Collective::kFingerprint: return "fingerprint_check";
    case Collective::kResync: return "resync";
  }
  return "unknown";
}

std::exception_ptr make_error(ErrorKind kind, const std::string& what) {
  switch (kind) {
    case ErrorKind::kInvalidArgument: return std::make_exception_ptr(InvalidArgument(what));
    case ErrorKind::kMismatch: return std::make_exception_ptr(MismatchError(what));
    case ErrorKind::kDivergence: return std::make_exception_ptr(DivergenceError(what));
    case ErrorKind::kTimeout: return std::make_exception_ptr(TimeoutError(what));
    case ErrorKind::kTransport: return std::make_exception_ptr(TransportError(what));
    case ErrorKind::kState: return std::make_exception_ptr(StateError(what));
    case ErrorKind::kRankFailed: return std::make_exception_ptr(RankFailedError(what));
    case ErrorKind::kNone: break;
  }
  return std::make_exception_ptr(Error(what));
}

std::size_t Request::nbytes() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return static_cast<std::size_t>(n) * dtype_size(dtype);
}

bool Request::same_operation(const Request& o) const { return name == o.name && same_signature(o); }

bool Request::same_signature(const Request& o) const {
  return collective == o.collective && dtype == o.dtype && op == o.op &&
         device == o.device && root == o.root && prescale == o.prescale &&
         postscale == o.postscale && shape == o.shape && splits == o.splits &&
         digests == o.digests && resync_policy == o.resync_policy && group == o.group &&
         group_size == o.group_size;
}

}  // namespace gyre::core
