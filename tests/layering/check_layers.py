#!/usr/bin/env python3
"""Checks the layering of the source tree: no include runs upward.

Layers, lowest first:
  base/include/gyre        the shared vocabulary (dtypes, reduce ops, errors)
  collectives/             algorithms and transports: base and collectives headers only
  core/include/gyre        the public C++ API: base, collectives' public headers are not part of it
  core/src                 the runtime: anything above

Also: GYRE_HAVE_NCCL, the switch of the GPU build, appears in C++ sources only under
core/src/backends/nccl/ and in the one file that registers the backends
(core/src/backends/registry.cc), so no other file changes with the build.
Likewise GYRE_HAVE_ULFM, the switch of elastic recovery (an MPI with ULFM), and
ULFM's header mpi-ext.h appear only under collectives/transport/, and mpi.h only
there and in bindings/src/module.cc (docs/architecture.md says so): the runtime
sees a peer's death as RankFailedError and asks MpiWorld whether it can recover.
The files that include mpi.h (directly, or through collectives/transport/mpi_comm.h)
are exactly those docs/architecture.md lists under "Which files include mpi.h".

Stages: the numbered folders of core/src (docs/architecture.md's tree: 0 bootstrap/
to 6 backends/) include no folder of a later stage, apart from the known crossings
listed in KNOWN_STAGE_CROSSINGS (each to be removed; a listed one that is gone fails
the check too, so that the list stays true).

Size: no source file (C++, CUDA or Python) in core/, collectives/ or bindings/ is
longer than MAX_LINES lines: past that, a file holds more than one concern.

Usage: check_layers.py SOURCE_ROOT. Prints every violation; exits 1 if there is any.
"""
import pathlib
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]', re.M)
# A stage folder in the doc's tree: "    api/    1 call: ...".
STAGE_LINE = re.compile(r"^\s{4}([a-z_]+)/\s+(\d+) [a-z-]+:", re.M)
MPI_SECTION = re.compile(r"^### Which files include mpi\.h\n(.*?)(?=^#)", re.M | re.S)
DOC_PATH = re.compile(r"`((?:base|collectives|core|bindings)/[^`\s]+\.(?:h|cc|cu|cuh|hpp|cpp))`")

MAX_LINES = 500

# (file under core/src, the later stage's header it includes): the crossings
# of today's tree, docs/architecture.md "Includes between the stages".
KNOWN_STAGE_CROSSINGS = set()
SOURCES = (".h", ".cc", ".cu", ".cuh", ".hpp", ".cpp")


def files(root, sub):
    base = root / sub
    return [p for p in base.rglob("*") if p.suffix in SOURCES] if base.is_dir() else []


def gyre_includes(path):
    return [m.group(1) for m in INCLUDE.finditer(path.read_text(errors="replace"))]


