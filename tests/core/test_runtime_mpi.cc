// The public API (gyre.h) under mpirun with 2-4 ranks. Every test case
// initialises gyre and shuts it down again; MPI itself is finalised at exit.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include <unistd.h>

#include <fmt/format.h>

#include "gyre/gyre.h"
#include "mpi_session.h"
#include "shm_fusion_cases.h"

using namespace gyre;
using test::Session;
using test::test_options;

namespace {

TensorView view(std::vector<float>& v) {
  return TensorView{v.data(), DataType::kFloat32, {static_cast<std::int64_t>(v.size())}};
}

TensorView view(std::vector<double>& v) {
  return TensorView{v.data(), DataType::kFloat64, {static_cast<std::int64_t>(v.size())}};
}

std::vector<std::vector<float>> random_order(std::size_t fusion_threshold) {
  Options o = test_options();
  o.fusion_threshold_bytes = fusion_threshold;
  Session s(o);
  const int n = size(), r = rank();
  constexpr int kTensors = 200;
  std::vector<std::vector<float>> bufs(kTensors);
  std::vector<int> order(kTensors);
  for (int t = 0; t < kTensors; ++t) {
    bufs[t].resize(1 + (static_cast<std::size_t>(t) * 7919) % 5000);
    for (std::size_t i = 0; i < bufs[t].size(); ++i) bufs[t][i] = static_cast<float>(r + (i + t) % 7);
    order[t] = t;
  }
  std::mt19937 rng(99 + r);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<Handle> hs(kTensors);
  for (int t : order) {
    ReduceOp op = t % 2 ? ReduceOp::kSum : ReduceOp::kAverage;
    hs[t] = allreduce_async(fmt::format("grad.{}", t), view(bufs[t]), view(bufs[t]), op);
  }
  int wrong = 0;
  for (int t = 0; t < kTensors; ++t) {
    hs[t].wait();
    for (std::size_t i = 0; i < bufs[t].size(); ++i) {
      float want = static_cast<float>(n * static_cast<int>((i + t) % 7) + n * (n - 1) / 2);
      if (t % 2 == 0) want /= static_cast<float>(n);
      if (std::fabs(bufs[t][i] - want) > 1e-5f * want) ++wrong;
    }
  }
  CHECK(wrong == 0);
  return bufs;
}

// Bytes of this process's mappings of gyre's shared-memory segments (their
// names are unlinked, so /proc/self/maps shows them as deleted).
std::size_t shm_mapped_bytes() {
  std::ifstream maps("/proc/self/maps");
  std::size_t total = 0;
  for (std::string line; std::getline(maps, line);) {
    if (line.find("/dev/shm/gyre-") == std::string::npos) continue;
    std::istringstream in(line);
    std::string range;
    in >> range;
    const auto dash = range.find('-');
    total += std::stoull(range.substr(dash + 1), nullptr, 16) -
             std::stoull(range.substr(0, dash), nullptr, 16);
  }
  return total;
}

constexpr int kFusedSteps = 3;

// kFusedSteps steps of small tensors of every dtype and op, then a grouped
// bucket of 4 x 800 KB: this rank's results by name, and the bytes of
// shared memory mapped meanwhile.
std::map<std::string, std::vector<std::byte>> fused_steps(const Options& o,
                                                          std::size_t* mapped) {
  Session session(o);
  *mapped = shm_mapped_bytes();
  const int r = rank();
  std::map<std::string, std::vector<std::byte>> results;
  auto run = [&](const std::vector<test::Spec>& specs, int step, bool grouped) {
    std::vector<std::vector<std::byte>> bufs(specs.size());
    std::vector<TensorView> views;
    std::vector<std::string> names;
    for (std::size_t k = 0; k < specs.size(); ++k) {
      const test::Spec& s = specs[k];
      bufs[k].resize(s.count * dtype_size(s.dt));
      for (std::size_t i = 0; i < s.count; ++i) {
        test::store(s.dt, bufs[k].data(), i, test::value(s, r, i, step));
      }
      views.push_back(TensorView{bufs[k].data(), s.dt, {static_cast<std::int64_t>(s.count)}});
      names.push_back(s.name);
    }
    if (grouped) {
      grouped_allreduce_async(names, views, views, specs[0].op).wait();
    } else {
      std::vector<Handle> hs;
      for (std::size_t k = 0; k < specs.size(); ++k) {
        hs.push_back(allreduce_async(names[k], views[k], views[k], specs[k].op,
                                     specs[k].prescale, specs[k].postscale));
      }
      for (auto& h : hs) h.wait();
    }
    for (std::size_t k = 0; k < specs.size(); ++k) results[specs[k].name] = std::move(bufs[k]);
  };
  for (int step = 0; step < kFusedSteps; ++step) run(test::small_specs(step), step, false);
  std::vector<test::Spec> big;
  for (int k = 0; k < 4; ++k) {
    big.push_back({fmt::format("big.{}", k), DataType::kFloat32, ReduceOp::kSum, 200'000,
                   k % 2 == 0});
  }
  run(big, 7, true);
  return results;
}

// Messages per log-depth round from each rank (test_negotiation_log_depth.cc
// has the same helper for the negotiator alone).
std::uint64_t ceil_log2(int n) {
  std::uint64_t k = 0;
  while ((1 << k) < n) ++k;
  return k;
}

// This rank's messages per log-depth round: ceil(log2 n), or in two tiers
// across hosts ceil(log2 hosts) from local rank 0 and none from the others.
std::uint64_t log_depth_messages(const RuntimeStats& st) {
  if (st.negotiation_tier_hosts > 0) {
    return local_rank() == 0 ? ceil_log2(st.negotiation_tier_hosts) : 0;
  }
  return ceil_log2(size());
}

}  // namespace

