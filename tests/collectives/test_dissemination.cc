// dissemination_allreduce: every rank ends with the combination of every
// rank's words (AND, OR, min and max in one vector) for every world size
// 1..16, each rank sending exactly ceil(log2 n) messages (counted by the
// CountingTransport the negotiation uses); and bad arguments are refused
// before any transfer.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <vector>

#include "gyre/collectives/algorithms.h"
#include "gyre/collectives/counting_transport.h"
#include "gyre/collectives/local_transport.h"
#include "gyre/error.h"

using namespace gyre;
using namespace gyre::collectives;

namespace {

// [AND word, OR word, min, max] of rank r's values.
std::vector<std::uint64_t> words_of(int r) {
  const std::uint64_t bits = ~(std::uint64_t{1} << r) & 0xffffu;  // all but bit r
  return {bits, std::uint64_t{1} << r, 100u + static_cast<std::uint64_t>(r * 7 % 11),
          100u + static_cast<std::uint64_t>(r * 7 % 11)};
}

void combine(std::span<std::uint64_t> acc, std::span<const std::uint64_t> in) {
  acc[0] &= in[0];
  acc[1] |= in[1];
  acc[2] = std::min(acc[2], in[2]);
  acc[3] = std::max(acc[3], in[3]);
}

}  // namespace

TEST_CASE("dissemination_allreduce: idempotent combine of every rank, ceil(log2 n) messages",
          "[dissemination]") {
  for (int n = 1; n <= 16; ++n) {
    INFO("n = " << n);
    std::uint64_t want_and = 0xffffu, want_or = 0, want_min = ~0ull, want_max = 0;
    for (int r = 0; r < n; ++r) {
      const auto w = words_of(r);
      want_and &= w[0];
      want_or |= w[1];
      want_min = std::min(want_min, w[2]);
      want_max = std::max(want_max, w[3]);
    }
    int log2n = 0;
    while ((1 << log2n) < n) ++log2n;
    std::vector<std::vector<std::uint64_t>> got(static_cast<std::size_t>(n));
    std::vector<std::uint64_t> messages(static_cast<std::size_t>(n));
    transport::run_local_world(n, [&](transport::Transport& t) {
      transport::CountingTransport counted(t);
      auto w = words_of(t.rank());
      DisseminationOptions o;
      o.tag = 5;
      dissemination_allreduce(counted, w, combine, o);
      got[static_cast<std::size_t>(t.rank())] = w;
      messages[static_cast<std::size_t>(t.rank())] = counted.messages();
    }, std::chrono::milliseconds(30000));
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r);
      CHECK(got[static_cast<std::size_t>(r)] ==
            std::vector<std::uint64_t>{want_and, want_or, want_min, want_max});
      CHECK(messages[static_cast<std::size_t>(r)] == static_cast<std::uint64_t>(log2n));
    }
  }
}

TEST_CASE("dissemination_allreduce: a bad tag is refused before any transfer", "[dissemination]") {
  transport::run_local_world(2, [&](transport::Transport& t) {
    transport::CountingTransport counted(t);
    std::vector<std::uint64_t> w{1};
    DisseminationOptions o;
    o.tag = -1;
    CHECK_THROWS_AS(dissemination_allreduce(counted, w, combine, o), InvalidArgument);
    CHECK(counted.messages() == 0);
  }, std::chrono::milliseconds(30000));
}
