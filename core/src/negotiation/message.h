// The negotiation messages: what one rank tells every other rank in one
// round, and how it is serialised.
//
// Every round each rank encodes one RoundMessage (its newly enqueued
// requests, its committed step, its joined and shutdown flags, cache hits)
// and the background thread allgathers the encoded bytes. Messages are
// built, encoded and decoded on the background thread only. The encoding is
// plain little-endian fields with length prefixes; decode() checks every
// length against the buffer and throws TransportError on malformed input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gyre/gyre.h"
#include "gyre/types.h"

namespace gyre::core {

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
};

struct RoundMessage {
  bool shutdown = false;  // this rank called shutdown()
  bool joined = false;    // this rank called join() and waits for the others
  std::uint64_t step = 0; // committed steps of the sender
  // Response-cache slots whose cached request this rank enqueued again,
  // unchanged and at `step`: sent as a bit vector instead of full requests.
  std::vector<std::uint32_t> cache_hits;
  std::vector<Request> requests;
  // Tensors the stall inspector (rank 0 only) fails on every rank.
  std::vector<std::string> stall_failures;
};

// Bounds of a message from a peer; decode() refuses anything beyond them.
inline constexpr std::size_t kMaxMessageBytes = 64u << 20;  // one encoded message
inline constexpr std::size_t kMinMessageBytes = 25;         // an empty message
inline constexpr std::size_t kMaxNameBytes = 64u << 10;     // a name or a group name
inline constexpr std::size_t kMaxErrorBytes = 64u << 10;    // an announced failure's reason
inline constexpr std::size_t kMaxDims = 64;                 // dimensions of a shape
// Largest byte count of one tensor: room to add a few without overflow.
inline constexpr std::uint64_t kMaxTensorBytes = std::uint64_t{1} << 56;

// The first 4 bytes of an encoded message are its total length, so the
// receiver of a truncated first block knows how much follows.
std::vector<std::byte> encode(const RoundMessage& m);
// Decodes the message rank `from_rank` of a world of `world_size` ranks
// sent, and validates every field: lengths within the bounds above, enum
// values known, shapes non-negative with byte counts that do not
// overflow, split counts equal to the world size (alltoall) and adding up
// to the rows sent, digest counts that fit the collective, a root that is
// a rank, finite scale factors. Throws TransportError naming the peer and
// the field; never reads out of bounds or allocates beyond the message's
// own length.
RoundMessage decode(std::span<const std::byte> bytes, int from_rank, int world_size);
std::uint32_t encoded_length(std::span<const std::byte> first_bytes);

}  // namespace gyre::core
