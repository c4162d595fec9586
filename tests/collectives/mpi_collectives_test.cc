// The ring algorithms, recursive doubling and Rabenseifner's allreduce over
// MpiTransport, checked element by element against MPI's own collectives on
// the same data: MPI_Allreduce, MPI_Allgatherv, MPI_Bcast,
// MPI_Reduce_scatter and MPI_Alltoallv. Run under mpirun with 2, 3 and 4
// ranks (tests/collectives/CMakeLists.txt).
//
// Integers must match exactly. Floating results may differ from MPI's by
// the order of additions: |ring - mpi| <= tol * sum_r |x_r| per element, with
// tol = 1e-6 (float32), 1e-14 (float64); min and max must match exactly.
#include <algorithm>
#include <mpi.h>
#include <sys/prctl.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gyre/collectives/algorithms.h"
#include "gyre/collectives/mpi_transport.h"
#include "gyre/collectives/naps.h"
#include "gyre/error.h"

using namespace gyre;
using namespace gyre::collectives;

namespace {

int g_rank = 0, g_size = 1;
long g_checks = 0, g_failures = 0;

void fail(const std::string& what) {
  if (g_failures < 20) std::fprintf(stderr, "rank %d: FAIL %s\n", g_rank, what.c_str());
  ++g_failures;
}

template <class T> MPI_Datatype mpi_type();
template <> MPI_Datatype mpi_type<float>() { return MPI_FLOAT; }
template <> MPI_Datatype mpi_type<double>() { return MPI_DOUBLE; }
template <> MPI_Datatype mpi_type<std::int8_t>() { return MPI_INT8_T; }
template <> MPI_Datatype mpi_type<std::uint8_t>() { return MPI_UINT8_T; }
template <> MPI_Datatype mpi_type<std::int32_t>() { return MPI_INT32_T; }
template <> MPI_Datatype mpi_type<std::int64_t>() { return MPI_INT64_T; }

template <class T> DataType gyre_type();
template <> DataType gyre_type<float>() { return DataType::kFloat32; }
template <> DataType gyre_type<double>() { return DataType::kFloat64; }
template <> DataType gyre_type<std::int8_t>() { return DataType::kInt8; }
template <> DataType gyre_type<std::uint8_t>() { return DataType::kUInt8; }
template <> DataType gyre_type<std::int32_t>() { return DataType::kInt32; }
template <> DataType gyre_type<std::int64_t>() { return DataType::kInt64; }

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage: return MPI_SUM;
    case ReduceOp::kMin: return MPI_MIN;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kProduct: return MPI_PROD;
  }
  return MPI_SUM;
}

// Rank-dependent data: floats in [-1, 1]; integers small enough that the
// product over 4 ranks cannot overflow (wrap-around would also agree, but
// is not what this test is about).
template <class T>
std::vector<T> make_data(std::size_t count, unsigned seed) {
  std::mt19937 gen(seed * 7919u + static_cast<unsigned>(g_rank) * 104729u + 1u);
  std::vector<T> v(count);
  for (auto& x : v) {
    if constexpr (std::is_floating_point_v<T>) {
      x = static_cast<T>(std::uniform_real_distribution<double>(-1.0, 1.0)(gen));
    } else if constexpr (std::is_signed_v<T>) {
      x = static_cast<T>(std::uniform_int_distribution<int>(-3, 3)(gen));
    } else {
      x = static_cast<T>(std::uniform_int_distribution<int>(0, 3)(gen));
    }
  }
  return v;
}

template <class T>
void compare(const std::vector<T>& got, const std::vector<T>& want, const std::vector<T>& abs_sum,
             double tol, const std::string& what) {
  ++g_checks;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const bool ok = tol == 0 ? got[i] == want[i]
                             : std::fabs(double(got[i]) - double(want[i])) <= tol * double(abs_sum[i]) + 1e-30;
    if (!ok) {
      fail(what + ": element " + std::to_string(i) + " got " + std::to_string(double(got[i])) +
           " want " + std::to_string(double(want[i])));
      return;
    }
  }
}

