// ring_allgather, ring_broadcast, ring_reduce_scatter, alltoall and barrier
// on the in-process transport, world sizes 1..8, closed-form expectations.
#include <catch2/catch.hpp>

#include <atomic>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "gyre/collectives/algorithms.h"
#include "gyre/collectives/local_transport.h"
#include "test_support.h"

using namespace gyre;
using namespace gyre::collectives;
using gyre::transport::run_local_world;

namespace {

constexpr std::chrono::milliseconds kTimeout{60000};

std::byte pattern(int rank, std::size_t i) { return static_cast<std::byte>((rank * 31 + i * 7 + 3) & 0xff); }

// Block sizes for rank r: uneven, rank 1 empty when there is one.
std::vector<std::size_t> uneven_blocks(int n, std::size_t base) {
  std::vector<std::size_t> b(n);
  for (int r = 0; r < n; ++r) b[r] = r == 1 ? 0 : base + static_cast<std::size_t>(r) * (base / 3 + 1);
  return b;
}

}  // namespace

TEST_CASE("ring_allgather: uneven blocks, in place and out of place", "[allgather]") {
  for (int n = 1; n <= 8; ++n) {
    for (std::size_t base : {0, 1, 5, 1009, 70000}) {
      for (std::size_t chunk : {kDefaultChunkBytes, std::size_t{7}}) {
        if (chunk == 7 && base > 1009) continue;  // 10^4 chunks: covered by smaller sizes
        for (bool in_place : {false, true}) {
          INFO("n " << n << " base " << base << " chunk " << chunk << (in_place ? " in-place" : ""));
          const auto blocks = uneven_blocks(n, base);
          std::vector<std::size_t> off(n + 1, 0);
          for (int r = 0; r < n; ++r) off[r + 1] = off[r] + blocks[r];
          std::vector<std::vector<std::byte>> in(n), out(n, std::vector<std::byte>(off[n], std::byte{0xee}));
          for (int r = 0; r < n; ++r) {
            for (std::size_t i = 0; i < blocks[r]; ++i) in[r].push_back(pattern(r, i));
            if (in_place) std::copy(in[r].begin(), in[r].end(), out[r].begin() + off[r]);
          }
          run_local_world(n, [&](transport::Transport& t) {
            AllgatherOptions opt;
            opt.chunk_bytes = chunk;
            const int r = t.rank();
            const void* src = in_place ? static_cast<const void*>(out[r].data() + off[r]) : in[r].data();
            ring_allgather(t, src, out[r].data(), blocks, opt);
          }, kTimeout);
          std::size_t wrong = 0;
          for (int r = 0; r < n; ++r) {
            for (int b = 0; b < n; ++b) {
              for (std::size_t i = 0; i < blocks[b]; ++i) wrong += out[r][off[b] + i] != pattern(b, i);
            }
          }
          CHECK(wrong == 0);
        }
      }
    }
  }
}

TEST_CASE("ring_broadcast: every root, several chunk counts", "[broadcast]") {
  for (int n = 1; n <= 8; ++n) {
    for (std::size_t bytes : {std::size_t{0}, std::size_t{1}, static_cast<std::size_t>(n + 1),
                              std::size_t{1009}, std::size_t{300001}}) {
      for (std::size_t chunk : {kDefaultChunkBytes, std::size_t{100}}) {
        for (int root = 0; root < n; ++root) {
          INFO("n " << n << " bytes " << bytes << " chunk " << chunk << " root " << root);
          std::vector<std::vector<std::byte>> buf(n);
          for (int r = 0; r < n; ++r) {
            buf[r].resize(bytes);
            for (std::size_t i = 0; i < bytes; ++i) buf[r][i] = pattern(r, i);
          }
          run_local_world(n, [&](transport::Transport& t) {
            BroadcastOptions opt;
            opt.chunk_bytes = chunk;
            ring_broadcast(t, buf[t.rank()].data(), bytes, root, opt);
          }, kTimeout);
          std::size_t wrong = 0;
          for (int r = 0; r < n; ++r) {
            for (std::size_t i = 0; i < bytes; ++i) wrong += buf[r][i] != pattern(root, i);
          }
          CHECK(wrong == 0);
        }
      }
    }
  }
}

