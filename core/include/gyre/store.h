// The versioned parameter store: parameters sharded across the ranks of a
// process set, each shard with a version; a worker pulls a tensor with its
// versions, computes, and pushes an update with the versions it read, and
// each shard's owner applies it atomically only if the shard is still
// current enough (optimistic concurrency), else rejects it with the current
// version. The clock of asynchronous and bounded-staleness training
// (docs/training-modes.md).
//
// Placement: a tensor of at most StoreOptions::split_bytes is one shard,
// owned by the rank holding the fewest bytes so far (ties: the lowest rank
// of the set); a larger one is cut into one contiguous shard per rank of the
// set (rank i owns shard i). Every rank registers the same tensors in the
// same order, so every rank computes the same placement.
//
// Atomicity is per shard: a shard's value and version change together or
// not at all, and pushes to one shard apply in some order one after the
// other. A push to a tensor of several shards is a push to each: some may
// be applied and others rejected (PushResult says which), and a retry sends
// only the rejected ones (push's `only_shards`).
//
// Engine: a server thread on every rank of the set answers requests for its
// shards over a communicator of the store's own (gyre's MPI world, at
// MPI_THREAD_MULTIPLE), one request per owner per call whatever the number
// of shards and tensors; requests for this rank's own shards are served on
// the caller's thread. Why not MPI one-sided windows: docs/training-modes.md.
//
// Errors: as every gyre call. Bad arguments (an unregistered name, a delta
// of another dtype or size, a version vector of the wrong length) throw
// InvalidArgument on the calling rank only: the store is one-sided, nothing
// is announced. A request an owner does not answer within the deadline
// throws TimeoutError naming the owner. Under ULFM a member's death ends
// the store on every member: the calls that follow (on this rank's own
// shards excepted) throw RankFailedError naming the dead member, and so
// does check_members() once this rank's server has seen the death; a push
// the dead member was sending was applied whole or not at all.
//
// Threads: the constructor, register_tensor() and close() are collective
// over the set (one thread of each member, the same order); pull() and
// push() from any thread of a member, concurrently. The store must be
// closed (close() or the destructor, collectively) before gyre::shutdown();
// shutdown() stops any store still open on this rank (its later calls throw
// StateError). A store destroyed without close() keeps its communicator
// until MPI is finalised (the others may still send to it).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gyre/gyre.h"

namespace gyre {

// What a push does with its update, given lag = the shard's version now -
// the version the update was computed from.
enum class PushPolicy : std::uint8_t {
  kReject = 0,  // lag <= staleness: value += delta; else rejected
  kApply,       // always value += delta (fully asynchronous); staleness ignored
  kScale,       // lag <= staleness: value += delta / (1 + lag); else rejected
};

struct StoreOptions {
  // A tensor of more bytes than this is cut into one shard per rank.
  std::size_t split_bytes = std::size_t{4} << 20;
  // How long a request waits for its owner; <= 0: GYRE_STALL_SHUTDOWN_S
  // (and if that is 0, no limit).
  double timeout_s = 0;
};

struct PushResult {
  bool applied = false;               // every shard pushed was applied
  std::vector<std::int64_t> version;  // per shard: the version after this push
  std::vector<bool> shard_applied;    // per shard (false for shards not pushed)
  std::vector<std::int64_t> lag;      // per shard pushed: version then - base
  std::vector<int> rejected_shards;   // the shards pushed and rejected
};

// One tensor of a pull_many(): its name and where its values go.
struct PullItem {
  std::string name;
  TensorView out;
};

// One tensor of a push_many(): as push()'s arguments.
struct PushItem {
  std::string name;
  TensorView delta;
  std::vector<std::int64_t> base_version;
  std::int64_t staleness = 0;
  PushPolicy policy = PushPolicy::kReject;
  std::vector<int> only_shards;
};

struct StoreStats {
  std::int64_t pulls = 0;             // by this rank
  std::int64_t pushes = 0;            // shard pushes by this rank
  std::int64_t pushes_applied = 0;
  std::int64_t pushes_rejected = 0;
  std::int64_t pushes_scaled = 0;     // applied with a factor below 1
  std::int64_t served_requests = 0;   // requests this rank's server answered
  std::int64_t max_lag_seen = 0;      // largest lag among this rank's pushes
};

class ParameterStore {
 public:
  // Collective over `process_set`'s ranks (after a gyre barrier over the set,
  // so that a missing rank fails with gyre's stall deadline, not a hang).
  explicit ParameterStore(int process_set = kGlobalProcessSet, const StoreOptions& options = {});
  // Not collective: stops serving this rank's shards at once (the others'
  // requests for them then time out, naming this rank). Call close() first
  // where every member ends together.
  ~ParameterStore();
  ParameterStore(const ParameterStore&) = delete;
  ParameterStore& operator=(const ParameterStore&) = delete;

  // Collective: `value` of the set's first rank (gyre's broadcast, which
  // names any rank whose shape or dtype differs) becomes the tensor's value,
  // version 0 in every shard. `value` itself is not modified. CPU tensors.
  void register_tensor(const std::string& name, const TensorView& value);

  // Writes the whole tensor into `out` (its registered dtype and number of
  // elements) and returns each shard's version, read with its values.
  std::vector<std::int64_t> pull(const std::string& name, const TensorView& out);

  // Pushes `delta` (the registered dtype and number of elements), computed
  // from the values of `base_version` (per shard, as pull() returned).
  // staleness < 0: no bound. `only_shards` empty: every shard.
  PushResult push(const std::string& name, const TensorView& delta,
                  const std::vector<std::int64_t>& base_version, std::int64_t staleness = 0,
                  PushPolicy policy = PushPolicy::kReject,
                  const std::vector<int>& only_shards = {});

  // pull() and push() of several tensors in one call: one request to each
  // owner for all the shards it holds of them (a step of AsyncOptimizer).
  // Returns what pull() / push() return, per item. Atomic per shard, as
  // pushes always are; a push request refused (a bad base version) changes
  // nothing on its owner, and bad arguments on this rank are found before
  // anything is sent.
  std::vector<std::vector<std::int64_t>> pull_many(const std::vector<PullItem>& items);
  std::vector<PushResult> push_many(const std::vector<PushItem>& items);

  // Throws RankFailedError if this rank's server has stopped because a
  // member died (under ULFM; it sees that within milliseconds, whether or
  // not anyone asks it anything), StateError if it stopped on another
  // error; else returns. Calls on this rank's own shards do not check it
  // (they go on after a death): a loop that may read only its own shards
  // while it waits for the others calls this to learn of a death.
  void check_members() const;
  // The tensor's number of shards and the world rank owning each.
  std::vector<int> shard_owners(const std::string& name) const;
  StoreStats stats() const;
  // Collective: waits (gyre barrier) until every member has finished its
  // calls, then stops this rank's server. Idempotent.
  void close();

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace gyre
