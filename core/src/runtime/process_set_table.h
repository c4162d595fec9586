// ProcessSetTable: the process sets (Horovod's) this process knows, by id,
// each with its ranks and, on its members, the Runtime that serves it.
//
// A process set is a sorted list of world ranks with a runtime of its own:
// its own transport (an MPI communicator of its members), queue, negotiator
// (coordinator, response cache, per-name sequence numbers: names are scoped
// by set), fusion and backends, and its own background thread, so that
// collectives on different sets never wait for each other. Id 0, the global
// set, is the world runtime and is not in the table.
//
// Two kinds of set (api/process_sets.cc). A set of the job is added and
// removed by calls that every rank makes in the same order, agreed over the
// world runtime first: every rank holds it (ranks outside with no runtime).
// A set of its members (torch's new_group on some ranks only) is made and
// removed by its members alone: only they hold it. Either way the ranks that
// hold a set agree on its id, the largest of their next_id() proposals, so
// ids stay the same wherever a set is known. Ids are never reused within a
// process.
//
// Threads: any user thread; mu_ guards everything.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace gyre::core {

class Runtime;

struct ProcessSetEntry {
  int id = 0;
  std::vector<int> ranks;            // world ranks, sorted
  std::shared_ptr<Runtime> runtime;  // null on ranks outside the set
  bool members_only = false;         // made and removed by its members alone
};

class ProcessSetTable {
 public:
  // The runtime of set `id` for a call of `call` by world rank `rank`.
  // Throws InvalidArgument naming the call when no set has that id or this
  // rank is not in it, StateError when a rebuild dropped the set.
  std::shared_ptr<Runtime> runtime_of(const char* call, int id, int rank) const;
  std::optional<ProcessSetEntry> find(int id) const;
  // The id of a registered set of the given kind with exactly these ranks.
  std::optional<int> find_ranks(const std::vector<int>& ranks, bool members_only = false) const;
  std::vector<int> ids() const;
  int next_id() const;
  // Registers a set under `id` (agreed: at least next_id(), which then
  // passes it); returns `id`.
  int insert(int id, std::vector<int> ranks, std::shared_ptr<Runtime> runtime,
             bool members_only = false);
  // Removes set `id`; returns its runtime (null on non-members) for the
  // caller to shut down outside the lock.
  std::shared_ptr<Runtime> erase(int id);
  // Removes every set (shutdown); returns their runtimes. Ids start at 1
  // again.
  std::vector<std::shared_ptr<Runtime>> clear();
  // Removes every set for a rebuild (their communicators hold the old
  // world's ranks); returns their runtimes. Their ids stay known as
  // dropped: a later call on one gets dropped_error().
  std::vector<std::shared_ptr<Runtime>> drop_for_rebuild();
  // The error for a call of `call` on set `id` if a rebuild dropped it:
  // a message naming the set and the rebuild; empty otherwise.
  std::string dropped_error(const char* call, int id) const;

 private:
  std::string dropped_error_locked(const char* call, int id) const;

  mutable std::mutex mu_;  // guards sets_, dropped_ and next_id_
  std::map<int, ProcessSetEntry> sets_;
  std::map<int, std::vector<int>> dropped_;  // id -> its ranks in the world before the rebuild
  int next_id_ = 1;
};

}  // namespace gyre::core
