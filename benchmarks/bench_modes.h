// The three modes of gyre-allreduce-perf and what they share: the options,
// and the "systems" a mode times side by side (gyre's bare ring, gyre's
// runtime, MPI_Allreduce).
//
// Threads: the modes run on the main thread of every rank and print on
// rank 0 only. The runtime system calls gyre's public API, whose background
// thread does the transfers; the ring system drives its transport directly
// on the main thread (the runtime is then not running, or idle).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "gyre/collectives/algorithms.h"
#include "gyre/types.h"

namespace gyre::bench {

struct PerfOptions {
  // Sweep: sizes from min_bytes to max_bytes, times step_factor (or plus
  // step_bytes when that is non-zero), as nccl-tests' -b -e -f -i.
  std::size_t min_bytes = 8;
  std::size_t max_bytes = 64u << 20;
  long step_factor = 2;
  std::size_t step_bytes = 0;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  bool op_given = false;
  // Untimed iterations before timing; -1: the mode's default.
  long warmup = -1;
  // Sweep: iterations per timed block; gradient sets: timed steps; latency:
  // timed samples. -1: the mode's default.
  long iters = -1;
  // Sweep: timed blocks per system and size; the blocks of the systems alternate.
  long blocks = 5;
  // Sweep: time the runtime (gyre::allreduce, blocking) instead of the bare ring.
  bool runtime = false;
  // Sweep, with runtime: gyre's buffer from gyre::alloc_shared (the host's
  // pool, GYRE_SHM_POOL_BYTES), reduced in place.
  bool shared_buffers = false;
  // Sweep: time the shared-memory allreduce (collectives/shm.h, slots of
  // chunk_bytes) as gyre's bare system instead of the ring over MPI.
  bool shm = false;
  // Sweep: also time the machine's single-copy bound (shm_reduce_slots: the
  // data already in memory every rank maps, reduced in place) per size.
  bool bound = false;
  std::size_t chunk_bytes = collectives::kDefaultChunkBytes;
  std::size_t small_bytes = collectives::kDefaultSmallBytes;
  // Sweep and gradient sets: the bare system's algorithm above small_bytes
  // (--large ring|rabenseifner).
  collectives::LargeAllreduce large = collectives::LargeAllreduce::kRing;
  // Sweep and gradient sets: the buffers of every system on transparent huge
  // pages (HostBuffer in bench_common.h).
  bool huge_pages = false;
  std::string gradients_path;  // non-empty: gradient-set mode
  bool latency = false;        // latency mode
  std::string json_path;       // non-empty: rank 0 writes the rows there
  // Runs one system alone, e.g. under a profiler. Sweep: "gyre" or "mpi";
  // gradient sets: "runtime", "per-tensor", "fused", "ring" or "shm". Empty: all.
  std::string only;
};

// One way of allreducing `count` elements from `in` to `out` (out-of-place;
// `in == out` is allowed where the system supports it).
struct System {
  std::string name;
  std::function<void(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op)> run;
};

// collectives::allreduce (recursive doubling up to o.small_bytes, the ring
// or Rabenseifner's algorithm above as o.large says; no runtime) over a transport of its own (MpiWorld's duplicated
// communicator), on the calling thread: "gyre bare".
System make_bare_system(const PerfOptions& o);
// gyre::allreduce_async(name, ...) then Handle::wait(); gyre::init() must
// have been called. Every call uses the tensor name `tensor_name`, so calls
// of one system must not overlap (they do not: each waits).
System make_runtime_system(std::string tensor_name);
// The same in place on `shared` (a buffer of gyre::alloc_shared, large
// enough for every size): `in` and `out` are not used.
System make_runtime_shared_system(std::string tensor_name, void* shared);
// MPI_Allreduce on MPI_COMM_WORLD (see mpi_allreduce()).
System make_mpi_system();
System make_shm_system(const PerfOptions& o);

// Each returns the process exit status: 0, or 1 when a result was wrong.
int run_sweep(const PerfOptions& o);
int run_gradient_set(const PerfOptions& o);
int run_latency(const PerfOptions& o);

// Rank 0 only: writes `text` to `path`, throwing InvalidArgument naming the
// path when it cannot.
void write_file(const std::string& path, const std::string& text);

}  // namespace gyre::bench
