"""Independent float64 oracle for the paired statistics (docs/metrics.md).

Everything here is plain NumPy float64 and ``math.fsum``; nothing is shared with
the C engine.  Sums of squares are taken after an exact power-of-two scaling by
the largest magnitude (so 1e300 and 1e-310 are fine), then ``math.fsum``
(correctly rounded sum of the rounded terms).  Maxima use ``np.argmax``
(first occurrence = lowest flat index), quantiles ``np.quantile`` (method
"linear").

``exact_sums`` is a second, EXACT oracle for the sum-based statistics: every finite
float64 is an integer multiple of 2^-1074, so sums of squares, the dot product and the
sum of differences are Python integers (no rounding, no overflow, no underflow, also
where a - e overflows float64); the square roots and quotients are taken to ~2^-120 and
rounded once at the end.  ``mismatches_vs_oracle(..., exact=True)`` checks against it.

Decoders for the dtypes NumPy lacks (bfloat16, float8_e4m3fn, float8_e5m2) work
from raw bits with the formulas of the OCP 8-bit FP spec v1.0 and the bfloat16
definition (upper half of an IEEE binary32), written independently of
csrc/vgct_dtypes.h.
"""

from __future__ import annotations

import math
from typing import Dict, Iterable, Optional

import numpy as np


# ---- decoders (raw bits -> float64) ----------------------------------------------

def decode_bf16(bits: np.ndarray) -> np.ndarray:
    u = np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)
    return u.view(np.float32).astype(np.float64)


def _minifloat_table(ebits: int, mbits: int, bias: int, ieee_specials: bool) -> np.ndarray:
    out = np.empty(256, dtype=np.float64)
    for b in range(256):
        s = -1.0 if b & 0x80 else 1.0
        ex = (b >> mbits) & ((1 << ebits) - 1)
        m = b & ((1 << mbits) - 1)
        if ieee_specials and ex == (1 << ebits) - 1:
            v = math.inf if m == 0 else math.nan
        elif not ieee_specials and ex == (1 << ebits) - 1 and m == (1 << mbits) - 1:
            v = math.nan  # E4M3FN: S.1111.111 is NaN, no infinities
        elif ex == 0:
            v = math.ldexp(m, 1 - bias - mbits)
        else:
            v = math.ldexp(1.0 + m / (1 << mbits), ex - bias)
        out[b] = s * v if not math.isnan(v) else math.nan
    return out


E4M3_TABLE = _minifloat_table(4, 3, 7, ieee_specials=False)
E5M2_TABLE = _minifloat_table(5, 2, 15, ieee_specials=True)


def decode_e4m3(bits: np.ndarray) -> np.ndarray:
    return E4M3_TABLE[np.asarray(bits, dtype=np.uint8)]


def decode_e5m2(bits: np.ndarray) -> np.ndarray:
    return E5M2_TABLE[np.asarray(bits, dtype=np.uint8)]


def to_f64(x) -> np.ndarray:
    """A NumPy array or a CPU torch tensor -> float64 NumPy array (same logical shape)."""
    if isinstance(x, np.ndarray):
        return x.astype(np.float64)
    import torch  # only reached for torch inputs

    t = x.detach()
    if t.dtype == torch.bfloat16:
        return decode_bf16(t.contiguous().view(torch.int16).numpy().view(np.uint16))
    if t.dtype == torch.float8_e4m3fn:
        return decode_e4m3(t.contiguous().view(torch.uint8).numpy())
    if t.dtype == torch.float8_e5m2:
        return decode_e5m2(t.contiguous().view(torch.uint8).numpy())
    return t.contiguous().numpy().astype(np.float64)


# ---- sums -----------------------------------------------------------------------

def _pow2_exponent(x: np.ndarray) -> int:
    m = float(np.max(np.abs(x))) if x.size else 0.0
    if m == 0.0:
        return 0
    return math.frexp(m)[1]


