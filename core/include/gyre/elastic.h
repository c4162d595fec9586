// Elastic training for C++ jobs (docs/elastic.md): a state object that
// keeps a committed copy of the job's buffers in memory, and a run loop that
// goes back to it when a rank dies. The C++ counterpart of Python's
// gyre.torch.elastic.TorchState and elastic.run.
//
//   std::vector<float> weights(n);
//   gyre::elastic::State state;
//   state.add("weights", weights);
//   gyre::elastic::run(state, [&](gyre::elastic::State& s) {
//     for (auto step = gyre::committed_steps(); step < steps; ++step) {
//       ...                         // compute, allreduce, update weights
//       s.commit();                 // copy in memory, then gyre::commit_step()
//     }
//   });
//
// run() synchronises the state from rank 0, then calls the function. When a
// rank dies (RankFailedError), every survivor calls rebuild(), returns its
// buffers to its own last commit, takes the agreed commit from the
// rebuild's root by broadcast (a rank one commit ahead rolls back), runs the
// reset callbacks and calls the function again: it resumes from
// gyre::committed_steps(). Without ULFM (or with fault tolerance off) the
// RankFailedError is not raised and run() calls the function once.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "gyre/gyre.h"

namespace gyre::elastic {

// What a recovery did, for the reset callbacks.
struct Recovery {
  RebuildInfo info;                                 // what rebuild() agreed
  std::uint64_t own_commit = 0;                     // this rank's commits when it failed
  std::chrono::steady_clock::time_point failed_at;  // when this rank saw the failure
};

// Host buffers committed and restored together. The caller owns them: each
// must stay alive, at the same address and size, as long as the State.
class State {
 public:
  // Registers `count` elements at `data`; `name` must be the same on every
  // rank (the buffers are broadcast by name) and unique in this State.
  // Throws InvalidArgument on a duplicate or empty name, a null buffer or a
  // negative count. The current contents become the commit.
  void add(const std::string& name, void* data, DataType dtype, std::int64_t count);
  template <class T>
  void add(const std::string& name, std::vector<T>& v) {
    add(name, v.data(), dtype_of<T>(), static_cast<std::int64_t>(v.size()));
  }

  // Copies every buffer into its committed copy (memory allocated once, at
  // add()), then gyre::commit_step().
  void commit();
  // Copies the committed copies back into the buffers.
  void restore();
  // Makes every rank's buffers equal to `root`'s (broadcast), commits
  // them in memory (without commit_step()), then runs the sync callbacks.
  void sync(int root);
  // The number of commit() calls (steps this State committed).
  std::uint64_t commits() const { return commits_; }

  // Called by run(): on_failure callbacks when this rank sees a rank's
  // failure, before rebuild(); on_reset callbacks after a recovery, once the
  // buffers hold the agreed commit.
  void on_failure(std::function<void(const RankFailedError&)> cb) {
    failure_callbacks_.push_back(std::move(cb));
  }
  void on_reset(std::function<void(const Recovery&)> cb) { reset_callbacks_.push_back(std::move(cb)); }
  // Called at the end of every sync(), on every rank, once the buffers hold
  // the root's values: run()'s first sync (a replacement rank's joining
  // included) and each recovery's, before the reset callbacks. For what
  // must follow the sync collectively on every rank alike, the replacement
  // too, which runs no reset callbacks (PartialLocalSgd::add_to reopens
  // its store here). A RankFailedError it throws during a recovery's sync
  // makes run() rebuild again, as one of the broadcasts would.
  void on_sync(std::function<void()> cb) { sync_callbacks_.push_back(std::move(cb)); }

 private:
  template <class T>
  static DataType dtype_of();

  struct Buffer {
    std::string name;
    void* data;
    DataType dtype;
    std::int64_t count;
    std::vector<std::byte> saved;
  };
  friend void run(State&, const std::function<void(State&)>&);
  std::vector<Buffer> buffers_;
  std::uint64_t commits_ = 0;
  std::uint64_t committed_at_ = 0;  // committed_steps() when the buffers were last saved
  std::vector<std::function<void(const RankFailedError&)>> failure_callbacks_;
  std::vector<std::function<void(const Recovery&)>> reset_callbacks_;
  std::vector<std::function<void()>> sync_callbacks_;
};

template <class T>
DataType State::dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DataType::kFloat32;
  else if constexpr (std::is_same_v<T, double>) return DataType::kFloat64;
  else if constexpr (std::is_same_v<T, std::int32_t>) return DataType::kInt32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return DataType::kInt64;
  else if constexpr (std::is_same_v<T, std::uint8_t>) return DataType::kUInt8;
  else static_assert(sizeof(T) == 0, "gyre::elastic::State::add: unsupported element type");
}

// Runs fn(state) after state.sync(0) until it returns; see the top of this
// file. A recovery whose agreed step this rank's commits cannot match (its
// State is behind the agreed step, or more than one commit ahead: commit()
// was not called once per commit_step()) throws StateError on that rank.
void run(State& state, const std::function<void(State&)>& fn);

}  // namespace gyre::elastic
