// gyre::init(ranks) (Horovod's init(comm)) under mpirun with 3 or 4 ranks:
// the listed ranks run gyre alone, in the list's order; a rank outside the
// list is refused at once; init() without ranks then runs on every rank;
// bad lists are refused on every rank; another list while running is
// refused.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "gyre/gyre.h"
#include "mpi_session.h"

using namespace gyre;
using test::Session;
using test::test_options;

namespace {

int env_int(const char* name) {
  const char* v = std::getenv(name);
  REQUIRE(v != nullptr);
  return std::atoi(v);
}

int world_rank() { return env_int("OMPI_COMM_WORLD_RANK"); }
int world_size() { return env_int("OMPI_COMM_WORLD_SIZE"); }

TensorView fview(std::vector<float>& v) {
  return TensorView{v.data(), DataType::kFloat32, {static_cast<std::int64_t>(v.size())}};
}

// The last rank, then 0 (and 2 with 4 ranks), descending: gyre's rank order
// is not MPI_COMM_WORLD's. Rank 1 is never in it.
std::vector<int> listed() {
  std::vector<int> l{world_size() - 1};
  if (world_size() >= 4) l.push_back(2);
  l.push_back(0);
  return l;
}

}  // namespace

TEST_CASE("init(ranks): the listed ranks run alone, then every rank again", "[mpi]") {
  const int me = world_rank(), n = world_size();
  REQUIRE(n >= 3);
  const std::vector<int> ranks = listed();
  const auto at = std::find(ranks.begin(), ranks.end(), me);
  if (at == ranks.end()) {
    const auto started = std::chrono::steady_clock::now();
    try {
      init(test_options(), ranks);
      FAIL("init(ranks) was accepted on a rank outside the list");
    } catch (const InvalidArgument& e) {
      CHECK_THAT(e.what(), Catch::Matchers::Contains("is not among ranks"));
    }
    CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(10));
    CHECK_FALSE(is_initialized());
  } else {
    init(test_options(), ranks);
    const int k = static_cast<int>(ranks.size());
    CHECK(size() == k);
    CHECK(rank() == static_cast<int>(at - ranks.begin()));
    CHECK(local_size() == k);  // one host
    CHECK(local_rank() == rank());
    std::vector<float> v{static_cast<float>(me), 1.0f};
    allreduce_async("sum", fview(v), fview(v), ReduceOp::kSum).wait();
    float listed_sum = 0;
    for (int r : ranks) listed_sum += static_cast<float>(r);
    CHECK(v == std::vector<float>{listed_sum, static_cast<float>(k)});
    std::vector<float> mine{static_cast<float>(me)};
    Handle h = allgather_async("gather", fview(mine));
    h.wait();
    const float* got = reinterpret_cast<const float*>(h.output().data.data());
    for (int i = 0; i < k; ++i) {
      CHECK(got[i] == static_cast<float>(ranks[static_cast<std::size_t>(i)]));
    }
    barrier();
    init(test_options(), ranks);  // the same list while running: nothing
    CHECK_THROWS_WITH(init(test_options(), std::vector<int>{0, 1, 2}),
                      Catch::Matchers::Contains("runs already"));
    CHECK(size() == k);
    shutdown();
  }
  Session all;
  CHECK(size() == n);
  CHECK(rank() == me);
  CHECK(local_size() == n);
  std::vector<float> one{1.0f};
  allreduce_async("all", fview(one), fview(one), ReduceOp::kSum).wait();
  CHECK(one[0] == static_cast<float>(n));
}

TEST_CASE("init(ranks): bad lists are refused on every rank", "[mpi]") {
  const int n = world_size();
  CHECK_THROWS_WITH(init(test_options(), std::vector<int>{0, n}),
                    Catch::Matchers::Contains("are not all ranks of MPI_COMM_WORLD"));
  CHECK_THROWS_WITH(init(test_options(), std::vector<int>{1, 1, 0}),
                    Catch::Matchers::Contains("repeat a rank"));
  CHECK_FALSE(is_initialized());
  // Every rank in order: the same as init().
  std::vector<int> all;
  for (int r = 0; r < n; ++r) all.push_back(r);
  init(test_options(), all);
  CHECK(size() == n);
  shutdown();
}
