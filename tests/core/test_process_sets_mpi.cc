// Process sets through the public API (gyre.h) under mpirun with 3 or 4
// ranks: concurrency between sets, a subset's collectives against closed
// forms, refusals for ranks outside a set and for calls that ranks do not
// make alike, remove and add again.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gyre/gyre.h"
#include "mpi_session.h"

using namespace gyre;
using test::Session;
using test::test_options;

namespace {

template <typename T>
TensorView view(std::vector<T>& v, DataType dt) {
  return TensorView{v.data(), dt, {static_cast<std::int64_t>(v.size())}};
}
TensorView fview(std::vector<float>& v) { return view(v, DataType::kFloat32); }

bool member(const std::vector<int>& ranks, int r) {
  return std::find(ranks.begin(), ranks.end(), r) != ranks.end();
}

// Every rank but rank 1: {0, 2} with 3 ranks, {0, 2, 3} with 4.
std::vector<int> without_rank_1() {
  std::vector<int> s;
  for (int r = 0; r < size(); ++r) {
    if (r != 1) s.push_back(r);
  }
  return s;
}

}  // namespace

TEST_CASE("process sets: disjoint sets reduce different values at once", "[mpi]") {
  Session s;
  const int n = size(), r = rank();
  std::vector<int> lower, upper;
  for (int q = 0; q < n; ++q) (q < n / 2 ? lower : upper).push_back(q);
  const int a = add_process_set(lower);
  const int b = add_process_set(upper);
  CHECK(a != b);
  CHECK(process_set_ids() == std::vector<int>{0, a, b});
  const bool in_lower = member(lower, r);
  const auto& mine = in_lower ? lower : upper;
  const int id = in_lower ? a : b;
  const auto at = std::find(mine.begin(), mine.end(), r) - mine.begin();
  CHECK(process_set_rank(id) == static_cast<int>(at));
  CHECK(process_set_size(id) == static_cast<int>(mine.size()));
  CHECK(process_set_included(id));
  CHECK_FALSE(process_set_included(in_lower ? b : a));
  CHECK(process_set_rank(in_lower ? b : a) == -1);
  // The same names on both sets (names are scoped by set), values that
  // differ between the sets: each set sums its own ranks' values.
  const float expected = std::accumulate(mine.begin(), mine.end(), 0.0f,
                                         [](float acc, int q) { return acc + 100.0f * (q + 1); });
  for (int iter = 0; iter < 20; ++iter) {
    std::vector<float> v(1000 + iter, 100.0f * (r + 1));
    allreduce_async("grad", fview(v), fview(v), ReduceOp::kSum, 1.0, 1.0, id).wait();
    CHECK(v.front() == expected);
    CHECK(v.back() == expected);
  }
  remove_process_set(a);
  remove_process_set(b);
  CHECK(process_set_ids() == std::vector<int>{0});
}

TEST_CASE("process sets: a set waiting on a late rank does not hold up another set", "[mpi]") {
  Session s;
  const int r = rank();
  // Rank 0 is in both sets. Rank 1 enqueues on A only after rank 0 has
  // finished on B (the world barrier orders it): with one queue served in
  // turns by a thread that waits for A, B would never complete.
  const int a = add_process_set({0, 1});
  const int b = add_process_set({0, 2});
  std::vector<float> va(8, static_cast<float>(r + 1)), vb(8, static_cast<float>(r + 1));
  if (r == 0) {
    Handle ha = allreduce_async("g", fview(va), fview(va), ReduceOp::kSum, 1.0, 1.0, a);
    allreduce_async("g", fview(vb), fview(vb), ReduceOp::kSum, 1.0, 1.0, b).wait();
    CHECK(vb[0] == 1.0f + 3.0f);
    CHECK_FALSE(ha.poll());  // rank 1 has not enqueued yet
    barrier();
    ha.wait();
    CHECK(va[0] == 1.0f + 2.0f);
  } else if (r == 1) {
    barrier();
    allreduce_async("g", fview(va), fview(va), ReduceOp::kSum, 1.0, 1.0, a).wait();
    CHECK(va[0] == 1.0f + 2.0f);
  } else if (r == 2) {
    allreduce_async("g", fview(vb), fview(vb), ReduceOp::kSum, 1.0, 1.0, b).wait();
    CHECK(vb[0] == 1.0f + 3.0f);
    barrier();
  } else {
    barrier();
  }
  remove_process_set(b);
  remove_process_set(a);
}

