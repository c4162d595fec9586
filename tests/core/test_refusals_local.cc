// A call refused on one rank fails the operation on every rank within one
// negotiation round: 3 runtimes as threads over LocalTransport, one rank
// passing what a binding could not convert or the runtime cannot take.
#include <catch2/catch.hpp>

#include <chrono>
#include <future>
#include <limits>

#include "local_job.h"

using namespace gyre;
using namespace gyre::test;
using core::Runtime;

namespace {

// The stall timeout stays at its default (600 s): only the announcement of
// the refusal can end the other ranks' operations within the bound below.
Options options() {
  Options o = fast_options();
  return o;
}

constexpr double kBoundSeconds = 10.0;  // generous; far below the stall timeout

// Every rank: `bad_rank` calls `refused` (expected to throw InvalidArgument
// at once), the others call `valid` and wait for it. Each rank's message
// must contain `reason`; the others' must name the refusing rank. Returns
// after checking the time each rank took.
template <typename Refused, typename Valid>
void expect_refused_everywhere(int r, int bad_rank, const std::string& reason, Refused&& refused,
                               Valid&& valid) {
  const auto start = std::chrono::steady_clock::now();
  std::string msg;
  if (r == bad_rank) {
    msg = expect_throw<InvalidArgument>(r, [&] { refused(); });
  } else {
    msg = expect_throw<InvalidArgument>(r, [&] { wait_for(valid(), kBoundSeconds); });
    expect(contains(msg, fmt::format("failed on rank {}", bad_rank)), r,
           "the refusing rank named in: " + msg);
  }
  expect(contains(msg, reason), r, "'" + reason + "' in: " + msg);
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  expect(took.count() < kBoundSeconds, r, fmt::format("refusal within {} s, took {} s",
                                                      kBoundSeconds, took.count()));
}

}  // namespace

TEST_CASE("local: a refusal on one rank fails the operation on every rank at once",
          "[runtime][refusal]") {
  // Each rank's checks throw (Catch2's are not thread-safe); run() rethrows.
  REQUIRE_NOTHROW(LocalJob::run(3, options(), [&](int r, Runtime& rt) {
    std::vector<float> good(4, 1.0f);

    // A binding's conversion failure, carried in the view.
    TensorView converted = view(good);
    converted.refusal = "input has unsupported dtype int16";
    expect_refused_everywhere(
        r, 2, "unsupported dtype int16",
        [&] { core::allreduce_async(rt, "refused.conversion", converted, converted); },
        [&] { return core::allreduce_async(rt, "refused.conversion", view(good), view(good)); });

    // An enum value gyre has none for: it must not travel in the
    // announcement (the other ranks' decoder would take the whole
    // negotiation message for malformed).
    TensorView unknown_dtype = view(good);
    unknown_dtype.dtype = static_cast<DataType>(200);
    expect_refused_everywhere(
        r, 1, "unknown dtype",
        [&] { core::allreduce_async(rt, "refused.dtype", unknown_dtype, unknown_dtype); },
        [&] { return core::allreduce_async(rt, "refused.dtype", view(good), view(good)); });
    expect_refused_everywhere(
        r, 0, "unknown reduction op 17",
        [&] {
          core::reducescatter_async(rt, "refused.op", view(good), static_cast<ReduceOp>(17));
        },
        [&] { return core::reducescatter_async(rt, "refused.op", view(good), ReduceOp::kSum); });

    // Semantic checks of values a binding passes through unjudged.
    expect_refused_everywhere(
        r, 1, "scale factors must be finite",
        [&] {
          core::allreduce_async(rt, "refused.scale", view(good), view(good), ReduceOp::kSum,
                                std::numeric_limits<double>::quiet_NaN());
        },
        [&] {
          return core::allreduce_async(rt, "refused.scale", view(good), view(good),
                                       ReduceOp::kSum);
        });
    expect_refused_everywhere(
        r, 2, "root rank 3 is not a rank",
        [&] { core::broadcast_async(rt, "refused.root", view(good), 3); },
        [&] { return core::broadcast_async(rt, "refused.root", view(good), 0); });
    expect_refused_everywhere(
        r, 0, "add up to 2 but the input has 4 rows",
        [&] { core::alltoall_async(rt, "refused.splits", view(good), {1, 1, 0}); },
        [&] { return core::alltoall_async(rt, "refused.splits", view(good), {2, 1, 1}); });

    // The runtime goes on: a valid operation afterwards completes.
    std::vector<float> after(4, 1.0f);
    wait_for(core::allreduce_async(rt, "after.refusals", view(after), view(after),
                                   ReduceOp::kSum));
    GYRE_EXPECT(r, after == std::vector<float>(4, 3.0f));
  }));
}

TEST_CASE("local: a refused call of a name already pending leaves that operation valid",
          "[runtime][refusal]") {
  std::promise<void> refused_promise;
  auto refused = refused_promise.get_future().share();
  REQUIRE_NOTHROW(LocalJob::run(3, options(), [&](int r, Runtime& rt) {
    std::vector<float> x(4, 1.0f);
    Handle h;
    if (r == 0) {
      h = core::allreduce_async(rt, "pending", view(x), view(x), ReduceOp::kSum);
      TensorView null_view{nullptr, DataType::kFloat32, {4}};
      auto msg = expect_throw<InvalidArgument>(r, [&] {
        core::allreduce_async(rt, "pending", null_view, null_view, ReduceOp::kSum);
      });
      // The duplicate check comes before the argument checks: the refusal
      // names the pending operation, not the null buffer.
      GYRE_EXPECT(r, contains(msg, "pending"));
      refused_promise.set_value();
    } else {
      // Enqueued after rank 0's refusal: the first "pending" is certainly
      // still pending there when the refusal happens.
      GYRE_EXPECT(r, refused.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
      h = core::allreduce_async(rt, "pending", view(x), view(x), ReduceOp::kSum);
    }
    wait_for(h, kBoundSeconds);
    GYRE_EXPECT(r, x == std::vector<float>(4, 3.0f));
  }));
}
