// Fused buckets over shared memory, with 2-4 ranks as threads over one
// region: gathered from their members chunk by chunk (never packed into a
// fusion buffer), they give the same bits as the same tensors reduced one by
// one (GYRE_FUSION_THRESHOLD=0), for every dtype and op and for inputs whose
// sums depend on the order of the additions; for inputs whose reduction is
// exact, the same bits as the ring over the transport and the closed form.
// Several steps in a row, a grouped bucket of 4 MB and a tensor above
// GYRE_FUSION_MAX_TENSOR.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gyre/collectives/shm.h"
#include "gyre/collectives/shm_host.h"
#include "local_job.h"
#include "shm_fusion_cases.h"

using namespace gyre;
using namespace gyre::test;
using core::Runtime;

namespace {

// Every rank's results, by tensor name.
using Results = std::vector<std::map<std::string, std::vector<std::byte>>>;

enum class Path { kRing, kShmFused, kShmUnfused };

constexpr int kSmallSteps = 4;
constexpr std::size_t kBigElems = 200'000;  // 800 KB of float32: fused, below 1 MiB

struct Run {
  Results results;
  std::vector<int> allocations_small, allocations_big;  // private fusion buffer, per rank
};

Run run(int n, Path path) {
  Options opt = fast_options();
  opt.op_timeout_s = 60;
  collectives::ShmOptions so;
  so.slot_bytes = 4096;  // many chunks per bucket
  so.timeout = std::chrono::milliseconds(60000);
  if (path == Path::kShmUnfused) opt.fusion_threshold_bytes = 0;
  const std::size_t region_bytes = collectives::ShmGroup::region_bytes(n, so.slot_bytes);
  std::unique_ptr<std::byte, void (*)(void*)> region(
      static_cast<std::byte*>(std::aligned_alloc(64, (region_bytes + 63) / 64 * 64)), std::free);
  std::memset(region.get(), 0, region_bytes);

  Run out;
  out.results.resize(static_cast<std::size_t>(n));
  out.allocations_small.resize(static_cast<std::size_t>(n));
  out.allocations_big.resize(static_cast<std::size_t>(n));
  LocalJob::Setup setup;
  if (path != Path::kRing) {
    setup = [&](int r, core::RuntimeInfo& info) {
      info.shm = transport::ShmHost::attach(region.get(), r, n, so);
    };
  }
  LocalJob::run(n, opt, [&](int r, Runtime& rt) {
    auto& mine = out.results[static_cast<std::size_t>(r)];
    auto take = [&](const Spec& s, std::vector<std::byte>& buf) { mine[s.name] = std::move(buf); };
    for (int step = 0; step < kSmallSteps; ++step) {
      const std::vector<Spec> specs = small_specs(step);
      std::vector<std::vector<std::byte>> bufs(specs.size());
      std::vector<Handle> handles;
      for (std::size_t k = 0; k < specs.size(); ++k) {
        const Spec& s = specs[k];
        bufs[k].resize(s.count * dtype_size(s.dt));
        for (std::size_t i = 0; i < s.count; ++i) store(s.dt, bufs[k].data(), i, value(s, r, i, step));
        TensorView t;
        t.data = bufs[k].data();
        t.dtype = s.dt;
        t.shape = {static_cast<std::int64_t>(s.count)};
        handles.push_back(core::allreduce_async(rt, s.name, t, t, s.op, s.prescale, s.postscale));
      }
      for (auto& h : handles) wait_for(h);
      for (std::size_t k = 0; k < specs.size(); ++k) take(specs[k], bufs[k]);
    }
    out.allocations_small[static_cast<std::size_t>(r)] = rt.fusion_allocations();

    // A grouped bucket of 5 x 800 KB and a tensor above GYRE_FUSION_MAX_TENSOR (1 MiB: reduced from the caller's
    // buffer).
    std::vector<Spec> big;
    for (int k = 0; k < 5; ++k) {
      big.push_back({fmt::format("big.{}", k), DataType::kFloat32, ReduceOp::kSum, kBigElems,
                     k % 2 == 0});
    }
    Spec lone{"lone", DataType::kFloat32, ReduceOp::kSum, 300'001, false};
    std::vector<std::vector<std::byte>> bufs(big.size() + 1);
    std::vector<TensorView> views;
    std::vector<std::string> names;
    for (std::size_t k = 0; k <= big.size(); ++k) {
      const Spec& s = k < big.size() ? big[k] : lone;
      bufs[k].resize(s.count * 4);
      for (std::size_t i = 0; i < s.count; ++i) store(s.dt, bufs[k].data(), i, value(s, r, i, 9));
      TensorView t;
      t.data = bufs[k].data();
      t.dtype = s.dt;
      t.shape = {static_cast<std::int64_t>(s.count)};
      views.push_back(t);
      names.push_back(s.name);
    }
    std::vector<TensorView> group(views.begin(), views.end() - 1);
    std::vector<std::string> group_names(names.begin(), names.end() - 1);
    Handle g = core::grouped_allreduce_async(rt, group_names, group, group, ReduceOp::kSum);
    Handle l = core::allreduce_async(rt, lone.name, views.back(), views.back(), ReduceOp::kSum);
    wait_for(g);
    wait_for(l);
    for (std::size_t k = 0; k < big.size(); ++k) take(big[k], bufs[k]);
    take(lone, bufs.back());
    out.allocations_big[static_cast<std::size_t>(r)] = rt.fusion_allocations();
  }, setup);
  return out;
}

}  // namespace

TEST_CASE("local shm: fused buckets gathered chunk by chunk give the bits of unfused tensors "
          "and of the ring", "[runtime][shm]") {
  for (int n : {2, 3, 4}) {
    INFO("ranks: " << n);
    const Run fused = run(n, Path::kShmFused);
    const Run unfused = run(n, Path::kShmUnfused);
    const Run ring = run(n, Path::kRing);
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r);
      const auto& b = fused.results[static_cast<std::size_t>(r)];
      const auto& s = unfused.results[static_cast<std::size_t>(r)];
      const auto& g = ring.results[static_cast<std::size_t>(r)];
      REQUIRE(b.size() == s.size());
      REQUIRE(b.size() == g.size());
      // Every tensor: the same bits as unfused, and as rank 0.
      for (const auto& [name, bits] : b) {
        INFO(name);
        CHECK(bits == s.at(name));
        CHECK(bits == fused.results[0].at(name));
      }
      // Exact inputs: the ring's bits, and the closed form.
      for (const ExactCase& c : exact_cases(kSmallSteps)) {
        INFO(c.spec.name);
        const auto& bits = b.at(c.spec.name);
        CHECK(bits == g.at(c.spec.name));
        bool all = true;
        for (std::size_t i = 0; i < c.spec.count && all; ++i) {
          const double want = expected(c.spec.dt, c.spec.op, n, i + static_cast<std::size_t>(c.step));
          const double tol = c.spec.op == ReduceOp::kAverage ? scaled_tolerance(c.spec.dt) : 0.0;
          all = close_enough(load(c.spec.dt, bits.data(), i), want, tol);
        }
        CHECK(all);
      }
      for (const char* name : {"big.0", "big.2", "big.4"}) {
        INFO(name);
        CHECK(b.at(name) == g.at(name));
      }
      // Over shared memory no bucket was packed: no fusion buffer was ever
      // allocated. The ring packs its buckets into one.
      CHECK(fused.allocations_big[static_cast<std::size_t>(r)] == 0);
      CHECK(ring.allocations_small[static_cast<std::size_t>(r)] >= 1);
    }
  }
}
