"""ctypes harness over csrc/cpu_engine.c, built with -DVGCT_CPU_TESTING.

The public path (vgct_ext.compare) cannot reach the engine's internals: the
thread count, the segment size, the fast/definition tile paths, the select
candidate cap.  This harness compiles the same cpu_engine.c into a private
shared library with those knobs exposed (csrc/cpu_engine.c, "Test hooks") and
calls the entry points of csrc/vgct_engine.h directly on NumPy buffers.
It needs a C compiler (the one that builds the extension); tests using it skip
without one.
"""

from __future__ import annotations

import ctypes as C
import hashlib
import os
import shlex
import shutil
import subprocess
import sysconfig
import tempfile
from typing import Optional, Sequence, Tuple

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), *([".."] * 5)))
CSRC = os.environ.get("VGCT_TEST_CSRC") or os.path.join(ROOT, "csrc")  # override: mutation checks
MAX_NDIM = 32

# vgct_dtype codes (csrc/vgct_dtypes.h)
(BOOL, INT8, INT16, INT32, INT64, UINT8, FLOAT16, BFLOAT16, FLOAT32, FLOAT64, E4M3, E5M2,
 UINT16, UINT32, UINT64) = range(15)
NP_CODES = {np.dtype(np.bool_): BOOL, np.dtype(np.int8): INT8, np.dtype(np.int16): INT16,
            np.dtype(np.int32): INT32, np.dtype(np.int64): INT64, np.dtype(np.uint8): UINT8,
            np.dtype(np.float16): FLOAT16, np.dtype(np.float32): FLOAT32,
            np.dtype(np.float64): FLOAT64, np.dtype(np.uint16): UINT16,
            np.dtype(np.uint32): UINT32, np.dtype(np.uint64): UINT64}
RAW_CODES = {"bfloat16": (BFLOAT16, np.uint16), "float8_e4m3fn": (E4M3, np.uint8),
             "float8_e5m2": (E5M2, np.uint8)}


class View(C.Structure):
    _fields_ = [("data", C.c_void_p), ("ndim", C.c_int), ("shape", C.c_int64 * MAX_NDIM),
                ("strides", C.c_int64 * MAX_NDIM), ("dtype", C.c_int), ("device_type", C.c_int),
                ("device_id", C.c_int)]


class Params(C.Structure):
    _fields_ = [("rtol", C.c_double), ("atol", C.c_double), ("dim", C.c_int), ("nthreads", C.c_int),
                ("interrupt", C.c_void_p), ("interrupt_ctx", C.c_void_p),
                ("expect_finite", C.c_int64), ("presel", C.c_void_p)]


ACC_DOUBLES = ["scale_a", "scale_e", "scale_d", "s_aa", "s_ee", "s_ae", "s_dd", "s_d", "max_abs",
               "max_abs_a", "max_abs_e", "max_rel", "worst_excess", "max_abs_ref"]
ACC_INTS = ["max_abs_i", "max_rel_i", "worst_i", "n", "n_finite", "n_unequal", "n_mismatch",
            "n_nan_a", "n_posinf_a", "n_neginf_a", "n_nan_e", "n_posinf_e", "n_neginf_e",
            "n_class_diff", "first_class_diff"]


class Acc(C.Structure):
    _fields_ = [(f, C.c_double) for f in ACC_DOUBLES] + [(f, C.c_int64) for f in ACC_INTS]

    def as_tuple(self) -> Tuple:
        """Every field; doubles as their bit patterns (bitwise comparisons)."""
        return tuple(np.float64(getattr(self, f)).view(np.uint64).item() for f in ACC_DOUBLES) + \
            tuple(getattr(self, f) for f in ACC_INTS)


class SliceAcc(C.Structure):
    _fields_ = [("scale_e", C.c_double), ("scale_d", C.c_double), ("s_dd", C.c_double),
                ("s_ee", C.c_double), ("s_d", C.c_double), ("max_abs", C.c_double),
                ("n_finite", C.c_int64)]


def _compiler() -> Optional[str]:
    for cc in (os.environ.get("CC"), sysconfig.get_config_var("CC"), "cc", "gcc", "clang"):
        if cc:
            exe = shutil.which(cc.split()[0])
            if exe:
                return exe
    return None


