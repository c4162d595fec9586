// The parameter store under mpirun with 2 or 3 ranks: the optimistic-update
// scenario (workers that read the same version: one applied per shard, the
// others rejected with the current version, retried, and the result equal
// to applying every update one after the other), no lost update under
// contention on a tensor split across every rank, placement, refusals on
// the calling rank only, an owner that stops serving, named by the others
// within the deadline, another rank's shutdown ending the calls waiting on
// it at once, calls of several tensors (one request per owner; a
// request refused in part changes nothing), and pulls that land in the
// output and nowhere else, and a store stopped from two threads at once.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "gyre/gyre.h"
#include "gyre/store.h"

#include "../core/mpi_session.h"
#include "store/parameter_store.h"

using namespace gyre;

namespace {

// A gyre session per test case; a stalled collective ends the job after 60 s.
struct Session : test::Session {
  Session() : test::Session(test::test_options_with_stall_shutdown(60)) {}
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

namespace {

// A store of timeout_s holding "a" (owned by rank 0) and "b" (rank 1).
std::unique_ptr<ParameterStore> store_a_and_b(double timeout_s) {
  StoreOptions opt;
  opt.timeout_s = timeout_s;
  auto store = std::make_unique<ParameterStore>(kGlobalProcessSet, opt);
  std::vector<float> a(2, 0.0f), b(2, 0.0f);
  store->register_tensor("a", view(a));
  store->register_tensor("b", view(b));
  barrier();
  return store;
}

}  // namespace

TEST_CASE("an owner that stops serving is named within the deadline") {
  Session s;
  auto store = store_a_and_b(2);
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

TEST_CASE("pull_many and push_many: one request per owner, the values and versions of single calls") {
  Session s;
  const int n = size(), me = rank();
  ParameterStore store;
  // 2n small tensors: placement by bytes gives every member two.
  const int kTensors = 2 * n;
  std::vector<std::vector<float>> init(kTensors);
  std::vector<std::string> names;
  for (int j = 0; j < kTensors; ++j) {
    init[j].resize(static_cast<std::size_t>(3 + j));
    for (std::size_t i = 0; i < init[j].size(); ++i) init[j][i] = static_cast<float>(j + i % 7);
    names.push_back(fmt::format("m{}", j));
    store.register_tensor(names.back(), view(init[j]));
  }
  std::vector<int> per_owner(static_cast<std::size_t>(n), 0);
  for (const auto& name : names) ++per_owner[static_cast<std::size_t>(store.shard_owners(name)[0])];
  for (int c : per_owner) REQUIRE(c == 2);

  std::vector<std::vector<float>> out(kTensors), delta(kTensors);
  std::vector<PullItem> pulls;
  for (int j = 0; j < kTensors; ++j) {
    out[j].assign(init[j].size(), -1.0f);
    delta[j].assign(init[j].size(), static_cast<float>(me + 1));
    pulls.push_back(PullItem{names[j], view(out[j])});
  }
  barrier();
  const std::int64_t served_before = store.stats().served_requests;
  barrier();
  std::vector<std::vector<std::int64_t>> v;
  if (me == 0) v = store.pull_many(pulls);
  barrier();
  // Rank 0's call reached each other member once, for both of its tensors.
  CHECK(total(store.stats().served_requests - served_before) == n - 1);
  if (me == 0) {
    for (int j = 0; j < kTensors; ++j) {
      CHECK(out[j] == init[j]);
      CHECK(v[static_cast<std::size_t>(j)] == std::vector<std::int64_t>{0});
    }
  }

  // Every rank pushes its delta to every tensor in one call ("apply").
  std::vector<PushItem> pushes;
  for (int j = 0; j < kTensors; ++j) {
    pushes.push_back(PushItem{names[j], view(delta[j]), {0}, -1, PushPolicy::kApply, {}});
  }
  barrier();
  const std::int64_t served_mid = store.stats().served_requests;
  barrier();
  const std::vector<PushResult> r = store.push_many(pushes);
  REQUIRE(r.size() == static_cast<std::size_t>(kTensors));
  for (const PushResult& x : r) CHECK(x.applied);
  barrier();
  CHECK(total(store.stats().served_requests - served_mid) == n * (n - 1));
  v = store.pull_many(pulls);
  const float added = static_cast<float>(n * (n + 1) / 2);
  for (int j = 0; j < kTensors; ++j) {
    CHECK(v[static_cast<std::size_t>(j)] == std::vector<std::int64_t>{n});
    for (std::size_t i = 0; i < out[j].size(); ++i) CHECK(out[j][i] == init[j][i] + added);
  }
  store.close();
}

TEST_CASE("a push_many its owner refuses in part changes nothing there") {
  Session s;
  const int n = size(), me = rank();
  ParameterStore store;
  std::vector<float> w(4, 1.0f);
  for (int j = 0; j < n; ++j) store.register_tensor(fmt::format("r{}", j), view(w));
  // r{j} is owned by rank j: rank 0 sends rank 1 (and itself) a good push
  // and one from a version the shard never had.
  std::vector<float> d(4, 2.0f), got(4);
  if (me == 0) {
    for (const int owner : {1, 0}) {
      const std::string name = fmt::format("r{}", owner);
      REQUIRE(store.shard_owners(name) == std::vector<int>{owner});
      const std::vector<PushItem> items{{name, view(d), {0}, 0, PushPolicy::kReject, {}},
                                        {name, view(d), {7}, 0, PushPolicy::kReject, {}}};
      CHECK_THROWS_WITH(store.push_many(items), Catch::Contains("never this shard's"));
      CHECK(store.pull(name, view(got)) == std::vector<std::int64_t>{0});
      CHECK(got == w);
    }
  }
  barrier();
  store.close();
}

TEST_CASE("a pull lands each shard's values and version straight in the output, nothing around it") {
  // Split tensors of several dtypes, of sizes that do not divide by the
  // ranks, pulled into the middle of larger buffers: the bytes before and
  // after the output stay as they were, and every value and version is the
  // closed form after each rank's push.
  Session s;
  const int n = size(), me = rank();
  StoreOptions opt;
  opt.split_bytes = 16;  // every tensor here is cut into one shard per rank
  ParameterStore store(kGlobalProcessSet, opt);
  const std::int64_t count = 97 * n + 1;
  std::vector<double> a(static_cast<std::size_t>(count));
  std::vector<std::int32_t> b(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) {
    a[static_cast<std::size_t>(i)] = 0.5 * static_cast<double>(i % 7);
    b[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i % 11);
  }
  store.register_tensor("a", TensorView{a.data(), DataType::kFloat64, {count}});
  store.register_tensor("b", TensorView{b.data(), DataType::kInt32, {count}});
  REQUIRE(store.shard_owners("a").size() == static_cast<std::size_t>(n));
  std::vector<double> da(a.size(), static_cast<double>(me + 1));
  std::vector<std::int32_t> db(b.size(), me + 1);
  auto ra = store.push("a", TensorView{da.data(), DataType::kFloat64, {count}},
                       std::vector<std::int64_t>(static_cast<std::size_t>(n), 0), -1,
                       PushPolicy::kApply);
  CHECK(ra.applied);
  barrier();
  std::vector<PushItem> pb{{"b", TensorView{db.data(), DataType::kInt32, {count}},
                            std::vector<std::int64_t>(static_cast<std::size_t>(n), 0), -1,
                            PushPolicy::kApply, {}}};
  CHECK(store.push_many(pb)[0].applied);
  barrier();
  constexpr std::int64_t kGuard = 5;
  std::vector<double> big_a(static_cast<std::size_t>(count + 2 * kGuard), -7.0);
  std::vector<std::int32_t> big_b(static_cast<std::size_t>(count + 2 * kGuard), -7);
  const std::vector<PullItem> items{
      {"a", TensorView{big_a.data() + kGuard, DataType::kFloat64, {count}}},
      {"b", TensorView{big_b.data() + kGuard, DataType::kInt32, {count}}}};
  const auto v = store.pull_many(items);
  const int added = n * (n + 1) / 2;
  CHECK(v[0] == std::vector<std::int64_t>(static_cast<std::size_t>(n), n));
  CHECK(v[1] == std::vector<std::int64_t>(static_cast<std::size_t>(n), n));
  for (std::int64_t i = 0; i < count + 2 * kGuard; ++i) {
    const auto k = static_cast<std::size_t>(i);
    const bool inside = i >= kGuard && i < kGuard + count;
    const double want_a = inside ? a[k - kGuard] + added : -7.0;
    const std::int32_t want_b = inside ? b[k - kGuard] + added : -7;
    if (big_a[k] != want_a || big_b[k] != want_b) {
      FAIL(fmt::format("element {}: a {} (want {}), b {} (want {})", i, big_a[k], want_a,
                       big_b[k], want_b));
    }
  }
  // The single-tensor pull gives the same.
  std::vector<std::int32_t> one(b.size());
  CHECK(store.pull("b", TensorView{one.data(), DataType::kInt32, {count}}) == v[1]);
  CHECK(std::equal(one.begin(), one.end(), big_b.begin() + kGuard));
  store.close();
}

TEST_CASE("another rank's shutdown stops this rank's store: a call waiting on it fails now") {
  Session s;
  auto store = store_a_and_b(60);  // what an unanswered request would otherwise wait
  if (rank() == 1) {
    shutdown();  // stops every rank's runtime in the same round, and its own store
    store.reset();
    return;
  }
  // Pulls of rank 1's shard until one fails: once the shutdown reaches this
  // rank's runtime its stores stop, and a call in flight gives up within a
  // poll of its wait.
  std::vector<float> out(2);
  const auto start = std::chrono::steady_clock::now();
  std::string what;
  for (;;) {
    try {
      store->pull("b", view(out));
    } catch (const std::exception& e) {
      what = e.what();
      break;
    }
  }
  INFO(what);
  CHECK(what.find("store") != std::string::npos);
  CHECK((what.find("was closed during the call") != std::string::npos ||
         what.find("is closed") != std::string::npos));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
  store.reset();
}

TEST_CASE("a store stopped from two threads at once returns on both") {
  // A peer's shutdown stops this rank's stores on the runtime's background
  // thread (core::store::stop_all_stores) while the owner may be closing or
  // destroying the same store: each joins the store's server thread. Here
  // the two stops start together, many times; a second join of one thread
  // hung or ended the process. A stop that does not return within the
  // watchdog's limit fails the job (it cannot be unwound).
  Session s;
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false;
  int iteration = 0;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, std::chrono::seconds(30), [&] { return finished; })) {
      std::fprintf(stderr, "rank %d: stopping a store from two threads at once did not return "
                   "(iteration %d)\n", rank(), iteration);
      std::abort();
    }
  });
  constexpr int kIterations = 40;
  for (int i = 0; i < kIterations; ++i) {
    {
      std::lock_guard<std::mutex> lock(mu);
      iteration = i;
    }
    auto store = store_a_and_b(60);
    std::atomic<int> ready{0};
    std::thread peer([&] {
      ready.fetch_add(1);
      while (ready.load() < 2) std::this_thread::yield();
      core::store::stop_all_stores();
    });
    ready.fetch_add(1);
    while (ready.load() < 2) std::this_thread::yield();
    store.reset();
    peer.join();
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    finished = true;
  }
  cv.notify_one();
  watchdog.join();
  CHECK(iteration == kIterations - 1);
}
