// The allreduce algorithms behind the public entry points of allreduce.cc,
// which validate the arguments, apply prescale (into `out`, so `src` may be
// `out`) and handle a world of one rank before calling them. `postscale`
// already includes average's 1/n.
#pragma once

#include <cstddef>

#include "gyre/collectives/algorithms.h"

namespace gyre::collectives::detail {

// Each requires t.size() >= 2 and count >= 1; `src` is `out` or disjoint
// from it.
void run_ring_allreduce(Transport& t, const std::byte* src, std::byte* out, std::size_t count,
                        DataType dt, ReduceOp op, double postscale, std::size_t chunk_bytes,
                        int tag);
void run_recursive_doubling(Transport& t, const std::byte* src, std::byte* out, std::size_t count,
                            DataType dt, ReduceOp op, double postscale, int tag);
void run_rabenseifner(Transport& t, const std::byte* src, std::byte* out, std::size_t count,
                      DataType dt, ReduceOp op, double postscale, std::size_t chunk_bytes,
                      int tag);

}  // namespace gyre::collectives::detail