template <class T>
void check_allreduce(transport::Transport& t, std::size_t count, ReduceOp op, bool in_place,
                     std::size_t chunk_bytes, std::size_t small_bytes = kDefaultSmallBytes,
                     LargeAllreduce large = LargeAllreduce::kRing) {
  const std::vector<T> in = make_data<T>(count, static_cast<unsigned>(count) + static_cast<unsigned>(op));
  std::vector<T> want(count), abs_in(count), abs_sum(count);
  MPI_Allreduce(in.data(), want.data(), static_cast<int>(count), mpi_type<T>(), mpi_op(op), MPI_COMM_WORLD);
  double tol = 0;
  if constexpr (std::is_floating_point_v<T>) {
    for (std::size_t i = 0; i < count; ++i) abs_in[i] = std::fabs(in[i]);
    MPI_Allreduce(abs_in.data(), abs_sum.data(), static_cast<int>(count), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
    if (op == ReduceOp::kSum || op == ReduceOp::kAverage || op == ReduceOp::kProduct) {
      tol = std::is_same_v<T, float> ? 1e-6 : 1e-14;
    }
    if (op == ReduceOp::kAverage) {
      for (auto& x : want) x /= static_cast<T>(g_size);
      for (auto& x : abs_sum) x /= static_cast<T>(g_size);
    }
    if (op == ReduceOp::kProduct) abs_sum.assign(count, T(1));  // |product| <= 1 here
  } else if (op == ReduceOp::kAverage) {
    // Integers average toward zero (Horovod's rule; the sums do not wrap here).
    for (auto& x : want) x = static_cast<T>(std::trunc(static_cast<double>(x) / g_size));
  }
  std::vector<T> got = in;
  if (!in_place) got.assign(count, T(0));
  AllreduceOptions opt;
  opt.chunk_bytes = chunk_bytes;
  opt.small_bytes = small_bytes;
  opt.large = large;
  allreduce(t, in_place ? got.data() : in.data(), got.data(), count, gyre_type<T>(), op, opt);
  compare(got, want, abs_sum, tol,
          "allreduce " + std::string(dtype_name(gyre_type<T>())) + " " + std::string(op_name(op)) +
              " count " + std::to_string(count) + (in_place ? " in-place" : "") + " chunk " +
              std::to_string(chunk_bytes) + " small_bytes " + std::to_string(small_bytes) + " " +
              large_allreduce_name(large));
}

template <class T>
void allreduce_suite(transport::Transport& t) {
  const std::size_t n = static_cast<std::size_t>(g_size);
  const std::size_t counts[] = {0, 1, n - 1, n + 1, 1009, 300007};
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
    if (!op_defined(gyre_type<T>(), op)) continue;
    for (std::size_t count : counts) {
      check_allreduce<T>(t, count, op, false, kDefaultChunkBytes);
      check_allreduce<T>(t, count, op, true, kDefaultChunkBytes);
    }
    // Counts up to kDefaultSmallBytes went by recursive doubling above; the
    // ring with many chunks, and the ring for a small buffer:
    check_allreduce<T>(t, 4099, op, false, 40, 0);
    check_allreduce<T>(t, 4099, op, true, 40, 0);
    check_allreduce<T>(t, n + 1, op, false, kDefaultChunkBytes, 0);
    // Rabenseifner's algorithm instead of the ring: one chunk per exchange,
    // many chunks, and fewer elements than ranks.
    for (bool in_place : {false, true}) {
      for (std::size_t count : {std::size_t{1009}, std::size_t{300007}}) {
        check_allreduce<T>(t, count, op, in_place, kDefaultChunkBytes, 0, LargeAllreduce::kRabenseifner);
      }
      check_allreduce<T>(t, 4099, op, in_place, 40, 0, LargeAllreduce::kRabenseifner);
      check_allreduce<T>(t, n - 1, op, in_place, kDefaultChunkBytes, 0, LargeAllreduce::kRabenseifner);
    }
  }
}

void allgather_suite(transport::Transport& t) {
  for (std::size_t base : {0, 1, 13, 70001}) {
    for (std::size_t chunk : {kDefaultChunkBytes, std::size_t{1000}}) {
      std::vector<std::size_t> blocks(g_size);
      std::vector<int> counts(g_size), displs(g_size);
      std::size_t total = 0;
      for (int r = 0; r < g_size; ++r) {
        blocks[r] = (r == 1) ? 0 : base * (r + 1) + static_cast<std::size_t>(r) * 3;  // uneven, one empty
        counts[r] = static_cast<int>(blocks[r]);
        displs[r] = static_cast<int>(total);
        total += blocks[r];
      }
      std::vector<std::uint8_t> in(blocks[g_rank]);
      for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<std::uint8_t>(g_rank * 31 + i * 7 + base);
      std::vector<std::uint8_t> want(total), got(total, 0xee);
      MPI_Allgatherv(in.data(), counts[g_rank], MPI_UINT8_T, want.data(), counts.data(), displs.data(),
                     MPI_UINT8_T, MPI_COMM_WORLD);
      AllgatherOptions opt;
      opt.chunk_bytes = chunk;
      ring_allgather(t, in.data(), got.data(), blocks, opt);
      std::vector<std::uint8_t> none;
      compare(got, want, none, 0, "ring_allgather base " + std::to_string(base) + " chunk " + std::to_string(chunk));
      // In place: this rank's block already sits in the output.
      std::vector<std::uint8_t> inplace(total, 0xee);
      std::copy(in.begin(), in.end(), inplace.begin() + displs[g_rank]);  // in may be empty
      ring_allgather(t, inplace.data() + displs[g_rank], inplace.data(), blocks, opt);
      compare(inplace, want, none, 0, "ring_allgather in-place base " + std::to_string(base));
    }
  }
}

