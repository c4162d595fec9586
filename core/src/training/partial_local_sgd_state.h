// PartialLocalSgd's internals (gyre/partial_local_sgd.h), shared by the
// rank's side (partial_local_sgd.cc) and the aggregator's thread
// (partial_local_sgd_aggregator.cc): the layout of the store's tensors, the
// calls both sides make on them (partial_local_sgd_store.cc), and the
// polling backoff of every wait.
//
// The store's tensors, registered in this order by every rank:
//   <name>.model     θ_synced, np values of the wire dtype; its version is
//                    the number of rounds closed (one push per round)
//   <name>.slot.<i>  rank i's mailbox: its pseudo-gradient (np values) and
//                    the round it started from + 1 (0: empty)
//   <name>.posted    int64, written by the ranks (PostedLayout)
//   <name>.meta      int64, written by the aggregator only (MetaLayout)
// Every write is a push with the "apply" policy (value += delta, whatever
// the version): the ranks and the aggregator never write the same element
// concurrently, so no push needs to be retried.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "gyre/partial_local_sgd.h"
#include "gyre/store.h"
#include "runtime/logging.h"

namespace gyre::core::partial {

// <name>.posted, 3n elements: per rank of the set, the contributions it has
// posted, the round its latest one started from, and 1 once it has stopped.
struct PostedLayout {
  int n = 0;
  int count(int i) const { return i; }
  int base(int i) const { return n + i; }
  int stopped(int i) const { return 2 * n + i; }
  int size() const { return 3 * n; }
};

// <name>.meta, 3 + 4n elements: rounds closed, 1 once the aggregator has
// finished, 1 if it failed; then per rank: its contributions consumed, the
// round its latest merged one went into, merged late, rejected.
struct MetaLayout {
  int n = 0;
  static constexpr int kRounds = 0;
  static constexpr int kFinished = 1;
  static constexpr int kFailed = 2;
  int consumed(int i) const { return 3 + i; }
  int merged_round(int i) const { return 3 + n + i; }
  int merged_late(int i) const { return 3 + 2 * n + i; }
  int rejected(int i) const { return 3 + 3 * n + i; }
  int size() const { return 3 + 4 * n; }
};

// Naps of a polling wait: 50 µs doubling up to 2 ms, so that a result that
// comes at once is seen at once and a long wait costs little CPU.
class Backoff {
 public:
  void nap() {
    nap_ = std::clamp(nap_ * 2, std::chrono::microseconds(50), std::chrono::microseconds(2000));
    std::this_thread::sleep_for(nap_);
  }
  void reset() { nap_ = std::chrono::microseconds(0); }

 private:
  std::chrono::microseconds nap_{0};
};

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The store and its tensors as both sides use them. Values travel as
// float64 on this side of the calls whatever the wire dtype (float32 or
// float64). Thread-safe after construction (the store's calls are; the rest
// is read-only), so the aggregator's thread and the rank's share it.
class PartialStore {
 public:
  // Collective: makes the store and registers the tensors (`model`: the
  // rank's flattened parameters; the set's first rank's become the model).
  PartialStore(const PartialLocalSgdOptions& o, double timeout_s, DataType wire, int n,
               const std::vector<double>& model);

  std::size_t np() const { return np_; }
  const std::string& model_name() const { return model_; }
  const std::string& slot_name(int i) const { return slots_[static_cast<std::size_t>(i)]; }
  const std::string& posted_name() const { return posted_; }
  const std::string& meta_name() const { return meta_; }

  // value += delta, whatever the version.
  void add(const std::string& name, const std::vector<double>& delta);
  void add_ints(const std::string& name, const std::vector<std::int64_t>& delta);
  // The whole tensor into `out` (resized); returns the first shard's version.
  std::int64_t pull(const std::string& name, std::vector<double>& out);
  std::vector<std::int64_t> pull_ints(const std::string& name);
  // Several float tensors in one call (the aggregator's mailboxes).
  void pull_many(const std::vector<std::string>& names, std::vector<std::vector<double>>& out);
  // The model and its version, pulled again while its shards show different
  // versions (the aggregator pushes them one by one); bounded by timeout_s.
  std::int64_t pull_model(std::vector<double>& out);
  void close() { store_.close(); }
  // RankFailedError once this rank's store server has seen a member die
  // (ParameterStore::check_members): reads of this rank's own shards do not.
  void check_members() const { store_.check_members(); }

