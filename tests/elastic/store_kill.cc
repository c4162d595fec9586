// The parameter store (gyre/store.h) when a member dies during a push, under
// an MPI with ULFM and `mpirun --with-ft ulfm` (3 ranks; run_elastic.sh
// counts the survivors' PASS lines).
//
// Every rank owns one tensor of kCount int64 (t0 on rank 0, t1 on rank 1,
// t2 on rank 2: placement by bytes) and pushes +1 to every element of each
// of the three in turn, policy "apply", 4 MiB per request: the owners
// receive the pushes of two ranks at once. Rank GYRE_TEST_KILL_RANK
// (default 2) SIGKILLs itself GYRE_TEST_KILL_AFTER_US (default 3000) after
// its third round has begun, from a thread of its own, while its main
// thread is in a push: most likely with a 4 MiB request half transferred.
//
// Each survivor must then:
//  - get an error naming the dead rank as failed within the store's
//    deadline (the failing call returns in less than timeout_s), and the
//    same from a call to the other survivor's tensor: a dead member ends the
//    store on every member, and the errors say which member died, not the
//    live owner a request happened to go to;
//  - find its own shard whole: every element equal to the shard's version
//    (each applied push adds 1 everywhere and 1 to the version), so a
//    request cut short by the death was applied in full or not at all;
//  - have check_members() raise RankFailedError within 10 s (reads of its
//    own shard go on; this is how a loop reading only those learns of it).
// Then the survivors drop the store, rebuild the world (the old runtime's
// communicators kept, not freed; MpiWorld::retire_communicators) and shut
// gyre down (an exit without a crash, the new communicators freed), and
// print "elastic: rank N PASS".
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "gyre/collectives/mpi_transport.h"
#include "gyre/gyre.h"
#include "gyre/store.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::int64_t kCount = std::int64_t{1} << 19;  // 4 MiB of int64: a rendezvous send
constexpr int kRounds = 2000;                            // far more than any run needs
constexpr double kTimeoutS = 20;

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoi(v) : fallback;
}

[[noreturn]] void fail(int me, const std::string& what) {
  std::fprintf(stderr, "elastic: rank %d FAIL: %s\n", me, what.c_str());
  std::fflush(stderr);
  std::exit(1);
}

gyre::TensorView view(std::vector<std::int64_t>& v) {
  return gyre::TensorView{v.data(), gyre::DataType::kInt64, {static_cast<std::int64_t>(v.size())}};
}

// Runs `call`, which must fail within the store's deadline with an error
// that says rank `dead` failed (RankFailedError, or TimeoutError naming it).
// Returns false (and `call` did its work) when it succeeds and
// `may_succeed`; the error's text in `text` otherwise.
template <typename F>
bool fails_naming(int me, int dead, const std::string& what, bool may_succeed, std::string& text,
                  F&& call) {
  const auto start = Clock::now();
  try {
    call();
    if (may_succeed) return false;
    fail(me, what + " succeeded after rank " + std::to_string(dead) + " died");
  } catch (const gyre::RankFailedError& e) {
    text = e.what();
  } catch (const gyre::TimeoutError& e) {
    text = e.what();
  } catch (const std::exception& e) {
    fail(me, what + ": not RankFailedError nor TimeoutError: " + e.what());
  }
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  if (took >= kTimeoutS) {
    fail(me, fmt::format("{}: the error came after {:.1f} s, the deadline is {} s", what, took,
                         kTimeoutS));
  }
  if (text.find(fmt::format("rank {} failed", dead)) == std::string::npos) {
    fail(me, what + ": the error does not name rank " + std::to_string(dead) +
                 " as failed: " + text);
  }
  return true;
}

}  // namespace

