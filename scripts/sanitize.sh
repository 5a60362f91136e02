#!/usr/bin/env bash
# ASan + UBSan run of the C core: builds the CPU extension (csrc/, VGCT_CUDA=0) with
# -fsanitize=address,undefined (UBSan fatal: -fno-sanitize-recover), and the ctypes engine harness
# of the tests the same way (VGCT_TEST_CFLAGS), into a scratch folder, then runs the bridge and
# engine tests against that build with the ASan runtime preloaded into python.
#   bash scripts/sanitize.sh                 # test_bridge.py + test_exchange_*.py + test_engine_internals.py + test_quantiles.py
#   bash scripts/sanitize.sh -k overflow     # extra pytest arguments
# Leak detection is off (CPython's own allocations at exit are not ours); every use-after-free,
# out-of-bounds access, double free and undefined behaviour in csrc/ fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_env.sh
vgct_build_deps
vgct_need pytest:pytest hypothesis:hypothesis "numpy:numpy>=2.1" ml_dtypes:ml_dtypes

CC="${CC:-$(command -v clang || command -v gcc)}"
export CC
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g"
runtime="$("$CC" -print-file-name=libclang_rt.asan-x86_64.so)"
[[ -f "$runtime" ]] || runtime="$("$CC" -print-file-name=libasan.so)"
if [[ ! -f "$runtime" ]]; then
  echo "sanitize.sh: no ASan runtime found for $CC" >&2
  exit 1
fi

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
echo "+ $CC $SAN build (CPU only) into $scratch" >&2
CFLAGS="$SAN -O1" LDFLAGS="$SAN" VGCT_CUDA=0 "$PY" setup.py -q build_ext -b "$scratch/build" -t "$scratch/tmp"
# the package: the Python files of this tree + the sanitized _C
mkdir -p "$scratch/pkg"
cp -r vgct_ext "$scratch/pkg/"
rm -f "$scratch/pkg/vgct_ext/"_C*.so
cp "$scratch"/build/vgct_ext/_C*.so "$scratch/pkg/vgct_ext/"
# an editable install (pip install -e .) maps vgct_ext to this tree through a meta path finder
# that would win over PYTHONPATH: drop it in this run only
cat > "$scratch/pkg/sitecustomize.py" <<'PYEOF'
import sys
sys.meta_path[:] = [f for f in sys.meta_path if not str(getattr(f, "__module__", "")).startswith("__editable__")]
PYEOF

export PYTHONPATH="$scratch/pkg${PYTHONPATH:+:$PYTHONPATH}"
export VGCT_TEST_CFLAGS="$SAN"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:allocator_may_return_null=1:handle_segv=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
T="$PWD/tests/unittest/_torch/visual_gen/vgct"
cd "$scratch" # not the tree's root: its vgct_ext/ (the unsanitized _C) would come first on sys.path
LD_PRELOAD="$runtime" "$PY" -c "import vgct_ext, sys; f = vgct_ext._C.__file__; print('sanitized _C:', f); sys.exit(0 if f.startswith('$scratch') else 1)"
LD_PRELOAD="$runtime" "$PY" -m pytest -q -p no:cacheprovider "$T/test_bridge.py" "$T/test_exchange_api.py" \
  "$T/test_exchange_attacks.py" "$T/test_engine_internals.py" \
  "$T/test_quantiles.py" -k "not ctrl_c" "$@"
