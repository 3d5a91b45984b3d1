#!/usr/bin/env bash
# run51: nccl-tests scatter/gather with the new exports; FSDP2 alone with debug logs of every call
cd "$(dirname "$0")"
source ./env.sh
export MSCCLPP_CACHE_DIR=$PWD/kcache
LIB=$PWD/lib/libmscclpp_nccl.so
t() { local n=$1; shift; echo "=== $n $(date +%T) $*"; timeout "$@"; echo "rc=$? ($n)"; }
{
( cd nccl-tests && make -j 16 MPI=1 MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi NCCL_HOME=/usr CUDA_HOME=/usr/local/cuda NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" > ../nccl-tests-build.log 2>&1; echo "nccl-tests build rc=$?" )
MPI="mpirun --allow-run-as-root --oversubscribe -np 2 -x LD_PRELOAD=$LIB -x NCCL_NVLS_ENABLE -x MSCCLPP_CACHE_DIR -x MSCCLPP_FORCE_DISABLE_NVLS=1 -x NCCL_TESTS_DEVICE=0"
for b in scatter gather; do
  t nt_$b 60 $MPI ./nccl-tests/build/${b}_perf -b 8 -e 1M -f 16 -n 2 -w 1 -c 1 -d all
  t nt_G_$b 30 $MPI ./nccl-tests/build/${b}_perf -b 8 -e 1M -f 64 -n 2 -w 1 -c 1 -G 2
done
t fsdp2_debug 90 env LD_PRELOAD=$LIB MSCCLPP_LOG_LEVEL=debug CUDA_LAUNCH_BLOCKING=1 torchrun --nproc_per_node=2 ../nccl/examples/torch_matrix.py --features fsdp2 > $OUT/fsdp2_debug.log 2>&1
tail -5 $OUT/fsdp2_debug.log
t fsdp2_nonblocking 90 env LD_PRELOAD=$LIB MSCCLPP_LOG_LEVEL=debug torchrun --nproc_per_node=2 ../nccl/examples/torch_matrix.py --features fsdp2 > $OUT/fsdp2_nb.log 2>&1
tail -5 $OUT/fsdp2_nb.log
t fsdp2_plain 90 env LD_PRELOAD=$LIB torchrun --nproc_per_node=2 ../nccl/examples/torch_matrix.py --features fsdp2 > $OUT/fsdp2_plain.log 2>&1
tail -5 $OUT/fsdp2_plain.log
} > $OUT/run51.log 2>&1
