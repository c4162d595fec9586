// The shared-memory collectives between processes (mpirun -np 2..4 on one
// host), against MPI's own collectives on the same data; and the set-up
// leaves no segment name behind in /dev/shm.
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <numeric>
#include <string>
#include <vector>

#include "gyre/collectives/shm_host.h"
#include "gyre/error.h"

using namespace gyre;
using namespace gyre::collectives;

namespace {

int g_checks = 0, g_failures = 0;

void expect(bool ok, const std::string& what) {
  ++g_checks;
  if (!ok) {
    ++g_failures;
    std::fprintf(stderr, "FAILED: %s\n", what.c_str());
  }
}

// Segments of this job: their names start with the creator's (local rank 0,
// here world rank 0) pid. Other jobs (tests running beside this one) may
// have their own.
std::string g_prefix;

int count_gyre_segments() {
  int n = 0;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d)) n += std::strncmp(e->d_name, g_prefix.c_str(), g_prefix.size()) == 0;
    ::closedir(d);
  }
  return n;
}

// Values that every reduction of 2..4 ranks holds exactly in float32.
float value(int rank, std::size_t i) { return static_cast<float>((rank * 7 + i * 3) % 13); }

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  int pid = ::getpid();
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  g_prefix = "gyre-" + std::to_string(pid) + "-";
  const int before = count_gyre_segments();
  MPI_Barrier(MPI_COMM_WORLD);

  ShmOptions opt;
  opt.slot_bytes = 4096;  // many chunks with small buffers
  opt.timeout = std::chrono::milliseconds(60000);
  auto host = transport::ShmHost::create(opt);
  expect(host != nullptr, "every rank of this test is on one host and wants the group");
  if (!host) MPI_Abort(MPI_COMM_WORLD, 1);
  ShmGroup& g = host->group();
  expect(transport::ShmHost::create(opt, rank != 0) == nullptr,
         "no group unless every rank wants it");
  expect(g.size() == n && g.rank() == rank, "the group is the world, in world order");
  MPI_Barrier(MPI_COMM_WORLD);
  expect(count_gyre_segments() == before, "no segment name left in /dev/shm after set-up");

  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1023}, std::size_t{100003}}) {
    std::vector<float> in(count), got(count), want(count);
    for (std::size_t i = 0; i < count; ++i) in[i] = value(rank, i);
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax}) {
      MPI_Op mop = op == ReduceOp::kSum ? MPI_SUM : op == ReduceOp::kMin ? MPI_MIN : MPI_MAX;
      shm_allreduce(g, in.data(), got.data(), count, DataType::kFloat32, op);
      MPI_Allreduce(in.data(), want.data(), static_cast<int>(count), MPI_FLOAT, mop, MPI_COMM_WORLD);
      expect(got == want, "allreduce " + std::string(op_name(op)) + " of " + std::to_string(count));
    }
    // Reduce-scatter of uneven blocks.
    std::vector<std::size_t> counts(n);
    std::vector<int> icounts(n);
    for (int r = 0; r < n; ++r) icounts[r] = static_cast<int>(counts[r] = count / n + (r < static_cast<int>(count % n)));
    std::vector<float> rs(counts[rank]), rs_want(counts[rank]);
    shm_reduce_scatter(g, in.data(), rs.data(), counts, DataType::kFloat32, ReduceOp::kSum);
    MPI_Reduce_scatter(in.data(), rs_want.data(), icounts.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    expect(rs == rs_want, "reduce-scatter of " + std::to_string(count));
    // Allgather of blocks of rank-dependent size.
    std::vector<std::size_t> blocks(n);
    std::vector<int> iblocks(n), displs(n);
    for (int r = 0; r < n; ++r) iblocks[r] = static_cast<int>(blocks[r] = (count * (r + 1)) / n * 4);
    std::partial_sum(iblocks.begin(), iblocks.end() - 1, displs.begin() + 1);
    const std::size_t total = std::accumulate(blocks.begin(), blocks.end(), std::size_t{0});
    std::vector<char> mine(blocks[rank]), ag(total), ag_want(total);
    for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<char>(rank * 17 + i);
    shm_allgather(g, mine.data(), ag.data(), blocks);
    MPI_Allgatherv(mine.data(), iblocks[rank], MPI_CHAR, ag_want.data(), iblocks.data(),
                   displs.data(), MPI_CHAR, MPI_COMM_WORLD);
    expect(ag == ag_want, "allgather of " + std::to_string(total) + " bytes");
    // Broadcast from the last rank.
    std::vector<float> b = in, b_want = in;
    shm_broadcast(g, b.data(), count * 4, n - 1);
    MPI_Bcast(b_want.data(), static_cast<int>(count), MPI_FLOAT, n - 1, MPI_COMM_WORLD);
    expect(b == b_want, "broadcast of " + std::to_string(count));
    // All-to-all: rank p sends (p + q + 1) * count / 7 bytes to rank q.
    std::vector<std::size_t> send(n), recv(n);
    std::vector<int> isend(n), irecv(n), sd(n, 0), rd(n, 0);
    std::size_t max_pair = 0;
    for (int q = 0; q < n; ++q) {
      isend[q] = static_cast<int>(send[q] = (rank + q + 1) * count / 7);
      irecv[q] = static_cast<int>(recv[q] = (q + rank + 1) * count / 7);
      for (int p = 0; p < n; ++p) max_pair = std::max(max_pair, (p + q + 1) * count / 7);
    }
    std::partial_sum(isend.begin(), isend.end() - 1, sd.begin() + 1);
    std::partial_sum(irecv.begin(), irecv.end() - 1, rd.begin() + 1);
    std::vector<char> a_in(std::accumulate(send.begin(), send.end(), std::size_t{0}));
    for (std::size_t i = 0; i < a_in.size(); ++i) a_in[i] = static_cast<char>(rank * 31 + i * 5);
    std::vector<char> a_out(std::accumulate(recv.begin(), recv.end(), std::size_t{0})), a_want(a_out.size());
    shm_alltoall(g, a_in.data(), send, a_out.data(), recv, max_pair);
    MPI_Alltoallv(a_in.data(), isend.data(), sd.data(), MPI_CHAR, a_want.data(), irecv.data(),
                  rd.data(), MPI_CHAR, MPI_COMM_WORLD);
    expect(a_out == a_want, "alltoall with " + std::to_string(count) + "-scaled splits");
  }

  host.reset();
  MPI_Barrier(MPI_COMM_WORLD);
  expect(count_gyre_segments() == before, "no segment left in /dev/shm at the end");
  int failures = 0;
  MPI_Allreduce(&g_failures, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) {
    std::printf("mpi_shm_test: %d ranks, %d checks per rank, %d failures\n", n, g_checks, failures);
  }
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
