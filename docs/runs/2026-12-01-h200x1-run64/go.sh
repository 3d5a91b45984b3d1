#!/usr/bin/env bash
# run64 (session 8): one H200, 2 ranks share it. The torch backend's test with the GPU case's new
# check (a call failing after it staged CPU tensors leaves nothing to be copied back later), and
# the same check against a mutant without the clean-up (py_mut), which must fail.
cd "$(dirname "$0")"
source ./env.sh
export MSCCLPP_CACHE_DIR=$PWD/kcache
R=${RUN:-run64}; LIMIT=${LIMIT:-300}; START=$(date +%s)
t() { local n=$1; shift
  if [ $(( $(date +%s) - START )) -gt $LIMIT ]; then echo "=== $n SKIPPED (past ${LIMIT}s)"; return; fi
  echo "=== $n $(date +%T) $*"; timeout "$@"; echo "rc=$? ($n)"; }
{
PY=/opt/torch/.venv/bin/python3; [ -x $PY ] || PY=$(command -v python3)
t py_torch 200 env PYTHONPATH=$PWD/py $PY -m pytest -q -p no:cacheprovider --import-mode=importlib -rs ../python/tests/test_torch_backend.py
t py_torch_mutant 200 env PYTHONPATH=$PWD/py_mut $PY -m pytest -q -p no:cacheprovider --import-mode=importlib -rs -k gpu ../python/tests/test_torch_backend.py
true
} > $OUT/$R.log 2>&1
