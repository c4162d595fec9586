#!/usr/bin/env python3
"""Prints the build targets that the tests CTest selects would run.

Usage: ctest_targets.py BUILD_DIR [ctest label arguments, e.g. -L mpi -LE python]

Reads the selected tests from `ctest --show-only=json-v1` and keeps every
file name in their commands and properties (an environment variable may name
a library to preload) that is a target of the build (`cmake --build --target
help`), so that a build of those targets alone is enough to run them
(scripts/test.sh builds its sanitizer trees that way). Fails, printing
nothing, if no selected test names a target: a build of nothing would let the
tests fail for a missing file instead of running. Tests that CTest learns of
only once their binary is built (Catch2's discovered unit tests) are not
listed before the build: tests/CMakeLists.txt's gyre_unit_tests builds those.
"""
import json
import os
import re
import subprocess
import sys


def main():
    build, selection = sys.argv[1], sys.argv[2:]
    shown = subprocess.run(["ctest", "--show-only=json-v1", *selection], cwd=build,
                           check=True, capture_output=True, text=True).stdout
    helped = subprocess.run(["cmake", "--build", build, "--target", "help"],
                            check=True, capture_output=True, text=True).stdout
    # "... name" (Makefiles) or "name: phony" (Ninja)
    known = {line.split()[-1] if line.startswith("...") else line.split(":")[0]
             for line in helped.splitlines() if line.strip()}
    wanted = set()

    def visit(value):
        if isinstance(value, dict):
            for v in value.values():
                visit(v)
        elif isinstance(value, list):
            for v in value:
                visit(v)
        elif isinstance(value, str):
            for word in re.split(r"[\s=:;,]+", value):
                name = os.path.basename(word)
                if name in known:
                    wanted.add(name)
                elif name.startswith("lib") and name.endswith(".so") and name[3:-3] in known:
                    wanted.add(name[3:-3])

    for test in json.loads(shown).get("tests", []):
        visit(test.get("command", []))
        visit(test.get("properties", []))
    if not wanted:
        print(f"ctest_targets.py: no test selected by {selection} runs a target of {build}",
              file=sys.stderr)
        return 1
    print(" ".join(sorted(wanted)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
