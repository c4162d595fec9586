// NcclBackend's collectives whose result is delivered in host memory
// (Handle::output()): allgather, reducescatter, alltoall. See
// nccl_backend.h for the contract.
#include <algorithm>

#include "backends/nccl/nccl_backend_impl.h"

namespace gyre::core {

namespace {

// Elements per row of the first dimension.
std::size_t row_elems(const std::vector<std::int64_t>& shape) {
  std::size_t n = 1;
  for (std::size_t i = 1; i < shape.size(); ++i) n *= static_cast<std::size_t>(shape[i]);
  return n;
}

}  // namespace

PaddedGather plan_padded_gather(const Response& resp) {
  const Request& a = resp.agreed;
  PaddedGather g;
  g.row_bytes = row_elems(a.shape) * dtype_size(a.dtype);
  g.blocks.assign(resp.per_rank.size(), 0);
  for (std::size_t r = 0; r < resp.per_rank.size(); ++r) {
    const std::int64_t k = resp.per_rank[r] ? resp.per_rank[r]->shape[0] : 0;
    g.blocks[r] = static_cast<std::size_t>(k) * g.row_bytes;
    g.padded_block = std::max(g.padded_block, g.blocks[r]);
    g.total_bytes += g.blocks[r];
    g.rows += k;
  }
  return g;
}

void NcclBackend::allgather(const Response& resp, Entry& entry) {
  Impl& m = *impl_;
  const std::string what = fmt::format("allgather of CUDA tensor '{}'", resp.name);
  // Ranks may differ in the first dimension; ncclAllGather needs equal
  // blocks, so every block is padded to the largest and compacted when
  // copied out.
  const PaddedGather g = plan_padded_gather(resp);
  const std::size_t n = g.blocks.size();
  const std::size_t me = static_cast<std::size_t>(m.t.rank());
  if (entry) {
    OwnedTensor& out = entry->state->output;
    out.dtype = resp.agreed.dtype;
    out.shape = entry->request.shape;
    out.shape[0] = g.rows;
    out.data.resize(g.total_bytes);
  }
  if (g.padded_block == 0) return;
  check_cuda(cudaSetDevice(m.device), what + ": cudaSetDevice");
  auto* staging = static_cast<std::byte*>(m.scratch.get(g.padded_block * n, what));
  std::byte* mine = staging + g.padded_block * me;
  if (entry) m.copy(mine, entry->in.data, g.blocks[me], cudaMemcpyDeviceToDevice, what);
  m.settle(ncclAllGather(mine, staging, g.padded_block, ncclUint8, m.comm, m.stream),
           what + ": ncclAllGather");
  // A copy into pageable host memory blocks the calling thread until the
  // stream gets there, beyond any deadline: wait for the gather first.
  m.synchronize(what);
  if (entry) {
    std::byte* host = entry->state->output.data.data();
    for (std::size_t r = 0; r < n; ++r) {
      m.copy(host, staging + g.padded_block * r, g.blocks[r], cudaMemcpyDeviceToHost, what);
      host += g.blocks[r];
    }
    m.synchronize(what);
  }
}

void NcclBackend::reducescatter(const Response& resp, Entry& entry, ReduceOp op,
                                double prescale, double postscale) {
  Impl& m = *impl_;
  const Request& a = resp.agreed;
  const DataType dt = a.dtype;
  const std::string what = fmt::format("reducescatter of CUDA tensor '{}'", resp.name);
  check_scale(what, dt, prescale, postscale);
  if (!nccl_dtype(dt) || !nccl_op(op)) {
    throw InvalidArgument(fmt::format("{}: no NCCL reduction for {} on {}", what, op_name(op),
                                      dtype_name(dt)));
  }
  // The CPU path's split: rank r keeps block r of the first dimension,
  // earlier ranks one extra row when it does not divide evenly.
  // ncclReduceScatter needs equal blocks, so each is padded to the largest
  // (block 0) with zeros, which no op turns into a wrong value for the
  // elements kept: padding is only ever reduced with padding.
  const std::size_t n = static_cast<std::size_t>(m.t.size());
  const std::size_t me = static_cast<std::size_t>(m.t.rank());
  const std::int64_t dim0 = a.shape.empty() ? 1 : a.shape[0];
  const std::size_t per_row = row_elems(a.shape);
  const auto ranks = static_cast<std::int64_t>(n);
  std::vector<std::size_t> counts(n), offsets(n);
  std::size_t at = 0;
  for (std::size_t r = 0; r < n; ++r) {
    const std::int64_t rows = dim0 / ranks + (static_cast<std::int64_t>(r) < dim0 % ranks ? 1 : 0);
    counts[r] = static_cast<std::size_t>(rows) * per_row;
    offsets[r] = at;
    at += counts[r];
  }
  const std::size_t esize = dtype_size(dt);
  if (entry) {
    OwnedTensor& out = entry->state->output;
    out.dtype = dt;
    out.shape = a.shape;
    if (!out.shape.empty()) {
      out.shape[0] = static_cast<std::int64_t>(counts[me] / std::max<std::size_t>(per_row, 1));
    }
    out.data.resize(counts[me] * esize);
  }
  const std::size_t largest = counts[0];
  if (largest == 0) return;
  check_cuda(cudaSetDevice(m.device), what + ": cudaSetDevice");
  const std::size_t block = largest * esize;
  auto* staging = static_cast<std::byte*>(m.scratch.get(block * (n + 1), what));
  std::byte* result = staging + block * n;
  check_cuda(cudaMemsetAsync(staging, 0, block * n, m.stream), what + ": cudaMemsetAsync");
  if (entry) {
    const auto* in = static_cast<const std::byte*>(entry->in.data);
    for (std::size_t r = 0; r < n; ++r) {
      m.copy(staging + block * r, in + offsets[r] * esize, counts[r] * esize,
             cudaMemcpyDeviceToDevice, what);
    }
  }
  m.scale(staging, largest * n, dt, prescale, what);
  m.settle(ncclReduceScatter(staging, result, largest, *nccl_dtype(dt), *nccl_op(op), m.comm,
                             m.stream),
           what + ": ncclReduceScatter");
  m.scale(result, largest, dt, postscale, what);
  m.synchronize(what);  // before a copy into pageable memory, which blocks
  if (entry) {
    m.copy(entry->state->output.data.data(), result, counts[me] * esize,
           cudaMemcpyDeviceToHost, what);
    m.synchronize(what);
  }
}

void NcclBackend::alltoall(const Response& resp, Entry& entry) {
  Impl& m = *impl_;
  const std::string what = fmt::format("alltoall of CUDA tensor '{}'", resp.name);
  // Every rank's splits are in the gathered requests: rank p sends
  // splits[p][q] rows to rank q. Joined ranks are refused at negotiation,
  // so every rank has an entry.
  const int n = m.t.size();
  const int me = m.t.rank();
  const Request& a = resp.agreed;
  const std::size_t row_bytes = row_elems(a.shape) * dtype_size(a.dtype);
  const Request& mine = *resp.per_rank[static_cast<std::size_t>(me)];
  std::vector<std::size_t> send(n), recv(n), send_at(n), recv_at(n);
  std::vector<std::int64_t> received(n);
  std::size_t send_total = 0, recv_total = 0;
  std::int64_t rows = 0;
  for (int p = 0; p < n; ++p) {
    send[p] = static_cast<std::size_t>(mine.splits[p]) * row_bytes;
    received[p] = resp.per_rank[static_cast<std::size_t>(p)]->splits[me];
    recv[p] = static_cast<std::size_t>(received[p]) * row_bytes;
    send_at[p] = send_total;
    recv_at[p] = recv_total;
    send_total += send[p];
    recv_total += recv[p];
    rows += received[p];
  }
  OwnedTensor& out = entry->state->output;
  out.dtype = a.dtype;
  out.shape = mine.shape;
  out.shape[0] = rows;
  out.data.resize(recv_total);
  entry->state->received_splits = received;
  if (send_total == 0 && recv_total == 0) return;  // no peer expects anything of this rank
  check_cuda(cudaSetDevice(m.device), what + ": cudaSetDevice");
  auto* staging = static_cast<std::byte*>(m.scratch.get(recv_total, what));
  const auto* in = static_cast<const std::byte*>(entry->in.data);
  // Sizes of zero are skipped on both sides alike (they come from the same
  // agreed splits); this rank's own rows are a device copy.
  check_nccl(ncclGroupStart(), what + ": ncclGroupStart", m.comm);
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    if (send[p]) {
      check_nccl(ncclSend(in + send_at[p], send[p], ncclUint8, p, m.comm, m.stream),
                 fmt::format("{}: ncclSend to rank {}", what, p), m.comm);
    }
    if (recv[p]) {
      check_nccl(ncclRecv(staging + recv_at[p], recv[p], ncclUint8, p, m.comm, m.stream),
                 fmt::format("{}: ncclRecv from rank {}", what, p), m.comm);
    }
  }
  m.settle(ncclGroupEnd(), what + ": ncclGroupEnd");
  m.copy(staging + recv_at[me], in + send_at[me], send[me], cudaMemcpyDeviceToDevice, what);
  m.synchronize(what);  // before a copy into pageable memory, which blocks
  m.copy(out.data.data(), staging, recv_total, cudaMemcpyDeviceToHost, what);
  m.synchronize(what);
}

}  // namespace gyre::core
