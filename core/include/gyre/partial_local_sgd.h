// Local SGD with partial participation for C++ jobs (docs/training-modes.md):
// rounds that do not wait for late ranks. The C++ counterpart of Python's
// gyre.torch.PartialLocalSGD, on the versioned parameter store
// (gyre/store.h) instead of a collective per round.
//
//   std::vector<float> w(n), b(m);                 // the job's parameters
//   gyre::PartialLocalSgd sgd({.period = 16, .late_after_s = 2.0, .max_staleness = 1},
//                             {gyre::view(w), gyre::view(b)});
//   for (...) {
//     ...                                          // gradients, own update of w and b
//     sgd.step();                                  // a round every 16 calls
//   }
//   sgd.close();                                   // collective: the final model everywhere
//
// The synchronised model θ_synced (every parameter, flattened into one
// tensor) lives in a ParameterStore; its version counts the closed rounds. A
// rank's round, every `period` steps: it posts its contribution (the
// pseudo-gradient θ_synced − θ_local and the round it started from) into a
// mailbox of its own in the store, waits until a round after that one has
// closed, pulls the model and continues from it. Nobody waits for a
// particular rank.
//
// The set's first rank runs the aggregator on a thread of its own (its own
// training pace does not matter): a round closes when every rank still
// training has posted, or `late_after_s` seconds after the first contribution
// made from the current round, whichever comes first. A contribution from
// an older round has a lag (rounds closed since the round it started from):
// lag <= max_staleness: merged into the round closing now (counted as merged
// late); otherwise rejected (a warning on the aggregator's rank and on the
// contributing rank, counted), and that rank goes on from the current model
// like every rank after a round. The round's update: the outer optimizer's
// step (OuterOptimizer of gyre/local_sgd.h; default plain averaging) on
// θ_synced with the mean of the merged pseudo-gradients as its gradient. The
// outer optimizer runs on the aggregator only: one copy of its momentum.
//
// Precision: the store's tensors are float64 if any parameter is float64,
// else float32 (Python's choice: one float32 tensor); the aggregator computes
// in float64. A rank's θ_synced is the model as its parameters hold it, so a
// rank whose parameters did not move contributes exactly zero. Mailboxes
// are emptied by pushing the negated contents (x + (−x) = 0 exactly), so
// contributions arrive bit for bit. The round a contribution started from
// travels in the mailbox as a number of the store's dtype: exact up to 2^24
// rounds in float32.
//
// Streaming (PartialLocalSgdOptions::fragments, sync_delay): each fragment
// of the parameters is such a round of its own, staggered across the period
// as LocalSgd's; with a sync delay a rank posts and merges sync_delay steps
// later.
//
// Commits: adopting round k after round j calls gyre::commit_step() k − j
// times (on the global process set, with `commit`; as LocalSgd), so a rank's
// entry in the version vector is the round it holds, plus the commits made
// before construction. Ranks at different rounds differ in committed steps:
// a collective between them during training fails with DivergenceError
// unless GYRE_MAX_VERSION_LAG allows the difference; after close() every rank
// holds the final round.
//
// Ownership: the caller owns the parameter buffers and keeps them alive, at
// the same address and size, as long as the PartialLocalSgd (until close()
// or destruction); it owns the store, the aggregator's thread and its state.
// Threads: one PartialLocalSgd is used from one thread at a time; on the
// set's first rank the aggregator runs on a thread of its own, which touches
// only the store (never the caller's parameters). The constructor and
// close() are collective over the process set; step() and round() are not.
// It must be closed or destroyed before gyre::shutdown() (the store's rule).
//
// Errors never hang: every wait is bounded by `timeout_s` and ends in
// TimeoutError naming what was awaited. An error on the aggregator's thread
// is logged there, published in the store, and raised by every rank's next
// wait as StateError naming the aggregator's rank. Bad arguments throw
// InvalidArgument naming the problem.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gyre/gyre.h"
#include "gyre/local_sgd.h"

