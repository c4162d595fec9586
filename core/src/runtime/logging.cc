#include "runtime/logging.h"

#include <cstdio>

namespace gyre::core {

std::string_view level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace: return "TRACE";
    case LogLevel::kDebug: return "DEBUG";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kWarning: return "WARNING";
    case LogLevel::kError: return "ERROR";
    case LogLevel::kFatal: return "FATAL";
  }
  return "?";
}

void Logger::write(LogLevel level, const std::string& text) const {
  std::string line = fmt::format("[gyre {} {}] {}\n", rank_, level_name(level), text);
  // One fwrite per line: stdio locks the stream for the call, so lines from
  // the background thread and user threads stay whole.
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace gyre::core
