// Options from the environment and from code, through the public API and the
// runtime only: values that overflow, lie out of range, are NaN or carry
// trailing characters are refused naming the variable; a cycle time of 0
// does not run negotiation rounds back to back.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <thread>

#include "local_job.h"

using namespace gyre;
using namespace gyre::test;
using core::Runtime;

namespace {

// Sets one variable for the scope, restoring what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// from_env()'s InvalidArgument message, or "accepted".
std::string refusal(const char* name, const char* value) {
  ScopedEnv env(name, value);
  try {
    (void)Options::from_env();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "accepted";
}

}  // namespace

TEST_CASE("options: from_env refuses overflow, out of range, NaN, infinity and trailing text",
          "[options]") {
  struct Bad {
    const char* name;
    const char* value;
  };
  const Bad bad[] = {
      {"GYRE_FUSION_THRESHOLD", "99999999999999999999G"},
      {"GYRE_FUSION_THRESHOLD", "17179869184G"},        // 2^64 bytes: the shift wrapped to 0
      {"GYRE_FUSION_THRESHOLD", "18014398509481985K"},  // wraps to 1 KiB
      {"GYRE_FUSION_THRESHOLD", " -1"},                 // strtoull wrapped it to 2^64 - 1
      {"GYRE_FUSION_THRESHOLD", "-1"},
      {"GYRE_FUSION_THRESHOLD", "2048G"},  // more than any machine's memory
      {"GYRE_FUSION_THRESHOLD", "64Mx"},
      {"GYRE_FUSION_MAX_TENSOR", "1.5M"},
      {"GYRE_CACHE_CAPACITY", "4G"},  // cache slots are numbered in 32 bits
      {"GYRE_RING_CHUNK_BYTES", "0"},
      {"GYRE_RING_CHUNK_BYTES", "64G"},
      {"GYRE_ALLREDUCE_SMALL_BYTES", "64KB"},
      {"GYRE_MAX_VERSION_LAG", "inf"},
      {"GYRE_MAX_VERSION_LAG", "1e300"},
      {"GYRE_MAX_VERSION_LAG", "nan"},
      {"GYRE_MAX_VERSION_LAG", "-1"},
      {"GYRE_MAX_VERSION_LAG", "1.5"},
      {"GYRE_MAX_VERSION_LAG", "99999999999999999999"},
      {"GYRE_CYCLE_TIME_MS", "nan"},
      {"GYRE_CYCLE_TIME_MS", "1e300"},
      {"GYRE_CYCLE_TIME_MS", "inf"},
      {"GYRE_CYCLE_TIME_MS", "-0.5"},
      {"GYRE_CYCLE_TIME_MS", "1ms"},
      {"GYRE_SPIN_WAIT_US", "1e300"},
      {"GYRE_SPIN_WAIT_US", "NaN"},
      {"GYRE_STALL_WARNING_S", "-inf"},
      {"GYRE_STALL_SHUTDOWN_S", "nan"},
      {"GYRE_STALL_SHUTDOWN_S", "1e400"},
      {"GYRE_OP_TIMEOUT_S", "inf"},
      {"GYRE_OP_TIMEOUT_S", "1e300"},
      {"GYRE_LOG_LEVEL", "loud"},
  };
  for (const auto& b : bad) {
    const std::string message = refusal(b.name, b.value);
    INFO(b.name << "='" << b.value << "': " << message);
    CHECK(message.find(b.name) != std::string::npos);
    CHECK(message.find(std::string("'") + b.value + "'") != std::string::npos);
  }
}

TEST_CASE("options: from_env sets each field from good values, bounds included", "[options]") {
  auto with = [](const char* name, const char* value) {
    ScopedEnv env(name, value);
    return Options::from_env();
  };
  CHECK(with("GYRE_FUSION_THRESHOLD", "1M").fusion_threshold_bytes == (1u << 20));
  CHECK(with("GYRE_FUSION_THRESHOLD", "3GiB").fusion_threshold_bytes == (std::size_t{3} << 30));
  CHECK(with("GYRE_FUSION_THRESHOLD", "1024G").fusion_threshold_bytes == (std::size_t{1} << 40));
  CHECK(with("GYRE_FUSION_THRESHOLD", "0").fusion_threshold_bytes == 0);
  CHECK(with("GYRE_FUSION_THRESHOLD", "").fusion_threshold_bytes == Options{}.fusion_threshold_bytes);
  CHECK(with("GYRE_FUSION_MAX_TENSOR", "5k").fusion_max_tensor_bytes == 5 * 1024);
  CHECK(with("GYRE_CYCLE_TIME_MS", "0").cycle_time_ms == 0.0);
  CHECK(with("GYRE_CYCLE_TIME_MS", "0.25").cycle_time_ms == 0.25);
  CHECK(with("GYRE_SPIN_WAIT_US", "1e3").spin_wait_us == 1000.0);
  CHECK(with("GYRE_CACHE_CAPACITY", "2K").cache_capacity == 2048);
  CHECK(with("GYRE_RING_CHUNK_BYTES", "1").ring_chunk_bytes == 1);
  CHECK(with("GYRE_ALLREDUCE_SMALL_BYTES", "7").allreduce_small_bytes == 7);
  CHECK(with("GYRE_TIMELINE", "/tmp/t-{rank}.json").timeline_path == "/tmp/t-{rank}.json");
  CHECK(with("GYRE_LOG_LEVEL", "warn").log_level == LogLevel::kWarning);
  CHECK(with("GYRE_LOG_LEVEL", "debug").log_level == LogLevel::kDebug);
  CHECK(with("GYRE_STALL_WARNING_S", "0.2").stall_warning_s == 0.2);
  CHECK(with("GYRE_STALL_SHUTDOWN_S", "0").stall_shutdown_s == 0.0);
  CHECK(with("GYRE_OP_TIMEOUT_S", "1e7").op_timeout_s == 1e7);
  CHECK(with("GYRE_MAX_VERSION_LAG", "3").max_version_lag == 3);
}

// The loop floors the cycle time: idle rounds back off from the floor to
// their longest sleep, and rounds that wait for a peer come no faster than
// the floor. Before, a cycle of 0 ran rounds back to back, idle or not.
TEST_CASE("options: a cycle time of 0 does not run negotiation rounds back to back",
          "[options][runtime]") {
  Options opt = fast_options();
  opt.cycle_time_ms = 0;
  using Clock = std::chrono::steady_clock;
  const auto window = std::chrono::milliseconds(300);
  std::uint64_t idle_rounds = 0, waiting_rounds = 0;
  double idle_ms = 0, waiting_ms = 0;
  LocalJob::run(2, opt, [&](int r, Runtime& rt) {
    std::vector<float> a(4, 1.0f);
    // Idle: nothing enqueued anywhere for the window.
    const auto r0 = rt.rounds();
    const auto t0 = Clock::now();
    std::this_thread::sleep_for(window);
    if (r == 0) {
      idle_rounds = rt.rounds() - r0;
      idle_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    }
    // Waiting: rank 0's tensor is pending while rank 1 enqueues late.
    const auto r1 = rt.rounds();
    const auto t1 = Clock::now();
    if (r == 1) std::this_thread::sleep_for(window);
    Handle h = core::allreduce_async(rt, "late", view(a), view(a), ReduceOp::kSum);
    wait_for(h);
    if (r == 0) {
      waiting_rounds = rt.rounds() - r1;
      waiting_ms = std::chrono::duration<double, std::milli>(Clock::now() - t1).count();
    }
    GYRE_EXPECT(r, a[0] == 2.0f);
  });
  INFO("idle: " << idle_rounds << " rounds in " << idle_ms << " ms; waiting: " << waiting_rounds
                << " rounds in " << waiting_ms << " ms");
  // Idle sleeps double from the floor up to 16 ms: about 10 rounds to get
  // there, then one per 16 ms.
  CHECK(idle_rounds <= static_cast<std::uint64_t>(idle_ms / 16.0) + 30);
  CHECK(waiting_rounds <= static_cast<std::uint64_t>(waiting_ms / 0.1) + 30);
}

TEST_CASE("options: values out of range set in code fail start-up on every rank, named",
          "[options][runtime]") {
  for (int n : {1, 3}) {
    auto world = transport::make_local_world(n);
    std::vector<std::string> messages(static_cast<std::size_t>(n));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        Options o = fast_options();
        if (r == n - 1) o.cycle_time_ms = std::numeric_limits<double>::quiet_NaN();
        if (r == 0) o.max_version_lag = -1;
        core::RuntimeInfo info;
        info.abort = [](int) {};
        try {
          Runtime rt(o, std::make_unique<transport::LocalTransport>(world, r), info);
          messages[static_cast<std::size_t>(r)] = "started";
        } catch (const InvalidArgument& e) {
          messages[static_cast<std::size_t>(r)] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < n; ++r) {
      const std::string& m = messages[static_cast<std::size_t>(r)];
      INFO(n << " ranks, rank " << r << ": " << m);
      CHECK(m.find(fmt::format("GYRE_CYCLE_TIME_MS on rank {}: nan", n - 1)) != std::string::npos);
      CHECK(m.find("GYRE_MAX_VERSION_LAG on rank 0: -1") != std::string::npos);
    }
  }
}
