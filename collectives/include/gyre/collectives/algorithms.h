// Collective algorithms over a Transport. Each is a pure function of the
// transport, the buffers and an options struct; every rank of the transport
// must call the same algorithm with agreeing arguments, in the same order.
//
// Bad arguments (null buffer with a non-zero count, root out of range,
// operation not defined for a type, span sizes that do not match the world)
// throw gyre::InvalidArgument before any byte is sent, so a rank that rejects
// its own arguments never leaves a peer half-way through a ring.
//
// What is checked locally, on each rank: known dtype and op, op defined on
// the dtype (average and scaling: not on bool; adasum: floating types, its
// own entry point only), prescale/postscale finite and equal to 1 on bool
// (integers scale as reduce_kernels.h says),
// chunk_bytes > 0 where an algorithm has it, 0 <= tag < INT_MAX, null
// buffers with a non-zero size, per-rank spans with exactly one entry per
// rank, sizes whose byte count overflows,
// input/output overlap other than the documented in-place forms, root in
// [0, size), and for alltoall that what a rank sends itself matches what it
// expects from itself.
// What is NOT checked (it needs traffic a pure ring does not have; the
// runtime's negotiation checks it before calling in): that all ranks pass
// the same count, dtype, op, root, block sizes and options. Ranks that
// disagree get a TransportError (size mismatch), a TimeoutError if the
// transport has a timeout set, or wrong results.
//
// Threads: called from one thread per transport (the runtime's background
// thread; a test's rank thread). Buffers belong to the caller and are only
// touched during the call. Each call uses a small per-thread staging area
// (kept between calls). After a TransportError or TimeoutError the transport
// may still have transfers in flight; it must not be used again.
//
// Messages of one call use opt.tag (and opt.tag + 1, see the options below);
// calls on one transport must not overlap (they cannot: every call
// completes its transfers before returning).
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <vector>

#include "gyre/collectives/transport.h"
#include "gyre/types.h"

