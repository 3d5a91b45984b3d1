#!/usr/bin/env bash
# run62 (session 8): one H200, 2 ranks share it. run61 again after the torch backend learned
# its group name from the creator (functional collectives, FSDP2) and staged CPU tensors on a
# GPU group (object collectives): torch_matrix.py --backend mscclpp, and the backend's pytest
# cases (object collectives, functional collectives and FSDP2 added).
cd "$(dirname "$0")"
source ./env.sh
export MSCCLPP_CACHE_DIR=$PWD/kcache
R=${RUN:-run62}; LIMIT=${LIMIT:-500}; START=$(date +%s)
t() { local n=$1; shift
  if [ $(( $(date +%s) - START )) -gt $LIMIT ]; then echo "=== $n SKIPPED (past ${LIMIT}s)"; return; fi
  echo "=== $n $(date +%T) $*"; timeout "$@"; echo "rc=$? ($n)"; }
{
PY=/opt/torch/.venv/bin/python3; [ -x $PY ] || PY=$(command -v python3)
export PYTHONPATH=$PWD/py MSCCLPP_LOG_LEVEL=warn
t matrix 300 $PY -m torch.distributed.run --nproc_per_node=2 ../nccl/examples/torch_matrix.py --backend mscclpp
t py_torch 200 $PY -m pytest -q -p no:cacheprovider --import-mode=importlib -rs ../python/tests/test_torch_backend.py
true
} > $OUT/$R.log 2>&1
