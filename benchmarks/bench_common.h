// Shared pieces of the benchmarks: command-line values, closed-form buffer
// contents and their checks, the MPI peer, timing statistics.
//
// Threads: everything here runs on the benchmark's main thread. The MPI
// calls are the job's own (MPI_COMM_WORLD); gyre's transports use their own
// duplicated communicators, so the two never match each other's messages.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "gyre/types.h"

namespace gyre::bench {

// "8", "1K", "64M", "1G" (binary multiples). Throws InvalidArgument naming
// `what` when the text does not parse.
std::size_t parse_size(std::string_view what, std::string_view text);
long parse_int(std::string_view what, std::string_view text, long min);
// float32|float|float64|double|float16|half|bfloat16|int8|uint8|int32|int64
DataType parse_dtype(std::string_view text);
// sum|average|avg|min|max|prod|product
ReduceOp parse_op(std::string_view text);
// "1K" style rendering for headers.
std::string format_size(std::size_t bytes);

// MPI's datatype for `dt`, or MPI_DATATYPE_NULL when Open MPI has none
// (float16, bfloat16): the MPI columns then read "n/a".
MPI_Datatype mpi_datatype(DataType dt);

// The contents every benchmark uses, chosen so that every reduction is exact
// in every type (small integers, powers of two): rank r holds, at element i,
//   sum/average/min/max: (r + i) % n + i % 7
//   product:             1 + (r + i) % 2
// so the expected result is known in closed form without a reference run.
// `first` shifts i, so that consecutive tensors of a gradient set differ.
void fill_input(void* buf, std::size_t count, DataType dt, ReduceOp op, int rank, int world,
                std::size_t first = 0);
double expected_value(std::size_t i, ReduceOp op, int world);
// Elements of `buf` that differ from the expected result (a tolerance applies
// to average only, whose 1/n is rounded).
std::size_t count_wrong(const void* buf, std::size_t count, DataType dt, ReduceOp op, int world,
                        std::size_t first = 0);
// Fills with a byte pattern no reduction of fill_input() produces, so an
// operation that never writes its output is caught by count_wrong().
void poison(void* buf, std::size_t bytes);

// A page-aligned host buffer (so that neither system is favoured by
// alignment), touched once at allocation. With `huge_pages` it is allocated
// in whole 2 MiB pages and marked MADV_HUGEPAGE, as PyTorch does for tensors
// of 2 MiB and more under THP_MEM_ALLOC_ENABLE=1: the benchmarks' --hugepages.
class HostBuffer {
 public:
  HostBuffer(std::size_t bytes, bool huge_pages);
  ~HostBuffer();
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  std::byte* data() const { return p_; }

 private:
  std::byte* p_;
};

// The peer: MPI_Allreduce on MPI_COMM_WORLD. Average is MPI_SUM followed by
// one scaling pass by 1/n, which is counted in the time (gyre does the same
// work inside its collective). Requires mpi_datatype(dt) != MPI_DATATYPE_NULL.
void mpi_allreduce(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op);

// A wall-clock stopwatch in seconds.
double now_s();

// Statistics over samples (seconds); the input is copied, not reordered.
double median(std::vector<double> v);
double percentile(std::vector<double> v, double p);  // p in [0, 100]
double mean(const std::vector<double>& v);

// Element-wise maximum of `v` across the ranks of MPI_COMM_WORLD: a
// collective finishes when its slowest rank does.
std::vector<double> max_across_ranks(const std::vector<double>& v);

// nccl-tests' definitions: algbw = bytes / time (GB = 1e9 bytes);
// busbw = algbw * 2 (n - 1) / n for allreduce.
double algbw_gbs(std::size_t bytes, double seconds);
double allreduce_busbw_gbs(std::size_t bytes, double seconds, int world);

// Minimal JSON rendering for --json files.
std::string json_string(std::string_view s);
std::string json_number(double v);  // NaN/inf become null

}  // namespace gyre::bench
