#!/usr/bin/env bash
# run56 (session 7): one H200, 2 ranks share it. Wrapped-memory IPC (HAL), the Python package's
# registration / plans / torch.distributed backend on torch tensors, and the copy-engine abort.
cd "$(dirname "$0")"
source ./env.sh
export MSCCLPP_CACHE_DIR=$PWD/kcache
R=${RUN:-run56}; LIMIT=${LIMIT:-420}; START=$(date +%s)
t() { local n=$1; shift
  if [ $(( $(date +%s) - START )) -gt $LIMIT ]; then echo "=== $n SKIPPED (past ${LIMIT}s)"; return; fi
  echo "=== $n $(date +%T) $*"; timeout "$@"; echo "rc=$? ($n)"; }
{
nvidia-smi -L
t hal 120 ./tests/hal --test-threads=1 cuda::
PY=/opt/torch/.venv/bin/python3; [ -x $PY ] || PY=$(command -v python3)
$PY -c "import torch; print('torch', torch.__version__)"
export PYTHONPATH=$PWD/py
t py_gpu 200 $PY -m pytest -q -p no:cacheprovider --import-mode=importlib -rs -k "register or execute_plan or torch_backend or ping_pong or graph" ../python/tests
t ce_abort 90 ./tests/faults --test-threads=1 --include-ignored cuda::killed_during_ce
t ce_2 120 ./tests/collectives --test-threads=1 cuda::ce::2_ranks
true
} > $OUT/$R.log 2>&1
