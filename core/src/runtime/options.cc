// The options table (see options_table.h), its parsers and bounds, and
// Options::from_env: the only place gyre reads environment variables.
#include <bit>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "gyre/error.h"
#include "gyre/options.h"
#include "runtime/options_table.h"

namespace gyre::core {
namespace {

constexpr std::size_t kKiB = std::size_t{1} << 10;
constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGiB = std::size_t{1} << 30;
// Bounds wide enough for any real job, narrow enough that no value overflows
// where it is used: byte counts summed or aligned, durations in seconds
// converted to microseconds in a long, cache slots numbered in 32 bits.
constexpr std::size_t kMaxBytes = 1024 * kGiB;
constexpr std::size_t kMaxChunkBytes = kGiB;
constexpr std::size_t kMaxCacheEntries = 16 * kMiB;
constexpr double kMaxSeconds = 1e7;         // about 115 days
constexpr double kMaxCycleMs = 60000;       // a minute between idle rounds
constexpr double kMaxSpinUs = 1e7;          // ten seconds: spinning always
constexpr long kMaxVersionLag = 1000000000;
constexpr long kMaxRanks = 1 << 24;

using O = Options;
// clang-format off
const OptionSpec kTable[] = {
  {"GYRE_FUSION_THRESHOLD", "fusion_threshold_bytes",
   SizeOption{&O::fusion_threshold_bytes, 0, kMaxBytes}, "64M", true,
   "Largest fusion buffer in bytes."},
  {"GYRE_FUSION_MAX_TENSOR", "fusion_max_tensor_bytes",
   SizeOption{&O::fusion_max_tensor_bytes, 0, kMaxBytes}, "1M", true,
   "Only allreduces of at most this many bytes are copied into a fusion buffer; larger tensors "
   "are reduced in place from the caller's buffers."},
  {"GYRE_CYCLE_TIME_MS", "cycle_time_ms",
   RealOption{&O::cycle_time_ms, 0, kMaxCycleMs}, "1", false,
   "Longest the background thread sleeps between negotiation rounds when nothing is enqueued."},
  {"GYRE_SPIN_WAIT_US", "spin_wait_us",
   RealOption{&O::spin_wait_us, 0, kMaxSpinUs}, "100", false,
   "How long the background thread polls a pending transfer (negotiation message or ring chunk) "
   "before it sleeps between polls, in naps of 5 µs doubling up to 200 µs; also how long it "
   "polls for the caller's next operation after a round that ran operations, before it sleeps "
   "until an enqueue wakes it, and how long a shared-memory barrier polls before it sleeps on "
   "a futex until the peer arrives. With more ranks on the host than cores, neither the queue "
   "nor a barrier polls."},
  {"GYRE_CACHE_CAPACITY", "cache_capacity",
   SizeOption{&O::cache_capacity, 0, kMaxCacheEntries}, "1024", true,
   "Entries of the response cache."},
  {"GYRE_LOG_NEGOTIATION", "log_negotiation",
   IntegerOption{&O::log_negotiation, 0, 1}, "1", true,
   "1 decides a negotiation round in which every rank's requests are response-cache hits at "
   "one committed step by a log-depth exchange, 0 always by the full exchange."},
  {"GYRE_HOST_NEGOTIATION", "host_negotiation",
   IntegerOption{&O::host_negotiation, 0, 1}, "1", true,
   "1 combines a log-depth negotiation round within each host over shared memory first, then "
   "among one rank per host, in a job across hosts of several ranks each; 0 over every rank."},
  {"GYRE_SPECULATE_BYTES", "speculate_bytes",
   SizeOption{&O::speculate_bytes, 0, 64u << 10}, "16K", true,
   "An allreduce of host memory of at most this many bytes (and of the largest the backend "
   "reduces by recursive doubling; over shared memory of 64) that every rank submits as a "
   "response-cache hit is reduced within the log-depth negotiation round itself, with no "
   "collective after it; 0 never."},
  {"GYRE_RING_CHUNK_BYTES", "ring_chunk_bytes",
   SizeOption{&O::ring_chunk_bytes, 1, kMaxChunkBytes}, "256K", true,
   "Pipelined chunk size of the ring algorithms (allreduce, allgather, broadcast, "
   "reduce-scatter), also used for the negotiation allgather."},
  {"GYRE_ALLREDUCE_SMALL_BYTES", "allreduce_small_bytes",
   SizeOption{&O::allreduce_small_bytes, 0, kMaxBytes}, "64K", true,
   "An allreduce (one tensor, or one fused bucket) of at most this many bytes uses recursive "
   "doubling (or, under GYRE_RABENSEIFNER_ALLREDUCE=-1, Rabenseifner's algorithm where the "
   "cost model predicts it faster), a larger one the ring."},
  {"GYRE_RABENSEIFNER_ALLREDUCE", "rabenseifner_allreduce",
   IntegerOption{&O::rabenseifner_allreduce, -1, 1}, "-1", true,
   "Above `GYRE_ALLREDUCE_SMALL_BYTES`: 1 reduces host tensors with Rabenseifner's algorithm, 0 "
   "with the ring, -1 chooses."},
  {"GYRE_SHM", "shared_memory",
   IntegerOption{&O::shared_memory, 0, 1}, "1", true,
   "1 runs the collectives of CPU tensors over shared memory when every rank of the job is on "
   "one host; 0 keeps the ring over MPI."},
  {"GYRE_SHM_SLOT_BYTES", "shm_slot_bytes",
   SizeOption{&O::shm_slot_bytes, 4096, kMaxChunkBytes}, "256K", true,
   "Bytes of each rank's slot in the shared-memory segment: the chunk of the shared-memory "
   "collectives."},
  {"GYRE_SHM_POOL_BYTES", "shm_pool_bytes",
   SizeOption{&O::shm_pool_bytes, 0, kMaxBytes}, "0", true,
   "Bytes of each rank's part of the host's shared pool (in the shared-memory segment, "
   "allocated at init): gyre::alloc_shared takes buffers from it, and an allreduce in place "
   "of such buffers, one per rank, from 64 KiB, reduces them straight from one another "
   "without copies through the slots. 0: no pool."},
  {"GYRE_HIERARCHICAL_ALLREDUCE", "hierarchical_allreduce",
   IntegerOption{&O::hierarchical_allreduce, -1, 1}, "-1", true,
   "When the job spans hosts that each hold the same number (more than one) of ranks: 1 reduces "
   "host tensors hierarchically, 0 with one flat ring, -1 chooses."},
  {"GYRE_HIERARCHICAL_PIPELINE", "hierarchical_pipeline",
   IntegerOption{&O::hierarchical_pipeline, -1, 64}, "-1", true,
   "The hierarchical allreduce cut into this many pieces, pipelined: the shared-memory passes "
   "of one piece run beside the network phase of another. 0 or 1: not pipelined; -1 chooses."},
  {"GYRE_LINK_PROBE", "link_probe",
   IntegerOption{&O::link_probe, 0, 1}, "0", true,
   "1 measures the cost model's network and shared-memory parameters at start-up on the job's "
   "own links (a job across hosts of several ranks each; across hosts of one rank each, the "
   "network alone); 0 keeps the built-in ones."},
  {"GYRE_LINK_PROBE_CACHE", "link_probe_cache",
   TextOption{&O::link_probe_cache}, "", false,
   "A file rank 0 reads the link parameters from (its line for this layout) instead of "
   "measuring them, and writes them to after measuring."},
  {"GYRE_AUTOTUNE", "autotune",
   IntegerOption{&O::autotune, 0, 1}, "0", true,
   "1 times the flat and the hierarchical allreduce on the job's own calls where "
   "`GYRE_HIERARCHICAL_ALLREDUCE` is -1: in each size class from 256 KiB (buffers of 2^k to "
   "2^(k+1) bytes) the first call warms up, the next four run the cost model's choice, the "
   "other form twice and the model's again (four more while the two are within 10 % of each "
   "other, up to 12); the slowest rank's mean times, agreed by an allreduce, then choose for "
   "the rest of the job. 0 leaves the choice to the cost model."},
  {"GYRE_HIERARCHICAL_ALLGATHER", "hierarchical_allgather",
   IntegerOption{&O::hierarchical_allgather, -1, 1}, "-1", true,
   "When the job spans hosts that each hold the same number (more than one) of ranks: 1 gathers "
   "host tensors hierarchically, 0 with one flat ring, -1 chooses."},
  {"GYRE_TIMELINE", "timeline_path",
   TextOption{&O::timeline_path}, "", false,
   "Path of a Chrome trace-event JSON file (open in Perfetto or `chrome://tracing`)."},
  {"GYRE_TIMELINE_MAX_BYTES", "timeline_max_bytes",
   SizeOption{&O::timeline_max_bytes, 0, kMaxBytes}, "1G", false,
   "Largest size of a timeline file in bytes."},
  {"GYRE_LOG_LEVEL", "log_level",
   LogLevelOption{&O::log_level}, "warning", false,
   "Least severity of the lines gyre writes to stderr."},
  {"GYRE_STALL_WARNING_S", "stall_warning_s",
   RealOption{&O::stall_warning_s, 0, kMaxSeconds}, "60", false,
   "A rank warns about a tensor it enqueued this many seconds ago that other ranks have not "
   "enqueued, naming the tensor and the missing ranks (again every period while it lasts)."},
  {"GYRE_STALL_SHUTDOWN_S", "stall_shutdown_s",
   RealOption{&O::stall_shutdown_s, 0, kMaxSeconds}, "600", true,
   "After this many seconds a stalled tensor fails with `TimeoutError` on every rank, naming the "
   "ranks that never enqueued it."},
  {"GYRE_OP_TIMEOUT_S", "op_timeout_s",
   RealOption{&O::op_timeout_s, 0, kMaxSeconds}, "300", false,
   "Deadline for any single transfer of the background thread (negotiation or data)."},
  {"GYRE_CALLER_ROUNDS", "caller_rounds",
   IntegerOption{&O::caller_rounds, 0, 1}, "1", false,
   "1: a thread that waits for an operation (C++ `Handle::wait()`; Python's blocking calls, "
   "except with fault tolerance on) runs the negotiation rounds itself when no other thread of its rank is running one, instead of waiting for the "
   "background thread to run them and wake it."},
  {"GYRE_P2P_ON_COORDINATOR", "p2p_on_coordinator",
   IntegerOption{&O::p2p_on_coordinator, 0, 1}, "0", false,
   "1: point-to-point operations (`send_async`, `recv_async`) are driven by the world runtime's "
   "background loop, between its negotiation rounds, instead of by a thread of their own."},
  {"GYRE_MAX_VERSION_LAG", "max_version_lag",
   IntegerOption{&O::max_version_lag, 0, kMaxVersionLag}, "0", true,
   "Largest difference in committed steps (`commit_step()`) allowed between the requests of one "
   "tensor."},
  {"GYRE_ELASTIC_MIN_NP", "elastic_min_np",
   IntegerOption{&O::elastic_min_np, 1, kMaxRanks}, "1", true,
   "The fewest ranks an elastic job goes on with after a rank's failure (Horovod's `--min-np`)."},
  {"GYRE_ELASTIC_MAX_NP", "elastic_max_np",
   IntegerOption{&O::elastic_max_np, 0, kMaxRanks}, "0", true,
   "The most ranks `GYRE_ELASTIC_RESPAWN` grows an elastic job back to (Horovod's `--max-np`)."},
  {"GYRE_ELASTIC_RESPAWN", "elastic_respawn",
   IntegerOption{&O::elastic_respawn, 0, 1}, "0", true,
   "1: after a rank's failure, `rebuild()` starts replacement ranks with `MPI_Comm_spawn` and "
   "merges them into the world."},
  {"GYRE_ELASTIC_HOST_DISCOVERY_SCRIPT", "elastic_host_discovery_script",
   TextOption{&O::elastic_host_discovery_script}, "", false,
   "A command printing `host:slots` lines (Horovod's `--host-discovery-script`): where "
   "`GYRE_ELASTIC_RESPAWN` starts replacement ranks."},
  {"GYRE_ELASTIC_RECOVERY_TIMEOUT_S", "elastic_recovery_timeout_s",
   RealOption{&O::elastic_recovery_timeout_s, 0, kMaxSeconds}, "120", false,
   "Deadline of one `rebuild()`: past it, a survivor whose recovery is still blocked inside MPI "
   "logs the step it was blocked in and exits with status 1."},
};
// clang-format on

constexpr std::string_view kLevelNames[] = {"trace", "debug", "info", "warning", "error", "fatal"};

template <class... F>
struct Overload : F... {
  using F::operator()...;
};

// 1024 -> "1K", 3 << 20 -> "3M": sizes as a user writes them.
std::string size_text(std::size_t v) {
  if (v != 0 && v % kGiB == 0) return fmt::format("{}G", v / kGiB);
  if (v != 0 && v % kMiB == 0) return fmt::format("{}M", v / kMiB);
  if (v != 0 && v % kKiB == 0) return fmt::format("{}K", v / kKiB);
  return fmt::format("{}", v);
}

[[noreturn]] void refuse(const OptionSpec& s, std::string_view text, std::string_view why) {
  throw InvalidArgument(fmt::format("{}='{}' {}", s.variable, text, why));
}

[[noreturn]] void refuse_range(const OptionSpec& s, std::string_view text) {
  refuse(s, text, fmt::format("is out of range (accepted: {})", accepted_values(s)));
}

// from_chars reads no sign on unsigned types, no leading space, no "+"; the
// whole text must be used, so nothing trails.
std::size_t parse_size(const OptionSpec& s, const SizeOption& k, std::string_view text) {
  const char* first = text.data();
  const char* last = first + text.size();
  std::uint64_t v = 0;
  auto [end, ec] = std::from_chars(first, last, v);
  if (end == first) refuse(s, text, "is not a whole number with an optional K, M or G suffix");
  if (ec == std::errc::result_out_of_range) refuse_range(s, text);
  const std::string_view suffix(end, static_cast<std::size_t>(last - end));
  unsigned shift = 0;
  if (suffix == "K" || suffix == "k" || suffix == "KiB") shift = 10;
  else if (suffix == "M" || suffix == "m" || suffix == "MiB") shift = 20;
  else if (suffix == "G" || suffix == "g" || suffix == "GiB") shift = 30;
  else if (!suffix.empty()) refuse(s, text, "has an unknown unit (use K, M or G)");
  if (v > (std::numeric_limits<std::uint64_t>::max() >> shift)) refuse_range(s, text);
  v <<= shift;
  if (v < k.min || v > k.max) refuse_range(s, text);
  return static_cast<std::size_t>(v);
}

double parse_real(const OptionSpec& s, const RealOption& k, std::string_view text) {
  const char* first = text.data();
  const char* last = first + text.size();
  double v = 0;
  auto [end, ec] = std::from_chars(first, last, v);
  if (end == first || end != last) refuse(s, text, "is not a number");
  if (ec == std::errc::result_out_of_range || !std::isfinite(v) || v < k.min || v > k.max) {
    refuse_range(s, text);
  }
  return v == 0 ? 0.0 : v;  // -0 is 0: the ranks compare values
}

long parse_integer(const OptionSpec& s, const IntegerOption& k, std::string_view text) {
  const char* first = text.data();
  const char* last = first + text.size();
  long v = 0;
  auto [end, ec] = std::from_chars(first, last, v);
  if (end == first || end != last) refuse(s, text, "is not a whole number");
  if (ec == std::errc::result_out_of_range || v < k.min || v > k.max) refuse_range(s, text);
  return v;
}

LogLevel parse_level(const OptionSpec& s, std::string_view text) {
  if (text == "warn") return LogLevel::kWarning;
  for (std::size_t i = 0; i < std::size(kLevelNames); ++i) {
    if (text == kLevelNames[i]) return static_cast<LogLevel>(i);
  }
  refuse(s, text, fmt::format("is not a log level ({})", accepted_values(s)));
}

// The field's value as messages show it.
std::string value_text(const OptionSpec& s, const Options& o) {
  return std::visit(
      Overload{[&](const SizeOption& k) { return fmt::format("{}", o.*k.field); },
               [&](const RealOption& k) { return fmt::format("{}", o.*k.field); },
               [&](const IntegerOption& k) { return fmt::format("{}", o.*k.field); },
               [&](const LogLevelOption& k) {
                 const auto i = static_cast<std::size_t>(o.*k.field);
                 return i < std::size(kLevelNames) ? std::string(kLevelNames[i])
                                                   : fmt::format("level {}", i);
               },
               [&](const TextOption& k) { return fmt::format("'{}'", o.*k.field); }},
      s.kind);
}

bool is_text(const OptionSpec& s) { return std::holds_alternative<TextOption>(s.kind); }

// One word per entry that is not text, and back.
std::uint64_t to_word(const OptionSpec& s, const Options& o) {
  return std::visit(
      Overload{[&](const SizeOption& k) -> std::uint64_t { return o.*k.field; },
               [&](const RealOption& k) { return std::bit_cast<std::uint64_t>(o.*k.field); },
               [&](const IntegerOption& k) {
                 return static_cast<std::uint64_t>(static_cast<std::int64_t>(o.*k.field));
               },
               [&](const LogLevelOption& k) { return static_cast<std::uint64_t>(o.*k.field); },
               [&](const TextOption&) -> std::uint64_t { return 0; }},
      s.kind);
}

void from_word(const OptionSpec& s, std::uint64_t w, Options& o) {
  std::visit(Overload{[&](const SizeOption& k) { o.*k.field = static_cast<std::size_t>(w); },
                      [&](const RealOption& k) { o.*k.field = std::bit_cast<double>(w); },
                      [&](const IntegerOption& k) {
                        o.*k.field = static_cast<long>(static_cast<std::int64_t>(w));
                      },
                      [&](const LogLevelOption& k) { o.*k.field = static_cast<LogLevel>(w); },
                      [&](const TextOption&) {}},
             s.kind);
}

bool same_value(const OptionSpec& s, const Options& a, const Options& b) {
  // Doubles by value (0 and -0 are equal); everything else by its word.
  if (const auto* k = std::get_if<RealOption>(&s.kind)) return a.*k->field == b.*k->field;
  return to_word(s, a) == to_word(s, b);
}

}  // namespace

std::span<const OptionSpec> option_table() { return kTable; }

std::string accepted_values(const OptionSpec& spec) {
  return std::visit(
      Overload{[](const SizeOption& k) {
                 return fmt::format("{} to {}", size_text(k.min), size_text(k.max));
               },
               [](const RealOption& k) { return fmt::format("{} to {}", k.min, k.max); },
               [](const IntegerOption& k) { return fmt::format("{} to {}", k.min, k.max); },
               [](const LogLevelOption&) {
                 return std::string("trace, debug, info, warning (or warn), error, fatal");
               },
               [](const TextOption&) { return std::string("any path"); }},
      spec.kind);
}

void parse_option(const OptionSpec& spec, std::string_view text, Options& o) {
  std::visit(Overload{[&](const SizeOption& k) { o.*k.field = parse_size(spec, k, text); },
                      [&](const RealOption& k) { o.*k.field = parse_real(spec, k, text); },
                      [&](const IntegerOption& k) { o.*k.field = parse_integer(spec, k, text); },
                      [&](const LogLevelOption& k) { o.*k.field = parse_level(spec, text); },
                      [&](const TextOption& k) { o.*k.field = std::string(text); }},
             spec.kind);
}

std::optional<std::string> option_problem(const OptionSpec& spec, const Options& o) {
  const bool ok = std::visit(
      Overload{[&](const SizeOption& k) { return o.*k.field >= k.min && o.*k.field <= k.max; },
               [&](const RealOption& k) {
                 const double v = o.*k.field;
                 return std::isfinite(v) && v >= k.min && v <= k.max;
               },
               [&](const IntegerOption& k) { return o.*k.field >= k.min && o.*k.field <= k.max; },
               [&](const LogLevelOption& k) {
                 return static_cast<std::size_t>(o.*k.field) < std::size(kLevelNames);
               },
               [&](const TextOption&) { return true; }},
      spec.kind);
  if (ok) return std::nullopt;
  return fmt::format("{} is out of range (accepted: {})", value_text(spec, o),
                     accepted_values(spec));
}

std::size_t option_word_count() {
  std::size_t n = 0;
  for (const auto& s : kTable) n += is_text(s) ? 0 : 1;
  return n;
}

std::vector<std::uint64_t> option_words(const Options& o) {
  std::vector<std::uint64_t> out;
  for (const auto& s : kTable) {
    if (!is_text(s)) out.push_back(to_word(s, o));
  }
  return out;
}

std::optional<std::string> options_problems(std::span<const std::uint64_t> words, int ranks) {
  const std::size_t k = option_word_count();
  const auto n = static_cast<std::size_t>(ranks);
  if (words.size() != k * n) {
    throw InvalidArgument(fmt::format("options check: {} words for {} ranks of {} options",
                                      words.size(), ranks, k));
  }
  std::vector<Options> of(n);
  for (std::size_t r = 0; r < n; ++r) {
    std::size_t w = 0;
    for (const auto& s : kTable) {
      if (!is_text(s)) from_word(s, words[r * k + w++], of[r]);
    }
  }
  std::vector<std::string> invalid, differ;
  for (const auto& s : kTable) {
    if (is_text(s)) continue;
    for (std::size_t r = 0; r < n; ++r) {
      if (auto why = option_problem(s, of[r])) {
        invalid.push_back(fmt::format("{} on rank {}: {}", s.variable, r, *why));
      }
    }
    if (!s.same_on_every_rank) continue;
    bool same = true;
    for (std::size_t r = 1; r < n; ++r) same = same && same_value(s, of[r], of[0]);
    if (same) continue;
    std::vector<std::string> values;
    for (std::size_t r = 0; r < n; ++r) {
      values.push_back(fmt::format("rank {}: {}", r, value_text(s, of[r])));
    }
    differ.push_back(fmt::format("{} ({})", s.variable, fmt::join(values, ", ")));
  }
  std::vector<std::string> parts;
  if (!invalid.empty()) {
    parts.push_back(fmt::format("options out of range: {}", fmt::join(invalid, "; ")));
  }
  if (!differ.empty()) {
    parts.push_back(fmt::format("options differ between ranks, and every rank must use the same: {}",
                                fmt::join(differ, "; ")));
  }
  if (parts.empty()) return std::nullopt;
  return fmt::format("gyre::init(): {}", fmt::join(parts, ". "));
}

}  // namespace gyre::core

namespace gyre {

Options Options::from_env() {
  Options o;
  for (const auto& spec : core::option_table()) {
    const char* v = std::getenv(std::string(spec.variable).c_str());
    if (v && *v) core::parse_option(spec, v, o);  // empty: as if unset
  }
  return o;
}

}  // namespace gyre
