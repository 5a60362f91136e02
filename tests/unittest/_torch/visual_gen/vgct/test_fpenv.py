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
import os
import platform
import signal
import struct
import subprocess
import sys
import textwrap
import threading
from collections.abc import Mapping

import numpy as np
import pytest

import vgct_ext
from vgct_ext import _C
from oracle import mismatches_vs_oracle, to_f64

torch = pytest.importorskip("torch")

N = 1 << 18  # several engine threads (vgpy_pick_threads: n / 2^16)
QS = (0.0, 0.5, 0.99, 1.0)

_LIBM_PATH = ctypes.util.find_library("m")
_GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
_FE = {"x86_64": {"up": 0x800, "down": 0x400, "zero": 0xC00, "nearest": 0},
       "aarch64": {"up": 0x400000, "down": 0x800000, "zero": 0xC00000, "nearest": 0}}.get(
           platform.machine())


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


class _FlushingProducer:
    """A DLPack producer whose __dlpack__ turns flush-to-zero on (as a lazily loaded library
    built with -ffast-math may): Python code that runs inside the call, before the engine."""

    def __init__(self, t):
        self.t = t

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()

    def __dlpack__(self, **kw):
        torch.set_flush_denormal(True)
        return self.t.__dlpack__(**kw)


def test_a_producer_that_changes_the_mode_inside_the_call():
    a, e = _subnormal_pair(torch.float32, seed=13)
    want = _canon(_C.compare(a, e, 1e-3, 1e-3, QS, None, None, None, None))
    try:
        got = _canon(_C.compare(_FlushingProducer(a), e, 1e-3, 1e-3, QS, None, None, None, None))
        kept = _probe_flushes()  # the producer's change is the caller's: it holds after
    finally:
        torch.set_flush_denormal(False)
    if not kept:
        pytest.skip("this CPU has no flush-denormal mode")
    assert got == want


@pytest.mark.skipif(not (_GLIBC and _LIBM_PATH and _FE), reason="needs glibc's fesetround")
def test_a_producer_that_sets_a_rounding_direction_keeps_the_callers_flush_mode():
    """Python code inside the call changes one thing (a rounding direction): on return the caller has
    it AND keeps its own flush-to-zero mode; the engine computed in the default either way."""
    libm = ctypes.CDLL(_LIBM_PATH)
    a, e = _subnormal_pair(torch.float32, seed=19)
    want = _canon(_C.compare(a, e, 1e-3, 1e-3, QS, None, None, None, None))

    class Rounding(_FlushingProducer):
        def __dlpack__(self, **kw):
            libm.fesetround(_FE["up"])
            return self.t.__dlpack__(**kw)

    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU has no flush-denormal mode")
    try:
        got = _canon(_C.compare(Rounding(a), e, 1e-3, 1e-3, QS, None, None, None, None))
        flush, rnd = _probe_flushes(), libm.fegetround()
    finally:
        libm.fesetround(0)
        torch.set_flush_denormal(False)
    assert (flush, rnd) == (True, _FE["up"])
    assert got == want


