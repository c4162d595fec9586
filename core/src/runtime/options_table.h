// The options table: every GYRE_* variable the runtime reads, one entry each,
// naming the Options field it sets, how its text is parsed and bounded, its
// default, whether every rank must share it and its doc line. Three readers,
// one table: Options::from_env(), the start-up check of Runtime (options
// agree between ranks and are within bounds) and the test that
// docs/environment.md lists exactly these entries.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "gyre/options.h"

namespace gyre::core {

// A whole number with an optional K, M or G suffix (binary multiples).
struct SizeOption {
  std::size_t Options::*field;
  std::size_t min, max;
};
// A finite decimal number (no NaN, no infinity).
struct RealOption {
  double Options::*field;
  double min, max;
};
// A whole number without suffix.
struct IntegerOption {
  long Options::*field;
  long min, max;
};
struct LogLevelOption {
  LogLevel Options::*field;
};
// Any text; an empty variable leaves the default (empty).
struct TextOption {
  std::string Options::*field;
};
using OptionKind = std::variant<SizeOption, RealOption, IntegerOption, LogLevelOption, TextOption>;

struct OptionSpec {
  std::string_view variable;  // GYRE_...
  std::string_view field;     // the member of Options it sets
  OptionKind kind;            // parser, bounds and the member itself
  // The default as docs/environment.md shows it; parsing it gives the
  // in-class default of the field (a unit test checks that).
  std::string_view default_text;
  // Each rank plans from its own copy what must match across ranks (fusion
  // buckets, ring chunks, the allreduce algorithm, cache slots, version-lag
  // and stall decisions), so these must be equal on every rank.
  bool same_on_every_rank;
  // The first sentence of the variable's row in docs/environment.md.
  std::string_view doc;
};

// The table, in the order of docs/environment.md.
std::span<const OptionSpec> option_table();

// GYRE_CYCLE_TIME_MS below this (0 included) counts as this: a cycle of 0
// would run negotiation rounds back to back, a core busy doing nothing.
inline constexpr double kMinCycleTimeMs = 0.1;

// The values spec accepts, as docs/environment.md shows them ("0 to 1024G").
std::string accepted_values(const OptionSpec& spec);

// Sets spec's field of `o` from the variable's text; throws InvalidArgument
// naming the variable, the text and what is accepted.
void parse_option(const OptionSpec& spec, std::string_view text, Options& o);

// Why spec's field of `o` is outside what the variable accepts (Options set
// in code bypass the parser), or nothing.
std::optional<std::string> option_problem(const OptionSpec& spec, const Options& o);

// The start-up check exchanges one 64-bit word per entry that is not text
// (option_words) between the ranks; options_problems() reads every rank's
// words (rank-major: words of rank 0, then rank 1, ...) and describes each
// value out of bounds and each option every rank must share that differs,
// naming the variable and the ranks' values; nothing if all is well. Every
// rank computes the same text from the same words.
std::size_t option_word_count();
std::vector<std::uint64_t> option_words(const Options& o);
std::optional<std::string> options_problems(std::span<const std::uint64_t> words, int ranks);

}  // namespace gyre::core
