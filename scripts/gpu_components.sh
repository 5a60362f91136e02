#!/usr/bin/env bash
# GPU run of the component parity suite (issue [D]) on a CUDA machine without network (the H200 boxes):
#
#   bash scripts/gpu_components.sh            # writes into $OUT (or ./build/gpu_components when unset)
#
# 1. installs the carried wheels from .whl/ (diffusers, pure Python, --no-deps: the box's torch stays) into
#    /tmp/vgct-site and puts it on PYTHONPATH;
# 2. builds vgct_ext with its CUDA kernels (pip install --no-build-isolation --no-deps -e ., sm_90);
# 3. calibration pass: the GPU T2 tests with --vgct-calibrate record the sm_90 stratum into the evidence JSON files
#    next to the test modules (the CPU strata already there are kept);
# 4. gating pass: every GPU component test (T1 and T2 against the evidence just recorded) with --vgct-repeat=2
#    (bitwise run-to-run check) and --vgct-report=$OUT/report.json;
# 5. copies the evidence files and the report to $OUT and prints the evidence summary last.
#
# PASS1_TIMEOUT / PASS2_TIMEOUT (seconds, default 0 = none) bound the two pytest passes.
#
# Needs a python3 with torch (CUDA), transformers, huggingface_hub, safetensors, pytest (the H200 image has them)
# and the wheels: python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#   --platform manylinux2014_x86_64 -d .whl diffusers==0.42.1
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/build/gpu_components}"
mkdir -p "$OUT/evidence"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
# keep NVLink multicast off on shared multi-GPU hosts (no-ops where already set)
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}" TORCH_SYMM_MEM_DISABLE_MULTICAST="${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}"
export NVSHMEM_DISABLE_NVLS="${NVSHMEM_DISABLE_NVLS:-1}"
LOG="$OUT/gpu_components.log"
: >"$LOG"
say() { echo "== $*" | tee -a "$LOG"; }

say "machine: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | paste -sd ';')"
if ls .whl/*.whl >/dev/null 2>&1; then
  say "installing carried wheels: $(ls .whl/*.whl | xargs -n1 basename | paste -sd ' ')"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/vgct-site \
    .whl/*.whl >>"$LOG" 2>&1 || { say "wheel install failed"; tail -20 "$LOG"; exit 3; }
  export PYTHONPATH="/tmp/vgct-site${PYTHONPATH:+:$PYTHONPATH}"
fi
"$PY" -c "import torch, diffusers, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'gpus', torch.cuda.device_count(), '| diffusers', diffusers.__version__, '| transformers', transformers.__version__)" \
  2>&1 | tee -a "$LOG"

say "building vgct_ext (CUDA, sm_90)"
t0=$SECONDS
VGCT_CUDA_ARCHS="${VGCT_CUDA_ARCHS:-90}" "$PY" -m pip install -q --no-build-isolation --no-deps -e . >>"$LOG" 2>&1 \
  || { say "vgct_ext build failed"; tail -40 "$LOG"; exit 4; }
"$PY" -c "import vgct_ext, json; print('vgct_ext build:', json.dumps(vgct_ext.build_info()))" 2>&1 | tee -a "$LOG"
say "build took $((SECONDS - t0)) s"

SUITE=tests/unittest/_torch/visual_gen
COMMON=(-p no:cacheprovider -q -rs --ignore="$SUITE/vgct")

say "pass 1: calibrate the sm_90 stratum (GPU T2 tests)"
t0=$SECONDS
timeout "${PASS1_TIMEOUT:-0}" "$PY" -m pytest "$SUITE" "${COMMON[@]}" -m "gpu and t2" --vgct-calibrate 2>&1 | \
  tee -a "$LOG" | \
  grep -E "evidence written|cosine bar|passed|failed|error" || true
say "calibration took $((SECONDS - t0)) s"

say "pass 2: gate every GPU component test, --vgct-repeat=2, report"
t0=$SECONDS
timeout "${PASS2_TIMEOUT:-0}" "$PY" -m pytest "$SUITE" "${COMMON[@]}" -m gpu --vgct-repeat=2 \
  --vgct-report="$OUT/report.json" >"$OUT/pass2.log" 2>&1
rc=$?
say "gating pass exit status $rc after $((SECONDS - t0)) s"
grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed" "$OUT/pass2.log" | tail -40 | tee -a "$LOG"

for f in "$SUITE"/*/*.vgct-evidence.json; do
  cp "$f" "$OUT/evidence/$(basename "$(dirname "$f")")__$(basename "$f")"
done
if [ -f "$OUT/report.json" ]; then
  "$PY" scripts/main_job.py --summarize "$OUT/report.json" 2>&1 | tee -a "$LOG"
fi
say "gpu_components: exit status $rc"
exit "$rc"
