// Join as Horovod defines it, and grouped allreduces that ranks group
// differently: the coordinator's rules on their own (one process() call is
// one negotiation round), then the same through n runtimes in one process.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "execution/plan.h"
#include "local_job.h"
#include "negotiation/coordinator.h"

using namespace gyre;
using namespace gyre::core;
using gyre::test::contains;
using gyre::test::expect_throw;
using gyre::test::fast_options;
using gyre::test::LocalJob;
using gyre::test::view;
using gyre::test::wait_for;

namespace {

Request req(const std::string& name, Collective c, std::vector<std::int64_t> shape,
            ReduceOp op = ReduceOp::kSum) {
  Request r;
  r.name = name;
  r.collective = c;
  r.shape = std::move(shape);
  r.op = op;
  return r;
}

Request member(const std::string& name, const std::string& group, std::uint32_t size) {
  Request r = req(name, Collective::kAllreduce, {2});
  r.group = group;
  r.group_size = size;
  return r;
}

// rank r's requests: the members names[0..count) of a group of `count`.
std::vector<Request> group_of(int count) {
  std::vector<Request> out;
  for (int i = 0; i < count; ++i) out.push_back(member(fmt::format("g.{}", i), "g.0", count));
  return out;
}

}  // namespace

TEST_CASE("coordinator: while a rank has joined, allgather and broadcast fail and averages "
          "divide by every rank",
          "[coordinator][join]") {
  ResponseCache cache(16);
  Coordinator c(3, 0, 0);
  // Everyone runs "avg" once: it enters the response cache.
  std::vector<RoundMessage> msgs(3);
  Request avg = req("avg", Collective::kAllreduce, {4}, ReduceOp::kAverage);
  avg.seq = 1;
  for (auto& m : msgs) m.requests = {avg};
  auto out = c.process(msgs, cache, Clock::now());
  REQUIRE(out.responses.size() == 1);
  REQUIRE(out.responses[0].ok());
  CHECK(effective_reduction(out.responses[0]).postscale == Approx(1.0 / 3));
  avg.seq = 2;  // the name's second submission
  const auto slot = cache.find(avg);
  REQUIRE(slot);

  // Rank 0 joins; ranks 1 and 2 send "avg" again as a cache bit, and an
  // allgather, a broadcast and a sum reduce-scatter in full.
  msgs.assign(3, RoundMessage{});
  msgs[0].joined = true;
  for (int r : {1, 2}) {
    auto& m = msgs[static_cast<std::size_t>(r)];
    m.cache_hits = {*slot};
    m.requests = {req("ag", Collective::kAllgather, {2, 3}),
                  req("bc", Collective::kBroadcast, {5}),
                  req("rs", Collective::kReducescatter, {3})};
    m.requests[1].root = 1;
  }
  out = c.process(msgs, cache, Clock::now());
  REQUIRE(out.responses.size() == 4);
  CHECK_FALSE(out.join_completed);
  for (const Response& resp : out.responses) {
    INFO(resp.name << ": " << resp.error);
    if (resp.name == "avg" || resp.name == "rs") {
      CHECK(resp.ok());
      CHECK(resp.joined == std::vector<bool>{true, false, false});
      CHECK(resp.ranks_taking_part() == 3);
    } else {
      CHECK(resp.error_kind == ErrorKind::kState);
      CHECK_THAT(resp.error, Catch::Contains("rank 0 joined"));
    }
  }
  // Average over all three ranks, the joined one's zeros included.
  const auto averaged = std::find_if(out.responses.begin(), out.responses.end(),
                                [](const Response& r) { return r.name == "avg"; });
  CHECK(effective_reduction(*averaged).postscale == Approx(1.0 / 3));

  // Ranks 1 and 2 join in the same round: the last in rank order is the
  // last to join, and the flags reset.
  msgs.assign(3, RoundMessage{});
  for (auto& m : msgs) m.joined = true;
  out = c.process(msgs, cache, Clock::now());
  REQUIRE(out.join_completed);
  CHECK(*out.join_completed == 2);
  CHECK(c.joined() == std::vector<bool>{false, false, false});
}

