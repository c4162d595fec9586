// Host memory for the new outputs of out-of-place allreduces of large
// tensors (gyre.torch.allreduce, Horovod's semantics), kept for reuse.
//
// Why: through torch's allocator a new output above glibc's mmap threshold
// (which adapts up to 32 MiB) is a fresh mapping whose first touch faults in
// every 4 KiB page (16,384 faults for 64 MiB, about half of such a call),
// unmapped again when the tensor is freed. A block from this pool is mapped
// once, advised onto transparent huge pages, and comes back here when the
// tensor made from it is freed (the DLPack deleter), so the next output of
// that size is already in memory.
//
// Bounds: sizes are rounded up to 2 MiB; idle blocks are kept up to
// kMaxIdleBytes in all (beyond that a returned block is unmapped).
//
// Threads: acquire() and the release may run on any thread, with or
// without the GIL (the DLPack deleter runs wherever torch frees the
// tensor); a mutex guards the idle list. The pool is never destroyed: a
// tensor may outlive the interpreter's teardown.
#pragma once

#include <cstddef>
#include <memory>

namespace gyre::python {

// Outputs of at least this many bytes come from the pool.
inline constexpr std::size_t kPooledOutputMinBytes = std::size_t{1} << 20;

// At least `bytes` bytes (not zeroed); the block returns to the pool when
// the last copy of the pointer is dropped. Throws std::bad_alloc.
std::shared_ptr<std::byte> acquire_output(std::size_t bytes);

}  // namespace gyre::python
