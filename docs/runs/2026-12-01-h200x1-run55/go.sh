#!/usr/bin/env bash
# run55 (session 6, last): one H200, 2 ranks share it. The Python package's torch tests (a
# memory-channel ping-pong kernel compiled from a Python string, graphs, plans, registration,
# f32/bf16 collectives), the hierarchical collectives with each rank as its own host
# (MSCCLPP_HOSTID), and the overlap benchmark's first GPU run.
cd "$(dirname "$0")"
source ./env.sh
export MSCCLPP_CACHE_DIR=$PWD/kcache
R=${RUN:-run55}; LIMIT=${LIMIT:-250}; START=$(date +%s)
t() { local n=$1; shift
  if [ $(( $(date +%s) - START )) -gt $LIMIT ]; then echo "=== $n SKIPPED (past ${LIMIT}s)"; return; fi
  echo "=== $n $(date +%T) $*"; timeout "$@"; echo "rc=$? ($n)"; }
{
t warm 60 ./bin/mscclpp-perf allreduce -d float -b 1K -e 4M -f 64 -n 2 -w 1
PY=$(command -v python3)
export PYTHONPATH=$PWD/py
t py_gpu 140 $PY -m pytest -q -p no:cacheprovider --import-mode=importlib -rs -k "ping_pong or graph or execute_plan or register or (gpu and float32) or (gpu and bfloat16)" ../python/tests
t multinode 80 ./run-tests.sh --nocapture multinode::cuda::hosts_2x1
t overlap 40 ./bin/mscclpp-perf overlap -d bfloat16 -b 16M -e 64M -f 4 -n 3 -w 1
true
} > $OUT/$R.log 2>&1