TEST_CASE("coordinator: ranks grouping a tensor differently fail the whole group on every "
          "rank in one round",
          "[coordinator][group]") {
  // {rank 0's group size, rank 1's}, both ways round, and 3 ranks.
  for (auto sizes : std::vector<std::vector<int>>{{3, 2}, {2, 3}, {3, 3, 2}, {2, 3, 3}}) {
    const int n = static_cast<int>(sizes.size());
    INFO("group sizes " << fmt::format("{}", fmt::join(sizes, ", ")));
    ResponseCache cache(16);
    Coordinator c(n, 0, 0);
    std::vector<RoundMessage> msgs(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) msgs[static_cast<std::size_t>(r)].requests = group_of(sizes[r]);
    auto out = c.process(msgs, cache, Clock::now());
    // Every member any rank sent is answered, with a MismatchError.
    REQUIRE(out.responses.size() == 3);
    for (const Response& resp : out.responses) {
      INFO(resp.name << ": " << resp.error);
      CHECK(resp.error_kind == ErrorKind::kMismatch);
      CHECK_THAT(resp.error, Catch::Contains("group 'g.0' of 3") &&
                                 Catch::Contains("group 'g.0' of 2"));
    }
    CHECK_THAT(out.responses[0].error, Catch::Contains("ranks disagree on group"));
    CHECK_THAT(out.responses[2].error, Catch::Contains("'g.2': its grouped allreduce failed"));
    CHECK(c.pending().empty());
    // Nothing failed is cached; the next group of the same shape runs.
    CHECK(cache.size() == 0);
    for (auto& m : msgs) m.requests = group_of(2);
    out = c.process(msgs, cache, Clock::now());
    REQUIRE(out.responses.size() == 2);
    CHECK(out.responses[0].ok());
    CHECK(out.responses[1].ok());
  }
}

TEST_CASE("local: join as Horovod's tests define it", "[runtime][join]") {
  for (int n : {2, 3}) {
    LocalJob::run(n, fast_options(), [&](int r, Runtime& rt) {
      for (int first = 0; first < n; ++first) {
        int ret = -1;
        if (r == first) {
          ret = core::join(rt);
        } else {
          // The joined rank contributes zeros; the average divides by n.
          std::vector<float> a(4, 6.0f);
          wait_for(core::allreduce_async(rt, "join.avg", view(a), view(a), ReduceOp::kAverage));
          GYRE_EXPECT(r, std::fabs(a[0] - 6.0f * static_cast<float>(n - 1) / n) < 1e-6f);
          std::vector<float> rows(6, 1.0f);
          auto ag = expect_throw<Error>(r, [&] {
            wait_for(core::allgather_async(rt, "join.ag",
                                           TensorView{rows.data(), DataType::kFloat32, {2, 3}}));
          });
          GYRE_EXPECT(r, contains(ag, fmt::format("rank {} joined", first)));
          std::vector<float> b(5, 1.0f);
          expect_throw<Error>(r, [&] { wait_for(core::broadcast_async(rt, "join.bc", view(b), r)); });
          ret = core::join(rt);
        }
        GYRE_EXPECT(r, ret != first && ret >= 0 && ret < n);
        // The same value on every rank, and every rank in step again.
        std::vector<float> mine(1, static_cast<float>(ret));
        Handle h = core::allgather_async(rt, "join.ret",
                                         TensorView{mine.data(), DataType::kFloat32, {1}});
        wait_for(h);
        const auto* all = reinterpret_cast<const float*>(h.output().data.data());
        GYRE_EXPECT(r, h.output().shape[0] == n);
        for (int q = 0; q < n; ++q) GYRE_EXPECT(r, all[q] == static_cast<float>(ret));
      }
    });
  }
}

TEST_CASE("local: a grouped allreduce of different sizes fails on every rank at once",
          "[runtime][group]") {
  Options opt = fast_options();
  opt.stall_shutdown_s = 600;  // the default: nothing may wait for it
  LocalJob::run(2, opt, [&](int r, Runtime& rt) {
    for (int flip : {0, 1}) {
      const int count = (r == flip) ? 3 : 2;
      std::vector<std::vector<float>> bufs(static_cast<std::size_t>(count),
                                           std::vector<float>(4, 1.0f));
      std::vector<std::string> names;
      std::vector<TensorView> views;
      for (int i = 0; i < count; ++i) {
        names.push_back(fmt::format("grp{}.{}", flip, i));
        views.push_back(view(bufs[static_cast<std::size_t>(i)]));
      }
      Handle h = core::grouped_allreduce_async(rt, names, views, views, ReduceOp::kSum);
      auto what = expect_throw<MismatchError>(r, [&] { wait_for(h, 30); });
      GYRE_EXPECT(r, contains(what, fmt::format("group 'grp{}.0' of 3", flip)) &&
                         contains(what, fmt::format("group 'grp{}.0' of 2", flip)));
      // In step afterwards.
      std::vector<float> z(2, 1.0f);
      wait_for(core::allreduce_async(rt, fmt::format("after.group{}", flip), view(z), view(z),
                                     ReduceOp::kSum));
      GYRE_EXPECT(r, z[0] == 2.0f);
    }
  });
}