 private:
  PushItem apply_item(const std::string& name, TensorView delta) const;

  ParameterStore store_;
  DataType wire_;
  std::size_t np_ = 0;
  double timeout_s_ = 0;
  std::string model_, posted_, meta_;
  std::vector<std::string> slots_;
  std::unordered_map<std::string, std::size_t> shards_;  // per tensor; filled at construction
};

class Aggregator;

}  // namespace gyre::core::partial

namespace gyre {

struct PartialLocalSgd::State {
  PartialLocalSgdOptions options;
  double timeout_s = 0;
  std::vector<int> ranks;  // the set's world ranks
  int n = 0;               // ranks in the set
  int me = 0;              // this rank's index in the set
  std::vector<TensorView> params;
  core::partial::PostedLayout posted_at;
  core::partial::MetaLayout meta_at;
  core::Logger log;
  std::unique_ptr<core::partial::PartialStore> store;
  std::unique_ptr<core::partial::Aggregator> aggregator;  // on the set's first rank

  std::vector<std::int64_t> posted;  // this rank's part of <name>.posted
  std::vector<double> synced;        // θ_synced as this rank's parameters hold it
  std::int64_t local_steps = 0;
  std::int64_t version = 0;        // the round of the store's model this rank holds
  // Rounds of the stores before this one (elastic recovery opens a new
  // store, whose rounds count from 0), and their sum with `version`: the
  // round counted over the whole training (PartialLocalSgd::version()).
  std::int64_t rounds_before = 0;
  std::int64_t rounds_total = 0;
  std::int64_t rounds_late = 0;
  std::int64_t seen_rejected = 0;
  bool closed = false;
  std::optional<std::vector<std::int64_t>> final_meta;  // after close(): what the aggregator left
  // A round in flight (posted, not yet adopted): the round it started from,
  // the step it is due at, and the parameters at the post (sync_delay > 0).
  std::optional<std::int64_t> pending_base;
  std::int64_t due = 0;
  std::vector<double> at_post;
  // Streaming (options.fragments > 1): one PartialLocalSgd of one fragment
  // per fragment, each with its store and aggregator (this State has
  // none), and the step % period of each one's rounds.
  std::vector<std::unique_ptr<PartialLocalSgd>> parts;
  std::vector<int> offsets;
  std::string fragment_label;  // a fragment's: " of fragment <k>", in its messages

  ~State();
  void open_store();
  void drop_store();
  void check_store() const;  // StateError once the store was dropped
  std::vector<std::int64_t> meta() const;
  template <typename Ready>
  std::vector<std::int64_t> wait(Ready ready, const std::string& what) const;
  void adopt(const std::vector<double>& value, std::int64_t version);
  // A round in two halves: post() this rank's contribution; finish() waits
  // for a round after the one it started from and adopts it (with the steps
  // since the post on top, under a sync delay). finish() without a round in
  // flight does nothing.
  void post();
  void finish();
  void check_rejections(const std::vector<std::int64_t>& m);
  void stop_aggregator();
};

}  // namespace gyre

namespace gyre::core::partial {

// The set's first rank's thread that closes rounds (the rules:
// gyre/partial_local_sgd.h). It reads and writes the store only; its own
// copy of θ_synced and the outer optimizer's momentum are float64.
class Aggregator {
 public:
  // Starts the thread; `owner` (its store made) outlives this Aggregator.
  explicit Aggregator(const PartialLocalSgd::State& owner);
  ~Aggregator();  // stops and joins the thread
  Aggregator(const Aggregator&) = delete;
  Aggregator& operator=(const Aggregator&) = delete;

  // Asks the thread to end at its next poll and joins it. Idempotent.
  void stop();
  std::vector<PartialLocalSgdRound> history() const;

 private:
  void run();
  void loop();
  void close_round(const std::vector<int>& pending);
  void push_meta(const std::vector<std::int64_t>& delta);

  const PartialLocalSgd::State& o_;  // options, ranks, store and logger: read-only here
  std::vector<double> synced_;       // θ_synced of the round being closed
  std::vector<double> momentum_;
  std::vector<std::int64_t> meta_;   // what this thread has published in <name>.meta
  std::vector<std::int64_t> consumed_;
  std::atomic<bool> stop_{false};
  mutable std::mutex history_mu_;  // guards history_
  std::vector<PartialLocalSgdRound> history_;
  std::thread thread_;  // last: started once everything above is made
};

}  // namespace gyre::core::partial
