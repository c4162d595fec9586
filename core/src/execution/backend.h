// Backend: what the executor needs of the code that moves one device kind's
// buffers, defined here, at the stage that calls it, so that the stages'
// includes run one way (the backends, the stage after this one, implement
// it; the executor never names one). One object per device kind (and, with
// process sets, per set); the executor plans every collective
// (execution/plan.h, fusion/fusion.h), packs fused buckets with the
// backend's memory calls, calls the collective and completes the handles. A
// backend never sees a Response: it gets buffers, byte or element counts,
// the dtype and the effective reduction. BackendSet (below) is where the
// executor gets them from.
//
// Implementations: CpuRingBackend (backends/cpu/: the ring algorithms of
// collectives/ over the runtime's Transport), ShmBackend (backends/shm/:
// host tensors over the host's shared-memory group), HierarchicalBackend
// (backends/hierarchical/: shared memory within hosts, a ring across them)
// and NcclBackend (backends/nccl/: CUDA tensors through NCCL); the one
// BackendSet is BackendRegistry (backends/registry.h), which the runtime
// owns and which chooses the host backend from the host layout.
//
// Buffers: `in`/`out`/`buf` of allreduce and broadcast, and `in` of the
// others, are memory of the backend's device. The result of allgather,
// alltoall and reducescatter is written to `out` in host memory (the
// handle's OwnedTensor, or, for a rank with no entry of its own, a scratch
// buffer of the executor whose contents it discards). Every rank calls the same collectives
// with the same sizes in the same order (they come from agreed metadata).
//
// Ordering: a backend may run its work asynchronously on its device, in
// call order (a CUDA stream). Results are visible to the host, and the
// caller's buffers free, only once synchronize() returns; the executor
// calls it before completing a handle. synchronous() backends (the CPU ring)
// finish every call before returning.
//
// Errors: InvalidArgument before anything is sent (from agreed arguments,
// so every rank throws it alike: the executor fails that operation only);
// TransportError / TimeoutError otherwise (the runtime ends the job).
// `what` names the operation and its tensors for error messages; it is
// formatted only when a message is (the CPU path stays allocation-free).
//
// Thread: the runtime's background thread only.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "execution/plan.h"
#include "gyre/error.h"
#include "gyre/types.h"

namespace gyre::core {

// The operation and tensors a call is for, as error messages name them:
// "allreduce of 'a', 'b'". Views: valid for the duration of the call.
struct OpLabel {
  std::string_view op;
  std::span<const std::string_view> tensors;
  std::string str() const {
    std::string s = fmt::format("{} of ", op);
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      s += fmt::format("{}'{}'", i ? ", " : "", tensors[i]);
    }
    return s;
  }
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu", "nccl": for logs and messages.
  virtual const char* name() const = 0;
  // Whether every call has finished when it returns (synchronize() is then
  // a no-op).
  virtual bool synchronous() const = 0;

  // --- memory of the backend's device ---
  // A reusable buffer of at least `bytes` for fused buckets, grown as
  // needed; valid until the next call.
  virtual std::byte* fusion_buffer(std::size_t bytes, const OpLabel& what) = 0;
  // `bytes` of zeros, the contribution of a rank with no entry (it joined);
  // valid until the next call of zeros().
  virtual std::byte* zeros(std::size_t bytes, const OpLabel& what) = 0;
  // Device-to-device copy of `bytes` (in call order with the collectives).
  virtual void copy(void* dst, const void* src, std::size_t bytes, const OpLabel& what) = 0;
  // Sets `ranges` of `buf` to zero. Called before members are copied into
  // a fused buffer, so an implementation may zero the whole extent of the
  // ranges at once where one device call is cheaper than one per range.
  virtual void zero_ranges(std::byte* buf, std::span<const ByteRange> ranges,
                           const OpLabel& what) = 0;
  // Waits until everything called so far has finished.
  virtual void synchronize(const OpLabel& what) = 0;

