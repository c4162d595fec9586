// A transport failure in the middle of a collective (after agreement): the
// operations of that round, and those queued behind them, complete with the
// error on every rank instead of being dropped, so no wait() hangs.
#include <catch2/catch.hpp>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "gyre/collectives/local_transport.h"
#include "local_job.h"

namespace gyre::test {
namespace {

// A LocalTransport whose first data transfer (larger than any negotiation
// message here) fails, as a dead peer's would: it throws TransportError and
// marks the world failed, so that the other ranks' waits fail too.
class FailingTransport final : public transport::Transport {
 public:
  FailingTransport(std::shared_ptr<transport::LocalWorld> world, int rank, bool fail)
      : world_(world), inner_(world, rank), fail_(fail) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string name() const override { return "failing-local"; }
  transport::Transfer isend(int peer, int tag, std::span<const std::byte> d) override {
    maybe_fail(d.size());
    return inner_.isend(peer, tag, d);
  }
  transport::Transfer irecv(int peer, int tag, std::span<std::byte> d) override {
    maybe_fail(d.size());
    return inner_.irecv(peer, tag, d);
  }
  transport::Transfer isend_message(int peer, int tag, std::span<const std::byte> d) override {
    maybe_fail(d.size());
    return inner_.isend_message(peer, tag, d);
  }
  transport::Transfer irecv_message(int peer, int tag, std::span<std::byte> room,
                                    std::size_t* received) override {
    return inner_.irecv_message(peer, tag, room, received);
  }
  bool test(transport::Transfer& t) override { return inner_.test(t); }
  void wait(transport::Transfer& t) override {
    inner_.set_timeout(timeout());
    inner_.wait(t);
  }

 private:
  void maybe_fail(std::size_t bytes) {
    if (!fail_ || bytes < 4096) return;
    transport::fail_local_world(*world_, inner_.rank());
    throw TransportError("injected: the peer of this transfer failed");
  }
  std::shared_ptr<transport::LocalWorld> world_;
  transport::LocalTransport inner_;
  bool fail_;
};

}  // namespace

TEST_CASE("local: a transport failure inside a collective fails its handles on every rank",
          "[runtime][errors]") {
  const int n = 3;
  auto world = transport::make_local_world(n);
  std::vector<std::string> big_errors(n), small_errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      Options o = fast_options();
      o.op_timeout_s = 20;
      core::RuntimeInfo info;
      info.abort = [](int) {};  // in-process: the runtime fails its handles instead
      core::Runtime rt(o, std::make_unique<FailingTransport>(world, r, r == 1), info);
      std::vector<float> big(1 << 16, 1.0f), small(4, 1.0f);
      // Both in one round: the small one (fused) and the big one (in place).
      Handle hb = core::allreduce_async(rt, "big", view(big), view(big), ReduceOp::kSum);
      Handle hs = core::allreduce_async(rt, "small", view(small), view(small), ReduceOp::kSum);
      for (auto [h, out] : {std::pair{hb, &big_errors}, std::pair{hs, &small_errors}}) {
        try {
          wait_for(h, 10.0);  // before the fix: never completed
          (*out)[r] = "completed";
        } catch (const TransportError& e) {
          (*out)[r] = e.what();
        } catch (const std::exception& e) {
          (*out)[r] = std::string("other: ") + e.what();
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": big: " << big_errors[r] << " / small: " << small_errors[r]);
    CHECK(big_errors[r] != "completed");
    CHECK(big_errors[r].rfind("other: ", 0) != 0);
    CHECK(small_errors[r].rfind("other: ", 0) != 0);
  }
  CHECK(big_errors[1].find("injected") != std::string::npos);
}

}  // namespace gyre::test
