#!/usr/bin/env bash
# Real NCCL clients we did not write, run against our NCCL-compatible library on a GPU machine:
# nccl-tests (every binary, and its flags: parallel init, run cycles, null stream, registration,
# unaligned buffers, blocking, aggregation, memory report, graphs, device API, threads / GPUs per
# process), PyTorch (its feature matrix, re-initialisation, p2p batches; through LD_PRELOAD and
# through the Python package's backend), CuPy's NCCL binding, NVIDIA's nccl4py (every host call it
# makes), and JAX where its example exists.
# Each case is recorded PASS / FAIL / SKIP in a Markdown table (printed, and written to
# OUT/clients.md); each case's output is OUT/logs/<case>.log.
#
#   ci/gpu-clients.sh --lib PATH/libmscclpp_nccl.so [--py DIR] [--nccl-tests DIR] [--out DIR]
#                     [--nccl4py DIR] [--only LIST] [--limit SECONDS] [--ranks 2,4]
#
#   --lib         our library (required); preloaded into every NCCL client
#   --py          a directory holding the mscclpp_rs package (built extension included), put on
#                 PYTHONPATH for the `cuda:mscclpp` cases; without it those cases run if
#                 mscclpp_rs is importable anyway, else they are SKIPped
#   --nccl-tests  a directory of nccl-tests' built binaries (all_reduce_perf ..., MPI=1; or its
#                 build/ subdirectory); this script builds nothing
#   --nccl4py     nccl4py (PyPI, cp312): a directory holding its package (`nccl/core`: `pip install
#                 --no-deps --target DIR nccl4py==0.6.0`, or the wheel unzipped), or one holding
#                 its wheel (unpacked into OUT/nccl4py-pkg), e.g. the git-ignored .gpu-carry/nccl4py
#                 that `pip download --no-deps --python-version 3.12 --only-binary=:all:
#                 --platform manylinux_2_28_x86_64 nccl4py==0.6.0 -d .gpu-carry/nccl4py` fills;
#                 put on PYTHONPATH; without it the case runs if nccl4py is importable anyway
#   --out         where the table, logs and the build go (default ./gpu-clients)
#   --only        comma list: client names (nccl-tests, torch-matrix, torch-reinit, torch-p2p,
#                 cupy, nccl4py, jax) or shell globs over case names (e.g. 'nt-all_reduce-*',
#                 'nt-*-p1N2-*', '*-np4'); unselected cases are left out of the table
#   --limit       no case starts after this many seconds from the script's start (default 480;
#                 the build counts); later cases are SKIPped; a case's timeout is also cut so that
#                 it ends by limit + 60 s
#   --ranks       rank counts to run every case at (default 2)
#
# The machine (see docs/gpu-machines.md): NVIDIA H200, one GPU or two; nvcc, NCCL 2.28 at
# /lib/x86_64-linux-gnu/libnccl.so.2 (nccl-tests link it; our preloaded library's symbols win),
# Open MPI's mpirun, PyTorch (/opt/torch/.venv/bin/python3 if present, else python3), CuPy, JAX.
# With fewer GPUs than ranks every rank shares device 0: nccl-tests get NCCL_TESTS_DEVICE=0
# (the real NCCL refuses two ranks on one device; ours must not), and the Python examples use
# cuda:(local_rank % device_count), as torch_matrix.py does. With a GPU per rank, each rank has
# its own. The 'ranks' column counts NCCL ranks; 'note' says whether they shared a device.
#
# JAX: runs nccl/examples/jax_psum.py (when it exists) as
#   env MSCCLPP_NCCL_SO=LIB JAX_PSUM_NPROC=N <JAX_NCCL_RECIPE> PY nccl/examples/jax_psum.py --nproc N
# where JAX_NCCL_RECIPE (from the environment) is a space-separated list of VAR=VALUE
# assignments telling XLA how to reach our library, with @LIB@ replaced by the library's path
# and @LIBDIR@ by its directory. Unset, it is "LD_PRELOAD=DIR/mscclpp_rs/lib/nccl/libnccl.so.2"
# when --py DIR holds the wheel's JAX copy (SONAME libnccl.so.2: what `python -m mscclpp_rs.nccl
# --jax` tells users to preload; no patchelf), else "LD_PRELOAD=@LIB@" (which XLA does not reach).
#
# Exit status: 0 when no case FAILed (SKIPs allowed), 1 otherwise, 2 on bad arguments.
# Never creates NVLink multicast objects: NVLS is disabled for every client below.
export NCCL_NVLS_ENABLE=0 MSCCLPP_FORCE_DISABLE_NVLS=1
set -u

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
START=$(date +%s)

