// LocalSgd's streaming (gyre/local_sgd.h: fragments, sync_delay, mixing)
// under mpirun with 2 or 3 ranks, against references every rank computes
// from all ranks' values: fragments' rounds fall at their staggered steps,
// a fragment is identical on every rank right after its round (and equal to
// the ranks' mean) while the other differs, each fragment round is a
// commit and fragment_versions() names it; a delayed round keeps the inner
// steps taken while it was in flight (or mixes, with `mixing`); a LocalSgd
// destroyed with a round in flight leaves nothing behind; bad streaming
// arguments are refused naming the problem. The model's two parameters
// (w, float32, and b, float64) are the two fragments.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gyre/elastic.h"
#include "gyre/gyre.h"
#include "gyre/local_sgd.h"

#include "local_sgd_model.h"

using namespace gyre;
using namespace gyre::test_lsgd;

namespace {

constexpr std::size_t kW = 12;  // w's elements, first in Model::flat()

std::vector<double> part(const std::vector<double>& v, int fragment) {
  return fragment == 0 ? std::vector<double>(v.begin(), v.begin() + kW)
                       : std::vector<double>(v.begin() + kW, v.end());
}

// Whether every rank holds the same bits of `fragment`.
bool identical(const Model& m, int fragment) {
  const std::vector<double> mine = part(m.flat(), fragment);
  const auto all = gather(fmt::format("test.lsgd_stream.same.{}", fragment), mine);
  for (const auto& v : all) {
    if (v != all.front()) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("local SGD streaming: fragments round at staggered steps, each round a commit",
          "[mpi]") {
  Session s;
  Model m(rank());
  const auto compression = GENERATE(LocalSgdCompression::kNone, LocalSgdCompression::kInt8);
  INFO(fmt::format("compression {}", static_cast<int>(compression)));
  LocalSgd sgd({.period = 4, .compression = compression, .fragments = 2}, m.views());
  REQUIRE(sgd.fragment_params(0) == std::pair<std::size_t, std::size_t>{0, 1});
  REQUIRE(sgd.fragment_params(1) == std::pair<std::size_t, std::size_t>{1, 2});
  // Fragment 0 (w) at steps 2, 6 (2 * 4 / 2 = 2); fragment 1 (b) at 4, 8.
  const std::uint64_t start = committed_steps();
  std::vector<std::uint64_t> versions = {0, 0};
  for (int t = 1; t <= 8; ++t) {
    inner_step(m, t);
    const std::vector<double> before = mean(gather("test.lsgd_stream.before", m.flat()));
    const int due = t % 4 == 2 ? 0 : t % 4 == 0 ? 1 : -1;
    INFO(fmt::format("step {}", t));
    CHECK(sgd.step() == (due >= 0));
    for (int f = 0; f < 2; ++f) {
      INFO(fmt::format("fragment {}", f));
      CHECK(identical(m, f) == (f == due));
    }
    if (due >= 0) {
      versions[static_cast<std::size_t>(due)] = committed_steps();
      if (compression == LocalSgdCompression::kNone) {
        // Plain averaging: the fragment is the mean of the ranks' values.
        const auto got = part(m.flat(), due), want = part(before, due);
        for (std::size_t k = 0; k < got.size(); ++k) {
          CHECK(std::abs(got[k] - want[k]) <= (due == 0 ? 1e-5 : 1e-12));
        }
      }
    }
    CHECK(sgd.fragment_versions() == versions);
    CHECK(committed_steps() == start + static_cast<std::uint64_t>(t / 2));
  }
  CHECK(sgd.fragment_rounds() == std::vector<std::int64_t>{2, 2});
  CHECK(sgd.rounds() == 4);
  sgd.sync();  // both fragments now
  CHECK(identical(m, 0));
  CHECK(identical(m, 1));
  CHECK(sgd.fragment_rounds() == std::vector<std::int64_t>{3, 3});
}

TEST_CASE("local SGD streaming: a delayed round keeps the steps taken while it was in flight",
          "[mpi]") {
  Session s;
  Model m(rank());
  const double mixing = GENERATE(-1.0, 0.25);
  INFO(fmt::format("mixing {}", mixing));
  LocalSgd sgd({.period = 3, .sync_delay = 2, .mixing = mixing}, m.views());
  // Rounds start at steps 3 and 6 and complete at 5 and 8.
  std::vector<double> at_start, synced;
  for (int t = 1; t <= 8; ++t) {
    inner_step(m, t);
    INFO(fmt::format("step {}", t));
    if (t % 3 == 0) {
      at_start = m.flat();
      synced = mean(gather("test.lsgd_stream.start", at_start));  // averaging: the new θ_synced
    }
    const std::vector<double> now = m.flat();
    const bool completes = t == 5 || t == 8;
    CHECK(sgd.step() == completes);
    if (!completes) {
      CHECK(m.flat() == now);  // a start alone changes nothing
      continue;
    }
    std::vector<double> want(now.size());
    for (std::size_t k = 0; k < want.size(); ++k) {
      want[k] = mixing < 0 ? synced[k] + (now[k] - at_start[k])
                           : mixing * now[k] + (1 - mixing) * synced[k];
    }
    check_close(m.flat(), want, 1e-5, 1e-12, "after the delayed round");
  }
  CHECK(sgd.rounds() == 2);
  sgd.sync();
  CHECK(identical(m, 0));
  CHECK(identical(m, 1));
}

TEST_CASE("local SGD streaming: destroyed with a round in flight, the job goes on", "[mpi]") {
  Session s;
  for (int round = 0; round < 3; ++round) {
    Model m(rank());
    LocalSgd sgd({.period = 2, .sync_delay = 1}, m.views());
    inner_step(m, 1);
    CHECK_FALSE(sgd.step());
    inner_step(m, 2);
    CHECK_FALSE(sgd.step());  // started, in flight until step 3
  }  // each destructor waits for its round: names free, buffers unused after
  Model m(rank());
  LocalSgd sgd({.period = 1}, m.views());
  inner_step(m, 1);
  CHECK(sgd.step());
  CHECK(identical(m, 0));
}

TEST_CASE("local SGD streaming: bad arguments are refused, naming the problem", "[mpi]") {
  Session s;
  Model m(rank());
  auto refused = [&](LocalSgdOptions o, const std::string& words) {
    INFO(words);
    CHECK_THROWS_WITH(LocalSgd(o, m.views()), Catch::Contains(words));
  };
  refused({.period = 4, .fragments = 0}, "fragments must be between 1 and period (4), got 0");
  refused({.period = 2, .fragments = 3}, "fragments must be between 1 and period (2), got 3");
  refused({.period = 4, .fragments = 3}, "3 fragments but only 2 parameters");
  refused({.period = 4, .sync_delay = 4}, "sync_delay must be >= 0 and < period (4), got 4");
  refused({.period = 4, .sync_delay = -1}, "sync_delay must be >= 0 and < period (4), got -1");
  refused({.period = 4, .mixing = 1.5}, "mixing must be in [0, 1] or negative, got 1.5");

}

TEST_CASE("local SGD streaming: an elastic State takes a LocalSgd with a sync delay", "[mpi]") {
  // A commit then falls while the other fragment's round is in flight: it
  // holds the counters from before that round (the kill test,
  // tests/elastic/local_sgd_kill.cc under GYRE_TEST_STREAMING=1, checks a
  // recovery from such a commit against a reference).
  Session s;
  Model m(rank());
  LocalSgd delayed({.period = 2, .name = "test.lsgd.delayed", .commit = false, .fragments = 2,
                    .sync_delay = 1},
                   m.views());
  elastic::State state;
  REQUIRE_NOTHROW(delayed.add_to(state));
  for (int t = 1; t <= 2; ++t) {  // fragment 0 starts at step 1, merged at 2; fragment 1 starts
    inner_step(m, t);
    if (delayed.step()) state.commit();
  }
  CHECK(delayed.fragment_rounds() == std::vector<std::int64_t>{1, 0});
  CHECK(delayed.rounds() == 1);
  for (int t = 3; t <= 4; ++t) {
    inner_step(m, t);
    if (delayed.step()) state.commit();
  }
  CHECK(delayed.rounds() == 3);
  delayed.sync();
  CHECK(identical(m, 0));
  CHECK(identical(m, 1));
}
