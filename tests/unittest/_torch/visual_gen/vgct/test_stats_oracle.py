"""vgct_ext.compare against the independent float64 oracle (oracle.py).

Every statistic of docs/metrics.md: sums within 1e-12 relative of math.fsum,
maxima, indices, counts and quantiles exact; every dtype NumPy exports, every
layout (contiguous, transposed, negative and stride-0 views, slices), the edge
values of the issue, and a stride-0 view of more than 2^31 elements.
"""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import vgct_ext
from oracle import exact_sums, mismatches_vs_oracle, oracle, quantile_linear

RNG = np.random.default_rng(20260501)
QS = (0.0, 0.25, 0.5, 0.9, 0.99, 1.0)


def check(a, e, rtol=1e-3, atol=1e-3, quantiles=QS, dim=None, a64=None, e64=None):
    s = vgct_ext.compare(a, e, rtol=rtol, atol=atol, quantiles=quantiles, dim=dim)
    a64 = np.asarray(a, dtype=np.float64) if a64 is None else a64
    e64 = np.asarray(e, dtype=np.float64) if e64 is None else e64
    bad = mismatches_vs_oracle(s, a64, e64, rtol, atol, quantiles, dim)
    assert not bad, f"{a.dtype}/{e.dtype} shape {a.shape} strides {a.strides}/{e.strides}: {bad}"
    return s


def pair(shape, dt_a, dt_e=None, rel=1e-3, seed=None):
    """Reference-like data and a perturbed copy, cast to the dtypes."""
    rng = np.random.default_rng(seed) if seed is not None else RNG
    dt_e = dt_e or dt_a
    base = rng.standard_normal(shape) * 3
    noise = rng.standard_normal(shape) * rel * 3

    def cast(x, dt):
        dt = np.dtype(dt)
        if dt == np.bool_:
            return x > 0
        if dt.kind in "iu":
            info = np.iinfo(dt)
            return np.clip(np.round(x * 20), info.min, info.max).astype(dt)
        return x.astype(dt)

    return cast(base + noise, dt_a), cast(base, dt_e)


DTYPES = ["float32", "float16", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"]


@pytest.mark.parametrize("dt", DTYPES)
def test_each_dtype_against_oracle(dt):
    a, e = pair((37, 61), dt)
    check(a, e)
    check(a, e, dim=1)


@pytest.mark.parametrize("dt_a,dt_e", [("float16", "float32"), ("float32", "float64"),
                                       ("int32", "float64"), ("uint8", "int8"),
                                       ("bool", "float16"), ("int64", "float32")])
def test_mixed_dtypes(dt_a, dt_e):
    a, e = pair((4, 1031), dt_a, dt_e)
    check(a, e)


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "negative", "stepped",
                                    "broadcast", "mixed_orders", "fortran", "size1_dims"])
@pytest.mark.parametrize("dt", ["float32", "float64", "float16"])
def test_layouts(layout, dt):
    a, e = pair((23, 17, 41), dt)
    if layout == "transposed":
        a, e = a.transpose(2, 0, 1), e.transpose(2, 0, 1)
    elif layout == "negative":
        a, e = a[::-1, :, ::-2], e[::-1, :, ::-2]
    elif layout == "stepped":
        a, e = a[1::2, ::3, 2:], e[1::2, ::3, 2:]
    elif layout == "broadcast":
        a = np.broadcast_to(a[:1], (5,) + a.shape[1:])
        e = np.broadcast_to(e[:1, :1], (5,) + e.shape[1:])
    elif layout == "mixed_orders":  # only one side transposed: no common memory order
        a = np.ascontiguousarray(a.transpose(2, 1, 0)).transpose(2, 1, 0)
    elif layout == "fortran":
        a, e = np.asfortranarray(a), np.asfortranarray(e)
    elif layout == "size1_dims":
        a, e = a[:, None, :1, :, None], e[:, None, :1, :, None]
    check(a, e)
    for d in range(a.ndim):
        check(a, e, dim=d, quantiles=(0.5,))


