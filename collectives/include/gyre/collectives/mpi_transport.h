// The MPI side of gyre: process-level set-up and the point-to-point
// transport. Only collectives/transport/ includes mpi.h (mpi_world.cc is
// MpiWorld, mpi_transport.cc the transport); everything MPI-specific
// the runtime needs (initialisation, the host-local split, abort) is here.
//
// Threads: instance() may be called from any thread (the first call
// initialises MPI, thread-safely). A Transport from make_transport() is
// owned by its caller and driven by one thread at a time (the runtime's
// background thread); it frees its communicator when destroyed, and must be
// destroyed before finalize().
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gyre/collectives/transport.h"

namespace gyre::transport {

// What MpiWorld::rebuild() agreed among the surviving ranks; the same on
// every survivor.
struct RebuildOutcome {
  int rank = 0, size = 1;           // this rank and the size of the new world
  std::vector<int> previous_ranks;  // [r]: new rank r's rank in the world before
  std::vector<std::uint64_t> steps;  // [r]: new rank r's committed step
  std::vector<int> lost;            // ranks of the world before that failed
  int attempts = 1;                 // shrinks it took (above 1: failures during recovery)
};

// What MpiWorld::grow() asks for; only the new rank 0's values are used.
struct GrowRequest {
  int target_size = 0;           // grow the world to this many ranks
  std::string discovery_script;  // prints `host:slots` lines; empty: the lost ranks' hosts
  std::uint64_t step = 0;        // the agreed commit, told to the replacements
  int root = 0;                  // the rank holding it
};

// What MpiWorld::grow() did, the same on every rank except `problem`.
struct GrowOutcome {
  int spawned = 0;                 // replacement ranks, numbered after the survivors
  std::vector<std::string> hosts;  // on the new rank 0: where each was asked to start
  std::string problem;             // on the new rank 0: why fewer were started, if so
};

// What a replacement rank was told by the ranks that started it.
struct JoinRecord {
  bool replacement = false;  // this process was started by MpiWorld::grow()
  std::uint64_t step = 0;    // the survivors' agreed commit
  int root = 0;              // the rank to take the committed state from
  int survivors = 0;         // ranks before the replacements (survivors first)
  int rebuilds = 0;          // rebuilds of the world so far, the one that started it included
};

class MpiWorld {
 public:
  // Initialises MPI (MPI_THREAD_MULTIPLE if offered, else at least
  // MPI_THREAD_SERIALIZED, else TransportError) unless the job already did;
  // in that case checks the thread level the job chose is enough.
  static MpiWorld& instance();
  // The world for a runtime (init()): `ranks` of MPI_COMM_WORLD alone, in
  // that order (ranks[i] becomes rank i; Horovod's init(comm)), or, empty,
  // every rank. Between runtimes only (no transport of the world alive).
  //  - Non-empty: over a communicator of those ranks (MPI_Comm_create_group:
  //    collective over them alone); rank, size, local and cross ranks and
  //    hosts are derived within them. The ranks outside call nothing. On a
  //    process that is not among them, or for ranks out of range or
  //    repeated, InvalidArgument before any call but MPI's initialisation.
  //    If the world was not made yet, it is made without the world-wide
  //    layout (nothing collective over MPI_COMM_WORLD). The same list as the
  //    current one keeps its communicator. All of MPI_COMM_WORLD in order is
  //    the same as empty. NotSupported with fault tolerance (ULFM) or after a
  //    rebuild/grow (the world is no longer MPI_COMM_WORLD).
  //  - Empty: MPI_COMM_WORLD again (the listed ranks' communicator freed)
  //    with the layout saved before the restriction; if it was never derived
  //    (the process started restricted, or refused), it is derived now:
  //    collective over every rank, which all reach it in their next init().
  static MpiWorld& instance(const std::vector<int>& ranks);
  // The ranks of MPI_COMM_WORLD this world runs on (instance(ranks)), in
  // rank order; empty: every rank.
  const std::vector<int>& restricted_to() const { return restricted_to_; }

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }  // from MPI_COMM_TYPE_SHARED split
  int local_size() const { return local_size_; }
  // Among the ranks with this rank's local rank (one per host that has that
  // many ranks), ordered by world rank.
  int cross_rank() const { return cross_rank_; }
  int cross_size() const { return cross_size_; }
  // Every host holds the same number of ranks (the same on every rank).
  bool uniform_hosts() const { return uniform_hosts_; }