  // --- collectives ---
  // `count` elements of `dt`; in == out is in place. `red.op` is never
  // kAverage (see effective_reduction).
  virtual void allreduce(const void* in, void* out, std::size_t count, DataType dt,
                         const Reduction& red, const OpLabel& what) = 0;
  virtual void broadcast(void* buf, std::size_t bytes, int root, const OpLabel& what) = 0;
  // Rank r contributes block_bytes[r] bytes from `in`; `out` receives the
  // blocks in rank order, compacted.
  virtual void allgather(const void* in, std::span<const std::size_t> block_bytes, void* out,
                         const OpLabel& what) = 0;
  // send_bytes[p] consecutive bytes of `in` go to rank p; recv_bytes[p]
  // bytes from rank p land consecutively in `out`. `largest_bytes`: the
  // largest message between any two ranks (AlltoallPlan), alike on every
  // rank.
  virtual void alltoall(const void* in, std::span<const std::size_t> send_bytes, void* out,
                        std::span<const std::size_t> recv_bytes, std::size_t largest_bytes,
                        const OpLabel& what) = 0;
  // `in` holds the sum of `counts` elements; `out` receives the reduction
  // of block `rank` (counts[rank] elements).
  virtual void reducescatter(const void* in, std::span<const std::size_t> counts, void* out,
                             DataType dt, const Reduction& red, const OpLabel& what) = 0;
  // Whether this backend reduces a fused bucket straight from its members'
  // buffers (allreduce_members) better than the executor's pack into
  // fusion_buffer(), allreduce() and unpack: the shared-memory backend,
  // which gathers and scatters one cache-sized chunk at a time.
  virtual bool reduces_members() const { return false; }
  // The allreduce of a fused bucket of `count` elements from its members
  // into theirs (`members` sorted by offset, for a rank without an entry
  // in == out == nullptr; the bytes no member covers are zeros). Called only
  // when reduces_members(), never for kAdasum.
  virtual void allreduce_members(std::span<const BucketPiece> members, std::size_t count,
                                 DataType dt, const Reduction& red, const OpLabel& what) {
    (void)members, (void)count, (void)dt, (void)red;
    throw StateError(fmt::format("{}: backend '{}' does not reduce buckets from their members",
                                 what.str(), name()));
  }
  // Allreduce with red.op == kAdasum: `tensors` are the byte ranges of the
  // bucket's members in `in`/`out` (one range for a lone tensor), each
  // combined on its own. Backends without Adasum throw InvalidArgument
  // (from agreed arguments: alike on every rank, before any transfer).
  virtual void adasum(const void* in, void* out, std::size_t count, DataType dt,
                      const Reduction& red, std::span<const ByteRange> tensors,
                      const OpLabel& what) {
    (void)in, (void)out, (void)count, (void)dt, (void)red, (void)tensors;
    throw InvalidArgument(fmt::format("{}: Adasum is not implemented for {} tensors (backend "
                                      "'{}'); it runs on CPU tensors", what.str(), name(),
                                      name()));
  }
};

// The backends of a runtime, as the executor sees them. BackendRegistry
// (backends/registry.h) is the implementation; the runtime owns it and
// gives it to its executor. Background thread, apart from the statistics.
class BackendSet {
 public:
  virtual ~BackendSet() = default;
  // The backend for tensors on `device.type`, created at its first use
  // (`device.index` -1: the rank has no tensor of its own, the backend
  // chooses), or nullptr if this build has none for that device kind.
  virtual Backend* get(Device device) = 0;
  // The backend of host tensors (always present).
  virtual Backend& host() = 0;
  // The host backend's name ("cpu", "shm", "hierarchical") and fusion
  // buffer (statistics; any thread).
  virtual const char* host_backend() const = 0;
  virtual const FusionBuffer& host_fusion_buffer() const = 0;
};

}  // namespace gyre::core
