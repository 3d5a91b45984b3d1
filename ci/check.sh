#!/usr/bin/env bash
# The checks CI runs, in order of cost. Run locally with `bash ci/check.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n=== %s (%s)\n' "$*" "$(date -u +%H:%M:%S)"; }

step "structure: layers point down, docs name paths that exist (ci/structure.py, docs/map.md)"
python3 ci/structure.py --self-test
python3 ci/structure.py

step "rustfmt"
cargo fmt --all -- --check

step "clippy, every target and feature, warnings denied"
cargo clippy --workspace --all-targets --all-features -- -D warnings

step "python extension (python/, its own workspace): rustfmt and clippy"
cargo fmt --manifest-path python/Cargo.toml -- --check
cargo clippy --manifest-path python/Cargo.toml --all-targets -- -D warnings

step "host-only build (no GPU features)"
cargo check -p mscclpp -p mscclpp-perf --no-default-features

step "tests (the README's test command; tests/tests/python.rs runs ci/python.sh, the Python package's build and pytest)"
MSCCLPP_REQUIRE_PYTHON=1 cargo test --workspace

step "main job smoke run (debug build, small sizes)"
cargo run -q -p mscclpp-perf -- -b 1K -e 64K -f 8 -n 5 -w 1
cargo run -q -p mscclpp-perf -- overlap -b 1K -e 16K -f 4 -n 3 -w 1 --compute-us 500

step "done"
