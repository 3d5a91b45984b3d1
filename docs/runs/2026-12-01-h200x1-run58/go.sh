#!/usr/bin/env bash
# run58 (session 7): one H200. How often a copy-engine kill trial takes seconds (run56, run57:
# 5.3 and 5.6 s, other trials 64-67 ms), beside the LL trial; the 4-rank copy-engine
# conformance with the all-reduce (150 s was too short in run57).
cd "$(dirname "$0")"
source ./env.sh
export MSCCLPP_CACHE_DIR=$PWD/kcache
R=${RUN:-run58}; LIMIT=${LIMIT:-500}; START=$(date +%s)
t() { local n=$1; shift
  if [ $(( $(date +%s) - START )) -gt $LIMIT ]; then echo "=== $n SKIPPED (past ${LIMIT}s)"; return; fi
  echo "=== $n $(date +%T) $*"; timeout "$@"; echo "rc=$? ($n)"; }
{
t warm 90 ./tests/faults --test-threads=1 cuda::killed_during_ce
for i in 1 2 3 4 5 6 7 8; do t ce_kill_$i 40 ./tests/faults --test-threads=1 cuda::killed_during_ce 2>&1 | grep -E "survivor|result"; done
for i in 1 2 3; do t ll_kill_$i 40 ./tests/faults --test-threads=1 cuda::killed_during_ll 2>&1 | grep -E "survivor|result"; done
t ce_4 330 ./tests/collectives --test-threads=1 cuda::ce::4_ranks
true
} > $OUT/$R.log 2>&1
