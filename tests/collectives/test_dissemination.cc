// dissemination_allreduce: every rank ends with the combination of every
// rank's words (AND, OR, min and max in one vector) for every world size
// 1..16, each rank sending exactly ceil(log2 n) messages (counted by the
// CountingTransport the negotiation uses); and bad arguments are refused
// before any transfer.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <string>
#include <vector>

#include "gyre/collectives/algorithms.h"
#include "gyre/collectives/counting_transport.h"
#include "gyre/collectives/local_transport.h"
#include "gyre/error.h"

using namespace gyre;
using namespace gyre::collectives;

namespace {

// [AND word, OR word, min, max] of rank r's values.
std::vector<std::uint64_t> words_of(int r) {
  const std::uint64_t bits = ~(std::uint64_t{1} << r) & 0xffffu;  // all but bit r
  return {bits, std::uint64_t{1} << r, 100u + static_cast<std::uint64_t>(r * 7 % 11),
          100u + static_cast<std::uint64_t>(r * 7 % 11)};
}

void combine(std::span<std::uint64_t> acc, std::span<const std::uint64_t> in) {
  acc[0] &= in[0];
  acc[1] |= in[1];
  acc[2] = std::min(acc[2], in[2]);
  acc[3] = std::max(acc[3], in[3]);
}

}  // namespace

TEST_CASE("dissemination_allreduce: idempotent combine of every rank, ceil(log2 n) messages",
          "[dissemination]") {
  for (int n = 1; n <= 16; ++n) {
    INFO("n = " << n);
    std::uint64_t want_and = 0xffffu, want_or = 0, want_min = ~0ull, want_max = 0;
    for (int r = 0; r < n; ++r) {
      const auto w = words_of(r);
      want_and &= w[0];
      want_or |= w[1];
      want_min = std::min(want_min, w[2]);
      want_max = std::max(want_max, w[3]);
    }
    int log2n = 0;
    while ((1 << log2n) < n) ++log2n;
    std::vector<std::vector<std::uint64_t>> got(static_cast<std::size_t>(n));
    std::vector<std::uint64_t> messages(static_cast<std::size_t>(n));
    transport::run_local_world(n, [&](transport::Transport& t) {
      transport::CountingTransport counted(t);
      auto w = words_of(t.rank());
      DisseminationOptions o;
      o.tag = 5;
      dissemination_allreduce(counted, w, combine, o);
      got[static_cast<std::size_t>(t.rank())] = w;
      messages[static_cast<std::size_t>(t.rank())] = counted.messages();
    }, std::chrono::milliseconds(30000));
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r);
      CHECK(got[static_cast<std::size_t>(r)] ==
            std::vector<std::uint64_t>{want_and, want_or, want_min, want_max});
      CHECK(messages[static_cast<std::size_t>(r)] == static_cast<std::uint64_t>(log2n));
    }
  }
}

TEST_CASE("dissemination_allreduce: a bad tag is refused before any transfer", "[dissemination]") {
  // Checked on the test's thread: Catch's assertions are not thread-safe.
  std::vector<int> refused(2, 0);
  std::vector<std::uint64_t> messages(2, 99);
  transport::run_local_world(2, [&](transport::Transport& t) {
    transport::CountingTransport counted(t);
    std::vector<std::uint64_t> w{1};
    DisseminationOptions o;
    o.tag = -1;
    try {
      dissemination_allreduce(counted, w, combine, o);
    } catch (const InvalidArgument&) {
      refused[static_cast<std::size_t>(t.rank())] = 1;
    }
    messages[static_cast<std::size_t>(t.rank())] = counted.messages();
  }, std::chrono::milliseconds(30000));
  CHECK(refused == std::vector<int>{1, 1});
  CHECK(messages == std::vector<std::uint64_t>{0, 0});
}

