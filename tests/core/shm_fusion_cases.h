// Tensors for comparing the paths of a fused allreduce (shared-memory
// fusion buffers, slots, ring): every dtype and op, odd sizes that change
// from step to step, inputs whose floating-point sums depend on the order of
// the additions and inputs whose reduction is exact.
#pragma once

#include <string>
#include <vector>

#include <fmt/format.h>

#include "../collectives/test_support.h"
#include "gyre/types.h"

namespace gyre::test {

struct Spec {
  std::string name;
  DataType dt;
  ReduceOp op;
  std::size_t count;
  bool exact;  // small integers: every reduction order gives the same bits
  double prescale = 1.0, postscale = 1.0;
};

inline bool floating(DataType dt) {
  return dt == DataType::kFloat32 || dt == DataType::kFloat64 || dt == DataType::kFloat16 ||
         dt == DataType::kBFloat16;
}

inline double value(const Spec& s, int r, std::size_t i, int step) {
  const double base = contribution(s.op, r, i + static_cast<std::size_t>(step));
  if (s.exact || !floating(s.dt)) return base;
  // Fractions no binary type holds: the sum's bits depend on its order.
  return base + 0.1 * static_cast<double>((i * 7 + static_cast<std::size_t>(r) * 13 +
                                           static_cast<std::size_t>(step)) % 10);
}

// The small tensors of one step: three per dtype and op, of odd sizes that
// change from step to step, so that buckets and their layouts differ.
inline std::vector<Spec> small_specs(int step) {
  std::vector<Spec> specs;
  for (DataType dt : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      if (!op_defined(dt, op)) continue;
      const std::size_t counts[] = {1, 13 + static_cast<std::size_t>(step),
                                    1001 - 3 * static_cast<std::size_t>(step)};
      for (std::size_t k = 0; k < 3; ++k) {
        Spec s{fmt::format("s{}.{}.{}.{}", step, dtype_name(dt), op_name(op), k), dt, op,
               counts[k], k == 0 || !floating(dt)};
        if (k == 2 && floating(dt) && op == ReduceOp::kSum) s.prescale = 0.5, s.postscale = 3.0;
        specs.push_back(s);
      }
    }
  }
  return specs;
}

// The tensor spec and step of every exact tensor of `steps` steps, whose
// result has a closed form (expected()).
struct ExactCase {
  Spec spec;
  int step;
};
inline std::vector<ExactCase> exact_cases(int steps) {
  std::vector<ExactCase> cases;
  for (int step = 0; step < steps; ++step) {
    for (const Spec& s : small_specs(step)) {
      if (s.exact) cases.push_back({s, step});
    }
  }
  return cases;
}

}  // namespace gyre::test
