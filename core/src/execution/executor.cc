// Executor: dispatch, fusion of allreduces, and the per-collective runners.
#include "execution/executor.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <optional>
#include <string_view>

#include <fmt/format.h>

#include "execution/plan.h"
#include "gyre/collectives/reduce_kernels.h"

namespace gyre::core {

namespace {

std::string upper(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

// The exception a failed response becomes; a divergence carries the steps.
std::exception_ptr response_error(const Response& r) {
  if (r.error_kind != ErrorKind::kDivergence) return make_error(r.error_kind, r.error);
  DivergenceDetail d;
  d.tensor = r.name;
  for (std::size_t q = 0; q < r.per_rank.size(); ++q) {
    if (!r.per_rank[q]) continue;
    d.ranks.push_back(static_cast<int>(q));
    d.steps.push_back(r.per_rank[q]->step);
  }
  return std::make_exception_ptr(DivergenceError(r.error, std::move(d)));
}

// A refusal the executor makes itself from agreed facts (the agreed device
// has no backend in this build, a collective that device does not run):
// every rank refuses alike, so it fails only that operation. Any other
// error inside a collective is not known to be alike on every rank (an
// algorithm's check of this rank's own buffers, a transfer that failed
// here): it leaves run() and ends the job with its cause (Runtime::fatal)
// rather than letting this rank go on while its peers wait in the
// collective. Conditions that depend on one rank's facts are checked at
// enqueue (api/operations.cc), so none should reach an algorithm.
class AgreedRefusal : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

}  // namespace

void Executor::trace(const Entry& e, const char* phase, Clock::time_point a, Clock::time_point b,
                     std::size_t bytes, std::size_t bucket_size) {
  if (!timeline_ || !timeline_->active() || !e) return;
  timeline_->slice(e->request.name, phase, a, b,
                   fmt::format(R"({{"bytes":{},"bucket_tensors":{}}})", bytes, bucket_size));
}

std::optional<LocalEntry> take_entry(TensorQueue& queue, const Response& resp, int rank) {
  const auto r = static_cast<std::size_t>(rank);
  if (r >= resp.per_rank.size()) return std::nullopt;
  std::uint64_t latest = 0;
  for (const auto& q : resp.per_rank) {
    if (q) latest = std::max(latest, q->seq);
  }
  const bool joined = r < resp.joined.size() && resp.joined[r];
  return queue.take_for(resp.name, resp.per_rank[r], joined, latest);
}

void Executor::run(std::vector<Response>& responses, Clock::time_point agreed_at,
                   const Speculated* speculated) {
  std::vector<Entry> entries(responses.size());
  for (std::size_t i = 0; i < responses.size(); ++i) {
    entries[i] = take_entry(queue_, responses[i], t_.rank());
    // A resync repairs the ranks' state: from here they count iterations
    // of every name afresh, alike.
    if (responses[i].ok() && responses[i].collective == Collective::kResync) {
      queue_.restart_sequences();
    }
  }
  std::vector<FusionItem> items(responses.size());
  // The response the round already reduced: alone in its bucket (an
  // unfused item), which the bucket loop skips.
  std::optional<std::size_t> speculated_at;
  for (std::size_t i = 0; i < responses.size(); ++i) {
    Response& r = responses[i];
    if (entries[i]) {
      auto sent = entries[i]->sent == Clock::time_point{} ? agreed_at : entries[i]->sent;
      trace(entries[i], "QUEUE", entries[i]->enqueued, sent, r.agreed.nbytes());
      trace(entries[i], "NEGOTIATE", sent, agreed_at, r.agreed.nbytes());
    }
    if (!r.ok()) {
      log_.debug("{}", r.error);
      if (entries[i]) entries[i]->state->complete_one(response_error(r));
      continue;
    }
    if (speculated && r.collective == Collective::kAllreduce && r.name == speculated->name &&
        speculated->result.size() == r.agreed.nbytes()) {
      complete_speculated(r, entries[i], speculated->result);
      speculated = nullptr;
      speculated_at = i;
      continue;
    }
    if (r.collective == Collective::kAllreduce) {
      const std::size_t bytes = r.agreed.nbytes();
      const bool small = opt_.fusion_max_tensor_bytes == 0 || bytes <= opt_.fusion_max_tensor_bytes;
      const Reduction red = effective_reduction(r);
      items[i] = FusionItem{small, r.agreed.dtype, red.op, red.prescale, red.postscale,
                            r.agreed.device, bytes};
    }
  }

  // The usual small step: one response, which the round already reduced.
  if (responses.size() == 1 && speculated_at) return;
  const std::vector<Bucket> buckets = plan_buckets(items, opt_.fusion_threshold_bytes);
  for (std::size_t k = 0; k < buckets.size(); ++k) {
    const Bucket& b = buckets[k];
    Response& first = responses[b.members.front()];
    if (!first.ok() || speculated_at == b.members.front()) continue;  // completed above
    std::vector<Response*> resps;
    std::vector<Entry> bucket_entries;
    for (auto m : b.members) {
      resps.push_back(&responses[m]);
      bucket_entries.push_back(std::move(entries[m]));
    }
    try {
      Backend& be = backend_for(first, bucket_entries.front());
      if (first.collective == Collective::kAllreduce) {
        run_allreduce(be, resps, bucket_entries);
      } else {
        run_single(be, first, bucket_entries.front());
      }
    } catch (const AgreedRefusal& e) {
      // Thrown before any transfer, from agreed facts: alike on every rank.
      for (auto& ent : bucket_entries) {
        if (ent) ent->state->complete_one(std::make_exception_ptr(e));
      }
    } catch (...) {
      // Not known to be alike on every rank: the job ends (the caller,
      // Runtime::loop, rethrows it to Runtime::fatal). This round's
      // operations that have not completed are no longer in the queue, where
      // the runtime's end would fail them: they are held here and failed
      // with the cause by fail_held(), after Runtime::fatal has logged it.
      held_error_ = std::current_exception();
      for (auto& ent : bucket_entries) {
        if (ent) held_.push_back(std::move(*ent));
      }
      for (std::size_t later = k + 1; later < buckets.size(); ++later) {
        for (auto m : buckets[later].members) {
          if (entries[m] && responses[m].ok()) held_.push_back(std::move(*entries[m]));
        }
      }
      throw;
    }
  }
}

void Executor::complete_speculated(const Response& r, Entry& entry,
                                   std::span<const std::byte> result) {
  // The sum (or min, max, product) of every rank's prescaled input, as the
  // backends' recursive doubling combines it; what remains is their last
  // step: the postscale (with an average's division).
  const auto t0 = Clock::now();
  if (entry) {
    std::memcpy(entry->out.data, result.data(), result.size());
    const Reduction red = effective_reduction(r);
    if (red.postscale != 1.0) {
      collectives::scale(entry->out.data, result.size() / dtype_size(r.agreed.dtype),
                         r.agreed.dtype, red.postscale);
    }
  }
  trace(entry, "ALLREDUCE_IN_NEGOTIATION", t0, Clock::now(), result.size());
  if (entry) entry->state->complete_one();
}

void Executor::fail_held() {
  std::vector<LocalEntry> held;
  held.swap(held_);
  for (auto& e : held) {
    if (e.state) e.state->complete_one(held_error_);
  }
}

Backend& Executor::backend_for(const Response& head, const Entry& entry) {
  Device device = head.agreed.device;
  // The rank's own device index (ranks may use different GPUs); -1 when it
  // has no entry: the backend then picks one.
  device.index = entry ? entry->in.device.index : -1;
  if (Backend* be = backends_.get(device)) return *be;
  // Refused at enqueue; reaching here means a rank enqueued what this
  // build refuses, so refuse it alike.
  throw AgreedRefusal(fmt::format(
      "{} '{}': the tensors are on {}, but this build of gyre has no backend for them (built "
      "without NCCL)", collective_name(head.collective), head.name,
      device_name(head.agreed.device.type)));
}

void Executor::run_allreduce(Backend& be, std::vector<Response*>& resps,
                             std::vector<Entry>& entries) {
  const Response& head = *resps.front();
  const DataType dt = head.agreed.dtype;
  const Reduction red = effective_reduction(head);
  // Views of the names, for error messages (no copy on the common path).
  std::string_view lone = head.name;
  std::vector<std::string_view> names;
  if (resps.size() > 1) {
    names.reserve(resps.size());
    for (const Response* r : resps) names.push_back(r->name);
  }
  const OpLabel what{"allreduce", resps.size() > 1 ? std::span<const std::string_view>(names)
                                                   : std::span<const std::string_view>(&lone, 1)};

  if (resps.size() == 1) {
    // Alone in its bucket: reduce the caller's buffers directly, no copy.
    const std::size_t bytes = head.agreed.nbytes();
    const void* in;
    void* out;
    if (entries[0]) {
      in = entries[0]->in.data;
      out = entries[0]->out.data;
    } else {
      std::byte* z = be.zeros(bytes, what);
      in = out = z;
    }
    auto t0 = Clock::now();
    const auto count = static_cast<std::size_t>(numel(head.agreed.shape));
    if (red.op == ReduceOp::kAdasum) {
      const ByteRange whole{0, bytes};
      be.adasum(in, out, count, dt, red, std::span(&whole, 1), what);
    } else {
      be.allreduce(in, out, count, dt, red, what);
    }
    be.synchronize(what);
    trace(entries[0], "ALLREDUCE", t0, Clock::now(), bytes);
    if (entries[0]) entries[0]->state->complete_one();
    return;
  }

  // Fused: members at 64-byte aligned offsets, padding and the slots of
  // members without an entry zeroed.
  const FusedLayout layout = fused_layout(resps);
  if (red.op != ReduceOp::kAdasum && be.reduces_members()) {
    // Straight from the members (no packed copy).
    std::vector<BucketPiece> members(resps.size());
    for (std::size_t i = 0; i < resps.size(); ++i) {
      members[i] = {entries[i] ? entries[i]->in.data : nullptr,
                    entries[i] ? entries[i]->out.data : nullptr, layout.offsets[i],
                    layout.sizes[i]};
    }
    const auto t0 = Clock::now();
    be.allreduce_members(members, layout.total / dtype_size(dt), dt, red, what);
    be.synchronize(what);
    const auto t1 = Clock::now();
    for (std::size_t i = 0; i < resps.size(); ++i) {
      trace(entries[i], "ALLREDUCE", t0, t1, layout.sizes[i], resps.size());
      if (entries[i]) entries[i]->state->complete_one();
    }
    return;
  }
  std::vector<bool> has_input(resps.size());
  for (std::size_t i = 0; i < resps.size(); ++i) has_input[i] = entries[i].has_value();
  std::byte* buf = be.fusion_buffer(layout.total, what);
  auto t0 = Clock::now();
  be.zero_ranges(buf, fusion_zero_ranges(layout, has_input), what);
  for (std::size_t i = 0; i < resps.size(); ++i) {
    if (entries[i]) be.copy(buf + layout.offsets[i], entries[i]->in.data, layout.sizes[i], what);
  }
  auto t1 = Clock::now();
  if (red.op == ReduceOp::kAdasum) {
    // Adasum combines each member with its own dot products.
    std::vector<ByteRange> members(resps.size());
    for (std::size_t i = 0; i < resps.size(); ++i) members[i] = {layout.offsets[i], layout.sizes[i]};
    be.adasum(buf, buf, layout.total / dtype_size(dt), dt, red, members, what);
  } else {
    be.allreduce(buf, buf, layout.total / dtype_size(dt), dt, red, what);
  }
  auto t2 = Clock::now();
  for (std::size_t i = 0; i < resps.size(); ++i) {
    if (entries[i]) be.copy(entries[i]->out.data, buf + layout.offsets[i], layout.sizes[i], what);
  }
  be.synchronize(what);
  auto t3 = Clock::now();
  for (std::size_t i = 0; i < resps.size(); ++i) {
    if (be.synchronous()) {
      trace(entries[i], "MEMCPY_IN_FUSION_BUFFER", t0, t1, layout.sizes[i], resps.size());
      trace(entries[i], "ALLREDUCE", t1, t2, layout.sizes[i], resps.size());
      trace(entries[i], "MEMCPY_OUT_FUSION_BUFFER", t2, t3, layout.sizes[i], resps.size());
    } else {
      // The phases overlap on the device; only the whole is measured.
      trace(entries[i], "ALLREDUCE", t0, t3, layout.sizes[i], resps.size());
    }
    if (entries[i]) entries[i]->state->complete_one();
  }
}

void Executor::run_single(Backend& be, Response& resp, Entry& entry) {
  const std::string_view name = resp.name;
  const OpLabel what{collective_name(resp.collective), std::span(&name, 1)};
  auto t0 = Clock::now();
  switch (resp.collective) {
    case Collective::kAllreduce: break;  // handled by run_allreduce
    case Collective::kBarrier: break;    // agreement itself means every rank arrived
    case Collective::kAllgather: run_allgather(be, resp, entry, what); break;
    case Collective::kBroadcast: run_broadcast(be, resp, entry, what); break;
    case Collective::kAlltoall: run_alltoall(be, resp, entry, what); break;
    case Collective::kReducescatter: run_reducescatter(be, resp, entry, what); break;
    case Collective::kFingerprint:
    case Collective::kResync:
      if (&be != &backends_.host()) {
        // Refused at enqueue (operations.cc); refused alike here.
        throw AgreedRefusal(fmt::format("{} '{}': not supported on {} tensors yet",
                                          collective_name(resp.collective), resp.name,
                                          device_name(resp.agreed.device.type)));
      }
      if (resp.collective == Collective::kFingerprint) run_fingerprint(resp, entry);
      else run_resync(resp, entry);
      break;
  }
  be.synchronize(what);
  trace(entry, upper(collective_name(resp.collective)).c_str(), t0, Clock::now(),
        resp.agreed.nbytes());
  if (entry) entry->state->complete_one();
}

void Executor::run_allgather(Backend& be, Response& resp, Entry& entry, const OpLabel& what) {
  AllgatherPlan p = plan_allgather(resp);
  void* out = nullptr;
  if (!entry) {
    out = discard(p.total_bytes);  // a joined rank: the result is not kept
  } else {
    OwnedTensor& o = entry->state->output;
    o.dtype = resp.agreed.dtype;
    o.shape = std::move(p.out_shape);
    o.data.resize(p.total_bytes);
    out = o.data.data();
  }
  be.allgather(entry ? entry->in.data : nullptr, p.blocks, out, what);
}

void Executor::run_broadcast(Backend& be, Response& resp, Entry& entry, const OpLabel& what) {
  const std::size_t bytes = resp.agreed.nbytes();
  void* buf = entry ? entry->in.data : be.zeros(bytes, what);
  be.broadcast(buf, bytes, resp.agreed.root, what);
}

void Executor::run_alltoall(Backend& be, Response& resp, Entry& entry, const OpLabel& what) {
  // Joined ranks are refused at negotiation: every rank has an entry.
  AlltoallPlan p = plan_alltoall(resp, t_.rank());
  OwnedTensor& out = entry->state->output;
  out.dtype = resp.agreed.dtype;
  out.shape = std::move(p.out_shape);
  out.data.resize(p.recv_total);
  be.alltoall(entry->in.data, p.send_bytes, out.data.data(), p.recv_bytes, p.largest_bytes, what);
  entry->state->received_splits = std::move(p.received_splits);
}

void Executor::run_reducescatter(Backend& be, Response& resp, Entry& entry,
                                 const OpLabel& what) {
  const Request& a = resp.agreed;
  ReduceScatterPlan p = plan_reducescatter(a, t_.size(), t_.rank());
  const Reduction red = effective_reduction(resp);
  if (entry) {
    OwnedTensor& out = entry->state->output;
    out.dtype = a.dtype;
    out.shape = std::move(p.out_shape);
    out.data.resize(p.my_count * dtype_size(a.dtype));
    be.reducescatter(entry->in.data, p.counts, out.data.data(), a.dtype, red, what);
  } else {
    be.reducescatter(be.zeros(a.nbytes(), what), p.counts,
                     discard(p.my_count * dtype_size(a.dtype)), a.dtype, red, what);
  }
}

}  // namespace gyre::core
