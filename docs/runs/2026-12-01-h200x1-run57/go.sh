#!/usr/bin/env bash
# run57 (session 7): one H200, 2 ranks share it. Copy-engine all-reduce and the copy-engine
# abort (with the default and with more hardware queues, to tell queue sharing apart), the other
# kill trials for comparison, and the overlap benchmark with the all-reduce row.
cd "$(dirname "$0")"
source ./env.sh
export MSCCLPP_CACHE_DIR=$PWD/kcache
R=${RUN:-run57}; LIMIT=${LIMIT:-400}; START=$(date +%s)
t() { local n=$1; shift
  if [ $(( $(date +%s) - START )) -gt $LIMIT ]; then echo "=== $n SKIPPED (past ${LIMIT}s)"; return; fi
  echo "=== $n $(date +%T) $*"; timeout "$@"; echo "rc=$? ($n)"; }
{
t ce_abort 90 ./tests/faults --test-threads=1 cuda::killed_during_ce
CUDA_DEVICE_MAX_CONNECTIONS=32 t ce_abort_32q 90 ./tests/faults --test-threads=1 cuda::killed_during_ce
t ce_abort_again 90 ./tests/faults --test-threads=1 cuda::killed_during_ce
t other_kills 200 ./tests/faults --test-threads=1 cuda::killed_during_
t ce_2 150 ./tests/collectives --test-threads=1 cuda::ce::2_ranks
t ce_4 150 ./tests/collectives --test-threads=1 cuda::ce::4_ranks
t wait64 60 ./tests/hal --test-threads=1 cuda::wait_value64
t overlap 60 ./bin/mscclpp-perf overlap -d bfloat16 -b 16M -e 64M -f 4 -n 3 -w 1 --collectives allreduce,allgather,reducescatter
true
} > $OUT/$R.log 2>&1