TEST_CASE("mpi: fused buckets over shared memory give the bits of the same tensors unfused, "
          "and the ring's where the reduction is exact", "[mpi][shm]") {
  Options fused = test_options();
  fused.shared_memory = 1;
  Options unfused = fused;
  unfused.fusion_threshold_bytes = 0;  // every tensor alone in its bucket
  Options ring = fused;
  ring.shared_memory = 0;
  std::size_t mapped_fused = 0, mapped_unfused = 0, mapped_ring = 0;
  const auto a = fused_steps(fused, &mapped_fused);
  const auto b = fused_steps(unfused, &mapped_unfused);
  const auto c = fused_steps(ring, &mapped_ring);
  init(test_options());
  const bool one_host = local_size() == size();
  const int n = size();
  shutdown();
  if (one_host) {
    // The segment holds the slots alone (fused buckets are gathered into
    // them chunk by chunk): nothing is reserved for fusion buffers.
    CHECK(mapped_fused > 0);
    CHECK(mapped_fused < (2u << 20));
    CHECK(mapped_unfused == mapped_fused);
    CHECK(mapped_ring == 0);
  }
  REQUIRE(a.size() == b.size());
  REQUIRE(a.size() == c.size());
  // Over one host's shared memory every element is reduced in rank order
  // wherever its tensor lies in a bucket. Across hosts (the hierarchical
  // backend, whose ring's order depends on the position in the bucket) only
  // the exact inputs below are comparable.
  for (const auto& [name, bits] : a) {
    if (!one_host) break;
    INFO(name);
    CHECK(bits == b.at(name));
  }
  for (const char* name : {"big.0", "big.2"}) {
    INFO(name);
    CHECK(a.at(name) == c.at(name));
  }
  for (const test::ExactCase& e : test::exact_cases(kFusedSteps)) {
    INFO(e.spec.name);
    const auto& bits = a.at(e.spec.name);
    CHECK(bits == c.at(e.spec.name));
    bool all = true;
    for (std::size_t i = 0; i < e.spec.count && all; ++i) {
      const double want =
          test::expected(e.spec.dt, e.spec.op, n, i + static_cast<std::size_t>(e.step));
      const double tol = e.spec.op == ReduceOp::kAverage ? test::scaled_tolerance(e.spec.dt) : 0;
      all = test::close_enough(test::load(e.spec.dt, bits.data(), i), want, tol);
    }
    CHECK(all);
  }
}

