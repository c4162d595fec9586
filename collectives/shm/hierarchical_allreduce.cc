// hierarchical_allreduce: shared memory within a host, a ring across hosts.
#include <vector>

#include "gyre/collectives/algorithms.h"
#include "gyre/collectives/shm.h"
#include "gyre/collectives/transport.h"

namespace gyre::collectives {

void hierarchical_allreduce(ShmGroup& local, transport::Transport& cross, const void* in,
                            void* out, std::size_t count, DataType dt, ReduceOp op,
                            double prescale, double postscale,
                            const AllreduceOptions& cross_opt) {
  const int p = local.size();
  const int me = local.rank();
  const std::size_t esize = dtype_size(dt);
  // Shard r: earlier local ranks take one extra element when the count does
  // not divide evenly (the same split on every host).
  std::vector<std::size_t> counts(p), blocks(p);
  std::size_t first = 0, mine_at = 0;
  for (int r = 0; r < p; ++r) {
    counts[r] = count / p + (static_cast<std::size_t>(r) < count % p ? 1 : 0);
    blocks[r] = counts[r] * esize;
    if (r == me) mine_at = first;
    first += counts[r];
  }
  auto* shard = static_cast<std::byte*>(out) + mine_at * esize;
  // Average: a sum over every rank of every host, divided once at the end.
  const ReduceOp sum_or_op = op == ReduceOp::kAverage ? ReduceOp::kSum : op;
  if (op == ReduceOp::kAverage) postscale /= static_cast<double>(p) * cross.size();
  // 1. Within the host: this rank's shard, reduced over the host's ranks.
  shm_reduce_scatter(local, in, shard, counts, dt, sum_or_op, prescale, 1.0);
  // 2. Across hosts: the shard, reduced over the ranks with this local rank.
  AllreduceOptions o = cross_opt;
  o.prescale = 1.0;
  o.postscale = postscale;
  allreduce(cross, shard, shard, counts[me], dt, sum_or_op, o);
  // 3. Within the host: every shard to every rank.
  shm_allgather(local, shard, out, blocks);
}

}  // namespace gyre::collectives