def norm_parts(x: np.ndarray):
    """(m, k) with ||x||_2 = m * 2^k, m computed on the exactly rescaled values (no
    overflow or underflow, so ratios of norms stay accurate even when the norms
    themselves are subnormal)."""
    x = np.asarray(x, dtype=np.float64).ravel()
    k = _pow2_exponent(x)
    y = np.ldexp(x, -k)
    return math.sqrt(math.fsum(y * y)), k


def mean(x: np.ndarray) -> float:
    """fsum(x)/len(x) without intermediate overflow (exact 2^-k scaling)."""
    x = np.asarray(x, dtype=np.float64).ravel()
    if not np.all(np.isfinite(x)):  # an overflowed float64 difference: exact_sums handles it
        return float(np.sum(x))
    k = _pow2_exponent(x)
    return math.ldexp(math.fsum(np.ldexp(x, -k)) / x.size, k)


def norm(x: np.ndarray) -> float:
    """||x||_2, overflow/underflow-free: exact 2^-k scaling, fsum of squares."""
    m, k = norm_parts(x)
    try:
        return math.ldexp(m, k)
    except OverflowError:  # the true norm exceeds DBL_MAX
        return math.inf


def norm_ratio(x: np.ndarray, y: np.ndarray) -> float:
    """||x|| / ||y|| (y not all zero), accurate for any magnitudes."""
    mx, kx = norm_parts(x)
    my, ky = norm_parts(y)
    try:
        return math.ldexp(mx / my, kx - ky)
    except OverflowError:
        return math.inf


def cosine(x: np.ndarray, y: np.ndarray) -> float:
    """<x,y>/(||x|| ||y||) on exactly rescaled copies (no overflow of the dot product)."""
    x = np.asarray(x, dtype=np.float64).ravel()
    y = np.asarray(y, dtype=np.float64).ravel()
    xs, ys = np.ldexp(x, -_pow2_exponent(x)), np.ldexp(y, -_pow2_exponent(y))
    return math.fsum(xs * ys) / norm(xs) / norm(ys)


def quantile_linear(x: np.ndarray, p: float) -> float:
    """docs/metrics.md's Q(p): ``np.quantile(x, p)`` (method "linear") with the limits at an
    infinite order statistic made explicit: the interpolation is x_lo when gamma == 0 or
    x_lo == x_hi, +Inf when x_hi is +Inf and gamma > 0 (numpy's formula gives NaN there:
    Inf - Inf); else numpy's own value (bitwise)."""
    xs = np.sort(np.asarray(x, dtype=np.float64).ravel())
    m = xs.size
    h = (m - 1) * p
    lo = int(math.floor(h))
    gamma = h - math.floor(h)
    if h >= m - 1:
        lo = hi = m - 1
    else:
        hi = lo + 1
    a, b = float(xs[lo]), float(xs[hi])
    if gamma == 0.0 or a == b:
        return a
    if b == math.inf:
        return math.inf
    return float(np.quantile(xs, p))


def record_answered(nf: int, n_unequal: int, quantiles: Iterable[float], distinct: bool = False) -> list:
    """[ranks the reduction's record answers, ranks left to the selection] for compare()'s quantile
    ranks over nf finite pairs of which the record counts n_unequal unequal pairs (docs/metrics.md,
    "Ranks the reduction answers": every rank below nf - n_unequal, and rank nf - 1).  The ranks are
    numpy's linear method's, floor(h) and floor(h) + 1 with h = (nf - 1) q (both nf - 1 when h >=
    nf - 1): two per quantile, or the distinct ones (the sharded selection's count)."""
    ranks = []
    for q in quantiles:
        h = float(nf - 1) * float(q)
        ranks += [nf - 1, nf - 1] if h >= nf - 1 else [math.floor(h), math.floor(h) + 1]
    if distinct:
        ranks = sorted(set(ranks))
    known = sum(1 for r in ranks if r < nf - n_unequal or r == nf - 1)
    return [known, len(ranks) - known]


