// Options::from_env: the only place gyre reads environment variables.
#include <cerrno>
#include <cstdlib>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "gyre/error.h"
#include "gyre/options.h"

namespace gyre {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

double parse_double(const char* name, const char* text, double min) {
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(text, &end);
  if (errno != 0 || end == text || *end != '\0' || v < min) {
    throw InvalidArgument(fmt::format("{}='{}' is not a number >= {}", name, text, min));
  }
  return v;
}

// Sizes accept a K, M or G suffix (binary multiples): GYRE_FUSION_THRESHOLD=64M.
std::size_t parse_bytes(const char* name, const char* text) {
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(text, &end, 10);
  if (errno != 0 || end == text || text[0] == '-') {
    throw InvalidArgument(fmt::format("{}='{}' is not a byte count", name, text));
  }
  std::string_view suffix(end);
  unsigned shift = 0;
  if (suffix == "K" || suffix == "k" || suffix == "KiB") shift = 10;
  else if (suffix == "M" || suffix == "m" || suffix == "MiB") shift = 20;
  else if (suffix == "G" || suffix == "g" || suffix == "GiB") shift = 30;
  else if (!suffix.empty()) {
    throw InvalidArgument(fmt::format("{}='{}' has an unknown unit (use K, M or G)", name, text));
  }
  return static_cast<std::size_t>(v) << shift;
}

LogLevel parse_level(const char* name, const char* text) {
  std::string_view s(text);
  if (s == "trace") return LogLevel::kTrace;
  if (s == "debug") return LogLevel::kDebug;
  if (s == "info") return LogLevel::kInfo;
  if (s == "warning" || s == "warn") return LogLevel::kWarning;
  if (s == "error") return LogLevel::kError;
  if (s == "fatal") return LogLevel::kFatal;
  throw InvalidArgument(fmt::format(
      "{}='{}' is not a log level (trace, debug, info, warning, error, fatal)", name, text));
}

}  // namespace

Options Options::from_env() {
  Options o;
  if (auto v = env("GYRE_FUSION_THRESHOLD")) o.fusion_threshold_bytes = parse_bytes("GYRE_FUSION_THRESHOLD", v);
  if (auto v = env("GYRE_FUSION_MAX_TENSOR")) o.fusion_max_tensor_bytes = parse_bytes("GYRE_FUSION_MAX_TENSOR", v);
  if (auto v = env("GYRE_CYCLE_TIME_MS")) o.cycle_time_ms = parse_double("GYRE_CYCLE_TIME_MS", v, 0.0);
  if (auto v = env("GYRE_SPIN_WAIT_US")) o.spin_wait_us = parse_double("GYRE_SPIN_WAIT_US", v, 0.0);
  if (auto v = env("GYRE_CACHE_CAPACITY")) o.cache_capacity = parse_bytes("GYRE_CACHE_CAPACITY", v);
  if (auto v = env("GYRE_RING_CHUNK_BYTES")) {
    o.ring_chunk_bytes = parse_bytes("GYRE_RING_CHUNK_BYTES", v);
    if (o.ring_chunk_bytes == 0) throw InvalidArgument("GYRE_RING_CHUNK_BYTES must be > 0");
  }
  if (auto v = env("GYRE_ALLREDUCE_SMALL_BYTES")) {
    o.allreduce_small_bytes = parse_bytes("GYRE_ALLREDUCE_SMALL_BYTES", v);
  }
  if (auto v = env("GYRE_TIMELINE")) o.timeline_path = v;
  if (auto v = env("GYRE_LOG_LEVEL")) o.log_level = parse_level("GYRE_LOG_LEVEL", v);
  if (auto v = env("GYRE_STALL_WARNING_S")) o.stall_warning_s = parse_double("GYRE_STALL_WARNING_S", v, 0.0);
  if (auto v = env("GYRE_STALL_SHUTDOWN_S")) o.stall_shutdown_s = parse_double("GYRE_STALL_SHUTDOWN_S", v, 0.0);
  if (auto v = env("GYRE_OP_TIMEOUT_S")) o.op_timeout_s = parse_double("GYRE_OP_TIMEOUT_S", v, 0.0);
  if (auto v = env("GYRE_MAX_VERSION_LAG")) o.max_version_lag = static_cast<long>(parse_double("GYRE_MAX_VERSION_LAG", v, 0.0));
  return o;
}

}  // namespace gyre
