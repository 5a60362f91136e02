#!/usr/bin/env bash
# scripts/pytest_split.sh -- one pytest selection run as JOBS processes at once: the test ids
# pytest collects are dealt round-robin to JOBS pytest processes, which run side by side.
# For the GPU suite on one GPU (scripts/gpu_check.sh): its tests spend most of their time on
# the host (the CPU engine and the float64 oracle each test compares against), so four
# processes share the device well -- on an H200 the ~870 GPU tests took 100-190 s a process in
# 4 processes against ~6 min in one (docs/performance.md, 2026-12-03).  A timing benchmark must
# not run beside it.
#
#   bash scripts/pytest_split.sh JOBS PYTEST_ARGS...     # e.g. 4 -q -m gpu tests/.../vgct
#
# Run it from the directory the test paths are under (the repository root): the collected ids
# are relative to it.
# Python: $PYTHON (default python3).  Each process's output goes to $SPLIT_DIR/part<k>.log
# (default: a new temporary directory); their failures and summary lines are printed, then one
# line with the sums.  Exit status: 0 when every process passed; 5 when nothing was collected;
# else the first non-zero status (collection errors: pytest's own).
set -u -o pipefail
if (( $# < 2 )) || ! [[ "$1" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 JOBS PYTEST_ARGS...  (JOBS: a positive integer, got '${1:-}')" >&2
  exit 2
fi
JOBS=$1
shift
PY=${PYTHON:-python3}
DIR=${SPLIT_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/pytest_split.XXXXXX")}
mkdir -p "$DIR" || exit 2

# the ids, with the selection's own options (-m, -k, paths; not the report's -q, -v, -r...:
# --collect-only -q prints one id a line, -qq would print counts a file)
sel=()
for a in "$@"; do
  [[ "$a" =~ ^-(q+|v+|r.*)$ ]] || sel+=("$a")
done
# (--rootdir: the ids relative to this directory, so that they name the tests from here)
"$PY" -m pytest --collect-only -q -p no:cacheprovider --rootdir="$PWD" "${sel[@]}" > "$DIR/collect.log" 2>&1
crc=$?
grep '::' "$DIR/collect.log" > "$DIR/ids.txt"
n=$(wc -l < "$DIR/ids.txt")
if (( crc != 0 && crc != 5 )); then
  tail -20 "$DIR/collect.log"
  echo "pytest_split: collection failed (status $crc)"
  exit "$crc"
fi
if (( n == 0 )); then
  tail -5 "$DIR/collect.log"
  echo "pytest_split: no tests collected"
  exit 5
fi
(( JOBS > n )) && JOBS=$n

# options of the run that are not paths: the collected ids replace the paths
opts=()
for a in "$@"; do
  [[ -e "$a" || "$a" == *::* ]] || opts+=("$a")
done

pids=()
for (( k = 0; k < JOBS; k++ )); do
  awk -v k="$k" -v j="$JOBS" '(NR - 1) % j == k' "$DIR/ids.txt" > "$DIR/ids$k.txt"
  mapfile -t ids < "$DIR/ids$k.txt"
  "$PY" -m pytest -p no:cacheprovider --rootdir="$PWD" "${opts[@]}" "${ids[@]}" > "$DIR/part$k.log" 2>&1 &
  pids+=($!)
done
rc=0
for (( k = 0; k < JOBS; k++ )); do
  wait "${pids[$k]}"
  r=$?
  (( r != 0 && rc == 0 )) && rc=$r
done

tot_p=0 tot_f=0 tot_s=0 tot_x=0 tot_e=0
for (( k = 0; k < JOBS; k++ )); do
  grep -E '^(FAILED|ERROR) ' "$DIR/part$k.log"
  line=$(grep -E '(passed|failed|error|skipped|no tests ran)' "$DIR/part$k.log" | tail -1)
  echo "  part $k: ${line:-no summary line (see $DIR/part$k.log)}"
  num() { echo "$line" | grep -oE "[0-9]+ $1" | head -1 | grep -oE '^[0-9]+' || echo 0; }
  tot_p=$(( tot_p + $(num passed) ))
  tot_f=$(( tot_f + $(num failed) ))
  tot_s=$(( tot_s + $(num skipped) ))
  tot_x=$(( tot_x + $(num xfailed) ))
  tot_e=$(( tot_e + $(num error) ))
done
echo "pytest_split: $tot_p passed, $tot_f failed, $tot_s skipped, $tot_x xfailed, $tot_e errors" \
  "of $n ids in $JOBS processes (status $rc; logs in $DIR)"
exit "$rc"