def test_a_generator_of_records_that_changes_the_mode():
    """merge_raw over a generator whose next() turns flush-to-zero on between records: the merge
    computes in the default (a subnormal maximum survives), and the mode holds after the call."""
    a = torch.tensor([1e-310, 3e-310], dtype=torch.float64)
    e = torch.zeros(2, dtype=torch.float64)
    recs = [_C.reduce_raw(a[i:i + 1], e[i:i + 1], 1e-3, 1e-3)["acc"] for i in (0, 1)]
    want = _canon(_C.acc_fields(_C.merge_raw(recs)))

    def gen():
        yield recs[0]
        torch.set_flush_denormal(True)
        yield recs[1]

    try:
        got = _C.merge_raw(gen())
        kept = _probe_flushes()
    finally:
        torch.set_flush_denormal(False)
    if not kept:
        pytest.skip("this CPU has no flush-denormal mode")
    assert _canon(_C.acc_fields(got)) == want


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs signal.setitimer")
def test_a_signal_handler_that_changes_the_mode_during_the_call():
    """A SIGALRM handler run by the Ctrl-C poll (between tiles) turns flush-to-zero on: the
    handler runs in the caller's environment, its mode holds after the call, and the engine
    finishes in the default one (the result equals the default environment's)."""
    n = 1 << 24
    g = torch.Generator().manual_seed(17)
    e = torch.randn(n, generator=g, dtype=torch.float64) * 1e-40
    a = (e + torch.randn(n, generator=g, dtype=torch.float64) * 3e-41).to(torch.float32)
    e = e.to(torch.float32)
    want = _canon(_C.compare(a, e, 1e-3, 1e-3, (0.5,), None, None, None, None))
    seen, in_call = [], [False]

    def handler(signum, frame):
        if in_call[0]:
            seen.append(_probe_flushes())
        torch.set_flush_denormal(True)

    old = signal.signal(signal.SIGALRM, handler)
    try:
        # a few tries, each timer shorter: on a fast machine the call can end before the timer
        for delay in (0.01, 0.004, 0.002, 0.001, 0.0005):
            in_call[0] = True
            signal.setitimer(signal.ITIMER_REAL, delay)
            got = _canon(_C.compare(a, e, 1e-3, 1e-3, (0.5,), None, None, None, None))
            in_call[0] = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            kept = _probe_flushes()
            torch.set_flush_denormal(False)
            if seen:
                break
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        torch.set_flush_denormal(False)
    if not seen:
        pytest.skip("the timer fired outside the call on every try")
    assert seen == [False], "the handler did not run in the caller's environment"
    assert kept, "the handler's mode did not hold after the call"
    assert got == want


def test_a_subnormal_tolerance_is_not_flushed():
    """atol = 5e-310 under flush-to-zero: the tolerance reaches the engine and the result
    unchanged (vgct_ext.compare does no arithmetic on it; _C normalises -0.0)."""
    a = torch.tensor([1e-310, 0.0, 1.0], dtype=torch.float64)
    e = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)
    want = vgct_ext.compare(a, e, rtol=0.0, atol=5e-310).as_dict()
    got, _ = _under_flush_denormal(lambda: vgct_ext.compare(a, e, rtol=0.0, atol=5e-310))
    got = got.as_dict()
    assert _canon(got) == _canon(want)
    assert got["mismatches"] == 0 and struct.pack("<d", got["atol"]) == struct.pack("<d", 5e-310)
    assert struct.pack("<d", vgct_ext.compare(a, e, atol=-0.0).atol) == struct.pack("<d", 0.0)


