// The hierarchical allgather with hosts x ranks as threads (one shared region
// per host, one LocalTransport world per local rank across the hosts),
// against the flat ring allgather over all ranks on the same data: every
// dtype, blocks of different sizes (zero ones too), host-major, round-robin
// and scrambled placements, in place and out of place.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include "gyre/collectives/algorithms.h"
#include "gyre/collectives/local_transport.h"
#include "gyre/collectives/shm.h"
#include "gyre/error.h"
#include "test_support.h"

using namespace gyre;
using namespace gyre::collectives;

namespace {

using test::on_threads;
using test::Region;

enum class Placement { kHostMajor, kRoundRobin, kScrambled };

// world_rank_of[h * p + l] for the placement.
std::vector<int> place(Placement how, int hosts, int p) {
  const int n = hosts * p;
  std::vector<int> w(n);
  for (int h = 0; h < hosts; ++h) {
    for (int l = 0; l < p; ++l) {
      const int i = h * p + l;
      switch (how) {
        case Placement::kHostMajor: w[i] = i; break;
        case Placement::kRoundRobin: w[i] = l * hosts + h; break;
        case Placement::kScrambled: w[i] = (i * 5 + 3) % n; break;  // 5 is prime to n here
      }
    }
  }
  return w;
}

}  // namespace

TEST_CASE("hierarchical_allgather: every dtype, uneven blocks, every placement, equals the flat ring",
          "[shm][hierarchical]") {
  for (auto [hosts, p] : {std::pair{2, 2}, std::pair{3, 2}, std::pair{2, 3}, std::pair{1, 3},
                          std::pair{3, 1}}) {
    const int n = hosts * p;
    for (Placement how : {Placement::kHostMajor, Placement::kRoundRobin, Placement::kScrambled}) {
      const std::vector<int> world_rank_of = place(how, hosts, p);
      for (DataType dt : test::kAllTypes) {
        for (bool in_place : {false, true}) {
          const std::size_t esz = dtype_size(dt);
          std::vector<std::size_t> counts(n), bytes(n), offset(n + 1, 0);
          for (int r = 0; r < n; ++r) {
            counts[r] = (r * 389 + 11) % 701 * (r % 4 != 2);  // rank 2 (and 6) give nothing
            bytes[r] = counts[r] * esz;
            offset[r + 1] = offset[r] + bytes[r];
          }
          const std::size_t total = offset[n];
          std::vector<std::vector<std::byte>> in(n), flat(n), hier(n);
          for (int r = 0; r < n; ++r) {
            in[r].resize(bytes[r]);
            for (std::size_t i = 0; i < counts[r]; ++i) {
              test::store(dt, in[r].data(), i, test::contribution(ReduceOp::kSum, r, i));
            }
            flat[r].assign(total, std::byte{0x5a});
            hier[r].assign(total, std::byte{0xa5});
            if (in_place && bytes[r] > 0) std::memcpy(hier[r].data() + offset[r], in[r].data(), bytes[r]);
          }
          // The flat path: one ring over all n ranks.
          {
            auto world = transport::make_local_world(n);
            on_threads(n, [&](int r) {
              transport::LocalTransport t(world, r);
              t.set_timeout(std::chrono::milliseconds(60000));
              AllgatherOptions o;
              o.chunk_bytes = 96;
              ring_allgather(t, in[r].data(), flat[r].data(), bytes, o);
            });
          }
          // The hierarchical path.
          ShmOptions opt;
          opt.slot_bytes = 512;
          opt.timeout = std::chrono::milliseconds(60000);
          std::vector<std::unique_ptr<Region>> regions;
          for (int h = 0; h < hosts; ++h) {
            regions.push_back(std::make_unique<Region>(ShmGroup::region_bytes(p, opt.slot_bytes)));
          }
          std::vector<std::shared_ptr<transport::LocalWorld>> cross;
          for (int l = 0; l < p; ++l) cross.push_back(transport::make_local_world(hosts));
          on_threads(n, [&](int i) {
            const int h = i / p, l = i % p, r = world_rank_of[i];
            ShmGroup g(regions[h]->p, l, p, opt);
            transport::LocalTransport t(cross[l], h);
            t.set_timeout(std::chrono::milliseconds(60000));
            AllgatherOptions o;
            o.chunk_bytes = 96;
            std::vector<std::byte> scratch;
            const void* src = in_place ? static_cast<const void*>(hier[r].data() + offset[r])
                                       : static_cast<const void*>(in[r].data());
            hierarchical_allgather(g, t, src, hier[r].data(), bytes, world_rank_of, o, scratch);
          });
          for (int r = 0; r < n; ++r) {
            INFO(hosts << "x" << p << " placement " << static_cast<int>(how) << " "
                       << dtype_name(dt) << (in_place ? " in place" : "") << " rank " << r);
            REQUIRE(flat[r] == hier[r]);
            // And the flat path itself holds every rank's block.
            // (An empty block's vector may have no storage: memcmp must not
            // see its null pointer.)
            for (int q = 0; q < n; ++q) {
              if (bytes[q] == 0) continue;
              REQUIRE(std::memcmp(flat[r].data() + offset[q], in[q].data(), bytes[q]) == 0);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("hierarchical_allgather: a placement of the wrong size is refused", "[shm][hierarchical]") {
  ShmOptions opt;
  opt.slot_bytes = 512;
  Region region(ShmGroup::region_bytes(1, opt.slot_bytes));
  ShmGroup g(region.p, 0, 1, opt);
  auto world = transport::make_local_world(1);
  transport::LocalTransport t(world, 0);
  std::vector<std::size_t> bytes{4, 4};
  std::vector<int> placement{0};
  std::vector<std::byte> in(4), out(8), scratch;
  REQUIRE_THROWS_AS(hierarchical_allgather(g, t, in.data(), out.data(), bytes, placement, {}, scratch),
                    InvalidArgument);
}
