// The messages of the point-to-point protocol (p2p_engine.h describes the
// protocol): the control tags, the header a send announces itself with, the
// receiver's acknowledgement, and the words errors describe an operation in.
// Internal to the engine (p2p_engine.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gyre/gyre.h"
#include "runtime/p2p_engine.h"

namespace gyre::core::p2p {

inline constexpr int kHeaderTag = 1;
inline constexpr int kAckTag = 2;
inline constexpr int kPayloadTag = 3;
inline constexpr std::size_t kPieceBytes = std::size_t{1} << 30;

// A refused send's header has count kRefusedCount and its reason after it.
inline constexpr std::int64_t kRefusedCount = -1;
// A send whose deadline passed unacknowledged withdraws its header with a
// second one of count kWithdrawnCount and the same sequence number: the
// receiver's engine learns it whenever it next runs, so the sender's need
// not stay awake for a recv that may come late or never.
inline constexpr std::int64_t kWithdrawnCount = -2;

struct Header {
  std::uint64_t seq;
  std::int64_t tag;
  std::int64_t count;
  std::int32_t process_set;
  std::int32_t dtype;
};

struct Ack {
  std::uint64_t seq;
  std::int64_t count;   // the receiver's element count
  std::int32_t dtype;   // the receiver's dtype
  std::int32_t accepted;
};

template <typename T>
std::vector<std::byte> bytes_of(const T& v) {
  std::vector<std::byte> b(sizeof(T));
  std::memcpy(b.data(), &v, sizeof(T));
  return b;
}

template <typename T>
std::optional<T> parse(const std::vector<std::byte>& b) {
  if (b.size() != sizeof(T)) return std::nullopt;
  T v;
  std::memcpy(&v, b.data(), sizeof(T));
  return v;
}

inline std::string dtype_text(std::int32_t d) {
  if (d < 0 || d >= kNumDataTypes) return fmt::format("dtype #{}", d);
  return std::string(dtype_name(static_cast<DataType>(d)));
}

inline std::string where(const P2pOp& op) {
  std::string s = fmt::format("tag {}", op.tag);
  if (op.process_set != kGlobalProcessSet) s += fmt::format(", process set {}", op.process_set);
  return s;
}

inline std::string describe(const P2pOp& op) {
  if (op.is_send) return fmt::format("send to rank {} ({})", op.peer, where(op));
  if (op.peer == kAnySource) return fmt::format("recv from any rank ({})", where(op));
  return fmt::format("recv from rank {} ({})", op.peer, where(op));
}

}  // namespace gyre::core::p2p
