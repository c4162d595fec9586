// Logging through fmt, one line per call on stderr, prefixed with the rank
// and the level: "[gyre 1 WARNING] tensor 'w' ...".
//
// A Logger belongs to one runtime instance (its rank and level are fixed at
// init); it is called from the background thread and from user threads.
// Each line is written with one fwrite so lines from several threads do not
// interleave.
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "gyre/options.h"

namespace gyre::core {

std::string_view level_name(LogLevel level);

class Logger {
 public:
  Logger() = default;
  Logger(int rank, LogLevel level) : rank_(rank), level_(level) {}

  bool enabled(LogLevel level) const { return level >= level_; }

  template <typename... Args>
  void log(LogLevel level, fmt::format_string<Args...> f, Args&&... args) const {
    if (!enabled(level)) return;
    write(level, fmt::format(f, std::forward<Args>(args)...));
  }
  template <typename... Args>
  void debug(fmt::format_string<Args...> f, Args&&... args) const {
    log(LogLevel::kDebug, f, std::forward<Args>(args)...);
  }
  template <typename... Args>
  void info(fmt::format_string<Args...> f, Args&&... args) const {
    log(LogLevel::kInfo, f, std::forward<Args>(args)...);
  }
  template <typename... Args>
  void warn(fmt::format_string<Args...> f, Args&&... args) const {
    log(LogLevel::kWarning, f, std::forward<Args>(args)...);
  }
  template <typename... Args>
  void error(fmt::format_string<Args...> f, Args&&... args) const {
    log(LogLevel::kError, f, std::forward<Args>(args)...);
  }

 private:
  void write(LogLevel level, const std::string& text) const;

  int rank_ = 0;
  LogLevel level_ = LogLevel::kWarning;
};

}  // namespace gyre::core
