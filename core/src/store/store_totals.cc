#include "store/store_totals.h"

namespace gyre::core {

void StoreTotals::note(bool was_applied, bool was_scaled, std::int64_t lag) {
  ++pushes;
  if (was_applied) {
    ++applied;
    if (was_scaled) ++scaled;
  } else {
    ++rejected;
  }
  std::int64_t seen = max_lag.load();
  while (lag > seen && !max_lag.compare_exchange_weak(seen, lag)) {
  }
}

StoreTotals& store_totals() {
  static StoreTotals totals;
  return totals;
}

}  // namespace gyre::core