usage() { sed -n '11,34p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

LIB="" PYDIR="" NT_SRC="" N4P_SRC="" OUT="$PWD/gpu-clients" ONLY="" LIMIT=480 RANKS="2"
while [ $# -gt 0 ]; do
  case $1 in
    --lib|--py|--nccl-tests|--nccl4py|--out|--only|--limit|--ranks)
      [ $# -ge 2 ] || { echo "gpu-clients: $1 needs a value" >&2; exit 2; } ;;
  esac
  case $1 in
    --lib) LIB=${2:-}; shift 2 ;;
    --py) PYDIR=${2:-}; shift 2 ;;
    --nccl-tests) NT_SRC=${2:-}; shift 2 ;;
    --nccl4py) N4P_SRC=${2:-}; shift 2 ;;
    --out) OUT=${2:-}; shift 2 ;;
    --only) ONLY=${2:-}; shift 2 ;;
    --limit) LIMIT=${2:-}; shift 2 ;;
    --ranks) RANKS=${2:-}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu-clients: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
if [ -z "$LIB" ] || [ ! -f "$LIB" ]; then
  echo "gpu-clients: --lib PATH/libmscclpp_nccl.so is required (got '${LIB}')" >&2; exit 2
fi
case $LIMIT in ''|*[!0-9]*) echo "gpu-clients: --limit takes seconds, got '$LIMIT'" >&2; exit 2 ;; esac
IFS=, read -ra RANK_LIST <<< "$RANKS"
for n in "${RANK_LIST[@]}"; do
  case $n in ''|*[!0-9]*|0) echo "gpu-clients: --ranks takes a comma list of counts, got '$RANKS'" >&2; exit 2 ;; esac
done
ONLY_LIST=()
[ -n "$ONLY" ] && IFS=, read -ra ONLY_LIST <<< "$ONLY"
LIB=$(cd "$(dirname "$LIB")" && pwd)/$(basename "$LIB")
if [ -n "$PYDIR" ]; then
  [ -d "$PYDIR" ] || { echo "gpu-clients: --py '$PYDIR' is not a directory" >&2; exit 2; }
  PYDIR=$(cd "$PYDIR" && pwd)
fi
if [ -n "$N4P_SRC" ]; then
  [ -d "$N4P_SRC" ] || { echo "gpu-clients: --nccl4py '$N4P_SRC' is not a directory" >&2; exit 2; }
  N4P_SRC=$(cd "$N4P_SRC" && pwd)
fi
mkdir -p "$OUT/logs" || exit 2
OUT=$(cd "$OUT" && pwd)
rm -f "$OUT"/logs/*.log

PY=${CLIENTS_PY:-/opt/torch/.venv/bin/python3}
[ -x "$PY" ] || PY=$(command -v python3 || echo python3)
# JAX may live in another interpreter than PyTorch: the first of these that imports it.
JAX_PY=${JAX_PY:-}
if [ -z "$JAX_PY" ]; then
  for c in "$PY" "$(command -v python3)" /usr/bin/python3 /opt/*/.venv/bin/python3; do
    if [ -x "$c" ] && timeout 60 "$c" -c 'import jax' >/dev/null 2>&1; then JAX_PY=$c; break; fi
  done
fi
JAX_PY=${JAX_PY:-$PY}
# Python's own bin directory first (torchrun, and tools a venv brings), without activating it
PATH=$(dirname "$PY"):$PATH
export MSCCLPP_CACHE_DIR=${MSCCLPP_CACHE_DIR:-$OUT/kcache}
export MSCCLPP_LOG_LEVEL=${MSCCLPP_LOG_LEVEL:-warn}
unset NCCL_TESTS_DEVICE   # set per case below
GRACE=60

