// LocalTransport: MPI-like matching, size checks, timeouts and failure
// propagation, which the algorithm tests rely on.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "gyre/collectives/local_transport.h"
#include "gyre/error.h"

using namespace gyre;
using namespace gyre::transport;
using namespace std::chrono_literals;

namespace {

std::span<const std::byte> bytes_of(const int& x) {
  return {reinterpret_cast<const std::byte*>(&x), sizeof x};
}
std::span<std::byte> bytes_of(int& x) { return {reinterpret_cast<std::byte*>(&x), sizeof x}; }

}  // namespace

TEST_CASE("local transport: messages of one (source, tag) match in posting order", "[local]") {
  std::vector<int> got(6, -1);
  run_local_world(2, [&](Transport& t) {
    if (t.rank() == 0) {
      const int v[6] = {10, 11, 12, 20, 21, 22};
      for (int i = 0; i < 3; ++i) t.isend(1, 5, bytes_of(v[i]));      // tag 5
      for (int i = 3; i < 6; ++i) t.isend(1, 9, bytes_of(v[i]));      // tag 9
    } else {
      // Receive tag 9 first: tags are matched independently.
      Transfer r[6];
      for (int i = 3; i < 6; ++i) r[i] = t.irecv(0, 9, bytes_of(got[i]));
      for (int i = 0; i < 3; ++i) r[i] = t.irecv(0, 5, bytes_of(got[i]));
      for (auto& q : r) t.wait(q);
    }
  }, 10s);
  CHECK(got == std::vector<int>{10, 11, 12, 20, 21, 22});
}

TEST_CASE("local transport: receive posted before the send, and test() polling", "[local]") {
  int got = 0;
  bool reset_after_test = false;
  CHECK_FALSE(Transfer{}.pending());
  run_local_world(2, [&](Transport& t) {
    if (t.rank() == 1) {
      Transfer r = t.irecv(0, 0, bytes_of(got));
      while (!t.test(r)) {
      }
      reset_after_test = !r.pending();
      int ack = 1;
      t.wait(r);  // a completed request waits for nothing
      Transfer s = t.isend(0, 1, bytes_of(ack));
      t.wait(s);
    } else {
      int ack = 0;
      Transfer a = t.irecv(1, 1, bytes_of(ack));
      const int v = 42;
      t.isend(1, 0, bytes_of(v));
      t.wait(a);
    }
  }, 10s);
  CHECK(got == 42);
  CHECK(reset_after_test);
}

TEST_CASE("local transport: a size mismatch is a TransportError naming both sizes", "[local]") {
  CHECK_THROWS_WITH(run_local_world(2, [&](Transport& t) {
    if (t.rank() == 0) {
      const std::vector<std::byte> v(8);
      t.isend(1, 3, v);
    } else {
      std::vector<std::byte> v(4);
      Transfer r = t.irecv(0, 3, v);
      t.wait(r);
    }
  }, 10s), Catch::Contains("expected 4 bytes from rank 0 (tag 3)") && Catch::Contains("8 bytes"));
}

TEST_CASE("local transport: wait() times out with a TimeoutError naming peer and tag", "[local]") {
  CHECK_THROWS_AS(run_local_world(2, [&](Transport& t) {
    if (t.rank() == 1) {
      int x = 0;
      Transfer r = t.irecv(0, 7, bytes_of(x));
      t.wait(r);  // rank 0 never sends
    }
  }, 200ms), TimeoutError);
  try {
    run_local_world(1, [&](Transport& t) {
      int x = 0;
      Transfer r = t.irecv(0, 7, bytes_of(x));
      t.wait(r);
    }, 100ms);
    FAIL("no timeout");
  } catch (const TimeoutError& e) {
    CHECK_THAT(e.what(), Catch::Contains("from rank 0") && Catch::Contains("tag 7") &&
                             Catch::Contains("4 bytes"));
  }
}

TEST_CASE("local transport: one rank failing releases the others, its error is rethrown", "[local]") {
  std::atomic<int> released{0};
  CHECK_THROWS_WITH(run_local_world(4, [&](Transport& t) {
    if (t.rank() == 2) throw std::runtime_error("rank 2 broke");
    int x = 0;
    Transfer r = t.irecv(2, 0, bytes_of(x));  // no timeout: only the failure ends this
    try {
      t.wait(r);
    } catch (const TransportError&) {
      ++released;
      throw;
    }
  }), "rank 2 broke");
  CHECK(released == 3);
}

TEST_CASE("local transport: bad peers and worlds", "[local]") {
  CHECK_THROWS_AS(make_local_world(0), InvalidArgument);
  CHECK_THROWS_AS(LocalTransport(make_local_world(2), 2), InvalidArgument);
  CHECK_THROWS_AS(run_local_world(2, [](Transport& t) {
    int x = 0;
    t.isend(t.size(), 0, bytes_of(x));
  }), InvalidArgument);
}
