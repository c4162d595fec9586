// How many cores the ranks of one host share, for the waits that decide
// whether to poll or to give the core away.
#pragma once

#include <thread>

namespace gyre::collectives {

// True when `ranks_on_host` processes (each with a thread that waits for
// its peers) outnumber the host's online cores, or the count is unknown.
// A rank that polls for a peer then takes the core the peer needs to make
// progress, so waits must block or yield at once instead of spinning.
inline bool oversubscribed(int ranks_on_host) {
  const unsigned cores = std::thread::hardware_concurrency();
  return cores == 0 || static_cast<unsigned>(ranks_on_host) > cores;
}

}  // namespace gyre::collectives
