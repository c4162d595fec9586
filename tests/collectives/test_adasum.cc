// adasum_allreduce on the in-process transport with 1, 2, 4 and 8 ranks,
// against a reference computed here from the pairwise rule alone: the
// binary tree of pairs (r, r ^ 2^l), the lower rank's partial result as a,
//   a' = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b,
// in float64, per tensor of the buffer. Also: the refusals, fused tensors
// combined independently, scaling, and bit-identical results on all ranks.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gyre/collectives/algorithms.h"
#include "gyre/collectives/local_transport.h"
#include "gyre/error.h"
#include "test_support.h"

using namespace gyre;
using namespace gyre::collectives;
using gyre::transport::run_local_world;

namespace {

constexpr std::chrono::milliseconds kTimeout{60000};

using Vec = std::vector<double>;

// The pairwise rule on one tensor.
Vec pair_rule(const Vec& a, const Vec& b) {
  double ab = 0, aa = 0, bb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ab += a[i] * b[i];
    aa += a[i] * a[i];
    bb += b[i] * b[i];
  }
  const double ca = aa == 0 ? 1.0 : 1.0 - ab / (2 * aa);
  const double cb = bb == 0 ? 1.0 : 1.0 - ab / (2 * bb);
  Vec out(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) out[i] = ca * a[i] + cb * b[i];
  return out;
}

// The tree over ranks: level by level, rank r (bit l clear) with r + 2^l.
Vec reference(std::vector<Vec> parts) {
  for (std::size_t d = 1; d < parts.size(); d *= 2) {
    for (std::size_t r = 0; r < parts.size(); r += 2 * d) parts[r] = pair_rule(parts[r], parts[r + d]);
  }
  return parts[0];
}

struct Layout {
  std::size_t count = 0;
  std::vector<TensorExtent> tensors;  // empty: one tensor
};

// Runs Adasum of rank-dependent random data of `dt`; checks every rank
// against the reference (each tensor on its own) within `tol`, and that all
// ranks agree bit for bit.
void check_adasum(int n, DataType dt, const Layout& lay, double tol, bool in_place = true,
                  double prescale = 1.0, double postscale = 1.0) {
  INFO("ranks " << n << " dtype " << dtype_name(dt) << " count " << lay.count << " tensors "
                << lay.tensors.size() << (in_place ? " in place" : ""));
  const std::size_t esz = dtype_size(dt);
  std::mt19937 gen(static_cast<unsigned>(n * 131 + lay.count));
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<std::vector<std::byte>> in(n, std::vector<std::byte>(lay.count * esz));
  std::vector<Vec> values(n, Vec(lay.count));
  for (int r = 0; r < n; ++r) {
    for (std::size_t i = 0; i < lay.count; ++i) {
      // Correlated gradients (a shared part plus noise), as Adasum meets them.
      test::store(dt, in[r].data(), i, std::sin(0.1 * i) + 0.5 * normal(gen));
      values[r][i] = test::load(dt, in[r].data(), i) * prescale;
    }
  }
  std::vector<std::vector<std::byte>> out(n, std::vector<std::byte>(lay.count * esz));
  const auto original = in;
  run_local_world(n, [&](transport::Transport& t) {
    AdasumOptions o;
    o.tag = 5;
    o.prescale = prescale;
    o.postscale = postscale;
    auto& src = in[t.rank()];
    void* dst = in_place ? static_cast<void*>(src.data()) : out[t.rank()].data();
    adasum_allreduce(t, src.data(), dst, lay.count, dt, lay.tensors, o);
  }, kTimeout);
  if (in_place) out = in;
  if (!in_place) CHECK(in == original);

  std::vector<TensorExtent> tensors = lay.tensors;
  if (tensors.empty()) tensors.push_back({0, lay.count});
  std::size_t wrong = 0;
  for (const TensorExtent& e : tensors) {
    std::vector<Vec> parts(n);
    for (int r = 0; r < n; ++r) {
      parts[r].assign(values[r].begin() + e.offset, values[r].begin() + e.offset + e.count);
    }
    const Vec want = reference(parts);
    for (std::size_t i = 0; i < e.count; ++i) {
      const double got = test::load(dt, out[0].data(), e.offset + i);
      if (std::fabs(got - want[i] * postscale) > tol * std::max(1.0, std::fabs(want[i]))) {
        if (wrong++ < 3) {
          UNSCOPED_INFO("element " << e.offset + i << ": got " << got << ", want "
                                   << want[i] * postscale);
        }
      }
    }
  }
  CHECK(wrong == 0);
  for (int r = 1; r < n; ++r) CHECK(out[r] == out[0]);
}