def _argmax_first(v: np.ndarray):
    """(value, flat index) of the max of v (entries < 0 mean 'absent'), or (None, None)."""
    if v.size == 0:
        return None, None
    i = int(np.argmax(v))
    if v[i] < 0:
        return None, None
    return float(v[i]), i


# ---- the oracle -------------------------------------------------------------------

def oracle(a64: np.ndarray, e64: np.ndarray, rtol: float = 1e-3, atol: float = 1e-3,
           quantiles: Iterable[float] = (0.99,), dim: Optional[int] = None) -> Dict:
    """All statistics of vgct_ext.compare for float64 arrays of one shape."""
    a = np.ascontiguousarray(a64, dtype=np.float64).ravel()
    e = np.ascontiguousarray(e64, dtype=np.float64).ravel()
    assert a.shape == e.shape
    n = a.size
    fin = np.isfinite(a) & np.isfinite(e)
    af, ef = a[fin], e[fin]
    with np.errstate(all="ignore"):
        d_all = a - e
    df = d_all[fin]
    out: Dict = {"n": n, "n_finite": int(fin.sum())}
    na, ne, nd = norm(af), norm(ef), norm(df)
    out.update(norm_actual=na, norm_expected=ne, norm_diff=nd)
    out["zero_reference"] = ne == 0.0
    out["rel_l2"] = None if ne == 0.0 else norm_ratio(df, ef)
    if na == 0.0 or ne == 0.0:
        out["cosine"] = None
    else:
        c = cosine(af, ef)
        out["cosine"] = min(1.0, max(-1.0, c))
    out["mean_diff"] = mean(df) if df.size else None

    ad = np.where(fin, np.abs(d_all), -1.0)
    v, i = _argmax_first(ad)
    out["max_abs_err"], out["max_abs_err_flat"] = v, i
    out["max_abs_err_actual"] = float(a[i]) if i is not None else None
    out["max_abs_err_expected"] = float(e[i]) if i is not None else None
    ae = np.abs(e)
    with np.errstate(all="ignore"):
        rel = np.where(fin & (e != 0), np.abs(d_all) / ae, -1.0)
    out["max_rel_err"], out["max_rel_err_flat"] = _argmax_first(rel)
    out["max_abs_expected"] = float(ae[fin].max()) if fin.any() else None
    with np.errstate(all="ignore"):
        tol = atol + rtol * ae
        mm = fin & (np.abs(d_all) > tol)
        exc = np.where(mm, np.abs(d_all) - tol, -1.0)
    out["mismatches"] = int(mm.sum())
    out["mismatch_fraction"] = out["mismatches"] / out["n_finite"] if out["n_finite"] else 0.0
    out["worst_mismatch_excess"], out["worst_mismatch_flat"] = _argmax_first(exc)
    both_nan = np.isnan(a) & np.isnan(e)
    out["n_unequal"] = int(((a != e) & ~both_nan).sum())

    def cls(x):
        c = np.zeros(x.shape, dtype=np.int8)
        c[np.isnan(x)] = 1
        c[x == np.inf] = 2
        c[x == -np.inf] = 3
        return c

    ca, ce = cls(a), cls(e)
    for side, c in (("actual", ca), ("expected", ce)):
        out[f"nan_{side}"] = int((c == 1).sum())
        out[f"posinf_{side}"] = int((c == 2).sum())
        out[f"neginf_{side}"] = int((c == 3).sum())
    diff = np.nonzero(ca != ce)[0]
    out["n_class_mismatch"] = int(diff.size)
    out["first_class_mismatch_flat"] = int(diff[0]) if diff.size else None

    qs = tuple(float(q) for q in quantiles)
    if df.size:
        with np.errstate(all="ignore"):
            absd = np.abs(df)
        out["quantiles"] = {q: quantile_linear(absd, q) for q in qs}
    else:
        out["quantiles"] = {q: None for q in qs}

    if dim is not None:
        out["slices"] = slice_oracle(a64, e64, dim)
    return out


