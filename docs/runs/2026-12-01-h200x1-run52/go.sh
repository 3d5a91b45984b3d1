#!/usr/bin/env bash
# Session 6 GPU run on one H200 (2 ranks share it): the stream-ordering fix (FSDP2), GPU abort
# trials, nccl-tests under LD_PRELOAD (no real NCCL), the PyTorch matrix, DSL plans through
# mscclpp-perf plan and MSCCLPP_EXECUTION_PLAN_DIR, the C library's and executor's GPU tests.
# Steps run in priority order; a step that would start after LIMIT seconds is skipped (logged).
cd "$(dirname "$0")"
source ./env.sh
export MSCCLPP_CACHE_DIR=$PWD/kcache
LIB=$PWD/lib/libmscclpp_nccl.so
R=${RUN:-run52}; LIMIT=${LIMIT:-540}; START=$(date +%s)
t() { local n=$1; shift
  if [ $(( $(date +%s) - START )) -gt $LIMIT ]; then echo "=== $n SKIPPED (past ${LIMIT}s)"; return; fi
  echo "=== $n $(date +%T) $*"; timeout "$@"; echo "rc=$? ($n)"; }
{
nvidia-smi -L
( cd nccl-tests && make -j 12 MPI=1 MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi NCCL_HOME=/usr CUDA_HOME=/usr/local/cuda NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" > ../nt-build.log 2>&1; echo "nccl-tests build rc=$?" >> ../nt-build.log ) &
NT=$!
t warm 150 ./bin/mscclpp-perf allreduce -d bfloat16 -b 1K -e 8M -f 8 -n 2 -w 1
t torch_fsdp2_first 100 env LD_PRELOAD=$LIB torchrun --nproc_per_node=2 ../nccl/examples/torch_matrix.py --features fsdp2,ddp,new_group,split_group
t faults 150 ./run-tests.sh faults::cuda::
wait $NT; tail -2 nt-build.log
MPI="mpirun --allow-run-as-root --oversubscribe -np 2 -x LD_PRELOAD=$LIB -x NCCL_NVLS_ENABLE -x MSCCLPP_CACHE_DIR -x MSCCLPP_FORCE_DISABLE_NVLS=1 -x NCCL_TESTS_DEVICE=0"
for b in all_reduce all_gather reduce_scatter broadcast reduce alltoall sendrecv scatter gather hypercube; do
  t nt_$b 40 $MPI ./nccl-tests/build/${b}_perf -b 8 -e 1G -f 64 -n 2 -w 1 -c 1
done
t torch 200 env LD_PRELOAD=$LIB torchrun --nproc_per_node=2 ../nccl/examples/torch_matrix.py
t torch_plandir 100 bash -c "env LD_PRELOAD=$LIB MSCCLPP_EXECUTION_PLAN_DIR=$PWD/plandir MSCCLPP_LOG_LEVEL=info torchrun --nproc_per_node=2 ../nccl/examples/torch_matrix.py --features allreduce_float,allgather 2>&1 | grep -i 'plan\|PASS\|FAIL\|SUMMARY' | head -30"
for p in plans/*.json; do
  t plan_$(basename $p .json) 40 ./bin/mscclpp-perf plan --ranks 2 -b 1K -e 1M -f 1024 -n 5 -w 1 $p
done
for b in all_reduce all_gather reduce_scatter broadcast reduce alltoall sendrecv scatter gather hypercube; do
  t nt_G_$b 40 $MPI ./nccl-tests/build/${b}_perf -b 8 -e 1M -f 32 -n 2 -w 1 -c 1 -G 2 -d all
done
for b in all_reduce reduce_scatter reduce; do
  t nt_ops_$b 40 $MPI ./nccl-tests/build/${b}_perf -b 8 -e 64K -f 64 -n 2 -w 1 -c 1 -d all -o all
done
t streams 100 ./run-tests.sh two_streams
t executor 150 ./run-tests.sh executor::cuda
t nccl_lib 150 ./run-tests.sh lifecycle
t coll 150 env MSCCLPP_TEST_DTYPES=bfloat16,float,int8 ./run-tests.sh collectives::cuda::default::2_ranks
for p in plans/*.json; do
  t plan256_$(basename $p .json) 40 ./bin/mscclpp-perf plan --ranks 2 -b 256M -e 256M -n 3 -w 1 $p
done
true
} > $OUT/$R.log 2>&1
cp nt-build.log $OUT/ 2>/dev/null
