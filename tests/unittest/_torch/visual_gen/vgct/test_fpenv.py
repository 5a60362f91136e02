"""The engines compute in IEEE 754's default floating-point environment whatever the caller's
thread set (csrc/vgct_fpenv.h, docs/metrics.md "Accuracy and determinism"), and hand the
caller's back on return.

Planted environments, each of which changed results before the fix (or would crash):

* ``torch.set_flush_denormal(True)`` (MXCSR.FTZ + DAZ on x86-64, FPCR.FZ on AArch64): a pair
  differing by subnormals read as equal (n_unequal 0, max_abs_err 0);
* ``fesetround(FE_UPWARD / FE_DOWNWARD / FE_TOWARDZERO)`` (glibc): every sum rounded one way;
* ``feenableexcept(FE_INVALID | FE_DIVBYZERO | FE_OVERFLOW)`` (glibc, x86-64): NaN/Inf inputs
  and an overflowing difference raised SIGFPE (run in a subprocess: a failure is a crash).

Results are gathered while the environment is planted and compared only after it is restored
(under DAZ, Python's own ``==`` on subnormals is unreliable): against the same call in the
default environment bit for bit, and against the float64 oracle (oracle.py).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import math
import platform
import struct
import subprocess
import sys
import textwrap
from collections.abc import Mapping

import numpy as np
import pytest

import vgct_ext
from vgct_ext import _C
from oracle import mismatches_vs_oracle, to_f64

torch = pytest.importorskip("torch")

N = 1 << 18  # several engine threads (vgpy_pick_threads: n / 2^16)
QS = (0.0, 0.5, 0.99, 1.0)


def _bits(d: dict) -> dict:
    """A _C.compare dict with every float as its bit pattern (an exact, env-free comparison)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            v = dict(v)
        if isinstance(v, float):
            out[k] = struct.pack("<d", v)
        elif isinstance(v, dict):
            out[k] = _bits(v)
        elif isinstance(v, (tuple, list)):
            out[k] = tuple(struct.pack("<d", x) if isinstance(x, float) else x for x in v)
        else:
            out[k] = v
    return out


def _subnormal_pair(dtype, seed=7):
    """Pairs of `dtype` values that are mostly subnormal (some normal, some zero): differences
    of a few subnormal ulps, which a flushing environment reads as 0."""
    g = torch.Generator().manual_seed(seed)
    tiny = {torch.float16: 3e-6, torch.bfloat16: 1e-39, torch.float32: 1e-40,
            torch.float64: 1e-310}[dtype]
    e = torch.randn(N, generator=g, dtype=torch.float64) * tiny
    a = e + torch.randn(N, generator=g, dtype=torch.float64) * tiny * 0.3
    a[::97] = 0.0
    e[::89] = 1.0  # some normal values among them
    return a.to(dtype), e.to(dtype)


def _probe_flushes() -> bool:
    """Whether the calling thread flushes subnormals now (torch's own CPU arithmetic)."""
    return (torch.tensor([1e-40], dtype=torch.float32) * 1.0).item() == 0.0


def _under_flush_denormal(fn):
    """fn() with torch.set_flush_denormal(True), the mode off again after it; also whether the
    mode was still on when fn returned (the caller's mode handed back).  Skips the test when
    the CPU has no such mode."""
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU has no flush-denormal mode (torch.set_flush_denormal returned False)")
    try:
        out = fn()
        still = _probe_flushes()
    finally:
        torch.set_flush_denormal(False)
    return out, still


# (float16: its subnormals are normal float32 values, so a flushing mode never touched them --
# the case checks the float16 path under the mode, it plants no fault)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16],
                         ids=["float32", "float64", "bfloat16", "float16"])
def test_flush_denormal_changes_no_result(dtype):
    a, e = _subnormal_pair(dtype)
    want = vgct_ext.compare(a, e, quantiles=QS).as_dict()
    want_raw = _C.compare(a, e, 1e-3, 1e-3, QS, None, None, None, None)
    assert want["n_unequal"] > N // 2  # the data: mostly unequal pairs
    (got_stats, raw), still = _under_flush_denormal(
        lambda: (vgct_ext.compare(a, e, quantiles=QS),
                 _C.compare(a, e, 1e-3, 1e-3, QS, None, None, None, None)))
    assert still, "compare() did not hand the caller's flush-to-zero mode back"
    got = got_stats.as_dict()
    assert _bits(got) == _bits(want), {k: (got[k], want[k]) for k in got if got[k] != want[k]}
    assert _bits(raw) == _bits(want_raw)
    bad = mismatches_vs_oracle(got_stats, to_f64(a), to_f64(e), quantiles=QS)
    assert not bad, bad


def test_flush_denormal_sharded_steps():
    """The steps of compare_sharded (reduce_raw per shard, merge_raw, finalize_raw) under the
    mode: the same record, bit for bit, as in the default environment."""
    a, e = _subnormal_pair(torch.float32, seed=11)
    h = N // 2

    def steps():
        r = [_C.reduce_raw(a[i:i + h], e[i:i + h], 1e-3, 1e-3) for i in (0, h)]
        acc = _C.merge_raw([x["acc"] for x in r])
        return _C.finalize_raw(acc, None, (N,), "float32", "float32", r[0]["device_type"],
                               r[0]["device_id"], 1e-3, 1e-3, (), None, None)

    want = steps()
    assert want["n_unequal"] > N // 2
    got, still = _under_flush_denormal(steps)
    assert still
    assert _bits(got) == _bits(want)


