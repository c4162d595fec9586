// Executor: dispatch, fusion of allreduces, and the per-collective runners.
#include "execution/executor.h"

#include <cctype>
#include <cstring>

#include <fmt/format.h>

#include "gyre/collectives/algorithms.h"
#include "backends/nccl/nccl_backend.h"

namespace gyre::core {

namespace {

constexpr int kTagData = 2;

// Average becomes a sum with 1/contributors folded into the postscale, so
// joined ranks (which contribute zeros) are not counted.
ReduceOp effective_op(const Response& r) {
  return r.agreed.op == ReduceOp::kAverage ? ReduceOp::kSum : r.agreed.op;
}
double effective_postscale(const Response& r) {
  return r.agreed.op == ReduceOp::kAverage ? r.agreed.postscale / r.contributors
                                           : r.agreed.postscale;
}

std::size_t numel(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return static_cast<std::size_t>(n);
}

// Elements per row of the first dimension.
std::size_t row_elems(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (std::size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return static_cast<std::size_t>(n);
}

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

}  // namespace

std::byte* Executor::scratch(std::size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

void Executor::trace(const Entry& e, const char* phase, Clock::time_point a, Clock::time_point b,
                     std::size_t bytes, std::size_t bucket_size) {
  if (!timeline_ || !e) return;
  timeline_->slice(e->request.name, phase, a, b,
                   fmt::format(R"({{"bytes":{},"bucket_tensors":{}}})", bytes, bucket_size));
}

void Executor::run(std::vector<Response>& responses, Clock::time_point agreed_at) {
  std::vector<Entry> entries(responses.size());
  std::vector<FusionItem> items(responses.size());
  for (std::size_t i = 0; i < responses.size(); ++i) {
    Response& r = responses[i];
    entries[i] = std::move(r.local);  // handed over by TensorQueue::take_for()
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
    if (r.collective == Collective::kAllreduce) {
      const std::size_t bytes = r.agreed.nbytes();
      const bool small = opt_.fusion_max_tensor_bytes == 0 || bytes <= opt_.fusion_max_tensor_bytes;
      items[i] = FusionItem{small, r.agreed.dtype, effective_op(r), r.agreed.prescale,
                            effective_postscale(r), r.agreed.device, bytes};
    }
  }

  for (const Bucket& b : plan_buckets(items, opt_.fusion_threshold_bytes)) {
    Response& first = responses[b.members.front()];
    if (!first.ok()) continue;  // completed above
    std::vector<Response*> resps;
    std::vector<Entry> bucket_entries;
    for (auto m : b.members) {
      resps.push_back(&responses[m]);
      bucket_entries.push_back(std::move(entries[m]));
    }
    try {
      if (first.agreed.device.type == DeviceType::kCUDA) {
        run_cuda(resps, bucket_entries);
      } else if (first.collective == Collective::kAllreduce) {
        run_allreduce_bucket(resps, bucket_entries);
      } else {
        run_single(first, bucket_entries.front());
      }
    } catch (const InvalidArgument& e) {
      // Thrown before any transfer, from agreed arguments: alike on every rank.
      for (auto& ent : bucket_entries) {
        if (ent) ent->state->complete_one(std::make_exception_ptr(e));
      }
    }
  }
}

collectives::RingOptions Executor::ring_options() const {
  collectives::RingOptions ro;
  ro.chunk_bytes = opt_.ring_chunk_bytes;
  ro.small_bytes = opt_.allreduce_small_bytes;
  ro.tag = kTagData;
  return ro;
}

void Executor::run_allreduce_bucket(std::vector<Response*>& resps, std::vector<Entry>& entries) {
  const Response& head = *resps.front();
  const DataType dt = head.agreed.dtype;
  collectives::RingOptions ro = ring_options();
  ro.prescale = head.agreed.prescale;
  ro.postscale = effective_postscale(head);
  const ReduceOp op = effective_op(head);

  if (resps.size() == 1) {
    // Alone in its bucket: reduce the caller's buffers directly, no copy.
    const std::size_t bytes = head.agreed.nbytes();
    const void* in;
    void* out;
    if (entries[0]) {
      in = entries[0]->in.data;
      out = entries[0]->out.data;
    } else {
      std::byte* s = scratch(bytes);
      std::memset(s, 0, bytes);
      in = out = s;
    }
    auto t0 = Clock::now();
    collectives::allreduce(t_, in, out, numel(head.agreed.shape), dt, op, ro);
    trace(entries[0], "ALLREDUCE", t0, Clock::now(), bytes);
    if (entries[0]) entries[0]->state->complete_one();
    return;
  }

  // Fused: members at 64-byte aligned offsets, zeroed padding between them.
  const FusedLayout layout = fused_layout(resps);
  const std::vector<std::size_t>& offsets = layout.offsets;
  const std::vector<std::size_t>& sizes = layout.sizes;
  const std::size_t total = layout.total;
  std::byte* buf = fusion_.get(total);
  auto t0 = Clock::now();
  for (std::size_t i = 0; i < resps.size(); ++i) {
    if (entries[i]) std::memcpy(buf + offsets[i], entries[i]->in.data, sizes[i]);
    else std::memset(buf + offsets[i], 0, sizes[i]);
    std::memset(buf + offsets[i] + sizes[i], 0, layout.end(i) - offsets[i] - sizes[i]);
  }
  auto t1 = Clock::now();
  collectives::allreduce(t_, buf, buf, total / dtype_size(dt), dt, op, ro);
  auto t2 = Clock::now();
  for (std::size_t i = 0; i < resps.size(); ++i) {
    if (entries[i]) std::memcpy(entries[i]->out.data, buf + offsets[i], sizes[i]);
  }
  auto t3 = Clock::now();
  for (std::size_t i = 0; i < resps.size(); ++i) {
    trace(entries[i], "MEMCPY_IN_FUSION_BUFFER", t0, t1, sizes[i], resps.size());
    trace(entries[i], "ALLREDUCE", t1, t2, sizes[i], resps.size());
    trace(entries[i], "MEMCPY_OUT_FUSION_BUFFER", t2, t3, sizes[i], resps.size());
    if (entries[i]) entries[i]->state->complete_one();
  }
}

void Executor::run_single(Response& resp, Entry& entry) {
  auto t0 = Clock::now();
  switch (resp.collective) {
    case Collective::kAllreduce: break;  // handled by run_allreduce_bucket
    case Collective::kBarrier: break;    // agreement itself means every rank arrived
    case Collective::kAllgather: run_allgather(resp, entry); break;
    case Collective::kBroadcast: run_broadcast(resp, entry); break;
    case Collective::kAlltoall: run_alltoall(resp, entry); break;
    case Collective::kReducescatter: run_reducescatter(resp, entry); break;
    case Collective::kFingerprint: run_fingerprint(resp, entry); break;
    case Collective::kResync: run_resync(resp, entry); break;
  }
  trace(entry, upper(collective_name(resp.collective)).c_str(), t0, Clock::now(),
        resp.agreed.nbytes());
  if (entry) entry->state->complete_one();
}

void Executor::run_allgather(Response& resp, Entry& entry) {
  const Request& a = resp.agreed;
  const std::size_t row_bytes = row_elems(a.shape) * dtype_size(a.dtype);
  std::vector<std::size_t> blocks(resp.per_rank.size(), 0);
  std::int64_t rows = 0;
  for (std::size_t r = 0; r < blocks.size(); ++r) {
    std::int64_t n = resp.per_rank[r] ? resp.per_rank[r]->shape[0] : 0;
    blocks[r] = static_cast<std::size_t>(n) * row_bytes;
    rows += n;
  }
  std::size_t total = static_cast<std::size_t>(rows) * row_bytes;
  collectives::RingOptions ro = ring_options();
  if (entry) {
    OwnedTensor& out = entry->state->output;
    out.dtype = a.dtype;
    out.shape = a.shape;
    out.shape[0] = rows;
    out.data.resize(total);
    collectives::ring_allgather(t_, entry->in.data, out.data.data(), blocks, ro);
  } else {
    collectives::ring_allgather(t_, nullptr, scratch(total), blocks, ro);
  }
}

void Executor::run_broadcast(Response& resp, Entry& entry) {
  const std::size_t bytes = resp.agreed.nbytes();
  collectives::RingOptions ro = ring_options();
  void* buf = entry ? entry->in.data : scratch(bytes);
  collectives::ring_broadcast(t_, buf, bytes, resp.agreed.root, ro);
}

void Executor::run_alltoall(Response& resp, Entry& entry) {
  // Every rank's splits are in the gathered requests: rank p sends
  // splits[p][q] rows to rank q. Joined ranks are refused at negotiation.
  const int me = t_.rank();
  const int n = t_.size();
  const Request& a = resp.agreed;
  const std::size_t row_bytes = row_elems(a.shape) * dtype_size(a.dtype);
  std::vector<std::size_t> send(n), recv(n);
  std::vector<std::int64_t> received(n);
  std::int64_t rows = 0;
  for (int p = 0; p < n; ++p) {
    send[p] = static_cast<std::size_t>(resp.per_rank[me]->splits[p]) * row_bytes;
    received[p] = resp.per_rank[p]->splits[me];
    recv[p] = static_cast<std::size_t>(received[p]) * row_bytes;
    rows += received[p];
  }
  OwnedTensor& out = entry->state->output;
  out.dtype = a.dtype;
  out.shape = resp.per_rank[me]->shape;
  out.shape[0] = rows;
  out.data.resize(static_cast<std::size_t>(rows) * row_bytes);
  collectives::RingOptions ro = ring_options();
  collectives::alltoall(t_, entry->in.data, send, out.data.data(), recv, ro);
  entry->state->received_splits = std::move(received);
}

void Executor::run_reducescatter(Response& resp, Entry& entry) {
  // Rank r keeps block r of the first dimension; earlier ranks take one
  // extra row when the rows do not divide evenly.
  const int n = t_.size();
  const Request& a = resp.agreed;
  const std::int64_t dim0 = a.shape.empty() ? 1 : a.shape[0];
  const std::size_t per_row = row_elems(a.shape);
  std::vector<std::size_t> counts(n);
  for (int r = 0; r < n; ++r) {
    std::int64_t rows = dim0 / n + (r < dim0 % n ? 1 : 0);
    counts[r] = static_cast<std::size_t>(rows) * per_row;
  }
  collectives::RingOptions ro = ring_options();
  ro.prescale = a.prescale;
  ro.postscale = effective_postscale(resp);
  const std::size_t esize = dtype_size(a.dtype);
  const std::size_t my_bytes = counts[t_.rank()] * esize;
  if (entry) {
    OwnedTensor& out = entry->state->output;
    out.dtype = a.dtype;
    out.shape = a.shape;
    out.shape[0] = static_cast<std::int64_t>(counts[t_.rank()] / std::max<std::size_t>(per_row, 1));
    out.data.resize(my_bytes);
    collectives::ring_reduce_scatter(t_, entry->in.data, out.data.data(), counts, a.dtype,
                                     effective_op(resp), ro);
  } else {
    const std::size_t in_bytes = a.nbytes();
    std::byte* s = scratch(in_bytes + my_bytes);
    std::memset(s, 0, in_bytes);
    collectives::ring_reduce_scatter(t_, s, s + in_bytes, counts, a.dtype, effective_op(resp), ro);
  }
}

}  // namespace gyre::core

namespace gyre::core {

void Executor::run_cuda(std::vector<Response*>& resps, std::vector<Entry>& entries) {
  Response& head = *resps.front();
#ifdef GYRE_HAVE_NCCL
  if (!nccl_) {
    const int device = entries.front() ? entries.front()->in.device.index : -1;
    nccl_ = std::make_shared<NcclBackend>(t_, opt_, log_, device, local_rank_);
  }
  auto t0 = Clock::now();
  switch (head.collective) {
    case Collective::kAllreduce:
      nccl_->allreduce(resps, entries, effective_op(head), head.agreed.prescale,
                       effective_postscale(head));
      break;
    case Collective::kBroadcast: nccl_->broadcast(head, entries.front()); break;
    case Collective::kAllgather: nccl_->allgather(head, entries.front()); break;
    case Collective::kAlltoall: nccl_->alltoall(head, entries.front()); break;
    case Collective::kReducescatter:
      nccl_->reducescatter(head, entries.front(), effective_op(head), head.agreed.prescale,
                           effective_postscale(head));
      break;
    default:
      // Refused at enqueue (operations.cc); reaching here means a rank
      // enqueued what this build refuses, so refuse it alike.
      throw InvalidArgument(fmt::format("{} '{}': not supported on CUDA tensors yet",
                                        collective_name(head.collective), head.name));
  }
  auto t1 = Clock::now();
  for (std::size_t i = 0; i < resps.size(); ++i) {
    trace(entries[i], upper(collective_name(head.collective)).c_str(), t0, t1,
          resps[i]->agreed.nbytes(), resps.size());
    if (entries[i]) entries[i]->state->complete_one();
  }
#else
  (void)entries;
  throw InvalidArgument(fmt::format(
      "{} '{}': the tensors are on CUDA, but this build of gyre was built without NCCL",
      collective_name(head.collective), head.name));
#endif
}

}  // namespace gyre::core