int main() {
  gyre::init(gyre::Options::from_env());
  const int me = gyre::rank();
  const int n = gyre::size();
  const int dead = env_int("GYRE_TEST_KILL_RANK", 2);
  const int kill_after_us = env_int("GYRE_TEST_KILL_AFTER_US", 3000);
  if (!gyre::elastic_enabled()) fail(me, "needs a ULFM build run with mpirun --with-ft ulfm");
  if (n != 3 || dead < 0 || dead >= n) fail(me, "runs on 3 ranks, GYRE_TEST_KILL_RANK in 0..2");

  gyre::StoreOptions opt;
  opt.timeout_s = kTimeoutS;
  opt.split_bytes = std::size_t{64} << 20;  // every tensor one shard
  auto store = std::make_unique<gyre::ParameterStore>(gyre::kGlobalProcessSet, opt);
  std::vector<std::int64_t> zeros(kCount, 0), ones(kCount, 1), got(kCount);
  std::vector<std::string> names;
  for (int r = 0; r < n; ++r) {
    names.push_back("t" + std::to_string(r));
    store->register_tensor(names.back(), view(zeros));
    if (store->shard_owners(names.back()) != std::vector<int>{r}) {
      fail(me, names.back() + " is not owned by rank " + std::to_string(r) + " alone");
    }
  }
  gyre::barrier();

  std::thread killer;
  std::string first_error;
  int failed_on = -1;  // the owner whose tensor the first failing call was for
  for (int round = 0; round < kRounds && failed_on < 0; ++round) {
    if (me == dead && round == 2) {
      killer = std::thread([me, kill_after_us] {
        // Fault injection at a chosen moment, not a wait for a result.
        std::this_thread::sleep_for(std::chrono::microseconds(kill_after_us));
        std::fprintf(stderr, "elastic: rank %d killed during a push\n", me);
        std::fflush(stderr);
        std::raise(SIGKILL);
      });
    }
    for (int k = 0; k < n; ++k) {
      const int owner = (me + 1 + k) % n;  // the others' tensors first
      const std::string what = fmt::format("push to {} (round {})", names[owner], round);
      if (me == dead) {
        store->push(names[owner], view(ones), {0}, -1, gyre::PushPolicy::kApply);
        continue;
      }
      if (fails_naming(me, dead, what, true, first_error, [&] {
            store->push(names[owner], view(ones), {0}, -1, gyre::PushPolicy::kApply);
          })) {
        failed_on = owner;
        break;
      }
    }
  }
  if (me == dead) fail(me, "was not killed");
  if (failed_on < 0) fail(me, "no call failed after rank " + std::to_string(dead) + " died");

  // The other survivor's tensor: its owner is alive, and the error must
  // still name the dead rank, not it.
  const int other = 3 - me - dead;
  std::string other_error;
  fails_naming(me, dead, "pull of " + names[other], false, other_error,
               [&] { store->pull(names[other], view(got)); });

  // This rank's own shard: values and version changed together.
  const std::vector<std::int64_t> version = store->pull(names[me], view(got));
  if (version.size() != 1 || version[0] < 1) fail(me, "own shard at version < 1");
  for (std::int64_t i = 0; i < kCount; ++i) {
    if (got[static_cast<std::size_t>(i)] != version[0]) {
      fail(me, fmt::format("{} element {} is {} at version {}: an update half applied",
                           names[me], i, got[static_cast<std::size_t>(i)], version[0]));
    }
  }
  // The own shard's reads go on; check_members() says a member died, so
  // that a loop reading only its own shards learns of it (this rank's
  // server sees the death by itself, within the deadline).
  std::string members_error;
  const auto asked = Clock::now();
  while (members_error.empty()) {
    try {
      store->check_members();
    } catch (const gyre::RankFailedError& e) {
      members_error = e.what();
      break;
    }
    if (std::chrono::duration<double>(Clock::now() - asked).count() > 10) {
      fail(me, "check_members() did not report the death within 10 s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::fprintf(stderr, "elastic: rank %d: check_members(): %.300s\n", me, members_error.c_str());
  std::fprintf(stderr, "elastic: rank %d: first error (call to rank %d's tensor): %.300s\n", me,
               failed_on, first_error.c_str());
  std::fprintf(stderr, "elastic: rank %d: call to rank %d's tensor: %.300s\n", me, other,
               other_error.c_str());

  store.reset();  // not collective: its communicator stays until MPI ends
  const gyre::RebuildInfo info = gyre::rebuild();
  if (info.size != 2 || info.lost != std::vector<int>{dead}) fail(me, "rebuild lost other ranks");
  // The old runtime's communicators were kept, not freed: a new one taking
  // a freed one's context id could be handed that one's late messages (the
  // rebuild's MPI_Allreduce was seen waiting for ever; MpiWorld::
  // retire_communicators). Those made after the rebuild are freed.
  using gyre::transport::MpiWorld;
  const std::size_t kept = MpiWorld::kept_communicators();
  if (kept == 0) fail(me, "the old runtime's communicators were freed after the failure");
  gyre::shutdown();
  if (MpiWorld::kept_communicators() != kept) {
    fail(me, fmt::format("shutdown kept {} communicator(s) made after the rebuild",
                         MpiWorld::kept_communicators() - kept));
  }
  std::printf("elastic: rank %d PASS: %s whole at version %lld after rank %d died in a push\n", me,
              names[me].c_str(), static_cast<long long>(version[0]), dead);
  std::fflush(stdout);
  return 0;
}
