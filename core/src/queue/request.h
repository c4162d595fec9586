// Request: one rank's request for one named operation, as the caller's
// thread makes it at enqueue (api/), the queue keeps it with the caller's
// buffers (queue/) and the negotiation sends it to the other ranks
// (negotiation/message.h encodes it). Defined at the queue, the first
// stage that holds it, so that no stage includes a later one for it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "gyre/gyre.h"
#include "gyre/types.h"

namespace gyre::core {

// The clock of the runtime's stages (when an operation was enqueued, sent,
// agreed).
using Clock = std::chrono::steady_clock;

enum class Collective : std::uint8_t {
  kAllreduce = 0,
  kAllgather,
  kBroadcast,
  kAlltoall,
  kReducescatter,
  kBarrier,
  kFingerprint,  // compares digests carried in the requests themselves
  kResync,       // broadcast or average of a set of buffers, then step agreement
};
inline constexpr int kNumCollectives = 8;
std::string_view collective_name(Collective c);

// The kind of exception an error response turns into on every rank.
enum class ErrorKind : std::uint8_t {
  kNone = 0,
  kInvalidArgument,
  kMismatch,
  kDivergence,
  kTimeout,
  kTransport,
  kState,
  kRankFailed,  // a peer process died (ULFM): gyre::rebuild() goes on
};
std::exception_ptr make_error(ErrorKind kind, const std::string& what);

// One rank's request for one named operation.
struct Request {
  std::string name;
  Collective collective = Collective::kAllreduce;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  Device device{};
  std::int32_t root = -1;
  double prescale = 1.0;
  double postscale = 1.0;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> splits;    // alltoall: rows sent to each rank
  // fingerprint_check: a hash of the buffer names, then one digest per
  // buffer; resync: one hash of the buffers' names, dtypes and shapes.
  std::vector<std::uint64_t> digests;
  ResyncPolicy resync_policy = ResyncPolicy::kNewest;  // resync only
  // grouped_allreduce: the group's first name and its size (0: no group).
  // Members become ready together and run in the same round.
  std::string group;
  std::uint32_t group_size = 0;
  std::uint64_t step = 0;              // sender's committed step at enqueue
  // How many times the sender has submitted this name, this request
  // included (enqueued or refused and announced; see TensorQueue). Ranks
  // that pair requests of different numbers pair different iterations of
  // a reused name: a MismatchError, with or without commit_step().
  std::uint64_t seq = 0;
  // Set when the sender failed this operation on its own (bad argument
  // found at enqueue): the other ranks fail it too, with this reason.
  ErrorKind error_kind = ErrorKind::kNone;
  std::string error;

  std::size_t nbytes() const;
  // Same operation, ignoring the step, sequence and error fields: what the
  // response cache compares.
  bool same_operation(const Request& o) const;
  // same_operation without the name.
  bool same_signature(const Request& o) const;
};

}  // namespace gyre::core
