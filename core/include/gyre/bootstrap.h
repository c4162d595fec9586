// Start-up without an MPI launcher: a PMI-1 server.
//
// An MPI built with MPICH's PMI-1 client (the `mpich` wheel of the Python
// package registry, gyre's build against it: docs/launch.md) starts from the
// PMI-1 wire protocol: each process connects to PMI_PORT (host:port), says
// who it is (PMI_ID, its rank) and exchanges the addresses of its peers
// through the server's key-value space and barriers. A launcher that is not
// MPI's own (torchrun, a Kubernetes PyTorchJob, Lightning) starts the
// processes; one of them (rank 0) runs this server on a native thread before
// MPI_Init, publishes its address through the launcher's store, and every
// process sets PMI_PORT, PMI_ID and PMI_SIZE and calls init(): an ordinary
// MPI_COMM_WORLD of `size` processes, shared memory within a host included.
//
// The server speaks the part of PMI-1 that MPI_Init and MPI_Finalize use
// (initack, init, get_maxes, get_appnum, get_universe_size, get_my_kvsname,
// put, get, barrier_in, finalize, abort); spawn and name publishing are
// refused (rc=-1): such a world cannot grow by MPI_Comm_spawn.
#pragma once

#include <chrono>
#include <memory>
#include <string>

namespace gyre {

class PmiServer {
 public:
  // Listens on `bind_address`:`port` (port 0: a free port) for `size`
  // processes, ranks 0..size-1 (each process's PMI_ID). If not all of them
  // have reached MPI_Init's barrier within `startup_timeout`, the waiting
  // ones get an error (their MPI_Init fails rather than waiting for ever)
  // and error() names the missing ranks. Throws InvalidArgument for
  // size < 1, TransportError when it cannot listen.
  explicit PmiServer(int size, const std::string& bind_address = "0.0.0.0", int port = 0,
                     std::chrono::milliseconds startup_timeout = std::chrono::minutes(5));
  // Waits (at most `finalize_timeout`, 30 s unless set) for every process
  // that connected to finalize, then stops the thread: the process that
  // runs the server may end before its peers have finished MPI_Finalize.
  ~PmiServer();
  PmiServer(const PmiServer&) = delete;
  PmiServer& operator=(const PmiServer&) = delete;

  int port() const;
  int size() const;
  // Until every process that connected has sent `finalize` (true), or the
  // timeout passed (false).
  bool wait_finalized(std::chrono::milliseconds timeout) const;
  // How long the destructor waits for the processes to finalize.
  void set_finalize_timeout(std::chrono::milliseconds timeout);
  // What went wrong so far ("" if nothing): a process that aborted (its
  // message), a malformed line, a PMI_ID out of range or given twice.
  std::string error() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace gyre
