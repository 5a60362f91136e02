#!/usr/bin/env bash
# bench/ncu_profile.sh -- where the reduce kernel's time goes (Nsight Compute):
#   1. the main kernel of one 2^26 bf16 compare (bench_gpu.py's data): speed of light,
#      occupancy, issue rate and the stall reasons per issued instruction;
#   2. the same for a 2^10 compare (one block: the fixed cost of a launch);
#   3. the two data passes of the exact p99 of the 2^26 compare (k_sel_data).
# Writes $OUT/ncu_{big,small,sel}.log and prints the headline numbers.
#   bash bench/ncu_profile.sh        # on a machine with a CUDA GPU and ncu
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
M='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,smsp__inst_executed_pipe_fp64.sum,smsp__inst_executed_pipe_fma.sum,smsp__inst_executed_pipe_alu.sum'
ncu --clock-control none --kernel-name regex:k_reduce --launch-count 1 \
  --section SpeedOfLight --section Occupancy --section SchedulerStats --section LaunchStats \
  --metrics "$M" $PY bench/gpu_diag.py --ncu-target > "$OUT/ncu_big.log" 2>&1
ncu --clock-control none --kernel-name regex:k_reduce --launch-skip 2 --launch-count 1 \
  --section SpeedOfLight --section SchedulerStats --section LaunchStats \
  --metrics "$M" $PY bench/gpu_diag.py --ncu-small > "$OUT/ncu_small.log" 2>&1
ncu --clock-control none --kernel-name regex:k_sel_data --launch-count 2 \
  --section SpeedOfLight --section Occupancy --section SchedulerStats --section LaunchStats \
  --metrics "$M" $PY bench/gpu_diag.py --ncu-target > "$OUT/ncu_sel.log" 2>&1
for f in ncu_big ncu_small ncu_sel; do
  echo "== $f"
  grep -E "^  k_|Duration|Issued Warp|Registers Per|Achieved Occ|Memory Throughput|Compute \(SM\)|inst_executed" "$OUT/$f.log"
  grep -E "issue_stalled" "$OUT/$f.log" | awk '{ if ($NF + 0 >= 0.05) print }' | sort -k3 -g -r | head -8
done
