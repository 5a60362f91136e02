#!/usr/bin/env bash
# The main job: build vgct_ext and run the component parity suite (issue [D]) on its embedded default:
# a representative subset of the diffusers component tests (every case not marked slow; the GPU cases
# too where a GPU is visible), printed as the evidence table, with the JSON report in build/.
#   bash scripts/main_job.sh                # the default subset
#   bash scripts/main_job.sh --full         # also the slow cases
#   bash scripts/main_job.sh -- -k wan      # extra pytest arguments after --
# Installs pytest and safetensors when missing, the pinned component stack (diffusers, transformers; see scripts/main_job.py PINS) and torch
# (torch==2.13.0, the CPU build, only when no torch is importable: a torch you have is kept).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_env.sh

vgct_need pytest:pytest "numpy:numpy>=2.1" safetensors:safetensors "rich:rich>=13" filelock:filelock cpuinfo:py-cpuinfo
vgct_need_torch
vgct_build
"$PY" scripts/main_job.py --install-deps --no-run
exec "$PY" scripts/main_job.py "$@"