namespace gyre::collectives {

using transport::Transport;

// Measured with 2 ranks on a 2-core host against 128 KiB, 512 KiB and 1 MiB
// at 1, 8 and 64 MiB float32: best or tied everywhere. A staging window of
// kRecvWindow chunks (1 MiB) stays within a core's L2.
inline constexpr std::size_t kDefaultChunkBytes = 256 * 1024;

// allreduce() takes recursive doubling up to this many bytes, the ring
// above. Measured with 2 ranks on a 2-core host (float32 sum, median of 5
// blocks of 50): recursive doubling 0.7 us at 8 B against 2.3 us for the
// ring, 7.5 against 11.5 us at 16 KiB, 17.7 against 20.7 at 64 KiB, even at
// 128-256 KiB and slower above (the whole buffer in one message, not
// pipelined). With more ranks it moves log2(n) buffers against 2(n-1)/n for
// the ring, so the crossover only falls: 64 KiB errs on the ring's side.
inline constexpr std::size_t kDefaultSmallBytes = 64 * 1024;

// Options: one plain struct per algorithm, holding only the fields that
// algorithm reads. `chunk_bytes` is the largest single transfer (a segment
// larger than this is pipelined in chunks so that sending chunk k+1 overlaps
// reducing chunk k). `prescale` / `postscale` multiply the input before the
// reduction and the result after it, as Horovod's prescale_factor and
// postscale_factor do; average applies its 1/n on top of postscale, once, at
// the end. `tag` is the message tag of the call: the ring algorithms
// (allreduce, reduce-scatter, allgather) use `tag` and `tag + 1`; broadcast,
// alltoall, barrier, recursive doubling and Rabenseifner use `tag` only.

// The algorithm allreduce() runs above small_bytes.
enum class LargeAllreduce {
  kRing,          // ring_allreduce
  kRabenseifner,  // rabenseifner_allreduce
};
// "ring", "rabenseifner".
const char* large_allreduce_name(LargeAllreduce a);

// allreduce(): the ring's options plus the size below which recursive
// doubling runs instead, and which algorithm runs above it.
struct AllreduceOptions {
  std::size_t chunk_bytes = kDefaultChunkBytes;
  int tag = 0;
  double prescale = 1.0;
  double postscale = 1.0;
  // A buffer of at most this many bytes is reduced by recursive doubling,
  // larger ones by the ring; 0: always the ring.
  std::size_t small_bytes = kDefaultSmallBytes;
  // Above small_bytes: the ring or Rabenseifner's algorithm (the runtime
  // picks per call by its cost model, core/src/backends/hierarchical/
  // cost_model.h). Every rank must pass the same value.
  LargeAllreduce large = LargeAllreduce::kRing;
};

struct RingAllreduceOptions {
  std::size_t chunk_bytes = kDefaultChunkBytes;
  int tag = 0;
  double prescale = 1.0;
  double postscale = 1.0;
};

// Recursive doubling moves whole buffers: no chunking.
struct RecursiveDoublingOptions {
  int tag = 0;
  double prescale = 1.0;
  double postscale = 1.0;
};

// Rabenseifner's allreduce: each exchange is cut in chunks of chunk_bytes.
struct RabenseifnerOptions {
  std::size_t chunk_bytes = kDefaultChunkBytes;
  int tag = 0;
  double prescale = 1.0;
  double postscale = 1.0;
};

struct ReduceScatterOptions {
  std::size_t chunk_bytes = kDefaultChunkBytes;
  int tag = 0;
  double prescale = 1.0;
  double postscale = 1.0;
};

struct AllgatherOptions {
  std::size_t chunk_bytes = kDefaultChunkBytes;
  int tag = 0;
};

struct BroadcastOptions {
  std::size_t chunk_bytes = kDefaultChunkBytes;
  int tag = 0;
};

// One message per pair (the transport cuts huge ones): no chunking.
struct AlltoallOptions {
  int tag = 0;
};

struct BarrierOptions {
  int tag = 0;
};

struct DisseminationOptions {
  int tag = 0;
};
// dissemination_allreduce's combine: acc = f(acc, in), element by element or
// field by field, associative; for a world size that is not a power of two
// also commutative and idempotent (f(a, a) = a: AND, OR, min, max), since
// some ranks' words are then combined more than once. For a power of two
// every rank's words are combined once, `acc` holding the lower ranks'.
using WordCombine =
    std::function<void(std::span<std::uint64_t> acc, std::span<const std::uint64_t> in)>;

// Adasum exchanges halves on `tag` and per-tensor dot products on `tag + 1`.
struct AdasumOptions {
  int tag = 0;
  double prescale = 1.0;
  double postscale = 1.0;
};

// One tensor of a fused buffer, in elements: [offset, offset + count).
struct TensorExtent {
  std::size_t offset = 0;
  std::size_t count = 0;
};


// Allreduce, the algorithm chosen by size: recursive_doubling_allreduce for
// buffers of at most opt.small_bytes, ring_allreduce or
// rabenseifner_allreduce (opt.large) above. Arguments and results as for
// ring_allreduce. Every rank must pass the same small_bytes and large (the
// choice must agree, like the count).
void allreduce(Transport& t, const void* in, void* out, std::size_t count, DataType dt,
               ReduceOp op, const AllreduceOptions& opt = {});

// Ring allreduce: reduce-scatter then all-gather around rank r -> r+1.
// `in == out` is the in-place form; otherwise `in` is left unchanged and the
// buffers must not overlap. Any count (zero, fewer than the ranks, not a
// multiple of them). float16/bfloat16 are combined in float32 and rounded
// once per ring hop. kAverage divides by the world size once, at the end,
// together with postscale.
void ring_allreduce(Transport& t, const void* in, void* out, std::size_t count,
                    DataType dt, ReduceOp op, const RingAllreduceOptions& opt = {});

// Recursive-doubling allreduce, for small buffers, where the number of
// sequential steps matters more than the bytes moved: ceil(log2 n) exchanges
// of the whole buffer (two more when n is not a power of two: ranks beyond
// the largest power of two fold into a partner first and get the result back
// at the end), against 2(n-1) steps for the ring, which moves less data per
// rank (2(n-1)/n of the buffer against log2 n of it). Arguments and results
// as for ring_allreduce; every rank gets bit-identical results (each
// combination takes the lower rank's operand first, on both partners).
void recursive_doubling_allreduce(Transport& t, const void* in, void* out, std::size_t count,
                                  DataType dt, ReduceOp op,
                                  const RecursiveDoublingOptions& opt = {});

// Rabenseifner's allreduce: a reduce-scatter by recursive halving, then an
// allgather by recursive doubling, over p = the largest power of two <= n
// ranks: 2 log2(p) steps against the ring's 2(n-1), moving the same
// 2(p-1)/p of the buffer per rank as a ring over p ranks. When n is not a
// power of two, the first 2(n-p) ranks fold in pairs first: each odd one
// sends its whole input to the even one below it, which combines it and
// takes part; the odd one gets the whole result back at the end (two more
// steps and two more buffers' worth of traffic on those pairs). Each step's
// exchange is pipelined in chunks of chunk_bytes. Arguments and results as
// for ring_allreduce; every element is combined by one rank per step (the
// lower rank's operand first) and copied to the others, so every rank gets
// bit-identical results. float16/bfloat16 are combined in float32 and
// rounded once per step. kAverage divides by n once, at the end, with
// postscale. See collectives/src/rabenseifner.cc.
void rabenseifner_allreduce(Transport& t, const void* in, void* out, std::size_t count,
                            DataType dt, ReduceOp op, const RabenseifnerOptions& opt = {});

// Ring allgather of rank-contributed byte blocks, which may differ in size.
// `block_bytes[r]` is rank r's contribution; `out` receives the blocks in
// rank order (sum of block_bytes bytes). `in` holds block_bytes[rank] bytes;
// in place when `in` points at this rank's block inside `out`.
void ring_allgather(Transport& t, const void* in, void* out,
                    std::span<const std::size_t> block_bytes,
                    const AllgatherOptions& opt = {});

// Broadcast of `bytes` bytes from `root`, pipelined along the ring.
void ring_broadcast(Transport& t, void* buf, std::size_t bytes, int root,
                    const BroadcastOptions& opt = {});

// Ring reduce-scatter: every rank holds the full input (sum of `counts`
// elements); rank r receives the reduction of block r (counts[r] elements).
// In place when `out` points at block r inside `in`. A prescale other than
// 1 makes a scaled copy of the whole input (in is never written).
void ring_reduce_scatter(Transport& t, const void* in, void* out,
                         std::span<const std::size_t> counts, DataType dt,
                         ReduceOp op, const ReduceScatterOptions& opt = {});

// Personalised all-to-all: send_bytes[p] bytes (consecutive in `in`) go to
// rank p; recv_bytes[p] bytes arrive from rank p, consecutive in `out`.
// `in` and `out` must not overlap.
void alltoall(Transport& t, const void* in, std::span<const std::size_t> send_bytes,
              void* out, std::span<const std::size_t> recv_bytes,
              const AlltoallOptions& opt = {});

// Adasum (adaptive summation; Maleki et al., "Scaling Distributed Training
// with Adaptive Summation", MLSys 2021) of `count` elements, float32,
// float64, float16 or bfloat16, over a power-of-two number of ranks
// (anything else is refused before any transfer). Pairs of partial results
// a, b are combined as
//   a' = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b
// (a coefficient is 1 when its norm is 0), level by level along a binary
// tree: at level l rank r and r ^ 2^l combine, the lower rank's partial
// result as a. Recursive vector halving: each level halves the part of the
// buffer a rank works on (the lower rank keeps the first half) and the dot
// products of the halves are summed over the 2^(l+1) ranks that hold the
// pieces, so every rank reduces 1/n of the buffer; an all-gather along the
// same pairs then assembles the result on every rank, bit-identical.
// `tensors` are the tensors of a fused buffer, sorted and disjoint: each is
// combined with its own dot products (empty: the whole buffer is one
// tensor). Elements outside every tensor (fusion padding) keep the value
// the rank that reduces them had, which is the result when they are zero on
// every rank. Dot products and combinations are computed in float64;
// prescale and postscale as for allreduce. `in == out` is in place.
void adasum_allreduce(Transport& t, const void* in, void* out, std::size_t count, DataType dt,
                      std::span<const TensorExtent> tensors, const AdasumOptions& opt = {});

// Returns once every rank has entered the barrier (dissemination barrier,
// ceil(log2 n) rounds of empty messages).
void barrier(Transport& t, const BarrierOptions& opt = {});

// Allreduce of a vector of 64-bit words by dissemination: every rank sends
// ceil(log2 n) messages of the vector's size (for every n, not only powers
// of two), and every rank ends with the combination of every rank's words.
// For n a power of two the steps are recursive doubling's pairs: each
// rank's words are combined exactly once, in the same order on every rank
// (the same bits everywhere); otherwise `combine` must be idempotent (see
// WordCombine): a rank's words may reach another twice. Every rank passes
// the same number of words.
void dissemination_allreduce(Transport& t, std::span<std::uint64_t> words,
                             const WordCombine& combine, const DisseminationOptions& opt = {});

// The same exchange for a vector whose length may differ between ranks and
// change as it is combined (a fixed head the combine reads first, then a
// tail that only some ranks carry: the negotiation round's speculated
// input): each message carries the sender's vector as it stands, received
// as a message of unknown length (Transport::isend_message), still
// ceil(log2 n) messages per rank. `combine` may resize `acc` (drop its
// tail, say); for n a power of two `acc` holds the lower ranks' words, as
// above. Every rank passes the same max_words, and no vector, combined or
// not, may be longer (TransportError names a peer whose message is).
using TailCombine =
    std::function<void(std::vector<std::uint64_t>& acc, std::span<const std::uint64_t> in)>;
void dissemination_allreduce(Transport& t, std::vector<std::uint64_t>& words,
                             std::size_t max_words, const TailCombine& combine,
                             const DisseminationOptions& opt = {});

}  // namespace gyre::collectives
