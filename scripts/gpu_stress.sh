#!/usr/bin/env bash
# scripts/gpu_stress.sh -- one pytest selection run over and over by JOBS processes at once, for a
# time: a wrong result that shows only now and then, under load, is caught by repetition.  Each
# process reruns the selection until SECONDS have passed (a run still going then is stopped and
# not counted); the log of every failing run is kept.
#
#   bash scripts/gpu_stress.sh JOBS SECONDS PYTEST_ARGS...
#   # e.g. the ring's intermittent wrong pair data (docs/performance.md, 2026-12-03 15:50 UTC):
#   bash scripts/gpu_stress.sh 4 150 -m gpu tests/unittest/_torch/visual_gen/vgct/test_gpu.py -k fused_window
#
# Unlike scripts/pytest_split.sh, which deals a selection's tests out to its processes once, every
# process here runs the whole selection, so the processes share the device the whole time (on one
# GPU, four processes' kernels are time-sliced: that is the load under which the failure above
# showed, once in ~7 runs).  Run it from the repository root.  Python: $PYTHON (default python3).
# Logs: $STRESS_DIR (default: a new temporary directory), fail_p<k>_<run>.log for each failing run.
# Prints a line per run and a summary; exit status 0 when no run failed, 1 when one did, 2 on a
# usage error, 5 when no run completed.
set -u -o pipefail
if (( $# < 3 )) || ! [[ "$1" =~ ^[1-9][0-9]*$ && "$2" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 JOBS SECONDS PYTEST_ARGS...  (JOBS, SECONDS: positive integers; got '${1:-}' '${2:-}')" >&2
  exit 2
fi
JOBS=$1
SECS=$2
shift 2
PY=${PYTHON:-python3}
DIR=${STRESS_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/gpu_stress.XXXXXX")}
mkdir -p "$DIR" || exit 2
END=$(( $(date +%s) + SECS ))

one() {  # process $1: rerun the selection ($2...) until END; each run's status into $DIR/p$1.runs
  local k=$1 i=0 left rc
  shift
  while left=$(( END - $(date +%s) )); (( left > 0 )); do
    i=$((i + 1))
    timeout "$left" "$PY" -m pytest -q -p no:cacheprovider --tb=long "$@" > "$DIR/p$k.log" 2>&1
    rc=$?
    if (( rc == 124 )); then
      echo "p$k run $i: stopped at the time limit (not counted)"
      break
    fi
    (( rc != 0 )) && cp "$DIR/p$k.log" "$DIR/fail_p${k}_$i.log"
    echo "p$k run $i rc $rc: $(tail -n 1 "$DIR/p$k.log")"
    echo "$rc" >> "$DIR/p$k.runs"
  done
}

for k in $(seq 1 "$JOBS"); do
  one "$k" "$@" &
done
wait
runs=$(cat "$DIR"/p*.runs 2>/dev/null | wc -l)
failed=$(cat "$DIR"/p*.runs 2>/dev/null | grep -cv '^0$')
echo "gpu_stress: $runs runs completed, $failed failed (logs in $DIR)"
(( runs == 0 )) && exit 5
(( failed > 0 )) && exit 1
exit 0
