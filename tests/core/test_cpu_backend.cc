// CpuRingBackend through the Backend interface, ranks as threads over the
// local transport: what the executor relies on (zeros that stay zeros,
// zeroed ranges, a discarded result for a rank without an entry, the
// effective reduction of an average with a joined rank).
#include <catch2/catch.hpp>

#include <array>
#include <chrono>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "backends/cpu/cpu_ring_backend.h"
#include "execution/plan.h"
#include "gyre/collectives/counting_transport.h"
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

TEST_CASE("cpu backend: a rank without an entry contributes zeros, its results go to scratch",
          "[backend]") {
  // Rank 2 joined: zeros into the average (not counted), no rows to the
  // allgather, zeros into the reduce-scatter; its outputs are scratch
  // buffers (the executor's, whose contents it discards), written like any.
  const int n = 3;
  Options opt;
  std::vector<std::vector<float>> avg(n), gathered(n, std::vector<float>(3, -1.0f)), scattered(n);
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
    be.allgather(joined ? nullptr : mine.data(), blocks, gathered[r].data(), kWhat);

    const std::vector<std::size_t> counts = {2, 1, 1};
    std::vector<float> rs(4, 1.0f);
    const void* rs_in = joined ? static_cast<const void*>(be.zeros(16, kWhat)) : rs.data();
    scattered[r].resize(counts[static_cast<std::size_t>(r)]);
    be.reducescatter(rs_in, counts, scattered[r].data(), DataType::kFloat32, Reduction{}, kWhat);
  }, kTimeout);
  for (int r = 0; r < n; ++r) CHECK(avg[r] == std::vector<float>(5, 1.5f));  // (1 + 2) / 2
  for (int r = 0; r < n; ++r) {
    CHECK(gathered[r] == std::vector<float>{0.0f, 10.0f, 10.0f});
    CHECK(scattered[r] == std::vector<float>(r == 0 ? 2 : 1, 2.0f));
  }
}

TEST_CASE("cpu backend: GYRE_RABENSEIFNER_ALLREDUCE picks the large allreduce, -1 by the cost "
          "model",
          "[backend][rabenseifner]") {
  // 1 MB of float32 (above the 64 KiB small size) in one chunk per message,
  // so the algorithms show by their message counts: the ring 2(n-1) per
  // rank; Rabenseifner 2 log2 p for the p ranks of the power of two, one
  // more for a folded pair's even rank (the result it sends back), one in
  // all for the odd rank (its input).
  const std::size_t count = 1 << 18;
  for (int n : {3, 4, 8}) {
    for (long setting : {-1L, 0L, 1L}) {
      Options opt;
      opt.ring_chunk_bytes = 64u << 20;
      opt.rabenseifner_allreduce = setting;
      // The model: Rabenseifner at powers of two from 4 on, the ring at 3.
      const bool rab = setting == 1 || (setting == -1 && n != 3);
      std::vector<std::size_t> messages(n);
      std::vector<std::vector<float>> out(n);
      transport::run_local_world(n, [&](transport::Transport& inner) {
        transport::CountingTransport t(inner);
        CpuRingBackend be(t, opt);
        const int r = t.rank();
        std::vector<float> x(count);
        for (std::size_t i = 0; i < count; ++i) x[i] = static_cast<float>(r + i % 3);
        out[r].resize(count);
        be.allreduce(x.data(), out[r].data(), count, DataType::kFloat32, Reduction{}, kWhat);
        messages[r] = t.messages();
      }, kTimeout);
      INFO("n=" << n << " GYRE_RABENSEIFNER_ALLREDUCE=" << setting);
      const int p = n == 3 ? 2 : n, extra = n - p, log_p = n == 8 ? 3 : n == 4 ? 2 : 1;
      for (int r = 0; r < n; ++r) {
        std::size_t want = 2 * static_cast<std::size_t>(n - 1);
        if (rab) {
          want = r < 2 * extra && r % 2 == 1 ? 1
                                             : 2 * static_cast<std::size_t>(log_p) + (r < 2 * extra);
        }
        CHECK(messages[r] == want);
        bool right = true;
        for (std::size_t i = 0; i < count && right; ++i) {
          right = out[r][i] == static_cast<float>(n * (i % 3) + n * (n - 1) / 2);
        }
        CHECK(right);
      }
    }
  }
}
