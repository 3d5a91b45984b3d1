#!/usr/bin/env bash
# run65 (session 8): run64 again with the check made able to fail: in run64 the mutant passed,
# since a failed call's stale device copy held the values the tensor already had; now the caller
# writes the tensor after the failure and the next call must not overwrite it.
cd "$(dirname "$0")"
source ./env.sh
export MSCCLPP_CACHE_DIR=$PWD/kcache
R=${RUN:-run65}; LIMIT=${LIMIT:-300}; START=$(date +%s)
t() { local n=$1; shift
  if [ $(( $(date +%s) - START )) -gt $LIMIT ]; then echo "=== $n SKIPPED (past ${LIMIT}s)"; return; fi
  echo "=== $n $(date +%T) $*"; timeout "$@"; echo "rc=$? ($n)"; }
{
PY=/opt/torch/.venv/bin/python3; [ -x $PY ] || PY=$(command -v python3)
t py_torch 200 env PYTHONPATH=$PWD/py $PY -m pytest -q -p no:cacheprovider --import-mode=importlib -rs ../python/tests/test_torch_backend.py
t py_torch_mutant 200 env PYTHONPATH=$PWD/py_mut $PY -m pytest -q -p no:cacheprovider --import-mode=importlib -rs -k gpu ../python/tests/test_torch_backend.py
true
} > $OUT/$R.log 2>&1
