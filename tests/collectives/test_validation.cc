// Bad arguments give gyre::InvalidArgument naming the problem, on every rank
// that has them, before any transfer; nothing crashes or hangs.
#include <catch2/catch.hpp>

#include <vector>

#include "gyre/collectives/algorithms.h"
#include "gyre/collectives/local_transport.h"
#include "gyre/error.h"

using namespace gyre;
using namespace gyre::collectives;
using gyre::transport::run_local_world;
using Catch::Contains;

namespace {

constexpr std::chrono::milliseconds kValidationTimeout{20000};

// Runs `fn` on every rank of a 3-rank world and returns the message of the
// InvalidArgument it must throw (the test fails if it throws anything else).
template <class F>
std::string invalid(F fn) {
  try {
    run_local_world(3, [&](transport::Transport& t) { fn(t); }, kValidationTimeout);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "<no InvalidArgument>";
}

}  // namespace

TEST_CASE("ring_allreduce rejects bad arguments", "[validation]") {
  std::vector<float> buf(10);
  std::vector<std::int32_t> ints(10);
  CHECK_THAT(invalid([&](auto& t) { ring_allreduce(t, nullptr, buf.data(), 10, DataType::kFloat32, ReduceOp::kSum); }),
             Contains("ring_allreduce") && Contains("input buffer is null"));
  CHECK_THAT(invalid([&](auto& t) { ring_allreduce(t, buf.data(), nullptr, 10, DataType::kFloat32, ReduceOp::kSum); }),
             Contains("output buffer is null"));
  CHECK_THAT(invalid([&](auto& t) { ring_allreduce(t, ints.data(), ints.data(), 10, DataType::kBool, ReduceOp::kAverage); }),
             Contains("'average' is not defined for dtype bool"));
  CHECK_THAT(invalid([&](auto& t) { ring_allreduce(t, buf.data(), buf.data(), 10, static_cast<DataType>(42), ReduceOp::kSum); }),
             Contains("unknown dtype"));
  CHECK_THAT(invalid([&](auto& t) { ring_allreduce(t, buf.data(), buf.data(), 10, DataType::kFloat32, static_cast<ReduceOp>(9)); }),
             Contains("unknown reduce op"));
  CHECK_THAT(invalid([&](auto& t) {
               RingAllreduceOptions o;
               o.chunk_bytes = 0;
               ring_allreduce(t, buf.data(), buf.data(), 10, DataType::kFloat32, ReduceOp::kSum, o);
             }),
             Contains("chunk_bytes"));
  CHECK_THAT(invalid([&](auto& t) {
               RingAllreduceOptions o;
               o.postscale = 2.0;
               ring_allreduce(t, ints.data(), ints.data(), 10, DataType::kBool, ReduceOp::kSum, o);
             }),
             Contains("scaling is not defined for bool"));
  CHECK_THAT(invalid([&](auto& t) { ring_allreduce(t, buf.data(), buf.data(), 10, DataType::kFloat32, ReduceOp::kAdasum); }),
             Contains("adasum_allreduce"));
  CHECK_THAT(invalid([&](auto& t) { ring_allreduce(t, buf.data(), buf.data() + 1, 5, DataType::kFloat32, ReduceOp::kSum); }),
             Contains("overlap"));
  // Null buffers with a zero count are fine.
  CHECK_NOTHROW(run_local_world(3, [&](transport::Transport& t) {
    ring_allreduce(t, nullptr, nullptr, 0, DataType::kFloat32, ReduceOp::kSum);
  }, kValidationTimeout));
}

TEST_CASE("allgather, broadcast, reduce-scatter, alltoall reject bad arguments", "[validation]") {
  std::vector<std::byte> buf(64);
  const std::vector<std::size_t> three = {4, 4, 4}, two = {4, 4};
  CHECK_THAT(invalid([&](auto& t) { ring_allgather(t, buf.data(), buf.data() + 32, two); }),
             Contains("block_bytes has 2 entries but the world has 3 ranks"));
  CHECK_THAT(invalid([&](auto& t) { ring_allgather(t, nullptr, buf.data(), three); }),
             Contains("input buffer is null"));
  CHECK_THAT(invalid([&](auto& t) { ring_allgather(t, buf.data() + 1, buf.data(), three); }),
             Contains("not this rank's block"));
  CHECK_THAT(invalid([&](auto& t) { ring_broadcast(t, buf.data(), 8, 3); }),
             Contains("root 3 is outside the world of 3 ranks"));
  CHECK_THAT(invalid([&](auto& t) { ring_broadcast(t, buf.data(), 8, -1); }), Contains("root -1"));
  CHECK_THAT(invalid([&](auto& t) { ring_broadcast(t, nullptr, 8, 0); }), Contains("buffer is null"));
  CHECK_THAT(invalid([&](auto& t) {
               ring_reduce_scatter(t, buf.data(), buf.data() + 48, two, DataType::kFloat32, ReduceOp::kSum);
             }),
             Contains("counts has 2 entries"));
  CHECK_THAT(invalid([&](auto& t) {
               ring_reduce_scatter(t, buf.data(), buf.data(), three, DataType::kBool, ReduceOp::kAverage);
             }),
             Contains("not defined for dtype bool"));
  CHECK_THAT(invalid([&](auto& t) {
               ring_reduce_scatter(t, buf.data(), buf.data() + 1, three, DataType::kFloat32, ReduceOp::kSum);
             }),
             Contains("output overlaps the input"));
  CHECK_THAT(invalid([&](auto& t) { alltoall(t, buf.data(), three, buf.data() + 32, two); }),
             Contains("recv_bytes has 2 entries"));
  CHECK_THAT(invalid([&](auto& t) { alltoall(t, buf.data(), three, buf.data() + 4, three); }),
             Contains("overlap"));
  CHECK_THAT(invalid([&](auto& t) {
               std::vector<std::size_t> recv = three;
               recv[static_cast<std::size_t>(t.rank())] = 5;  // what this rank sends itself must match
               alltoall(t, buf.data(), three, buf.data() + 32, recv);
             }),
             Contains("to itself"));
}

TEST_CASE("a rank with bad arguments does not leave its peers hanging", "[validation]") {
  // Only rank 1 passes a null buffer: it throws before sending anything; the
  // in-process world then releases the others, and the first error is the
  // InvalidArgument.
  std::vector<float> bufs[3] = {std::vector<float>(100), std::vector<float>(100), std::vector<float>(100)};
  CHECK_THROWS_AS(run_local_world(3, [&](transport::Transport& t) {
    float* p = t.rank() == 1 ? nullptr : bufs[t.rank()].data();
    ring_allreduce(t, p, p, 100, DataType::kFloat32, ReduceOp::kSum);
  }, kValidationTimeout), InvalidArgument);
}
