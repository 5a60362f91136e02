# Shared by scripts/main_job.sh, scripts/test.sh and .ci/run (sourced, not run).
# Picks the Python, installs the build requirements when missing and builds vgct_ext in place.

PY="${PYTHON:-$(command -v python3 || command -v python)}"
PIP=("$PY" -m pip --disable-pip-version-check)

# pip-install each "module:requirement" whose module does not import; never upgrades what is there
vgct_need() {
  local want=() spec
  for spec in "$@"; do
    "$PY" -c "import ${spec%%:*}" >/dev/null 2>&1 || want+=("${spec#*:}")
  done
  if ((${#want[@]})); then
    echo "+ pip install ${want[*]}" >&2
    "${PIP[@]}" install -q "${want[@]}"
  fi
}

# setuptools >= 64 builds PEP 660 editable installs; numpy's headers are a build input;
# numpy >= 2.1 exports versioned DLPack capsules (with the read-only flag: read-only arrays work)
vgct_build_deps() {
  "$PY" - <<'PYEOF' >/dev/null 2>&1 || { echo "+ pip install setuptools>=64 wheel numpy>=2.1" >&2; "${PIP[@]}" install -q "setuptools>=64" wheel "numpy>=2.1"; }
import setuptools, wheel, numpy
assert int(setuptools.__version__.split(".")[0]) >= 64
assert tuple(int(x) for x in numpy.__version__.split(".")[:2]) >= (2, 1)
PYEOF
}

# pip install -e . (no build isolation: nothing downloaded), under a lock when flock exists
vgct_build() {
  vgct_build_deps
  local cmd=("${PIP[@]}" install -q --no-build-isolation --no-deps -e .)
  echo "+ ${cmd[*]}" >&2
  if command -v flock >/dev/null 2>&1; then
    flock /tmp/vgct-build.lock "${cmd[@]}"
  else
    "${cmd[@]}"
  fi
  "$PY" -c "import vgct_ext, json; print('vgct_ext build:', json.dumps(vgct_ext.build_info()))"
}

# torch for the tests: only when none is importable (a torch the user has is never replaced)
vgct_need_torch() {
  if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "+ pip install ${VGCT_TORCH_SPEC:-torch==2.13.0}" >&2
    "${PIP[@]}" install -q "${VGCT_TORCH_SPEC:-torch==2.13.0}"
  fi
}
