#!/usr/bin/env bash
# scripts/gpu_check.sh -- everything issue [B] asks of a GPU machine, in one run:
#   1. build vgct_ext with its CUDA kernels (no network: --no-build-isolation --no-deps)
#   2. a smoke run of every kernel (scripts/gpu_sanitize.py), then the GPU tests
#      (every test under tests/.../vgct marked gpu: test_gpu.py, the sharded NCCL
#      cases, the GPU probes and gates), in GPU_CHECK_JOBS (4) processes at once
#   3. the benchmark bench/bench_gpu.py (ratio table) and a latency breakdown
#      (bench/gpu_diag.py; GPU_CHECK_NCU=1 adds an ncu profile of the reduce kernel)
#   4. compute-sanitizer memcheck and racecheck on scripts/gpu_sanitize.py (when present)
#   5. the CPU statistics tests (GPU_CHECK_CPU_TESTS=0 skips them)
# Logs go to $OUT (default ./gpu_check_out); a short summary table is printed last.
# GPU_CHECK_BUDGET (seconds, default 900) bounds the whole run: each step gets at most
# what is left, so the summary always prints.  Exit status: 0 when every step passed.
#
#   bash scripts/gpu_check.sh                 # on a machine with a CUDA GPU
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
BUDGET=${GPU_CHECK_BUDGET:-900}
T0=$(date +%s)
declare -a SUMMARY=()
FAILED=0

left() { echo $(( BUDGET - ($(date +%s) - T0) )); }

# step NAME MAX_SECONDS command...
step() {
  local name=$1 max=$2
  shift 2
  local lim
  lim=$(left)
  (( lim > max )) && lim=$max
  if (( lim < 10 )); then
    SUMMARY+=("$(printf '%-22s %-8s %6s  %s' "$name" "SKIPPED" "-" "no time left in GPU_CHECK_BUDGET")")
    FAILED=1
    return
  fi
  local t=$(date +%s)
  echo "== $name (limit ${lim}s): $*" | tee -a "$OUT/steps.log"
  timeout -k 10 "$lim" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  local dt=$(( $(date +%s) - t ))
  local what
  what=$(grep -E "passed|failed|error|ERROR SUMMARY|sanitize script: done|Traceback" "$OUT/$name.log" | tail -1)
  [[ -z "$what" ]] && what=$(tail -1 "$OUT/$name.log")
  local st=ok
  (( rc == 124 || rc == 137 )) && st=TIMEOUT
  (( rc != 0 && rc != 124 && rc != 137 )) && st="rc=$rc"
  (( rc != 0 )) && FAILED=1
  SUMMARY+=("$(printf '%-22s %-8s %5ss  %s' "$name" "$st" "$dt" "${what:0:110}")")
  echo "   -> $st in ${dt}s: $what" | tee -a "$OUT/steps.log"
}

{
  date -u
  nvidia-smi -L 2>&1 || true
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 || true
  $PY -c "import torch, numpy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'numpy', numpy.__version__, 'devices', torch.cuda.device_count())"
  command -v nvcc && nvcc --version | tail -2
  command -v compute-sanitizer || echo "no compute-sanitizer"
} > "$OUT/env.log" 2>&1

step build 420 $PY -m pip install --no-build-isolation --no-deps -v -e .
step info 60 $PY -c "import vgct_ext, json; print(json.dumps(vgct_ext.build_info()))"
step smoke 120 $PY scripts/gpu_sanitize.py
# GPU_CHECK_JOBS pytest processes side by side (default 4; 1: one process): the GPU tests are
# mostly host-bound (CPU engine, float64 oracle), so they share the device (scripts/pytest_split.sh)
step gpu_tests 420 env PYTHON="$PY" bash scripts/pytest_split.sh "${GPU_CHECK_JOBS:-4}" -q -m gpu -rs \
  tests/unittest/_torch/visual_gen/vgct
step bench 420 $PY bench/bench_gpu.py --json "$OUT/bench.json" ${GPU_CHECK_BENCH_ARGS:-}
step diag 120 $PY bench/gpu_diag.py
step trace 60 env VGCT_CUDA_TRACE=1 $PY bench/gpu_diag.py --trace
if [[ "${GPU_CHECK_NCU:-0}" != 0 ]] && command -v ncu > /dev/null 2>&1; then
  step ncu 150 ncu --clock-control none --kernel-name regex:k_reduce_flat --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats \
    --section LaunchStats $PY bench/gpu_diag.py --ncu-target
fi
if command -v compute-sanitizer > /dev/null 2>&1 && [[ "${GPU_CHECK_SANITIZER:-1}" != 0 ]]; then
  step memcheck 240 compute-sanitizer --tool memcheck --error-exitcode 9 --kernel-name kns=k_ \
    $PY scripts/gpu_sanitize.py
  step racecheck 240 compute-sanitizer --tool racecheck --error-exitcode 9 --kernel-name kns=k_ \
    $PY scripts/gpu_sanitize.py
fi
if [[ "${GPU_CHECK_CPU_TESTS:-1}" != 0 ]]; then
  step cpu_stats_tests 300 $PY -m pytest -q -p no:cacheprovider \
    tests/unittest/_torch/visual_gen/vgct/test_stats_oracle.py
fi

echo
echo "==== bench (ratio table) ===="
sed -n '/^case /,$p' "$OUT/bench.log" 2>/dev/null
echo
echo "==== gpu_check summary ($(( $(date +%s) - T0 ))s, logs in $OUT) ===="
printf '%-22s %-8s %6s  %s\n' step status time "last line"
for l in "${SUMMARY[@]}"; do echo "$l"; done
exit $FAILED