namespace gyre {

struct PartialLocalSgdOptions {
  int period = 1;              // inner steps per round, >= 1
  int warmup_steps = 0;        // the first warmup_steps steps each end in a round, >= 0
  // A round closes at most this long after its first on-time post, >= 0.
  double late_after_s = 1.0;
  int max_staleness = 1;       // rounds a late contribution may lag and still be merged, >= 0
  OuterOptimizer outer = OuterOptimizer::averaging();
  int process_set = kGlobalProcessSet;
  // Bound of every wait (and of the store's requests); <= 0:
  // GYRE_STALL_SHUTDOWN_S, and 600 s where that is 0 too.
  double timeout_s = 0;
  // The prefix of the store's tensors ("<name>.model", "<name>.slot.<i>",
  // "<name>.posted", "<name>.meta").
  std::string name = "gyre.partial_local_sgd";
  // Whether adopting a round calls gyre::commit_step() (once per round), on
  // the global process set only: see LocalSgdOptions::commit.
  bool commit = true;
  // Streaming, as LocalSgdOptions' (LocalSgd's cut of the parameters into
  // runs balanced by size): each fragment is a partial-participation round
  // of its own, with its tensors ("<name>.f<k>.model", ...) in a store of
  // its own and its aggregator; fragment f's rounds fall at the steps where
  // step % period == (f + 1) * period / fragments % period. With
  // sync_delay > 0 a rank posts its contribution and goes on; sync_delay
  // steps later it waits for the round and merges it: the round's model
  // plus the inner steps taken since the post. fragments in [1, period] and
  // at most the number of parameters; sync_delay in [0, period). Elastic
  // too (add_to).
  int fragments = 1;
  int sync_delay = 0;
};

// What the aggregator has published, as this rank reads it.
struct PartialLocalSgdCounters {
  std::int64_t rounds = 0;        // rounds closed
  std::int64_t merged_late = 0;   // this rank's contributions merged late
  std::int64_t rejected = 0;      // this rank's contributions rejected
  std::int64_t rounds_late = 0;   // rounds this rank arrived at after they had closed
  std::vector<std::int64_t> merged_late_by_rank;  // per rank of the set
  std::vector<std::int64_t> rejected_by_rank;     // per rank of the set
};

// One round the aggregator closed (round_history()); ranks are world ranks.
struct PartialLocalSgdRound {
  std::int64_t round = 0;  // its number; 0 if every contribution taken was rejected
  std::vector<int> merged;    // on time
  std::vector<int> late;      // merged late
  std::vector<int> rejected;  // too old, not merged
};

class PartialLocalSgd {
 public:
  // `params`: the job's parameters, float32 or float64 host tensors (mixed
  // dtypes are fine), updated in place. Collective over the process set:
  // makes the store and registers the model, the set's first rank's
  // parameters, which every rank then starts from. Throws InvalidArgument
  // naming the problem for a period below 1, negative warm-up steps, a
  // negative or non-finite
  // late_after_s, a negative max_staleness, an lr that is not positive, a
  // momentum outside [0, 1), Nesterov without momentum, an empty name or
  // parameter list, a parameter of another dtype, off the host, with a null
  // buffer, or given twice, a rank outside the process set; ranks whose
  // parameters differ in size get MismatchError from the registration.
  PartialLocalSgd(const PartialLocalSgdOptions& options, std::vector<TensorView> params);
  // Not collective: stops the aggregator (waiting at most for the store call
  // it is in, bounded by timeout_s) and the store on this rank without
  // waiting for the others (call close() where every rank ends together).
  ~PartialLocalSgd();
  PartialLocalSgd(const PartialLocalSgd&) = delete;
  PartialLocalSgd& operator=(const PartialLocalSgd&) = delete;
  // A moved-from PartialLocalSgd may only be destroyed or assigned to.
  PartialLocalSgd(PartialLocalSgd&&) noexcept;
  PartialLocalSgd& operator=(PartialLocalSgd&&) noexcept;

