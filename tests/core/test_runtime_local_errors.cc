// The runtime's answers to a rank's own mistakes, with ranks as threads of
// this process over LocalTransport: refused calls, reused names.
#include <catch2/catch.hpp>

#include <future>

#include "local_job.h"

using namespace gyre;
using namespace gyre::test;
using core::Runtime;

namespace {

Options fast_options() {
  Options o;
  o.cycle_time_ms = 0.5;
  o.op_timeout_s = 60;
  return o;
}

}  // namespace

TEST_CASE("local: a refused call of a pending name leaves the pending operation valid",
          "[runtime][errors]") {
  std::promise<void> refused;
  auto refused_seen = refused.get_future().share();
  LocalJob::run(2, fast_options(), [&](int r, Runtime& rt) {
    std::vector<float> c(4, 1.0f);
    Handle h;
    if (r == 0) {
      h = core::allreduce_async(rt, "x", view(c), view(c), ReduceOp::kSum);
      // The same name again, with a bad buffer: refused as a duplicate,
      // not announced, so it cannot fail or replace the pending "x".
      TensorView null_view{nullptr, DataType::kFloat32, {4}};
      auto msg = expect_throw<InvalidArgument>(r, [&] {
        core::allreduce_async(rt, "x", null_view, null_view, ReduceOp::kSum);
      });
      GYRE_EXPECT(r, contains(msg, "'x'") && contains(msg, "already pending"));
      refused.set_value();
    } else {
      GYRE_EXPECT(r, refused_seen.wait_for(std::chrono::seconds(30)) ==
                         std::future_status::ready);
      h = core::allreduce_async(rt, "x", view(c), view(c), ReduceOp::kSum);
    }
    wait_for(h, 20.0);
    GYRE_EXPECT(r, c == std::vector<float>(4, 2.0f));
  });
}
