// The shared-memory collectives with ranks as threads over one region.
// shm_allreduce: every dtype and op, 1..8 ranks, awkward counts, chunks down
// to one cache line, in place and out of place, scale factors, bit-identical
// results on every rank; allgather, broadcast, reduce-scatter and all-to-all
// with uneven sizes; a rank that stops coming is a TimeoutError naming it,
// a rank that fails wakes the rest, also when the waiters sleep in the
// kernel. shm_allreduce_pieces: a fused bucket gathered from its members
// gives the bits of the packed bucket.
#include <catch2/catch.hpp>

#include <sys/statvfs.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <array>
#include <atomic>
#include <functional>
#include <thread>
#include <typeinfo>
#include <vector>

#include "gyre/collectives/algorithms.h"
#include "gyre/collectives/local_transport.h"
#include "gyre/collectives/reduce_kernels.h"
#include "gyre/collectives/shm.h"
#include "gyre/error.h"
#include "test_support.h"

using namespace gyre;
using namespace gyre::collectives;

namespace {

using test::on_threads;
using test::Region;

// Runs fn(group) on n threads over one region; rethrows the first exception.
template <class Fn>
void run_group(int n, const ShmOptions& opt, Fn fn) {
  Region region(ShmGroup::region_bytes(n, opt.slot_bytes));
  on_threads(n, [&](int r) {
    ShmGroup g(region.p, r, n, opt);
    fn(g);
  });
}

struct Case {
  int n;
  std::size_t count;
  DataType dt;
  ReduceOp op;
  bool in_place;
  std::size_t slot_bytes = 4096;
  double prescale = 1.0, postscale = 1.0;
  std::chrono::microseconds spin{100};  // ShmOptions::spin
};

std::string run_case(const Case& c) {
  const std::size_t esz = dtype_size(c.dt);
  std::vector<std::vector<std::byte>> in(c.n), out(c.n);
  for (int r = 0; r < c.n; ++r) {
    in[r].resize(c.count * esz);
    for (std::size_t i = 0; i < c.count; ++i) {
      test::store(c.dt, in[r].data(), i, test::contribution(c.op, r, i));
    }
    out[r] = c.in_place ? in[r] : std::vector<std::byte>(c.count * esz, std::byte{0x5a});
  }
  ShmOptions opt;
  opt.slot_bytes = c.slot_bytes;
  opt.timeout = std::chrono::milliseconds(60000);
  opt.spin = c.spin;
  run_group(c.n, opt, [&](ShmGroup& g) {
    auto& o = out[g.rank()];
    const void* src = c.in_place ? o.data() : in[g.rank()].data();
    shm_allreduce(g, src, o.data(), c.count, c.dt, c.op, c.prescale, c.postscale);
  });
  const bool scaled = c.op == ReduceOp::kAverage || c.prescale != 1.0 || c.postscale != 1.0;
  const double tol = scaled ? test::scaled_tolerance(c.dt) : 0.0;
  double factor = c.postscale;
  if (c.op != ReduceOp::kProduct) factor *= c.prescale;
  for (int r = 0; r < c.n; ++r) {
    for (std::size_t i = 0; i < c.count; ++i) {
      const double want = test::expected(c.dt, c.op, c.n, i) * factor;
      const double got = test::load(c.dt, out[r].data(), i);
      if (!test::close_enough(got, want, tol)) {
        return "rank " + std::to_string(r) + " element " + std::to_string(i) + ": got " +
               std::to_string(got) + ", want " + std::to_string(want);
      }
    }
    if (out[r] != out[0]) return "rank " + std::to_string(r) + " differs from rank 0 in some bits";
  }
  return "";
}

std::string describe(const Case& c) {
  return "n=" + std::to_string(c.n) + " count=" + std::to_string(c.count) + " dtype=" +
         std::string(dtype_name(c.dt)) + " op=" + std::string(op_name(c.op)) +
         (c.in_place ? " in-place" : " out-of-place") + " slot=" + std::to_string(c.slot_bytes);
}

}  // namespace

TEST_CASE("shm_allreduce: every dtype and op, 1..8 ranks, awkward counts", "[shm]") {
  for (int n = 1; n <= 8; ++n) {
    // Counts below, at and above one chunk (4096-byte slots), and a prime.
    const std::size_t counts[] = {0, 1, static_cast<std::size_t>(n + 1), 1009, 5003};
    for (DataType dt : test::kAllTypes) {
      for (ReduceOp op : test::kAllOps) {
        if (!op_defined(dt, op)) continue;
        for (std::size_t count : counts) {
          for (bool in_place : {false, true}) {
            Case c{n, count, dt, op, in_place};
            INFO(describe(c));
            CHECK(run_case(c) == "");
          }
        }
      }
    }
  }
}

