// Host memory of large blocks the extension allocates on every call, kept
// for reuse: the new outputs of out-of-place allreduces (gyre.torch.
// allreduce, Horovod's semantics) and the staged copies of torch tensors in
// flight (tensor_import.h), both from kPooledMinBytes up.
//
// Why: a new block above glibc's mmap threshold (which adapts up to 32 MiB)
// is a fresh mapping whose first touch faults in every 4 KiB page (16,384
// faults for 64 MiB, about half of such a call), unmapped again when it is
// freed. A block from this pool is mapped once, advised onto transparent
// huge pages, and comes back here when its last user drops it (the DLPack
// deleter of an output tensor, the end of a staged operation), so the next
// block of that size is already in memory. A training step hands the same
// sizes over every step (DDP's buckets, a model's gradients), so after the
// first step its blocks come from here.
//
// Bounds: sizes are rounded up to 2 MiB; idle blocks are kept up to
// kMaxIdleBytes (1 GiB) in all (beyond that a returned block is unmapped): memory a
// step had in use at once stays mapped between steps, up to that bound.
//
// Threads: acquire() and the release may run on any thread, with or
// without the GIL (the DLPack deleter runs wherever torch frees the
// tensor); a mutex guards the idle list. The pool is never destroyed: a
// tensor may outlive the interpreter's teardown.
#pragma once

#include <cstddef>
#include <memory>

namespace gyre::python {

// Blocks of at least this many bytes come from the pool.
inline constexpr std::size_t kPooledMinBytes = std::size_t{1} << 20;

// At least `bytes` bytes (not zeroed); the block returns to the pool when
// the last copy of the pointer is dropped. Throws std::bad_alloc.
std::shared_ptr<std::byte> acquire_host_block(std::size_t bytes);

// Blocks the pool has mapped so far (each mapped once, then reused): what
// the tests read to tell reuse from a new mapping.
std::size_t host_blocks_mapped();

}  // namespace gyre::python
