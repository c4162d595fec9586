// The host's pool (shm_pool.h) with ranks as threads: the allocator's
// first fit, coalescing and refusals; shm_allreduce_registered on buffers in
// the pool gives shm_allreduce's bits for every dtype and op, 1..7 ranks,
// counts around the shares' lines and the reduction's pieces, scale
// factors; and it declines on every rank, leaving the buffers alone, when
// one rank's buffer is not in place or not in its part of the pool.
#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

#include "gyre/collectives/shm.h"
#include "gyre/collectives/shm_pool.h"
#include "gyre/error.h"
#include "test_support.h"

using namespace gyre;
using namespace gyre::collectives;

namespace {

using test::on_threads;
using test::Region;

// A pool of n parts of `part` bytes in one region, as ShmHost lays it out.
struct PoolRegion {
  PoolRegion(int n, std::size_t bytes)
      : part((bytes + kShmPoolAlign - 1) / kShmPoolAlign * kShmPoolAlign),
        region(static_cast<std::size_t>(n) * part) {
    pool = {region.p, part, n};
  }
  std::size_t part;
  Region region;
  ShmPool pool;
};

struct PoolCase {
  int n;
  std::size_t count;
  DataType dt;
  ReduceOp op;
  double prescale = 1.0, postscale = 1.0;
};

// Each rank's input at the same place in its part; the registered
// allreduce's result against shm_allreduce's of the same inputs, bit for
// bit, on every rank.
std::string run_pool_case(const PoolCase& c) {
  const std::size_t esz = dtype_size(c.dt), bytes = c.count * esz;
  std::vector<std::vector<std::byte>> in(static_cast<std::size_t>(c.n));
  for (int r = 0; r < c.n; ++r) {
    in[r].resize(bytes);
    for (std::size_t i = 0; i < c.count; ++i) {
      test::store(c.dt, in[r].data(), i, test::contribution(c.op, r, i));
    }
  }
  PoolRegion tp(c.n, kShmPoolHeader + bytes + 128);
  ShmOptions opt;
  opt.slot_bytes = 4096;
  opt.timeout = std::chrono::milliseconds(60000);
  Region region(ShmGroup::region_bytes(c.n, opt.slot_bytes));
  std::vector<std::vector<std::byte>> want(static_cast<std::size_t>(c.n));
  std::vector<int> reduced(static_cast<std::size_t>(c.n), -1);
  on_threads(c.n, [&](int r) {
    ShmGroup g(region.p, r, c.n, opt);
    // The reference: shm_allreduce through the slots, out of place.
    want[r].resize(bytes);
    shm_allreduce(g, in[r].data(), want[r].data(), c.count, c.dt, c.op, c.prescale,
                  c.postscale);
    std::byte* const buf = tp.pool.part(r) + kShmPoolHeader + 64;
    std::memcpy(buf, in[r].data(), bytes);
    reduced[r] = shm_allreduce_registered(g, tp.pool, buf, buf, c.count, c.dt, c.op, c.prescale,
                                          c.postscale);
  });
  for (int r = 0; r < c.n; ++r) {
    if (reduced[r] != 1) return "rank " + std::to_string(r) + " declined";
    if (std::memcmp(tp.pool.part(r) + kShmPoolHeader + 64, want[r].data(), bytes) != 0) {
      return "rank " + std::to_string(r) + ": not shm_allreduce's bits";
    }
  }
  return "";
}

}  // namespace

TEST_CASE("ShmPoolAllocator: first fit, alignment, coalescing, refusals", "[shm][pool]") {
  Region region(64 * 100);
  ShmPoolAllocator a(region.p, 64 * 100);
  CHECK(a.free_bytes() == 6400);
  CHECK(a.allocate(0) == nullptr);
  CHECK(a.allocate(6401) == nullptr);
  void* x = a.allocate(1);  // rounded up to 64
  void* y = a.allocate(100);  // 128
  void* z = a.allocate(64);
  REQUIRE(x != nullptr);
  REQUIRE(y != nullptr);
  REQUIRE(z != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(x) % kShmPoolAlign == 0);
  CHECK(static_cast<std::byte*>(y) == static_cast<std::byte*>(x) + 64);
  CHECK(static_cast<std::byte*>(z) == static_cast<std::byte*>(y) + 128);
  CHECK(a.free_bytes() == 6400 - 256);
  CHECK(a.contains(y, 128));
  CHECK_FALSE(a.contains(region.p + 6400 - 63, 64));
  // The rest is one range: nothing larger than it fits.
  CHECK(a.allocate(6400 - 256 + 1) == nullptr);
  // Freed x and y coalesce into one range of 192 bytes that a 192-byte
  // request takes whole (first fit, at x).
  a.release(y);
  a.release(x);
  CHECK(a.allocate(192) == x);
  a.release(x);
  a.release(z);
  CHECK(a.free_bytes() == 6400);
  void* all = a.allocate(6400);  // everything coalesced back into one range
  CHECK(all == region.p);
  CHECK_THROWS_AS(a.release(static_cast<std::byte*>(all) + 64), InvalidArgument);
  a.release(all);
  CHECK_THROWS_AS(a.release(all), InvalidArgument);  // twice
  int elsewhere = 0;
  CHECK_THROWS_AS(a.release(&elsewhere), InvalidArgument);
}

