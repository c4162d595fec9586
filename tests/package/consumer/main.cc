// A C++ training job's view of gyre: found with find_package, linked as
// gyre::gyre, only the installed headers. Exits non-zero on a wrong sum.
#include <gyre/gyre.h>

#include <cstdio>

int main() {
  gyre::init();
  float x[4] = {1, 2, 3, 4};
  gyre::TensorView v{x, gyre::DataType::kFloat32, {4}};
  gyre::allreduce_async("x", v, v, gyre::ReduceOp::kSum).wait();
  const float n = static_cast<float>(gyre::size());
  bool ok = x[0] == 1 * n && x[1] == 2 * n && x[2] == 3 * n && x[3] == 4 * n;
  std::printf("rank %d of %d: [%g %g %g %g] %s\n", gyre::rank(), gyre::size(), x[0], x[1], x[2],
              x[3], ok ? "ok" : "WRONG");
  gyre::shutdown();
  return ok ? 0 : 1;
}
