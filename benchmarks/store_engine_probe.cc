// gyre-store-engine-probe: the two engines a versioned parameter store could
// stand on, measured on the same workload (docs/training-modes.md, "Which
// engine"). Rank 0 owns one shard {int64 version, float value[n]}; every
// other rank K times pulls (version, value) and pushes +1 to every element
// with the version it pulled, retrying when the owner's version moved on
// (optimistic concurrency). The owner can spend the run computing without
// calling MPI (--owner-busy-ms), as a worker owning a shard does between its
// own steps. Prints the final version/value against ranks*K (a lost update
// would show) and per-rank mean pull/push latency and rejections.
//
//   rma     MPI-3 passive target: MPI_Win_allocate; pull under a shared lock,
//           push under an exclusive lock (get version, flush, accumulate and
//           put version+1 only if it matched).
//   server  two-sided requests to a server thread on the owner
//           (MPI_THREAD_MULTIPLE, a communicator of its own).
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double micros(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

constexpr int kOwner = 0;
enum Tag : int { kPullTag = 1, kPushTag = 2, kDoneTag = 3 };

struct Args {
  std::string engine = "rma";
  std::size_t floats = 1024;
  int pushes = 200;
  int owner_busy_ms = 0;
};

struct Tally {
  double pull_us = 0, push_us = 0;
  long pulls = 0, pushes = 0, rejected = 0;
};

void compute_without_mpi(int ms) {
  const auto end = Clock::now() + std::chrono::milliseconds(ms);
  volatile double x = 0;
  while (Clock::now() < end) x = x + 1;
}

// Returns the owner's final (version, value[0], value[n-1]).
struct Final { std::int64_t version; float first, last; };

Final run_rma(const Args& a, int rank, Tally& t) {
  const MPI_Aint bytes = 8 + static_cast<MPI_Aint>(a.floats) * 4;
  void* base = nullptr;
  MPI_Win win;
  MPI_Win_allocate(bytes, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
  std::memset(base, 0, bytes);
  MPI_Barrier(MPI_COMM_WORLD);
  const int n = static_cast<int>(a.floats);
  std::vector<float> ones(a.floats, 1.0f), pulled(a.floats);
  if (rank == kOwner) {
    compute_without_mpi(a.owner_busy_ms);
  } else {
    for (int k = 0; k < a.pushes; ++k) {
      for (;;) {
        std::int64_t seen = 0, current = 0;
        const auto t0 = Clock::now();
        MPI_Win_lock(MPI_LOCK_SHARED, kOwner, 0, win);
        MPI_Get(&seen, 8, MPI_BYTE, kOwner, 0, 8, MPI_BYTE, win);
        MPI_Get(pulled.data(), n, MPI_FLOAT, kOwner, 8, n, MPI_FLOAT, win);
        MPI_Win_unlock(kOwner, win);
        const auto t1 = Clock::now();
        MPI_Win_lock(MPI_LOCK_EXCLUSIVE, kOwner, 0, win);
        MPI_Get(&current, 8, MPI_BYTE, kOwner, 0, 8, MPI_BYTE, win);
        MPI_Win_flush(kOwner, win);
        const bool applied = current == seen;
        if (applied) {
          const std::int64_t next = current + 1;
          MPI_Accumulate(ones.data(), n, MPI_FLOAT, kOwner, 8, n, MPI_FLOAT, MPI_SUM, win);
          MPI_Put(&next, 8, MPI_BYTE, kOwner, 0, 8, MPI_BYTE, win);
        }
        MPI_Win_unlock(kOwner, win);
        const auto t2 = Clock::now();
        t.pull_us += micros(t0, t1); t.push_us += micros(t1, t2); ++t.pulls; ++t.pushes;
        if (applied) break;
        ++t.rejected;
      }
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  Final f{};
  if (rank == kOwner) {
    std::memcpy(&f.version, base, 8);
    const float* v = reinterpret_cast<const float*>(static_cast<char*>(base) + 8);
    f.first = v[0];
    f.last = v[a.floats - 1];
  }
  MPI_Win_free(&win);
  return f;
}

Final run_server(const Args& a, int rank, int size, Tally& t) {
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  const std::size_t msg = 8 + a.floats * 4;
  std::vector<float> value(a.floats, 0.0f);
  std::int64_t version = 0;
  std::thread server;
  if (rank == kOwner) {
    server = std::thread([&] {
      std::vector<char> buf(msg);
      for (int done = 0; done < size - 1;) {
        MPI_Status st;
        MPI_Recv(buf.data(), static_cast<int>(msg), MPI_BYTE, MPI_ANY_SOURCE, MPI_ANY_TAG, comm, &st);
        if (st.MPI_TAG == kDoneTag) {
          ++done;
        } else if (st.MPI_TAG == kPullTag) {
          std::memcpy(buf.data(), &version, 8);
          std::memcpy(buf.data() + 8, value.data(), a.floats * 4);
          MPI_Send(buf.data(), static_cast<int>(msg), MPI_BYTE, st.MPI_SOURCE, kPullTag, comm);
        } else {
          std::int64_t base = 0, reply = 0;
          std::memcpy(&base, buf.data(), 8);
          if (base == version) {
            const float* d = reinterpret_cast<const float*>(buf.data() + 8);
            for (std::size_t i = 0; i < a.floats; ++i) value[i] += d[i];
            reply = ++version;
          } else {
            reply = -1;
          }
          MPI_Send(&reply, 1, MPI_INT64_T, st.MPI_SOURCE, kPushTag, comm);
        }
      }
    });
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == kOwner) {
    compute_without_mpi(a.owner_busy_ms);
  } else {
    std::vector<char> request(msg), reply_buf(msg);
    float* delta = reinterpret_cast<float*>(request.data() + 8);
    for (std::size_t i = 0; i < a.floats; ++i) delta[i] = 1.0f;
    for (int k = 0; k < a.pushes; ++k) {
      for (;;) {
        const auto t0 = Clock::now();
        MPI_Send(nullptr, 0, MPI_BYTE, kOwner, kPullTag, comm);
        MPI_Recv(reply_buf.data(), static_cast<int>(msg), MPI_BYTE, kOwner, kPullTag, comm, MPI_STATUS_IGNORE);
        const auto t1 = Clock::now();
        std::memcpy(request.data(), reply_buf.data(), 8);  // the version pulled
        MPI_Send(request.data(), static_cast<int>(msg), MPI_BYTE, kOwner, kPushTag, comm);
        std::int64_t reply = 0;
        MPI_Recv(&reply, 1, MPI_INT64_T, kOwner, kPushTag, comm, MPI_STATUS_IGNORE);
        const auto t2 = Clock::now();
        t.pull_us += micros(t0, t1); t.push_us += micros(t1, t2); ++t.pulls; ++t.pushes;
        if (reply >= 0) break;
        ++t.rejected;
      }
    }
    MPI_Send(nullptr, 0, MPI_BYTE, kOwner, kDoneTag, comm);
  }
  if (rank == kOwner) server.join();
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Comm_free(&comm);
  return {version, value[0], value[a.floats - 1]};
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--engine") a.engine = argv[i + 1];
    else if (k == "--floats") a.floats = std::strtoull(argv[i + 1], nullptr, 10);
    else if (k == "--pushes") a.pushes = std::atoi(argv[i + 1]);
    else if (k == "--owner-busy-ms") a.owner_busy_ms = std::atoi(argv[i + 1]);
    else { std::fprintf(stderr, "unknown option %s\n", argv[i]); std::exit(2); }
  }
  if (a.floats == 0 || (a.engine != "rma" && a.engine != "server")) {
    std::fprintf(stderr, "usage: --engine rma|server --floats N>0 --pushes K --owner-busy-ms MS\n");
    std::exit(2);
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const Args a = parse(argc, argv);
  if (size < 2 || (a.engine == "server" && provided < MPI_THREAD_MULTIPLE)) {
    if (rank == 0) std::fprintf(stderr, "needs 2+ ranks (and MPI_THREAD_MULTIPLE for the server engine)\n");
    MPI_Finalize();
    return 2;
  }
  Tally t;
  const auto start = Clock::now();
  const Final f = a.engine == "rma" ? run_rma(a, rank, t) : run_server(a, rank, size, t);
  const double total_ms = micros(start, Clock::now()) / 1000;
  const std::int64_t expected = static_cast<std::int64_t>(size - 1) * a.pushes;
  int status = 0;
  if (rank == kOwner) {
    const bool exact = f.version == expected && f.first == static_cast<float>(expected) &&
                       f.last == static_cast<float>(expected);
    std::printf("engine %s, %zu floats, %d ranks: version %lld, value %.0f..%.0f, expected %lld: %s\n",
                a.engine.c_str(), a.floats, size, static_cast<long long>(f.version), f.first, f.last,
                static_cast<long long>(expected), exact ? "exact" : "LOST UPDATE");
    status = exact ? 0 : 1;
  } else {
    std::printf("rank %d: mean pull %.1f us, mean push %.1f us, %ld of %ld pushes rejected, %.0f ms\n", rank,
                t.pull_us / t.pulls, t.push_us / t.pushes, t.rejected, t.pushes, total_ms);
  }
  MPI_Finalize();
  return status;
}
