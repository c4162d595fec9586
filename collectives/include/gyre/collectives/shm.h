// Shared memory between the ranks of one host: the segment, the group laid
// out in it, and the allreduce that reads every rank's data in place.
//
// A ShmGroup is p ranks (p <= kShmMaxRanks) over one memory region that all
// of them map: a header of per-rank counters, then one slot of slot_bytes per
// rank, through which the collectives stage their chunks. Ranks synchronise
// through the counters (atomics, no system call unless a rank waits long
// enough to sleep: ShmOptions::spin): every rank runs the same sequence of
// collectives, and each collective advances every rank's counter by the
// same amount, so "all counters have reached my own" is a barrier.
//
// Who owns what: the region belongs to the caller (a ShmSegment for
// processes, any shared buffer for ranks as threads in a test), and must
// outlive the group. Each rank drives its own ShmGroup from one thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gyre/types.h"

namespace gyre::collectives {

inline constexpr int kShmMaxRanks = 64;

// A POSIX shared-memory segment private to one job: created exclusively with
// mode 0600 under a name unique to the job, mapped, and unlinked by its
// creator as soon as every rank has mapped it (unlink()), so that a crash
// leaves nothing in /dev/shm. Unmapped on destruction.
class ShmSegment {
 public:
  // Creates and maps `bytes` zero-filled bytes, all of them allocated now
  // (a segment the room left in /dev/shm cannot hold fails here, not with
  // SIGBUS at its first use); throws TransportError naming the segment and
  // errno's text.
  static ShmSegment create(const std::string& name, std::size_t bytes);
  // Maps an existing segment of `bytes` bytes.
  static ShmSegment open(const std::string& name, std::size_t bytes);
  ShmSegment() = default;  // maps nothing
  ShmSegment(ShmSegment&& o) noexcept;
  ShmSegment& operator=(ShmSegment&& o) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ~ShmSegment();

  void* data() const { return data_; }
  std::size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  // Removes the name (the mapping stays valid); idempotent.
  void unlink();

 private:
  ShmSegment(std::string name, void* data, std::size_t size, bool owner)
      : name_(std::move(name)), data_(data), size_(size), owner_(owner) {}
  std::string name_;
  void* data_ = nullptr;
  std::size_t size_ = 0;
  bool owner_ = false;  // the creator unlinks
};

struct ShmOptions {
  // Bytes of each rank's slot: the chunk of a pipelined collective. Small
  // enough that a chunk stays in cache between being written and read.
  std::size_t slot_bytes = 256u << 10;
  // A wait for a peer longer than this throws TimeoutError naming the ranks
  // waited for (zero: forever).
  std::chrono::milliseconds timeout{0};
  // A barrier polls without pause for `spin`, then sleeps in the kernel
  // (futex) until a peer arrives, fails or the deadline comes. With more
  // ranks in the group than the host has cores it sleeps at once: polling
  // would take the core of the rank it waits for.
  std::chrono::microseconds spin{100};
  // Bytes of each rank's part of the host's pool (shm_pool.h), from which
  // gyre::alloc_shared allocates buffers the other ranks of the host map;
  // 0: no pool.
  std::size_t pool_bytes = 0;
};

class ShmGroup {
 public:
  // Bytes a region must have for `size` ranks with the given slot size.
  static std::size_t region_bytes(int size, std::size_t slot_bytes);

  // `region`: region_bytes(size, opt.slot_bytes) bytes, zero-filled before
  // any rank uses it, 64-byte aligned, mapped by every rank of the group.
  ShmGroup(void* region, int rank, int size, const ShmOptions& opt);

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::size_t slot_bytes() const { return opt_.slot_bytes; }
  std::byte* slot(int r) const;

  // Barrier: publishes that this rank reached the next point, waits until
  // every rank has. Throws TimeoutError after opt.timeout, naming the ranks
  // that had not arrived; when another rank marked the group failed,
  // TimeoutError naming the same ranks if that rank timed out, else
  // TransportError.
  void barrier();
  // Marks the group failed, so peers blocked in barrier() throw instead of
  // waiting for this rank. Called when a rank leaves a collective early.
  void fail() noexcept;
  // Whether some rank marked the group failed (any thread).
  bool failed() const noexcept;

