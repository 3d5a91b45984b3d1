#!/usr/bin/env python3
"""The tree's structural rules, checked (ci/check.sh runs this, then `--self-test`).

1. Layers. Every crate sits on a layer (LAYERS below, the order of docs/map.md); a crate's
   normal dependencies on crates of this workspace must sit on strictly lower layers. Dev
   dependencies (tests, examples) may reach anywhere. A new crate must be given a layer here.
2. Paths in docs. A backticked path in the docs that starts with one of the repository's
   top-level folders (`comm/src/...`, `nccl/examples/...`) must exist: files move, and a map that
   names a file no longer there misleads (a `path:line` suffix is allowed; a path may be relative
   to the doc's folder or a crate's; "SGLang's `python/...`" names another project's file).
3. Docs name dates and commits, not working sessions or helpers: "session 14", "this session",
   "helpers" are refused in docs/ (a working note's words; a date and a commit say when).
4. Front ends import few crates: the library code (`src/`) of the C library, the benchmark and
   the Python package names the facade (`mscclpp::...`), the caller side and (C library,
   benchmark) the real NCCL's binding, nothing else of this workspace; and it reaches the
   collectives only through the caller (`AnyCollectives`, `typed_collectives` and the facade's
   `typed::collectives` are not named).

`--self-test` runs each rule on a broken input (an upward dependency, a missing path, a session)
and fails unless each is caught, so that a rule that silently stopped working is noticed.
"""
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Lower numbers are lower layers. Same number: no dependency allowed either way.
LAYERS = {
    "mscclpp-base": 0,
    "mscclpp-hal": 1,
    "mscclpp-bootstrap": 1,
    "mscclpp-host": 2,
    "mscclpp-gpu": 2,
    "mscclpp-nccl-real": 2,
    "mscclpp-cuda": 3,
    "mscclpp-rocm": 3,
    "mscclpp-transports": 4,
    "mscclpp-comm": 5,
    "mscclpp-collectives": 6,
    "mscclpp-executor": 7,
    "mscclpp": 8,
    "mscclpp-caller": 9,
    "mscclpp-nccl": 10,
    "mscclpp-perf": 10,
    "mscclpp-python": 10,
    "mscclpp-conformance": 11,
}

# What each front end's library code may name of this workspace (rule 4).
FRONT_ENDS = {
    "nccl/src": {"mscclpp", "mscclpp_caller", "mscclpp_nccl_real", "mscclpp_nccl"},
    "perf/src": {"mscclpp", "mscclpp_nccl_real", "mscclpp_perf"},
    "python/src": {"mscclpp", "mscclpp_caller"},
}
CRATE_NAME = re.compile(r"\b(mscclpp(?:_[a-z_]+)?)(?:::|\s+as\b|;)")
STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
AROUND_CALLER = re.compile(r"\b(AnyCollectives|typed_collectives|typed::collectives)\b")
DOC_FILES = ["README.md", "CONTRIBUTING.md", "kernels/README.md", "experiments/README.md"]
SESSION_WORDS = re.compile(r"\b(?:[Ss]ession \d+|this session|that session|[Hh]elpers?)\b")
PATH_TOKEN = re.compile(r"`([A-Za-z0-9_.\-]+/[A-Za-z0-9_./:\-]*)`")


def packages():
    out = subprocess.run(
        ["cargo", "metadata", "--no-deps", "--format-version", "1"],
        cwd=ROOT, check=True, capture_output=True, text=True).stdout
    pkgs = {}
    for p in json.loads(out)["packages"]:
        pkgs[p["name"]] = [d["name"] for d in p["dependencies"]
                           if d["name"] in LAYERS or d["name"].startswith("mscclpp")
                           if d.get("kind") is None]
    return pkgs


def layer_errors(pkgs):
    errors = []
    for name, deps in sorted(pkgs.items()):
        if name not in LAYERS:
            errors.append(f"{name}: no layer in ci/structure.py's LAYERS (give it one, see docs/map.md)")
            continue
        for d in deps:
            if d not in LAYERS:
                errors.append(f"{name} depends on {d}, which has no layer")
            elif LAYERS[d] >= LAYERS[name]:
                errors.append(f"{name} (layer {LAYERS[name]}) depends on {d} (layer {LAYERS[d]}): "
                              "dependencies point down (docs/map.md, 'Layers')")
    return errors


def import_errors(name, text, allowed):
    errors = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("//"):
            continue
        # Log targets and messages name crates as text (`"mscclpp_comm::proxy"`): not imports.
        line = STRING.sub('""', line)
        for m in CRATE_NAME.finditer(line):
            if m.group(1) not in allowed:
                errors.append(f"{name}:{n}: names `{m.group(1)}`: a front end imports the facade "
                              "(`mscclpp::...`) and the caller (docs/map.md, 'Layers')")
        m = AROUND_CALLER.search(line)
        if m:
            errors.append(f"{name}:{n}: names `{m.group(1)}`: front ends reach the collectives "
                          "through the caller (`mscclpp_caller::Caller`)")
    return errors