TEST_CASE("shm_allreduce: slots of one cache line, large buffers, scale factors", "[shm]") {
  for (int n : {2, 3, 4}) {
    Case tiny{n, 777, DataType::kFloat32, ReduceOp::kSum, false, 64};
    INFO(describe(tiny));
    CHECK(run_case(tiny) == "");
    Case large{n, 3'000'001, DataType::kFloat32, ReduceOp::kSum, true, 256u << 10};
    INFO(describe(large));
    CHECK(run_case(large) == "");
    Case scaled{n, 10'007, DataType::kFloat64, ReduceOp::kAverage, false, 8192, 0.5, 3.0};
    INFO(describe(scaled));
    CHECK(run_case(scaled) == "");
  }
}

TEST_CASE("shm_allreduce: bool scale factors are refused on every rank before any wait",
          "[shm]") {
  ShmOptions opt;
  opt.timeout = std::chrono::milliseconds(10000);
  std::vector<std::uint8_t> buf(10, 1);
  CHECK_THROWS_AS(run_group(2, opt, [&](ShmGroup& g) {
    std::vector<std::uint8_t> mine = buf;
    shm_allreduce(g, mine.data(), mine.data(), mine.size(), DataType::kBool, ReduceOp::kSum,
                  2.0, 1.0);
  }), InvalidArgument);
}

TEST_CASE("shm_allreduce: integer prescale and postscale truncate as Horovod's", "[shm]") {
  ShmOptions opt;
  opt.timeout = std::chrono::milliseconds(10000);
  std::vector<std::vector<std::int32_t>> out(3);
  run_group(3, opt, [&](ShmGroup& g) {
    // Rank r holds 5 + r: prescale 0.5 gives 2, 3, 3 (truncated), sum 8,
    // postscale 0.75 gives 6.
    std::vector<std::int32_t> mine(7, 5 + g.rank());
    shm_allreduce(g, mine.data(), mine.data(), mine.size(), DataType::kInt32, ReduceOp::kSum,
                  0.5, 0.75);
    out[static_cast<std::size_t>(g.rank())] = mine;
  });
  for (const auto& o : out) CHECK(o == std::vector<std::int32_t>(7, 6));
}

TEST_CASE("shm_allreduce: waiting ranks that sleep at once (no polling) get the same results",
          "[shm]") {
  // spin 0: every wait for a late peer goes to the futex, the path taken
  // with more local ranks than cores. One-line slots: thousands of barriers.
  for (int n : {2, 3, 5, 8}) {
    for (DataType dt : {DataType::kFloat32, DataType::kInt64, DataType::kFloat16}) {
      Case c{n, 20'011, dt, ReduceOp::kSum, n % 2 == 0, 64};
      c.spin = std::chrono::microseconds(0);
      INFO(describe(c));
      CHECK(run_case(c) == "");
    }
  }
}

TEST_CASE("shm group: a sleeping waiter is woken by the arrival it waits for", "[shm]") {
  // No timeout and no polling: a waiter sleeps without limit. After each
  // barrier neither rank goes on before its peer has passed it too, so no
  // later arrival can rescue a sleeper whose wake-up was lost: that peer
  // would wait here until the watchdog fails the group (and the test).
  ShmOptions opt;
  opt.spin = std::chrono::microseconds(0);
  opt.timeout = std::chrono::milliseconds(0);
  constexpr int kBarriers = 20'000;
  std::array<std::atomic<int>, 2> passed{};
  std::array<std::string, 2> lost;
  run_group(2, opt, [&](ShmGroup& g) {
    const int me = g.rank(), peer = 1 - me;
    for (int i = 0; i < kBarriers; ++i) {
      if (i % 2 == me) std::this_thread::yield();  // each rank is the late one in turn
      try {
        g.barrier();
      } catch (const TransportError&) {
        return;  // the peer's watchdog failed the group
      }
      passed[static_cast<std::size_t>(me)].store(i + 1);
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (passed[static_cast<std::size_t>(peer)].load() < i + 1) {
        if (std::chrono::steady_clock::now() > give_up) {
          lost[static_cast<std::size_t>(me)] =
              "rank " + std::to_string(peer) + " still waits in barrier " + std::to_string(i + 1);
          g.fail();
          return;
        }
        std::this_thread::yield();
      }
    }
  });
  CHECK(lost[0] == "");
  CHECK(lost[1] == "");
  CHECK(passed[0].load() == kBarriers);
  CHECK(passed[1].load() == kBarriers);
}

TEST_CASE("shm group: a rank that never arrives is a TimeoutError naming it on every waiting rank",
          "[shm]") {
  ShmOptions opt;
  opt.timeout = std::chrono::milliseconds(200);
  std::vector<std::string> seen(3);
  run_group(3, opt, [&](ShmGroup& g) {
    if (g.rank() == 2) return;  // never takes part
    // Rank 1 starts later, so rank 0 gives up first and rank 1 learns of
    // it from the group rather than from its own deadline.
    if (g.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::vector<float> v(100, 1.0f);
    try {
      shm_allreduce(g, v.data(), v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
      seen[static_cast<std::size_t>(g.rank())] = "completed";
    } catch (const TimeoutError& e) {
      seen[static_cast<std::size_t>(g.rank())] = e.what();
    }
  });
  // The rank that gives up first and the one that sees its failure both
  // name rank 2, not each other.
  for (int r : {0, 1}) {
    INFO("rank " << r << ": " << seen[static_cast<std::size_t>(r)]);
    CHECK_THAT(seen[static_cast<std::size_t>(r)], Catch::Contains("local rank(s) 2 to reach"));
  }
}

TEST_CASE("shm group: a rank that fails wakes the ranks waiting for it", "[shm]") {
  ShmOptions opt;
  opt.timeout = std::chrono::milliseconds(0);  // no deadline: only fail() can end the wait
  opt.spin = std::chrono::microseconds(0);     // rank 0 sleeps in the kernel until woken
  CHECK_THROWS_WITH(run_group(2, opt, [&](ShmGroup& g) {
    if (g.rank() == 1) {
      // Late enough that rank 0 is asleep (the wake-up, not a poll, ends its wait).
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      g.fail();
      throw TransportError("rank 1 gave up");
    }
    g.barrier();
  }), Catch::Contains("local rank 1 failed"));
}

TEST_CASE("shm segment: one larger than the room in /dev/shm fails at creation, leaving no name",
          "[shm]") {
  struct statvfs fs{};
  REQUIRE(::statvfs("/dev/shm", &fs) == 0);
  const std::size_t room = static_cast<std::size_t>(fs.f_bavail) * fs.f_frsize;
  const std::string name = "/gyre-test-big-" + std::to_string(::getpid());
  // Without allocating the pages at creation this would succeed and fault
  // (SIGBUS) at the first write past the room.
  CHECK_THROWS_WITH(ShmSegment::create(name, room + (std::size_t{1} << 30)),
                    Catch::Contains("posix_fallocate"));
  CHECK_THROWS_AS(ShmSegment::open(name, 1), TransportError);
}

TEST_CASE("shm segment: created exclusively, mapped by name, gone after unlink", "[shm]") {
  const std::string name = "/gyre-test-" + std::to_string(::getpid());
  ShmSegment a = ShmSegment::create(name, 1 << 16);
  CHECK_THROWS_AS(ShmSegment::create(name, 1 << 16), TransportError);
  ShmSegment b = ShmSegment::open(name, 1 << 16);
  static_cast<char*>(a.data())[100] = 42;
  CHECK(static_cast<char*>(b.data())[100] == 42);
  a.unlink();
  CHECK_THROWS_AS(ShmSegment::open(name, 1 << 16), TransportError);
  CHECK(static_cast<char*>(b.data())[100] == 42);  // mappings outlive the name
}

namespace {

std::byte slot_pattern(int rank, std::size_t i) {
  return static_cast<std::byte>((rank * 31 + i * 7 + 1) & 0xff);
}

ShmOptions small_slots(std::size_t bytes) {
  ShmOptions opt;
  opt.slot_bytes = bytes;
  opt.timeout = std::chrono::milliseconds(60000);
  return opt;
}

}  // namespace

TEST_CASE("shm_allgather: blocks of different sizes, zero-sized ones, in place", "[shm]") {
  for (int n = 1; n <= 5; ++n) {
    for (bool in_place : {false, true}) {
      std::vector<std::size_t> blocks(n);
      for (int r = 0; r < n; ++r) blocks[r] = (r * 997 + 13) % 3001 * (r % 3 != 1);
      std::size_t total = 0;
      for (auto b : blocks) total += b;
      std::vector<std::vector<std::byte>> out(n, std::vector<std::byte>(total, std::byte{0}));
      run_group(n, small_slots(256), [&](ShmGroup& g) {
        const int r = g.rank();
        std::size_t off = 0;
        for (int q = 0; q < r; ++q) off += blocks[q];
        std::vector<std::byte> mine(blocks[r]);
        for (std::size_t i = 0; i < blocks[r]; ++i) mine[i] = slot_pattern(r, i);
        if (in_place) std::copy(mine.begin(), mine.end(), out[r].begin() + off);
        shm_allgather(g, in_place ? out[r].data() + off : mine.data(), out[r].data(), blocks);
      });
      for (int r = 0; r < n; ++r) {
        std::size_t at = 0;
        for (int q = 0; q < n; ++q) {
          for (std::size_t i = 0; i < blocks[q]; ++i, ++at) {
            INFO("n=" << n << " rank " << r << " block " << q << " byte " << i);
            REQUIRE(out[r][at] == slot_pattern(q, i));
          }
        }
      }
    }
  }
}

TEST_CASE("shm_broadcast: every root, sizes around the slot", "[shm]") {
  for (int n : {1, 2, 3, 4}) {
    for (int root = 0; root < n; ++root) {
      for (std::size_t bytes : {0u, 1u, 255u, 256u, 257u, 10000u}) {
        std::vector<std::vector<std::byte>> buf(n, std::vector<std::byte>(bytes));
        for (int r = 0; r < n; ++r) {
          for (std::size_t i = 0; i < bytes; ++i) buf[r][i] = slot_pattern(r, i);
        }
        run_group(n, small_slots(256), [&](ShmGroup& g) {
          shm_broadcast(g, buf[g.rank()].data(), bytes, root);
        });
        for (int r = 0; r < n; ++r) {
          INFO("n=" << n << " root " << root << " bytes " << bytes << " rank " << r);
          CHECK(buf[r] == buf[root]);
          for (std::size_t i = 0; i < bytes; ++i) REQUIRE(buf[r][i] == slot_pattern(root, i));
        }
      }
    }
  }
}

TEST_CASE("shm_reduce_scatter: every dtype and op, uneven blocks, in place", "[shm]") {
  for (int n = 1; n <= 4; ++n) {
    std::vector<std::size_t> counts(n);
    for (int r = 0; r < n; ++r) counts[r] = 100 + 37 * r + (r == 1 ? 0 : 1);
    std::size_t total = 0;
    for (auto c : counts) total += c;
    for (DataType dt : test::kAllTypes) {
      for (ReduceOp op : test::kAllOps) {
        if (!op_defined(dt, op)) continue;
        for (bool in_place : {false, true}) {
          const std::size_t esz = dtype_size(dt);
          std::vector<std::vector<std::byte>> in(n, std::vector<std::byte>(total * esz));
          std::vector<std::vector<std::byte>> out(n);
          std::vector<std::size_t> first(n + 1, 0);
          for (int r = 0; r < n; ++r) {
            first[r + 1] = first[r] + counts[r];
            out[r].assign(counts[r] * esz, std::byte{0x5a});
            for (std::size_t i = 0; i < total; ++i) test::store(dt, in[r].data(), i, test::contribution(op, r, i));
          }
          run_group(n, small_slots(512), [&](ShmGroup& g) {
            const int r = g.rank();
            void* o = in_place ? in[r].data() + first[r] * esz : out[r].data();
            shm_reduce_scatter(g, in[r].data(), o, counts, dt, op);
          });
          const double tol = op == ReduceOp::kAverage ? test::scaled_tolerance(dt) : 0.0;
          for (int r = 0; r < n; ++r) {
            const std::byte* got = in_place ? in[r].data() + first[r] * esz : out[r].data();
            for (std::size_t i = 0; i < counts[r]; ++i) {
              INFO("n=" << n << " " << dtype_name(dt) << " " << op_name(op) << " rank " << r
                        << " element " << i << (in_place ? " in place" : ""));
              REQUIRE(test::close_enough(test::load(dt, got, i),
                                         test::expected(dt, op, n, first[r] + i), tol));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("shm_alltoall: uneven splits, zero-sized pairs, sub-slots smaller than a message",
          "[shm]") {
  for (int n = 1; n <= 4; ++n) {
    // Rank p sends (p * 3 + q * 5) % 11 * 40 bytes to rank q.
    auto amount = [](int p, int q) { return static_cast<std::size_t>((p * 3 + q * 5) % 11 * 40); };
    std::size_t max_pair = 0;
    for (int p = 0; p < n; ++p)
      for (int q = 0; q < n; ++q) max_pair = std::max(max_pair, amount(p, q));
    std::vector<std::vector<std::byte>> out(n);
    run_group(n, small_slots(64 * 4), [&](ShmGroup& g) {
      const int r = g.rank();
      std::vector<std::size_t> send(n), recv(n);
      std::vector<std::byte> in;
      for (int q = 0; q < n; ++q) {
        send[q] = amount(r, q);
        recv[q] = amount(q, r);
        for (std::size_t i = 0; i < send[q]; ++i) in.push_back(slot_pattern(r * 16 + q, i));
      }
      std::size_t total = 0;
      for (auto b : recv) total += b;
      out[r].assign(total, std::byte{0});
      shm_alltoall(g, in.data(), send, out[r].data(), recv, max_pair);
    });
    for (int r = 0; r < n; ++r) {
      std::size_t at = 0;
      for (int q = 0; q < n; ++q) {
        for (std::size_t i = 0; i < amount(q, r); ++i, ++at) {
          INFO("n=" << n << " rank " << r << " from " << q << " byte " << i);
          REQUIRE(out[r][at] == slot_pattern(q * 16 + r, i));
        }
      }
    }
  }
}

TEST_CASE("shm_reduce_slots: data already in every slot is reduced in place into all of them",
          "[shm]") {
  for (int n : {1, 2, 3, 4}) {
    const std::size_t count = 1000;
    ShmOptions opt = small_slots(count * sizeof(double));
    std::vector<std::vector<double>> seen(n);
    run_group(n, opt, [&](ShmGroup& g) {
      auto* mine = reinterpret_cast<double*>(g.slot(g.rank()));
      for (std::size_t i = 0; i < count; ++i) mine[i] = test::contribution(ReduceOp::kSum, g.rank(), i);
      shm_reduce_slots(g, count, DataType::kFloat64, ReduceOp::kSum);
      seen[g.rank()].assign(mine, mine + count);
    });
    for (int r = 0; r < n; ++r) {
      for (std::size_t i = 0; i < count; ++i) {
        INFO("n=" << n << " rank " << r << " element " << i);
        REQUIRE(seen[r][i] == test::expected(ReduceOp::kSum, n, i));
      }
    }
  }
}

// Hosts x ranks as threads: one shared region per host, one LocalTransport
// world per local rank across the hosts.
TEST_CASE("hierarchical_allreduce: every dtype and op against the closed form, 2x2, 3x2, 2x3",
          "[shm][hierarchical]") {
  for (auto [hosts, per_host] : {std::pair{2, 2}, std::pair{3, 2}, std::pair{2, 3}, std::pair{1, 3}}) {
    const int n = hosts * per_host;
    for (DataType dt : test::kAllTypes) {
      for (ReduceOp op : test::kAllOps) {
        if (!op_defined(dt, op)) continue;
        for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{5003}}) {
          const std::size_t esz = dtype_size(dt);
          ShmOptions opt = small_slots(1024);
          std::vector<std::unique_ptr<Region>> regions;
          for (int h = 0; h < hosts; ++h) {
            regions.push_back(std::make_unique<Region>(ShmGroup::region_bytes(per_host, opt.slot_bytes)));
          }
          std::vector<std::shared_ptr<transport::LocalWorld>> cross;
          for (int l = 0; l < per_host; ++l) cross.push_back(transport::make_local_world(hosts));
          std::vector<std::vector<std::byte>> buf(n, std::vector<std::byte>(count * esz));
          // Host-major ranks: rank r is local rank r % per_host of host r / per_host.
          for (int r = 0; r < n; ++r) {
            for (std::size_t i = 0; i < count; ++i) test::store(dt, buf[r].data(), i, test::contribution(op, r, i));
          }
          on_threads(n, [&](int r) {
            const int host = r / per_host, local = r % per_host;
            ShmGroup g(regions[host]->p, local, per_host, opt);
            transport::LocalTransport t(cross[local], host);
            t.set_timeout(std::chrono::milliseconds(60000));
            AllreduceOptions co;
            co.chunk_bytes = 512;
            co.small_bytes = 64;
            hierarchical_allreduce(g, t, buf[r].data(), buf[r].data(), count, dt, op, 1.0, 1.0, co);
          });
          const double tol = op == ReduceOp::kAverage ? test::scaled_tolerance(dt) : 0.0;
          for (int r = 0; r < n; ++r) {
            for (std::size_t i = 0; i < count; ++i) {
              INFO(hosts << "x" << per_host << " " << dtype_name(dt) << " " << op_name(op) << " count "
                         << count << " rank " << r << " element " << i);
              REQUIRE(test::close_enough(test::load(dt, buf[r].data(), i), test::expected(dt, op, n, i), tol));
            }
          }
        }
      }
    }
  }
}

namespace {

// One hierarchical allreduce over hosts x ranks as threads (host-major
// ranks), `pieces` pieces; input element i of rank r is value(r, i). Returns
// every rank's output; `errors[r]` (when given) receives what rank r threw
// instead of rethrowing it.
struct HierCase {
  int hosts, per_host;
  std::size_t count;
  DataType dt;
  ReduceOp op;
  std::size_t pieces;
  bool in_place = true;
  std::size_t slot_bytes = 1024;
  int absent = -1;  // this rank marks its host's group failed and does not call
};
template <class Value>
std::vector<std::vector<std::byte>> run_hierarchical(
    const HierCase& c, Value value, std::vector<std::string>* errors = nullptr,
    const std::function<void(std::vector<std::shared_ptr<transport::LocalWorld>>&)>& before = {}) {
  const int n = c.hosts * c.per_host;
  const std::size_t esz = dtype_size(c.dt);
  ShmOptions opt = small_slots(c.slot_bytes);
  std::vector<std::unique_ptr<Region>> regions;
  for (int h = 0; h < c.hosts; ++h) {
    regions.push_back(std::make_unique<Region>(ShmGroup::region_bytes(c.per_host, opt.slot_bytes)));
  }
  std::vector<std::shared_ptr<transport::LocalWorld>> cross;
  for (int l = 0; l < c.per_host; ++l) cross.push_back(transport::make_local_world(c.hosts));
  if (before) before(cross);
  std::vector<std::vector<std::byte>> in(n, std::vector<std::byte>(c.count * esz));
  for (int r = 0; r < n; ++r) {
    for (std::size_t i = 0; i < c.count; ++i) test::store(c.dt, in[r].data(), i, value(r, i));
  }
  std::vector<std::vector<std::byte>> out =
      c.in_place ? in : std::vector<std::vector<std::byte>>(n, std::vector<std::byte>(c.count * esz, std::byte{0x5a}));
  const std::vector<std::vector<std::byte>> original = in;
  if (errors) errors->assign(n, "");
  on_threads(n, [&](int r) {
    const int host = r / c.per_host, local = r % c.per_host;
    try {
      ShmGroup g(regions[host]->p, local, c.per_host, opt);
      if (r == c.absent) {
        g.fail();
        return;
      }
      transport::LocalTransport t(cross[local], host);
      t.set_timeout(std::chrono::milliseconds(60000));
      AllreduceOptions co;
      co.chunk_bytes = 512;
      co.small_bytes = 64;
      const void* src = c.in_place ? out[r].data() : in[r].data();
      hierarchical_allreduce(g, t, src, out[r].data(), c.count, c.dt, c.op, 1.0, 1.0, co, c.pieces);
    } catch (const std::exception& e) {
      if (!errors) throw;
      (*errors)[r] = std::string(typeid(e).name()) + ": " + e.what();
    }
  });
  if (!c.in_place) {
    for (int r = 0; r < n; ++r) {
      if (in[r] != original[r]) throw std::runtime_error("input of rank " + std::to_string(r) + " changed");
    }
  }
  return out;
}

}  // namespace

TEST_CASE("hierarchical_allreduce pipelined: the closed form in 3 and 16 pieces, in and out "
          "of place, every rank the same bits",
          "[shm][hierarchical][pipeline]") {
  for (auto [hosts, per_host] : {std::pair{2, 2}, std::pair{3, 2}, std::pair{2, 3}}) {
    const int n = hosts * per_host;
    for (DataType dt : {DataType::kFloat32, DataType::kFloat64, DataType::kInt32, DataType::kFloat16}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
        if (!op_defined(dt, op)) continue;
        // 0 and 1 element (fewer than a piece per shard: one piece), 7, and
        // enough for 16 pieces of several ring chunks each.
        for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{20011}}) {
          for (std::size_t pieces : {3, 16}) {
            for (bool in_place : {true, false}) {
              INFO(hosts << "x" << per_host << " " << dtype_name(dt) << " " << op_name(op) << " count "
                         << count << " pieces " << pieces << (in_place ? " in place" : " out of place"));
              HierCase c{hosts, per_host, count, dt, op, pieces, in_place};
              auto out = run_hierarchical(c, [&](int r, std::size_t i) { return test::contribution(op, r, i); });
              const double tol = op == ReduceOp::kAverage ? test::scaled_tolerance(dt) : 0.0;
              for (int r = 0; r < n; ++r) {
                REQUIRE(out[r] == out[0]);
                std::size_t wrong = 0, first_wrong = 0;
                for (std::size_t i = 0; i < count; ++i) {
                  if (!test::close_enough(test::load(dt, out[r].data(), i), test::expected(dt, op, n, i), tol)) {
                    if (wrong++ == 0) first_wrong = i;
                  }
                }
                INFO("rank " << r << ", first wrong element " << first_wrong);
                REQUIRE(wrong == 0);
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("hierarchical_allreduce pipelined: at 2 hosts the bits of the unpipelined call",
          "[shm][hierarchical][pipeline]") {
  // Fractions no binary type holds exactly: equal bits mean the same order
  // of additions (the shm reduce-scatter's rank order, then one addition of
  // the two hosts' partial sums, wherever the piece boundaries fall).
  for (DataType dt : {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16}) {
    auto value = [](int r, std::size_t i) { return 0.1 * static_cast<double>((i * 7 + r * 13) % 10) + r; };
    HierCase one{2, 3, 30011, dt, ReduceOp::kSum, 1};
    const auto want = run_hierarchical(one, value);
    for (std::size_t pieces : {2, 5, 64}) {
      INFO(dtype_name(dt) << " pieces " << pieces);
      HierCase c = one;
      c.pieces = pieces;
      CHECK(run_hierarchical(c, value) == want);
    }
  }
}

TEST_CASE("hierarchical_allreduce pipelined: a failure on one host stops the ranks of both "
          "hosts with an error, none waits for its timeout",
          "[shm][hierarchical][pipeline]") {
  // Host 1's local rank 1 (rank 3) fails its group and never calls, so host
  // 1's local rank 0 (rank 2) stops in its first reduce-scatter and never
  // sends piece 0 across hosts. Local rank 1's cross-host world has failed
  // too. On host 0, local rank 1's network thread fails at piece 0, its
  // calling thread fails host 0's group; local rank 0's calling thread waits
  // for piece 0, whose network thread waits for rank 2: the interrupt check
  // (its host's group failed) stops it, not the transports' 60 s timeout.
  HierCase c{2, 2, 200000, DataType::kFloat32, ReduceOp::kSum, 16};
  c.absent = 3;
  std::vector<std::string> errors;
  run_hierarchical(c, [](int r, std::size_t i) { return test::contribution(ReduceOp::kSum, r, i); },
                   &errors, [](auto& cross) { transport::fail_local_world(*cross[1], 1); });
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r << ": " << errors[r]);
    CHECK(!errors[r].empty());
    CHECK(errors[r].find("Timeout") == std::string::npos);
  }
  CHECK(errors[0].find("network phase stopped") != std::string::npos);
  CHECK(errors[1].find("failed") != std::string::npos);
}

namespace {

// Inputs whose floating-point sums depend on the order of the additions
// (fractions that no binary type holds exactly), so that equal bits mean the
// same reduction order; small integers for the integer types.
double varied(DataType dt, ReduceOp op, int r, std::size_t i, int call) {
  const double base = test::contribution(op, r, i + static_cast<std::size_t>(call));
  const bool floating = dt == DataType::kFloat32 || dt == DataType::kFloat64 ||
                        dt == DataType::kFloat16 || dt == DataType::kBFloat16;
  if (!floating) return base;
  return base + 0.1 * static_cast<double>((i * 7 + static_cast<std::size_t>(r) * 13 +
                                           static_cast<std::size_t>(call)) % 10);
}

}  // namespace

TEST_CASE("shm_allreduce_pieces: a bucket gathered from its members gives the bits of the "
          "packed bucket, gaps and absent members as zeros", "[shm]") {
  // Members of odd sizes at odd offsets (gaps between them and at the end,
  // as a fused layout's padding), one member absent on the last rank (a
  // rank that joined: zeros in, nothing out), one in place; 4096-byte
  // slots so members straddle chunks. Inputs with fractions, so that the
  // bits depend on the order of the additions.
  for (int n : {2, 3, 4}) {
    for (DataType dt : {DataType::kFloat32, DataType::kFloat64, DataType::kInt32,
                        DataType::kFloat16}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
        if (!op_defined(dt, op)) continue;
        INFO("n=" << n << " dtype=" << dtype_name(dt) << " op=" << op_name(op));
        const std::size_t es = dtype_size(dt);
        const std::size_t count = 9000;
        struct Span { std::size_t off, elems; };
        const Span spans[] = {{0, 1}, {16, 1000}, {1100, 3333}, {4500, 7}, {4600, 4000}};
        std::vector<std::vector<std::byte>> packed(n), packed_out(n), outs(n * 5), ins(n * 5);
        for (int r = 0; r < n; ++r) {
          packed[static_cast<std::size_t>(r)].assign(count * es, std::byte{0});
          for (std::size_t k = 0; k < 5; ++k) {
            auto& in = ins[static_cast<std::size_t>(r) * 5 + k];
            in.resize(spans[k].elems * es);
            for (std::size_t i = 0; i < spans[k].elems; ++i) {
              const double v = (dt == DataType::kInt32 ? 1.0 : 0.1) * ((r + 3) * (i + k + 1) % 97);
              test::store(dt, in.data(), i, v);
            }
            // The absent member (k == 2 on the last rank) adds zeros.
            if (!(k == 2 && r == n - 1)) {
              std::memcpy(packed[static_cast<std::size_t>(r)].data() + spans[k].off * es,
                          in.data(), in.size());
            }
            outs[static_cast<std::size_t>(r) * 5 + k].assign(in.size(), std::byte{0x5a});
          }
          packed_out[static_cast<std::size_t>(r)].assign(count * es, std::byte{0x5a});
        }
        ShmOptions opt = small_slots(4096);
        run_group(n, opt, [&](ShmGroup& g) {
          const auto r = static_cast<std::size_t>(g.rank());
          shm_allreduce(g, packed[r].data(), packed_out[r].data(), count, dt, op);
        });
        run_group(n, opt, [&](ShmGroup& g) {
          const auto r = static_cast<std::size_t>(g.rank());
          std::vector<BucketPiece> pieces;
          for (std::size_t k = 0; k < 5; ++k) {
            auto& in = ins[r * 5 + k];
            auto& out = outs[r * 5 + k];
            if (k == 2 && g.rank() == g.size() - 1) {
              pieces.push_back({nullptr, nullptr, spans[k].off * es, in.size()});
            } else if (k == 3) {
              out = in;  // in place
              pieces.push_back({out.data(), out.data(), spans[k].off * es, in.size()});
            } else {
              pieces.push_back({in.data(), out.data(), spans[k].off * es, in.size()});
            }
          }
          shm_allreduce_pieces(g, pieces, count, dt, op);
        });
        for (int r = 0; r < n; ++r) {
          for (std::size_t k = 0; k < 5; ++k) {
            INFO("rank " << r << " member " << k);
            const auto& out = outs[static_cast<std::size_t>(r) * 5 + k];
            const std::byte* want = packed_out[static_cast<std::size_t>(r)].data() + spans[k].off * es;
            if (k == 2 && r == n - 1) {
              CHECK(out == std::vector<std::byte>(out.size(), std::byte{0x5a}));  // untouched
            } else {
              CHECK(std::memcmp(out.data(), want, out.size()) == 0);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("shm_allreduce_pieces: overlapping, out-of-bounds or element-splitting pieces are refused "
          "before any wait",
          "[shm]") {
  // Catch's assertions are not thread-safe: each rank records what it saw.
  std::array<std::string, 2> overlap_error, past_error, split_error;
  run_group(2, small_slots(4096), [&](ShmGroup& g) {
    float a[8] = {}, b[8] = {};
    const auto r = static_cast<std::size_t>(g.rank());
    const BucketPiece overlap[] = {{a, a, 0, 16}, {b, b, 8, 16}};
    try {
      shm_allreduce_pieces(g, overlap, 8, DataType::kFloat32, ReduceOp::kSum);
    } catch (const InvalidArgument& e) {
      overlap_error[r] = e.what();
    }
    const BucketPiece past[] = {{a, a, 16, 32}};
    try {
      shm_allreduce_pieces(g, past, 8, DataType::kFloat32, ReduceOp::kSum);
    } catch (const InvalidArgument& e) {
      past_error[r] = e.what();
    }
    // A piece that splits an element: its own share would be reduced from
    // half an element of its input.
    const BucketPiece split[] = {{a, a, 2, 8}};
    try {
      shm_allreduce_pieces(g, split, 8, DataType::kFloat32, ReduceOp::kSum);
    } catch (const InvalidArgument& e) {
      split_error[r] = e.what();
    }
  });
  for (std::size_t r = 0; r < 2; ++r) {
    CHECK_THAT(overlap_error[r], Catch::Contains("overlaps the one before it"));
    CHECK_THAT(past_error[r], Catch::Contains("past the 32 bytes"));
    CHECK_THAT(split_error[r], Catch::Contains("does not start and end on float32 elements"));
  }
}