 private:
  struct Header;
  void wake_sleepers() noexcept;
  void sleep_until_arrived(int q, std::chrono::nanoseconds limit);
  Header* header_;
  std::byte* slots_;
  int rank_, size_;
  ShmOptions opt_;
  std::uint64_t epoch_ = 0;  // barriers this rank has passed
};

// Allreduce of `count` elements over the group: out = op over ranks of in
// (in == out allowed). Pipelined through the slots one chunk at a time: each
// rank copies its input of the other ranks' shares of the chunk into its
// slot, reduces its own share from the other slots and its own input (read
// in place when it is not prescaled, else copied into its slot too) into
// its output (into its slot where the input is not one contiguous buffer),
// writes the reduced share into every other rank's slot, and copies the
// other shares out of its slot: 3(n - 1)/n bytes copied per byte of
// buffer (n = 2: 1.5), against 3 - 1/n when the whole chunk was copied in,
// reduced in the slots and copied out. Every element is reduced by one
// rank, in rank order, so every rank holds the same bits.
// `prescale` scales each input and `postscale` the result (floating types);
// kAverage is the sum with 1/size folded into the postscale.
void shm_allreduce(ShmGroup& g, const void* in, void* out, std::size_t count, DataType dt,
                   ReduceOp op, double prescale = 1.0, double postscale = 1.0);

// The allreduce of a fused bucket of `count` elements without packing it
// first: `pieces` (gyre/types.h; sorted by offset, not overlapping) are gathered into the
// slots one chunk at a time, zeros filling the bytes no piece covers, and
// each reduced chunk is scattered back into the pieces' outputs while it is
// still in cache. The same bits as shm_allreduce of the packed bucket. Every
// rank passes the same count and the same offsets and sizes.
void shm_allreduce_pieces(ShmGroup& g, std::span<const BucketPiece> pieces, std::size_t count,
                          DataType dt, ReduceOp op, double prescale = 1.0,
                          double postscale = 1.0);

// The reduction of `count` elements that already lie at the start of every
// rank's slot, in place: afterwards every slot holds the result. No copy in
// or out: the single-copy bound an allreduce of data in shared memory can
// reach (the benchmark's bound row), and the middle step of shm_allreduce.
void shm_reduce_slots(ShmGroup& g, std::size_t count, DataType dt, ReduceOp op);

// The other collectives, staged through the slots with the same barriers;
// their arguments mean what they mean for the ring algorithms of
// algorithms.h, and every rank passes the same sizes.
//
// Allgather of blocks that may differ in size: block_bytes[r] from rank r,
// in rank order in `out`; in place when `in` is this rank's block in `out`.
void shm_allgather(ShmGroup& g, const void* in, void* out,
                   std::span<const std::size_t> block_bytes);
// Broadcast of `bytes` bytes from `root`.
void shm_broadcast(ShmGroup& g, void* buf, std::size_t bytes, int root);
// Reduce-scatter: every rank holds sum(counts) elements; rank r receives the
// reduction of block r. In place when `out` is block r inside `in`.
void shm_reduce_scatter(ShmGroup& g, const void* in, void* out,
                        std::span<const std::size_t> counts, DataType dt, ReduceOp op,
                        double prescale = 1.0, double postscale = 1.0);
// All-to-all: send_bytes[q] consecutive bytes of `in` go to rank q;
// recv_bytes[q] bytes from rank q land consecutively in `out`.
// `max_pair_bytes`: the largest amount any rank sends any rank (every rank
// must pass the same value: it sets the number of rounds).
void shm_alltoall(ShmGroup& g, const void* in, std::span<const std::size_t> send_bytes,
                  void* out, std::span<const std::size_t> recv_bytes,
                  std::size_t max_pair_bytes);

}  // namespace gyre::collectives

namespace gyre::transport {
class Transport;
}

namespace gyre::collectives {

struct AllreduceOptions;
struct AllgatherOptions;

// `count` elements cut into one shard per rank of a group of `p`: earlier
// ranks take one extra element when the count does not divide evenly (the
// same split on every host of a hierarchical allreduce). Per rank its
// element count and its bytes (`esize` per element); `mine_at`: the
// elements before rank `me`'s shard.
struct ShmShards {
  std::vector<std::size_t> counts, blocks;
  std::size_t mine_at = 0;
};
ShmShards shm_shards(std::size_t count, int p, int me, std::size_t esize);

// Hierarchical allreduce over hosts that each hold the same number of ranks:
// reduce-scatter within the host over shared memory (`local`), an allreduce
// of each rank's shard among the ranks with its local rank on the other hosts
// (`cross`, e.g. a ring over the network: one inter-host transfer per host
// per step), then an allgather within the host. Every host must have as many
// local ranks (so that each shard has a peer on every host). `cross_opt`:
// the inter-host allreduce's options (chunk, tag, small-message threshold);
// its scale factors are ignored: `prescale` applies to the inputs,
// `postscale` to the result. `pieces` > 1 pipelines the three phases: the
// buffer is cut into that many pieces (at most one per element of a
// shard), and while one piece crosses the hosts (on a thread started for
// the call, the only user of `cross` meanwhile) the calling thread
// reduce-scatters the next and allgathers the previous. Every rank must
// pass the same `pieces`. Every rank gets the same bits; with more than two
// hosts the association order of a sum (so its last bits) can depend on
// `pieces`, as the cross-host ring's order depends on an element's place.
void hierarchical_allreduce(ShmGroup& local, transport::Transport& cross, const void* in,
                            void* out, std::size_t count, DataType dt, ReduceOp op,
                            double prescale, double postscale,
                            const AllreduceOptions& cross_opt, std::size_t pieces = 1);

// Hierarchical allgather over hosts that each hold the same number p of
// ranks: a ring allgather across hosts among the ranks with this rank's local
// rank (`cross`: each host sends each of its blocks over the network once),
// then an allgather within the host over shared memory of what each local
// rank gathered. Arguments as for ring_allgather over the whole job, with
// `block_bytes[r]` for world rank r, plus the placement: `world_rank_of[h * p
// + l]` is the world rank of local rank l on host h (host h = rank h of
// `cross`). When the world ranks are placed round-robin (world rank l *
// hosts + h), the blocks land in `out` directly; otherwise they are staged in
// `scratch` (grown to the total size) and copied into rank order.
void hierarchical_allgather(ShmGroup& local, transport::Transport& cross, const void* in,
                            void* out, std::span<const std::size_t> block_bytes,
                            std::span<const int> world_rank_of,
                            const AllgatherOptions& cross_opt, std::vector<std::byte>& scratch);

}  // namespace gyre::collectives
