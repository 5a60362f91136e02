#!/usr/bin/env bash
# Build vgct_ext and run the whole test suite; extra arguments go to pytest.
#   bash scripts/test.sh            # everything
#   bash scripts/test.sh -k wan     # a subset
# Installs what the tests need when missing: pytest, hypothesis, numpy, safetensors, filelock, py-cpuinfo,
# pytest-xdist, scipy, pytest-rerunfailures, the pinned
# component stack (diffusers, transformers: scripts/main_job.py PINS), and torch
# (torch==2.13.0, the CPU build here) only when no torch is importable: a torch you have is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_env.sh

vgct_need pytest:pytest hypothesis:hypothesis "numpy:numpy>=2.1" safetensors:safetensors ml_dtypes:ml_dtypes
# the method layer's runtime dependencies (pip install -e . runs with --no-deps), and for the tests:
# pytest-xdist (the -n 2 calibration test) and scipy (Student's t oracle of the bar rule)
vgct_need "rich:rich>=13" filelock:filelock cpuinfo:py-cpuinfo xdist:pytest-xdist scipy:scipy
# pytest-rerunfailures (a gate's verdict retried away by --reruns; inert without that option): best effort -- a
# package index without it skips that one test rather than failing the run
vgct_need pytest_rerunfailures:pytest-rerunfailures || echo "+ pytest-rerunfailures not installed: its test skips" >&2
vgct_need_torch
vgct_build
"$PY" scripts/main_job.py --install-deps --no-run

exec "$PY" -m pytest tests/unittest/_torch/visual_gen "$@"
