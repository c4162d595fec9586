// Timeline (timeline.h): the trace-event file and its start and stop.
#include "runtime/timeline.h"

#include <cerrno>
#include <algorithm>
#include <cstring>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

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
  // O_NOFOLLOW: a symbolic link planted at the path (in a shared /tmp, say)
  // must not make gyre overwrite the file it points to. O_NONBLOCK: opening
  // a FIFO for writing would otherwise wait for ever for a reader (with no
  // reader it fails at once, ENXIO); anything but a regular file is refused
  // below, so the flag changes nothing for the file that is written. Mode
  // 0666 less the umask, as any file the user's programs create.
  const auto not_regular = [&](mode_t mode) {
    return InvalidArgument(fmt::format(
        "{}: cannot write the timeline to '{}': it is {}, not a regular file (choose a file "
        "path)",
        what, file,
        S_ISFIFO(mode)  ? "a FIFO"
        : S_ISDIR(mode) ? "a directory"
        : S_ISCHR(mode) ? "a character device"
        : S_ISBLK(mode) ? "a block device"
        : S_ISSOCK(mode) ? "a socket"
                         : "not a regular file"));
  };
  struct stat st{};
  if (::lstat(file.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode)) {
    throw not_regular(st.st_mode);
  }
  const int fd = ::open(file.c_str(),
                        O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0666);
  if (fd < 0) {
    const int err = errno;
    throw InvalidArgument(fmt::format(
        "{}: cannot create the timeline file '{}': {}", what, file,
        err == ELOOP ? std::string("it is a symbolic link, which gyre does not follow (remove it "
                                   "or choose another path)")
                     : std::string(std::strerror(err))));
  }
  // The path may have been replaced between lstat() and open().
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const mode_t mode = st.st_mode;
    ::close(fd);
    throw not_regular(mode);
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  file_ = ::fdopen(fd, "w");
  if (!file_) {
    const int err = errno;
    ::close(fd);
    throw InvalidArgument(fmt::format("{}: cannot create the timeline file '{}': {}", what, file,
                                      std::strerror(err)));
  }
  path_ = file;
  origin_ = Clock::now();
  mark_cycles_ = mark_cycles;
  tids_.clear();
  events_ = 0;
  std::fputs(kHead, file_);
  std::fputs(kTail, file_);
  std::fflush(file_);
  bytes_ = sizeof(kHead) - 1 + sizeof(kTail) - 1;
  append(fmt::format(
      R"({{"name":"process_name","ph":"M","pid":{},"tid":0,"args":{{"name":"gyre rank {}"}}}})",
      rank_, rank_));
  active_ = file_ != nullptr;  // a limit below one event stops at once
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

std::size_t Timeline::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

void Timeline::append(const std::string& event_json) {
  if (!file_) return;  // stopped at the size limit (tid_for then slice)
  const std::size_t grow = (events_ > 0 ? 2 : 0) + event_json.size();
  if (max_bytes_ > 0 && bytes_ + grow > max_bytes_) {
    // The file ends here, complete; the recording stops with one warning.
    const std::string why = fmt::format(
        "timeline: '{}' reached its size limit (GYRE_TIMELINE_MAX_BYTES={} bytes) after {} "
        "events; recording stopped, the file is complete JSON up to here",
        path_, max_bytes_, events_);
    close_file();
    if (warn_) warn_(why);
    return;
  }
  // Overwrite the closing "\n]}\n" with the event, then close again.
  std::fseek(file_, -static_cast<long>(sizeof(kTail) - 1), SEEK_END);
  if (events_ > 0) std::fputs(",\n", file_);
  std::fputs(event_json.c_str(), file_);
  std::fputs(kTail, file_);
  std::fflush(file_);
  bytes_ += grow;
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
  if (!file_) return;  // the size limit was reached
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

void Timeline::counter(std::string_view name, Clock::time_point t,
                       const std::vector<std::pair<std::string, double>>& series) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!file_ || t < origin_) return;
  std::string args;
  for (const auto& [k, v] : series) {
    if (!args.empty()) args += ',';
    args += fmt::format(R"("{}":{})", json_escape(k), v);
  }
  append(fmt::format(R"({{"name":"{}","cat":"gyre","ph":"C","ts":{},"pid":{},"args":{{{}}}}})",
                     json_escape(name), micros(t), rank_, args));
}

}  // namespace gyre::core
