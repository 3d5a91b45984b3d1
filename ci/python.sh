#!/usr/bin/env bash
# The Python package's check: a fresh venv, `pip install ./python` (maturin builds the extension
# in python/target, and python/build.rs the NCCL-compatible libmscclpp_nccl.so that the wheel
# carries, in python/target/nccl; no vendor SDK), then its pytest suite on the host backend (plus
# the torch tests where torch and a GPU are present; they report themselves skipped otherwise).
#
# The venv lives in python/.venv (git-ignored) and is reused; MSCCLPP_PYTHON picks the
# interpreter (default python3). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

py="${MSCCLPP_PYTHON:-python3}"
venv=python/.venv
if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
fi
# The extension has its own target directory and workspace: an outer cargo's must not leak in
# (build.rs also keeps it from the nested build of the C library).
unset CARGO_TARGET_DIR CARGO_BUILD_TARGET_DIR
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check maturin pytest numpy
start=$(date +%s)
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps ./python
echo "python: pip install ./python took $(( $(date +%s) - start )) s"
cd python
# Tests import the installed package, not the source folder (which has no extension built in).
"../$venv/bin/pytest" -q -p no:cacheprovider --import-mode=importlib "$@" tests

# The release wheel (docs/python.md, "Release wheel"): manylinux_2_17 through maturin --zig (the
# PyPI ziglang), installed in a fresh venv, the C library's test run from there. On in CI
# (MSCCLPP_REQUIRE_PYTHON=1), off by default locally; MSCCLPP_PY_MANYLINUX=0/1 decides. About
# 3.5 minutes on 2 cores from nothing (its own target dirs: python/target/x86_64-unknown-linux-gnu,
# python/target/manylinux), seconds when repeated.
if [ "${MSCCLPP_PY_MANYLINUX:-${MSCCLPP_REQUIRE_PYTHON:-0}}" = 1 ]; then
  ml="$PWD/target/manylinux"
  "../$venv/bin/python" -m pip install --quiet --disable-pip-version-check ziglang
  rm -rf "$ml/wheels" "$ml/venv"
  start=$(date +%s)
  PATH="$PWD/../$venv/bin:$PATH" MSCCLPP_NCCL_TARGET_DIR="$ml/nccl" \
    "../$venv/bin/maturin" build --quiet --release --zig --compatibility manylinux_2_17 \
    -i "../$venv/bin/python" -o "$ml/wheels"
  echo "python: manylinux wheel build took $(( $(date +%s) - start )) s"
  "../$venv/bin/python" -m venv "$ml/venv"
  "$ml/venv/bin/python" -m pip install --quiet --disable-pip-version-check "$ml"/wheels/*.whl pytest pyelftools
  # The C library must need no glibc past 2.17 either (maturin audits the extension only).
  # (run from $ml: python/'s source package would shadow the installed one)
  (cd "$ml" && "$ml/venv/bin/python" - <<'PY'
import re
from elftools.elf.elffile import ELFFile
from mscclpp_rs.nccl import library_path
with open(library_path(), "rb") as f:
    need = [str(a.name) for s in ELFFile(f).iter_sections() if s.name == ".gnu.version_r"
            for _, aux in s.iter_versions() for a in aux]
vers = [tuple(map(int, m.group(1).split("."))) for n in need if (m := re.match(r"GLIBC_([\d.]+)$", n))]
assert vers and max(vers) <= (2, 17), f"{library_path()} needs glibc {max(vers)}"
print(f"python: manylinux {library_path()}: glibc <= {'.'.join(map(str, max(vers)))}")
PY
  )
  "$ml/venv/bin/pytest" -q -p no:cacheprovider --import-mode=importlib tests/test_nccl_lib.py
fi