TEST_CASE("mpi: lifecycle errors are StateError, init() twice and re-init work", "[mpi]") {
  CHECK_FALSE(is_initialized());
  CHECK_THROWS_AS(rank(), StateError);
  std::vector<float> v(2, 1.0f);
  CHECK_THROWS_WITH(allreduce_async("x", view(v), view(v)), Catch::Contains("not initialised"));
  CHECK_THROWS_AS(shutdown(), StateError);
  init(test_options());
  CHECK(is_initialized());
  commit_step();
  init(test_options());  // a second init() while running does nothing:
  CHECK(committed_steps() == 1u);  // the same runtime, not a new one
  CHECK(size() >= 2);
  CHECK(local_size() >= 1);
  CHECK(local_rank() < local_size());
  shutdown();
  CHECK_THROWS_AS(version_vector(), StateError);
  Session again;  // a second init in the same process
  allreduce_async("after.reinit", view(v), view(v), ReduceOp::kSum).wait();
  CHECK(v[0] == static_cast<float>(size()));
}

TEST_CASE("mpi: random enqueue order on every rank; fusion on and off agree", "[mpi]") {
  auto fused = random_order(64 << 10);
  auto unfused = random_order(0);
  REQUIRE(fused == unfused);
}

TEST_CASE("mpi: a mismatch fails on every rank and the runtime goes on", "[mpi]") {
  Session s;
  std::vector<float> a(rank() == 1 ? 6 : 4, 1.0f);
  try {
    allreduce_async("mismatched", view(a), view(a)).wait();
    FAIL("no MismatchError");
  } catch (const MismatchError& e) {
    CHECK_THAT(e.what(), Catch::Contains("'mismatched'") && Catch::Contains("shape") &&
                             Catch::Contains("rank 1 has [6]"));
  }
  std::vector<float> b(4, 2.0f);
  allreduce_async("fine", view(b), view(b), ReduceOp::kSum).wait();
  CHECK(b[3] == 2.0f * static_cast<float>(size()));
}

TEST_CASE("mpi: a rank that skips a step gets DivergenceError everywhere", "[mpi]") {
  Session s;
  std::vector<float> g(3, 1.0f);
  for (int step = 0; step < 2; ++step) {
    allreduce_async("w", view(g), view(g)).wait();
    if (!(rank() == size() - 1 && step == 1)) commit_step();
  }
  try {
    allreduce_async("w", view(g), view(g)).wait();
    FAIL("no DivergenceError");
  } catch (const DivergenceError& e) {
    CHECK_THAT(e.what(), Catch::Contains("'w'") &&
                             Catch::Contains(fmt::format("rank {} at step 1", size() - 1)));
  }
  auto vv = version_vector();
  CHECK(vv[static_cast<std::size_t>(size() - 1)] == 1);
  CHECK(vv[0] == 2);
}

TEST_CASE("mpi: fingerprint_check and resync (both policies)", "[mpi]") {
  for (auto policy : {ResyncPolicy::kNewest, ResyncPolicy::kAverage}) {
    Session s;
    std::vector<float> w(4096);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = std::sin(static_cast<float>(i));
    const float orig = w[100];
    if (rank() == 1) w[100] += 0.5f;
    if (rank() == 0) commit_step();  // rank 0 is newest
    std::vector<NamedBuffer> bufs = {{"w", view(w)}};
    auto mm = fingerprint_check(bufs);
    REQUIRE(mm.size() == 1);
    CHECK(mm[0].name == "w");
    REQUIRE(mm[0].groups.size() == 2);
    resync(bufs, policy);
    CHECK(fingerprint_check(bufs).empty());
    float want = policy == ResyncPolicy::kNewest ? orig : orig + 0.5f / static_cast<float>(size());
    CHECK(w[100] == Approx(want));
    CHECK(committed_steps() == 1);
  }
}