def test_large_multi_segment_and_threads():
    """> 2^18 pairs: several segments and both threads (the public path)."""
    a, e = pair((3, 300_007), "float32")
    check(a, e)
    check(a.T, e.T)
    check(a, e, dim=0)


# ---- edge values ------------------------------------------------------------------

def test_fp32_overflowing_square():
    """[1e20, 1, 1]: squares overflow float32 (1e40), not the float64 accumulation."""
    a = np.array([1e20, 1, 1], np.float32)
    e = np.array([1e20, 1, 2], np.float32)
    s = check(a, e)
    assert s.norm_actual == pytest.approx(1e20, rel=1e-7) and math.isfinite(s.norm_actual)
    assert s.rel_l2 == pytest.approx(1.0 / float(np.float32(1e20)), rel=1e-12)


def test_fp16_near_max():
    a = np.array([65504, 65504, -65504, 60000], np.float16)
    e = np.array([65504, 65472, 65504, -65504], np.float16)
    s = check(a, e)
    assert s.max_abs_err == 131008.0  # |(-65504) - 65504| is not an fp16 value, it is here
    assert s.max_abs_err_index == (2,)


@pytest.mark.parametrize("scale", [1e300, 1e-300, 1e-310, 2.0 ** -1074])
def test_float64_extreme_magnitudes(scale):
    a, e = pair((1000,), "float64", seed=3)
    s = check(a * scale, e * scale)
    if scale >= 1e-300:  # the data keep their 53-bit values: the ratios are those of scale 1
        s1 = vgct_ext.compare(a, e)
        assert s.rel_l2 == pytest.approx(s1.rel_l2, rel=1e-12)
        assert s.cosine == pytest.approx(s1.cosine, rel=1e-12)


def test_float64_near_max_and_subnormal_mix():
    a = np.array([1.2e308, 1e308, 1e-320, 0.0, -5e-324], np.float64)
    e = np.array([1.2e308, 9e307, 3e-320, 1e-310, 5e-324], np.float64)
    s = check(a, e)
    assert math.isfinite(s.norm_actual) and math.isfinite(s.norm_expected)
    s = check(a * 1.4, e)  # ||a|| > DBL_MAX: +inf, the ratios stay finite
    assert s.norm_actual == math.inf and 0 < s.cosine <= 1 and math.isfinite(s.rel_l2)
    b = np.array([np.finfo(np.float64).max, 1.0])
    s = check(b, b / 2)
    assert s.rel_l2 == pytest.approx(1.0, rel=1e-12) and s.cosine == pytest.approx(1.0, rel=1e-12)


# ---- float64 across families of magnitudes (per-family scales, docs/metrics.md) -----------
# Each sum family (a, e, d = a - e) has its own power-of-two scale, so no vector underflows
# against another one's magnitude; checked against the EXACT integer oracle (oracle.exact_sums),
# every sum-based statistic within 1e-12 relative.

def check_exact(a, e, dim=None, quantiles=QS, cond_aware=False):
    s = vgct_ext.compare(a, e, quantiles=quantiles, dim=dim)
    bad = mismatches_vs_oracle(s, np.asarray(a, np.float64), np.asarray(e, np.float64), 1e-3, 1e-3,
                               quantiles, dim, exact=True, cond_aware=cond_aware)
    assert not bad, f"shape {np.shape(a)} dim {dim}: {bad}"
    return s


@pytest.mark.parametrize("n", [7, 1000, 70001])
def test_float64_tiny_actual_against_unit_reference(n):
    """a ~ 1e-200 against e ~ 1: ||a|| used to underflow to 0 (cosine None) against the
    shared scale of e; now it is exact, and so are cosine and rel_l2."""
    rng = np.random.default_rng(n)
    e = rng.standard_normal(n)
    a = 1e-200 * e * (1 + 1e-3 * rng.standard_normal(n))
    s = check_exact(a, e)
    assert s.norm_actual == pytest.approx(1e-200 * np.linalg.norm(e), rel=1e-5)
    assert s.cosine == pytest.approx(1.0, abs=1e-5) and s.rel_l2 == pytest.approx(1.0, rel=1e-12)
    b = 1e-200 * rng.standard_normal(n)  # independent: cosine near 0 (conditioned bound)
    s = check_exact(b, e, cond_aware=True)
    assert s.cosine is not None and s.norm_actual > 0


