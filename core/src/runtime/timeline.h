// Timeline: a Chrome trace-event JSON file of what happened to each tensor
// (QUEUE, NEGOTIATE, MEMCPY_IN_FUSION_BUFFER, ALLREDUCE or the other
// collectives, MEMCPY_OUT_FUSION_BUFFER),
// viewable in Perfetto or chrome://tracing.
//
// Events are complete ("X") events with microsecond timestamps relative to
// the timeline's start; pid is the rank and each tensor gets its own tid
// (named by an "M" metadata event), so slices of one tensor never overlap
// on a track. The file is valid JSON after every event: the closing "]}" is
// written after each event and overwritten by the next one.
//
// Thread: background thread only.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>
#include <string_view>
#include <unordered_map>

namespace gyre::core {

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;

  // Throws InvalidArgument if the file cannot be created.
  Timeline(const std::string& path, int rank);
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // One slice [start, end) named `phase` on the track of `tensor`.
  void slice(std::string_view tensor, std::string_view phase, Clock::time_point start,
             Clock::time_point end, std::string_view args_json = {});
  int events() const { return events_; }

 private:
  int tid_for(std::string_view tensor);
  void append(const std::string& event_json);
  long long micros(Clock::time_point t) const;

  std::FILE* file_ = nullptr;
  int rank_;
  Clock::time_point origin_;
  std::unordered_map<std::string, int> tids_;
  int events_ = 0;
};

// Escapes a string for a JSON string literal.
std::string json_escape(std::string_view s);

}  // namespace gyre::core