TEST_CASE("mpi: join with uneven step counts", "[mpi]") {
  Session s;
  const int n = size(), r = rank();
  for (int step = 0; step < r + 2; ++step) {
    std::vector<float> g(7, static_cast<float>(r));
    allreduce_async(fmt::format("j.{}", step), view(g), view(g)).wait();
    // The joined ranks contribute zeros; the average divides by every
    // rank (Horovod's join).
    float sum = 0;
    for (int q = 0; q < n; ++q) {
      if (q + 2 > step) sum += static_cast<float>(q);
    }
    CHECK(g[6] == Approx(sum / static_cast<float>(n)));
  }
  CHECK(join() == n - 1);
}

TEST_CASE("mpi: shutdown with pending work fails it, on every rank", "[mpi]") {
  Session s;
  std::vector<float> g(4, 1.0f);
  allreduce_async("warm", view(g), view(g)).wait();
  if (rank() == 0) {
    Handle h = allreduce_async("only.rank0", view(g), view(g));
    shutdown();
    CHECK_THROWS_AS(h.wait(), StateError);
  } else {
    bool stopped = false;
    for (int i = 0; !stopped; ++i) {
      try {
        allreduce_async(fmt::format("later.{}", i), view(g), view(g)).wait();
      } catch (const StateError& e) {
        CHECK_THAT(e.what(), Catch::Contains("shut down by rank 0"));
        stopped = true;
      }
    }
  }
}

TEST_CASE("mpi: the timeline file is valid JSON", "[mpi]") {
  std::string path;  // one file per job: the jobs ctest runs side by side may share a size
  int me = -1;
  {
    init(test_options());  // to learn rank 0's process id, which names the file
    std::vector<std::int64_t> pid{static_cast<std::int64_t>(::getpid())};
    broadcast_async("timeline.pid", TensorView{pid.data(), DataType::kInt64, {1}}, 0).wait();
    path = fmt::format("gyre_core_mpi_timeline_{}.json", pid[0]);
    shutdown();
    Options o = test_options();
    o.timeline_path = path;
    Session s(o);
    std::vector<float> a(64, 1.0f), b(64, 1.0f);
    Handle x = allreduce_async("t.a", view(a), view(a));
    Handle y = allreduce_async("t.b", view(b), view(b));
    x.wait();
    y.wait();
    barrier();
    me = rank();
  }
  if (me == 0) {
    std::string cmd = "python3 -c \"import json,sys; e=json.load(open(sys.argv[1]))['traceEvents'];"
                      " sys.exit(0 if any(x['name']=='ALLREDUCE' for x in e) else 1)\" " + path;
    CHECK(std::system(cmd.c_str()) == 0);
    std::remove(path.c_str());
  }
}

TEST_CASE("mpi: Adasum on a power of two, refused otherwise; integer average", "[mpi]") {
  Session s;
  const int n = size(), r = rank();
  // Orthogonal contributions add under Adasum: rank r owns element r.
  std::vector<float> g(static_cast<std::size_t>(n), 0.0f);
  g[static_cast<std::size_t>(r)] = static_cast<float>(r + 1);
  if ((n & (n - 1)) == 0) {
    allreduce_async("adasum.orth", view(g), view(g), ReduceOp::kAdasum).wait();
    for (int q = 0; q < n; ++q) CHECK(g[static_cast<std::size_t>(q)] == static_cast<float>(q + 1));
  } else {
    CHECK_THROWS_WITH(allreduce_async("adasum.orth", view(g), view(g), ReduceOp::kAdasum),
                      Catch::Contains("power-of-two number of ranks"));
  }
  // Average of r over the ranks, truncated toward zero.
  std::vector<std::int32_t> v(5, r);
  TensorView tv{v.data(), DataType::kInt32, {5}};
  allreduce_async("int.average", tv, tv, ReduceOp::kAverage).wait();
  CHECK(v == std::vector<std::int32_t>(5, (n - 1) / 2));
}

namespace {

// Adasum's pairwise rule in double: a zero vector's coefficient is 1.
std::vector<double> adasum_pair(const std::vector<double>& a, const std::vector<double>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ab += a[i] * b[i];
    aa += a[i] * a[i];
    bb += b[i] * b[i];
  }
  const double ca = aa == 0 ? 1.0 : 1.0 - ab / (2 * aa);
  const double cb = bb == 0 ? 1.0 : 1.0 - ab / (2 * bb);
  std::vector<double> out(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) out[i] = ca * a[i] + cb * b[i];
  return out;
}

}  // namespace