@pytest.mark.parametrize("tiny", [1e-200, 1e-300, 1e-310])
def test_float64_tiny_reference_against_unit_actual(tiny):
    rng = np.random.default_rng(1)
    a = rng.standard_normal(513)
    e = tiny * a * (1 + 1e-3 * rng.standard_normal(513))
    s = check_exact(a, e)
    assert not s.zero_reference and s.norm_expected > 0
    assert s.rel_l2 == pytest.approx(1.0 / tiny, rel=1e-2) and s.cosine == pytest.approx(1.0, abs=1e-5)


def test_float64_tiny_differences_next_to_a_huge_outlier():
    """a = e except tiny differences (~1e-300), with |e| ~ 1e300 elsewhere: ||a - e|| used to
    underflow to 0 against the outlier; d has its own scale now."""
    rng = np.random.default_rng(2)
    e = 1e-290 * rng.standard_normal(2000)
    e[1234] = 1e300
    a = e + 1e-300 * rng.standard_normal(2000)
    a[1234] = e[1234]
    assert np.count_nonzero(a != e) > 1900
    s = check_exact(a, e, cond_aware=True)
    d = a - e
    assert s.norm_diff == pytest.approx(math.sqrt(math.fsum((d * 1e300) ** 2)) / 1e300, rel=1e-12)
    assert s.norm_diff > 0 and s.max_abs_err == float(np.max(np.abs(d)))
    # ||d|| / ||e|| ~ 1e-598 is below the float64 range: 0 is its correct rounding
    assert s.rel_l2 == 0.0 and s.mean_diff != 0.0


def test_float64_difference_overflows_near_dbl_max():
    """|a|, |e| near DBL_MAX with opposite signs: a - e overflows float64 although both are
    finite.  max_abs_err and the quantiles keep +Inf (the float64 difference); the sums are
    computed from (a/2 - e/2) and are exact: ||a - e|| > DBL_MAX is +Inf, rel_l2 and the
    mean are finite."""
    big = np.finfo(np.float64).max
    a = np.array([big, -0.9 * big, 1.0, 0.5, 1e-300, -3.0])
    e = np.array([-big, 0.95 * big, 2.0, 0.5, 0.0, -3.0])
    s = check_exact(a, e, quantiles=(0.0, 0.5, 0.9, 1.0))
    assert s.max_abs_err == math.inf and s.max_abs_err_index == (0,)
    assert s.norm_diff == math.inf and s.quantiles[0.5] == 0.5  # quantiles: numpy's, checked above
    assert s.rel_l2 == pytest.approx(math.hypot(2, 1.85) / math.hypot(1, 0.95), rel=1e-12)
    assert s.mean_diff == pytest.approx(((big - 0.9 * big) + (big - 0.95 * big) - 1 + 1e-300) / 6, rel=1e-12)
    # the sums of the two huge pairs cancel to the small rest: the mean of the small d only
    a2 = np.array([big, -big, 1.0, 4.0])
    e2 = np.array([-big, big, 2.0, 2.0])
    s = check_exact(a2, e2)
    assert s.mean_diff == 0.25 and s.rel_l2 == pytest.approx(2.0, rel=1e-12)
    assert s.cosine == pytest.approx(-1.0, rel=1e-12)


