#!/usr/bin/env bash
# The Python package's check: a fresh venv, `pip install ./python` (maturin builds the extension
# in python/target; no vendor SDK), then its pytest suite on the host backend (plus the torch
# tests where torch and a GPU are present; they report themselves skipped otherwise).
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
# The extension has its own target directory and workspace: an outer cargo's must not leak in.
unset CARGO_TARGET_DIR CARGO_BUILD_TARGET_DIR
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check maturin pytest numpy
start=$(date +%s)
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps ./python
echo "python: pip install ./python took $(( $(date +%s) - start )) s"
cd python
# Tests import the installed package, not the source folder (which has no extension built in).
exec "../$venv/bin/pytest" -q -p no:cacheprovider --import-mode=importlib "$@" tests
