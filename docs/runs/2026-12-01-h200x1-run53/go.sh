#!/usr/bin/env bash
# run53 (session 6): one H200, 2 ranks share it. PreMulSum under nccl-tests -o all, the abort
# trials (executor plans, C API, collectives), the Python package's GPU tests (torch tensors),
# MSCCLPP_EXECUTION_PLAN_DIR under PyTorch at plan-divisible sizes, nccl-tests to 1 GiB.
cd "$(dirname "$0")"
source ./env.sh
export MSCCLPP_CACHE_DIR=$PWD/kcache
LIB=$PWD/lib/libmscclpp_nccl.so
R=${RUN:-run53}; LIMIT=${LIMIT:-470}; START=$(date +%s)
t() { local n=$1; shift
  if [ $(( $(date +%s) - START )) -gt $LIMIT ]; then echo "=== $n SKIPPED (past ${LIMIT}s)"; return; fi
  echo "=== $n $(date +%T) $*"; timeout "$@"; echo "rc=$? ($n)"; }
{
nvidia-smi -L
( cd nccl-tests && make -j 12 MPI=1 MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi NCCL_HOME=/usr CUDA_HOME=/usr/local/cuda NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" > ../nt-build.log 2>&1; echo "nccl-tests build rc=$?" >> ../nt-build.log ) &
NT=$!
t warm 150 ./bin/mscclpp-perf allreduce -d bfloat16 -b 1K -e 8M -f 8 -n 2 -w 1
t faults 200 ./run-tests.sh --nocapture faults::cuda::
t abort 100 ./run-tests.sh --nocapture abort::cuda::
wait $NT; tail -1 nt-build.log
MPI="mpirun --allow-run-as-root --oversubscribe -np 2 -x LD_PRELOAD=$LIB -x NCCL_NVLS_ENABLE -x MSCCLPP_CACHE_DIR -x MSCCLPP_FORCE_DISABLE_NVLS=1 -x NCCL_TESTS_DEVICE=0"
for b in all_reduce reduce_scatter reduce; do
  t nt_ops_$b 60 $MPI ./nccl-tests/build/${b}_perf -b 8 -e 64K -f 64 -n 2 -w 1 -c 1 -d all -o all
  t nt_opsG_$b 60 $MPI ./nccl-tests/build/${b}_perf -b 8 -e 64K -f 64 -n 2 -w 1 -c 1 -d all -o all -G 2
done
PY=$(command -v python3)
export PYTHONPATH=$PWD/py
t py_env 30 $PY -c "import sys, numpy, torch, mscclpp_rs; print(sys.version.split()[0], numpy.__version__, torch.__version__, mscclpp_rs.__file__)"
t py_gpu 200 bash -c "cd ../python && $PY -m pytest -q -p no:cacheprovider --import-mode=importlib -k gpu -rs tests 2>&1 | tail -40"
t torch_plandir 100 bash -c "env LD_PRELOAD=$LIB MSCCLPP_EXECUTION_PLAN_DIR=$PWD/plandir MSCCLPP_LOG_LEVEL=info torchrun --nproc_per_node=2 ../nccl/examples/torch_matrix.py --features pow2_sizes 2>&1 | grep -i 'execution plan\|PASS\|FAIL\|SUMMARY' | head -30"
for b in all_reduce all_gather; do
  t nt_1G_$b 60 $MPI ./nccl-tests/build/${b}_perf -b 1K -e 1G -f 1024 -n 2 -w 1 -c 1
done
t executor 150 ./run-tests.sh executor::cuda
t register 60 env MSCCLPP_LOG_LEVEL=debug ./bin/mscclpp-perf allreduce -d bfloat16 -b 1M -e 8M -f 2 -n 5 -w 1 --register 2>&1 | grep -v "^20.*DEBUG.*bootstrap" | tail -30
true
} > $OUT/$R.log 2>&1
cp nt-build.log $OUT/ 2>/dev/null
