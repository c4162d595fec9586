// The parameter store under mpirun with 2 or 3 ranks: the optimistic-update
// scenario (workers that read the same version: one applied per shard, the
// others rejected with the current version, retried, and the result equal
// to applying every update one after the other), no lost update under
// contention on a tensor split across every rank, placement, refusals on
// the calling rank only, and an owner that stops serving, named by the
// others within the deadline.
#include <catch2/catch.hpp>

#include <cstring>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include "gyre/gyre.h"
#include "gyre/store.h"

using namespace gyre;

namespace {

struct Session {
  Session() {
    Options o = Options::from_env();
    o.cycle_time_ms = 0.5;
    o.op_timeout_s = 60;
    o.stall_shutdown_s = 60;
    init(o);
  }
  ~Session() {
    if (is_initialized()) shutdown();
  }
};

TensorView view(std::vector<float>& v) {
  return TensorView{v.data(), DataType::kFloat32, {static_cast<std::int64_t>(v.size())}};
}

// The sum of `x` over the ranks (a gyre allreduce).
std::int64_t total(std::int64_t x) {
  std::int64_t v = x;
  const TensorView t{&v, DataType::kInt64, {1}};
  allreduce_async("store.test.total", t, t, ReduceOp::kSum).wait();
  return v;
}

// Pushes `delta` until every shard has taken it, pulling again after each
// rejection and resending only the rejected shards. Returns the rejections.
int push_until_applied(ParameterStore& store, const std::string& name, std::vector<float>& delta,
                       std::vector<std::int64_t> base) {
  int rejections = 0;
  std::vector<int> only;
  std::vector<float> scratch(delta.size());
  for (;;) {
    PushResult r = store.push(name, view(delta), base, 0, PushPolicy::kReject, only);
    if (r.applied) return rejections;
    rejections += static_cast<int>(r.rejected_shards.size());
    for (int s : r.rejected_shards) CHECK(r.lag[static_cast<std::size_t>(s)] > 0);
    only = r.rejected_shards;
    base = store.pull(name, view(scratch));
  }
}

}  // namespace

TEST_CASE("workers that read the same version: one applied, the others rejected, retried") {
  Session s;
  const int n = size(), me = rank();
  ParameterStore store;
  std::vector<float> w(5);
  std::iota(w.begin(), w.end(), 1.0f);  // 1..5
  store.register_tensor("w", view(w));
  REQUIRE(store.shard_owners("w") == std::vector<int>{0});

  std::vector<float> pulled(5, -1);
  const auto v0 = store.pull("w", view(pulled));
  REQUIRE(v0 == std::vector<std::int64_t>{0});
  CHECK(pulled == w);
  barrier();  // every rank has read version 0

  // Rank r adds (r + 1) * 10^... : distinct updates, so the sum says which went in.
  std::vector<float> delta(5, static_cast<float>(me + 1));
  PushResult first = store.push("w", view(delta), v0);
  CHECK(total(first.applied ? 1 : 0) == 1);  // exactly one worker's update was applied
  if (!first.applied) {
    CHECK(first.version[0] >= 1);  // told the current version
    CHECK(first.rejected_shards == std::vector<int>{0});
    std::vector<float> again(5);
    CHECK(push_until_applied(store, "w", delta, store.pull("w", view(again))) >= 0);
  }
  barrier();
  const auto vn = store.pull("w", view(pulled));
  CHECK(vn == std::vector<std::int64_t>{n});  // one version per applied update
  const float added = static_cast<float>(n * (n + 1) / 2);
  for (int i = 0; i < 5; ++i) CHECK(pulled[i] == static_cast<float>(i + 1) + added);
  StoreStats st = store.stats();
  CHECK(st.pushes_applied == 1);
  store.close();
}

TEST_CASE("no lost update: every rank adds 1 to a split tensor K times, contended") {
  Session s;
  const int n = size();
  StoreOptions opt;
  opt.split_bytes = 64;  // 1000 floats: one shard per rank
  ParameterStore store(kGlobalProcessSet, opt);
  std::vector<float> zeros(1000, 0.0f);
  store.register_tensor("p", view(zeros));
  std::vector<int> owners = store.shard_owners("p");
  REQUIRE(owners.size() == static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) CHECK(owners[i] == i);

  constexpr int kRounds = 30;
  std::vector<float> ones(1000, 1.0f), cur(1000);
  int rejections = 0;
  for (int k = 0; k < kRounds; ++k) {
    auto base = store.pull("p", view(cur));
    if (k == 0) barrier();  // the first round: everyone pushes on version 0
    rejections += push_until_applied(store, "p", ones, base);
  }
  CHECK(total(rejections) > 0);
  barrier();
  auto v = store.pull("p", view(cur));
  for (std::size_t i = 0; i < cur.size(); ++i) {
    if (cur[i] != static_cast<float>(n * kRounds)) FAIL(fmt::format("element {} is {}", i, cur[i]));
  }
  for (auto x : v) CHECK(x == n * kRounds);
  store.close();
}

