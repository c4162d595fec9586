// MpiWorld::make_members_transport: a communicator of some ranks made by
// those ranks alone, with a bounded agreement first.
//
// MPI_Comm_create_group is collective over the new group's members only,
// and waits for ever for a member that never calls it or calls it for other
// ranks. So the members agree first, point to point over the world
// communicator: every member sends its proposal (its ranks and the id it
// proposes) to the lowest rank of the set,
// the leader, which collects them until every member has answered or its
// deadline has passed, and answers every member that did with one verdict:
// go (with the largest proposed id), or fail (who never came, or who asked
// for other ranks). Only after "go" does anyone call MPI_Comm_create_group,
// and then every member is known to call it next.
//
// Messages in flight from a failed call: a member that gives up waiting
// sends the leader a withdrawal after its proposal (messages between two
// ranks with one tag arrive in order, so the leader reads the proposal and
// then the withdrawal, and counts the member absent); a verdict carries the
// number of the proposal it answers, so a member never takes an old verdict
// for its current call.
//
// The one window left: a member gives up waiting for the verdict (its own
// bound) just as the leader says go. The leader then waits in
// MPI_Comm_create_group for a member that has left; a watchdog ends the job
// with a message after the same bound again instead of hanging.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "gyre/collectives/cores.h"
#include "gyre/collectives/mpi_transport.h"
#include "gyre/error.h"
#include "mpi_comm.h"