void broadcast_suite(transport::Transport& t) {
  for (std::size_t bytes : {std::size_t{0}, std::size_t{1}, std::size_t{1009}, std::size_t{1} << 20}) {
    for (int root = 0; root < g_size; ++root) {
      std::vector<std::uint8_t> want(bytes), got(bytes);
      for (std::size_t i = 0; i < bytes; ++i) {
        want[i] = static_cast<std::uint8_t>(g_rank == root ? (i * 13 + root) : 0x11);
      }
      got = want;
      MPI_Bcast(want.data(), static_cast<int>(bytes), MPI_UINT8_T, root, MPI_COMM_WORLD);
      BroadcastOptions opt;
      opt.chunk_bytes = 64 * 1024;
      ring_broadcast(t, got.data(), bytes, root, opt);
      std::vector<std::uint8_t> none;
      compare(got, want, none, 0, "ring_broadcast bytes " + std::to_string(bytes) + " root " + std::to_string(root));
    }
  }
}

template <class T>
void reduce_scatter_suite(transport::Transport& t, ReduceOp op) {
  for (std::size_t base : {0, 1, 5003}) {
    std::vector<std::size_t> counts(g_size);
    std::vector<int> icounts(g_size);
    std::size_t total = 0;
    for (int r = 0; r < g_size; ++r) {
      counts[r] = base * (r % 2 + 1) + static_cast<std::size_t>(r);
      icounts[r] = static_cast<int>(counts[r]);
      total += counts[r];
    }
    const std::vector<T> in = make_data<T>(total, 99 + static_cast<unsigned>(base));
    std::vector<T> want(counts[g_rank]), got(counts[g_rank]), abs_in(total), abs_sum(counts[g_rank]);
    MPI_Reduce_scatter(in.data(), want.data(), icounts.data(), mpi_type<T>(), mpi_op(op), MPI_COMM_WORLD);
    double tol = 0;
    if constexpr (std::is_floating_point_v<T>) {
      for (std::size_t i = 0; i < total; ++i) abs_in[i] = std::fabs(in[i]);
      MPI_Reduce_scatter(abs_in.data(), abs_sum.data(), icounts.data(), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
      if (op == ReduceOp::kSum || op == ReduceOp::kProduct) tol = std::is_same_v<T, float> ? 1e-6 : 1e-14;
      if (op == ReduceOp::kProduct) abs_sum.assign(counts[g_rank], T(1));  // |product| <= 1 here
    }
    ReduceScatterOptions opt;
    opt.chunk_bytes = 4096;
    ring_reduce_scatter(t, in.data(), got.data(), counts, gyre_type<T>(), op, opt);
    compare(got, want, abs_sum, tol, "ring_reduce_scatter " + std::string(dtype_name(gyre_type<T>())) + " " +
                                          std::string(op_name(op)) + " base " + std::to_string(base));
  }
}

void alltoall_suite(transport::Transport& t) {
  for (std::size_t k : {0, 1, 4097}) {
    std::vector<std::size_t> send(g_size), recv(g_size);
    std::vector<int> sc(g_size), sd(g_size), rc(g_size), rd(g_size);
    std::size_t st = 0, rt = 0;
    for (int p = 0; p < g_size; ++p) {
      send[p] = ((g_rank + 2 * p) % 5) * k;  // what this rank sends to p
      recv[p] = ((p + 2 * g_rank) % 5) * k;  // what p sends to this rank
      sc[p] = static_cast<int>(send[p]); sd[p] = static_cast<int>(st); st += send[p];
      rc[p] = static_cast<int>(recv[p]); rd[p] = static_cast<int>(rt); rt += recv[p];
    }
    std::vector<std::uint8_t> in(st), want(rt), got(rt, 0xee);
    for (std::size_t i = 0; i < st; ++i) in[i] = static_cast<std::uint8_t>(g_rank * 71 + i * 3);
    MPI_Alltoallv(in.data(), sc.data(), sd.data(), MPI_UINT8_T, want.data(), rc.data(), rd.data(),
                  MPI_UINT8_T, MPI_COMM_WORLD);
    alltoall(t, in.data(), send, got.data(), recv);
    std::vector<std::uint8_t> none;
    compare(got, want, none, 0, "alltoall k " + std::to_string(k));
  }
}

// wait() on a receive nobody sends gives a TimeoutError naming the peer,
// the direction, the tag and the size; destroying the transport cancels the
// abandoned receive.
void timeout_check(transport::MpiWorld& world) {
  auto t = world.make_transport();
  t->set_timeout(std::chrono::milliseconds(200));
  std::vector<std::byte> buf(24);
  transport::Transfer r = t->irecv(transport::ring_prev(*t), 99, buf);
  ++g_checks;
  try {
    t->wait(r);
    fail("timeout_check: wait() returned for a message never sent");
  } catch (const TimeoutError& e) {
    const std::string what = e.what();
    const std::string peer = "from rank " + std::to_string(transport::ring_prev(*t));
    if (what.find(peer) == std::string::npos || what.find("tag 99") == std::string::npos ||
        what.find("24 bytes") == std::string::npos) {
      fail("timeout_check: message lacks peer/tag/size: " + what);
    }
  }
}

// A wait that naps (a wait policy with naps, a message that never comes)
// sleeps with a timer slack of 1 us (naps.h: with the default 50 us a nap
// of 5 us took 89) and gives the calling thread its own slack back. The
// wait's interrupt check, which it calls on the waiting thread about every
// 50 ms, reads the thread's slack while the wait naps.
void naps_check(transport::MpiWorld& world) {
  auto t = world.make_transport();
  t->set_timeout(std::chrono::milliseconds(300));
  t->set_wait_policy({std::chrono::microseconds(0), std::chrono::microseconds(200)});
  const int before = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
  std::vector<int> during;
  t->set_interrupt_check([&] { during.push_back(prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0)); });
  std::vector<std::byte> buf(8);
  transport::Transfer r = t->irecv(transport::ring_prev(*t), 97, buf);
  try {
    t->wait(r);
  } catch (const TimeoutError&) {
  }
  const int after = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
  g_checks += 2;
  if (during.empty()) {
    fail("naps_check: the wait never called its interrupt check");
    return;
  }
  for (int ns : during) {
    if (ns != static_cast<int>(kNapSlackNs)) {
      fail("naps_check: the naps ran with a slack of " + std::to_string(ns) + " ns, not " +
           std::to_string(kNapSlackNs));
      break;
    }
  }
  if (after != before) {
    fail("naps_check: the thread's slack is " + std::to_string(after) +
         " ns after the wait, not its own " + std::to_string(before));
  }
}