_LIBM = ctypes.util.find_library("m")
_GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
# <fenv.h> rounding constants (glibc): x86-64 and AArch64
_ROUND = {"x86_64": {"up": 0x800, "down": 0x400, "zero": 0xC00, "nearest": 0},
          "aarch64": {"up": 0x400000, "down": 0x800000, "zero": 0xC00000, "nearest": 0}}


@pytest.mark.skipif(not (_GLIBC and _LIBM and platform.machine() in _ROUND),
                    reason="needs glibc's fesetround on x86-64 or AArch64")
@pytest.mark.parametrize("mode", ["up", "down", "zero"])
def test_rounding_mode_changes_no_result(mode):
    libm = ctypes.CDLL(_LIBM)
    rnd = _ROUND[platform.machine()]
    g = torch.Generator().manual_seed(3)
    e = torch.randn(N, generator=g)
    a = e + 1e-3 * torch.randn(N, generator=g)
    want = _C.compare(a, e, 1e-3, 1e-3, QS, None, None, None, None)
    assert libm.fesetround(rnd[mode]) == 0
    try:
        got = _C.compare(a, e, 1e-3, 1e-3, QS, None, None, None, None)
        kept = libm.fegetround()
    finally:
        libm.fesetround(rnd["nearest"])
    assert kept == rnd[mode], "compare() did not hand the caller's rounding mode back"
    assert _bits(got) == _bits(want)


_TRAP_CHILD = textwrap.dedent("""
    import ctypes, ctypes.util, json, sys
    import numpy as np
    from vgct_ext import _C
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    a = np.array([np.nan, np.inf, 1e308, 1.0, -np.inf, 0.0, 5e-324], dtype=np.float64)
    e = np.array([1.0, 1.0, -1e308, 0.0, -np.inf, 0.0, 0.0], dtype=np.float64)
    qs = (0.5, 1.0)
    with np.errstate(over="ignore"):
        a32, e32 = a.astype(np.float32), e.astype(np.float32)  # (before the traps: 1e308 overflows)
    if libm.feenableexcept(1 | 4 | 8) < 0:  # FE_INVALID | FE_DIVBYZERO | FE_OVERFLOW (x86-64)
        print("SKIP"); sys.exit(0)
    r = _C.compare(a, e, 1e-3, 1e-3, qs, None, None, None, None)
    r32 = _C.compare(a32, e32, 1e-3, 1e-3, qs, None, None, None, None)
    libm.fedisableexcept(1 | 4 | 8)
    print(json.dumps([repr(sorted(r.items())), repr(sorted(r32.items()))]))
""")


@pytest.mark.skipif(not (_GLIBC and _LIBM and platform.machine() == "x86_64"),
                    reason="needs glibc's feenableexcept on x86-64")
def test_unmasked_fp_exceptions_do_not_crash():
    """A caller that unmasked the overflow / invalid / divide-by-zero traps: compare() of
    NaN, Inf and an overflowing float64 difference (1e308 - (-1e308)) must not raise SIGFPE,
    and must give what it gives with the traps masked."""
    p = subprocess.run([sys.executable, "-c", _TRAP_CHILD], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, f"child died (status {p.returncode}): {p.stderr[-2000:]}"
    if p.stdout.strip() == "SKIP":
        pytest.skip("feenableexcept refused the traps")
    got = json.loads(p.stdout.strip().splitlines()[-1])
    a = np.array([np.nan, np.inf, 1e308, 1.0, -np.inf, 0.0, 5e-324], dtype=np.float64)
    e = np.array([1.0, 1.0, -1e308, 0.0, -np.inf, 0.0, 0.0], dtype=np.float64)
    qs = (0.5, 1.0)
    r = _C.compare(a, e, 1e-3, 1e-3, qs, None, None, None, None)
    with np.errstate(over="ignore"):
        a32, e32 = a.astype(np.float32), e.astype(np.float32)
    r32 = _C.compare(a32, e32, 1e-3, 1e-3, qs, None, None, None, None)
    assert got == [repr(sorted(r.items())), repr(sorted(r32.items()))]
    assert r["max_abs_err"] == math.inf  # the overflowing difference, as documented


def _cuda_reason():
    info = vgct_ext.build_info()
    if not info.get("cuda_compiled"):
        return "vgct_ext built without CUDA"
    if not info.get("cuda_device_count") or not torch.cuda.is_available():
        return "no CUDA device (or torch without CUDA)"
    return None


@pytest.mark.gpu
@pytest.mark.skipif(_cuda_reason() is not None, reason=_cuda_reason() or "")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_flush_denormal_cuda_equals_cpu(dtype):
    """CUDA inputs under the mode: the host-side steps (window bounds, quantile interpolation,
    derived statistics) also compute in the default environment -- the same dict as the CPU
    engine in the default environment, exact fields bit for bit."""
    a, e = _subnormal_pair(dtype, seed=5)
    cpu = vgct_ext.compare(a, e, quantiles=QS).as_dict()
    ad, ed = a.cuda(), e.cuda()
    gpu_stats, still = _under_flush_denormal(lambda: vgct_ext.compare(ad, ed, quantiles=QS))
    assert still
    gpu = gpu_stats.as_dict()
    for k in ("n_unequal", "max_abs_err", "max_abs_err_index", "max_rel_err", "quantiles",
              "mismatches", "n_finite"):
        assert _bits({k: gpu[k]}) == _bits({k: cpu[k]}), (k, gpu[k], cpu[k])
    assert math.isclose(gpu["norm_diff"], cpu["norm_diff"], rel_tol=1e-12)
    bad = mismatches_vs_oracle(gpu_stats, to_f64(a), to_f64(e), quantiles=QS)
    assert not bad, bad
