// Point-to-point (send_async / recv_async of gyre.h) under mpirun with 2 or
// 3 ranks: ring exchanges against closed forms for every dtype and several
// sizes (0 elements included), ordering of messages with one tag, tags kept
// apart, any source with the sender returned, mismatched counts and dtypes
// failing on both ranks without writing, refusals at the call, a process
// set, a missing peer ending at the deadline, shutdown with a pending recv,
// and pairs completing while allreduces run. The core_p2p_*_on_coordinator
// entries run the same cases with GYRE_P2P_ON_COORDINATOR=1 (the engine
// driven by the runtime's loop instead of its own thread).
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "gyre/gyre.h"

using namespace gyre;

namespace {

Options test_options(double deadline_s = 60) {
  Options o;
  o.cycle_time_ms = 0.5;
  o.op_timeout_s = 60;
  o.stall_shutdown_s = deadline_s;
  o.p2p_on_coordinator = Options::from_env().p2p_on_coordinator;
  return o;
}

struct Session {
  explicit Session(double deadline_s = 60) { init(test_options(deadline_s)); }
  ~Session() {
    if (is_initialized()) shutdown();
  }
};

// Rank `src` sends element i of a message to `dst` as the byte pattern of
// (src * 31 + dst * 7 + i) % 251, whatever the dtype: a closed form.
std::vector<std::byte> pattern(int src, int dst, std::size_t bytes) {
  std::vector<std::byte> v(bytes);
  for (std::size_t i = 0; i < bytes; ++i) {
    v[i] = static_cast<std::byte>((src * 31 + dst * 7 + static_cast<int>(i)) % 251);
  }
  return v;
}

TensorView bytes_view(std::vector<std::byte>& v, DataType dt, std::int64_t n) {
  return TensorView{v.empty() ? nullptr : v.data(), dt, {n}};
}

}  // namespace

TEST_CASE("p2p: ring exchange of every dtype and several sizes", "[mpi]") {
  Session s;
  const int r = rank(), n = size();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  for (int d = 0; d < kNumDataTypes; ++d) {
    const auto dt = static_cast<DataType>(d);
    for (std::int64_t count : {0, 1, 17, 300000}) {
      const std::size_t bytes = static_cast<std::size_t>(count) * dtype_size(dt);
      auto out = pattern(r, next, bytes);
      std::vector<std::byte> in(bytes, std::byte{0});
      Handle rh = recv_async(bytes_view(in, dt, count), prev, 4);
      Handle sh = send_async(bytes_view(out, dt, count), next, 4);
      sh.wait();
      rh.wait();
      CHECK(rh.source_rank() == prev);
      CHECK(sh.source_rank() == next);
      INFO(fmt::format("dtype {} count {}", dtype_name(dt), count));
      CHECK(in == pattern(prev, r, bytes));
    }
  }
  barrier();  // no rank shuts down while another still receives (next case)
}

TEST_CASE("p2p: one tag keeps the order of sending; tags are kept apart", "[mpi]") {
  Session s;
  const int r = rank(), n = size();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  std::vector<std::vector<float>> in(5, std::vector<float>(3)), other(1, std::vector<float>(3));
  std::vector<Handle> hs;
  hs.push_back(recv_async(TensorView{other[0].data(), DataType::kFloat32, {3}}, prev, 9));
  for (auto& v : in) hs.push_back(recv_async(TensorView{v.data(), DataType::kFloat32, {3}}, prev, 1));
  std::vector<std::vector<float>> out;
  for (int i = 0; i < 5; ++i) out.push_back(std::vector<float>(3, static_cast<float>(100 * r + i)));
  out.push_back(std::vector<float>(3, -1.0f));
  for (int i = 0; i < 5; ++i) {
    hs.push_back(send_async(TensorView{out[static_cast<std::size_t>(i)].data(), DataType::kFloat32, {3}}, next, 1));
  }
  hs.push_back(send_async(TensorView{out[5].data(), DataType::kFloat32, {3}}, next, 9));
  for (auto& h : hs) h.wait();
  for (int i = 0; i < 5; ++i) CHECK(in[static_cast<std::size_t>(i)][0] == static_cast<float>(100 * prev + i));
  CHECK(other[0][2] == -1.0f);
  // Every rank's receives are done before any rank shuts down: under
  // GYRE_P2P_ON_COORDINATOR=1 the runtime's loop drives point-to-point, and
  // a peer's shutdown ends that loop on every rank, failing the receives of
  // a rank still waiting for messages already sent (docs/architecture.md).
  barrier();
}