TEST_CASE("ring_reduce_scatter: every dtype and op, uneven counts", "[reduce_scatter]") {
  for (int n = 1; n <= 8; ++n) {
    for (DataType dt : test::kAllTypes) {
      for (ReduceOp op : test::kAllOps) {
        if (!op_defined(dt, op)) continue;
        for (std::size_t base : {0, 1, 13, 4001}) {
          for (bool in_place : {false, true}) {
            const std::size_t chunk = base == 13 ? 3 * dtype_size(dt) : kDefaultChunkBytes;
            INFO("n " << n << " dtype " << dtype_name(dt) << " op " << op_name(op) << " base " << base
                      << " chunk " << chunk << (in_place ? " in-place" : ""));
            const auto counts = uneven_blocks(n, base);
            std::vector<std::size_t> off(n + 1, 0);
            for (int r = 0; r < n; ++r) off[r + 1] = off[r] + counts[r];
            const std::size_t esz = dtype_size(dt), total = off[n];
            std::vector<std::vector<std::byte>> in(n, std::vector<std::byte>(total * esz)), out(n);
            for (int r = 0; r < n; ++r) {
              for (std::size_t i = 0; i < total; ++i) test::store(dt, in[r].data(), i, test::contribution(op, r, i));
              out[r].assign(counts[r] * esz, std::byte{0x5a});
            }
            run_local_world(n, [&](transport::Transport& t) {
              const int r = t.rank();
              void* dst = in_place ? static_cast<void*>(in[r].data() + off[r] * esz) : out[r].data();
              ring_reduce_scatter(t, in[r].data(), dst, counts, dt, op);
            }, kTimeout);
            const double tol = op == ReduceOp::kAverage ? test::scaled_tolerance(dt) : 0.0;
            std::size_t wrong = 0;
            for (int r = 0; r < n; ++r) {
              const std::byte* res = in_place ? in[r].data() + off[r] * esz : out[r].data();
              for (std::size_t i = 0; i < counts[r]; ++i) {
                const double want = test::expected(dt, op, n, off[r] + i);
                wrong += !test::close_enough(test::load(dt, res, i), want, tol);
              }
            }
            CHECK(wrong == 0);
          }
        }
      }
    }
  }
}

TEST_CASE("ring_reduce_scatter and ring_allreduce agree with prescale/postscale", "[reduce_scatter]") {
  const int n = 3;
  const std::vector<std::size_t> counts = {100, 101, 99};
  std::vector<std::vector<float>> in(n, std::vector<float>(300)), out(n, std::vector<float>(101));
  for (int r = 0; r < n; ++r) {
    for (std::size_t i = 0; i < 300; ++i) in[r][i] = static_cast<float>(test::contribution(ReduceOp::kSum, r, i));
  }
  run_local_world(n, [&](transport::Transport& t) {
    ReduceScatterOptions opt;
    opt.prescale = 2.0;
    opt.postscale = 0.5;
    opt.chunk_bytes = 64;
    ring_reduce_scatter(t, in[t.rank()].data(), out[t.rank()].data(), counts, DataType::kFloat32,
                        ReduceOp::kAverage, opt);
  }, kTimeout);
  std::size_t wrong = 0, pos = 0;
  for (int r = 0; r < n; ++r) {
    for (std::size_t i = 0; i < counts[r]; ++i) {
      wrong += !test::close_enough(out[r][i], test::expected(ReduceOp::kAverage, n, pos + i), 1e-6);
    }
    pos += counts[r];
  }
  CHECK(wrong == 0);
}

TEST_CASE("alltoall: per-pair sizes including empty ones", "[alltoall]") {
  for (int n = 1; n <= 8; ++n) {
    for (std::size_t k : {0, 1, 777}) {
      INFO("n " << n << " k " << k);
      // Rank r sends ((r + 2p) % 5) * k bytes to p, byte i being f(r, p, i).
      auto size = [&](int from, int to) { return static_cast<std::size_t>((from + 2 * to) % 5) * k; };
      auto value = [](int from, int to, std::size_t i) {
        return static_cast<std::byte>((from * 71 + to * 13 + i) & 0xff);
      };
      std::vector<std::vector<std::byte>> out(n);
      run_local_world(n, [&](transport::Transport& t) {
        const int r = t.rank();
        std::vector<std::size_t> send(n), recv(n);
        std::vector<std::byte> in;
        for (int p = 0; p < n; ++p) {
          send[p] = size(r, p);
          recv[p] = size(p, r);
          for (std::size_t i = 0; i < send[p]; ++i) in.push_back(value(r, p, i));
        }
        out[r].assign(std::accumulate(recv.begin(), recv.end(), std::size_t{0}), std::byte{0xee});
        alltoall(t, in.data(), send, out[r].data(), recv);
      }, kTimeout);
      std::size_t wrong = 0;
      for (int r = 0; r < n; ++r) {
        std::size_t pos = 0;
        for (int p = 0; p < n; ++p) {
          for (std::size_t i = 0; i < size(p, r); ++i) wrong += out[r][pos++] != value(p, r, i);
        }
        wrong += pos != out[r].size();
      }
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE("barrier: no rank leaves before every rank has arrived", "[barrier]") {
  for (int n = 1; n <= 8; ++n) {
    for (int round = 0; round < 20; ++round) {
      std::atomic<int> arrived{0};
      std::atomic<int> early{0};
      run_local_world(n, [&](transport::Transport& t) {
        // Stagger arrivals: later ranks spend longer before arriving.
        for (int i = 0; i < t.rank() * 50; ++i) std::this_thread::yield();
        ++arrived;
        barrier(t);
        if (arrived.load() != t.size()) ++early;
      }, kTimeout);
      CHECK(early == 0);
    }
  }
}