TEST_CASE("process sets: every collective on a subset", "[mpi]") {
  Session s;
  const int r = rank();
  const std::vector<int> set = without_rank_1();
  const int id = add_process_set(set);
  const int k = static_cast<int>(set.size());
  if (!member(set, r)) {
    std::vector<float> v(4, 1.0f);
    CHECK_THROWS_AS(allreduce_async("x", fview(v), fview(v), ReduceOp::kSum, 1.0, 1.0, id),
                    InvalidArgument);
    CHECK_THROWS_WITH(allgather_async("x", fview(v), id),
                      Catch::Contains("rank 1 is not in process set"));
    CHECK_THROWS_AS(broadcast_async("x", fview(v), 0, id), InvalidArgument);
    CHECK_THROWS_AS(alltoall_async("x", fview(v), {}, id), InvalidArgument);
    CHECK_THROWS_AS(reducescatter_async("x", fview(v), ReduceOp::kSum, 1.0, 1.0, id),
                    InvalidArgument);
    CHECK_THROWS_AS(barrier(id), InvalidArgument);
    CHECK_THROWS_AS(join(id), InvalidArgument);
  } else {
    const int sr = process_set_rank(id);
    // allreduce: average of world ranks over the set.
    std::vector<double> v(5, static_cast<double>(r));
    allreduce_async("ar", view(v, DataType::kFloat64), view(v, DataType::kFloat64),
                    ReduceOp::kAverage, 1.0, 1.0, id).wait();
    const double mean = std::accumulate(set.begin(), set.end(), 0.0) / k;
    CHECK(v[0] == Approx(mean));
    // grouped allreduce.
    std::vector<float> g1(3, 1.0f), g2(2, static_cast<float>(r));
    grouped_allreduce_async({"g1", "g2"}, {fview(g1), fview(g2)}, {fview(g1), fview(g2)},
                            ReduceOp::kSum, 1.0, 1.0, id).wait();
    CHECK(g1[0] == static_cast<float>(k));
    CHECK(g2[1] == static_cast<float>(std::accumulate(set.begin(), set.end(), 0)));
    // allgather: set rank i contributes i+1 rows holding its world rank.
    std::vector<float> rows(static_cast<std::size_t>(sr + 1), static_cast<float>(r));
    Handle h = allgather_async("ag", fview(rows), id);
    h.wait();
    const auto& out = h.output();
    REQUIRE(out.shape[0] == k * (k + 1) / 2);
    const float* got = reinterpret_cast<const float*>(out.data.data());
    std::size_t at = 0;
    for (int i = 0; i < k; ++i) {
      for (int j = 0; j <= i; ++j) CHECK(got[at++] == static_cast<float>(set[i]));
    }
    // broadcast from the last member, named by its world rank.
    std::vector<float> b(6, static_cast<float>(r));
    broadcast_async("bc", fview(b), set.back(), id).wait();
    CHECK(b[5] == static_cast<float>(set.back()));
    // alltoall: one row to each member, holding 10 * sender + receiver.
    std::vector<float> t(static_cast<std::size_t>(k));
    for (int i = 0; i < k; ++i) t[i] = static_cast<float>(10 * sr + i);
    Handle ha = alltoall_async("a2a", fview(t), {}, id);
    ha.wait();
    const float* recv = reinterpret_cast<const float*>(ha.output().data.data());
    for (int i = 0; i < k; ++i) CHECK(recv[i] == static_cast<float>(10 * i + sr));
    CHECK(ha.received_splits() == std::vector<std::int64_t>(static_cast<std::size_t>(k), 1));
    // reducescatter: k rows of ones summed; each member keeps its row.
    std::vector<float> rs(static_cast<std::size_t>(2 * k), 1.0f);
    TensorView rv{rs.data(), DataType::kFloat32, {k, 2}};
    Handle hr = reducescatter_async("rs", rv, ReduceOp::kSum, 1.0, 1.0, id);
    hr.wait();
    REQUIRE(hr.output().shape == std::vector<std::int64_t>{1, 2});
    CHECK(reinterpret_cast<const float*>(hr.output().data.data())[1] == static_cast<float>(k));
    barrier(id);
    // join: the first member reduces alone (the others have joined), then
    // joins last.
    if (sr == 0) {
      std::vector<float> j(4, 7.0f);
      allreduce_async("j", fview(j), fview(j), ReduceOp::kSum, 1.0, 1.0, id).wait();
      CHECK(j[0] == 7.0f);
    }
    const int last = join(id);
    CHECK(member(set, last));
  }
  barrier();
  remove_process_set(id);
}

