// Argument checks of send_async / recv_async, then submission to the engine.
#include "api/point_to_point.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace gyre::core {

namespace {

// The tensor's own faults (the caller's refusal, dtype, shape, buffer, device).
void check_tensor(const std::string& what, const TensorView& t) {
  if (!t.refusal.empty()) throw InvalidArgument(fmt::format("{}: {}", what, t.refusal));
  if (static_cast<int>(t.dtype) >= kNumDataTypes) {
    throw InvalidArgument(fmt::format("{}: the tensor has an unknown dtype (value {})", what,
                                      static_cast<int>(t.dtype)));
  }
  for (auto d : t.shape) {
    if (d < 0) {
      throw InvalidArgument(fmt::format("{}: the tensor has a negative dimension in shape [{}]",
                                        what, fmt::join(t.shape, ", ")));
    }
  }
  if (t.numel() > 0 && t.data == nullptr) {
    throw InvalidArgument(
        fmt::format("{}: the buffer is null but has {} elements", what, t.numel()));
  }
  if (t.device.type != DeviceType::kCPU) {
    throw InvalidArgument(fmt::format(
        "{}: the tensor is on {}:{}; point-to-point operations take CPU tensors only", what,
        device_name(t.device.type), t.device.index));
  }
}

}  // namespace

Handle point_to_point_async(P2pEngine& engine, bool is_send, const TensorView& t, int peer,
                            std::int64_t tag, int process_set,
                            const std::vector<int>& set_ranks, int self) {
  const std::string what =
      is_send ? fmt::format("send to rank {} (tag {})", peer, tag)
              : (peer == kAnySource ? fmt::format("recv from any rank (tag {})", tag)
                                    : fmt::format("recv from rank {} (tag {})", peer, tag));
  auto in_set = [&](int r) { return std::binary_search(set_ranks.begin(), set_ranks.end(), r); };
  const std::string set_text =
      process_set == kGlobalProcessSet
          ? fmt::format("this job (ranks 0 to {})", set_ranks.size() - 1)
          : fmt::format("process set {} (ranks [{}])", process_set, fmt::join(set_ranks, ", "));
  // A refused send is announced to its peer (so that the recv that would
  // have taken it fails now with this reason, not at its deadline) when the
  // peer is one.
  const bool announce = is_send && peer != kAnySource && in_set(self) && in_set(peer);
  try {
    check_tensor(what, t);
    if (!in_set(self)) {
      throw InvalidArgument(fmt::format("{}: this rank ({}) is not in {}", what, self, set_text));
    }
    if (peer == kAnySource && is_send) {
      throw InvalidArgument(fmt::format("{}: a send needs a destination rank", what));
    }
    if (peer != kAnySource && !in_set(peer)) {
      throw InvalidArgument(fmt::format("{}: rank {} is not a rank of {}", what, peer, set_text));
    }
  } catch (const InvalidArgument& e) {
    if (announce) {
      P2pOp refused;
      refused.is_send = true;
      refused.peer = peer;
      refused.tag = tag;
      refused.process_set = process_set;
      refused.refusal = e.what();
      engine.submit(std::move(refused));
    }
    throw;
  }
  auto state = std::make_shared<OpState>();
  P2pOp op;
  op.is_send = is_send;
  op.view = t;
  op.peer = peer;
  op.tag = tag;
  op.process_set = process_set;
  op.state = state;
  engine.submit(std::move(op));
  return Handle(state);
}

}  // namespace gyre::core