  // Called after each of the job's own (inner) updates: counts the step and
  // at every period-th (and every step of the warm-up) runs round().
  // Returns true when it did. Streaming: completes the fragments' rounds
  // due now, then starts (and, without a delay, completes) those whose
  // step it is; returns true when a round was adopted.
  bool step();
  // Posts this rank's contribution, waits for the round after its version
  // to close (at most late_after_s after the first on-time contribution,
  // plus the aggregator's work), and continues from the model it pulls: the
  // parameters are overwritten with it. Streaming: completes the rounds in
  // flight, then a round of every fragment.
  void round();
  // Collective: tells the aggregator this rank has stopped, waits for it to
  // finish (it closes a last round with what was posted), takes the final
  // model into the parameters, and closes the store. Idempotent. After it
  // succeeded the accessors keep answering (with what the aggregator left);
  // after it threw, counters() and merged_rounds() throw (the store is closed).
  void close();

  // Elastic training (gyre/elastic.h): registers this PartialLocalSgd's
  // step and round counters with `state` ("<name>.local_steps",
  // "<name>.rounds", "<name>.rounds_late") and its recovery: when a member
  // dies, every survivor's store calls fail (RankFailedError, the
  // aggregator's thread stops quietly); elastic::run's failure callback
  // drops this rank's store without a collective, and after the rebuild the
  // State's sync callback (State::on_sync) opens a new store over the ranks
  // now (collective), holding the restored model, with a new aggregator on
  // the new first rank; version() counts on from the rounds before. A
  // failure while it opens makes run() rebuild again. A replacement rank
  // (GYRE_ELASTIC_RESPAWN) constructs its PartialLocalSgd without a store
  // and opens it in its first sync, with the survivors. The outer
  // optimizer's momentum restarts (it was the old aggregator's alone). The
  // job adds its parameters to the State itself and calls state.commit()
  // after each step() that ran a round: the PartialLocalSgd must not commit
  // itself (`.commit = false`), and must be on the global process set (a
  // rebuild drops the others); InvalidArgument otherwise. elastic::run
  // needs the survivors within one commit of each other: rounds that wait
  // for every rank (late_after_s above a period's time) keep them so. The
  // PartialLocalSgd must outlive the State's use. Streaming: each fragment's
  // store goes and comes back the same way (its counters
  // "<name>.f<k>.rounds", "<name>.f<k>.rounds_late"); a fragment's round in
  // flight at the failure (posted, not yet merged: a commit may fall inside
  // a sync delay, or between the fragments' rounds) goes with the old store.
  // Its new store's model is the sync root's restored parameters, so the
  // root's inner steps since that fragment's last merged round stay in the
  // model (without an outer step), and the other survivors', like every
  // survivor's steps since the commit, are dropped.
  void add_to(elastic::State& state);

  std::int64_t local_steps() const;  // step() calls so far
  // The round of the model this rank works from, counted over the whole
  // training (after an elastic recovery: the rounds before it plus the new
  // store's); streaming, the fragment rounds adopted.
  std::int64_t version() const;
  std::int64_t rounds_late() const;  // rounds this rank arrived at after they had closed
  PartialLocalSgdCounters counters() const;
  // Per rank of the set: the round of `fragment` its latest merged
  // contribution went into (0: none yet), as the store holds it now.
  std::vector<std::int64_t> merged_rounds(int fragment = 0) const;
  // On the aggregator's rank: every round of `fragment` closed so far;
  // elsewhere empty.
  std::vector<PartialLocalSgdRound> round_history(int fragment = 0) const;
  // Per fragment: the round of it this rank's parameters hold (version() is
  // their sum). counters() sums over the fragments.
  std::vector<std::int64_t> fragment_versions() const;
  const PartialLocalSgdOptions& options() const;

  // Internal (core/src/training/partial_local_sgd_state.h); named here so
  // that the aggregator's thread can hold a reference to it.
  struct State;

 private:
  const PartialLocalSgd& fragment(int fragment) const;
  std::unique_ptr<State> state_;
};

}  // namespace gyre