namespace gyre::transport {

namespace {

constexpr int kProposalTag = 0x6d31;
constexpr int kVerdictTag = 0x6d32;
enum Kind : std::int64_t { kPropose = 0, kWithdraw = 1 };
enum Verdict : std::int64_t { kGo = 0, kMissing = 1, kOtherRanks = 2 };

using Clock = std::chrono::steady_clock;

// This process's proposals, numbered (only the API thread makes sets, under
// gyre's API lock; atomic for a direct caller).
std::atomic<std::int64_t> g_proposals{0};

// Receives the message `source` sent with `tag` if one has arrived
// (matched probe, so a message of any length); nullopt otherwise.
std::optional<std::vector<std::int64_t>> try_receive(MPI_Comm comm, int source, int tag) {
  int flag = 0;
  MPI_Message msg;
  MPI_Status st;
  detail::check_mpi(MPI_Improbe(source, tag, comm, &flag, &msg, &st), "MPI_Improbe");
  if (!flag) return std::nullopt;
  int count = 0;
  MPI_Get_count(&st, MPI_INT64_T, &count);
  std::vector<std::int64_t> m(static_cast<std::size_t>(std::max(count, 0)));
  detail::check_mpi(MPI_Mrecv(m.data(), count, MPI_INT64_T, &msg, MPI_STATUS_IGNORE),
                    "MPI_Mrecv");
  return m;
}

void send(MPI_Comm comm, const std::vector<std::int64_t>& m, int dest, int tag) {
  // Small messages: sent eagerly, so this does not wait for the receiver.
  detail::check_mpi(MPI_Send(m.data(), static_cast<int>(m.size()), MPI_INT64_T, dest, tag, comm),
                    "MPI_Send");
}

void pause_briefly() { std::this_thread::sleep_for(std::chrono::microseconds(200)); }

std::string missing_error(const std::vector<int>& ranks, const std::string& who, double timeout_s) {
  return fmt::format(
      "making the process set of ranks [{}] on its members: rank(s) {} did not make it within "
      "{} s (ranks outside a set do not call this; every member must)",
      fmt::join(ranks, ", "), who, timeout_s);
}

// A member's proposal as the leader last read it.
struct Proposal {
  std::int64_t number = 0;
  std::int64_t id = 0;
  std::vector<int> ranks;
};

// The leader's side: collects the other members' proposals; answers them;
// returns the agreed id or throws.
std::int64_t lead(MPI_Comm comm, const std::vector<int>& ranks, std::int64_t id,
                  Clock::time_point deadline, double timeout_s) {
  std::map<int, Proposal> present;  // member -> its standing proposal
  auto all_present = [&] { return present.size() + 1 == ranks.size(); };
  // Reads every message that has arrived (withdrawals cancel proposals).
  auto read = [&] {
    bool got = false;
    for (std::size_t i = 1; i < ranks.size(); ++i) {
      const int r = ranks[i];
      while (auto m = try_receive(comm, r, kProposalTag)) {
        got = true;
        if (m->size() < 3) continue;
        if ((*m)[0] == kWithdraw) {
          present.erase(r);
        } else {
          present[r] = Proposal{(*m)[1], (*m)[2], std::vector<int>(m->begin() + 3, m->end())};
        }
      }
    }
    return got;
  };
  while (true) {
    const bool got = read();
    if (all_present() || Clock::now() >= deadline) break;
    if (!got) pause_briefly();
  }
  std::int64_t agreed = id;
  std::vector<int> missing;
  std::vector<std::string> others;
  std::vector<std::int64_t> who;
  for (std::size_t i = 1; i < ranks.size(); ++i) {
    const int r = ranks[i];
    auto it = present.find(r);
    if (it == present.end()) {
      missing.push_back(r);
    } else if (it->second.ranks != ranks) {
      others.push_back(
          fmt::format("rank {} asked for ranks [{}]", r, fmt::join(it->second.ranks, ", ")));
      who.push_back(r);
    } else {
      agreed = std::max(agreed, it->second.id);
    }
  }
  Verdict verdict = kGo;
  std::string error;
  if (!others.empty()) {
    verdict = kOtherRanks;
    error = fmt::format(
        "making the process set of ranks [{}] on its members: {} (the members must make the "
        "same sets in the same order)",
        fmt::join(ranks, ", "), fmt::join(others, "; "));
  } else if (!missing.empty()) {
    verdict = kMissing;
    who.assign(missing.begin(), missing.end());
    error = missing_error(ranks, fmt::format("{}", fmt::join(missing, ", ")), timeout_s);
  }
  for (const auto& [r, p] : present) {
    std::vector<std::int64_t> v{verdict, p.number, agreed};
    v.insert(v.end(), who.begin(), who.end());
    send(comm, v, r, kVerdictTag);
  }
  if (verdict == kOtherRanks) throw InvalidArgument(error);
  if (verdict == kMissing) throw TimeoutError(error);
  return agreed;
}

// A member's side: proposes to the leader, waits for its verdict; on giving
// up, withdraws the proposal.
std::int64_t follow(MPI_Comm comm, const std::vector<int>& ranks, std::int64_t id,
                    Clock::time_point deadline, double timeout_s) {
  const int leader = ranks.front();
  const std::int64_t number = ++g_proposals;
  std::vector<std::int64_t> m{kPropose, number, id};
  m.insert(m.end(), ranks.begin(), ranks.end());
  send(comm, m, leader, kProposalTag);
  while (true) {
    auto v = try_receive(comm, leader, kVerdictTag);
    if (v && v->size() >= 3 && (*v)[1] == number) {
      const std::vector<std::int64_t> who(v->begin() + 3, v->end());
      if ((*v)[0] == kGo) return (*v)[2];
      if ((*v)[0] == kMissing) {
        throw TimeoutError(missing_error(ranks, fmt::format("{}", fmt::join(who, ", ")),
                                         timeout_s));
      }
      throw InvalidArgument(fmt::format(
          "making the process set of ranks [{}] on its members: rank(s) {} asked for other "
          "ranks (the members must make the same sets in the same order)",
          fmt::join(ranks, ", "), fmt::join(who, ", ")));
    }
    if (v) continue;  // an answer to an earlier, abandoned proposal
    if (Clock::now() >= deadline) {
      send(comm, {kWithdraw, number, id}, leader, kProposalTag);
      throw TimeoutError(fmt::format(
          "making the process set of ranks [{}] on its members: rank {} (its lowest rank, which "
          "collects the members) did not answer within {} s",
          fmt::join(ranks, ", "), leader, timeout_s));
    }
    pause_briefly();
  }
}

// Runs `make` (which calls MPI_Comm_create_group), ending the job with a
// message should it not return within `bound` (a member that gave up after
// the leader said go).
std::unique_ptr<Transport> watched(const std::vector<int>& ranks,
                                   std::chrono::duration<double> bound,
                                   const std::function<std::unique_ptr<Transport>()>& make) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> lock(mu);
    if (cv.wait_for(lock, bound, [&] { return done; })) return;
    std::fprintf(stderr,
                 "gyre: making the process set of ranks [%s] did not finish within %.0f s after "
                 "its members agreed (a member gave up waiting): ending the job\n",
                 fmt::format("{}", fmt::join(ranks, ", ")).c_str(), bound.count());
    MpiWorld::instance().abort(1);
  });
  auto finish = [&] {
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
    }
    cv.notify_all();
    watchdog.join();
  };
  std::unique_ptr<Transport> t;
  try {
    t = make();
  } catch (...) {
    finish();
    throw;
  }
  finish();
  return t;
}

}  // namespace

std::unique_ptr<Transport> MpiWorld::make_members_transport(const std::vector<int>& ranks,
                                                            int& id, double timeout_s) {
  if (finalized_) throw StateError("MpiWorld::make_members_transport after finalize()");
  if (ranks.empty() || !std::binary_search(ranks.begin(), ranks.end(), rank_)) {
    throw InvalidArgument(fmt::format(
        "making a process set on its members: this rank ({}) is not among ranks [{}]; ranks "
        "outside the set do not call it", rank_,
        fmt::join(ranks, ", ")));
  }
  if (!(timeout_s > 0)) timeout_s = 300;
  const MPI_Comm world = detail::world_comm();
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(timeout_s));
  std::int64_t agreed = id;
  if (ranks.size() > 1) {
    agreed = rank_ == ranks.front() ? lead(world, ranks, id, deadline, timeout_s)
                                    : follow(world, ranks, id, deadline, timeout_s);
  }
  id = static_cast<int>(agreed);
  // The tag keeps this creation apart from a concurrent one on the same
  // parent; the members agreed on the id, so it is the same on all of them.
  return watched(ranks, std::chrono::duration<double>(timeout_s),
                 [&] { return make_group_transport(ranks, 0x4000 + (id & 0x3fff)); });
}

}  // namespace gyre::transport