TEST_CASE("dissemination_allreduce with a tail: vectors of different lengths, a tail kept only "
          "where both carry it, ceil(log2 n) messages",
          "[dissemination]") {
  // Rank r's vector: [OR of rank bits] then, on even ranks only, a tail of
  // 3 words holding r. The combine ORs the heads, sums two tails of equal
  // length and drops the tail where only one side carries one (so, as the
  // negotiation's speculation does, a tail survives only where every rank
  // has one). n a power of two: the pairs are recursive doubling's.
  for (int n : {1, 2, 3, 4, 5, 8, 16}) {
    for (bool all_tails : {false, true}) {
      INFO("n = " << n << (all_tails ? ", every rank a tail" : ", even ranks a tail"));
      const bool pairs = (n & (n - 1)) == 0;
      std::vector<std::vector<std::uint64_t>> got(static_cast<std::size_t>(n));
      std::vector<std::uint64_t> messages(static_cast<std::size_t>(n)), bytes(messages);
      transport::run_local_world(n, [&](transport::Transport& t) {
        transport::CountingTransport counted(t);
        const int r = t.rank();
        std::vector<std::uint64_t> w{std::uint64_t{1} << r};
        if (all_tails || r % 2 == 0) w.insert(w.end(), 3, static_cast<std::uint64_t>(r));
        DisseminationOptions o;
        o.tag = 5;
        dissemination_allreduce(
            counted, w, 4,
            [](std::vector<std::uint64_t>& acc, std::span<const std::uint64_t> in) {
              acc[0] |= in[0];
              if (acc.size() != in.size()) {
                acc.resize(1);
              } else {
                for (std::size_t i = 1; i < acc.size(); ++i) acc[i] += in[i];
              }
            },
            o);
        got[static_cast<std::size_t>(r)] = w;
        messages[static_cast<std::size_t>(r)] = counted.messages();
        bytes[static_cast<std::size_t>(r)] = counted.bytes();
      }, std::chrono::milliseconds(30000));
      int log2n = 0;
      while ((1 << log2n) < n) ++log2n;
      std::vector<std::uint64_t> want{(std::uint64_t{1} << n) - 1};
      // The sum of the ranks survives where every rank carried a tail and
      // each was added once (recursive doubling; 1 rank: its own).
      if ((all_tails || n == 1) && pairs) want.insert(want.end(), 3, n * (n - 1) / 2);
      for (int r = 0; r < n; ++r) {
        INFO("rank " << r);
        if (pairs || !all_tails) CHECK(got[static_cast<std::size_t>(r)] == want);
        CHECK(got[static_cast<std::size_t>(r)][0] == want[0]);
        CHECK(messages[static_cast<std::size_t>(r)] == static_cast<std::uint64_t>(log2n));
        // Messages carry what the sender holds: a dropped tail is not sent on.
        if (!all_tails && pairs && n > 2) {
          CHECK(bytes[static_cast<std::size_t>(r)] < 32u * static_cast<std::uint64_t>(log2n));
        }
      }
    }
  }
}

TEST_CASE("transport messages of unknown length: shorter ones arrive with their length, longer "
          "ones than the room fail",
          "[dissemination][transport]") {
  std::vector<std::size_t> received(2, 99);
  std::vector<std::string> errors(2);
  transport::run_local_world(2, [&](transport::Transport& t) {
    const int peer = 1 - t.rank();
    std::vector<std::byte> out(t.rank() == 0 ? 10 : 40, std::byte{7}), room(16);
    std::size_t got = 0;
    transport::Transfer s = t.isend_message(peer, 3, out);
    transport::Transfer rcv = t.irecv_message(peer, 3, room, &got);
    try {
      t.wait(rcv);
      received[static_cast<std::size_t>(t.rank())] = got;
    } catch (const TransportError& e) {
      errors[static_cast<std::size_t>(t.rank())] = e.what();
    }
    t.wait(s);
  }, std::chrono::milliseconds(30000));
  // Rank 1 received rank 0's 10 bytes into 16 of room; rank 0 had room for
  // 16 of rank 1's 40.
  CHECK(received[1] == 10);
  CHECK(errors[1].empty());
  CHECK(errors[0].find("room for 16 bytes") != std::string::npos);
}
