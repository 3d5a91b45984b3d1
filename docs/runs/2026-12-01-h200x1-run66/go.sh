#!/usr/bin/env bash
# run66 (session 8): one H200, 2 ranks share it. After the review's clean-up of the torch backend
# (gather and scatter share one helper, one creator) and the bench (one baseline helper):
# PyTorch's feature matrix through the backend, its pytest cases and the bench's.
cd "$(dirname "$0")"
source ./env.sh
export MSCCLPP_CACHE_DIR=$PWD/kcache
R=${RUN:-run66}; LIMIT=${LIMIT:-300}; START=$(date +%s)
t() { local n=$1; shift
  if [ $(( $(date +%s) - START )) -gt $LIMIT ]; then echo "=== $n SKIPPED (past ${LIMIT}s)"; return; fi
  echo "=== $n $(date +%T) $*"; timeout "$@"; echo "rc=$? ($n)"; }
{
PY=/opt/torch/.venv/bin/python3; [ -x $PY ] || PY=$(command -v python3)
export PYTHONPATH=$PWD/py MSCCLPP_LOG_LEVEL=warn
t matrix 150 $PY -m torch.distributed.run --nproc_per_node=2 ../nccl/examples/torch_matrix.py --backend mscclpp
t py 150 $PY -m pytest -q -p no:cacheprovider --import-mode=importlib -rs ../python/tests/test_torch_backend.py ../python/tests/test_bench.py
true
} > $OUT/$R.log 2>&1
