// Local SGD and DiLoCo for C++ jobs (docs/training-modes.md): each rank
// trains alone for `period` steps, then one outer round makes the ranks'
// parameters one model again, or, streaming, one fragment of the
// parameters at a time with its round overlapping the next inner steps. The
// C++ counterpart of Python's gyre.torch.LocalSGD (partial participation:
// gyre/partial_local_sgd.h).
//
//   std::vector<float> w(n), b(m);                 // the job's parameters
//   gyre::LocalSgd sgd({.period = 16, .outer = gyre::OuterOptimizer::diloco()},
//                      {gyre::view(w), gyre::view(b)});
//   for (...) {
//     ...                                          // gradients, own update of w and b
//     sgd.step();                                  // an outer round every 16 calls
//   }
//
// An outer round: the pseudo-gradients θ_synced − θ_local of every parameter
// are averaged over the process set's ranks in one grouped allreduce
// (optionally carried as float16 or bfloat16), the outer optimizer (SGD,
// optionally with momentum and Nesterov's correction, as torch.optim.SGD)
// steps θ_synced with them as its gradient, and every rank's parameters
// become θ_synced, identical on every rank. Each round is one commit of the
// version vector (gyre::commit_step(); LocalSgdOptions::commit).
//
// Streaming (LocalSgdOptions::fragments = F, sync_delay = D): the parameters
// are cut into F fragments, runs of consecutive parameters balanced by
// elements. Fragment f's round starts at the local steps s with
// s % period == ((f + 1) * period / F) % period (the last fragment at the
// multiples of the period, the others spread over it); its allreduce is
// started then and waited for D steps later, so that it overlaps those inner
// steps. When it completes, the outer optimizer steps the fragment's
// θ_synced and its parameters become θ_synced + (θ_local now − θ_local at the
// start) (the D inner steps taken meanwhile kept on top of the round's
// result), or with `mixing` = α, α·θ_local + (1 − α)·θ_synced. Each completed
// fragment round is a commit, and fragment_versions() says which commit each
// fragment of this rank's parameters includes. F = 1, D = 0 is the round
// above.
//
// Ownership: the caller owns the parameter buffers and keeps them alive, at
// the same address and size, as long as the LocalSgd; LocalSgd owns
// θ_synced and the outer optimizer's momentum, one copy of each parameter.
// Threads: one LocalSgd is used from one thread at a time. Every rank of the
// process set constructs it with the same options and parameter shapes and
// calls step() the same number of times (its collectives are matched by name).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gyre/gyre.h"

namespace gyre {

namespace elastic { class State; }

// The outer optimizer: SGD on θ_synced whose gradient is the averaged
// pseudo-gradient, with torch.optim.SGD's momentum (no dampening):
//   buf = momentum * buf + g;  d = nesterov ? g + momentum * buf : buf;
//   θ_synced -= lr * d          (momentum 0: θ_synced -= lr * g)
struct OuterOptimizer {
  double lr = 1.0;
  double momentum = 0.0;
  bool nesterov = false;