class Engine:
    """The test build of cpu_engine.c."""

    def __init__(self, lib: C.CDLL):
        self.lib = lib
        lib.vgct_cpu_reduce.argtypes = [C.POINTER(View), C.POINTER(View), C.POINTER(Params),
                                        C.POINTER(Acc), C.c_void_p, C.c_char_p, C.c_size_t]
        lib.vgct_cpu_select.argtypes = [C.POINTER(View), C.POINTER(View), C.POINTER(Params),
                                        C.c_void_p, C.c_int, C.c_void_p, C.c_char_p, C.c_size_t]
        lib.vgct_cpu_fingerprint.argtypes = [C.POINTER(View), C.c_int, C.POINTER(C.c_uint64),
                                             C.c_char_p, C.c_size_t]
        lib.vgct_cpu_histogram.argtypes = [C.POINTER(View), C.POINTER(View), C.POINTER(Params),
                                           C.c_void_p, C.c_int, C.c_int, C.c_int, C.c_void_p,
                                           C.c_char_p, C.c_size_t]
        for f in ("vgct_cpu_reduce", "vgct_cpu_select", "vgct_cpu_fingerprint", "vgct_cpu_histogram"):
            getattr(lib, f).restype = C.c_int
        lib.vgct_cpu_presel_new.argtypes = [C.POINTER(View), C.POINTER(View), C.c_void_p, C.c_int]
        lib.vgct_cpu_presel_new.restype = C.c_void_p
        lib.vgct_cpu_presel_free.argtypes = [C.c_void_p]
        lib.vgct_cpu_presel_free.restype = None

    # knobs (csrc/cpu_engine.c, "Test hooks")
    def _int(self, name, ctype=C.c_int):
        return ctype.in_dll(self.lib, name)

    def configure(self, force_slow: int = 0, seg_min: int = 0, par_min: int = -1,
                  select_cap: int = 0, level: int = -1, fail_alloc: int = 0,
                  presel_min: int = 0) -> None:
        """Engine knobs; every call resets the ones not given to their defaults.
        presel_min > 0: quantile windows from that n on (samples of >= 1024 keys)."""
        self._int("vgct_cpu_test_force_slow").value = force_slow
        self._int("vgct_cpu_test_fail_alloc").value = fail_alloc
        self._int("vgct_cpu_test_level").value = level
        self._int("vgct_cpu_test_seg_min", C.c_int64).value = seg_min
        self._int("vgct_cpu_test_par_min", C.c_int64).value = par_min
        self._int("vgct_cpu_test_select_cap", C.c_int64).value = select_cap
        self._int("vgct_cpu_test_presel_min", C.c_int64).value = presel_min

    @property
    def last_select_passes(self) -> int:
        return self._int("vgct_cpu_test_last_passes").value

    @property
    def last_npv(self) -> int:
        """Window 0's pivot count (lo, the sample's tie values inside, hi) of the last presel."""
        return self._int("vgct_cpu_test_last_npv").value

    def fused_tiles(self, reset: bool = False) -> int:
        """Tiles counted by the fused window loop (ps_fused) since the last reset."""
        v = self._int("vgct_cpu_test_fused_tiles", C.c_int64)
        n = v.value
        if reset:
            v.value = 0
        return n

    @staticmethod
    def view(x: np.ndarray, dtype: Optional[str] = None) -> View:
        """A vgct_view of a NumPy array; dtype names a raw-bits type (x then holds the bits)."""
        v = View()
        code = RAW_CODES[dtype][0] if dtype else NP_CODES[x.dtype]
        if dtype:
            assert x.dtype == RAW_CODES[dtype][1]
        v.data = x.ctypes.data if x.size else None
        v.ndim = x.ndim
        for k in range(x.ndim):
            v.shape[k] = x.shape[k]
            assert x.strides[k] % x.itemsize == 0
            v.strides[k] = x.strides[k] // x.itemsize
        v.dtype = code
        return v

    def presel(self, a, e, quantiles: Sequence[float], dta=None, dte=None) -> Optional[int]:
        """vgct_cpu_presel_new: the key windows (an opaque pointer), or None."""
        va, ve = self.view(a, dta), self.view(e, dte)
        q = np.ascontiguousarray(quantiles, dtype=np.float64)
        return self.lib.vgct_cpu_presel_new(C.byref(va), C.byref(ve), q.ctypes.data, len(q))

    def presel_free(self, ps: Optional[int]) -> None:
        self.lib.vgct_cpu_presel_free(ps)

    def reduce(self, a, e, rtol=1e-3, atol=1e-3, dim=-1, nthreads=1, dta=None, dte=None,
               presel: Optional[int] = None):
        """presel: windows from presel(), filled by this pass (vgct_params.presel)."""
        va, ve = self.view(a, dta), self.view(e, dte)
        p = Params(rtol, atol, dim, nthreads, None, None, -1, presel)
        acc = Acc()
        k = a.shape[dim] if dim >= 0 else 0
        sl = (SliceAcc * max(k, 1))()
        err = C.create_string_buffer(512)
        rc = self.lib.vgct_cpu_reduce(C.byref(va), C.byref(ve), C.byref(p), C.byref(acc),
                                      C.cast(sl, C.c_void_p) if dim >= 0 else None, err, 512)
        if rc:
            raise (MemoryError if rc == 1 else RuntimeError)(f"vgct_cpu_reduce rc={rc}: {err.value.decode()}")
        return acc, list(sl)[:k]

    def select(self, a, e, ranks: Sequence[int], nthreads=1, dta=None, dte=None,
               expect_finite: int = -1, presel: Optional[int] = None):
        """expect_finite / presel: vgct_params' (the reduction's n_finite and its filled windows)."""
        va, ve = self.view(a, dta), self.view(e, dte)
        p = Params(0.0, 0.0, -1, nthreads, None, None, expect_finite, presel)
        r = np.ascontiguousarray(ranks, dtype=np.int64)
        out = np.zeros(len(r), dtype=np.float64)
        err = C.create_string_buffer(512)
        rc = self.lib.vgct_cpu_select(C.byref(va), C.byref(ve), C.byref(p), r.ctypes.data, len(r),
                                      out.ctypes.data, err, 512)
        if rc:
            raise (MemoryError if rc == 1 else ValueError)(f"vgct_cpu_select rc={rc}: {err.value.decode()}")
        return out

    def histogram(self, a, e, prefixes, prefix_bits, width, nthreads=1, dta=None, dte=None):
        va, ve = self.view(a, dta), self.view(e, dte)
        p = Params(0.0, 0.0, -1, nthreads, None, None, -1, None)
        pr = np.ascontiguousarray(prefixes, dtype=np.uint64)
        out = np.full(len(pr) << width, -7, dtype=np.int64)
        err = C.create_string_buffer(512)
        rc = self.lib.vgct_cpu_histogram(C.byref(va), C.byref(ve), C.byref(p), pr.ctypes.data, len(pr),
                                         prefix_bits, width, out.ctypes.data, err, 512)
        if rc:
            raise (MemoryError if rc == 1 else ValueError)(f"vgct_cpu_histogram rc={rc}: {err.value.decode()}")
        return out.reshape(len(pr), 1 << width)

    def fingerprint(self, x, nthreads=1, dtype=None) -> int:
        v = self.view(x, dtype)
        h = C.c_uint64()
        err = C.create_string_buffer(512)
        rc = self.lib.vgct_cpu_fingerprint(C.byref(v), nthreads, C.byref(h), err, 512)
        if rc:
            raise (MemoryError if rc == 1 else RuntimeError)(err.value.decode())
        return h.value