def test_float64_subnormals_against_normals():
    """Subnormal vectors next to O(1) values of the other side, and on their own."""
    rng = np.random.default_rng(3)
    sub = rng.integers(1, 2 ** 40, 700) * 5e-324 * rng.choice([-1.0, 1.0], 700)
    one = rng.standard_normal(700)
    for a, e in ((sub, one), (one, sub), (sub, sub[::-1].copy()), (sub, 0.5 * sub)):
        s = check_exact(a, e, cond_aware=True)
        assert s.norm_actual > 0 and s.norm_expected > 0
    s = check_exact(np.array([5e-324, 0.0, 1e-323]), np.array([1e300, 1.0, 0.0]))
    assert s.norm_actual == pytest.approx(math.sqrt(5.0) * 5e-324, rel=1e-12)


def test_float64_exact_oracle_per_slice():
    """The same families per slice (compare(dim=k)): each slice has its own e and d scales."""
    rng = np.random.default_rng(4)
    e = rng.standard_normal((6, 300))
    a = e * (1 + 1e-4 * rng.standard_normal(e.shape))
    a[0] *= 1e-200                      # slice 0: tiny actual, unit reference
    e[1] *= 1e-250                      # slice 1: tiny reference, unit actual (rel_l2 ~ 1e250)
    e[2] *= 1e-290                      # slice 2: tiny differences next to a huge value
    e[2, 7] = 1e300
    a[2] = e[2] + 1e-300 * rng.standard_normal(300)
    a[2, 7] = e[2, 7]
    a[3, :2], e[3, :2] = [1.7e308, -1.7e308], [-1.7e308, 1.7e308]  # slice 3: d overflows
    e[4] = 5e-324 * rng.integers(1, 1000, 300)  # slice 4: subnormal reference and actual
    a[4] = 5e-324 * rng.integers(1, 1000, 300)
    for dim, x, y in ((0, a, e), (1, a.T, e.T), (0, np.asfortranarray(a), e[::-1][::-1])):
        s = check_exact(x, y, dim=dim, cond_aware=True)
    sl = s.slices
    assert np.all(np.isfinite(sl.rel_l2)) and sl.rel_l2[1] > 1e249 and np.all(sl.ref_rms > 0)
    assert sl.mean_shift[2] != 0.0 and abs(sl.mean_shift[2]) < 1e-300
    ex = exact_sums(a, e, 0)["slices"]
    np.testing.assert_allclose(sl.rel_l2, ex["rel_l2"], rtol=1e-12)
    np.testing.assert_allclose(sl.ref_rms, ex["ref_rms"], rtol=1e-12)


@pytest.mark.parametrize("shape", [(0,), (3, 0, 2), (0, 5)])
def test_zero_size(shape):
    a = np.zeros(shape, np.float32)
    s = check(a, a.copy())
    assert s.n == 0 and s.n_finite == 0 and s.rel_l2 is None and s.max_abs_err is None
    assert s.quantiles == {q: None for q in QS}
    if len(shape) > 1:
        s = vgct_ext.compare(a, a.copy(), dim=len(shape) - 1)
        assert s.slices.count.tolist() == [0] * shape[-1]


def test_zero_reference():
    a = np.array([0.5, -1.0, 0.0], np.float32)
    e = np.zeros(3, np.float32)
    s = check(a, e)
    assert s.zero_reference and s.rel_l2 is None and s.cosine is None
    assert s.max_rel_err is None and s.max_abs_expected == 0.0 and s.norm_diff > 0
    s = check(e, e.copy())
    assert s.zero_reference and s.rel_l2 is None and s.n_unequal == 0


def test_all_nan():
    a = np.full((3, 4), np.nan, np.float32)
    s = check(a, a.copy())
    assert s.n_finite == 0 and s.n_unequal == 0 and s.nan_actual == 12 and s.nan_expected == 12
    assert s.n_class_mismatch == 0 and s.rel_l2 is None and s.quantiles[0.5] is None