if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
  IFS=, read -ra _vis <<< "$CUDA_VISIBLE_DEVICES"; NGPU=${#_vis[@]}
else
  NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
fi
[ "${NGPU:-0}" -ge 1 ] 2>/dev/null || NGPU=0

# ---------------------------------------------------------------------------------------------
# the table

ROWS=()
NPASS=0 NFAIL=0 NSKIP=0

md() { # a table cell: one line, no pipes, at most 200 characters
  local s=${1//$'\n'/ }
  s=${s//|/\\|}
  s=${s//$'\r'/}
  [ ${#s} -gt 200 ] && s="${s:0:197}..."
  printf '%s' "$s"
}

add_row() { # client mode ranks result seconds note  (the case's name is appended to the note)
  local note
  note=$(md "$6")
  ROWS+=("| $(md "$1") | $(md "$2") | $3 | $4 | $5 | ${note:+$note }\`$CASE_NAME\` |")
  case $4 in PASS) NPASS=$((NPASS + 1)) ;; FAIL*) NFAIL=$((NFAIL + 1)) ;; SKIP*) NSKIP=$((NSKIP + 1)) ;; esac
  printf '[%4ss] %-44s %-5s %6s  %s\n' "$(( $(date +%s) - START ))" "$CASE_NAME" "$4" "$5" "$(md "$6")" >&2
}

selected() { # case-name client (its first word: nccl-tests, torch-matrix, ...)
  [ ${#ONLY_LIST[@]} -eq 0 ] && return 0
  local p
  for p in "${ONLY_LIST[@]}"; do
    # shellcheck disable=SC2053  # the right-hand side is a glob on purpose
    [[ $2 == "$p" || $1 == $p ]] && return 0
  done
  return 1
}

# nccl-tests' verdict from its output: exit status alone is not enough. Reads the header's
# '#wrong' columns and sums them over every result row; also the 'Out of bounds values' footer,
# per-rank 'rank=N #wrong=M' lines, and any line saying FAILED. Columns are counted from the
# right: the redop cell is blank for some binaries (hypercube), which shifts the left ones.
# 'N/A' is what nccl-tests prints where it does not check (in-place sendrecv and alltoall).
nt_parse() { # log -> "rows wrong oob_seen oob failed rankwrong checked unparsed"
  awk '
    /^#/ && / #wrong/ { np = 0; for (i = 1; i <= NF; i++) if ($i == "#wrong") off[np++] = NF - i; next }
    /Out of bounds values/ { seen = 1; v = $0; sub(/.*: */, "", v); split(v, a, " "); oob += a[1] + 0 }
    /rank=[0-9]+ #wrong=[0-9]+/ { rw++ }
    /FAILED/ { failed++ }
    /^#/ { next }
    np > 0 && $1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ {
      rows++
      for (k = 0; k < np; k++) {
        f = (NF - off[k] >= 1) ? $(NF - off[k]) : ""
        if (f == "N/A") continue
        if (f ~ /^[0-9.]+(e\+?[0-9]+)?$/) { wrong += f; checked++ } else bad++
      }
    }
    END { printf "%d %d %d %d %d %d %d %d\n", rows, wrong, seen, oob, failed, rw, checked, bad }
  ' "$1"
}

first_error() { # log: the first line that looks like the cause of a failure
  grep -m1 -E 'Test NCCL failure|Test CUDA failure|Test failure|[Ee]rror|FAILED|Segmentation|[Ss]ignal|Abort|invalid|not supported|Traceback|Timeout' "$1" \
    | grep -v '^# cmd:' | sed 's/^[[:space:]]*//' | cut -c1-160
}

py_fails() { # log: the names after FAIL on the clients' PASS/FAIL lines, unique, comma-joined
  grep -E '(^|[] ])FAIL( |$)' "$1" | awk '{for (i = 1; i <= NF; i++) if ($i == "FAIL") { print $(i + 1); break }}' \
    | sort -u | paste -sd, -
}

# run_case NAME CLIENT MODE RANKS KIND TIMEOUT NOTE -- COMMAND...
#   KIND nt: nccl-tests output parsed; py: exit status and the PASS/FAIL lines
run_case() {
  local name=$1 client=$2 mode=$3 ranks=$4 kind=$5 tmo=$6 note0=$7; shift 8
  CASE_NAME=$name
  selected "$name" "${client%% *}" || return 0
  local el=$(( $(date +%s) - START ))
  if [ "$el" -gt "$LIMIT" ]; then
    add_row "$client" "$mode" "$ranks" "SKIP" "-" "past --limit ${LIMIT}s (at ${el}s)"; return 0
  fi
  local left=$(( LIMIT + GRACE - el ))
  [ "$left" -lt 30 ] && left=30
  [ "$tmo" -gt "$left" ] && tmo=$left
  local log=$OUT/logs/$name.log
  {
    echo "# case $name: $client, $mode, $ranks ranks; $(date -Is); timeout ${tmo}s"
    printf '# cmd:'; printf ' %q' "$@"; echo
  } > "$log"
  local t0 t1 rc secs
  t0=$(date +%s.%N)
  timeout -k 15 "$tmo" "$@" >> "$log" 2>&1 < /dev/null
  rc=$?
  t1=$(date +%s.%N)
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  echo "# rc=$rc after ${secs}s" >> "$log"
  local result=PASS note="" why=()
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    why+=("timeout after ${tmo}s")
  elif [ "$rc" -ne 0 ]; then
    why+=("exit $rc")
  fi
  if [ "$kind" = nt ]; then
    local rows wrong seen oob failed rw checked bad
    read -r rows wrong seen oob failed rw checked bad < <(nt_parse "$log")
    [ "$rows" -eq 0 ] && why+=("no result rows")
    [ "$rows" -gt 0 ] && [ "$checked" -eq 0 ] && why+=("no checked #wrong cell")
    [ "$wrong" -ne 0 ] && why+=("#wrong $wrong")
    [ "$rw" -ne 0 ] && why+=("$rw rank #wrong lines")
    [ "$bad" -ne 0 ] && why+=("$bad unreadable #wrong cells")
    if [ "$seen" -eq 0 ]; then why+=("no 'Out of bounds values' line"); elif [ "$oob" -ne 0 ]; then why+=("out of bounds values $oob"); fi
    [ "$failed" -ne 0 ] && why+=("$failed FAILED lines")
    note="$rows rows, $checked #wrong cells checked, $wrong wrong"
  else
    local np nf names
    local nx
    np=$(grep -cE '(^|[] ])PASS( |$)' "$log")
    nf=$(grep -cE '(^|[] ])FAIL( |$)' "$log")
    nx=$(grep -cE '(^|[] ])XFAIL( |$)' "$log")   # refused by design, said so (nccl4py_check.py)
    names=$(py_fails "$log")
    [ "$nf" -ne 0 ] && why+=("FAIL: ${names:-$nf lines}")
    [ "$np" -eq 0 ] && [ "$nf" -eq 0 ] && why+=("no PASS/FAIL lines")
    note="$np PASS lines, $nf FAIL"
    [ "$nx" -ne 0 ] && note="$note, $nx XFAIL"
  fi
  if [ ${#why[@]} -gt 0 ]; then
    result=FAIL
    note=$(printf '%s; ' "${why[@]}")
    note=${note%; }
    local err
    err=$(first_error "$log")
    [ -n "$err" ] && note="$note; $err"
  fi
  [ -n "$note0" ] && note="$note0; $note"
  # the Python clients may say which NCCL libraries their process mapped (cupy_nccl.py does)
  local libs
  libs=$(grep -m1 '^# nccl libraries mapped: ' "$log" | sed 's/^# nccl libraries mapped: //')
  [ -n "$libs" ] && note="$note; mapped: $libs"
  add_row "$client" "$mode" "$ranks" "$result" "$secs" "$note"
}

skip_case() { # NAME CLIENT MODE RANKS REASON
  CASE_NAME=$1
  selected "$1" "${2%% *}" || return 0
  add_row "$2" "$3" "$4" "SKIP" "-" "$5"
}

# ---------------------------------------------------------------------------------------------
# nccl-tests: build

NT_BUILD=$OUT/nccl-tests-build
NT_OK=0 NT_WHY=""
NT_KNOWN=(all_reduce all_gather broadcast reduce_scatter reduce alltoall alltoallv scatter gather sendrecv hypercube)
# mode table for nccl-tests: slug|flags|binaries (core: NT_CORE; dev: those with a device
# implementation)|NCCL ranks per MPI process (-t 2 / -g 2: two)
NT_MODES=(
  "dall_oall|-d all -o all|core|1"
  "G3|-G 3|core|1"
  "p1|-p 1|core|1"
  "y1|-y 1|core|1"
  "R1|-R 1|core|1"
  "R2|-R 2|core|1"
  "u1|-u 1|core|1"
  "z1|-z 1|core|1"
  "a3|-a 3|core|1"
  "m2|-m 2|core|1"
  "M1|-M 1|core|1"
  "D1R2|-D 1 -R 2|dev|1"
  "D2R2|-D 2 -R 2|dev|1"
  "D1R2G3|-D 1 -R 2 -G 3|dev|1"
  "D3R2|-D 3 -R 2|gin|1"
  "D4R2|-D 4 -R 2|gin|1"
  "D3R2G3|-D 3 -R 2 -G 3|gin|1"
  "t2|-t 2|core|2"
  "g2|-g 2|core|2"
)
nt_wanted() { # is any nccl-tests case selected?
  [ ${#ONLY_LIST[@]} -eq 0 ] && return 0
  local b spec n
  for n in "${RANK_LIST[@]}"; do
    for b in "${NT_KNOWN[@]}"; do
      for spec in "default|" "p1N2|" "${NT_MODES[@]}"; do
        selected "nt-$b-${spec%%|*}-np$n" nccl-tests && return 0
      done
    done
  done
  return 1
}
# nccl-tests are not built here: --nccl-tests names a directory of built *_perf binaries (build
# them as docs/gpu-machines.md or nccl-tests' README says, MPI=1).
if [ -n "$NT_SRC" ] && [ -x "$NT_SRC/all_reduce_perf" ]; then
  NT_BUILD=$(cd "$NT_SRC" && pwd)
elif [ -n "$NT_SRC" ] && [ -x "$NT_SRC/build/all_reduce_perf" ]; then
  NT_BUILD=$(cd "$NT_SRC/build" && pwd)
fi
NT_DESC=""
if [ -x "$NT_BUILD/all_reduce_perf" ]; then
  NT_OK=1 NT_DESC="binaries in $NT_BUILD"
elif ! nt_wanted; then
  NT_WHY="not selected"
else
  NT_WHY="no nccl-tests binaries (give --nccl-tests DIR holding all_reduce_perf and the others, built with MPI=1)"
  CASE_NAME=nt-build; add_row "nccl-tests" "binaries" "-" "SKIP" "-" "$NT_WHY"
fi

# every binary that was built, in a fixed order first
NT_BINS=()
if [ "$NT_OK" = 1 ]; then
  for b in "${NT_KNOWN[@]}"; do
    [ -x "$NT_BUILD/${b}_perf" ] && NT_BINS+=("$b")
  done
  for f in "$NT_BUILD"/*_perf; do
    b=$(basename "$f" _perf)
    [[ " ${NT_BINS[*]} " == *" $b "* ]] || NT_BINS+=("$b")
  done
else
  NT_BINS=("${NT_KNOWN[@]}")
fi
NT_CORE=(all_reduce reduce_scatter sendrecv alltoall)

# the environment every rank gets: ours, NCCL's and mscclpp's variables
MPI_X=()
while read -r v; do
  case $v in NCCL_TESTS_DEVICE) ;; MSCCLPP_*|NCCL_*) MPI_X+=(-x "$v") ;; esac
done < <(compgen -e)
[ -n "${LD_LIBRARY_PATH:-}" ] && MPI_X+=(-x LD_LIBRARY_PATH)
declare -A NT_SKIP_DONE=()
NT_SIZES=(-b 8 -e 1M -f 16 -n 2 -w 1 -c 1)

# nt_case BIN SLUG "FLAGS" NRANKS [PER_PROC]   (PER_PROC: NCCL ranks per MPI process, -t/-g)
nt_case() {
  local bin=$1 slug=$2 flags=$3 n=$4 per=${5:-1}
  local name="nt-$bin-$slug-np$n" mode=${flags:-default}
  if [ "$NT_OK" != 1 ]; then # one row per rank count, not one per case
    selected "$name" nccl-tests || return 0
    [ -n "${NT_SKIP_DONE[$n]:-}" ] && return 0
    NT_SKIP_DONE[$n]=1
    skip_case "nt-*-np$n" nccl-tests "every binary and mode" "$n" "$NT_WHY"; return
  fi
  if [ ! -x "$NT_BUILD/${bin}_perf" ]; then skip_case "$name" "nccl-tests $bin" "$mode" "$n" "${bin}_perf not built"; return; fi
  local np=$(( n / per )) dev=() note
  if [ $(( np * per )) -ne "$n" ]; then skip_case "$name" "nccl-tests $bin" "$mode" "$n" "$n ranks are not $per per process"; return; fi
  if [ "$NGPU" -lt "$per" ]; then
    skip_case "$name" "nccl-tests $bin" "$mode" "$n" "needs $per GPUs per process (nccl-tests puts a process's threads/GPUs on consecutive devices), $NGPU here"; return
  fi
  if [ "$NGPU" -ge "$n" ]; then
    note="one GPU per rank"
  else
    dev=(-x NCCL_TESTS_DEVICE=0)
    if [ "$per" -gt 1 ]; then note="every process on devices 0..$((per - 1))"; else note="ranks share device 0"; fi
  fi
  case $slug in
    D3*|D4*) note="$note; NCCL's device API (GIN, proxy type; served to builds against NCCL >= 2.30.3 headers)" ;;
    D*) note="$note; NCCL's device API (LSA; a build against NCCL 2.28 headers runs it with MSCCLPP_NCCL_VERSION set to that release)" ;;
  esac
  local sizes=("${NT_SIZES[@]}")
  [ "$slug" = dall_oall ] && sizes=(-b 8 -e 64K -f 64 -n 2 -w 1 -c 1)
  # shellcheck disable=SC2086  # flags split on purpose
  run_case "$name" "nccl-tests $bin" "$mode" "$n" nt 90 "$note" -- \
    mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$np" \
      -x LD_PRELOAD="$LIB" "${MPI_X[@]}" "${dev[@]}" \
      "$NT_BUILD/${bin}_perf" "${sizes[@]}" $flags
}

# ---------------------------------------------------------------------------------------------
# Python clients

HAVE_TORCH=0 HAVE_CUPY=0 HAVE_MSCCLPP=0 WHY_TORCH="" WHY_CUPY="" WHY_MSCCLPP="" TORCH_VER=""
if out=$(timeout 120 "$PY" -c 'import torch; print(torch.__version__, torch.cuda.device_count())' 2>&1); then
  HAVE_TORCH=1 TORCH_VER=$(echo "$out" | tail -1)
else
  WHY_TORCH="torch not importable with $PY: $(echo "$out" | tail -1)"
fi
if out=$(timeout 120 "$PY" -c 'import cupy; from cupy.cuda import nccl; assert nccl.available; print(cupy.__version__)' 2>&1); then
  HAVE_CUPY=1
else
  WHY_CUPY="cupy.cuda.nccl not importable with $PY: $(echo "$out" | tail -1)"
fi
PYPATH_MSCCLPP=${PYDIR:+$PYDIR}${PYTHONPATH:+${PYDIR:+:}$PYTHONPATH}
if out=$(PYTHONPATH=$PYPATH_MSCCLPP timeout 120 "$PY" -c 'import mscclpp_rs, torch, mscclpp_rs.torch_backend' 2>&1); then
  HAVE_MSCCLPP=1
else
  WHY_MSCCLPP="mscclpp_rs.torch_backend not importable${PYDIR:+ from $PYDIR} (give --py DIR): $(echo "$out" | tail -1)"
fi

# nccl4py: the package directory for PYTHONPATH (--nccl4py DIR, or its wheel unpacked), or none
HAVE_N4P=0 WHY_N4P="" N4P_DIR="" N4P_DESC=""
if [ -n "$N4P_SRC" ] && [ -d "$N4P_SRC/nccl/core" ]; then
  N4P_DIR=$N4P_SRC
elif [ -n "$N4P_SRC" ]; then
  n4p_whl=$(ls -1 "$N4P_SRC"/nccl4py-*.whl 2>/dev/null | sort | tail -1)
  if [ -n "$n4p_whl" ]; then
    rm -rf "$OUT/nccl4py-pkg"
    if out=$("$PY" -m zipfile -e "$n4p_whl" "$OUT/nccl4py-pkg" 2>&1); then
      N4P_DIR=$OUT/nccl4py-pkg N4P_DESC="$(basename "$n4p_whl") unpacked"
    else
      WHY_N4P="cannot unpack $n4p_whl: $(echo "$out" | tail -1)"
    fi
  else
    WHY_N4P="--nccl4py $N4P_SRC holds neither nccl/core nor an nccl4py-*.whl"
  fi
fi
PYPATH_N4P=${N4P_DIR:+$N4P_DIR}${PYTHONPATH:+${N4P_DIR:+:}$PYTHONPATH}
if [ -z "$WHY_N4P" ]; then
  # import only: nccl4py loads libnccl at its first call, which this does not make
  if out=$(PYTHONPATH=$PYPATH_N4P timeout 120 "$PY" -c 'import nccl.core, cupy, cuda.pathfinder; print(nccl.core.__version__, nccl.core.__file__)' 2>&1); then
    HAVE_N4P=1 N4P_DESC="nccl4py $(echo "$out" | tail -1)${N4P_DESC:+ ($N4P_DESC)}"
  else
    n4p_hint=""; [ -z "$N4P_SRC" ] && n4p_hint=" (give --nccl4py DIR)"
    WHY_N4P="nccl4py not importable with $PY${N4P_DIR:+ from $N4P_DIR}$n4p_hint: $(echo "$out" | tail -1)"
  fi
fi

torchrun_cmd() { # NRANKS SCRIPT ARGS... -> the command, in TR
  local n=$1; shift
  TR=("$PY" -m torch.distributed.run --standalone --nproc_per_node="$n" "$@")
}

dev_note() { # NRANKS
  if [ "$NGPU" -ge "$1" ]; then echo "one GPU per rank"; else echo "ranks share cuda:0 (local_rank % device_count)"; fi
}

# torch_case NAME CLIENT MODE NRANKS BACKEND TIMEOUT SCRIPT ARGS...   (BACKEND nccl | mscclpp)
torch_case() {
  local name=$1 client=$2 mode=$3 n=$4 backend=$5 tmo=$6; shift 6
  if [ "$HAVE_TORCH" != 1 ]; then skip_case "$name" "$client" "$mode" "$n" "$WHY_TORCH"; return; fi
  if [ "$backend" = mscclpp ] && [ "$HAVE_MSCCLPP" != 1 ]; then skip_case "$name" "$client" "$mode" "$n" "$WHY_MSCCLPP"; return; fi
  torchrun_cmd "$n" "$@"
  tmo=$(( tmo * (n > 2 ? n : 2) / 2 ))
  if [ "$backend" = mscclpp ]; then
    run_case "$name" "$client" "$mode" "$n" py "$tmo" "$(dev_note "$n")" -- \
      env -u LD_PRELOAD PYTHONPATH="$PYPATH_MSCCLPP" "${CASE_ENV[@]}" "${TR[@]}"
  else
    run_case "$name" "$client" "$mode" "$n" py "$tmo" "$(dev_note "$n")" -- \
      env LD_PRELOAD="$LIB" "${CASE_ENV[@]}" "${TR[@]}"
  fi
}
# Extra VAR=VALUE assignments for the next torch_case (reset after it by the caller).
CASE_ENV=()

EX=$REPO/nccl/examples

# ---------------------------------------------------------------------------------------------
# the cases, most important first (--limit cuts the tail)

# the header of the report
HDR=()
HDR+=("# Clients against libmscclpp_nccl.so")
HDR+=("")
HDR+=("- date: $(date -Is), host $(hostname)")
HDR+=("- GPUs: $NGPU ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | sed 's/^ *//' | paste -sd, -))")
HDR+=("- library: $LIB (sha256 $(sha256sum "$LIB" | cut -c1-16))")
HDR+=("- MSCCLPP_NCCL_LIB_PATH (fallback to the real NCCL): ${MSCCLPP_NCCL_LIB_PATH:-unset}")
HDR+=("- NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE MSCCLPP_FORCE_DISABLE_NVLS=$MSCCLPP_FORCE_DISABLE_NVLS")
HDR+=("- python: $PY${TORCH_VER:+ (torch $TORCH_VER)}${PYDIR:+; mscclpp_rs from $PYDIR}")
HDR+=("- nccl-tests: ${NT_DESC:-$NT_WHY}")
HDR+=("- nccl4py: ${N4P_DESC:-$WHY_N4P}")
HDR+=("- ranks: $RANKS; --limit ${LIMIT}s")

for N in "${RANK_LIST[@]}"; do
  # nccl-tests, every binary, default flags
  for b in "${NT_BINS[@]}"; do nt_case "$b" default "" "$N"; done

  # PyTorch's feature matrix: NCCL process group over the preloaded library; the Python backend
  torch_case "torch-matrix-nccl-np$N" torch-matrix "torch_matrix.py nccl (LD_PRELOAD)" "$N" nccl 240 \
    "$EX/torch_matrix.py"
  torch_case "torch-matrix-mscclpp-np$N" torch-matrix "torch_matrix.py --backend mscclpp" "$N" mscclpp 240 \
    "$EX/torch_matrix.py" --backend mscclpp

  # the same under PyTorch's production allocator setting: a tensor spans several cuMemMap
  # mappings of one virtual range (DDP's buckets, the segments case)
  CASE_ENV=(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)
  torch_case "torch-matrix-expandable-nccl-np$N" torch-matrix "torch_matrix.py nccl (LD_PRELOAD), expandable_segments" \
    "$N" nccl 240 "$EX/torch_matrix.py"
  torch_case "torch-matrix-expandable-mscclpp-np$N" torch-matrix "torch_matrix.py --backend mscclpp, expandable_segments" \
    "$N" mscclpp 240 "$EX/torch_matrix.py" --backend mscclpp
  CASE_ENV=()

  # re-initialisation: 3 cycles of init / all_reduce / destroy
  for be in nccl mscclpp; do
    for m in eager lazy; do
      flag=(); [ "$m" = eager ] && flag=(--eager)
      label="nccl (LD_PRELOAD)"; [ "$be" = mscclpp ] && label="cuda:mscclpp"
      torch_case "torch-reinit-$be-$m-np$N" torch-reinit "torch_reinit.py $label $m" "$N" "$be" 120 \
        "$EX/torch_reinit.py" --backend "$be" "${flag[@]}" --cycles 3
    done
  done

  # batch_isend_irecv ring and pairwise all-to-all
  torch_case "torch-p2p-nccl-np$N" torch-p2p "torch_p2p_ring.py nccl (LD_PRELOAD)" "$N" nccl 120 \
    "$EX/torch_p2p_ring.py"
  torch_case "torch-p2p-mscclpp-np$N" torch-p2p "torch_p2p_ring.py cuda:mscclpp" "$N" mscclpp 120 \
    "$EX/torch_p2p_ring.py" --backend mscclpp

  # CuPy's NCCL binding
  if [ "$HAVE_CUPY" = 1 ]; then
    run_case "cupy-np$N" cupy "cupy_nccl.py (LD_PRELOAD)" "$N" py 180 "$(dev_note "$N")" -- \
      env LD_PRELOAD="$LIB" "$PY" "$EX/cupy_nccl.py" --nproc "$N"
  else
    skip_case "cupy-np$N" cupy "cupy_nccl.py (LD_PRELOAD)" "$N" "$WHY_CUPY"
  fi

  # NVIDIA's nccl4py: every host call it makes. It dlsym()s from the libnccl.so.2 that
  # cuda.pathfinder finds already loaded, so the script loads a copy of LIB whose SONAME is
  # libnccl.so.2 (made in Python, in a temporary directory) before nccl4py; no LD_PRELOAD.
  if [ "$HAVE_N4P" = 1 ]; then
    run_case "nccl4py-np$N" nccl4py "nccl4py_check.py (libnccl.so.2 copy loaded first)" "$N" py 420 \
      "$(dev_note "$N"); XFAIL lines: calls refused by design" -- \
      env -u LD_PRELOAD PYTHONPATH="$PYPATH_N4P" MSCCLPP_NCCL_SO="$LIB" \
      "$PY" "$EX/nccl4py_check.py" --nproc "$N" --timeout 400
  else
    skip_case "nccl4py-np$N" nccl4py "nccl4py_check.py (libnccl.so.2 copy loaded first)" "$N" "$WHY_N4P"
  fi

  # JAX (nccl/examples/jax_psum.py, written elsewhere)
  if [ -f "$EX/jax_psum.py" ]; then
    jax_copy=${PYDIR:+$PYDIR/mscclpp_rs/lib/nccl/libnccl.so.2}
    if [ -n "$jax_copy" ] && [ -f "$jax_copy" ]; then
      jdefault="LD_PRELOAD=$jax_copy" jwhat="unset, the wheel's libnccl.so.2 preloaded"
    else
      jdefault="LD_PRELOAD=@LIB@" jwhat="unset, LD_PRELOAD only"
    fi
    recipe=${JAX_NCCL_RECIPE:-$jdefault}
    recipe=${recipe//@LIBDIR@/$(dirname "$LIB")}
    recipe=${recipe//@LIB@/$LIB}
    read -ra recipe_env <<< "$recipe"
    jnote="recipe: ${JAX_NCCL_RECIPE:-$jwhat}; $(dev_note "$N")"
    run_case "jax-np$N" jax "jax_psum.py" "$N" py 180 "$jnote" -- \
      env MSCCLPP_NCCL_SO="$LIB" JAX_PSUM_NPROC="$N" "${recipe_env[@]}" "$JAX_PY" "$EX/jax_psum.py" --nproc "$N"
  else
    skip_case "jax-np$N" jax "jax_psum.py" "$N" "nccl/examples/jax_psum.py is missing"
  fi

  # nccl-tests, every binary: parallel init (communicators made on threads that exit) and 2 run cycles
  for b in "${NT_BINS[@]}"; do nt_case "$b" p1N2 "-p 1 -N 2" "$N"; done

  # nccl-tests, the other flags, on all_reduce, reduce_scatter, sendrecv and alltoall
  for spec in "${NT_MODES[@]}"; do
    IFS='|' read -r slug flags set per <<< "$spec"
    case $set in
      core) bins=("${NT_CORE[@]}") ;;
      dev) bins=(all_reduce alltoall) ;;   # the binaries with a device implementation (-D 1 = LSA)
      gin) bins=(alltoall) ;;              # GIN (-D 3) and hybrid LSA+GIN (-D 4): alltoall's
    esac
    for b in "${bins[@]}"; do nt_case "$b" "$slug" "$flags" "$N" "$per"; done
  done
done

# ---------------------------------------------------------------------------------------------
# the report

TOTAL=$(( $(date +%s) - START ))
{
  printf '%s\n' "${HDR[@]}"
  echo "- total: ${TOTAL}s; $NPASS PASS, $NFAIL FAIL, $NSKIP SKIP; logs in $OUT/logs/<case>.log"
  echo
  echo "| client | mode | ranks | result | seconds | note |"
  echo "| --- | --- | ---: | --- | ---: | --- |"
  printf '%s\n' "${ROWS[@]}"
} > "$OUT/clients.md"
echo
cat "$OUT/clients.md"
[ "$NFAIL" -eq 0 ]