// Ranks that disagree on a transfer's size: a shorter message than the
// receive expects and a longer one are both a TransportError on the
// receiver, never a quietly partial buffer. Each case on a fresh transport
// (one that reported an error is not used again).
void size_mismatch_check(transport::MpiWorld& world) {
  const struct {
    std::size_t sent, expected;
    const char* must_name;
  } cases[] = {{16, 24, "received 16 bytes"}, {24, 16, "16 bytes"}};
  for (const auto& c : cases) {
    auto t = world.make_transport();
    t->set_timeout(std::chrono::milliseconds(60000));
    std::vector<std::byte> out(c.sent, std::byte{1}), in(c.expected);
    transport::Transfer s = t->isend(transport::ring_next(*t), 98, out);
    transport::Transfer r = t->irecv(transport::ring_prev(*t), 98, in);
    ++g_checks;
    try {
      t->wait(r);
      fail("size_mismatch_check: a receive of " + std::to_string(c.expected) +
           " bytes completed from a send of " + std::to_string(c.sent));
    } catch (const TransportError& e) {
      const std::string what = e.what();
      if (what.find(c.must_name) == std::string::npos ||
          what.find("rank " + std::to_string(transport::ring_prev(*t))) == std::string::npos) {
        fail("size_mismatch_check: message lacks the sizes or the peer: " + what);
      }
    }
    t->wait(s);
    barrier(*t);
  }
}

