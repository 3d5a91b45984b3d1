#!/usr/bin/env bash
# run60 (session 8): one H200, 2 ranks share it. The copy-engine kill trials again (run59's log
# was lost with its machine), the Python suite's GPU cases (the torch backend's Work.wait()
# stream ordering is new), and the Python benchmark of ours alone on torch tensors.
cd "$(dirname "$0")"
source ./env.sh
export MSCCLPP_CACHE_DIR=$PWD/kcache
R=${RUN:-run60}; LIMIT=${LIMIT:-540}; START=$(date +%s)
t() { local n=$1; shift
  if [ $(( $(date +%s) - START )) -gt $LIMIT ]; then echo "=== $n SKIPPED (past ${LIMIT}s)"; return; fi
  echo "=== $n $(date +%T) $*"; timeout "$@"; echo "rc=$? ($n)"; }
{
nvidia-smi -L
PY=/opt/torch/.venv/bin/python3; [ -x $PY ] || PY=$(command -v python3)
$PY -c "import torch; print('torch', torch.__version__)"
export PYTHONPATH=$PWD/py
t py_gpu 300 $PY -m pytest -q -p no:cacheprovider --import-mode=importlib -rs -k "gpu or torch_backend or bench" ../python/tests
t bench 150 $PY -m mscclpp_rs.bench --ranks 2 --baseline none -b 1K -e 1G -f 4 -n 10 -w 3
t ce_warm 90 ./tests/faults --test-threads=1 faults::cuda::killed_during_ce
for i in 1 2 3 4 5; do t ce_kill_$i 40 ./tests/faults --test-threads=1 faults::cuda::killed_during_ce 2>&1 | grep -E "survivor|result"; done
true
} > $OUT/$R.log 2>&1