def slice_oracle(a64: np.ndarray, e64: np.ndarray, dim: int) -> Dict[str, np.ndarray]:
    a = np.moveaxis(np.asarray(a64, dtype=np.float64), dim, 0)
    e = np.moveaxis(np.asarray(e64, dtype=np.float64), dim, 0)
    k = a.shape[0]
    rest = int(np.prod(a.shape[1:], dtype=np.int64))
    a = a.reshape(k, rest)
    e = e.reshape(k, rest)
    res = {f: np.full(k, np.nan) for f in ("mean_shift", "rel_l2", "max_abs_err", "ref_rms",
                                           "mean_abs")}
    res["count"] = np.zeros(k, dtype=np.int64)
    for j in range(k):
        fin = np.isfinite(a[j]) & np.isfinite(e[j])
        af, ef = a[j][fin], e[j][fin]
        d = af - ef
        c = int(fin.sum())
        res["count"][j] = c
        if c == 0:
            continue
        res["mean_shift"][j] = mean(d)
        res["mean_abs"][j] = mean(np.abs(d))
        me, ke = norm_parts(ef)
        res["rel_l2"][j] = norm_ratio(d, ef) if me != 0.0 else np.nan
        res["max_abs_err"][j] = float(np.max(np.abs(d)))
        res["ref_rms"][j] = math.ldexp(me / math.sqrt(c), ke)
    return res


def rel_close(x: Optional[float], y: Optional[float], tol: float = 1e-12) -> bool:
    """x within tol relative of y (both None, or equal non-finite values, also pass)."""
    if x is None or y is None:
        return x is None and y is None
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    if math.isinf(x) or math.isinf(y):
        return x == y
    return abs(x - y) <= tol * abs(y) or x == y


# ---- comparison of a PairedStats against the oracle --------------------------------

SUM_FIELDS = ("rel_l2", "cosine", "norm_actual", "norm_expected", "norm_diff", "mean_diff")
EXACT_FIELDS = ("n", "n_finite", "zero_reference", "max_abs_err", "max_abs_err_actual",
                "max_abs_err_expected", "max_rel_err", "max_abs_expected", "mismatches",
                "mismatch_fraction", "worst_mismatch_excess", "n_unequal", "nan_actual",
                "posinf_actual", "neginf_actual", "nan_expected", "posinf_expected",
                "neginf_expected", "n_class_mismatch")
INDEX_FIELDS = {"max_abs_err_index": "max_abs_err_flat", "max_rel_err_index": "max_rel_err_flat",
                "worst_mismatch_index": "worst_mismatch_flat",
                "first_class_mismatch_index": "first_class_mismatch_flat"}


def _same_exact(x, y) -> bool:
    if x is None or y is None:
        return x is None and y is None
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return True
    return x == y


# ---- the exact oracle of the sums (integer arithmetic) ---------------------------------

_U = 1074  # every finite float64 is an integer multiple of 2^-1074


