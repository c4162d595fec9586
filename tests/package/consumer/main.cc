// A C++ training job's view of gyre: found with find_package, linked as
// gyre::gyre, only the installed headers. Exits non-zero on a wrong sum.
#include <gyre/gyre.h>
#include <gyre/view.h>

#include <cstdint>
#include <cstdio>
#include <vector>

int main() {
  gyre::init();
  std::vector<float> x{1, 2, 3, 4};
  gyre::TensorView v = gyre::view(x, {2, 2});
  gyre::allreduce_async("x", v, v, gyre::ReduceOp::kSum).wait();
  const float n = static_cast<float>(gyre::size());
  bool ok = x[0] == 1 * n && x[1] == 2 * n && x[2] == 3 * n && x[3] == 4 * n;
  std::printf("rank %d of %d: [%g %g %g %g] %s\n", gyre::rank(), gyre::size(), x[0], x[1], x[2],
              x[3], ok ? "ok" : "WRONG");
  // The element type is deduced, and a shape that does not fit is refused.
  std::vector<gyre::bfloat16_t> half(6);
  const std::vector<std::int64_t> counts(3);
  ok = ok && gyre::view(half, {2, 3}).dtype == gyre::DataType::kBFloat16 &&
       gyre::view(counts).dtype == gyre::DataType::kInt64 && gyre::view(counts).shape[0] == 3;
  try {
    gyre::view(half, {4});
    ok = false;
  } catch (const gyre::InvalidArgument&) {
  }
  gyre::shutdown();
  return ok ? 0 : 1;
}
