#include "negotiation/message.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include <fmt/format.h>

#include "gyre/error.h"

namespace gyre::core {

namespace {

class Writer {
 public:
  template <typename T>
  void pod(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    auto at = out_.size();
    out_.resize(at + sizeof(T));
    std::memcpy(out_.data() + at, &v, sizeof(T));
  }
  void str(std::string_view s) {
    pod<std::uint32_t>(static_cast<std::uint32_t>(s.size()));
    auto at = out_.size();
    out_.resize(at + s.size());
    if (!s.empty()) std::memcpy(out_.data() + at, s.data(), s.size());
  }
  template <typename T>
  void vec(const std::vector<T>& v) {
    pod<std::uint32_t>(static_cast<std::uint32_t>(v.size()));
    for (const auto& x : v) pod<T>(x);
  }
  std::vector<std::byte> take() { return std::move(out_); }
  std::vector<std::byte>& bytes() { return out_; }

 private:
  std::vector<std::byte> out_;
};

class Reader {
 public:
  Reader(std::span<const std::byte> in, int from) : in_(in), from_(from) {}
  template <typename T>
  T pod() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string str(std::size_t max_bytes, const char* what) {
    auto n = pod<std::uint32_t>();
    if (n > max_bytes) {
      throw TransportError(fmt::format(
          "malformed negotiation message from rank {}: {} of {} bytes (at most {})", from_, what,
          n, max_bytes));
    }
    need(n);
    std::string s(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  template <typename T>
  std::vector<T> vec() {
    auto n = pod<std::uint32_t>();
    need(static_cast<std::size_t>(n) * sizeof(T));
    std::vector<T> v(n);
    for (auto& x : v) x = pod<T>();
    return v;
  }
  std::span<const std::byte> raw(std::size_t n) {
    need(n);
    auto s = in_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  bool done() const { return pos_ == in_.size(); }

 private:
  void need(std::size_t n) const {
    if (n > in_.size() - pos_) {
      throw TransportError(fmt::format(
          "malformed negotiation message from rank {}: needs {} bytes at offset {} of {}",
          from_, n, pos_, in_.size()));
    }
  }
  std::span<const std::byte> in_;
  std::size_t pos_ = 0;
  int from_;
};

void put_request(Writer& w, const Request& r) {
  w.str(r.name);
  w.pod<std::uint8_t>(static_cast<std::uint8_t>(r.collective));
  w.pod<std::uint8_t>(static_cast<std::uint8_t>(r.dtype));
  w.pod<std::uint8_t>(static_cast<std::uint8_t>(r.op));
  w.pod<std::uint8_t>(static_cast<std::uint8_t>(r.device.type));
  w.pod<std::int32_t>(r.device.index);
  w.pod<std::int32_t>(r.root);
  w.pod<double>(r.prescale);
  w.pod<double>(r.postscale);
  w.pod<std::uint64_t>(r.step);
  w.pod<std::uint64_t>(r.seq);
  w.vec(r.shape);
  w.vec(r.splits);
  w.vec(r.digests);
  w.pod<std::uint8_t>(static_cast<std::uint8_t>(r.resync_policy));
  w.str(r.group);
  w.pod<std::uint32_t>(r.group_size);
  w.pod<std::uint8_t>(static_cast<std::uint8_t>(r.error_kind));
  w.str(r.error);
}

template <typename E>
E checked_enum(Reader& rd, int limit, const char* what, int from) {
  auto v = rd.pod<std::uint8_t>();
  if (v >= limit) {
    throw TransportError(
        fmt::format("malformed negotiation message from rank {}: {} value {}", from, what, v));
  }
  return static_cast<E>(v);
}

Request get_request(Reader& rd, int from) {
  Request r;
  r.name = rd.str(kMaxNameBytes, "a name");
  r.collective = checked_enum<Collective>(rd, kNumCollectives, "collective", from);
  r.dtype = checked_enum<DataType>(rd, kNumDataTypes, "dtype", from);
  r.op = checked_enum<ReduceOp>(rd, kNumReduceOps, "reduce op", from);
  r.device.type = checked_enum<DeviceType>(rd, 2, "device", from);
  r.device.index = rd.pod<std::int32_t>();
  r.root = rd.pod<std::int32_t>();
  r.prescale = rd.pod<double>();
  r.postscale = rd.pod<double>();
  r.step = rd.pod<std::uint64_t>();
  r.seq = rd.pod<std::uint64_t>();
  r.shape = rd.vec<std::int64_t>();
  r.splits = rd.vec<std::int64_t>();
  r.digests = rd.vec<std::uint64_t>();
  r.resync_policy = checked_enum<ResyncPolicy>(rd, 2, "resync policy", from);
  r.group = rd.str(kMaxNameBytes, "a group name");
  r.group_size = rd.pod<std::uint32_t>();
  r.error_kind = checked_enum<ErrorKind>(rd, 8, "error kind", from);
  r.error = rd.str(kMaxErrorBytes, "a failure reason");
  return r;
}

constexpr std::uint8_t kFlagShutdown = 1, kFlagJoined = 2;

// The checks of one decoded request that do not need other ranks' requests
// (those are the coordinator's).
void validate(const Request& r, int from, int world) {
  auto bad = [&](const std::string& what) {
    throw TransportError(fmt::format("malformed negotiation message from rank {}: {} '{}': {}",
                                     from, collective_name(r.collective), r.name, what));
  };
  if (r.shape.size() > kMaxDims) bad(fmt::format("{} dimensions", r.shape.size()));
  std::uint64_t bytes = dtype_size(r.dtype);
  for (auto d : r.shape) {
    if (d < 0) bad(fmt::format("negative dimension {}", d));
    const auto u = static_cast<std::uint64_t>(d);
    if (u != 0 && bytes > kMaxTensorBytes / u) bad("byte count overflows");
    bytes *= u;
  }
  if (bytes > kMaxTensorBytes) bad(fmt::format("{} bytes", bytes));
  if (r.group_size == 1 || (r.group_size == 0) != r.group.empty() ||
      r.group_size > static_cast<std::uint32_t>(kMaxMessageBytes)) {
    bad(fmt::format("group '{}' of {}", r.group, r.group_size));
  }
  // A failed request (refused on its rank, announced with the reason) is
  // never run and its fields are never compared: the checks below are for
  // requests that will be.
  if (r.error_kind != ErrorKind::kNone) return;
  const Collective c = r.collective;
  const bool rows = c == Collective::kAllgather || c == Collective::kAlltoall ||
                    c == Collective::kReducescatter;
  if (rows && r.shape.empty()) bad("no first dimension");
  if (c == Collective::kAlltoall) {
    if (r.splits.size() != static_cast<std::size_t>(world)) {
      bad(fmt::format("{} splits for {} ranks", r.splits.size(), world));
    }
    std::uint64_t sum = 0;
    for (auto s : r.splits) {
      if (s < 0) bad(fmt::format("negative split {}", s));
      sum += static_cast<std::uint64_t>(s);  // each split <= rows: no overflow
      if (sum > static_cast<std::uint64_t>(r.shape[0])) break;
    }
    if (sum != static_cast<std::uint64_t>(r.shape[0])) {
      bad(fmt::format("splits do not add up to the {} rows", r.shape[0]));
    }
  } else if (!r.splits.empty()) {
    bad(fmt::format("{} splits", r.splits.size()));
  }
  const std::size_t digests = r.digests.size();
  if (c == Collective::kFingerprint ? digests < 1
                                    : digests != (c == Collective::kResync ? 1u : 0u)) {
    bad(fmt::format("{} digests", digests));
  }
  if (c == Collective::kBroadcast ? (r.root < 0 || r.root >= world)
                                  : (r.root < -1 || r.root >= world)) {
    bad(fmt::format("root {} in a world of {}", r.root, world));
  }
  if (!std::isfinite(r.prescale) || !std::isfinite(r.postscale)) bad("scale factor not finite");
  if ((c == Collective::kAllreduce || c == Collective::kReducescatter) &&
      !op_defined(r.dtype, r.op)) {
    bad(fmt::format("reduce op {} on {}", op_name(r.op), dtype_name(r.dtype)));
  }
}

}  // namespace

std::vector<std::byte> encode(const RoundMessage& m) {
  Writer w;
  w.pod<std::uint32_t>(0);  // total length, patched below
  std::uint8_t flags = (m.shutdown ? kFlagShutdown : 0) | (m.joined ? kFlagJoined : 0);
  w.pod<std::uint8_t>(flags);
  w.pod<std::uint64_t>(m.step);
  // Cache hits as a bit vector over slots 0..max: in steady state every
  // tensor is a hit and this is the whole message body.
  std::uint32_t nbits = 0;
  for (auto s : m.cache_hits) nbits = std::max(nbits, s + 1);
  w.pod<std::uint32_t>(nbits);
  std::vector<std::uint8_t> bits((nbits + 7) / 8, 0);
  for (auto s : m.cache_hits) bits[s / 8] |= static_cast<std::uint8_t>(1u << (s % 8));
  for (auto b : bits) w.pod<std::uint8_t>(b);
  w.pod<std::uint32_t>(static_cast<std::uint32_t>(m.requests.size()));
  for (const auto& r : m.requests) put_request(w, r);
  w.pod<std::uint32_t>(static_cast<std::uint32_t>(m.stall_failures.size()));
  for (const auto& s : m.stall_failures) w.str(s);
  auto out = w.take();
  auto len = static_cast<std::uint32_t>(out.size());
  std::memcpy(out.data(), &len, sizeof(len));
  return out;
}

std::uint32_t encoded_length(std::span<const std::byte> first_bytes) {
  std::uint32_t len = 0;
  if (first_bytes.size() >= sizeof(len)) std::memcpy(&len, first_bytes.data(), sizeof(len));
  return len;
}

RoundMessage decode(std::span<const std::byte> bytes, int from_rank, int world_size) {
  if (bytes.size() > kMaxMessageBytes) {
    throw TransportError(fmt::format(
        "malformed negotiation message from rank {}: {} bytes (at most {})", from_rank,
        bytes.size(), kMaxMessageBytes));
  }
  Reader rd(bytes, from_rank);
  RoundMessage m;
  auto len = rd.pod<std::uint32_t>();
  if (len != bytes.size()) {
    throw TransportError(fmt::format(
        "malformed negotiation message from rank {}: length field {} but {} bytes", from_rank,
        len, bytes.size()));
  }
  auto flags = rd.pod<std::uint8_t>();
  m.shutdown = flags & kFlagShutdown;
  m.joined = flags & kFlagJoined;
  m.step = rd.pod<std::uint64_t>();
  auto nbits = rd.pod<std::uint32_t>();
  auto bits = rd.raw((static_cast<std::size_t>(nbits) + 7) / 8);
  for (std::uint32_t s = 0; s < nbits; ++s) {
    if (std::to_integer<unsigned>(bits[s / 8]) & (1u << (s % 8))) m.cache_hits.push_back(s);
  }
  auto nreq = rd.pod<std::uint32_t>();
  for (std::uint32_t i = 0; i < nreq; ++i) {
    m.requests.push_back(get_request(rd, from_rank));
    validate(m.requests.back(), from_rank, world_size);
  }
  auto nstall = rd.pod<std::uint32_t>();
  for (std::uint32_t i = 0; i < nstall; ++i) {
    m.stall_failures.push_back(rd.str(kMaxNameBytes, "a stalled name"));
  }
  if (!rd.done()) {
    throw TransportError(
        fmt::format("malformed negotiation message from rank {}: trailing bytes", from_rank));
  }
  return m;
}

}  // namespace gyre::core
