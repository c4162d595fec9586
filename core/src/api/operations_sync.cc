// The public divergence tools: fingerprint_check() and resync().
//
// Both are ordinary operations of the background thread with internal
// names. fingerprint_check hashes the buffers here, on the caller's thread,
// and the digests travel inside the negotiation request: comparing them
// needs no transfer beyond the round itself. resync carries its policy and
// a hash of the buffers' names, dtypes and shapes (checked at negotiation);
// the background thread then broadcasts or averages the buffers.
//
// The internal name is taken before the arguments are checked, and a
// refusal is announced to the other ranks under that name: a call refused
// on one rank fails on every rank with its reason, and the names of later
// calls advance alike everywhere (a refused call consuming no name would
// pair this rank's next call with the others' previous one).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "api/fingerprint.h"
#include "api/operations.h"

namespace gyre::core {

namespace {

void check_buffers(const char* call, const std::vector<NamedBuffer>& buffers) {
  for (const auto& b : buffers) {
    // The binding could not convert it: the reason names the buffer.
    if (!b.tensor.refusal.empty()) {
      throw InvalidArgument(fmt::format("{}: {}", call, b.tensor.refusal));
    }
    if (b.tensor.numel() > 0 && b.tensor.data == nullptr) {
      throw InvalidArgument(fmt::format("{}: buffer '{}' is null but has {} elements", call,
                                        b.name, b.tensor.numel()));
    }
    if (b.tensor.device.type != DeviceType::kCPU) {
      throw InvalidArgument(fmt::format(
          "{}: buffer '{}' is not a CPU tensor ({} is not supported on CUDA tensors yet)", call,
          b.name, call));
    }
  }
}

// Runs `validate`; on InvalidArgument announces the refusal under the
// request's internal name, then rethrows.
template <typename F>
void refuse_everywhere(Runtime& rt, const Request& req, F&& validate) {
  try {
    validate();
  } catch (const InvalidArgument& e) {
    Request failed = req;
    failed.error_kind = ErrorKind::kInvalidArgument;
    failed.error = e.what();
    rt.queue().announce_failure(std::move(failed));
    throw;
  }
}

Handle submit(Runtime& rt, Request req, const std::vector<NamedBuffer>& buffers) {
  auto state = std::make_shared<OpState>();
  LocalEntry e;
  e.request = std::move(req);
  e.state = state;
  for (const auto& b : buffers) {
    e.buffers.push_back(b.tensor);
    e.buffer_names.push_back(b.name);
  }
  std::vector<LocalEntry> v;
  v.push_back(std::move(e));
  rt.queue().push(std::move(v));
  return Handle(state);
}

}  // namespace

std::vector<FingerprintMismatch> fingerprint_check(Runtime& rt,
                                                   const std::vector<NamedBuffer>& buffers) {
  Handle h = fingerprint_check_async(rt, buffers);
  h.wait();
  return h.mismatches();
}

void resync(Runtime& rt, const std::vector<NamedBuffer>& buffers, ResyncPolicy policy) {
  resync_async(rt, buffers, policy).wait();
}

Handle fingerprint_check_async(Runtime& rt, const std::vector<NamedBuffer>& buffers) {
  Request req;
  req.name = rt.internal_name("fingerprint");
  req.collective = Collective::kFingerprint;
  req.step = rt.versions().own();
  std::uint64_t names = buffers.size();
  for (const auto& b : buffers) names = hash_combine(names, b.name);
  req.digests.push_back(names);
  refuse_everywhere(rt, req, [&] { check_buffers("fingerprint_check", buffers); });
  for (const auto& b : buffers) {
    req.digests.push_back(hash_bytes(b.tensor.data, b.tensor.nbytes(),
                                           static_cast<std::uint64_t>(b.tensor.dtype)));
  }
  return submit(rt, std::move(req), buffers);
}

Handle resync_async(Runtime& rt, const std::vector<NamedBuffer>& buffers, ResyncPolicy policy) {
  Request req;
  req.name = rt.internal_name("resync");
  req.collective = Collective::kResync;
  req.step = rt.versions().own();
  std::uint64_t layout = buffers.size();
  for (const auto& b : buffers) {
    layout = hash_combine(layout, b.name);
    layout = hash_combine(layout, dtype_name(b.tensor.dtype));
    layout = hash_combine(layout, fmt::format("{}", fmt::join(b.tensor.shape, ",")));
  }
  req.resync_policy = policy;
  req.digests = {layout};
  refuse_everywhere(rt, req, [&] {
    check_buffers("resync", buffers);
    for (const auto& b : buffers) {
      if (policy == ResyncPolicy::kAverage && !is_floating(b.tensor.dtype)) {
        throw InvalidArgument(fmt::format(
            "resync: buffer '{}' is {}; the average policy needs floating types", b.name,
            dtype_name(b.tensor.dtype)));
      }
    }
  });
  return submit(rt, std::move(req), buffers);
}

}  // namespace gyre::core