TEST_CASE("mpi: Adasum with a joined rank, which contributes zeros (Horovod's join)", "[mpi]") {
  Session s;
  const int n = size(), r = rank();
  if ((n & (n - 1)) != 0) return;  // Adasum needs a power of two (refusal tested above)
  // Rank 0 joins: its zeros leave its partner's vector as it is; the others
  // reduce two tensors (a fused bucket, each combined on its own).
  const std::size_t lens[2] = {5, 9};
  auto data = [&](int q, int t) {
    std::vector<double> v(lens[t]);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(1.0 + 7.0 * q + 3.0 * t + static_cast<double>(i));
    return v;
  };
  if (r == 0) {
    const int last = join();  // a rank that joined after its allreduce
    CHECK((last >= 1 && last < n));
    return;
  }
  std::vector<std::vector<float>> bufs(2);
  std::vector<TensorView> views;
  for (int t = 0; t < 2; ++t) {
    for (double x : data(r, t)) bufs[t].push_back(static_cast<float>(x));
    views.push_back(view(bufs[t]));
  }
  grouped_allreduce_async({"adasum.joined.0", "adasum.joined.1"}, views, views, ReduceOp::kAdasum)
      .wait();
  for (int t = 0; t < 2; ++t) {
    // The same tree as the runtime's: pairs at distance 1, 2, 4, ...
    std::vector<std::vector<double>> parts;
    for (int q = 0; q < n; ++q) parts.push_back(q == 0 ? std::vector<double>(lens[t], 0.0) : data(q, t));
    for (int d = 1; d < n; d *= 2) {
      for (int q = 0; q < n; q += 2 * d) parts[q] = adasum_pair(parts[q], parts[q + d]);
    }
    for (std::size_t i = 0; i < lens[t]; ++i) {
      CHECK(std::fabs(bufs[t][i] - parts[0][i]) <= 1e-5 * (1.0 + std::fabs(parts[0][i])));
    }
  }
  const int last = join();
  CHECK((last >= 1 && last < n));
}

TEST_CASE("mpi: steady-state negotiation rounds are log depth, ceil(log2 n) messages each "
          "(two tiers across hosts of several ranks: ceil(log2 hosts) from local rank 0)",
          "[mpi]") {
  const Options o = test_options();
  Session s(o);
  // Across hosts of several ranks each the rounds are tiered, on the
  // hierarchical layout's groups (set up unless both hierarchical options
  // are 0), unless an option turns it (or shared memory, or log depth) off.
  const bool hierarchical_layout = o.hierarchical_allreduce != 0 || o.hierarchical_allgather != 0;
  const bool tiered = cross_size() > 1 && size() > cross_size() && hierarchical_layout &&
                      o.host_negotiation != 0 && o.shared_memory != 0 && o.log_negotiation != 0;
  CHECK(runtime_stats().negotiation_tier_hosts == (tiered ? cross_size() : 0));
  const std::uint64_t log2n = log_depth_messages(runtime_stats());
  std::vector<float> a(64, 1.0f), b(1000, 2.0f);
  auto step = [&] {
    Handle ha = allreduce_async("ld.a", view(a), view(a), ReduceOp::kAverage);
    Handle hb = allreduce_async("ld.b", view(b), view(b), ReduceOp::kAverage);
    ha.wait();
    hb.wait();
  };
  step();  // the first submissions travel in full and fill the response cache
  barrier();
  const RuntimeStats before = runtime_stats();
  constexpr int kSteps = 30;
  for (int i = 0; i < kSteps; ++i) step();
  const RuntimeStats after = runtime_stats();
  CHECK(a[0] == 1.0f);
  CHECK(b[999] == 2.0f);
  const std::uint64_t rounds = after.rounds - before.rounds;
  const std::uint64_t log_depth = after.log_depth_rounds - before.log_depth_rounds;
  const std::uint64_t messages = after.negotiation_messages - before.negotiation_messages;
  INFO("rounds " << rounds << ", log-depth rounds " << log_depth << ", messages " << messages);
  // Every operation ran in a log-depth round.
  CHECK(log_depth >= static_cast<std::uint64_t>(kSteps));
  CHECK(after.cache_hits_sent - before.cache_hits_sent == 2u * kSteps);
  CHECK(after.requests_sent == before.requests_sent);
  CHECK(messages >= log2n * log_depth);
  // A round takes the full exchange only when a hit waits past the hold
  // limit (1 s: a rank descheduled that long); otherwise each round is
  // exactly ceil(log2 n) messages from this rank.
  if (rounds == log_depth) CHECK(messages == log2n * rounds);
}

