// The public API (gyre.h): lifecycle, validation on the caller's thread,
// enqueue. One Runtime per process over an MPI transport.
//
// Validation failures throw InvalidArgument here, on the caller's thread;
// the failed request is also announced to the other ranks (with the reason)
// so that their matching operation fails with this rank's reason instead of
// stalling. A duplicate pending name is not announced: the first operation
// of that name is still valid.
#include <cstdlib>
#include <mutex>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "fingerprint.h"
#include "gyre/collectives/mpi_transport.h"
#include "gyre/gyre.h"
#include "runtime.h"

namespace gyre {

namespace {

// Guards g_runtime (the pointer; the Runtime synchronises itself). User
// calls copy the shared_ptr, so a concurrent shutdown() cannot destroy the
// runtime under them.
std::mutex g_mu;
std::shared_ptr<core::Runtime> g_runtime;
bool g_atexit_registered = false;

std::shared_ptr<core::Runtime> runtime(const char* call) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_runtime) {
    throw StateError(fmt::format("gyre::{}: gyre is not initialised (call gyre::init() first)", call));
  }
  return g_runtime;
}

constexpr std::string_view kReserved = "__gyre.";

void check_view(const std::string& what, const char* which, const TensorView& t) {
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
  if (t.device.type != DeviceType::kCPU) {
    throw InvalidArgument(fmt::format(
        "{}: {} is on {}:{}, but this build of gyre moves CPU tensors only", what, which,
        device_name(t.device.type), t.device.index));
  }
  if (static_cast<int>(t.dtype) >= kNumDataTypes) {
    throw InvalidArgument(fmt::format("{}: {} has an unknown dtype", what, which));
  }
}

void check_op(const std::string& what, DataType dt, ReduceOp op) {
  if (static_cast<int>(op) >= kNumReduceOps) {
    throw InvalidArgument(fmt::format("{}: unknown reduce op", what));
  }
  if (!op_defined(dt, op)) {
    throw InvalidArgument(fmt::format(
        "{}: reduce op {} is not defined for {} (average needs a floating type; use sum)", what,
        op_name(op), dtype_name(dt)));
  }
}

core::Request base_request(core::Runtime& rt, const std::string& name, core::Collective c,
                           const TensorView& t) {
  core::Request r;
  r.name = name;
  r.collective = c;
  r.dtype = t.dtype;
  r.device = t.device;
  r.shape = t.shape;
  r.step = rt.versions().own();
  return r;
}

// Runs `validate`; on InvalidArgument announces the failure to the other
// ranks, then rethrows.
template <typename F>
void validated(core::Runtime& rt, const core::Request& req, F&& validate) {
  try {
    if (req.name.empty()) throw InvalidArgument(fmt::format("{}: the tensor name is empty",
                                                            core::collective_name(req.collective)));
    validate();
  } catch (const InvalidArgument& e) {
    if (!req.name.empty() && req.name.rfind(kReserved, 0) != 0) {
      core::Request failed = req;
      failed.error_kind = core::ErrorKind::kInvalidArgument;
      failed.error = e.what();
      rt.queue().announce_failure(std::move(failed));
    }
    throw;
  }
}

std::string describe(const core::Request& r) {
  return fmt::format("{} '{}'", core::collective_name(r.collective), r.name);
}

void check_user_name(const std::string& what, const std::string& name) {
  if (name.rfind(kReserved, 0) == 0) {
    throw InvalidArgument(fmt::format("{}: names starting with '{}' are reserved for gyre", what,
                                      kReserved));
  }
}

Handle submit(core::Runtime& rt, core::Request req, const TensorView& in, const TensorView& out) {
  auto state = std::make_shared<core::OpState>();
  core::LocalEntry e;
  e.request = std::move(req);
  e.in = in;
  e.out = out;
  e.state = state;
  std::vector<core::LocalEntry> v;
  v.push_back(std::move(e));
  rt.queue().push(std::move(v));
  return Handle(state);
}

}  // namespace

// Shared with operations_sync.cc.
std::shared_ptr<core::Runtime> runtime_for(const char* call) { return runtime(call); }

void init(const Options& options) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_runtime) throw StateError("gyre::init(): gyre is already initialised");
  auto& world = transport::MpiWorld::instance();
  if (!g_atexit_registered) {
    // MPI is finalised at process exit rather than in shutdown(), so a
    // process may init() again after shutdown() (MPI cannot be
    // re-initialised once finalised).
    std::atexit([] { transport::MpiWorld::instance().finalize(); });
    g_atexit_registered = true;
  }
  core::RuntimeInfo info;
  info.local_rank = world.local_rank();
  info.local_size = world.local_size();
  info.abort = [&world](int code) { world.abort(code); };
  g_runtime = std::make_shared<core::Runtime>(options, world.make_transport(), std::move(info));
}

void shutdown() {
  std::shared_ptr<core::Runtime> rt;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_runtime) throw StateError("gyre::shutdown(): gyre is not initialised");
    rt.swap(g_runtime);
  }
  rt->shutdown();
}

bool is_initialized() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_runtime != nullptr;
}
int rank() { return runtime("rank")->rank(); }
int size() { return runtime("size")->size(); }
int local_rank() { return runtime("local_rank")->local_rank(); }
int local_size() { return runtime("local_size")->local_size(); }

