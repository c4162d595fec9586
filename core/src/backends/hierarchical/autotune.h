// AllreduceTuner: GYRE_AUTOTUNE's choice between the flat and the
// hierarchical allreduce, timed on the job's own calls.
//
// The cost model (cost_model.h) predicts from α-β parameters, built in or
// measured at start-up by the link probe; neither sees what a job's own
// calls meet, such as more ranks on a host than cores, where the
// shared-memory passes wait for a core while the link idles (docs/scaling.md,
// "4 hosts × 2 ranks"). The tuner times the two forms on the calls
// themselves. Per size class (buffers of [2^k, 2^(k+1)) bytes, from
// kTuneMinBytes), the class's first call is a warm-up (the model's choice,
// not timed: it pays for what the size touches first), and the calls after
// it come in blocks of four that run the model's choice (A) and the other
// form (B) in the order A B B A, which cancels a drift that is linear in
// time. Each rank sums its seconds per byte of each form (the expected time
// decides: the best of two would favour the form whose times vary more).
// After each block one dissemination allreduce (max) over the world gives
// every rank the slowest rank's sums; if the forms' means differ by less
// than kDecisiveGap, another block runs (up to kMaxBlocks: forms that close
// are about as good as each other), else, and after the last block, every
// later call of the class runs the faster form (a tie keeps the model's).
// Every rank sees the same calls in the same order (the negotiation's), so
// every rank runs the same trials and the same agreements at the same
// points, and decides alike.
//
// Below kTuneMinBytes the model decides: a call there takes microseconds,
// as noisy as the difference between the forms.
//
// Thread: the runtime's background thread; decisions() from any thread.
#pragma once

#include <array>
#include <cstddef>
#include <mutex>
#include <optional>
#include <vector>

#include "gyre/collectives/transport.h"
#include "gyre/gyre.h"

namespace gyre::core {

// One size class's outcome, as runtime_stats() reports it (gyre.h): the
// slowest rank's mean seconds per MiB of each form over its trials, and the
// form chosen beside the cost model's.
using TunedAllreduce = RuntimeStats::TunedAllreduce;

class AllreduceTuner {
 public:
  static constexpr std::size_t kTuneMinBytes = std::size_t{256} << 10;
  static constexpr int kBlockTrials = 4;  // A B B A
  static constexpr int kTrials = 1 + kBlockTrials;  // the warm-up and one block
  static constexpr int kMaxBlocks = 3;
  static constexpr double kDecisiveGap = 0.10;

  // `tag`: the agreement's messages (the data tag: no call of the backend
  // is in flight between two calls).
  explicit AllreduceTuner(int tag) : tag_(tag) {}

  // Whether a call of `bytes` runs the hierarchical form, given the model's
  // choice.
  bool choose(std::size_t bytes, bool model_hierarchical);
  // After that call: its seconds on this rank. After each block of a
  // class's trials, agrees with every rank over `world` (collective: every
  // rank records the same calls). Returns the class's outcome when it was
  // just decided.
  std::optional<TunedAllreduce> record(transport::Transport& world, std::size_t bytes,
                                       bool hierarchical, double seconds);

  std::vector<TunedAllreduce> decisions() const;

 private:
  struct Class {
    int trials = 0;                    // calls timed so far, the warm-up included
    std::array<double, 2> s_per_b{};   // this rank's sums: [flat, hierarchical]
    bool model_hierarchical = false;   // fixed at the class's first call
    bool decided = false;
    bool hierarchical = false;
  };
  static int class_of(std::size_t bytes);
  int tag_;
  std::vector<Class> classes_;  // by log2 of the bytes
  mutable std::mutex mu_;       // guards decided_
  std::vector<TunedAllreduce> decided_;
};

}  // namespace gyre::core
