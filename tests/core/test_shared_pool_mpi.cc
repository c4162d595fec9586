// gyre::alloc_shared under mpirun (2 and 3 ranks on one host): buffers from
// the host's pool (GYRE_SHM_POOL_BYTES) reduced in place straight from one
// another (runtime_stats().pool_allreduces counts them), with the slots'
// results; every other case (a rank's buffer private, out of place, below
// 64 KiB) reduced through the slots, with the same results; the allocator's
// refusals.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <vector>

#include "gyre/error.h"
#include "gyre/gyre.h"
#include "mpi_session.h"

using namespace gyre;
using test::Session;
using test::test_options;

namespace {

Options pool_options(std::size_t bytes) {
  Options o = test_options();
  o.shm_pool_bytes = bytes;
  return o;
}

TensorView view(float* p, std::size_t n) {
  return TensorView{p, DataType::kFloat32, {static_cast<std::int64_t>(n)}};
}

void fill(float* p, std::size_t n, int r) {
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<float>(r + i % 7);
}

// Elements that are not the sum over ranks of fill()'s values.
std::size_t wrong_sums(const float* p, std::size_t n, int world = size()) {
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const int sum = world * (world - 1) / 2 + world * static_cast<int>(i % 7);
    const float want = static_cast<float>(sum);
    if (p[i] != want) ++wrong;
  }
  return wrong;
}

}  // namespace

TEST_CASE("alloc_shared buffers are reduced straight from one another", "[pool]") {
  Session s(pool_options(8u << 20));
  const std::size_t n = 300001;  // about 1.2 MB: several of the reduction's pieces
  auto* buf = static_cast<float*>(alloc_shared(n * sizeof(float)));
  REQUIRE(buf != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(buf) % 64 == 0);
  const std::uint64_t before = runtime_stats().pool_allreduces;
  for (int step = 0; step < 3; ++step) {
    fill(buf, n, rank());
    allreduce("pool.grad", view(buf, n), view(buf, n), ReduceOp::kSum);
    CHECK(wrong_sums(buf, n) == 0);
  }
  CHECK(runtime_stats().pool_allreduces == before + 3);
  // An average: the sum's 1/size folded in, as the slots' path does.
  fill(buf, n, rank());
  allreduce("pool.avg", view(buf, n), view(buf, n), ReduceOp::kAverage);
  std::vector<float> priv(n);
  fill(priv.data(), n, rank());
  allreduce("private.avg", view(priv.data(), n), view(priv.data(), n), ReduceOp::kAverage);
  CHECK(std::memcmp(buf, priv.data(), n * sizeof(float)) == 0);
  CHECK(runtime_stats().pool_allreduces == before + 4);
  free_shared(buf);
}

TEST_CASE("alloc_shared: a rank whose buffer is not in the pool, or a call out of place or "
          "small, goes through the slots with the same result", "[pool]") {
  Session s(pool_options(8u << 20));
  const std::size_t n = 100000;
  auto* buf = static_cast<float*>(alloc_shared(n * sizeof(float)));
  auto* other = static_cast<float*>(alloc_shared(n * sizeof(float)));
  REQUIRE(buf != nullptr);
  REQUIRE(other != nullptr);
  std::vector<float> priv(n);
  const std::uint64_t before = runtime_stats().pool_allreduces;
  // Rank 0's buffer is private, the others' are in the pool.
  float* mine = rank() == 0 ? priv.data() : buf;
  fill(mine, n, rank());
  allreduce("mixed", view(mine, n), view(mine, n), ReduceOp::kSum);
  CHECK(wrong_sums(mine, n) == 0);
  // Out of place, both buffers in the pool.
  fill(buf, n, rank());
  allreduce("out_of_place", view(buf, n), view(other, n), ReduceOp::kSum);
  CHECK(wrong_sums(other, n) == 0);
  // Below 64 KiB.
  fill(buf, 1000, rank());
  allreduce("small", view(buf, 1000), view(buf, 1000), ReduceOp::kSum);
  CHECK(wrong_sums(buf, 1000) == 0);
  CHECK(runtime_stats().pool_allreduces == before);
  free_shared(other);
  free_shared(buf);
}

TEST_CASE("alloc_shared: no pool, a full pool, a foreign pointer, before init", "[pool]") {
  {
    Session s(pool_options(0));
    CHECK(alloc_shared(4096) == nullptr);
    free_shared(nullptr);  // nothing to do
  }
  CHECK_THROWS_AS(alloc_shared(4096), StateError);
  Session s(pool_options(1u << 20));
  void* a = alloc_shared(1u << 20);
  REQUIRE(a != nullptr);
  // Full: the part holds the 1 MiB asked for, rounded up to whole pages.
  CHECK(alloc_shared(8192) == nullptr);
  int elsewhere = 0;
  CHECK_THROWS_AS(free_shared(&elsewhere), InvalidArgument);
  free_shared(a);
  CHECK(alloc_shared(64) != nullptr);
}

TEST_CASE("alloc_shared: a buffer outlives shutdown() until it is freed", "[pool]") {
  const std::size_t n = 100000;
  float* buf = nullptr;
  int world = 0;
  {
    Session s(pool_options(1u << 20));
    buf = static_cast<float*>(alloc_shared(n * sizeof(float)));
    REQUIRE(buf != nullptr);
    fill(buf, n, rank());
    allreduce("outlives", view(buf, n), view(buf, n), ReduceOp::kSum);
    world = size();
  }
  CHECK_FALSE(is_initialized());
  CHECK(wrong_sums(buf, n, world) == 0);  // still mapped, still the result
  buf[0] = 1.0f;                          // and writable
  free_shared(buf);
  CHECK_THROWS_AS(free_shared(buf), InvalidArgument);  // once only
}
