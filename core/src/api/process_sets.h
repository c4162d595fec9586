// Adding and removing process sets (see runtime/process_set_table.h): calls
// that every rank of the job makes, with the same arguments and in the same
// order, on a user thread. Each first agrees over the world runtime (one
// allgather of every rank's proposal under an internal name), so that ranks
// calling with different arguments all fail with the same InvalidArgument
// naming what each passed, instead of building different tables or
// waiting in a communicator set-up that some ranks never join.
#pragma once

#include <vector>

#include "runtime/process_set_table.h"
#include "runtime/runtime.h"

namespace gyre::core {

// Registers the set of world `ranks` (any order; sorted here) and returns
// its id. Its members build its communicator and runtime. InvalidArgument
// on every rank: empty, out of range or repeated ranks, a set already
// registered (the global one included), ranks passing different sets; also
// when MPI does not run at MPI_THREAD_MULTIPLE (a set's background thread
// calls MPI beside the world's).
int add_process_set(Runtime& world, ProcessSetTable& table, std::vector<int> ranks);
// Registers the set of world `ranks` on its members alone (ranks outside
// never call it; torch's new_group on a subgroup's members): the members
// agree point to point first, bounded by `timeout_s` (<= 0: 300 s), so a
// member that never calls, or calls for other ranks, fails the call on every
// member that did. Returns the id the members agreed. InvalidArgument here
// alone for bad ranks, this rank not among them, or every rank.
int add_process_set_of_members(Runtime& world, ProcessSetTable& table, std::vector<int> ranks,
                               double timeout_s);
// Removes set `id` (a set of its members: on its members alone, with no
// agreement over the world): its runtime stops on its members (pending operations
// fail with StateError), on all of them as soon as one member calls this,
// so a member still waiting on the set is released to call it too. Then
// the agreement: InvalidArgument on every rank for id 0, an unknown id, or
// ranks passing different ids (a set that a member had asked to remove is
// then stopped, though still registered: its operations fail).
void remove_process_set(Runtime& world, ProcessSetTable& table, int id);

}  // namespace gyre::core