def front_end_errors():
    errors = []
    for folder, allowed in FRONT_ENDS.items():
        for base, _, files in os.walk(os.path.join(ROOT, folder)):
            for f in sorted(files):
                if f.endswith(".rs"):
                    path = os.path.join(base, f)
                    with open(path, encoding="utf-8") as fh:
                        errors += import_errors(os.path.relpath(path, ROOT), fh.read(), allowed)
    return errors


def doc_files():
    files = [f for f in DOC_FILES if os.path.exists(os.path.join(ROOT, f))]
    for f in sorted(os.listdir(os.path.join(ROOT, "docs"))):
        if f.endswith(".md"):
            files.append(os.path.join("docs", f))
    return files


def top_folders():
    return {e for e in os.listdir(ROOT)
            if os.path.isdir(os.path.join(ROOT, e)) and not e.startswith(".") and e != "target"}


def path_errors(name, text, tops, exists):
    errors = []
    for n, line in enumerate(text.splitlines(), 1):
        for m in PATH_TOKEN.finditer(line):
            p = re.sub(r":\d+(?:-\d+)?$", "", m.group(1))
            # "SGLang's `python/...`": a path of another project.
            if line[:m.start()].endswith("'s "):
                continue
            if p.split("/", 1)[0] not in tops or "*" in p or "/target/" in p or p.endswith("/target"):
                continue
            if not exists(p):
                errors.append(f"{name}:{n}: `{p}` does not exist")
    return errors


def session_errors(name, text):
    return [f"{name}:{n}: '{m.group(0)}': docs name dates and commits, not sessions or helpers"
            for n, line in enumerate(text.splitlines(), 1)
            for m in [SESSION_WORDS.search(line)] if m]


def crate_dirs():
    """Every folder holding a Cargo.toml or pyproject.toml: docs name files relative to them."""
    dirs = []
    for base, subdirs, files in os.walk(ROOT):
        subdirs[:] = [d for d in subdirs if not d.startswith(".") and d != "target"]
        if "Cargo.toml" in files or "pyproject.toml" in files:
            dirs.append(base)
    return dirs


def doc_errors():
    tops = top_folders()
    crates = crate_dirs()
    errors = []
    for f in doc_files():
        with open(os.path.join(ROOT, f), encoding="utf-8") as fh:
            text = fh.read()
        bases = [os.path.join(ROOT, os.path.dirname(f))] + crates

        def exists(p):
            return any(os.path.exists(os.path.join(b, p)) for b in bases)
        errors += path_errors(f, text, tops, exists)
        if f.startswith("docs/"):
            errors += session_errors(f, text)
    return errors


def self_test():
    caught = []
    upward = {"mscclpp-hal": ["mscclpp-comm"], "mscclpp-comm": ["mscclpp-hal"]}
    caught.append(("an upward dependency (hal -> comm)", bool(layer_errors(upward))))
    caught.append(("a crate without a layer", bool(layer_errors({"mscclpp-new": []}))))
    caught.append(("a downward dependency accepted", not layer_errors({"mscclpp-comm": ["mscclpp-hal"]})))
    text = "see `comm/src/gone.rs:12` and `comm/src/mod.rs`, not MSCCL++'s `comm/x.py`"
    errs = path_errors("x.md", text, {"comm"}, lambda p: p == "comm/src/mod.rs")
    caught.append(("a missing path", len(errs) == 1 and "gone.rs" in errs[0]))
    caught.append(("a session named", bool(session_errors("x.md", "measured in session 14"))))
    caught.append(("a date accepted", not session_errors("x.md", "measured 2026-12-05 at 4083228")))
    allowed = FRONT_ENDS["python/src"]
    caught.append(("a front end naming a lower crate",
                   bool(import_errors("x.rs", "use mscclpp_comm::Communicator;", allowed))))
    caught.append(("a front end around the caller",
                   bool(import_errors("x.rs", "fn f(c: &dyn AnyCollectives) {}", allowed))))
    caught.append(("a front end around the caller through the facade",
                   bool(import_errors("x.rs", "let c = mscclpp::typed::collectives(comm, 1);",
                                      allowed))))
    caught.append(("a front end's facade import accepted",
                   not import_errors("x.rs", 'use mscclpp::comm::Communicator; // mscclpp_hal',
                                     allowed)
                   and not import_errors("x.rs", 'let t = ("mscclpp_comm::proxy", "PROXY");',
                                         allowed)))
    bad = [what for what, ok in caught if not ok]
    for what, ok in caught:
        print(f"structure self-test: {'ok' if ok else 'FAILED'}: {what}")
    return 1 if bad else 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    errors = layer_errors(packages()) + front_end_errors() + doc_errors()
    for e in errors:
        print(f"structure: {e}")
    print(f"structure: {len(errors)} problem(s)" if errors else "structure: layers, front-end imports and doc paths ok")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
