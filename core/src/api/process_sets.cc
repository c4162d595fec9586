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
// its own reason).
void agree(Runtime& world, const char* call, Proposal kind, std::int64_t id,
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

  const auto* all = reinterpret_cast<const std::int64_t*>(h.output().data.data());
  if (h.output().data.size() != words * static_cast<std::size_t>(n) * sizeof(std::int64_t)) {
    throw InvalidArgument(fmt::format("{}: unexpected agreement size", call));
  }
  std::vector<std::string> lines;
  bool differ = false;
  for (int r = 0; r < n; ++r) {
    const std::int64_t* row = all + static_cast<std::size_t>(r) * words;
    if (row[0] == kRefused || !std::equal(row, row + words, all)) differ = true;
  }
  if (!differ) return;
  for (int r = 0; r < n; ++r) {
    const std::int64_t* row = all + static_cast<std::size_t>(r) * words;
    lines.push_back(fmt::format("rank {} {}", r, describe(row, n)));
  }
  throw InvalidArgument(fmt::format(
      "{}: the ranks do not make the same call (every rank must add and remove the same "
      "process sets in the same order): {}",
      call, fmt::join(lines, "; ")));
}

}  // namespace

int add_process_set(Runtime& world, ProcessSetTable& table, std::vector<int> ranks) {
  const int n = world.size();
  std::sort(ranks.begin(), ranks.end());
  std::string error;
  if (ranks.empty()) {
    error = "add_process_set: the set has no ranks";
  } else if (ranks.front() < 0 || ranks.back() >= n) {
    error = fmt::format("add_process_set: ranks [{}] are not all ranks of this job (0 to {})",
                        fmt::join(ranks, ", "), n - 1);
  } else if (std::adjacent_find(ranks.begin(), ranks.end()) != ranks.end()) {
    error = fmt::format("add_process_set: ranks [{}] repeat a rank", fmt::join(ranks, ", "));
  } else if (!transport::MpiWorld::instance().thread_multiple()) {
    error = "add_process_set: process sets need MPI at MPI_THREAD_MULTIPLE (each set's "
            "background thread calls MPI beside the global one); this MPI offers less";
  }
  agree(world, "add_process_set", kAdd, 0, ranks, error);
  if (static_cast<int>(ranks.size()) == n) {
    throw InvalidArgument(fmt::format(
        "add_process_set: ranks [{}] are every rank: that is the global process set (id 0)",
        fmt::join(ranks, ", ")));
  }
  if (auto existing = table.find_ranks(ranks)) {
    throw InvalidArgument(fmt::format(
        "add_process_set: ranks [{}] are already process set {}", fmt::join(ranks, ", "),
        *existing));
  }
  const int id = table.next_id();
  std::shared_ptr<Runtime> rt;
  auto& mpi = transport::MpiWorld::instance();
  if (auto t = mpi.make_group_transport(ranks, group_tag(id))) {
    Options opt = world.options();
    opt.timeline_path.clear();  // the world runtime owns the timeline file
    RuntimeInfo info;
    info.local_rank = world.local_rank();
    info.process_set = id;
    info.abort = [](int code) { transport::MpiWorld::instance().abort(code); };
    rt = std::make_shared<Runtime>(opt, std::move(t), std::move(info));
  }
  return table.insert(std::move(ranks), std::move(rt));
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
    if (auto e = table.find(id); e && e->runtime) e->runtime->shutdown();
  }
  agree(world, "remove_process_set", kRemove, id, {}, error);
  if (auto rt = table.erase(id)) rt->shutdown();  // stopped already: joins nothing
}

}  // namespace gyre::core