def main():
    root = pathlib.Path(sys.argv[1]).resolve()
    base_headers = {f"gyre/{p.name}" for p in (root / "base/include/gyre").glob("*.h")}
    api_headers = {f"gyre/{p.name}" for p in (root / "core/include/gyre").glob("*.h")}
    errors = []

    def check(sub, allowed, what):
        for f in files(root, sub):
            for inc in gyre_includes(f):
                if inc.startswith("gyre/") and not allowed(inc):
                    errors.append(f"{f.relative_to(root)}: includes {inc}, {what}")

    check("base", lambda inc: inc in base_headers,
          "but the base layer includes only its own headers")
    check("collectives", lambda inc: inc in base_headers or inc.startswith("gyre/collectives/"),
          "but collectives/ may include only base/ and collectives/ headers")
    check("core/include", lambda inc: inc in base_headers or inc in api_headers,
          "but a public header may include only public and base headers")
    for f in files(root, "collectives") + files(root, "base") + files(root, "core/include"):
        for inc in gyre_includes(f):
            top = inc.split("/")[0]
            if top in {"api", "queue", "negotiation", "fusion", "execution", "backends", "runtime"}:
                errors.append(f"{f.relative_to(root)}: includes the runtime's internal {inc}")

    nccl_home = root / "core/src/backends/nccl"
    registry = root / "core/src/backends/registry.cc"
    for sub in ("base", "collectives", "core", "bindings"):
        for f in files(root, sub):
            if "GYRE_HAVE_NCCL" not in f.read_text(errors="replace"):
                continue
            if f == registry or nccl_home in f.parents:
                continue
            errors.append(f"{f.relative_to(root)}: uses GYRE_HAVE_NCCL outside "
                          "core/src/backends/nccl/ and core/src/backends/registry.cc")

    ulfm_home = root / "collectives/transport"
    for sub in ("base", "collectives", "core", "bindings"):
        for f in files(root, sub):
            text = f.read_text(errors="replace")
            if ulfm_home in f.parents:
                continue
            if "GYRE_HAVE_ULFM" in text:
                errors.append(f"{f.relative_to(root)}: uses GYRE_HAVE_ULFM outside "
                              "collectives/transport/")
            if "mpi-ext.h" in gyre_includes(f):
                errors.append(f"{f.relative_to(root)}: includes mpi-ext.h outside "
                              "collectives/transport/")

    # mpi.h: the transport layer's, and the one exception docs/architecture.md
    # names (the extension's module.cc, which reads MPI's own state at import).
    mpi_allowed = {root / "bindings/src/module.cc"}
    for sub in ("base", "collectives", "core", "bindings"):
        for f in files(root, sub):
            if "mpi.h" not in gyre_includes(f) or ulfm_home in f.parents or f in mpi_allowed:
                continue
            errors.append(f"{f.relative_to(root)}: includes mpi.h outside collectives/transport/ "
                          "(and bindings/src/module.cc)")

    errors += check_mpi_list(root)
    errors += check_stages(root)
    errors += check_sizes(root)

    for e in errors:
        print(e)
    print(f"layering: {len(errors)} violation(s)")
    return 1 if errors else 0


def check_mpi_list(root):
    """The files of the library that see MPI against the doc's list of them."""
    doc = (root / "docs/architecture.md").read_text()
    section = MPI_SECTION.search(doc)
    if not section:
        return ["docs/architecture.md: no section '### Which files include mpi.h'"]
    listed = set(DOC_PATH.findall(section.group(1)))
    actual = set()
    for sub in ("base", "collectives", "core", "bindings"):
        for f in files(root, sub):
            incs = gyre_includes(f)
            if "mpi.h" in incs or "mpi_comm.h" in incs:
                actual.add(str(f.relative_to(root)))
    errors = [f"{p}: includes mpi.h (or mpi_comm.h) but docs/architecture.md does not list it"
              for p in sorted(actual - listed)]
    errors += [f"{p}: listed in docs/architecture.md as including mpi.h, but does not"
               for p in sorted(listed - actual)]
    return errors


def check_sizes(root):
    """No source file longer than MAX_LINES lines."""
    errors = []
    for sub in ("core", "collectives", "bindings"):
        for f in (root / sub).rglob("*"):
            if f.suffix not in SOURCES + (".py",) or not f.is_file():
                continue
            n = len(f.read_text(errors="replace").splitlines())
            if n > MAX_LINES:
                errors.append(f"{f.relative_to(root)}: {n} lines, more than {MAX_LINES}: split it "
                              "along its concerns")
    return errors


def check_stages(root):
    """No include from a stage folder of core/src to a later stage's folder."""
    doc = (root / "docs/architecture.md").read_text()
    order = {name: int(n) for name, n in STAGE_LINE.findall(doc)}
    if len(order) < 2:
        return ["docs/architecture.md: the tree lists no numbered stage folders of core/src"]
    src = root / "core/src"
    errors, seen = [], set()
    for name, stage in order.items():
        for f in files(root, f"core/src/{name}"):
            rel = str(f.relative_to(src))
            for inc in gyre_includes(f):
                target = inc.split("/")[0]
                if target not in order or order[target] <= stage:
                    continue
                if (rel, inc) in KNOWN_STAGE_CROSSINGS:
                    seen.add((rel, inc))
                    continue
                errors.append(f"core/src/{rel}: includes {inc}, a later stage ({order[target]} "
                              f"{target}/) than its own ({stage} {name}/)")
    for rel, inc in sorted(KNOWN_STAGE_CROSSINGS - seen):
        errors.append(f"core/src/{rel} no longer includes {inc}: remove it from "
                      "KNOWN_STAGE_CROSSINGS (and from docs/architecture.md)")
    return errors


if __name__ == "__main__":
    sys.exit(main())