  // A transport on a fresh duplicate of MPI_COMM_WORLD, so gyre's messages
  // never match the job's own.
  std::unique_ptr<Transport> make_transport();
  // The same, waiting for the other ranks' duplication at most `timeout`
  // (zero: forever; then TimeoutError) and calling `check` about every
  // 50 ms while it waits (it may throw to give up: Ctrl-C). A duplication
  // given up stays pending in MPI and pairs with the other ranks' next
  // one, so the next make_transport() resumes it.
  std::unique_ptr<Transport> make_transport(std::chrono::milliseconds timeout,
                                            const std::function<void()>& check);
  // The same, cutting every transfer into MPI messages of at most
  // `max_message_bytes` (default: 1 GiB, under MPI's INT_MAX count limit).
  // Tests use a small value to exercise the cutting without 2 GiB buffers.
  std::unique_ptr<Transport> make_transport(std::size_t max_message_bytes);
  std::unique_ptr<Transport> make_transport(std::size_t max_message_bytes,
                                            std::chrono::milliseconds timeout,
                                            const std::function<void()>& check);
  // A transport among the ranks with this rank's local rank (cross_rank()
  // is the rank in it): the inter-host ring of a hierarchical allreduce.
  // Collective over MPI_COMM_WORLD.
  std::unique_ptr<Transport> make_cross_transport();
  // A transport among `ranks` (world ranks, sorted, without duplicates;
  // this rank's index in them is its rank in it) over a new communicator
  // (MPI_Comm_create_group): collective over those ranks only, which must
  // all pass the same ranks and `tag`. nullptr when this rank is not among
  // them (and then nothing is called). A process set's transport.
  std::unique_ptr<Transport> make_group_transport(const std::vector<int>& ranks, int tag);
  // A transport among `ranks` (world ranks, sorted, without duplicates,
  // this rank among them) made by those ranks alone: ranks outside never
  // call it (collectives/transport/mpi_members.cc). The members first agree
  // point to point, bounded by `timeout_s` (<= 0: 300 s): a member that does
  // not call within it, or calls for other ranks, makes the call fail on
  // every member that did (TimeoutError / InvalidArgument naming them). `id`
  // is this rank's proposal for the set's id and becomes the largest of the
  // members' proposals, the same on all of them.
  std::unique_ptr<Transport> make_members_transport(const std::vector<int>& ranks, int& id,
                                                    double timeout_s);
  // MPI runs at MPI_THREAD_MULTIPLE: several threads may call it at once
  // (a process set's background thread beside the global one).
  bool thread_multiple() const { return thread_multiple_; }

  // Elastic recovery over ULFM (collectives/transport/mpi_elastic.cc).
  // Whether this build has it (its MPI's mpi-ext.h declares ULFM); any time.
  static bool ulfm_built();
  // Built with ULFM and switched on at run time (`mpirun --with-ft ulfm`,
  // which sets OMPI_MCA_mpi_ft_enable=1). Only then does a peer's death
  // become RankFailedError instead of ending the job.
  static bool fault_tolerant();
  // Collective over the surviving ranks, after a RankFailedError: shrinks
  // the world to the survivors (MPIX_Comm_shrink), exchanges every
  // survivor's previous rank and committed step (`own_step`), confirms with
  // MPIX_Comm_agree that every survivor got them, shrinking again if another
  // rank failed meanwhile, and re-derives rank, size, local and cross ranks.
  // Transports made afterwards span the survivors; those made before must
  // be destroyed. Throws StateError without fault tolerance.
  RebuildOutcome rebuild(std::uint64_t own_step);
  // A failure is known (ULFM on): every communicator gyre made before this
  // call is kept, not freed, when its transport, store channel or
  // point-to-point channel is destroyed. Open MPI gives a freed
  // communicator's context id to the next communicator made, and a message a
  // peer sent on the freed one that arrives afterwards is delivered to the
  // new one, where it takes the place of a message in the peer's order: the
  // real one is then never matched. After a failure the old communicators'
  // traffic is cut off mid-flight, so their messages may still arrive (seen:
  // a survivor's MPI_Allreduce on the shrunk world waiting for ever, its peer
  // already past it). The failure paths call it themselves (any error that
  // says a peer failed); rebuild() calls it before the old runtime stops.
  // Without a failure, a transport or point-to-point channel destroyed with
  // transfers still posted (a timeout, an interrupt) keeps its communicator
  // for the same reason. Any time, any thread.
  static void retire_communicators();
  // How many communicators were kept instead of freed so far (tests, logs).
  static std::size_t kept_communicators();

