// The negotiation messages: what one rank tells every other rank in one
// round, and how it is serialised. The requests they carry are
// queue/request.h's.
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
#include "queue/request.h"

namespace gyre::core {

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
