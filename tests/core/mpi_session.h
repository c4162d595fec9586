// What the MPI tests of the public API (test_runtime_mpi.cc,
// test_process_sets_mpi.cc, tests/store/, tests/training/) share: their options and a gyre session per
// test case. Each test binary runs under mpirun; MPI itself is finalised at
// exit, so every test case may initialise gyre again.
#pragma once

#include "gyre/gyre.h"

namespace gyre::test {

// The environment's options (so a CTest entry's GYRE_SHM=0 takes the ring
// over MPI), with short cycles for quick tests; a bug aborts the job after
// 60 s instead of hanging it.
inline Options test_options() {
  Options o = Options::from_env();
  o.cycle_time_ms = 0.5;
  o.op_timeout_s = 60;
  return o;
}

// test_options() where a collective that stalls also ends the job after
// `seconds` (the parameter store's and local SGD's tests).
inline Options test_options_with_stall_shutdown(double seconds) {
  Options o = test_options();
  o.stall_shutdown_s = seconds;
  return o;
}

// Initialises gyre for one test case and shuts it down at scope exit.
struct Session {
  explicit Session(const Options& o = test_options()) { init(o); }
  ~Session() {
    if (is_initialized()) shutdown();
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
};

}  // namespace gyre::test