TEST_CASE("mpi: barriers back to back are cache hits in log-depth rounds (numbered names)",
          "[mpi]") {
  // Each barrier is a name used once ("__gyre.barrier.<k>"); the response
  // cache takes it as its stream's next call.
  Session s(test_options());
  barrier();
  barrier();
  const RuntimeStats before = runtime_stats();
  constexpr int kBarriers = 20;
  for (int i = 0; i < kBarriers; ++i) barrier();
  const RuntimeStats after = runtime_stats();
  CHECK(after.cache_hits_sent - before.cache_hits_sent == static_cast<std::uint64_t>(kBarriers));
  CHECK(after.requests_sent == before.requests_sent);
  if (size() > 1 && test_options().log_negotiation != 0) {
    CHECK(after.log_depth_rounds - before.log_depth_rounds >=
          static_cast<std::uint64_t>(kBarriers));
  }
}

TEST_CASE("mpi: a repeated small allreduce is reduced within the negotiation round where the "
          "round is recursive doubling (GYRE_SPECULATE_BYTES)",
          "[mpi]") {
  const Options o = test_options();
  Session s(o);
  // Where the round gives the backend's own bits: 2 ranks (any layout), a
  // power of two of ranks each alone on its host (recursive doubling), any
  // number on one host over shared memory (rank order); not at 3 ranks on
  // the flat transport (the runtime's own flag says which).
  // Over shared memory the round carries up to 64 bytes; elsewhere up to
  // the backend's recursive doubling (GYRE_ALLREDUCE_SMALL_BYTES).
  const bool shm = cross_size() == 1 && o.shared_memory != 0;
  const bool on = o.speculate_bytes >= 8 && o.log_negotiation != 0 && o.cache_capacity > 0 &&
                  (shm || o.allreduce_small_bytes >= 8);
  const RuntimeStats st = runtime_stats();
  if (size() == 2) CHECK(st.speculation == on);
  if (shm && on) CHECK(st.speculation);
  if (size() == 3 && o.shared_memory == 0) CHECK_FALSE(st.speculation);
  const bool exact = st.speculation;
  const RuntimeStats before = runtime_stats();
  constexpr int kIters = 40;
  const double n = size();
  for (int i = 0; i < kIters; ++i) {
    std::vector<float> x = {static_cast<float>(rank() + i), 0.5f};
    allreduce_async("spec.sum", view(x), view(x), ReduceOp::kSum).wait();
    CHECK(x[0] == static_cast<float>(n * (n - 1) / 2 + n * i));
    CHECK(x[1] == static_cast<float>(0.5 * n));
    std::vector<double> y = {static_cast<double>(rank() * 3 + i)};
    allreduce_async("spec.avg", view(y), view(y), ReduceOp::kAverage).wait();
    CHECK(y[0] == Approx(3 * (n - 1) / 2 + i));
  }
  const RuntimeStats after = runtime_stats();
  const std::uint64_t speculated = after.speculated_allreduces - before.speculated_allreduces;
  INFO("speculated " << speculated << " of " << 2 * kIters);
  if (on && exact) {
    CHECK(speculated > 0);
  } else {
    CHECK(speculated == 0);
  }
}

