// Run on every rank of a job across several (simulated) hosts of several
// ranks each, GYRE_AUTOTUNE=1: allreduces of three size classes, fifteen
// calls each (the tuner's warm-up and up to three blocks of four trials,
// both forms, then at least two of the chosen one),
// each checked against its closed form; then the tuner's choices in
// runtime_stats(): one per class, with both forms timed, and the same on
// every rank (an allgather of each rank's). Exits non-zero on any rank that
// saw a difference; prints the choices on rank 0.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gyre/gyre.h"

using namespace gyre;

int main() {
  Options o = Options::from_env();
  o.autotune = 1;
  o.hierarchical_allreduce = -1;
  o.op_timeout_s = 120;
  init(o);
  const int n = size(), me = rank();
  int wrong = 0;
  constexpr std::size_t kSizes[] = {std::size_t{256} << 10, std::size_t{1} << 20,
                                    std::size_t{4} << 20};
  for (std::size_t bytes : kSizes) {
    const std::size_t count = bytes / sizeof(float);
    for (int call = 0; call < 15; ++call) {
      // Sum of small integers: exact in float32 in any order.
      std::vector<float> v(count);
      for (std::size_t i = 0; i < count; ++i) v[i] = static_cast<float>((me + i + call) % 7);
      TensorView t{v.data(), DataType::kFloat32, {static_cast<std::int64_t>(count)}};
      allreduce_async("tuned." + std::to_string(bytes), t, t, ReduceOp::kSum).wait();
      for (std::size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int r = 0; r < n; ++r) want += static_cast<float>((r + i + call) % 7);
        if (v[i] != want) {
          std::fprintf(stderr, "rank %d: allreduce of %zu bytes, call %d, element %zu: %g, not %g\n",
                       me, bytes, call, i, v[i], want);
          ++wrong;
          break;
        }
      }
    }
  }
  const RuntimeStats st = runtime_stats();
  // Each choice as words: the class, the model's form, the chosen form.
  std::vector<std::int64_t> mine;
  for (const auto& t : st.autotune) {
    mine.insert(mine.end(), {static_cast<std::int64_t>(t.min_bytes), t.model_hierarchical,
                             t.hierarchical});
    if (!(t.flat_s_per_mib > 0 && t.hierarchical_s_per_mib > 0 && t.trials >= 2)) {
      std::fprintf(stderr, "rank %d: class %zu B: a form not timed\n", me, t.min_bytes);
      ++wrong;
    }
  }
  if (st.autotune.size() != std::size(kSizes)) {
    std::fprintf(stderr, "rank %d: %zu size classes tuned, not %zu\n", me, st.autotune.size(),
                 std::size(kSizes));
    ++wrong;
  }
  mine.resize(3 * std::size(kSizes), -1);
  Handle h = allgather_async("choices", TensorView{mine.data(), DataType::kInt64,
                                                   {1, static_cast<std::int64_t>(mine.size())}});
  h.wait();
  const std::size_t row = mine.size() * sizeof(std::int64_t);
  for (int r = 0; r < n; ++r) {
    if (std::memcmp(h.output().data.data() + r * row, mine.data(), row) != 0) {
      std::fprintf(stderr, "rank %d: rank %d's autotune choices differ from this rank's\n", me, r);
      ++wrong;
    }
  }
  // Every rank's count of differences, so rank 0's line covers the job.
  std::int32_t total = wrong;
  TensorView tv{&total, DataType::kInt32, {1}};
  allreduce("wrong", tv, tv, ReduceOp::kSum);
  if (me == 0) {
    for (const auto& t : st.autotune) {
      std::printf("autotune_check: %zu KiB, %d calls of each: flat %.3f ms/MiB, hierarchical "
                  "%.3f; model %s, chosen %s\n", t.min_bytes >> 10, t.trials, t.flat_s_per_mib * 1e3,
                  t.hierarchical_s_per_mib * 1e3, t.model_hierarchical ? "hierarchical" : "flat",
                  t.hierarchical ? "hierarchical" : "flat");
    }
    std::printf("autotune_check: %d hosts x %d ranks: %d differences\n", cross_size(),
                n / cross_size(), total);
  }
  shutdown();
  return total == 0 ? 0 : 1;
}