Handle allreduce_async(const std::string& name, const TensorView& in, const TensorView& out,
                       ReduceOp op, double prescale, double postscale) {
  return grouped_allreduce_async({name}, {in}, {out}, op, prescale, postscale);
}

Handle grouped_allreduce_async(const std::vector<std::string>& names,
                               const std::vector<TensorView>& ins,
                               const std::vector<TensorView>& outs, ReduceOp op, double prescale,
                               double postscale) {
  auto rt = runtime("allreduce_async");
  if (names.size() != ins.size() || names.size() != outs.size() || names.empty()) {
    throw InvalidArgument(fmt::format(
        "grouped_allreduce_async: {} names, {} inputs and {} outputs (need the same, non-zero, "
        "count)", names.size(), ins.size(), outs.size()));
  }
  auto state = std::make_shared<core::OpState>(static_cast<int>(names.size()));
  std::vector<core::LocalEntry> entries;
  for (std::size_t i = 0; i < names.size(); ++i) {
    core::Request req = base_request(*rt, names[i], core::Collective::kAllreduce, ins[i]);
    req.op = op;
    req.prescale = prescale;
    req.postscale = postscale;
    validated(*rt, req, [&] {
      const std::string what = describe(req);
      check_user_name(what, names[i]);
      check_view(what, "input", ins[i]);
      check_view(what, "output", outs[i]);
      check_op(what, ins[i].dtype, op);
      if (outs[i].dtype != ins[i].dtype || outs[i].numel() != ins[i].numel()) {
        throw InvalidArgument(fmt::format(
            "{}: output ({} x {}) does not match input ({} x {})", what,
            dtype_name(outs[i].dtype), outs[i].numel(), dtype_name(ins[i].dtype), ins[i].numel()));
      }
    });
    core::LocalEntry e;
    e.request = std::move(req);
    e.in = ins[i];
    e.out = outs[i];
    e.state = state;
    entries.push_back(std::move(e));
  }
  rt->queue().push(std::move(entries));
  return Handle(state);
}

Handle allgather_async(const std::string& name, const TensorView& in) {
  auto rt = runtime("allgather_async");
  core::Request req = base_request(*rt, name, core::Collective::kAllgather, in);
  validated(*rt, req, [&] {
    const std::string what = describe(req);
    check_user_name(what, name);
    check_view(what, "input", in);
    if (in.shape.empty()) throw InvalidArgument(what + ": needs at least one dimension");
  });
  return submit(*rt, std::move(req), in, in);
}

Handle broadcast_async(const std::string& name, const TensorView& buf, int root) {
  auto rt = runtime("broadcast_async");
  core::Request req = base_request(*rt, name, core::Collective::kBroadcast, buf);
  req.root = root;
  validated(*rt, req, [&] {
    const std::string what = describe(req);
    check_user_name(what, name);
    check_view(what, "buffer", buf);
    if (root < 0 || root >= rt->size()) {
      throw InvalidArgument(
          fmt::format("{}: root {} is not a rank (world size {})", what, root, rt->size()));
    }
  });
  return submit(*rt, std::move(req), buf, buf);
}

Handle alltoall_async(const std::string& name, const TensorView& in,
                      const std::vector<std::int64_t>& splits) {
  auto rt = runtime("alltoall_async");
  core::Request req = base_request(*rt, name, core::Collective::kAlltoall, in);
  validated(*rt, req, [&] {
    const std::string what = describe(req);
    check_user_name(what, name);
    check_view(what, "input", in);
    if (in.shape.empty()) throw InvalidArgument(what + ": needs at least one dimension");
    const std::int64_t rows = in.shape[0];
    const int n = rt->size();
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
  return submit(*rt, std::move(req), in, in);
}

Handle reducescatter_async(const std::string& name, const TensorView& in, ReduceOp op,
                           double prescale, double postscale) {
  auto rt = runtime("reducescatter_async");
  core::Request req = base_request(*rt, name, core::Collective::kReducescatter, in);
  req.op = op;
  req.prescale = prescale;
  req.postscale = postscale;
  validated(*rt, req, [&] {
    const std::string what = describe(req);
    check_user_name(what, name);
    check_view(what, "input", in);
    check_op(what, in.dtype, op);
    if (in.shape.empty()) throw InvalidArgument(what + ": needs at least one dimension");
  });
  return submit(*rt, std::move(req), in, in);
}

void barrier() {
  auto rt = runtime("barrier");
  core::Request req;
  req.name = rt->internal_name("barrier");
  req.collective = core::Collective::kBarrier;
  req.step = rt->versions().own();
  submit(*rt, std::move(req), {}, {}).wait();
}

int join() {
  auto rt = runtime("join");
  auto state = rt->request_join();
  Handle(state).wait();
  return state->join_last_rank;
}

void commit_step() { runtime("commit_step")->versions().commit(); }
std::uint64_t committed_steps() { return runtime("committed_steps")->versions().own(); }
std::vector<std::uint64_t> version_vector() {
  return runtime("version_vector")->versions().snapshot();
}

}  // namespace gyre