// Small messages are cut into eager pieces only to peers on this rank's
// host (shared memory); to a peer on another host each goes whole (TCP's
// eager limit is 64 KiB, and every piece would be a message of its own
// through the network stack). The hosts come from MPI_Get_processor_name,
// as the simulated hosts of tests/multihost give each its own. Then every
// rank sends every size around the cut to every peer and checks the bytes.
void pieces_check(transport::MpiWorld& world) {
  auto t = world.make_transport();
  t->set_timeout(std::chrono::milliseconds(60000));
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  std::vector<char> names(static_cast<std::size_t>(g_size) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(), MPI_MAX_PROCESSOR_NAME,
                MPI_CHAR, MPI_COMM_WORLD);
  auto host = [&](int r) {
    return std::string(names.data() + static_cast<std::size_t>(r) * MPI_MAX_PROCESSOR_NAME);
  };
  for (int peer = 0; peer < g_size; ++peer) {
    if (peer == g_rank) continue;
    const bool local = host(peer) == host(g_rank);
    const struct {
      std::size_t bytes, local_pieces;
    } cases[] = {{4000, 1}, {4001, 2}, {16384, 5}, {65536, 17}, {65537, 1}};
    for (const auto& c : cases) {
      ++g_checks;
      const std::size_t want = local ? c.local_pieces : 1;
      const std::size_t got = t->pieces(peer, c.bytes);
      if (got != want) {
        fail("pieces_check: " + std::to_string(c.bytes) + " bytes to rank " +
             std::to_string(peer) + (local ? " (this host)" : " (another host)") + ": " +
             std::to_string(got) + " messages, expected " + std::to_string(want));
      }
    }
  }
  for (std::size_t bytes : {std::size_t{4001}, std::size_t{16384}, std::size_t{65536}}) {
    for (int shift = 1; shift < g_size; ++shift) {
      const int to = (g_rank + shift) % g_size, from = (g_rank - shift + g_size) % g_size;
      std::vector<std::byte> out(bytes), in(bytes);
      for (std::size_t i = 0; i < bytes; ++i) {
        out[i] = static_cast<std::byte>((i * 7 + static_cast<std::size_t>(g_rank)) & 0xff);
      }
      transport::Transfer r = t->irecv(from, 97, in);
      transport::Transfer s = t->isend(to, 97, out);
      t->wait(r);
      t->wait(s);
      ++g_checks;
      for (std::size_t i = 0; i < bytes; ++i) {
        if (in[i] != static_cast<std::byte>((i * 7 + static_cast<std::size_t>(from)) & 0xff)) {
          fail("pieces_check: " + std::to_string(bytes) + " bytes from rank " +
               std::to_string(from) + " differ at byte " + std::to_string(i));
          break;
        }
      }
    }
  }
  barrier(*t);
}

}  // namespace

int main(int argc, char** argv) {
  (void)argc;
  (void)argv;
  auto& world = transport::MpiWorld::instance();
  g_rank = world.rank();
  g_size = world.size();
  int code = 0;
  try {
    auto t = world.make_transport();
    t->set_timeout(std::chrono::milliseconds(60000));
    allreduce_suite<float>(*t);
    allreduce_suite<double>(*t);
    allreduce_suite<std::int8_t>(*t);
    allreduce_suite<std::uint8_t>(*t);
    allreduce_suite<std::int32_t>(*t);
    allreduce_suite<std::int64_t>(*t);
    allgather_suite(*t);
    broadcast_suite(*t);
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax}) {
      reduce_scatter_suite<float>(*t, op);
      reduce_scatter_suite<std::int32_t>(*t, op);
    }
    reduce_scatter_suite<double>(*t, ReduceOp::kProduct);
    alltoall_suite(*t);
    barrier(*t);
    // Again on a transport that cuts every transfer into MPI messages of at
    // most 4099 bytes: the path that messages above INT_MAX bytes take,
    // without 2 GiB buffers.
    auto cut = world.make_transport(4099);
    cut->set_timeout(std::chrono::milliseconds(60000));
    allreduce_suite<float>(*cut);
    allreduce_suite<std::int64_t>(*cut);
    allgather_suite(*cut);
    broadcast_suite(*cut);
    reduce_scatter_suite<double>(*cut, ReduceOp::kSum);
    alltoall_suite(*cut);
    barrier(*cut);
    timeout_check(world);
    naps_check(world);
    size_mismatch_check(world);
    pieces_check(world);
    barrier(*t);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: exception: %s\n", g_rank, e.what());
    world.abort(2);
  }
  long failures = 0;
  MPI_Allreduce(&g_failures, &failures, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (g_rank == 0) {
    std::printf("mpi_collectives_test: %d ranks, %ld checks per rank, %ld failures\n", g_size, g_checks, failures);
  }
  if (failures) code = 1;
  world.finalize();
  return code;
}