def to_units(x) -> list:
    """Finite float64 values -> Python ints X with x = X * 2^-1074 exactly."""
    out = []
    for v in np.asarray(x, dtype=np.float64).ravel().tolist():
        p, q = float(v).as_integer_ratio()  # q: a power of two <= 2^1074
        out.append(p * ((1 << _U) // q))
    return out


def _div(num: int, den: int) -> float:
    """num / den (den > 0) correctly rounded (CPython's int true division); +-inf beyond
    DBL_MAX, subnormal or 0 below."""
    try:
        return num / den
    except OverflowError:
        return math.inf if num > 0 else -math.inf


def sqrt_ratio(p: int, q: int, k: int = 0) -> float:
    """sqrt(p / q) * 2^k for integers p >= 0, q > 0, to ~2^-120 before the final rounding."""
    if p == 0:
        return 0.0
    s = max(0, 125 - (p.bit_length() - q.bit_length()) // 2)
    r = math.isqrt((p << (2 * s)) // q)  # floor(sqrt(p/q) * 2^s), >= 2^124
    sh = s - k
    return _div(r, 1 << sh) if sh >= 0 else _div(r << -sh, 1)


def _exact_fields(A: list, E: list) -> Dict:
    D = [x - y for x, y in zip(A, E)]
    n = len(D)
    saa = sum(x * x for x in A)
    see = sum(y * y for y in E)
    sae = sum(x * y for x, y in zip(A, E))
    sdd = sum(d * d for d in D)
    sd, sad = sum(D), sum(abs(d) for d in D)
    out: Dict = {"n_finite": n, "s_ee": see}
    out["norm_actual"] = sqrt_ratio(saa, 1, -_U)
    out["norm_expected"] = sqrt_ratio(see, 1, -_U)
    out["norm_diff"] = sqrt_ratio(sdd, 1, -_U)
    out["rel_l2"] = None if see == 0 else sqrt_ratio(sdd, see)
    if saa == 0 or see == 0:
        out["cosine"] = None
    else:
        c = sqrt_ratio(sae * sae, saa * see)
        c = -c if sae < 0 else c
        out["cosine"] = min(1.0, max(-1.0, c))
    out["mean_diff"] = _div(sd, n << _U) if n else None
    out["mean_abs"] = _div(sad, n << _U) if n else None
    out["ref_rms"] = sqrt_ratio(see, n, -_U) if n else None
    return out


def exact_sums(a64: np.ndarray, e64: np.ndarray, dim: Optional[int] = None) -> Dict:
    """The sum-based statistics of the finite pairs, exactly (then rounded once):
    norm_actual, norm_expected, norm_diff, rel_l2, cosine, mean_diff (and mean_abs, the
    conditioning of mean_diff); with dim, "slices" holds mean_shift, rel_l2, ref_rms,
    mean_abs per index along dim (NaN where undefined)."""
    a = np.asarray(a64, dtype=np.float64)
    e = np.asarray(e64, dtype=np.float64)
    fin = np.isfinite(a) & np.isfinite(e)
    out = _exact_fields(to_units(a[fin]), to_units(e[fin]))
    if dim is not None:
        am = np.moveaxis(a, dim, 0)
        em = np.moveaxis(e, dim, 0)
        k = am.shape[0]
        rest = int(np.prod(am.shape[1:], dtype=np.int64))
        am, em = am.reshape(k, rest), em.reshape(k, rest)
        sl = {f: np.full(k, np.nan) for f in ("mean_shift", "rel_l2", "ref_rms", "mean_abs")}
        for j in range(k):
            f = np.isfinite(am[j]) & np.isfinite(em[j])
            if not f.any():
                continue
            x = _exact_fields(to_units(am[j][f]), to_units(em[j][f]))
            sl["mean_shift"][j] = x["mean_diff"]
            sl["rel_l2"][j] = np.nan if x["rel_l2"] is None else x["rel_l2"]
            sl["ref_rms"][j] = x["ref_rms"]
            sl["mean_abs"][j] = x["mean_abs"]
        out["slices"] = sl
    return out


def mismatches_vs_oracle(stats, a64: np.ndarray, e64: np.ndarray, rtol: float = 1e-3,
                         atol: float = 1e-3, quantiles=(0.99,), dim: Optional[int] = None,
                         tol: float = 1e-12, cond_aware: bool = False,
                         exact: bool = False) -> Dict[str, tuple]:
    """{field: (engine, oracle)} for every field that disagrees (empty when all agree).

    Sums within `tol` relative, everything else exact (floats bitwise), quantiles
    bitwise equal to np.quantile, indices as multi-indices of the logical shape.

    cond_aware: the signed sums (mean of a-e, the dot product of the cosine) are
    held to `tol` relative to the sum of MAGNITUDES (the float64 summation bound,
    which no float64 accumulation beats under cancellation): mean_diff within
    tol*mean|d|, cosine within tol absolute (|<a,e>| <= ||a|| ||e||).

    exact: the sum-based fields (whole tensor and slices) are compared with exact_sums
    instead of the math.fsum oracle."""
    o = oracle(a64, e64, rtol, atol, quantiles, dim)
    ex = exact_sums(a64, e64, dim) if exact else None
    if ex is not None:
        o.update({f: ex[f] for f in SUM_FIELDS})
        if dim is not None:
            o["slices"].update(ex["slices"])
    shape = tuple(np.shape(a64))
    bad: Dict[str, tuple] = {}
    for f in SUM_FIELDS:
        if cond_aware and f in ("mean_diff", "cosine") and o[f] is not None \
                and getattr(stats, f) is not None:
            got = getattr(stats, f)
            if f == "cosine":
                scale = 1.0
            elif ex is not None:
                scale = ex["mean_abs"]
            else:
                fin = np.isfinite(a64) & np.isfinite(e64)
                with np.errstate(all="ignore"):
                    scale = mean(np.abs(np.asarray(a64, np.float64)[fin] - np.asarray(e64, np.float64)[fin]))
            if not (abs(got - o[f]) <= tol * scale or rel_close(got, o[f], tol)):
                bad[f] = (got, o[f])
            continue
        if not rel_close(getattr(stats, f), o[f], tol):
            bad[f] = (getattr(stats, f), o[f])
    for f in EXACT_FIELDS:
        if not _same_exact(getattr(stats, f), o[f]):
            bad[f] = (getattr(stats, f), o[f])
    for f, of in INDEX_FIELDS.items():
        want = None if o[of] is None else tuple(int(i) for i in np.unravel_index(o[of], shape))
        if getattr(stats, f) != want:
            bad[f] = (getattr(stats, f), want)
    for q, v in o["quantiles"].items():
        got = stats.quantiles.get(q, "missing")
        if not (got is None and v is None) and not (
                isinstance(got, float) and v is not None and
                (got == v or (math.isnan(got) and math.isnan(v)))):
            bad[f"quantile[{q}]"] = (got, v)
    if dim is not None:
        s = stats.slices
        want = o["slices"]
        if s is None:
            bad["slices"] = (None, "expected")
        else:
            if not np.array_equal(s.count, want["count"]):
                bad["slices.count"] = (s.count, want["count"])
            if not np.array_equal(s.max_abs_err, want["max_abs_err"], equal_nan=True):
                bad["slices.max_abs_err"] = (s.max_abs_err, want["max_abs_err"])
            for f in ("mean_shift", "rel_l2", "ref_rms"):
                x, y = np.asarray(getattr(s, f)), want[f]
                ok = np.array_equal(np.isnan(x), np.isnan(y)) and all(
                    rel_close(float(p), float(q), tol) for p, q in zip(x[~np.isnan(x)], y[~np.isnan(y)]))
                if not ok and cond_aware and f == "mean_shift":
                    ok = np.array_equal(np.isnan(x), np.isnan(y)) and np.all(
                        np.abs(x - y)[~np.isnan(y)] <= tol * want["mean_abs"][~np.isnan(y)])
                if not ok:
                    bad[f"slices.{f}"] = (x, y)
    return bad


def runs_within(bars):
    """Calibration runs for an evidence entry written by hand in a test: one run measuring each statistic at its
    bar (a statistic without a bar at 0, cosine 1), so the bars the bar rule re-derives from it (docs/method.md:
    at least the worst run times 1 + headroom) are never tighter than ``bars`` -- a gate refuses an entry whose
    bars are looser than its own runs give, and one without runs."""
    def at(k, default):  # (a test's deliberately malformed bar -- None, a string, NaN -- is not a measurement)
        v = bars.get(k)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else default

    run = {k: at(k, 0.0) for k in ("rel_l2", "p99", "max_abs_err", "channel_mean_shift", "channel_rel_l2")}
    run["cosine"] = at("cosine", 1.0)
    return [run]
