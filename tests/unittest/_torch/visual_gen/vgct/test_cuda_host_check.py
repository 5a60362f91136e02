"""Host-side checks of the CUDA engine's helpers (no GPU needed; CI runs them where nvcc is).

cuda_host_check.cu compiles cuda/vgct_cuda_internal.cuh's __host__ __device__ code for the CPU and
checks the register accumulator of the reduce kernels and their narrow-dtype chunk fast path
against vgct_acc_update (bit for bit / maxima and counters exact), the exact 64-bit division by
constants against '/', the selection key of binary32 pairs against vgct_absdiff_key, and the exact
integer pairs (vgct_int_pair) against 128-bit integer arithmetic, the fused key window's chunk
test (vg_win_t32_of: no pair with its key at or above lo passes; a bound 2^-20 too high is
caught), the selection's distinct ascending ranks (vg_distinct_ascending), the fused window's
per-pair classification, and its sparse way (every pair whose key is at or above the window's low
end is a candidate, and the candidates' keys give the whole chunk's counts), and the lean kernel's
typed loop (finiteness tested in float32, the last flush a store into a record nothing was folded
into: the same record as vg_pair and vg_hot_flush, bit for bit; a planted fault must differ),
and the bfloat16 conversion of the loaders and of the vector path (vgct_bf16_of_word) against the
format's fields on every bfloat16 pattern, in both halves of a word, and the fast kernels' flush
(vg_hot_flush_sums: sums and counters added) against vg_hot_flush, bit for bit, and the ring
kernel's copies of a step over rows (vg_ring_segments: each chunk once, from its own row; at most two
copies from the kernel's step starts; a planted split that keeps the column at a row end fails),
and the flat index that kernel steps along its rows for each lane (VgRowCur) against the division
(rows of 32..1024 chunks and others, every start of the first three rows and random far ones; a
planted cursor that misses a row end inside a step, or one past a chunk's, fails).
Skips when nvcc is not found.
"""

import os
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", "..", "..", ".."))


def _nvcc():
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if home and os.path.isfile(os.path.join(home, "bin", "nvcc")):
            return os.path.join(home, "bin", "nvcc")
    return shutil.which("nvcc")


def test_cuda_helpers_on_the_host(tmp_path):
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found (CUDA_HOME, CUDA_PATH, PATH)")
    exe = tmp_path / "cuda_host_check"
    cmd = [nvcc, "-O2", "-std=c++17", "-I", os.path.join(ROOT, "csrc"), "-I", os.path.join(ROOT, "cuda"),
           os.path.join(HERE, "cuda_host_check.cu"), os.path.join(ROOT, "cuda", "runtime.cu"),
           "-o", str(exe), "-lpthread"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"nvcc failed:\n{r.stdout}\n{r.stderr}"
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.rstrip().endswith("17 passed, 0 failed"), r.stdout + r.stderr
