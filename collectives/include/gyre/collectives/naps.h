// Short sleeps between polls ("naps") and the kernel's timer slack.
//
// Linux lets a sleep end late by the sleeping thread's timer slack, 50 us by
// default, so that wake-ups can be batched: on the machine this was measured
// on a nap of 5 us took 89 us and one of 20 us 108 us (24 and 46 us with a
// slack of 1 us). A wait that naps while its peer is a little late then
// returns one or two hundred microseconds after the peer's arrival: at 2
// ranks on 2 cores about 1 % of small dist.all_reduce calls took 300-440 us
// instead of under 100 (docs/benchmarks.md). Waits that nap take a slack of
// 1 us for their naps: gyre's own threads for good (precise_naps_for_this_thread),
// a caller's thread from its first nap to the end of the wait
// (PreciseNaps), so that a wait that never naps costs nothing and the
// caller's thread gets its own slack back.
#pragma once

#include <sys/prctl.h>

namespace gyre::collectives {

inline constexpr unsigned long kNapSlackNs = 1000;

// For a thread of gyre's own (the background thread, a server thread).
inline void precise_naps_for_this_thread() noexcept {
  prctl(PR_SET_TIMERSLACK, kNapSlackNs, 0, 0, 0);
}

// Scoped to one wait on a thread that is not gyre's (see above).
class PreciseNaps {
 public:
  PreciseNaps() = default;
  PreciseNaps(const PreciseNaps&) = delete;
  PreciseNaps& operator=(const PreciseNaps&) = delete;
  // Before the wait's first nap; later calls do nothing.
  void begin() noexcept {
    if (begun_) return;
    begun_ = true;
    const int old = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
    if (old <= 0 || static_cast<unsigned long>(old) == kNapSlackNs) return;
    saved_ = old;
    prctl(PR_SET_TIMERSLACK, kNapSlackNs, 0, 0, 0);
  }
  ~PreciseNaps() {
    if (saved_ > 0) prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(saved_), 0, 0, 0);
  }

 private:
  bool begun_ = false;
  int saved_ = 0;
};

}  // namespace gyre::collectives
