#!/usr/bin/env bash
# run63 (session 8): one H200, 2 ranks share it. run62 again after the FSDP2 case of the
# torch backend's test named its mesh's device type (its host case took the GPU in run62).
cd "$(dirname "$0")"
source ./env.sh
export MSCCLPP_CACHE_DIR=$PWD/kcache
R=${RUN:-run63}; LIMIT=${LIMIT:-500}; START=$(date +%s)
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