TEST_CASE("p2p: any source receives every sender and names it", "[mpi]") {
  Session s;
  const int r = rank(), n = size();
  if (r == 0) {
    std::vector<int> seen;
    for (int i = 1; i < n; ++i) {
      std::int64_t got[2] = {0, 0};
      Handle h = recv_async(TensorView{got, DataType::kInt64, {2}}, kAnySource);
      h.wait();
      CHECK(got[0] == h.source_rank());
      CHECK(got[1] == h.source_rank() * 10);
      seen.push_back(h.source_rank());
    }
    std::sort(seen.begin(), seen.end());
    std::vector<int> want;
    for (int i = 1; i < n; ++i) want.push_back(i);
    CHECK(seen == want);
  } else {
    std::int64_t v[2] = {r, r * 10};
    send_async(TensorView{v, DataType::kInt64, {2}}, 0).wait();
  }
  barrier();
}

TEST_CASE("p2p: a different count or dtype fails on both ranks and writes nothing", "[mpi]") {
  Session s;
  const int r = rank();
  if (r == 0) {
    std::vector<float> in(3, -1.0f);
    Handle h = recv_async(TensorView{in.data(), DataType::kFloat32, {3}}, 1);
    CHECK_THROWS_WITH(h.wait(), Catch::Contains("rank 1 sent 4 x float32") &&
                                    Catch::Contains("takes 3 x float32"));
    CHECK(in == std::vector<float>(3, -1.0f));
    std::vector<std::int32_t> ints(4);
    Handle h2 = recv_async(TensorView{ints.data(), DataType::kInt32, {4}}, 1);
    CHECK_THROWS_AS(h2.wait(), MismatchError);
  } else if (r == 1) {
    std::vector<float> out(4, 1.0f);
    Handle h = send_async(TensorView{out.data(), DataType::kFloat32, {4}}, 0);
    CHECK_THROWS_WITH(h.wait(), Catch::Contains("rank 0's recv takes 3 x float32"));
    Handle h2 = send_async(TensorView{out.data(), DataType::kFloat32, {4}}, 0);
    CHECK_THROWS_AS(h2.wait(), MismatchError);
  }
  // The pair goes on: nothing of the refused sends is left to be received.
  if (r < 2) {
    float v = static_cast<float>(r + 1), got = 0;
    Handle sh = send_async(TensorView{&v, DataType::kFloat32, {1}}, 1 - r);
    recv_async(TensorView{&got, DataType::kFloat32, {1}}, 1 - r).wait();
    sh.wait();
    CHECK(got == static_cast<float>(2 - r));
  }
  barrier();
}

TEST_CASE("p2p: bad arguments are refused at the call", "[mpi]") {
  Session s;
  const int n = size();
  float v = 0;
  TensorView t{&v, DataType::kFloat32, {1}};
  CHECK_THROWS_WITH(send_async(t, n), Catch::Contains(fmt::format("rank {} is not a rank", n)));
  CHECK_THROWS_AS(recv_async(t, -5), InvalidArgument);
  CHECK_THROWS_WITH(send_async(t, kAnySource), Catch::Contains("needs a destination"));
  TensorView gpu = t;
  gpu.device = Device{DeviceType::kCUDA, 0};
  CHECK_THROWS_WITH(send_async(gpu, 0), Catch::Contains("CPU tensors only"));
  TensorView null{nullptr, DataType::kFloat32, {4}};
  CHECK_THROWS_WITH(recv_async(null, 0), Catch::Contains("null"));
  TensorView refused = t;
  refused.refusal = "tensor has unsupported dtype int16";
  CHECK_THROWS_WITH(send_async(refused, 0), Catch::Contains("unsupported dtype int16"));
}

TEST_CASE("p2p: a send refused at the call fails its receiver's recv at once", "[mpi]") {
  Session s;
  const int r = rank();
  if (r == 0) {
    float v = 0;
    Handle h = recv_async(TensorView{&v, DataType::kFloat32, {1}}, 1, 6);
    CHECK_THROWS_WITH(h.wait(), Catch::Contains("rank 1 refused its send") &&
                                    Catch::Contains("unsupported dtype int16"));
  } else if (r == 1) {
    float v = 0;
    TensorView refused{&v, DataType::kFloat32, {1}};
    refused.refusal = "tensor has unsupported dtype int16";
    CHECK_THROWS_AS(send_async(refused, 0, 6), InvalidArgument);
  }
  barrier();
}

