// fingerprint_check and resync refused on one rank only: every rank fails
// the call with that rank's reason (no rank waits for it), and the internal
// names advance alike, so the next call pairs with the same call elsewhere.
#include <catch2/catch.hpp>

#include <vector>

#include "local_job.h"

using namespace gyre;
using namespace gyre::test;
using core::Runtime;

namespace {

// A stalled operation fails after 5 s: the code before this fix left the
// other ranks waiting for the refusing rank, and the test then fails in
// bounded time instead of hanging.
Options stalling_options() {
  Options o = fast_options();
  o.stall_shutdown_s = 5;
  return o;
}

TensorView null_buffer() {
  TensorView t;
  t.data = nullptr;
  t.dtype = DataType::kFloat32;
  t.shape = {4};
  return t;
}

}  // namespace

TEST_CASE("local: fingerprint_check refused on one rank fails everywhere, the next one pairs",
          "[runtime]") {
  const int n = GENERATE(2, 3);
  LocalJob::run(n, stalling_options(), [&](int r, Runtime& rt) {
    std::vector<float> a(4, 1.0f);
    std::vector<NamedBuffer> mine{{"w", r == 1 ? null_buffer() : view(a)}};
    auto msg = expect_throw<InvalidArgument>(r, [&] { core::fingerprint_check(rt, mine); });
    GYRE_EXPECT(r, contains(msg, "'w' is null"));
    if (r != 1) GYRE_EXPECT(r, contains(msg, "rank 1"));
    // Next call: rank n-1 holds another value, and that is all it reports.
    std::vector<float> b(4, r == n - 1 ? 2.0f : 1.0f);
    auto mm = core::fingerprint_check(rt, {{"w", view(b)}});
    GYRE_EXPECT(r, mm.size() == 1 && mm[0].name == "w" && mm[0].groups.size() == 2);
  });
}

TEST_CASE("local: resync refused on one rank fails everywhere, the next one pairs", "[runtime]") {
  const int n = GENERATE(2, 3);
  LocalJob::run(n, stalling_options(), [&](int r, Runtime& rt) {
    std::vector<float> a(4, static_cast<float>(r));
    std::vector<NamedBuffer> mine{{"w", r == 1 ? null_buffer() : view(a)}};
    auto msg = expect_throw<InvalidArgument>(
        r, [&] { core::resync(rt, mine, ResyncPolicy::kAverage); });
    GYRE_EXPECT(r, contains(msg, "'w' is null"));
    // An integer buffer cannot be averaged: refused on rank 0 alone.
    std::vector<std::int32_t> ints(4, 0);
    TensorView iv{ints.data(), DataType::kInt32, {4}};
    std::vector<NamedBuffer> second{{"w", r == 0 ? iv : view(a)}};
    msg = expect_throw<InvalidArgument>(
        r, [&] { core::resync(rt, second, ResyncPolicy::kAverage); });
    GYRE_EXPECT(r, contains(msg, "floating"));
    core::resync(rt, {{"w", view(a)}}, ResyncPolicy::kAverage);
    for (float x : a) GYRE_EXPECT(r, x == static_cast<float>(n - 1) / 2.0f);
  });
}
