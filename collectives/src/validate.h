// Argument checks shared by the collective algorithms. Each throws
// gyre::InvalidArgument naming the algorithm and the offending argument; all
// of them run before the algorithm posts its first transfer.
#pragma once

#include <cstddef>
#include <span>

#include "gyre/collectives/algorithms.h"
#include "gyre/types.h"

namespace gyre::collectives::detail {

// The transport has a sane rank and size.
void check_world(const Transport& t, const char* algo);
// dt and op are known values, op is defined on dt and element-wise (not
// adasum).
void check_reduction(DataType dt, ReduceOp op, const char* algo);
// A known dtype.
void check_dtype(DataType dt, const char* algo);
// chunk_bytes > 0.
void check_chunk(std::size_t chunk_bytes, const char* algo);
// 0 <= tag < INT_MAX (the ring algorithms use tag and tag + 1).
void check_tag(int tag, const char* algo);
// prescale/postscale finite, and 1 on bool (scaling is not defined there).
void check_scaling(DataType dt, double prescale, double postscale, const char* algo);
// `p` is not null when `bytes` > 0.
void check_buffer(const void* p, std::size_t bytes, const char* name, const char* algo);
// [a, a+abytes) and [b, b+bbytes) are either the same start or disjoint.
void check_overlap(const void* a, std::size_t abytes, const void* b, std::size_t bbytes,
                   const char* aname, const char* bname, const char* algo);
// Whether the two byte ranges share at least one byte.
bool overlaps(const void* a, std::size_t abytes, const void* b, std::size_t bbytes);
// A per-rank span has exactly one entry per rank.
void check_per_rank(std::span<const std::size_t> v, int world, const char* name, const char* algo);
// Sum of the entries, refusing overflow of size_t.
std::size_t checked_sum(std::span<const std::size_t> v, std::size_t scale, const char* name,
                        const char* algo);
// count * elem_size without overflow.
std::size_t checked_bytes(std::size_t count, std::size_t elem_size, const char* algo);

}  // namespace gyre::collectives::detail
