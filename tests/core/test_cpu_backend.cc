// CpuRingBackend through the Backend interface, ranks as threads over the
// local transport: what the executor relies on (zeros that stay zeros,
// zeroed ranges, a discarded result for a rank without an entry, the
// effective reduction of an average with a joined rank).
#include <catch2/catch.hpp>

#include <array>
#include <chrono>
#include <cstring>
#include <vector>

#include "backends/cpu/cpu_ring_backend.h"
#include "execution/plan.h"
#include "gyre/collectives/local_transport.h"

using namespace gyre;
using namespace gyre::core;

namespace {

constexpr std::chrono::milliseconds kTimeout{20000};

const std::array<std::string_view, 1> kName = {"t"};
const OpLabel kWhat{"test", kName};

}  // namespace

TEST_CASE("cpu backend: zeros are zero on every call, zero_ranges clears only its ranges",
          "[backend]") {
  Options opt;
  transport::run_local_world(1, [&](transport::Transport& t) {
    CpuRingBackend be(t, opt);
    std::byte* z = be.zeros(64, kWhat);
    std::memset(z, 0x7f, 64);  // a user of the stand-in wrote into it
    z = be.zeros(32, kWhat);
    for (int i = 0; i < 32; ++i) CHECK(z[i] == std::byte{0});

    std::vector<std::byte> buf(16, std::byte{1});
    const std::vector<ByteRange> ranges = {{2, 3}, {10, 1}};
    be.zero_ranges(buf.data(), ranges, kWhat);
    for (std::size_t i = 0; i < buf.size(); ++i) {
      const bool zeroed = (i >= 2 && i < 5) || i == 10;
      CHECK(buf[i] == (zeroed ? std::byte{0} : std::byte{1}));
    }
  }, kTimeout);
}

TEST_CASE("cpu backend: a rank without an entry contributes zeros and discards results",
          "[backend]") {
  // Rank 2 joined: zeros into the average (not counted), no rows to the
  // allgather, zeros into the reduce-scatter, null outputs.
  const int n = 3;
  Options opt;
  std::vector<std::vector<float>> avg(n), gathered(n), scattered(n);
  transport::run_local_world(n, [&](transport::Transport& t) {
    CpuRingBackend be(t, opt);
    const int r = t.rank();
    const bool joined = r == 2;
    const Reduction red = effective_reduction(ReduceOp::kAverage, 1.0, 1.0, /*contributors=*/2);

    std::vector<float> x(5, static_cast<float>(r + 1));
    const void* in = joined ? static_cast<const void*>(be.zeros(x.size() * 4, kWhat)) : x.data();
    avg[r].resize(5);
    be.allreduce(in, avg[r].data(), 5, DataType::kFloat32, red, kWhat);

    const std::vector<std::size_t> blocks = {4, 8, 0};  // bytes
    std::vector<float> mine(static_cast<std::size_t>(r + 1), static_cast<float>(10 * r));
    if (!joined) gathered[r].resize(3);
    be.allgather(joined ? nullptr : mine.data(), blocks, joined ? nullptr : gathered[r].data(),
                 kWhat);

    const std::vector<std::size_t> counts = {2, 1, 1};
    std::vector<float> rs(4, 1.0f);
    const void* rs_in = joined ? static_cast<const void*>(be.zeros(16, kWhat)) : rs.data();
    if (!joined) scattered[r].resize(counts[static_cast<std::size_t>(r)]);
    be.reducescatter(rs_in, counts, joined ? nullptr : scattered[r].data(), DataType::kFloat32,
                     Reduction{}, kWhat);
  }, kTimeout);
  for (int r = 0; r < n; ++r) CHECK(avg[r] == std::vector<float>(5, 1.5f));  // (1 + 2) / 2
  for (int r = 0; r < 2; ++r) {
    CHECK(gathered[r] == std::vector<float>{0.0f, 10.0f, 10.0f});
    CHECK(scattered[r] == std::vector<float>(r == 0 ? 2 : 1, 2.0f));
  }
}
