// The process's one Runtime (over MPI), the point-to-point engine beside it
// and the process sets' runtimes: the state the public API's files share.
// lifecycle.cc owns it (init, shutdown, the exit and fork handlers);
// elastic_rebuild.cc replaces the runtime after a failure (rebuild); api.cc
// forwards gyre.h's operations to the runtime a call names. Internal to
// core/src/api/.
//
// Threads: user threads. g_mu guards g_runtime and g_p2p (the pointers; the
// Runtime and the engine synchronise themselves): user calls copy the
// shared_ptr, so a concurrent shutdown() cannot destroy either under them.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gyre/collectives/mpi_transport.h"
#include "gyre/options.h"
#include "runtime/p2p_engine.h"
#include "runtime/process_set_table.h"
#include "runtime/runtime.h"

namespace gyre::api {

extern std::mutex g_mu;
extern std::shared_ptr<core::Runtime> g_runtime;
// Null when MPI does not run at MPI_THREAD_MULTIPLE (or with fault
// tolerance on): point-to-point calls are then refused (p2p_unavailable).
extern std::shared_ptr<core::P2pEngine> g_p2p;

// The process sets of the running runtime (emptied at shutdown); it guards
// itself. g_sets_change_mu serialises add/remove on this rank: each is one
// agreement with the other ranks, which pair the calls by their order.
extern core::ProcessSetTable g_sets;
extern std::mutex g_sets_change_mu;

// The running runtime; StateError, naming `call`, when there is none.
std::shared_ptr<core::Runtime> runtime(const char* call);

// The runtime serving `process_set` for this rank (InvalidArgument when the
// set is unknown or this rank is not in it).
std::shared_ptr<core::Runtime> runtime_for(const char* call, int process_set);

// The world ranks of `process_set` (every rank for the global set).
std::vector<int> ranks_of(const char* call, int process_set);

// The point-to-point engine over a new duplicate of the world (collective:
// every rank calls it once its runtime has started); null without
// MPI_THREAD_MULTIPLE, where point-to-point calls are refused. With
// options.p2p_on_coordinator it has no thread: the runtime made with it in
// RuntimeInfo::p2p drives it.
std::shared_ptr<core::P2pEngine> start_p2p(const Options& options);

// Why point-to-point calls are refused when there is no engine.
std::string p2p_unavailable(const char* call);

// Stops the point-to-point engine, the process sets' runtimes, then the
// world's. For a rebuild the sets' ids stay known as dropped (operations on
// them then say so).
void stop_all(std::shared_ptr<core::Runtime> world,
              std::shared_ptr<core::P2pEngine> p2p = nullptr, bool for_rebuild = false);

// This rank's place among the ranks and its host backends, from the world
// as it is now (at init(), and after a rebuild()).
core::RuntimeInfo runtime_info(transport::MpiWorld& world, const Options& options);

}  // namespace gyre::api