_ENGINE: Optional[Engine] = None


def load() -> Optional[Engine]:
    """Build (once per source version, cached in the temp dir) and load; None without a compiler."""
    global _ENGINE
    if _ENGINE is not None:
        return _ENGINE
    cc = _compiler()
    if cc is None:
        return None
    # cpu_engine.c first (the one file compiled: it includes its parts, cpu_*.inc), then every part and header it
    # may include, for the cache key
    srcs = [os.path.join(CSRC, "cpu_engine.c")] + sorted(
        os.path.join(CSRC, f) for f in os.listdir(CSRC) if f.endswith((".inc", ".h")))
    extra = shlex.split(os.environ.get("VGCT_TEST_CFLAGS", ""))  # scripts/sanitize.sh: -fsanitize=...
    h = hashlib.sha256(" ".join([cc] + extra).encode())
    for s in srcs:
        with open(s, "rb") as f:
            h.update(f.read())
    out_dir = os.path.join(tempfile.gettempdir(), f"vgct_cpu_test_{os.getuid()}")
    os.makedirs(out_dir, exist_ok=True)
    so = os.path.join(out_dir, f"libvgct_cpu_{h.hexdigest()[:16]}.so")
    if not os.path.exists(so):
        tmp = f"{so}.{os.getpid()}.tmp"
        cmd = [cc, "-std=c11", "-O3", "-Wall", "-Wextra", "-shared", "-fPIC", "-pthread",
               "-DVGCT_CPU_TESTING", "-I", CSRC, srcs[0], "-o", tmp, "-lm"] + extra
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"building the engine test library failed:\n{' '.join(cmd)}\n{r.stderr}")
        os.replace(tmp, so)
    _ENGINE = Engine(C.CDLL(so))
    return _ENGINE