TEST_CASE("p2p: on a process set, between its members", "[mpi]") {
  Session s;
  const int r = rank(), n = size();
  // A set of two ranks that is not every rank needs three.
  if (n < 3) return;
  const std::vector<int> members{0, n - 1};
  const int set = add_process_set(members);
  float v = static_cast<float>(r), got = -1;
  if (r == 0 || r == n - 1) {
    const int peer = r == 0 ? n - 1 : 0;
    // The same tag on the global set does not pair with the set's.
    float g = static_cast<float>(10 + r), ggot = -1;
    Handle a = recv_async(TensorView{&ggot, DataType::kFloat32, {1}}, peer, 0);
    Handle b = recv_async(TensorView{&got, DataType::kFloat32, {1}}, kAnySource, 0, set);
    Handle c = send_async(TensorView{&v, DataType::kFloat32, {1}}, peer, 0, set);
    Handle d = send_async(TensorView{&g, DataType::kFloat32, {1}}, peer, 0);
    for (auto* h : {&a, &b, &c, &d}) h->wait();
    CHECK(got == static_cast<float>(peer));
    CHECK(b.source_rank() == peer);
    CHECK(ggot == static_cast<float>(10 + peer));
  } else {
    CHECK_THROWS_WITH(send_async(TensorView{&v, DataType::kFloat32, {1}}, 0, 0, set),
                      Catch::Contains("is not in process set"));
  }
  if (r == 0) {
    CHECK_THROWS_WITH(send_async(TensorView{&v, DataType::kFloat32, {1}}, 1, 0, set),
                      Catch::Contains("rank 1 is not a rank of process set"));
  }
  barrier();
  remove_process_set(set);
}

TEST_CASE("p2p: a missing peer ends at the deadline, named", "[mpi]") {
  Session s(1.0);  // GYRE_STALL_SHUTDOWN_S = 1
  const int r = rank();
  const auto start = std::chrono::steady_clock::now();
  float v = 0;
  if (r == 0) {
    Handle h = recv_async(TensorView{&v, DataType::kFloat32, {1}}, 1, 3);
    CHECK_THROWS_WITH(h.wait(), Catch::Contains("rank 1 sent no matching message") &&
                                    Catch::Contains("GYRE_STALL_SHUTDOWN_S"));
  } else if (r == 1) {
    Handle h = send_async(TensorView{&v, DataType::kFloat32, {1}}, 0, 4);
    CHECK_THROWS_AS(h.wait(), TimeoutError);
  } else {
    // Waits out a deadline too, so that no rank waits in the barrier below
    // longer than the short deadline allows collectives.
    Handle h = recv_async(TensorView{&v, DataType::kFloat32, {1}}, kAnySource, 5);
    CHECK_THROWS_WITH(h.wait(), Catch::Contains("no rank sent a matching message"));
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
  barrier();
  if (r == 0) {
    // Rank 1's send of tag 4 gave up: this late recv is told, not paired.
    Handle h = recv_async(TensorView{&v, DataType::kFloat32, {1}}, 1, 4);
    CHECK_THROWS_WITH(h.wait(), Catch::Contains("rank 1 withdrew its send"));
  }
  barrier();
}

TEST_CASE("p2p: shutdown fails a pending recv with StateError", "[mpi]") {
  Handle h;
  float v = 0;
  {
    Session s;
    if (rank() == 0) h = recv_async(TensorView{&v, DataType::kFloat32, {1}}, kAnySource, 77);
    barrier();
  }
  if (h.valid()) CHECK_THROWS_AS(h.wait(), StateError);
}

TEST_CASE("p2p: send/recv pairs complete while allreduces run", "[mpi]") {
  Session s;
  const int r = rank(), n = size();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  constexpr int kAllreduces = 20, kExchanges = 50;
  std::vector<float> in(std::size_t{1} << 18, 1.0f), out(in.size());
  std::atomic<int> wrong_sums{0};
  std::thread reducer([&] {
    for (int k = 0; k < kAllreduces; ++k) {
      allreduce_async("p2p.beside", TensorView{in.data(), DataType::kFloat32,
                                               {static_cast<std::int64_t>(in.size())}},
                      TensorView{out.data(), DataType::kFloat32,
                                 {static_cast<std::int64_t>(out.size())}},
                      ReduceOp::kSum)
          .wait();
      for (float x : out) wrong_sums += x != static_cast<float>(n);
    }
  });
  int wrong_messages = 0;
  for (int k = 0; k < kExchanges; ++k) {
    std::int64_t got = -1, mine = 1000 * r + k;
    Handle h = recv_async(TensorView{&got, DataType::kInt64, {1}}, prev, 5);
    send_async(TensorView{&mine, DataType::kInt64, {1}}, next, 5).wait();
    h.wait();
    wrong_messages += got != 1000 * prev + k;
  }
  reducer.join();
  CHECK(wrong_messages == 0);
  CHECK(wrong_sums.load() == 0);
  barrier();  // no rank shuts down while another still receives (see above)
}