TEST_CASE("tensors are spread by bytes, and every dtype gyre reduces is stored") {
  Session s;
  ParameterStore store;
  std::vector<double> a(4, 1.5);
  std::vector<std::int64_t> b(3, 7);
  store.register_tensor("a", TensorView{a.data(), DataType::kFloat64, {4}});
  store.register_tensor("b", TensorView{b.data(), DataType::kInt64, {3}});
  CHECK(store.shard_owners("a") == std::vector<int>{0});
  CHECK(store.shard_owners("b") == std::vector<int>{1});
  std::vector<std::int64_t> got(3), inc{1, 2, 3};
  auto base = store.pull("b", TensorView{got.data(), DataType::kInt64, {3}});
  CHECK(got == b);
  if (rank() == 0) {
    auto r = store.push("b", TensorView{inc.data(), DataType::kInt64, {3}}, base);
    CHECK(r.applied);
  }
  barrier();
  store.pull("b", TensorView{got.data(), DataType::kInt64, {3}});
  CHECK(got == std::vector<std::int64_t>{8, 9, 10});
  store.close();
}

TEST_CASE("bad calls fail on the calling rank only, naming what is wrong") {
  Session s;
  ParameterStore store;
  std::vector<float> w(4, 0.0f);
  store.register_tensor("w", view(w));
  std::vector<float> out(4);
  if (rank() == size() - 1) {
    CHECK_THROWS_WITH(store.pull("nope", view(out)), Catch::Contains("no tensor 'nope'"));
    std::vector<float> wrong(3);
    CHECK_THROWS_WITH(store.pull("w", view(wrong)), Catch::Contains("3 elements"));
    CHECK_THROWS_WITH(store.push("w", view(out), {0, 0}), Catch::Contains("2 base versions"));
    CHECK_THROWS_WITH(store.push("w", view(out), {5}), Catch::Contains("never this shard's"));
  }
  // The others were never involved: the store goes on for everyone.
  auto v = store.pull("w", view(out));
  CHECK(v == std::vector<std::int64_t>{0});
  store.close();
  CHECK_THROWS_AS(store.pull("w", view(out)), StateError);
}

TEST_CASE("a pull straight after registration is answered, however late an owner installs") {
  // The registration's broadcast can complete on a requester before the
  // owner has installed its shards; the owner's server must hold such a
  // request until it has, not refuse it. Each round's tensor lands on
  // another owner (placement by bytes held), and every rank pulls at once.
  Session s;
  ParameterStore store;
  // Large tensors: installing the shards (a copy) takes long enough that
  // the old server refused some pull in most runs.
  for (int i = 0; i < 100; ++i) {
    std::vector<float> w(1 << 18, static_cast<float>(i));
    const std::string name = fmt::format("t{}", i);
    store.register_tensor(name, view(w));
    std::vector<float> out(w.size(), -1.0f);
    auto v = store.pull(name, view(out));
    REQUIRE(v == std::vector<std::int64_t>(v.size(), 0));
    REQUIRE(out == w);
  }
  store.close();
}

TEST_CASE("a store on the whole world after stores on a set that leaves a rank out") {
  // Each process counts the stores it has made; rank 1 made none on the
  // set, so the counts differ, and the members must still agree on the
  // store's communicator and names.
  Session s;
  std::vector<int> members;
  for (int r = 0; r < size(); ++r) {
    if (r != 1) members.push_back(r);
  }
  const int set = add_process_set(members);
  if (rank() != 1) {
    for (int i = 0; i < 2; ++i) {
      ParameterStore on_set(set);
      std::vector<float> w(2, 1.0f);
      on_set.register_tensor("w", view(w));
      on_set.close();
    }
  } else {
    CHECK_THROWS_WITH(ParameterStore(set), Catch::Contains("not in process set"));
  }
  remove_process_set(set);
  ParameterStore store;
  std::vector<float> w(static_cast<std::size_t>(size()) * 1024, 2.0f);
  store.register_tensor("w", view(w));
  std::vector<float> out(w.size(), 0.0f);
  store.pull("w", view(out));
  CHECK(out == w);
  store.close();
}

TEST_CASE("registering the same name twice fails on every rank in the same round") {
  Session s;
  ParameterStore store;
  std::vector<float> w(2, 1.0f);
  store.register_tensor("w", view(w));
  CHECK_THROWS_WITH(store.register_tensor("w", view(w)), Catch::Contains("already registered"));
  store.close();
}

TEST_CASE("an owner that stops serving is named within the deadline") {
  Session s;
  StoreOptions opt;
  opt.timeout_s = 2;
  auto store = std::make_unique<ParameterStore>(kGlobalProcessSet, opt);
  std::vector<float> a(2, 0.0f), b(2, 0.0f);
  store->register_tensor("a", view(a));  // owned by rank 0
  store->register_tensor("b", view(b));  // owned by rank 1
  barrier();
  if (rank() == 1) {
    store.reset();  // not collective: stops serving "b" at once
  }
  barrier();
  if (rank() != 1) {
    std::vector<float> out(2);
    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH(store->pull("b", view(out)), Catch::Contains("rank 1, owner of shard 0"));
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(30));
  }
  barrier();
  store.reset();
}
