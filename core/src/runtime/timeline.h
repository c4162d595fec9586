// Timeline: a Chrome trace-event JSON file of what happened to each tensor
// (QUEUE, NEGOTIATE, MEMCPY_IN_FUSION_BUFFER, ALLREDUCE or the other
// collectives, MEMCPY_OUT_FUSION_BUFFER), viewable in Perfetto or
// chrome://tracing. Recording starts with GYRE_TIMELINE at init, or at run
// time with start() (gyre::start_timeline, Horovod's hvd.start_timeline),
// and ends with stop() or the runtime's end.
//
// Events are complete ("X") events with microsecond timestamps relative to
// the start of the recording; pid is the rank and each tensor gets its own
// tid (named by an "M" metadata event), so slices of one tensor never
// overlap on a track. A slice that began before the recording started is
// cut at its start; one that ended before it is left out. With mark_cycles,
// each negotiation round is an instant ("i") event CYCLE_START. A round
// that changes the version vector adds a counter ("C") event VERSION_LAG:
// per rank, how many committed steps it is behind the most advanced rank. The file is
// valid JSON after every event: the closing "]}" is written after each
// event and overwritten by the next one.
//
// Threads: start() and stop() from user threads, slice() and mark_cycle()
// from the background thread; the recording is guarded by a mutex, and
// active() is a lock-free check so that the background thread formats
// nothing while no recording runs.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <vector>
#include <utility>
#include <string_view>
#include <unordered_map>

namespace gyre::core {

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;

  // `max_bytes` bounds each file (GYRE_TIMELINE_MAX_BYTES; 0: no bound):
  // an event that would take the file past it stops the recording instead,
  // the file staying complete JSON, and `warn` is called once with why.
  explicit Timeline(int rank, std::size_t max_bytes = 0,
                    std::function<void(const std::string&)> warn = {})
      : rank_(rank), max_bytes_(max_bytes), warn_(std::move(warn)) {}
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Starts recording to `path`: "{rank}" in it is replaced by the rank;
  // without it only rank 0 records (one file: rank 0's view), the other
  // ranks do nothing. A recording already running is stopped first (its
  // file stays complete). The file is created with mode 0666 less the
  // process's umask, and never through a symbolic link planted at its path
  // (O_NOFOLLOW). Throws InvalidArgument if the file cannot be created,
  // naming the path. `what` names the caller in that message
  // ("GYRE_TIMELINE").
  void start(const std::string& path, bool mark_cycles, std::string_view what);
  // Stops recording and closes the file; nothing when not recording.
  void stop();
  bool active() const { return active_.load(std::memory_order_relaxed); }

  // One slice [start, end) named `phase` on the track of `tensor`.
  void slice(std::string_view tensor, std::string_view phase, Clock::time_point start,
             Clock::time_point end, std::string_view args_json = {});
  // An instant CYCLE_START event at `t`, when recording with mark_cycles.
  void mark_cycle(Clock::time_point t);
  // A counter ("C") event `name` at `t` with one series per value (Perfetto
  // draws each as a line): the version vector's lags.
  void counter(std::string_view name, Clock::time_point t,
               const std::vector<std::pair<std::string, double>>& series);
  // Events written to the current (or last) file.
  int events() const;
  // Bytes of the current (or last) file.
  std::size_t bytes() const;

 private:
  // The helpers below run with mu_ held.
  int tid_for(std::string_view tensor);
  void append(const std::string& event_json);
  long long micros(Clock::time_point t) const;
  void close_file();

  const int rank_;
  const std::size_t max_bytes_;
  const std::function<void(const std::string&)> warn_;
  std::atomic<bool> active_{false};
  // Guards file_, path_, origin_, mark_cycles_, tids_, events_ and bytes_.
  mutable std::mutex mu_;
  std::FILE* file_ = nullptr;
  std::string path_;
  std::size_t bytes_ = 0;
  Clock::time_point origin_;
  bool mark_cycles_ = false;
  std::unordered_map<std::string, int> tids_;
  int events_ = 0;
};

// Escapes a string for a JSON string literal.
std::string json_escape(std::string_view s);

}  // namespace gyre::core
