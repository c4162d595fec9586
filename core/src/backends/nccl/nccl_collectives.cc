// NcclBackend's collectives whose result is delivered in host memory
// (Handle::output()): allgather, reducescatter, alltoall. NCCL's gather and
// reduce-scatter move equal blocks, so the planned blocks are padded to the
// largest in device staging memory and compacted when copied out. See
// nccl_backend.h for the contract.
#include <numeric>

#include "backends/nccl/nccl_backend_impl.h"
#include "execution/plan.h"

namespace gyre::core {

void NcclBackend::allgather(const void* in, std::span<const std::size_t> blocks, void* out,
                            const OpLabel& what) {
  Impl& m = *impl_;
  const std::size_t n = blocks.size();
  const std::size_t me = static_cast<std::size_t>(m.t.rank());
  const std::size_t padded = largest_block(blocks);
  if (padded == 0) return;
  const std::string w = describe(what);
  check_cuda(cudaSetDevice(m.device), w + ": cudaSetDevice");
  auto* staging = static_cast<std::byte*>(m.staging.get(padded * n, w));
  std::byte* mine = staging + padded * me;
  if (in) m.copy(mine, in, blocks[me], cudaMemcpyDeviceToDevice, w);
  m.settle(ncclAllGather(mine, staging, padded, ncclUint8, m.comm, m.stream),
           w + ": ncclAllGather");
  // A copy into pageable host memory blocks the calling thread until the
  // stream gets there, beyond any deadline: wait for the gather first.
  m.synchronize(w);
  if (out) {
    auto* host = static_cast<std::byte*>(out);
    for (std::size_t r = 0; r < n; ++r) {
      m.copy(host, staging + padded * r, blocks[r], cudaMemcpyDeviceToHost, w);
      host += blocks[r];
    }
    m.synchronize(w);
  }
}

void NcclBackend::reducescatter(const void* in, std::span<const std::size_t> counts, void* out,
                                DataType dt, const Reduction& red, const OpLabel& what) {
  Impl& m = *impl_;
  const std::string w = describe(what);
  check_scale(w, dt, red.prescale, red.postscale);
  if (!nccl_dtype(dt) || !nccl_op(red.op)) {
    throw InvalidArgument(fmt::format("{}: no NCCL reduction for {} on {}", w, op_name(red.op),
                                      dtype_name(dt)));
  }
  // Block r is padded to the largest with zeros, which no op turns into a
  // wrong value for the elements kept: padding is only ever reduced with
  // padding.
  const std::size_t n = counts.size();
  const std::size_t me = static_cast<std::size_t>(m.t.rank());
  const std::size_t largest = largest_block(counts);
  if (largest == 0) return;
  check_cuda(cudaSetDevice(m.device), w + ": cudaSetDevice");
  const std::size_t esize = dtype_size(dt);
  const std::size_t block = largest * esize;
  auto* staging = static_cast<std::byte*>(m.staging.get(block * (n + 1), w));
  std::byte* result = staging + block * n;
  check_cuda(cudaMemsetAsync(staging, 0, block * n, m.stream), w + ": cudaMemsetAsync");
  const auto* src = static_cast<const std::byte*>(in);
  std::size_t at = 0;  // elements of `in` before block r
  for (std::size_t r = 0; r < n; ++r) {
    m.copy(staging + block * r, src + at * esize, counts[r] * esize, cudaMemcpyDeviceToDevice, w);
    at += counts[r];
  }
  m.scale(staging, largest * n, dt, red.prescale, w);
  m.settle(ncclReduceScatter(staging, result, largest, *nccl_dtype(dt), *nccl_op(red.op), m.comm,
                             m.stream),
           w + ": ncclReduceScatter");
  m.scale(result, largest, dt, red.postscale, w);
  m.synchronize(w);  // before a copy into pageable memory, which blocks
  if (out) {
    m.copy(out, result, counts[me] * esize, cudaMemcpyDeviceToHost, w);
    m.synchronize(w);
  }
}

void NcclBackend::alltoall(const void* in, std::span<const std::size_t> send,
                           void* out, std::span<const std::size_t> recv, std::size_t,
                           const OpLabel& what) {
  Impl& m = *impl_;
  const int n = static_cast<int>(send.size());
  const int me = m.t.rank();
  std::vector<std::size_t> send_at(send.size()), recv_at(recv.size());
  std::exclusive_scan(send.begin(), send.end(), send_at.begin(), std::size_t{0});
  std::exclusive_scan(recv.begin(), recv.end(), recv_at.begin(), std::size_t{0});
  const std::size_t send_total = std::accumulate(send.begin(), send.end(), std::size_t{0});
  const std::size_t recv_total = std::accumulate(recv.begin(), recv.end(), std::size_t{0});
  if (send_total == 0 && recv_total == 0) return;  // no peer expects anything of this rank
  const std::string w = describe(what);
  check_cuda(cudaSetDevice(m.device), w + ": cudaSetDevice");
  auto* staging = static_cast<std::byte*>(m.staging.get(recv_total, w));
  const auto* src = static_cast<const std::byte*>(in);
  // Sizes of zero are skipped on both sides alike (they come from the same
  // agreed splits); this rank's own rows are a device copy.
  check_nccl(ncclGroupStart(), w + ": ncclGroupStart", m.comm);
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    if (send[p]) {
      check_nccl(ncclSend(src + send_at[p], send[p], ncclUint8, p, m.comm, m.stream),
                 fmt::format("{}: ncclSend to rank {}", w, p), m.comm);
    }
    if (recv[p]) {
      check_nccl(ncclRecv(staging + recv_at[p], recv[p], ncclUint8, p, m.comm, m.stream),
                 fmt::format("{}: ncclRecv from rank {}", w, p), m.comm);
    }
  }
  m.settle(ncclGroupEnd(), w + ": ncclGroupEnd");
  m.copy(staging + recv_at[me], src + send_at[me], send[me], cudaMemcpyDeviceToDevice, w);
  m.synchronize(w);  // before a copy into pageable memory, which blocks
  m.copy(out, staging, recv_total, cudaMemcpyDeviceToHost, w);
  m.synchronize(w);
}

}  // namespace gyre::core