TEST_CASE("process sets: refusals are alike on every rank", "[mpi]") {
  Session s;
  const int r = rank(), n = size();
  // Ranks passing different sets: every rank fails, nothing is added.
  std::vector<int> mine = r == 0 ? std::vector<int>{0, 1} : std::vector<int>{0, 2};
  CHECK_THROWS_WITH(add_process_set(mine), Catch::Contains("do not make the same call"));
  CHECK(process_set_ids() == std::vector<int>{0});
  // One rank's bad ranks: it fails with its reason, the others with a note.
  if (r == n - 1) {
    CHECK_THROWS_WITH(add_process_set({0, n}), Catch::Contains("not all ranks of this job"));
  } else {
    CHECK_THROWS_WITH(add_process_set({0, 1}), Catch::Contains("refused its arguments"));
  }
  CHECK_THROWS_WITH(add_process_set({}), Catch::Contains("no ranks"));
  CHECK_THROWS_WITH(add_process_set({1, 1}), Catch::Contains("repeat"));
  std::vector<int> all(static_cast<std::size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  CHECK_THROWS_WITH(add_process_set(all), Catch::Contains("global process set"));
  CHECK_THROWS_WITH(remove_process_set(0), Catch::Contains("cannot be removed"));
  CHECK_THROWS_WITH(remove_process_set(12345), Catch::Contains("no process set has id"));
  const int id = add_process_set({0, 2});
  CHECK_THROWS_WITH(add_process_set({2, 0}), Catch::Contains("already process set"));
  // A root outside the set: refused on the caller, announced to the others.
  if (member({0, 2}, r)) {
    std::vector<float> v(3, 1.0f);
    if (r == 0) {
      CHECK_THROWS_WITH(broadcast_async("root", fview(v), 1, id),
                        Catch::Contains("root rank 1 is not in process set"));
    } else {
      Handle h = broadcast_async("root", fview(v), 0, id);
      CHECK_THROWS_WITH(h.wait(), Catch::Contains("root rank 1 is not in process set"));
    }
  }
  barrier();
  remove_process_set(id);
  // Remove, then use: unknown; add again: a new id that works.
  std::vector<float> v(2, 1.0f);
  CHECK_THROWS_WITH(allreduce_async("x", fview(v), fview(v), ReduceOp::kSum, 1.0, 1.0, id),
                    Catch::Contains("no process set has id"));
  const int again = add_process_set({0, 2});
  CHECK(again != id);
  if (member({0, 2}, r)) {
    allreduce_async("x", fview(v), fview(v), ReduceOp::kSum, 1.0, 1.0, again).wait();
    CHECK(v[0] == 2.0f);
  }
  remove_process_set(again);
}

TEST_CASE("process sets: removing a set fails its pending operations; shutdown with sets",
          "[mpi]") {
  Session s;
  const int r = rank();
  const int id = add_process_set({0, 2});
  std::vector<float> v(2, 1.0f);
  Handle h;
  // Rank 0 enqueues; rank 2 never does: removal fails the pending operation.
  // A removal stops the set before its agreement over the world, so rank 2
  // may have stopped it before rank 0 enqueues: then the call itself fails,
  // with the same error.
  std::string error;
  if (r == 0) {
    try {
      h = allreduce_async("never", fview(v), fview(v), ReduceOp::kSum, 1.0, 1.0, id);
    } catch (const StateError& e) {
      error = e.what();
    }
  }
  remove_process_set(id);
  if (r == 0 && error.empty()) {
    try {
      h.wait();
    } catch (const StateError& e) {
      error = e.what();
    }
  }
  if (r == 0) CHECK_THAT(error, Catch::Contains(fmt::format("process set {} was removed", id)));
  // A set left registered is stopped by shutdown() (the Session).
  add_process_set({1, 2});
}

TEST_CASE("process sets: removing a set fails a peer's wait on it", "[mpi]") {
  Session s;
  const int r = rank();
  // Rank 0 waits in a broadcast on {0, 2} that rank 2 never makes: rank 2
  // removes the set instead. The removal must end rank 0's wait (with
  // StateError) so that rank 0 can make the removal's agreement too,
  // instead of each waiting for the other for ever.
  for (int it = 0; it < 3; ++it) {
    const int id = add_process_set({0, 2});
    if (r == 0) {
      // Rank 2 may have stopped the set already: then the call itself fails.
      std::vector<float> v(4, 1.0f);
      std::string error;
      try {
        broadcast_async(fmt::format("never.{}", it), fview(v), 0, id).wait();
      } catch (const StateError& e) {
        error = e.what();
      }
      CHECK_THAT(error, Catch::Contains(fmt::format("process set {} was removed", id)));
    }
    remove_process_set(id);
  }
  // The job goes on: a global operation and a new set work.
  std::vector<float> one(1, 1.0f);
  allreduce_async("after", fview(one), fview(one), ReduceOp::kSum).wait();
  CHECK(one[0] == static_cast<float>(size()));
  const int again = add_process_set({0, 2});
  if (r == 0 || r == 2) barrier(again);
  remove_process_set(again);
}