std::string refusal(int n, const std::function<void(transport::Transport&)>& fn) {
  try {
    run_local_world(n, fn, kTimeout);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("adasum: one tensor, 1/2/4/8 ranks, every floating type", "[adasum]") {
  for (int n : {1, 2, 4, 8}) {
    for (std::size_t count : {std::size_t{1}, std::size_t{3}, std::size_t{7}, std::size_t{1000},
                              std::size_t{4099}}) {
      check_adasum(n, DataType::kFloat64, {count, {}}, 1e-12);
      check_adasum(n, DataType::kFloat32, {count, {}}, 1e-5, count % 2 == 0);
      // 16-bit types round every partial result to the type at each level.
      check_adasum(n, DataType::kFloat16, {count, {}}, 2e-2);
      check_adasum(n, DataType::kBFloat16, {count, {}}, 1e-1);
    }
  }
}

TEST_CASE("adasum: the two-rank rule on a closed form", "[adasum]") {
  // a = (1, 0), b = (1, 1): a.b = 1, |a|^2 = 1, |b|^2 = 2, so
  // a' = 0.5 a + 0.75 b = (1.25, 0.75).
  std::vector<std::vector<double>> v = {{1, 0}, {1, 1}};
  run_local_world(2, [&](transport::Transport& t) {
    auto& x = v[t.rank()];
    adasum_allreduce(t, x.data(), x.data(), 2, DataType::kFloat64, {});
  }, kTimeout);
  CHECK(v[0] == std::vector<double>{1.25, 0.75});
  CHECK(v[1] == v[0]);
  // Orthogonal gradients add; identical ones are averaged.
  std::vector<std::vector<float>> o = {{2, 0}, {0, 3}}, same = {{4, -2}, {4, -2}};
  run_local_world(2, [&](transport::Transport& t) {
    adasum_allreduce(t, o[t.rank()].data(), o[t.rank()].data(), 2, DataType::kFloat32, {});
    adasum_allreduce(t, same[t.rank()].data(), same[t.rank()].data(), 2, DataType::kFloat32, {});
  }, kTimeout);
  CHECK(o[0] == std::vector<float>{2, 3});
  CHECK(same[1] == std::vector<float>{4, -2});
  // A zero vector is neutral.
  std::vector<std::vector<double>> z = {{0, 0, 0}, {1, -2, 3}};
  run_local_world(2, [&](transport::Transport& t) {
    adasum_allreduce(t, z[t.rank()].data(), z[t.rank()].data(), 3, DataType::kFloat64, {});
  }, kTimeout);
  CHECK(z[0] == std::vector<double>{1, -2, 3});
}

TEST_CASE("adasum: tensors of a fused buffer are combined independently", "[adasum]") {
  for (int n : {2, 4, 8}) {
    // Uneven tensors with gaps (padding) between them, some shorter than the
    // number of ranks, one spanning several ranks' halves.
    Layout lay{1200, {{0, 5}, {16, 300}, {320, 1}, {336, 700}, {1040, 3}, {1056, 144}}};
    check_adasum(n, DataType::kFloat64, lay, 1e-12);
    check_adasum(n, DataType::kFloat32, lay, 1e-5, false);
  }
  // One tensor per element.
  Layout each{9, {}};
  for (std::size_t i = 0; i < 9; ++i) each.tensors.push_back({i, 1});
  check_adasum(4, DataType::kFloat64, each, 1e-12);
}

TEST_CASE("adasum: prescale and postscale", "[adasum]") {
  check_adasum(4, DataType::kFloat64, {100, {}}, 1e-12, true, 0.5, 3.0);
  check_adasum(2, DataType::kFloat32, {33, {}}, 1e-5, false, 2.0, 0.25);
}

TEST_CASE("adasum: refusals before any transfer", "[adasum]") {
  std::vector<float> buf(8, 1.0f);
  using Catch::Matchers::Contains;
  CHECK_THAT(refusal(3, [&](auto& t) {
               std::vector<float> b(8, 1.0f);
               adasum_allreduce(t, b.data(), b.data(), 8, DataType::kFloat32, {});
             }),
             Contains("power-of-two number of ranks, this job has 3"));
  CHECK_THAT(refusal(2, [&](auto& t) {
               std::vector<std::int32_t> b(8, 1);
               adasum_allreduce(t, b.data(), b.data(), 8, DataType::kInt32, {});
             }),
             Contains("floating types, not int32"));
  CHECK_THAT(refusal(2, [&](auto& t) {
               std::vector<float> b(8, 1.0f);
               const TensorExtent bad[] = {{0, 4}, {2, 4}};
               adasum_allreduce(t, b.data(), b.data(), 8, DataType::kFloat32, bad);
             }),
             Contains("overlaps the previous one"));
  CHECK_THAT(refusal(2, [&](auto& t) {
               std::vector<float> b(8, 1.0f);
               const TensorExtent bad[] = {{4, 5}};
               adasum_allreduce(t, b.data(), b.data(), 8, DataType::kFloat32, bad);
             }),
             Contains("ends past the buffer"));
  // Empty buffers are fine on any power of two.
  CHECK_NOTHROW(run_local_world(4, [&](transport::Transport& t) {
    adasum_allreduce(t, nullptr, nullptr, 0, DataType::kFloat32, {});
  }, kTimeout));
}
