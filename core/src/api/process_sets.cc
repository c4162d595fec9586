// add_process_set / remove_process_set: agreement over the world runtime,
// then the set's communicator and runtime on its members.
#include "api/process_sets.h"

#include <algorithm>
#include <cstdint>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "api/operations.h"
#include "gyre/collectives/mpi_transport.h"

namespace gyre::core {

namespace {

enum Proposal : std::int64_t { kRefused = -1, kAdd = 1, kRemove = 2 };

// MPI_Comm_create_group's tag: the calls are serialised by the agreement,
// so one tag would do; the id keeps them apart in traces.
int group_tag(int id) { return 1000 + (id & 0x3fff); }

std::string describe(const std::int64_t* row, int n) {
  if (row[0] == kRefused) return "refused its arguments (see the error on that rank)";
  if (row[0] == kRemove) return fmt::format("removes process set {}", row[1]);
  std::vector<int> ranks;
  for (int r = 0; r < n; ++r) {
    if (row[2 + r] != 0) ranks.push_back(r);
  }
  return fmt::format("adds ranks [{}]", fmt::join(ranks, ", "));
}

// Allgathers every rank's proposal [kind, id, membership of each rank] over
// the world runtime and throws InvalidArgument on every rank when they are
// not all the same, or any rank refused its own arguments (that rank throws
// its own reason). For an add, `id` is this rank's proposal for the new
// set's id and may differ between ranks (a set of its members alone took
// ids on some ranks only): the largest is returned, the same everywhere.
std::int64_t agree(Runtime& world, const char* call, Proposal kind, std::int64_t id,
           const std::vector<int>& ranks, const std::string& local_error) {
  const int n = world.size();
  const std::size_t words = static_cast<std::size_t>(n) + 2;
  std::vector<std::int64_t> mine(words, 0);
  mine[0] = local_error.empty() ? kind : kRefused;
  mine[1] = id;
  if (local_error.empty()) {
    for (int r : ranks) mine[2 + static_cast<std::size_t>(r)] = 1;
  }
  Request req;
  req.name = world.internal_name("process_set");
  req.collective = Collective::kAllgather;
  req.dtype = DataType::kInt64;
  req.shape = {static_cast<std::int64_t>(words)};
  req.step = world.versions().own();
  TensorView view;
  view.data = mine.data();
  view.dtype = DataType::kInt64;
  view.shape = req.shape;
  Handle h = submit(world, std::move(req), view, view);
  h.wait();
  if (!local_error.empty()) throw InvalidArgument(local_error);
  // The column compared: all of a row but an add's proposed id.
  auto same = [&](const std::int64_t* a, const std::int64_t* b) {
    return a[0] == b[0] && (kind == kAdd || a[1] == b[1]) &&
           std::equal(a + 2, a + words, b + 2);
  };

  const auto* all = reinterpret_cast<const std::int64_t*>(h.output().data.data());
  if (h.output().data.size() != words * static_cast<std::size_t>(n) * sizeof(std::int64_t)) {
    throw InvalidArgument(fmt::format("{}: unexpected agreement size", call));
  }
  std::vector<std::string> lines;
  bool differ = false;
  std::int64_t largest = id;
  for (int r = 0; r < n; ++r) {
    const std::int64_t* row = all + static_cast<std::size_t>(r) * words;
    if (row[0] == kRefused || !same(row, all)) differ = true;
    largest = std::max(largest, row[1]);
  }
  if (!differ) return largest;
  for (int r = 0; r < n; ++r) {
    const std::int64_t* row = all + static_cast<std::size_t>(r) * words;
    lines.push_back(fmt::format("rank {} {}", r, describe(row, n)));
  }
  throw InvalidArgument(fmt::format(
      "{}: the ranks do not make the same call (every rank must add and remove the same "
      "process sets in the same order): {}",
      call, fmt::join(lines, "; ")));
}

// Why `ranks` (sorted) cannot make a set of a job of `n` ranks; empty if
// they can.
std::string check_ranks(const char* call, const std::vector<int>& ranks, int n) {
  if (ranks.empty()) return fmt::format("{}: the set has no ranks", call);
  if (ranks.front() < 0 || ranks.back() >= n) {
    return fmt::format("{}: ranks [{}] are not all ranks of this job (0 to {})", call,
                       fmt::join(ranks, ", "), n - 1);
  }
  if (std::adjacent_find(ranks.begin(), ranks.end()) != ranks.end()) {
    return fmt::format("{}: ranks [{}] repeat a rank", call, fmt::join(ranks, ", "));
  }
  if (!transport::MpiWorld::instance().thread_multiple()) {
    return fmt::format(
        "{}: process sets need MPI at MPI_THREAD_MULTIPLE (each set's background thread calls "
        "MPI beside the global one); this MPI offers less", call);
  }
  return {};
}

std::string every_rank_error(const std::vector<int>& ranks) {
  return fmt::format(
      "add_process_set: ranks [{}] are every rank: that is the global process set (id 0)",
      fmt::join(ranks, ", "));
}

// The runtime of set `id` over `t`, with the world's options.
std::shared_ptr<Runtime> set_runtime(Runtime& world, std::unique_ptr<transport::Transport> t,
                                     int id) {
  Options opt = world.options();
  opt.timeline_path.clear();  // the world runtime owns the timeline file
  RuntimeInfo info;
  info.local_rank = world.local_rank();
  info.process_set = id;
  info.abort = [](int code) { transport::MpiWorld::instance().abort(code); };
  return std::make_shared<Runtime>(opt, std::move(t), std::move(info));
}

}  // namespace

int add_process_set(Runtime& world, ProcessSetTable& table, std::vector<int> ranks) {
  const int n = world.size();
  std::sort(ranks.begin(), ranks.end());
  std::string error = check_ranks("add_process_set", ranks, n);
  const std::int64_t id =
      agree(world, "add_process_set", kAdd, table.next_id(), ranks, error);
  if (static_cast<int>(ranks.size()) == n) throw InvalidArgument(every_rank_error(ranks));
  if (auto existing = table.find_ranks(ranks)) {
    throw InvalidArgument(fmt::format(
        "add_process_set: ranks [{}] are already process set {}", fmt::join(ranks, ", "),
        *existing));
  }
  std::shared_ptr<Runtime> rt;
  auto& mpi = transport::MpiWorld::instance();
  if (auto t = mpi.make_group_transport(ranks, group_tag(static_cast<int>(id)))) {
    rt = set_runtime(world, std::move(t), static_cast<int>(id));
  }
  return table.insert(static_cast<int>(id), std::move(ranks), std::move(rt));
}

int add_process_set_of_members(Runtime& world, ProcessSetTable& table, std::vector<int> ranks,
                               double timeout_s) {
  const int n = world.size();
  std::sort(ranks.begin(), ranks.end());
  // Checked here alone: a member with bad arguments never reaches the
  // agreement, and the others fail it (TimeoutError naming this rank).
  if (std::string error = check_ranks("add_process_set", ranks, n); !error.empty()) {
    throw InvalidArgument(error);
  }
  if (static_cast<int>(ranks.size()) == n) throw InvalidArgument(every_rank_error(ranks));
  // (make_members_transport refuses a rank outside `ranks`.)
  int id = table.next_id();
  auto t = transport::MpiWorld::instance().make_members_transport(ranks, id, timeout_s);
  // (A members-only set with the same ranks may exist: like torch's groups,
  // two sets of the same ranks are two sets.)
  auto rt = set_runtime(world, std::move(t), id);
  return table.insert(id, std::move(ranks), std::move(rt), /*members_only=*/true);
}

void remove_process_set(Runtime& world, ProcessSetTable& table, int id) {
  std::string error;
  if (id == 0) {
    error = "remove_process_set: the global process set (id 0) cannot be removed";
  } else if (!table.find(id)) {
    error = table.dropped_error("remove_process_set", id);
    if (error.empty()) error = fmt::format("remove_process_set: no process set has id {}", id);
  }
  // The set's runtime stops first, before the agreement over the world:
  // its shutdown travels in the set's own next round and stops every
  // member's runtime there, failing their pending operations on the set.
  // A member still waiting for one (an operation this rank never made) is
  // thereby freed to make this call too; agreeing first would leave this
  // rank waiting for that member in the agreement while the member waited
  // for this rank on the set, for ever.
  if (error.empty()) {
    auto e = table.find(id);
    if (e && e->runtime) e->runtime->shutdown();
    if (e && e->members_only) {
      // Known to its members alone: no agreement over the world. The
      // shutdown above stops the set on every member in its next round.
      if (auto rt = table.erase(id)) rt->shutdown();
      return;
    }
  }
  agree(world, "remove_process_set", kRemove, id, {}, error);
  if (auto rt = table.erase(id)) rt->shutdown();  // stopped already: joins nothing
}

}  // namespace gyre::core
