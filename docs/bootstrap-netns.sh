#!/usr/bin/env bash
# Runs `mscclpp-perf bootstrap` as several hosts: one network namespace per host, joined by a
# bridge, each rank started as torchrun would start it (RANK, WORLD_SIZE, LOCAL_RANK,
# MASTER_ADDR/MASTER_PORT) with MSCCLPP_HOSTID naming its namespace. Needs root (ip netns).
#
#   docs/bootstrap-netns.sh HOSTS RANKS_PER_HOST [PERF_BINARY]
#
# Removes its namespaces, veths and bridge on exit.
set -euo pipefail
HOSTS=${1:?hosts}
PER=${2:?ranks per host}
PERF=${3:-target/release/mscclpp-perf}
N=$((HOSTS * PER))
BR=mscbr0
PREFIX=mscns
cleanup() {
    for i in $(seq 0 $((HOSTS - 1))); do
        ip netns del "$PREFIX$i" 2>/dev/null || true
        ip link del "mscv$i" 2>/dev/null || true
    done
    ip link del "$BR" 2>/dev/null || true
}
trap cleanup EXIT
cleanup
ip link add "$BR" type bridge
ip link set "$BR" up
for i in $(seq 0 $((HOSTS - 1))); do
    ns="$PREFIX$i"
    ip netns add "$ns"
    ip link add "mscv$i" type veth peer name eth0 netns "$ns"
    ip link set "mscv$i" master "$BR" up
    ip -n "$ns" addr add "10.77.0.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
done
pids=()
for i in $(seq 0 $((HOSTS - 1))); do
    for j in $(seq 0 $((PER - 1))); do
        r=$((i * PER + j))
        out=/dev/null
        [ "$r" -eq 0 ] && out=/dev/stdout
        ip netns exec "$PREFIX$i" env RANK=$r WORLD_SIZE=$N LOCAL_RANK=$j LOCAL_WORLD_SIZE=$PER \
            MASTER_ADDR=10.77.0.1 MASTER_PORT=29500 MSCCLPP_HOSTID="netns-host-$i" \
            "$PERF" bootstrap >"$out" &
        pids+=($!)
    done
done
fail=0
for p in "${pids[@]}"; do wait "$p" || fail=$((fail + 1)); done
echo "# $HOSTS namespaces x $PER ranks: $fail failed"
exit $((fail > 0))