def test_nonfinite_accounting_and_first_class_mismatch():
    a = np.array([1.0, np.nan, np.inf, -np.inf, 2.0, np.inf, np.nan, 3.0], np.float32)
    e = np.array([1.0, np.nan, np.inf, np.inf, np.nan, 5.0, 1.0, 3.5], np.float32)
    s = check(a, e)
    assert (s.nan_actual, s.posinf_actual, s.neginf_actual) == (2, 2, 1)
    assert (s.nan_expected, s.posinf_expected, s.neginf_expected) == (2, 2, 0)
    assert s.n_class_mismatch == 4 and s.first_class_mismatch_index == (3,)
    assert s.n_finite == 2 and s.n_unequal == 5  # (1,1),(nan,nan),(inf,inf) equal
    # transposed: the lowest LOGICAL index wins, not the first in memory
    a2 = np.zeros((4, 4), np.float32)
    e2 = a2.copy()
    a2[3, 0] = np.nan
    a2[0, 3] = np.inf
    s = check(a2.T, e2.T)
    assert s.first_class_mismatch_index == (0, 3)


def test_signed_zero_and_denormals():
    a = np.array([-0.0, 0.0, 1e-45, -1e-45, 5e-324], np.float64)
    e = np.array([0.0, -0.0, 1e-45, 1e-45, 0.0], np.float64)
    s = check(a, e)
    assert s.n_unequal == 2 and s.max_abs_err == 2e-45 and s.max_abs_err_index == (3,)


def test_ties_lowest_logical_index():
    """Ties of max |d|, max rel and worst excess: the lowest row-major index,
    whatever the memory order (transposed and reversed views)."""
    a = np.zeros((64, 48), np.float32)
    e = np.ones((64, 48), np.float32)
    for i, j in [(50, 1), (3, 40), (3, 41), (60, 0)]:
        a[i, j] = 5.0
    for view in (lambda x: x, lambda x: x.T, lambda x: x[::-1], lambda x: x.T[::-1, ::-1]):
        av, ev = np.ascontiguousarray(view(a)), np.ascontiguousarray(view(e))
        for layout in (lambda x: x, lambda x: np.asfortranarray(x)):
            s = check(layout(av), layout(ev))
            flat = np.flatnonzero(np.abs(av.astype(np.float64) - ev) == 4.0)[0]
            assert s.max_abs_err_index == tuple(np.unravel_index(flat, av.shape))


def test_mismatch_convention_is_allclose():
    """|a-e| > atol + rtol*|e| (torch.allclose / numpy.isclose), equality is a match."""
    e = np.ones(4, np.float64)
    a = e + np.array([2.0 ** -10, 2.0 ** -10 + 2.0 ** -30, -(2.0 ** -10), 0.0])
    s = check(a, e, rtol=2.0 ** -11, atol=2.0 ** -11)
    assert s.mismatches == 1 and s.worst_mismatch_index == (1,)
    want = int((~np.isclose(a, e, rtol=2.0 ** -11, atol=2.0 ** -11)).sum())
    assert s.mismatches == want
    x, y = pair((5000,), "float32", rel=1e-2)
    s = check(x, y, rtol=1e-3, atol=1e-3)
    assert s.mismatches == int((~np.isclose(x.astype(np.float64), y.astype(np.float64),
                                            rtol=1e-3, atol=1e-3)).sum()) > 0


def test_rank0_scalars():
    s = check(np.array(2.5, np.float32), np.array(2.0, np.float32))
    assert s.n == 1 and s.max_abs_err == 0.5 and s.max_abs_err_index == ()


def test_repeatable_bitwise():
    a, e = pair((7, 100_003), "float32")
    r = [json.dumps(vgct_ext.compare(a.T, e.T, dim=0, quantiles=(0.5, 0.99)).as_dict(),
                    default=lambda x: x.hex() if isinstance(x, float) else str(x), sort_keys=True)
         for _ in range(3)]
    assert r[0] == r[1] == r[2]


