// The options table against its readers: the in-class defaults,
// Options::from_env(), the start-up check's description of differing and
// out-of-range options, and docs/environment.md (path from CMake).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gyre/error.h"
#include "gyre/options.h"
#include "runtime/options_table.h"

using namespace gyre;
using namespace gyre::core;

namespace {

std::vector<std::string> split_row(const std::string& line) {
  std::vector<std::string> cells;
  std::string cell;
  std::istringstream in(line);
  while (std::getline(in, cell, '|')) {
    const auto b = cell.find_first_not_of(' ');
    const auto e = cell.find_last_not_of(' ');
    cells.push_back(b == std::string::npos ? "" : cell.substr(b, e - b + 1));
  }
  // "| a | b |" -> "", "a", "b": drop the empty cell before the first bar.
  if (!cells.empty() && cells.front().empty()) cells.erase(cells.begin());
  return cells;
}

}  // namespace

TEST_CASE("options: every entry's default text parses to the field's in-class default",
          "[options]") {
  const Options defaults;
  for (const auto& spec : option_table()) {
    INFO(spec.variable);
    Options parsed;
    parsed.timeline_path = "not the default";
    parse_option(spec, spec.default_text, parsed);
    CHECK(option_words(parsed) == option_words(defaults));
    CHECK(parsed.timeline_path == (spec.field == "timeline_path" ? "" : "not the default"));
    CHECK_FALSE(option_problem(spec, defaults).has_value());
  }
}

TEST_CASE("options: from_env reads every entry of the table", "[options]") {
  for (const auto& spec : option_table()) {
    const std::string name(spec.variable);
    INFO(name);
    ::setenv(name.c_str(), "/not!a-value", 1);
    if (const auto* text = std::get_if<TextOption>(&spec.kind)) {  // any text is taken
      CHECK(Options::from_env().*(text->field) == "/not!a-value");
    } else {
      CHECK_THROWS_WITH(Options::from_env(), Catch::Contains(name + "='/not!a-value'"));
    }
    ::unsetenv(name.c_str());
  }
}

TEST_CASE("options: docs/environment.md lists exactly the table's entries", "[options][docs]") {
  std::ifstream in(GYRE_ENVIRONMENT_MD);
  REQUIRE(in.good());
  const std::string header = "| variable | default | same on every rank | accepted | meaning |";
  std::string line;
  bool found = false;
  while (std::getline(in, line)) {
    if (line == header) {
      found = true;
      break;
    }
  }
  REQUIRE(found);
  std::getline(in, line);  // |---|---|...
  std::vector<std::vector<std::string>> rows;
  while (std::getline(in, line) && line.rfind("|", 0) == 0) rows.push_back(split_row(line));

  const auto table = option_table();
  REQUIRE(rows.size() == table.size());
  for (std::size_t i = 0; i < table.size(); ++i) {
    const auto& spec = table[i];
    const auto& row = rows[i];
    INFO("row " << i + 1 << ": " << spec.variable);
    REQUIRE(row.size() == 5);
    CHECK(row[0] == "`" + std::string(spec.variable) + "`");
    if (spec.default_text.empty()) {
      CHECK(row[1].rfind("empty", 0) == 0);
    } else {
      CHECK(row[1] == "`" + std::string(spec.default_text) + "`");
    }
    CHECK(row[2] == (spec.same_on_every_rank ? "yes" : "no"));
    CHECK(row[3] == accepted_values(spec));
    CHECK(row[4].rfind(std::string(spec.doc), 0) == 0);
  }
}

TEST_CASE("options: the start-up check names differing shared options and values out of range",
          "[options]") {
  Options a, b, c;
  const std::size_t k = option_word_count();
  auto words_of = [&](std::initializer_list<const Options*> ranks) {
    std::vector<std::uint64_t> all;
    for (const Options* o : ranks) {
      auto w = option_words(*o);
      REQUIRE(w.size() == k);
      all.insert(all.end(), w.begin(), w.end());
    }
    return all;
  };
  CHECK_FALSE(options_problems(words_of({&a, &b, &c}), 3).has_value());

  b.cycle_time_ms = 3;          // each rank may have its own
  b.stall_shutdown_s = -0.0;    // equal to 0 as a value
  a.stall_shutdown_s = 0.0;
  c.stall_shutdown_s = 0.0;
  CHECK_FALSE(options_problems(words_of({&a, &b, &c}), 3).has_value());

  c.fusion_threshold_bytes = 1 << 20;
  b.spin_wait_us = -1;
  const auto why = options_problems(words_of({&a, &b, &c}), 3);
  REQUIRE(why.has_value());
  CHECK_THAT(*why, Catch::Contains("GYRE_FUSION_THRESHOLD (rank 0: 67108864, rank 1: 67108864, "
                                   "rank 2: 1048576)"));
  CHECK_THAT(*why, Catch::Contains("GYRE_SPIN_WAIT_US on rank 1: -1 is out of range (accepted: "
                                   "0 to 10000000)"));
  CHECK_THAT(*why, !Catch::Contains("GYRE_CYCLE_TIME_MS"));
  CHECK_THROWS_AS(options_problems(words_of({&a, &b}), 3), InvalidArgument);
}