TEST_CASE("mpi: a small allreduce gives the same bits on every call, speculated or not",
          "[mpi]") {
  // Float sums whose result depends on the order of the additions: the
  // first call (not yet in the response cache) runs the backend's
  // collective, later ones may be reduced within the negotiation round.
  // Every call must give the same bits: at 4 ranks over shared memory the
  // round's pairwise order ((x0+x1)+(x2+x3): 0 here) differs from the
  // backend's rank order (((x0+x1)+x2)+x3: 1), so the round must reduce in
  // rank order there.
  Session s(test_options());
  const float pattern[4] = {1e8f, 1.0f, -1e8f, 1.0f};
  std::vector<float> first;
  int differ = 0;
  for (int i = 0; i < 40; ++i) {
    std::vector<float> x = {pattern[rank() % 4], pattern[(rank() + 1) % 4]};
    allreduce_async("spec.order", view(x), view(x), ReduceOp::kSum).wait();
    if (i == 0) first = x;
    differ += x != first;
  }
  INFO("first call " << first[0] << ", " << first[1]);
  CHECK(differ == 0);
}

TEST_CASE("mpi: runtime_stats' negotiation counters agree with each other while rounds run",
          "[mpi]") {
  // Idle rounds run in the background (log depth: ceil(log2 n) messages
  // each), and a rank spends much of an idle round waiting for a peer that
  // sleeps between its own. Read at any moment, the counters must describe
  // whole rounds: a snapshot taken part-way through a round once counted
  // its messages but not the round, so that a later difference came out
  // short by one round's messages.
  Session s(test_options());
  const std::uint64_t log2n = log_depth_messages(runtime_stats());
  std::vector<float> a(64, 1.0f);
  allreduce_async("agree.a", view(a), view(a), ReduceOp::kSum).wait();  // fills the cache
  barrier();
  const RuntimeStats base = runtime_stats();
  int samples = 0, whole = 0, mismatched = 0;
  std::uint64_t seen_rounds = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(400);
  while (std::chrono::steady_clock::now() < until) {
    const RuntimeStats st = runtime_stats();
    ++samples;
    const std::uint64_t rounds = st.rounds - base.rounds;
    seen_rounds = rounds;
    if (st.log_depth_rounds - base.log_depth_rounds != rounds) continue;  // a full exchange ran
    ++whole;
    if (st.negotiation_messages - base.negotiation_messages != log2n * rounds) ++mismatched;
    std::this_thread::yield();
  }
  barrier();
  INFO("samples " << samples << ", all-log-depth " << whole << ", mismatched " << mismatched
                  << ", rounds " << seen_rounds);
  CHECK(whole > 0);
  CHECK(mismatched == 0);
}

TEST_CASE("mpi: runtime_stats counts the bytes the runtime sends over its transport", "[mpi]") {
  // Without shared memory an allreduce's data goes over the transport: every
  // rank sends at least (n - 1) / n of the buffer (the ring 2 (n - 1) / n;
  // Rabenseifner's algorithm on n not a power of two: a folded rank sends
  // its whole buffer once, its partner up to twice); with shared memory
  // only the negotiation would.
  Options o = test_options();
  o.shared_memory = 0;
  Session s(o);
  const int n = size();
  std::vector<float> big(1 << 18, 1.0f);  // 1 MiB: above the small-message size
  allreduce_async("bytes.warm", view(big), view(big), ReduceOp::kSum).wait();
  const RuntimeStats before = runtime_stats();
  allreduce_async("bytes.big", view(big), view(big), ReduceOp::kSum).wait();
  const RuntimeStats after = runtime_stats();
  CHECK(big[12345] == static_cast<float>(n * n));
  const std::uint64_t bytes = after.transport_bytes - before.transport_bytes;
  const std::uint64_t floor =
      (static_cast<std::uint64_t>(n) - 1) * (1u << 20) / static_cast<std::uint64_t>(n);
  INFO("bytes sent " << bytes << ", at least " << floor);
  CHECK(bytes >= floor);
  // And not more than the data twice over, plus the negotiation.
  CHECK(bytes <= 2u * (1u << 20) + (64u << 10));
  CHECK(after.transport_messages > before.transport_messages);
  CHECK(after.transport_bytes - before.transport_bytes >=
        after.negotiation_messages - before.negotiation_messages);
}