  // Plain averaging: lr 1, no momentum, which makes θ_synced the mean of the
  // ranks' parameters.
  static OuterOptimizer averaging() { return {}; }
  // DiLoCo's (Douillard et al.): by default lr 0.7, Nesterov momentum 0.9.
  static OuterOptimizer diloco(double lr = 0.7, double momentum = 0.9, bool nesterov = true) {
    return {lr, momentum, nesterov};
  }
};

// How the pseudo-gradients travel: in the parameters' own dtype, or cast to
// 16 bits (summed by the allreduce in float32, rounded to 16 bits), or as
// 8-bit integers with one float32 scale per block of kLocalSgdInt8Block
// values of a parameter (its absolute maximum / 127), a quarter of float32's
// bytes and a little more. 8-bit values cannot be summed in 8 bits: an int8
// round is one allgather of every rank's values and scales, which every
// rank dequantizes and averages in float32 in rank order, so that every rank
// computes the same average; the error per value is at most half its
// block's scale. (gyre.torch.LocalSGD's LocalSGD.int8, with blocks taken per
// parameter here instead of across a fragment's parameters.)
enum class LocalSgdCompression { kNone, kFloat16, kBFloat16, kInt8 };
inline constexpr std::size_t kLocalSgdInt8Block = 256;

struct LocalSgdOptions {
  int period = 1;            // inner steps per outer round, >= 1
  OuterOptimizer outer = OuterOptimizer::averaging();
  int warmup_steps = 0;      // the first warmup_steps steps each end in a round, >= 0
  LocalSgdCompression compression = LocalSgdCompression::kNone;
  int process_set = kGlobalProcessSet;
  // The prefix of the operations' names ("<name>.init.<i>", "<name>.round.<i>"):
  // two LocalSgd on one process set at the same time need different ones.
  std::string name = "gyre.local_sgd";
  // Whether each round calls gyre::commit_step(), on the global process set
  // only: the version vector is one per job (the global set's), and rounds
  // on a set that leaves ranks out, were they commits, would put its
  // members' committed steps ahead of the other ranks' (the next collective
  // they share a DivergenceError beyond GYRE_MAX_VERSION_LAG), as Python's
  // LocalSGD and DistributedOptimizer on such a set do not commit either.
  // Turn it off where the job counts its commits itself.
  bool commit = true;
  // Streaming (above): fragments in [1, period] and at most the number of
  // parameters; sync_delay in [0, period).
  int fragments = 1;
  int sync_delay = 0;
  // With sync_delay > 0: a fragment's parameters after its round are
  // mixing·θ_local + (1 − mixing)·θ_synced; below 0 (the default): θ_synced
  // plus the inner steps taken while the round was in flight. In [0, 1] or
  // negative.
  double mixing = -1;
};

class LocalSgd {
 public:
  // `params`: the job's parameters, float32 or float64 host tensors (mixed
  // dtypes are fine), updated in place. Collective over the process set: the
  // set's first rank's parameters are broadcast into every rank's, so that
  // every rank starts from the same model. Throws InvalidArgument naming the
  // problem for a period below 1, negative warm-up steps, an lr that is not
  // positive, a momentum outside [0, 1), Nesterov without momentum, fragments
  // or sync_delay out of range, a mixing above 1, an empty name or parameter
  // list, a parameter of another dtype, off the host, with
  // a null buffer, or given twice; a rank outside the process set gets
  // InvalidArgument from the broadcast, ranks whose shapes or dtypes differ
  // MismatchError.
  LocalSgd(const LocalSgdOptions& options, std::vector<TensorView> params);
  // Waits for the rounds still in flight (their errors are dropped): their
  // buffers are the LocalSgd's.
  ~LocalSgd();
  LocalSgd(const LocalSgd&) = delete;
  LocalSgd& operator=(const LocalSgd&) = delete;
  // A moved-from LocalSgd may only be destroyed or assigned to.
  LocalSgd(LocalSgd&&) noexcept;
  LocalSgd& operator=(LocalSgd&&) noexcept;

  // Called after each of the job's own (inner) updates of the parameters:
  // counts the step and, at every period-th step (and every step of the
  // warm-up), runs an outer round; streaming, completes the fragments'
  // rounds due at this step, then starts those whose turn it is (and, with
  // no sync delay, completes them). Returns true when a round (of a
  // fragment) completed. Collective at those steps. If a round's allreduce
  // fails, its error is thrown and that fragment's parameters, θ_synced,
  // momentum and counters are as before the round (the round is dropped).
  bool step();
  // Completes the rounds in flight, then one outer round of every fragment
  // now, whatever the step (collective): for instance at the end of
  // training, so that every rank holds the same final model.
  void sync();

  // Elastic training (gyre/elastic.h): registers what this LocalSgd keeps
  // beside the job's parameters with `state`, so that a recovery returns it
  // to the last commit with them: θ_synced and the outer optimizer's
  // momentum of every parameter ("<name>.synced.<i>", "<name>.momentum.<i>")
  // and the step and round counters ("<name>.local_steps",
  // "<name>.rounds"). The job adds its parameters itself and calls
  // state.commit() after each step() that ran a round (the round's commit
  // is then the State's): the LocalSgd must not commit itself, so it needs
  // `.commit = false` on the global process set (InvalidArgument otherwise,
  // as two commit_step() per round would break the State's count). The
  // LocalSgd must outlive the State's use of these buffers (a move keeps
  // them where they are). With a sync delay a commit may fall while a
  // fragment's round is in flight: the commit holds θ_synced and the
  // momentum from before that round, and a failure drops it (elastic::run's
  // failure callback), so that the fragment's next round carries the steps
  // since its last completed one. The
  // fragments' round and version counters are registered too
  // ("<name>.fragment_rounds", "<name>.fragment_versions"). Under int8
  // compression every round counts the process set's ranks afresh, so
  // rounds after a rebuild average over the survivors.
  void add_to(elastic::State& state);

  std::int64_t local_steps() const;  // step() calls so far
  std::int64_t rounds() const;       // outer rounds completed (of any fragment)
  // gyre::committed_steps() right after this LocalSgd's last round; 0 before
  // one, and always without `commit`.
  std::uint64_t version() const;
  // Per fragment: gyre::committed_steps() right after the last round merged
  // into this rank's parameters of that fragment (0: none yet); without
  // `commit` or on a process set other than the global one, the number of
  // the fragment's rounds instead (such rounds are not commits).
  std::vector<std::uint64_t> fragment_versions() const;
  std::vector<std::int64_t> fragment_rounds() const;
  // The indices (into the constructor's `params`) of fragment f's parameters:
  // [first, last).
  std::pair<std::size_t, std::size_t> fragment_params(int f) const;
  const LocalSgdOptions& options() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace gyre
