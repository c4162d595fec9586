// Timeline (timeline.h): the trace-event file and its start and stop.
#include "runtime/timeline.h"

#include <cerrno>
#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "gyre/error.h"

namespace gyre::core {

namespace {
constexpr char kHead[] = "{\"traceEvents\":[\n";
constexpr char kTail[] = "\n]}\n";
}  // namespace

std::string json_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(static_cast<unsigned char>(c)));
        } else {
          out += c;
        }
    }
  }
  return out;
}

Timeline::~Timeline() { stop(); }

void Timeline::start(const std::string& path, bool mark_cycles, std::string_view what) {
  std::string file = path;
  const auto pos = file.find("{rank}");
  if (pos != std::string::npos) file.replace(pos, 6, std::to_string(rank_));
  std::lock_guard<std::mutex> lock(mu_);
  close_file();
  if (pos == std::string::npos && rank_ != 0) return;  // one file: rank 0's view
  file_ = std::fopen(file.c_str(), "w");
  if (!file_) {
    throw InvalidArgument(fmt::format("{}: cannot create the timeline file '{}': {}", what, file,
                                      std::strerror(errno)));
  }
  origin_ = Clock::now();
  mark_cycles_ = mark_cycles;
  tids_.clear();
  events_ = 0;
  std::fputs(kHead, file_);
  std::fputs(kTail, file_);
  std::fflush(file_);
  append(fmt::format(
      R"({{"name":"process_name","ph":"M","pid":{},"tid":0,"args":{{"name":"gyre rank {}"}}}})",
      rank_, rank_));
  active_ = true;
}

void Timeline::stop() {
  std::lock_guard<std::mutex> lock(mu_);
  close_file();
}

void Timeline::close_file() {
  active_ = false;
  if (file_) std::fclose(file_);
  file_ = nullptr;
}

int Timeline::events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_;
}

long long Timeline::micros(Clock::time_point t) const {
  return std::chrono::duration_cast<std::chrono::microseconds>(t - origin_).count();
}

void Timeline::append(const std::string& event_json) {
  // Overwrite the closing "\n]}\n" with the event, then close again.
  std::fseek(file_, -static_cast<long>(sizeof(kTail) - 1), SEEK_END);
  if (events_ > 0) std::fputs(",\n", file_);
  std::fputs(event_json.c_str(), file_);
  std::fputs(kTail, file_);
  std::fflush(file_);
  ++events_;
}

int Timeline::tid_for(std::string_view tensor) {
  auto it = tids_.find(std::string(tensor));
  if (it != tids_.end()) return it->second;
  int tid = static_cast<int>(tids_.size()) + 1;
  tids_.emplace(std::string(tensor), tid);
  append(fmt::format(R"({{"name":"thread_name","ph":"M","pid":{},"tid":{},"args":{{"name":"{}"}}}})",
                     rank_, tid, json_escape(tensor)));
  return tid;
}

void Timeline::slice(std::string_view tensor, std::string_view phase, Clock::time_point start,
                     Clock::time_point end, std::string_view args_json) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!file_ || end < origin_) return;  // not recording, or over before it started
  int tid = tid_for(tensor);
  long long ts = micros(std::max(start, origin_));
  long long dur = std::max(0LL, micros(end) - ts);
  append(fmt::format(R"({{"name":"{}","cat":"gyre","ph":"X","ts":{},"dur":{},"pid":{},"tid":{}{}}})",
                     json_escape(phase), ts, dur, rank_, tid,
                     args_json.empty() ? std::string() : fmt::format(",\"args\":{}", args_json)));
}

void Timeline::mark_cycle(Clock::time_point t) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!file_ || !mark_cycles_ || t < origin_) return;
  append(fmt::format(R"({{"name":"CYCLE_START","cat":"gyre","ph":"i","s":"p","ts":{},"pid":{},"tid":0}})",
                     micros(t), rank_));
}

}  // namespace gyre::core