def test_worst_slice_under_flush_to_zero():
    """SliceStats.worst() compares by bits: a subnormal error still beats a zero one."""
    e = torch.tensor([[1.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    a = torch.tensor([[1.001, 1.0], [1e-310, 0.0]], dtype=torch.float64)
    s = vgct_ext.compare(a, e, dim=0).slices
    assert s.worst() == 1  # the zero-reference slice with a (subnormal) error
    got, _ = _under_flush_denormal(s.worst)
    assert got == 1


def _canon(x):
    """A _C result as plain bytes/ints (floats by their bits): comparable in any environment."""
    if isinstance(x, float):
        return ("f", struct.pack("<d", x))
    if isinstance(x, np.ndarray):
        return ("a", str(x.dtype), x.shape, x.tobytes())
    if isinstance(x, Mapping):
        return {k: _canon(v) for k, v in sorted(x.items(), key=lambda kv: str(kv[0]))}
    if isinstance(x, (list, tuple)):
        return [_canon(v) for v in x]
    if isinstance(x, (bytes, bytearray, memoryview)):
        return bytes(x)
    return x


def _every_entry_point(a, e):
    """Every computing method of _C on one pair (a 512 x 512 view of it for the per-slice and
    sharded steps), raw: no Python arithmetic on the results while a mode is planted."""
    a2, e2 = a[:512 * 512].reshape(512, 512), e[:512 * 512].reshape(512, 512)
    out = {"compare": _C.compare(a, e, 1e-3, 1e-300, QS, None, None, None, None),
           "compare_dim1": _C.compare(a2, e2, 1e-3, 1e-3, QS, 1, None, None, None),
           "fingerprint": _C.fingerprint(a)}
    h = 256
    rs = [_C.reduce_raw(a2[i:i + h], e2[i:i + h], 1e-3, 1e-3, 1) for i in (0, h)]
    accs = [_C.remap_raw(r["acc"], r["shape"], (512, 512), 0, i * h) for i, r in enumerate(rs)]
    acc = _C.merge_raw(accs)
    sl = _C.merge_slices_raw([r["slices"] for r in rs], False)
    fields = _C.acc_fields(acc)
    out.update(remap=accs, merge=acc, merge_slices=sl, acc_fields=fields)
    if fields["n_finite"]:
        ranks = _C.quantile_ranks(fields["n_finite"], QS)
        out["ranks"] = ranks
        out["known"] = [_C.rank_key_known(acc, k) for lo_hi in ranks for k in lo_hi]
        out["histogram"] = _C.histogram(a2, e2, [0], 1, 16).tobytes()
    out["finalize"] = _C.finalize_raw(acc, sl, (512, 512), rs[0]["dtype_actual"],
                                      rs[0]["dtype_expected"], rs[0]["device_type"],
                                      rs[0]["device_id"], 1e-3, 1e-3, (), None, 1)
    return _canon(out)


def _mixed_pair(dtype, seed):
    """A subnormal-heavy pair with NaN, Inf, an overflowing float64 difference and a
    rounding-sensitive one (3 + 2^-40 against 3)."""
    a, e = _subnormal_pair(dtype, seed)
    a, e = a.to(torch.float64), e.to(torch.float64)
    a[::1001] = float("nan")
    e[::1003] = float("inf")
    a[5], e[5] = (1e308, -1e308) if dtype == torch.float64 else (1.0, 1.0)
    a[7], e[7] = 3.0 + 2.0 ** -40, 3.0
    return a.to(dtype), e.to(dtype)




def test_every_entry_point_in_concurrent_threads_with_their_own_modes():
    """Threads each planting their own mode (flush-to-zero, and where glibc lets us, a
    rounding direction; both are per thread): every computing method of _C, on float16 ..
    float64 and integer pairs, gives the default environment's result bit for bit, and each
    thread's mode is still its own after every call."""
    dts = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32]
    pairs = {str(dt): (_mixed_pair(dt, i) if dt.is_floating_point else
                       (torch.randint(0, 100, (N,), generator=torch.Generator().manual_seed(i),
                                      dtype=torch.int32),
                        torch.randint(0, 100, (N,), generator=torch.Generator().manual_seed(i + 9),
                                      dtype=torch.int32)))
             for i, dt in enumerate(dts)}
    base = {k: _every_entry_point(a, e) for k, (a, e) in pairs.items()}
    libm = ctypes.CDLL(_LIBM_PATH) if (_GLIBC and _LIBM_PATH and _FE) else None
    modes = ["flush", "default"] + (["up", "down", "zero", "flush+up"] if libm else [])
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU has no flush-denormal mode")
    torch.set_flush_denormal(False)
    res = {}

    def worker(mode):
        flush, rnd = mode.startswith("flush"), mode.split("+")[-1]
        got, kept = [], []
        torch.set_flush_denormal(flush)
        if libm is not None and rnd in _FE:
            libm.fesetround(_FE[rnd])
        try:
            for k, (a, e) in pairs.items():
                got.append((k, _every_entry_point(a, e)))
                kept.append((_probe_flushes() == flush) and
                            (libm is None or libm.fegetround() == _FE.get(rnd, 0)))
        finally:
            torch.set_flush_denormal(False)
            if libm is not None:
                libm.fesetround(0)
        res[mode] = (got, kept)

    threads = [threading.Thread(target=worker, args=(m,)) for m in modes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(res) == sorted(modes)
    for mode, (got, kept) in res.items():
        assert all(kept), f"{mode}: a call did not hand the thread's mode back"
        for k, g in got:
            assert g == base[k], f"{mode} {k}: differs from the default environment's result"


@pytest.mark.skipif(not (_GLIBC and _LIBM_PATH and _FE),
                    reason="needs glibc's fesetround on x86-64 or AArch64")
@pytest.mark.parametrize("mode", ["up", "down", "zero"])
def test_rounding_mode_changes_no_result(mode):
    libm = ctypes.CDLL(_LIBM_PATH)
    rnd = _FE
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
    n = int(sys.argv[1])
    a = np.resize(np.array([np.nan, np.inf, 1e308, 1.0, -np.inf, 0.0, 5e-324, 3.0]), n)
    e = np.resize(np.array([1.0, 1.0, -1e308, 0.0, -np.inf, 0.0, 0.0, 3.0]), n)
    qs = (0.5, 1.0)
    with np.errstate(over="ignore"):
        a32, e32 = a.astype(np.float32), e.astype(np.float32)  # (before the traps: 1e308 overflows)
    if libm.feenableexcept(1 | 4 | 8) < 0:  # FE_INVALID | FE_DIVBYZERO | FE_OVERFLOW (x86-64)
        print("SKIP"); sys.exit(0)
    r = _C.compare(a, e, 1e-3, 1e-3, qs, None, None, None, None)
    r32 = _C.compare(a32, e32, 1e-3, 1e-3, qs, None, None, None, None)
    fp = _C.fingerprint(a)
    libm.fedisableexcept(1 | 4 | 8)
    print(json.dumps([repr(sorted(r.items())), repr(sorted(r32.items())), fp]))
""")


@pytest.mark.skipif(not (_GLIBC and _LIBM_PATH and platform.machine() == "x86_64"),
                    reason="needs glibc's feenableexcept on x86-64")
@pytest.mark.parametrize("n", [8, N])
def test_unmasked_fp_exceptions_do_not_crash(n):
    """A caller that unmasked the overflow / invalid / divide-by-zero traps: compare() of
    NaN, Inf and an overflowing float64 difference (1e308 - (-1e308)) must not raise SIGFPE
    -- on the calling thread alone (n = 8) and with several engine threads (n = N) -- and
    must give what it gives with the traps masked.  The child imports this process's
    vgct_ext (PYTHONPATH set to it)."""
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(vgct_ext.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [pkg_parent] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    p = subprocess.run([sys.executable, "-c", _TRAP_CHILD, str(n)], capture_output=True,
                       text=True, timeout=120, env=env)
    assert p.returncode == 0, f"child died (status {p.returncode}): {p.stderr[-2000:]}"
    if p.stdout.strip() == "SKIP":
        pytest.skip("feenableexcept refused the traps")
    got = json.loads(p.stdout.strip().splitlines()[-1])
    a = np.resize(np.array([np.nan, np.inf, 1e308, 1.0, -np.inf, 0.0, 5e-324, 3.0]), n)
    e = np.resize(np.array([1.0, 1.0, -1e308, 0.0, -np.inf, 0.0, 0.0, 3.0]), n)
    qs = (0.5, 1.0)
    r = _C.compare(a, e, 1e-3, 1e-3, qs, None, None, None, None)
    with np.errstate(over="ignore"):
        a32, e32 = a.astype(np.float32), e.astype(np.float32)
    r32 = _C.compare(a32, e32, 1e-3, 1e-3, qs, None, None, None, None)
    assert got == [repr(sorted(r.items())), repr(sorted(r32.items())), _C.fingerprint(a)]
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
