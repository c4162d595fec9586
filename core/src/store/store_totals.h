// The parameter stores' push counters summed over every store of this
// process, alive or closed: what runtime_stats() reports beside the version
// vector (each ParameterStore's own counters are its stats()).
//
// Threads: any (atomics).
#pragma once

#include <atomic>
#include <cstdint>

namespace gyre::core {

struct StoreTotals {
  std::atomic<std::int64_t> pushes{0};    // shard pushes made by this process
  std::atomic<std::int64_t> applied{0};
  std::atomic<std::int64_t> rejected{0};
  std::atomic<std::int64_t> scaled{0};    // applied with a factor below 1
  std::atomic<std::int64_t> max_lag{0};   // largest lag among them

  void note(bool was_applied, bool was_scaled, std::int64_t lag);
};

StoreTotals& store_totals();

}  // namespace gyre::core