_THREADS_SCRIPT = r"""
import json, sys, numpy as np, vgct_ext
rng = np.random.default_rng(7)
a = rng.standard_normal((5, 300_017)).astype(np.float32)
e = (a + rng.standard_normal(a.shape).astype(np.float32) * 1e-3)
out = []
for x, y, dim in ((a, e, None), (a.T, e.T, 1), (a.astype(np.float64) * 1e300, e.astype(np.float64) * 1e300, 0)):
    d = vgct_ext.compare(x, y, dim=dim, quantiles=(0.5, 0.99)).as_dict()
    out.append(json.dumps(d, sort_keys=True, default=str, allow_nan=True))
    out.append(repr([v.hex() for v in (d['rel_l2'], d['cosine'], d['norm_diff'], d['mean_diff'])]))
print(json.dumps(out))
"""


def test_thread_count_independent_bitwise():
    """VGCT_NUM_THREADS=1 and =2 give bitwise identical results (the public path)."""
    outs = []
    for nt in ("1", "2"):
        env = dict(os.environ, VGCT_NUM_THREADS=nt)
        r = subprocess.run([sys.executable, "-c", _THREADS_SCRIPT], env=env, capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0, r.stderr
        outs.append(r.stdout)
    assert outs[0] == outs[1]


# ---- more than 2^31 elements, no memory ----------------------------------------------

@pytest.mark.slow
def test_broadcast_view_over_2_31_elements_exact():
    """A stride-0 view of 2^31 + 2^10 pairs (8 KiB of data): every statistic in closed form
    (int64 sizes and indices end to end: counts above 2^31, indices past 2^31 - 1)."""
    rows = (1 << 21) + 1
    x = np.linspace(-1, 1, 1024, dtype=np.float32)
    y = (x * np.float32(0.5)).astype(np.float32)
    y[1000] = 3.0  # the largest |d|, first at flat index 1000, again in every row
    a = np.broadcast_to(x, (rows, 1024))
    e = np.broadcast_to(y, (rows, 1024))
    n = rows * 1024
    assert n > 2 ** 31 and a.strides == (0, 4)
    s = vgct_ext.compare(a, e, quantiles=(0.5, 0.99))
    o = oracle(x.astype(np.float64), y.astype(np.float64), quantiles=(0.5, 0.99))
    assert s.n == n and s.n_finite == n and s.n_class_mismatch == 0
    assert s.n_unequal == rows * o["n_unequal"]
    assert s.mismatches == rows * o["mismatches"] and s.n_unequal > 2 ** 31
    for f in ("rel_l2", "cosine"):
        assert getattr(s, f) == pytest.approx(o[f], rel=1e-12)
    for f in ("norm_actual", "norm_expected", "norm_diff"):
        assert getattr(s, f) == pytest.approx(o[f] * math.sqrt(rows), rel=1e-12)
    assert s.mean_diff == pytest.approx(o["mean_diff"], rel=1e-12)
    assert s.max_abs_err == o["max_abs_err"] and s.max_abs_err_index == (0, 1000)
    assert s.max_rel_err_index == (0, o["max_rel_err_flat"])
    assert s.worst_mismatch_index == (0, o["worst_mismatch_flat"])
    # quantiles: each |d| value appears `rows` times, so the sorted order is known
    absd = np.sort(np.abs(x.astype(np.float64) - y))
    m = rows * absd.size
    for q in (0.5, 0.99):
        h = (m - 1) * q
        lo = math.floor(h)
        hi = min(lo + 1, m - 1)
        g = h - lo
        va, vb = absd[lo // rows], absd[hi // rows]
        want = vb - (vb - va) * (1 - g) if g >= 0.5 else va + (vb - va) * g
        assert s.quantiles[q] == want


# -- issue #12: integer pairs with a 64-bit side are compared exactly ------------------------------

def _int_oracle(a, e, rtol, atol, qs):
    """Exact oracle in Python integers and Fractions (docs/metrics.md, "Integer pairs")."""
    from fractions import Fraction

    A = [int(x) for x in np.asarray(a).ravel()]
    E = [int(x) for x in np.asarray(e).ravel()]
    D = [abs(x - y) for x, y in zip(A, E)]
    tol = [Fraction(atol) + Fraction(rtol) * abs(y) for y in E]
    mism = [i for i, (d, t) in enumerate(zip(D, tol)) if d > t]
    dmax = max(float(d) for d in D)  # int -> float is correctly rounded
    out = {"n_unequal": sum(x != y for x, y in zip(A, E)), "mismatches": len(mism),
           "max_abs_err": dmax, "max_abs_err_index": next(i for i, d in enumerate(D) if float(d) == dmax),
           "max_abs_err_actual": float(A[D.index(max(D, key=lambda d: float(d)))]) if D else None,
           "quantiles": {q: quantile_linear(np.array([float(d) for d in D]), q) for q in qs},
           "excess": {i: D[i] - tol[i] for i in mism}}
    out["max_abs_err_actual"] = float(A[out["max_abs_err_index"]])
    out["max_abs_err_expected"] = float(E[out["max_abs_err_index"]])
    return out


def _check_int(a, e, rtol, atol, qs=(0.0, 0.5, 0.9, 1.0)):
    s = vgct_ext.compare(a, e, rtol=rtol, atol=atol, quantiles=qs)
    o = _int_oracle(a, e, rtol, atol, qs)
    for k in ("n_unequal", "mismatches", "max_abs_err", "max_abs_err_index", "max_abs_err_actual",
              "max_abs_err_expected"):
        got = getattr(s, k)
        got = got[0] if k.endswith("_index") else got
        assert got == o[k], (k, got, o[k], a.dtype, e.dtype)
    assert dict(s.quantiles) == o["quantiles"]
    assert s.n_finite == a.size
    if o["excess"]:  # the worst excess: exact order up to the float64 rounding of the excess
        best = max(o["excess"].values())
        i = s.worst_mismatch_index[0]
        assert i in o["excess"] and o["excess"][i] >= best * (1 - 2.0 ** -50)
        assert abs(s.worst_mismatch_excess - float(best)) <= abs(float(best)) * 2.0 ** -50
    else:
        assert s.worst_mismatch_index is None
    return s


def test_int64_above_2_53_is_exact():
    # the example: float64 conversion made both pairs "equal"
    s = _check_int(np.array([2**53 + 1, 2**62 + 1]), np.array([2**53, 2**62]), 0.0, 0.0)
    assert (s.max_abs_err, s.mismatches, s.n_unequal) == (1.0, 2, 2)
    # int64 extremes: |min - max| = 2^64 - 1 (needs 64 bits), exact then rounded once
    lo, hi = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    s = _check_int(np.array([lo, hi, -1, 0]), np.array([hi, lo, 0, 0]), 0.0, 0.5)
    assert s.max_abs_err == 2.0 ** 64 and s.max_abs_err_index == (0,)


def test_integer_mismatch_is_decided_exactly():
    # |a-e| next to atol + rtol*|e| by less than one float64 ulp of either side
    e0 = 2**62 + 1
    for rtol, atol in ((2.0 ** -3, 0.5), (0.1, 0.0), (1e-3, 2.0 ** 55 + 0.25), (1.0, 0.0)):
        from fractions import Fraction
        t = Fraction(atol) + Fraction(rtol) * e0
        base = int(t)  # floor
        ds = [base + k for k in (-2, -1, 0, 1, 2)]
        vals = [e0 - d for d in ds] + [e0 + d for d in ds if e0 + d < 2**63]  # both signs of a - e
        _check_int(np.array(vals, np.int64), np.full(len(vals), e0, np.int64), rtol, atol)
        uvals = [e0 - d for d in ds if d <= e0] + [e0 + d for d in ds if e0 + d < 2**64]
        _check_int(np.array(uvals, np.uint64), np.full(len(uvals), e0, np.uint64), rtol, atol)
    # an exact tie is a match (torch.allclose: <=)
    s = _check_int(np.array([2**60 + 2**59]), np.array([2**60]), 0.5, 0.0)
    assert s.mismatches == 0


@pytest.mark.parametrize("dt_a,dt_e", [("int64", "int64"), ("uint64", "uint64"), ("int64", "uint64"),
                                       ("uint64", "int8"), ("int32", "uint64"), ("bool", "int64"),
                                       ("uint32", "int64"), ("uint16", "int64")])
def test_integer_pairs_random_edges(dt_a, dt_e):
    rng = np.random.default_rng(12)
    def draw(dt, n):
        info = np.iinfo(dt) if dt != "bool" else None
        if info is None:
            return rng.integers(0, 2, n).astype(bool)
        edges = np.array([info.min, info.max, 0, 1, 2**53 if info.max > 2**53 else info.max,
                          2**53 + 1 if info.max > 2**53 else info.min], dtype=object)
        v = rng.integers(info.min, info.max, n, dtype=dt, endpoint=True).astype(object)
        v[: len(edges)] = edges
        near = rng.integers(0, len(v), n // 3)
        v[near] = [min(max(int(x) + int(rng.integers(-3, 4)), int(info.min)), int(info.max)) for x in v[near]]
        return np.array([int(x) for x in v], dtype=dt)
    n = 600
    a = draw(dt_a, n)
    e = draw(dt_e, n)
    k = rng.integers(0, n, n // 2)  # near pairs: differences far below 2^53 next to huge values
    if dt_a != "bool" and dt_e != "bool" and np.dtype(dt_a).itemsize >= np.dtype(dt_e).itemsize \
            and np.can_cast(dt_e, dt_a):
        a[k] = np.clip(e[k].astype(object) + rng.integers(-5, 6, k.size), np.iinfo(dt_a).min,
                       np.iinfo(dt_a).max).astype(dt_a)
    for rtol, atol in ((0.0, 0.0), (1e-3, 1e-3), (2.0 ** -20, 3.0)):
        _check_int(a, e, rtol, atol)
    # layouts: strided and reversed views take the same path
    _check_int(a[::-3], e[::-3], 1e-3, 1e-3)


def test_mixed_integer_float_pairs_convert_to_float64():
    """docs/metrics.md: a pair with a floating side compares in float64 (the integer rounded to
    nearest, as numpy's int64 - float64 -> float64): 2^53 + 1 against the float 2^53 is equal."""
    s = vgct_ext.compare(np.array([2**53 + 1, 3]), np.array([2.0**53, 3.5]), rtol=0, atol=0)
    assert s.n_unequal == 1 and s.max_abs_err == 0.5 and s.max_abs_err_index == (1,)


def test_integer_pairs_threads_segments_and_slices():
    """2^20 int64 pairs above 2^53 (threads, several segments, per-slice statistics): counts and
    maxima against exact NumPy integer arithmetic (differences here fit int64)."""
    rng = np.random.default_rng(5)
    n = 1 << 20
    e = rng.integers(2**60, 2**62, n, dtype=np.int64)
    a = e + rng.integers(-3, 4, n, dtype=np.int64)  # differences of 0..3 next to values ~2^61
    s = vgct_ext.compare(a.reshape(256, -1), e.reshape(256, -1), rtol=0.0, atol=1.5, quantiles=(0.5, 1.0), dim=0)
    d = np.abs(a - e)  # exact: |d| <= 3
    assert s.n_unequal == int(np.count_nonzero(d)) and s.mismatches == int(np.count_nonzero(d > 1.5))
    assert s.max_abs_err == 3.0 and np.ravel_multi_index(s.max_abs_err_index, (256, n // 256)) == int(np.argmax(d))
    assert s.quantiles == {0.5: float(np.quantile(d.astype(np.float64), 0.5)), 1.0: 3.0}
    assert s.slices.count.tolist() == [n // 256] * 256
    assert s.slices.max_abs_err.tolist() == d.reshape(256, -1).max(axis=1).astype(float).tolist()
    assert math.isclose(s.mean_diff, float(np.mean((a - e).astype(np.float64))), rel_tol=1e-12, abs_tol=1e-15)