  // Growing back (collectives/transport/mpi_grow.cc). Collective over the
  // world after rebuild(): the new rank 0 chooses hosts (the discovery
  // script's free slots, or the hosts of the ranks rebuild() lost) for
  // target_size - size() replacements and starts them with
  // MPI_Comm_spawn_multiple (the spawn command, in this process's working
  // directory); the world becomes the survivors followed by the
  // replacements (MPI_Intercomm_merge), which are told the agreed step,
  // the root and the new rank 0's GYRE_* environment variables. A spawn
  // MPI refuses leaves the world as it was (outcome.spawned 0, problem on
  // rank 0); a rank's failure during it throws RankFailedError.
  GrowOutcome grow(const GrowRequest& request);
  // The program and arguments replacements run: by default this process's
  // command line (/proc/self/cmdline); Python sets sys.executable and its
  // arguments. Any time; read by grow() on the new rank 0.
  static void set_spawn_command(std::vector<std::string> argv);
  // Set on a process started by grow(), at MPI initialisation.
  const JoinRecord& join_record() const { return join_; }
  // The world's size when the job started (a replacement: as its starters knew it).
  int start_size() const { return start_size_; }
  // Rebuilds of the world so far (a replacement counts those before it joined).
  int rebuilds() const { return rebuilds_; }

  // Ends the whole job with a non-zero status (MPI_Abort on MPI_COMM_WORLD).
  [[noreturn]] void abort(int code);

  // MPI_Finalize, only if MpiWorld initialised MPI; idempotent. After a
  // rebuild() it is given 10 s, then the process exits with status 0
  // (Open MPI 5.0 may wait for ever for the dead rank).
  void finalize();
  // In the child of a fork(): MPI is the parent's, so the child never
  // finalises it (finalize() does nothing) nor makes transports. Called
  // with no other thread running (a pthread_atfork child handler).
  void forget_after_fork() { finalized_ = true; }

 private:
  MpiWorld();
  void derive_layout();
  void use_ranks(const std::vector<int>& ranks);  // see instance(ranks)
  // The whole world's layout, kept while the world is restricted.
  struct Layout {
    int rank = 0, size = 1, local_rank = 0, local_size = 1, cross_rank = 0, cross_size = 1;
    bool uniform_hosts = true;
    std::vector<std::string> hosts;
  };
  Layout layout() const;
  void set_layout(const Layout& l);
  // hosts_ where it describes the current world; else empty.
  const std::vector<std::string>& known_hosts() const;
  void join_survivors(void* parent);  // MPI_Comm*, on a replacement (mpi_grow.cc)
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1, cross_rank_ = 0, cross_size_ = 1;
  bool uniform_hosts_ = true;
  bool owns_mpi_ = false;
  bool finalized_ = false;
  bool thread_multiple_ = false;
  bool rebuilt_ = false;  // rebuild() replaced the world: a rank died
  bool layout_known_ = false;  // rank_ ... hosts_ describe the current world
  std::vector<int> restricted_to_;  // instance(ranks): the world's ranks; empty: all
  bool world_layout_saved_ = false;
  Layout world_layout_;  // MPI_COMM_WORLD's, while restricted
  std::vector<std::string> hosts_;       // [r]: rank r's host (MPI_Get_processor_name)
  std::vector<std::string> lost_hosts_;  // hosts of the ranks the last rebuild() lost
  JoinRecord join_;
  int start_size_ = 1;
  int rebuilds_ = 0;
};

}  // namespace gyre::transport
