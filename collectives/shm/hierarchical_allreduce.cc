// hierarchical_allreduce: shared memory within a host, an allreduce across
// hosts, optionally pipelined in pieces (the shared-memory passes of one
// piece beside the network phase of another).
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "gyre/collectives/algorithms.h"
#include "gyre/collectives/shm.h"
#include "gyre/collectives/transport.h"
#include "gyre/error.h"

namespace gyre::collectives {

namespace {

// The network phase of a pipelined allreduce, on a thread of its own: the
// caller hands over pieces in order (submit), the thread reduces each
// across hosts in that order, and the caller waits for each before its
// allgather. The cross transport is driven by this thread alone while it
// runs (the caller works on shared memory meanwhile), so the transport is
// still used from one thread at a time. A failure stops the thread; wait()
// rethrows it. The piece in progress stops at the transport's next
// interrupt check when a rank of this host has failed the local group (the
// caller then waits for no piece that may never come: a peer on another host
// may have stopped before sending it) and when the stage is destroyed before
// its pieces are done (the caller failed). The destructor takes no further
// pieces and joins; the transport's own interrupt check is restored.
class CrossStage {
 public:
  CrossStage(ShmGroup& local, transport::Transport& cross,
             std::function<void(std::size_t)> reduce)
      : cross_(cross), saved_check_(cross.interrupt_check()), reduce_(std::move(reduce)) {
    // The thread first: if it cannot start, the transport is left as it
    // was. It uses the transport only for a submitted piece, after this.
    thread_ = std::thread([this] { run(); });
    cross_.set_interrupt_check([this, &local] {
      if (stopping_.load() || local.failed()) {
        throw TransportError(
            "hierarchical allreduce: network phase stopped, the shared-memory phase on this "
            "host failed");
      }
      if (saved_check_) saved_check_();
    });
  }
  ~CrossStage() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
    cross_.set_interrupt_check(saved_check_);
  }
  CrossStage(const CrossStage&) = delete;
  CrossStage& operator=(const CrossStage&) = delete;

  void submit() {
    {
      std::lock_guard lock(mu_);
      ++submitted_;
    }
    cv_.notify_all();
  }
  // Returns once piece k has been reduced; rethrows the thread's failure.
  void wait(std::size_t k) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return done_ > k || error_; });
    if (done_ <= k) std::rethrow_exception(error_);
  }

 private:
  void run() {
    for (std::size_t k = 0;; ++k) {
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return submitted_ > k || stopping_.load(); });
        if (submitted_ <= k) return;
      }
      try {
        reduce_(k);
      } catch (...) {
        std::lock_guard lock(mu_);
        error_ = std::current_exception();
        cv_.notify_all();
        return;
      }
      {
        std::lock_guard lock(mu_);
        done_ = k + 1;
      }
      cv_.notify_all();
    }
  }

  transport::Transport& cross_;
  std::function<void()> saved_check_;
  std::function<void(std::size_t)> reduce_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::size_t submitted_ = 0, done_ = 0;
  std::atomic<bool> stopping_{false};  // read by the interrupt check without mu_
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace

ShmShards shm_shards(std::size_t count, int p, int me, std::size_t esize) {
  ShmShards s;
  s.counts.resize(static_cast<std::size_t>(p));
  s.blocks.resize(static_cast<std::size_t>(p));
  std::size_t first = 0;
  for (int r = 0; r < p; ++r) {
    s.counts[r] = count / p + (static_cast<std::size_t>(r) < count % p ? 1 : 0);
    s.blocks[r] = s.counts[r] * esize;
    if (r == me) s.mine_at = first;
    first += s.counts[r];
  }
  return s;
}

void hierarchical_allreduce(ShmGroup& local, transport::Transport& cross, const void* in,
                            void* out, std::size_t count, DataType dt, ReduceOp op,
                            double prescale, double postscale,
                            const AllreduceOptions& cross_opt, std::size_t pieces) {
  const int p = local.size();
  const int me = local.rank();
  const std::size_t esize = dtype_size(dt);
  // Average: a sum over every rank of every host, divided once at the end.
  const ReduceOp sum_or_op = op == ReduceOp::kAverage ? ReduceOp::kSum : op;
  if (op == ReduceOp::kAverage) postscale /= static_cast<double>(p) * cross.size();
  AllreduceOptions o = cross_opt;
  o.prescale = 1.0;
  o.postscale = postscale;
  // Piece k: elements [k * count / pieces, (k + 1) * count / pieces), each
  // cut into shards like the whole buffer. At least one element per shard.
  pieces = std::max<std::size_t>(1, std::min(pieces, count / static_cast<std::size_t>(p)));
  std::vector<std::size_t> first(pieces + 1);
  for (std::size_t k = 0; k <= pieces; ++k) first[k] = k * count / pieces;
  std::vector<ShmShards> split(pieces);
  for (std::size_t k = 0; k < pieces; ++k) split[k] = shm_shards(first[k + 1] - first[k], p, me, esize);
  const auto* src = static_cast<const std::byte*>(in);
  auto* dst = static_cast<std::byte*>(out);
  auto shard = [&](std::size_t k) { return dst + (first[k] + split[k].mine_at) * esize; };
  // 1. Within the host: this rank's shard of piece k, reduced over the host's ranks.
  auto reduce_scatter = [&](std::size_t k) {
    shm_reduce_scatter(local, src + first[k] * esize, shard(k), split[k].counts, dt, sum_or_op,
                       prescale, 1.0);
  };
  // 2. Across hosts: the shard, reduced over the ranks with this local rank.
  auto across = [&](std::size_t k) {
    allreduce(cross, shard(k), shard(k), split[k].counts[me], dt, sum_or_op, o);
  };
  // 3. Within the host: every shard of piece k to every rank.
  auto all_gather = [&](std::size_t k) {
    shm_allgather(local, shard(k), dst + first[k] * esize, split[k].blocks);
  };
  if (pieces == 1) {
    reduce_scatter(0);
    across(0);
    all_gather(0);
    return;
  }
  // Pipelined: this thread runs the shared-memory passes, reduce-scatter of
  // piece k then allgather of piece k - 1, while the stage's thread reduces
  // piece k - 1 ... across hosts. Every local rank runs the same sequence of
  // shared-memory collectives; the ranks of one local rank on the hosts run
  // the same sequence of cross-host allreduces.
  CrossStage stage(local, cross, across);
  auto finish = [&](std::size_t k) {
    try {
      stage.wait(k);
    } catch (...) {
      local.fail();  // the host's other ranks stop waiting for this one
      throw;
    }
    all_gather(k);
  };
  for (std::size_t k = 0; k < pieces; ++k) {
    reduce_scatter(k);
    stage.submit();
    if (k > 0) finish(k - 1);
  }
  finish(pieces - 1);
}

}  // namespace gyre::collectives