TEST_CASE("shm_allreduce_registered: shm_allreduce's bits, every dtype and op, 1..7 ranks",
          "[shm][pool]") {
  for (int n : {1, 2, 3, 4, 7}) {
    // Around one line per share, across the reduction's 128 KiB pieces.
    const std::size_t counts[] = {1, static_cast<std::size_t>(16 * n - 1), 1009,
                                  (128u << 10) / 4 * static_cast<std::size_t>(n) + 77};
    for (DataType dt : test::kAllTypes) {
      for (ReduceOp op : test::kAllOps) {
        if (!op_defined(dt, op)) continue;
        for (std::size_t count : counts) {
          if (count > 5000 && (dt != DataType::kFloat32 || op != ReduceOp::kSum) &&
              dt != DataType::kFloat64) {
            continue;  // the large count: two types are enough to cross pieces
          }
          PoolCase c{n, count, dt, op};
          INFO("n=" << n << " count=" << count << " dtype=" << dtype_name(dt)
                    << " op=" << op_name(op));
          CHECK(run_pool_case(c) == "");
        }
      }
    }
  }
}

TEST_CASE("shm_allreduce_registered: scale factors and average", "[shm][pool]") {
  for (int n : {2, 3, 5}) {
    for (DataType dt : {DataType::kFloat32, DataType::kFloat64, DataType::kBFloat16}) {
      PoolCase c{n, 3001, dt, ReduceOp::kSum, 0.5, 0.25};
      INFO("n=" << n << " dtype=" << dtype_name(dt));
      CHECK(run_pool_case(c) == "");
      PoolCase avg{n, 3001, dt, ReduceOp::kAverage};
      CHECK(run_pool_case(avg) == "");
    }
  }
}

TEST_CASE("shm_allreduce_registered: declines on every rank when one rank's buffer is not in "
          "place in its part", "[shm][pool]") {
  // Where rank `odd` puts its buffer: out of place, in another rank's part,
  // outside the pool, or not on a 64-byte boundary.
  enum class Odd { kOutOfPlace, kOthersPart, kOutside, kMisaligned };
  for (Odd odd : {Odd::kOutOfPlace, Odd::kOthersPart, Odd::kOutside, Odd::kMisaligned}) {
    const int n = 3;
    const std::size_t count = 4096, bytes = count * 4;
    PoolRegion tp(n, kShmPoolHeader + 2 * bytes + 128);
    ShmOptions opt;
    opt.slot_bytes = 4096;
    opt.timeout = std::chrono::milliseconds(60000);
    Region region(ShmGroup::region_bytes(n, opt.slot_bytes));
    std::vector<std::byte> outside(bytes + 64);
    std::vector<int> reduced(n, -1);
    std::vector<std::vector<std::byte>> before(n), after(n);
    on_threads(n, [&](int r) {
      ShmGroup g(region.p, r, n, opt);
      std::byte* buf = tp.pool.part(r) + kShmPoolHeader;
      const void* in = buf;
      if (r == 1) {
        if (odd == Odd::kOthersPart) buf = tp.pool.part(2) + kShmPoolHeader + bytes + 64;
        if (odd == Odd::kOutside) buf = outside.data();
        if (odd == Odd::kMisaligned) buf += 4;
        in = buf;
        if (odd == Odd::kOutOfPlace) in = buf + bytes;
      }
      for (std::size_t i = 0; i < count; ++i) {
        test::store(DataType::kFloat32, buf, i, static_cast<double>(r + i % 7));
      }
      before[r].assign(buf, buf + bytes);
      g.barrier();  // every rank's buffer written before any rank reads one
      reduced[r] = shm_allreduce_registered(g, tp.pool, in, buf, count, DataType::kFloat32,
                                            ReduceOp::kSum);
      g.barrier();
      after[r].assign(buf, buf + bytes);
    });
    INFO("case " << static_cast<int>(odd));
    for (int r = 0; r < n; ++r) {
      CHECK(reduced[r] == 0);
      CHECK(after[r] == before[r]);
    }
  }
}
