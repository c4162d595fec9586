// The operations of the API, on a given Runtime: validation on the caller's
// thread, then enqueue. The public functions of gyre.h (api.cc) call these
// on the process's runtime; in-process tests call them on one runtime per
// rank thread.
//
// This is the one place that checks arguments: the Python package and the
// binding only convert types, and pass what they could not convert in as a
// TensorView::refusal. Validation failures throw InvalidArgument here, on
// the caller's thread; the failed request is also announced to the other
// ranks (with the reason) so that their matching operation fails with this
// rank's reason within one negotiation round instead of stalling. A
// refused call of a name in use on this rank (tensor_queue.h: a duplicate,
// or any other refusal) is not announced: the operation holding the name is
// still valid.
#include "api/operations.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <span>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "api/fingerprint.h"

namespace gyre::core {

namespace {

constexpr std::string_view kReserved = "__gyre.";

void check_view(Runtime& rt, const std::string& what, const char* which, const TensorView& t) {
  // The caller could not describe the tensor: its reason names it.
  if (!t.refusal.empty()) throw InvalidArgument(fmt::format("{}: {}", what, t.refusal));
  if (static_cast<int>(t.dtype) >= kNumDataTypes) {
    throw InvalidArgument(fmt::format("{}: {} has an unknown dtype (value {})", what, which,
                                      static_cast<int>(t.dtype)));
  }
  for (auto d : t.shape) {
    if (d < 0) {
      throw InvalidArgument(fmt::format("{}: {} has a negative dimension in shape [{}]", what,
                                        which, fmt::join(t.shape, ", ")));
    }
  }
  if (t.numel() > 0 && t.data == nullptr) {
    throw InvalidArgument(
        fmt::format("{}: {} buffer is null but has {} elements", what, which, t.numel()));
  }
  if (t.device.type == DeviceType::kCUDA) {
    rt.check_cuda_tensor(what, which, t);
  } else if (t.device.type != DeviceType::kCPU) {
    throw InvalidArgument(fmt::format("{}: {} has an unknown device type {}", what, which,
                                      static_cast<int>(t.device.type)));
  }
}

// Two views of one device that share bytes without starting at the same
// address (compared as integers: the buffers are separate objects).
bool partly_overlap(const TensorView& a, const TensorView& b) {
  if (a.data == b.data || a.device != b.device) return false;
  const auto pa = reinterpret_cast<std::uintptr_t>(a.data);
  const auto pb = reinterpret_cast<std::uintptr_t>(b.data);
  const std::size_t na = a.nbytes(), nb = b.nbytes();
  return na > 0 && nb > 0 && pa < pb + nb && pb < pa + na;
}

void check_op(const std::string& what, DataType dt, ReduceOp op) {
  if (static_cast<int>(op) >= kNumReduceOps) {
    throw InvalidArgument(fmt::format(
        "{}: unknown reduction op {} (expected sum, average, min, max, product or adasum, 0 to "
        "{})", what, static_cast<int>(op), kNumReduceOps - 1));
  }
  if (!op_defined(dt, op)) {
    throw InvalidArgument(fmt::format(
        "{}: reduce op {} is not defined for {} ({})", what, op_name(op), dtype_name(dt),
        op == ReduceOp::kAdasum ? "Adasum needs float32, float64, float16 or bfloat16"
                                : "average and scaling need a numeric type; use sum (logical "
                                  "or) or product (logical and) on bool"));
  }
}

// Adasum: an allreduce of CPU tensors over a power-of-two number of ranks
// (the pairs of its binary tree). Every rank sees the same size, so every
// rank refuses alike.
void check_adasum(Runtime& rt, const std::string& what, const TensorView& in) {
  // CUDA tensors take the NCCL backend, which stages the bucket through host
  // memory (NcclBackend::adasum); without NCCL they are refused as any
  // CUDA tensor is.
  if (in.device.type != DeviceType::kCPU && in.device.type != DeviceType::kCUDA) {
    throw InvalidArgument(fmt::format(
        "{}: Adasum is implemented for CPU and CUDA tensors; the input is on {}:{}", what,
        device_name(in.device.type), in.device.index));
  }
  const int n = rt.size();
  if (n < 1 || !std::has_single_bit(static_cast<unsigned>(n))) {
    throw InvalidArgument(fmt::format(
        "{}: Adasum needs a power-of-two number of ranks (1, 2, 4, 8, ...), this job has {}",
        what, n));
  }
}

// A scale factor multiplies every element: NaN or infinity would silently
// turn the whole result into NaN or infinity.
// Integers scale as Horovod does (collectives/reduce_kernels.h: float64
// product truncated toward zero); bool does not scale.
void check_scales(const std::string& what, DataType dt, double prescale, double postscale) {
  if (!std::isfinite(prescale) || !std::isfinite(postscale)) {
    throw InvalidArgument(fmt::format(
        "{}: scale factors must be finite numbers, got prescale {} and postscale {}", what,
        prescale, postscale));
  }
  if (!scaling_defined(dt) && (prescale != 1.0 || postscale != 1.0)) {
    throw InvalidArgument(fmt::format(
        "{}: prescale {} / postscale {} on a {} tensor: scaling is not defined for {}", what,
        prescale, postscale, dtype_name(dt), dtype_name(dt)));
  }
}

Request base_request(Runtime& rt, const std::string& name, Collective c,
                           const TensorView& t) {
  Request r;
  r.name = name;
  r.collective = c;
  r.dtype = t.dtype;
  r.device = t.device;
  r.shape = t.shape;
  r.step = rt.versions().own();
  return r;
}

// Tells the other ranks that this rank failed `req` with `why`, so that
// their operation of that name fails too. Not for an empty name (nothing
// to match) nor a reserved one (gyre's own operations are never refused).
void announce(Runtime& rt, Request req, std::string why) {
  if (req.name.empty() || req.name.rfind(kReserved, 0) == 0) return;
  // The name is in use here by an operation still valid: announcing would
  // replace its request at negotiation and leave it waiting forever (or,
  // completed, fail the other ranks' next operation of the name). The
  // refused call is this rank's alone (as a duplicate name would be).
  if (rt.queue().in_use(req.name)) return;
  // A failed request's fields are not compared, and the receivers' decoder
  // refuses out-of-range values (an unknown enum, a NaN scale, a negative
  // dimension) as a malformed message: the value that caused the refusal
  // must not travel. Only the name, the collective, the group and the reason
  // do.
  Request announced;
  announced.name = std::move(req.name);
  announced.collective = req.collective;
  announced.group = std::move(req.group);
  announced.group_size = req.group_size;
  announced.step = req.step;
  req = std::move(announced);
  req.error_kind = ErrorKind::kInvalidArgument;
  req.error = std::move(why);
  rt.queue().announce_failure(std::move(req));
}

// Runs `validate`; on InvalidArgument announces the failure to the other
// ranks, then rethrows. A name pending on this rank is refused first, and
// not announced: the pending operation of that name is valid.
template <typename F>
void validated(Runtime& rt, const Request& req, F&& validate) {
  rt.queue().check_not_pending(req);
  try {
    if (req.name.empty()) throw InvalidArgument(fmt::format("{}: the tensor name is empty",
                                                            collective_name(req.collective)));
    validate();
  } catch (const InvalidArgument& e) {
    announce(rt, req, e.what());
    throw;
  }
}

std::string describe(const Request& r) {
  // Concatenated, not formatted: every call pays for it.
  return std::string(collective_name(r.collective)) + " '" + r.name + "'";
}

void check_user_name(const std::string& what, const std::string& name) {
  if (name.rfind(kReserved, 0) == 0) {
    throw InvalidArgument(fmt::format("{}: names starting with '{}' are reserved for gyre", what,
                                      kReserved));
  }
}

}  // namespace

Handle submit(Runtime& rt, Request req, const TensorView& in, const TensorView& out) {
  auto state = std::make_shared<OpState>();
  LocalEntry e;
  e.request = std::move(req);
  e.in = in;
  e.out = out;
  e.state = state;
  std::vector<LocalEntry> v;
  v.push_back(std::move(e));
  rt.queue().push(std::move(v));
  return Handle(state);
}

static void validate_member(Runtime& rt, const Request& req, const std::string& name,
                            const TensorView& in, const TensorView& out, ReduceOp op);

namespace {

// Both allreduce calls. Spans, so that a single tensor's call builds no
// vectors of copies (every call pays for their allocations).
Handle allreduce_members(Runtime& rt, std::span<const std::string> names,
                         std::span<const TensorView> ins, std::span<const TensorView> outs,
                         ReduceOp op, double prescale, double postscale) {
  if (names.empty()) {
    throw InvalidArgument("grouped_allreduce needs at least one tensor (got no names)");
  }
  if (names.size() != ins.size() || names.size() != outs.size()) {
    const std::string why = fmt::format(
        "grouped_allreduce: {} names, {} inputs and {} outputs (need the same count)",
        names.size(), ins.size(), outs.size());
    for (const auto& name : names) {
      Request req;
      req.name = name;
      req.collective = Collective::kAllreduce;
      req.step = rt.versions().own();
      announce(rt, std::move(req), why);
    }
    throw InvalidArgument(why);
  }
  auto state = std::make_shared<OpState>(static_cast<int>(names.size()));
  std::vector<LocalEntry> entries;
  entries.reserve(names.size());
  for (std::size_t i = 0; i < names.size(); ++i) {
    Request req = base_request(rt, names[i], Collective::kAllreduce, ins[i]);
    req.op = op;
    req.prescale = prescale;
    req.postscale = postscale;
    if (names.size() > 1) {
      req.group = names[0];
      req.group_size = static_cast<std::uint32_t>(names.size());
    }
    // A bad member fails the whole group: the other ranks hear of every
    // member, not only the bad one, so none of them waits for the rest.
    auto announce_group = [&](const InvalidArgument& e) {
      for (std::size_t j = 0; j < names.size(); ++j) {
        if (j == i) continue;
        announce(rt, base_request(rt, names[j], Collective::kAllreduce, ins[j]),
                 fmt::format("its group failed: {}", e.what()));
      }
    };
    try {
      validate_member(rt, req, names[i], ins[i], outs[i], op);
    } catch (const InvalidArgument& e) {
      announce_group(e);
      throw;
    }
    LocalEntry e;
    e.request = std::move(req);
    e.in = ins[i];
    e.out = outs[i];
    e.state = state;
    entries.push_back(std::move(e));
  }
  rt.queue().push(std::move(entries));
  return Handle(state);
}

}  // namespace

Handle allreduce_async(Runtime& rt, const std::string& name, const TensorView& in, const TensorView& out,
                       ReduceOp op, double prescale, double postscale) {
  return allreduce_members(rt, std::span(&name, 1), std::span(&in, 1), std::span(&out, 1), op,
                           prescale, postscale);
}

Handle grouped_allreduce_async(Runtime& rt, const std::vector<std::string>& names,
                               const std::vector<TensorView>& ins,
                               const std::vector<TensorView>& outs, ReduceOp op, double prescale,
                               double postscale) {
  return allreduce_members(rt, names, ins, outs, op, prescale, postscale);
}

static void validate_member(Runtime& rt, const Request& req, const std::string& name,
                            const TensorView& in, const TensorView& out, ReduceOp op) {
  validated(rt, req, [&] {
      const std::string what = describe(req);
      check_user_name(what, name);
      check_view(rt, what, "input", in);
      check_view(rt, what, "output", out);
      check_op(what, in.dtype, op);
      check_scales(what, in.dtype, req.prescale, req.postscale);
      if (op == ReduceOp::kAdasum) check_adasum(rt, what, in);
      if (out.device != in.device) {
        throw InvalidArgument(fmt::format("{}: output is on {}:{} but input on {}:{}", what,
                                          device_name(out.device.type), out.device.index,
                                          device_name(in.device.type), in.device.index));
      }
      if (out.dtype != in.dtype || out.numel() != in.numel()) {
        throw InvalidArgument(fmt::format("{}: output ({} x {}) does not match input ({} x {})",
                                          what, dtype_name(out.dtype), out.numel(),
                                          dtype_name(in.dtype), in.numel()));
      }
      // Where the buffers lie is this rank's own fact: checked here, where
      // a refusal reaches every rank, not inside the collective, where it
      // would fail on this rank alone while the others went on.
      if (partly_overlap(in, out)) {
        throw InvalidArgument(fmt::format(
            "{}: input and output overlap without being the same buffer (in-place needs the "
            "output to be the input)", what));
      }
  });
}

Handle allgather_async(Runtime& rt, const std::string& name, const TensorView& in) {
  Request req = base_request(rt, name, Collective::kAllgather, in);
  validated(rt, req, [&] {
    const std::string what = describe(req);
    check_user_name(what, name);
    check_view(rt, what, "input", in);
    if (in.shape.empty()) throw InvalidArgument(what + ": needs at least one dimension");
  });
  return submit(rt, std::move(req), in, in);
}

Handle broadcast_async(Runtime& rt, const std::string& name, const TensorView& buf, int root) {
  Request req = base_request(rt, name, Collective::kBroadcast, buf);
  req.root = root;
  validated(rt, req, [&] {
    const std::string what = describe(req);
    check_user_name(what, name);
    check_view(rt, what, "buffer", buf);
    if (root < 0 || root >= rt.size()) {
      throw InvalidArgument(fmt::format("{}: root rank {} is not a rank of this job (size {})",
                                        what, root, rt.size()));
    }
  });
  return submit(rt, std::move(req), buf, buf);
}

Handle alltoall_async(Runtime& rt, const std::string& name, const TensorView& in,
                      const std::vector<std::int64_t>& splits) {
  Request req = base_request(rt, name, Collective::kAlltoall, in);
  validated(rt, req, [&] {
    const std::string what = describe(req);
    check_user_name(what, name);
    check_view(rt, what, "input", in);
    if (in.shape.empty()) throw InvalidArgument(what + ": needs at least one dimension");
    const std::int64_t rows = in.shape[0];
    const int n = rt.size();
    if (splits.empty()) {
      if (rows % n != 0) {
        throw InvalidArgument(fmt::format(
            "{}: {} rows do not split evenly over {} ranks; pass splits", what, rows, n));
      }
      req.splits.assign(static_cast<std::size_t>(n), rows / n);
      return;
    }
    if (splits.size() != static_cast<std::size_t>(n)) {
      throw InvalidArgument(fmt::format("{}: {} splits for {} ranks", what, splits.size(), n));
    }
    std::int64_t sum = 0;
    for (auto s : splits) {
      if (s < 0) throw InvalidArgument(fmt::format("{}: negative split {}", what, s));
      sum += s;
    }
    if (sum != rows) {
      throw InvalidArgument(fmt::format("{}: splits [{}] add up to {} but the input has {} rows",
                                        what, fmt::join(splits, ", "), sum, rows));
    }
    req.splits = splits;
  });
  return submit(rt, std::move(req), in, in);
}

Handle reducescatter_async(Runtime& rt, const std::string& name, const TensorView& in, ReduceOp op,
                           double prescale, double postscale) {
  Request req = base_request(rt, name, Collective::kReducescatter, in);
  req.op = op;
  req.prescale = prescale;
  req.postscale = postscale;
  validated(rt, req, [&] {
    const std::string what = describe(req);
    check_user_name(what, name);
    check_view(rt, what, "input", in);
    check_op(what, in.dtype, op);
    if (op == ReduceOp::kAdasum) {
      throw InvalidArgument(what + ": Adasum is an allreduce op; reducescatter takes sum, "
                                   "average, min, max or product");
    }
    check_scales(what, in.dtype, prescale, postscale);
    if (in.shape.empty()) throw InvalidArgument(what + ": needs at least one dimension");
  });
  return submit(rt, std::move(req), in, in);
}

Handle barrier_async(Runtime& rt) {
  Request req;
  req.name = rt.internal_name("barrier");
  req.collective = Collective::kBarrier;
  req.step = rt.versions().own();
  return submit(rt, std::move(req), {}, {});
}

void barrier(Runtime& rt) {
  WaitFollows wait_follows;
  barrier_async(rt).wait();
}

Handle join_async(Runtime& rt) { return Handle(rt.request_join()); }

int join(Runtime& rt) {
  Handle h = join_async(rt);
  h.wait();
  return h.join_last_rank();
}

}  // namespace gyre::core
