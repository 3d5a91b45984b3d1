#!/usr/bin/env bash
# run54 (session 6, final): one H200, 2 ranks share it. PreMulSum per-rank scalars under
# nccl-tests -o all, ncclCommAbort's GPU trial, the Python package's torch tests, the copy-engine
# and multi-host (MSCCLPP_HOSTID) collectives on the GPU, the overlap benchmark's smoke run, and
# the PyTorch matrix once more.
cd "$(dirname "$0")"
source ./env.sh
export MSCCLPP_CACHE_DIR=$PWD/kcache
LIB=$PWD/lib/libmscclpp_nccl.so
ln -sf ../lib/libmscclpp_nccl.so tests/libmscclpp_nccl.so
R=${RUN:-run54}; LIMIT=${LIMIT:-470}; START=$(date +%s)
t() { local n=$1; shift
  if [ $(( $(date +%s) - START )) -gt $LIMIT ]; then echo "=== $n SKIPPED (past ${LIMIT}s)"; return; fi
  echo "=== $n $(date +%T) $*"; timeout "$@"; echo "rc=$? ($n)"; }
{
nvidia-smi -L
( cd nccl-tests && make -j 12 MPI=1 MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi NCCL_HOME=/usr CUDA_HOME=/usr/local/cuda NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" > ../nt-build.log 2>&1; echo "nccl-tests build rc=$?" >> ../nt-build.log ) &
NT=$!
t warm 150 ./bin/mscclpp-perf allreduce -d bfloat16 -b 1K -e 8M -f 8 -n 2 -w 1
t abort 100 ./run-tests.sh --nocapture abort::cuda::
PY=$(command -v python3)
export PYTHONPATH=$PWD/py
t py_gpu 200 bash -c "$PY -m pytest -q -p no:cacheprovider --import-mode=importlib -k gpu -rs ../python/tests 2>&1 | tail -40"
wait $NT; tail -1 nt-build.log
MPI="mpirun --allow-run-as-root --oversubscribe -np 2 -x LD_PRELOAD=$LIB -x NCCL_NVLS_ENABLE -x MSCCLPP_CACHE_DIR -x MSCCLPP_FORCE_DISABLE_NVLS=1 -x NCCL_TESTS_DEVICE=0"
for b in all_reduce reduce_scatter reduce; do
  t nt_ops_$b 60 $MPI ./nccl-tests/build/${b}_perf -b 8 -e 64K -f 64 -n 2 -w 1 -c 1 -d all -o all
  t nt_opsG_$b 60 $MPI ./nccl-tests/build/${b}_perf -b 8 -e 64K -f 64 -n 2 -w 1 -c 1 -d all -o all -G 2
done
t hal_wait 60 ./run-tests.sh wait_value64
t ce 200 ./run-tests.sh --nocapture collectives::cuda::ce
t multinode 200 ./run-tests.sh --nocapture multinode::cuda
t overlap 90 ./bin/mscclpp-perf overlap -d bfloat16 -b 16M -e 256M -f 4 -n 5 -w 2
t ce_allgather 60 env MSCCLPP_ALGO_ALLGATHER=ce ./bin/mscclpp-perf allgather -d bfloat16 -b 1M -e 256M -f 16 -n 5 -w 1
t ce_allgather_G 60 env MSCCLPP_ALGO_ALLGATHER=ce ./bin/mscclpp-perf allgather -d bfloat16 -b 1M -e 256M -f 16 -n 5 -w 1 -G 2
t torch 200 env LD_PRELOAD=$LIB torchrun --nproc_per_node=2 ../nccl/examples/torch_matrix.py
t coll 200 env MSCCLPP_TEST_DTYPES=bfloat16,float,int8 ./run-tests.sh collectives::cuda::default::2_ranks
true
} > $OUT/$R.log 2>&1
cp nt-build.log $OUT/ 2>/dev/null
