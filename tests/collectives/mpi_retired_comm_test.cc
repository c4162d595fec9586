// A transport destroyed after a failure was noticed keeps its communicator
// (MpiWorld::retire_communicators): the late messages a peer sent on it
// must never reach a transport made afterwards. Run under mpirun with 2 and
// 3 ranks (tests/collectives/CMakeLists.txt); no process dies, so that the
// late message is placed deterministically:
//
//  1. every rank makes transport A; a failure is noticed on every rank
//     (retire_communicators(), what any error naming a dead peer calls);
//  2. rank 0 destroys A, then tells rank 1 over MPI_COMM_WORLD; rank 1 then
//     sends 13 to rank 0 on A (tag 7), as a peer whose traffic a failure
//     cut short would, and destroys A;
//  3. every rank makes transport B; rank 1 sends 42 to rank 0 on B (tag 7).
//
// Rank 0 must receive 42 on B within 10 s. With A's communicator freed
// instead, Open MPI gives its context id to B and hands rank 0 the late 13
// (a silent wrong value) or, depending on the sequence numbers, never
// matches the real message or B's own duplication (a hang; seen as such in
// the parameter store's kill tests, docs/elastic.md).
//
// Then, without a failure: a transport destroyed with a transfer still
// posted (a receive that timed out) keeps its communicator; the others free
// theirs.
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <span>
#include <string>

#include "gyre/collectives/mpi_transport.h"
#include "gyre/error.h"

using gyre::transport::MpiWorld;

namespace {

constexpr int kTag = 7;
constexpr auto kDeadline = std::chrono::milliseconds(10000);

std::span<const std::byte> bytes_of(const std::int64_t& v) {
  return {reinterpret_cast<const std::byte*>(&v), sizeof v};
}

}  // namespace

int main() {
  auto& world = MpiWorld::instance();
  const int rank = world.rank();
  std::string failure;
  try {
    auto a = world.make_transport(kDeadline, {});
    MPI_Barrier(MPI_COMM_WORLD);
    const std::size_t kept_before = MpiWorld::kept_communicators();
    MpiWorld::retire_communicators();
    int go = 1;
    if (rank == 0) {
      a.reset();
      MPI_Send(&go, 1, MPI_INT, 1, 0, MPI_COMM_WORLD);
    } else if (rank == 1) {
      MPI_Recv(&go, 1, MPI_INT, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      const std::int64_t late = 13;
      auto t = a->isend(0, kTag, bytes_of(late));
      a->wait(t);
      a.reset();
    } else {
      a.reset();
    }
    if (MpiWorld::kept_communicators() != kept_before + 1) {
      failure = "transport A's communicator was freed after retire_communicators()";
    }
    MPI_Barrier(MPI_COMM_WORLD);  // the late message reaches rank 0 here
    auto b = world.make_transport(kDeadline, {});
    b->set_timeout(kDeadline);
    if (rank == 1) {
      const std::int64_t real = 42;
      auto t = b->isend(0, kTag, bytes_of(real));
      b->wait(t);
    } else if (rank == 0) {
      std::int64_t got = 0;
      auto t = b->irecv(1, kTag, {reinterpret_cast<std::byte*>(&got), sizeof got});
      b->wait(t);
      if (got != 42) {
        failure = "received " + std::to_string(got) +
                  " on transport B, not the 42 rank 1 sent there (13 is the late message it "
                  "sent on transport A)";
      }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    // No failure now: a transport destroyed with a transfer still posted
    // (rank 0's receive that timed out) keeps its communicator too; one
    // whose transfers all completed (the other ranks') frees it.
    auto c = world.make_transport(kDeadline, {});
    const std::size_t kept_before_c = MpiWorld::kept_communicators();
    if (rank == 0) {
      std::int64_t never = 0;
      c->set_timeout(std::chrono::milliseconds(100));
      auto t = c->irecv(1, kTag, {reinterpret_cast<std::byte*>(&never), sizeof never});
      bool timed_out = false;
      try {
        c->wait(t);
      } catch (const gyre::TimeoutError&) {
        timed_out = true;
      }
      if (!timed_out) failure = "a receive nobody sends to completed";
    }
    c.reset();
    const std::size_t kept_c = MpiWorld::kept_communicators() - kept_before_c;
    if (kept_c != (rank == 0 ? 1u : 0u)) {
      failure = "transport C: " + std::to_string(kept_c) + " communicator(s) kept, expected " +
                (rank == 0 ? "1 (a receive was still posted)" : "0 (all transfers completed)");
    }
    MPI_Barrier(MPI_COMM_WORLD);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  if (!failure.empty()) {
    std::fprintf(stderr, "mpi_retired_comm_test: rank %d FAIL: %s\n", rank, failure.c_str());
    std::fflush(stderr);
    world.abort(1);
  }
  if (rank == 0) std::printf("mpi_retired_comm_test: %d ranks PASS\n", world.size());
  world.finalize();
  return 0;
}
