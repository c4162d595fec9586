// Fault injection for the elastic tests: a rank SIGKILLs itself from inside
// gyre's data transfer, at a chosen send. Wraps MPI_Isend through MPI's
// profiling interface (PMPI_Isend): linked into gyre_elastic_kill, and built
// as a shared library that a Python test loads with LD_PRELOAD (its
// MPI_Isend then comes before libmpi's).
//
// Only sends of at least `min_bytes` count: the data of a large allreduce,
// not the negotiation's small messages. gyre_test_arm_kill(nth, min_bytes,
// rank) restarts the count; the nth counted send after it is never posted:
// the process dies first, with nth - 1 of its data sends of that operation
// posted. nth = 0 only counts (gyre_test_sends() reads the count), e.g. to
// learn how many sends one fused bucket takes.
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>

namespace {
std::atomic<long> g_nth{0};
std::atomic<long> g_min_bytes{1L << 62};
std::atomic<long> g_sends{0};
std::atomic<int> g_rank{-1};
}  // namespace

extern "C" {

void gyre_test_arm_kill(long nth, long min_bytes, int rank) {
  g_nth.store(0);
  g_sends.store(0);
  g_min_bytes.store(min_bytes);
  g_rank.store(rank);
  g_nth.store(nth);
}

long gyre_test_sends(void) { return g_sends.load(); }

int MPI_Isend(const void* buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm,
              MPI_Request* request) {
  int type_size = 0;
  PMPI_Type_size(type, &type_size);
  if (static_cast<long>(count) * type_size >= g_min_bytes.load()) {
    const long n = g_sends.fetch_add(1) + 1;
    if (g_nth.load() > 0 && n == g_nth.load()) {
      const long long t = std::chrono::duration_cast<std::chrono::nanoseconds>(
                              std::chrono::steady_clock::now().time_since_epoch())
                              .count();
      std::fprintf(stderr, "elastic: rank %d killed at %lld in its data send %ld (%ld bytes)\n",
                   g_rank.load(), t, n, static_cast<long>(count) * type_size);
      std::fflush(stderr);
      std::raise(SIGKILL);
    }
  }
  return PMPI_Isend(buf, count, type, dest, tag, comm, request);
}

}  // extern "C"
