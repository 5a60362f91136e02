"""Exact quantiles of |a - e| over finite pairs: bitwise numpy.quantile (method="linear").

numpy.quantile is the definition (docs/metrics.md): h = (n-1)q, the order
statistics at floor(h) and floor(h)+1, numpy's _lerp.  The engine selects the
order statistics exactly (radix selection) and interpolates with the same
expression, so the results are equal bit for bit -- for any n (torch.quantile
refuses more than 2^24 elements), any dtype, ties.  Where an order statistic
is +inf (a float64 difference that overflows) numpy's formula gives NaN
(inf - inf); docs/metrics.md defines the limit instead (oracle.quantile_linear).
"""

import math

import numpy as np
import pytest

import vgct_ext
from oracle import quantile_linear, record_answered

QS = (0.0, 1e-6, 0.01, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 1.0 - 1e-9, 1.0)


def numpy_q(a, e, qs):
    a64, e64 = np.asarray(a, np.float64).ravel(), np.asarray(e, np.float64).ravel()
    fin = np.isfinite(a64) & np.isfinite(e64)
    with np.errstate(over="ignore", invalid="ignore"):
        d = np.abs(a64[fin] - e64[fin])
        return {q: float(np.quantile(d, q)) for q in qs} if d.size else {q: None for q in qs}


def assert_bitwise(got, want):
    assert set(got) == set(want)
    for q in want:
        g, w = got[q], want[q]
        same = (g is None and w is None) or (np.float64(g).tobytes() == np.float64(w).tobytes()) or (
            g is not None and w is not None and np.isnan(g) and np.isnan(w))
        assert same, (q, g, w)


@pytest.mark.slow
def test_twenty_million_elements():
    """n = 2e7 > 2^24: exact, bitwise numpy."""
    rng = np.random.default_rng(123)
    n = 20_000_000
    e = rng.standard_normal(n, dtype=np.float32)
    a = e + rng.standard_normal(n, dtype=np.float32) * np.float32(1e-3)
    s = vgct_ext.compare(a, e, quantiles=QS)
    assert s.n == n
    assert_bitwise(s.quantiles, numpy_q(a, e, QS))
    assert s.p99 == s.quantiles[0.99]


@pytest.mark.parametrize("dt", ["float32", "float16", "float64", "int8", "int64", "uint8", "bool"])
@pytest.mark.parametrize("n", [1, 2, 3, 10, 1000, 300_001])
def test_dtypes_and_sizes(dt, n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n) * 10
    y = x + rng.standard_normal(n)
    if dt == "bool":
        a, e = x > 0, y > 0
    elif np.dtype(dt).kind in "iu":
        info = np.iinfo(dt)
        a = np.clip(x, info.min, info.max).astype(dt)
        e = np.clip(y, info.min, info.max).astype(dt)
    else:
        a, e = x.astype(dt), y.astype(dt)
    assert_bitwise(vgct_ext.compare(a, e, quantiles=QS).quantiles, numpy_q(a, e, QS))


def test_many_ties_and_interpolation_branches():
    """Integer-valued differences: every quantile lands on ties or halfway (t = 0.5)."""
    rng = np.random.default_rng(1)
    a = rng.integers(0, 5, 10_001).astype(np.float32)
    e = np.zeros_like(a)
    qs = tuple(np.linspace(0, 1, 41))
    assert_bitwise(vgct_ext.compare(a, e, quantiles=qs).quantiles, numpy_q(a, e, qs))
    a2 = np.array([0.0, 1.0], np.float64)  # h = 0.5: numpy's t >= 0.5 branch
    assert vgct_ext.compare(a2, np.zeros(2), quantiles=(0.5,)).quantiles[0.5] == 0.5


def test_nonfinite_excluded_and_overflowing_difference():
    a = np.array([1.7e308, np.nan, 2.0, np.inf, 5.0, -1.7e308], np.float64)
    e = np.array([-1.7e308, 1.0, np.inf, np.inf, 1.0, 0.0], np.float64)
    s = vgct_ext.compare(a, e, quantiles=(0.0, 0.5, 0.75, 1.0))
    # finite pairs: |1.7e308 - -1.7e308| = inf (the float64 difference), 4, 1.7e308;
    # docs/metrics.md: q = 1 is the maximum, +inf as max_abs_err says; between 1.7e308 and
    # +inf (gamma > 0) the limit +inf -- numpy's lerp gives NaN there (inf - inf)
    assert s.n_finite == 3 and s.quantiles[0.0] == 4.0
    assert s.quantiles[0.5] == 1.7e308
    assert s.quantiles[0.75] == math.inf and s.quantiles[1.0] == math.inf == s.max_abs_err
    with np.errstate(over="ignore", invalid="ignore"):
        d = np.abs(a - e)[np.isfinite(a) & np.isfinite(e)]
        assert np.isnan(np.quantile(d, 1.0)) and np.isnan(np.quantile(d, 0.75))  # numpy's NaN
    assert s.quantiles == {p: quantile_linear(d, p) for p in (0.0, 0.5, 0.75, 1.0)}


def test_quantile_interpolation_towards_an_infinite_order_statistic():
    # the example: q = 0.5 interpolates 0 and +inf halfway, q = 1.0 is the maximum
    s = vgct_ext.compare(np.array([1.7e308, 1.0]), np.array([-1.7e308, 1.0]), quantiles=(0.0, 0.5, 1.0))
    assert s.quantiles == {0.0: 0.0, 0.5: math.inf, 1.0: math.inf} and s.max_abs_err == math.inf
    # two infinite order statistics: +inf (numpy: inf - inf = NaN); gamma == 0 on a finite one: exact
    s = vgct_ext.compare(np.array([1.7e308, -1.7e308, 3.0]), np.array([-1.7e308, 1.7e308, 1.0]),
                         quantiles=(0.0, 0.25, 0.5, 0.75, 1.0))
    assert s.quantiles == {0.0: 2.0, 0.25: math.inf, 0.5: math.inf, 0.75: math.inf, 1.0: math.inf}


def test_no_finite_pair_and_zero_size():
    a = np.full(4, np.nan, np.float32)
    assert vgct_ext.compare(a, a, quantiles=(0.5,)).quantiles == {0.5: None}
    z = np.zeros((0, 3), np.float16)
    assert vgct_ext.compare(z, z, quantiles=(0.5, 0.99)).quantiles == {0.5: None, 0.99: None}


def test_strided_views_and_repeatability():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((700, 301)).astype(np.float16)
    e = rng.standard_normal((700, 301)).astype(np.float16)
    for x, y in ((a.T, e.T), (a[::-3, 1::2], e[::-3, 1::2]),
                 (np.broadcast_to(a[:1], (50, 301)), e[:50])):
        got = [vgct_ext.compare(x, y, quantiles=QS).quantiles for _ in range(2)]
        assert got[0] == got[1]
        assert_bitwise(got[0], numpy_q(x, y, QS))


def test_sixty_four_quantiles_one_call():
    rng = np.random.default_rng(5)
    a = rng.standard_normal(200_003)
    e = rng.standard_normal(200_003) * 1e-3 + a
    qs = tuple(float(q) for q in rng.random(62)) + (0.0, 1.0)
    assert_bitwise(vgct_ext.compare(a, e, quantiles=qs).quantiles, numpy_q(a, e, qs))


def _bf16_round(x):
    """float32 -> bfloat16 (round to nearest even) -> float32, in NumPy."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16 << 16
    return b.astype(np.uint32).view(np.float32)


@pytest.mark.parametrize("shape", ["bf16_vs_fp32", "bf16_vs_bf16", "fp32", "identical", "cauchy",
                                   "outliers", "offset", "nonfinite", "subnormal", "wide_range"])
def test_data_shapes_large_n_windows(shape):
    """n >= 2^18: the quantiles come from key windows read in the reduction's pass (csrc/
    cpu_windows.inc, "vgct_cpu_presel"); bitwise numpy on the data users have: bf16 rounding
    noise against an fp32 and a bf16 reference (many ties), fp32 noise, an identical pair
    (every key 0), heavy tails, a few large outliers, a constant offset, NaN/Inf pairs,
    subnormal differences, a huge key range; one quantile and many at once."""
    rng = np.random.default_rng(77)
    n = (1 << 19) + 3
    e = rng.standard_normal(n).astype(np.float32)
    noise = rng.standard_normal(n).astype(np.float32) * np.float32(1e-3)
    if shape == "bf16_vs_fp32":
        a = _bf16_round(e + noise)
    elif shape == "bf16_vs_bf16":
        a, e = _bf16_round(e + noise), _bf16_round(e)
    elif shape == "fp32":
        a = e + noise
    elif shape == "identical":
        a = e.copy()
    elif shape == "cauchy":
        a = e + rng.standard_cauchy(n).astype(np.float32) * np.float32(1e-3)
    elif shape == "outliers":
        a = e + noise
        a[rng.integers(0, n, 16)] += np.float32(1e4)
    elif shape == "offset":
        a = e + np.float32(0.5)
    elif shape == "nonfinite":
        a = (e + noise).astype(np.float64)
        a[rng.random(n) < 0.05] = np.nan
        a[rng.random(n) < 0.01] = -np.inf
        e = e.astype(np.float64)
    elif shape == "subnormal":
        a, e = rng.standard_normal(n) * 1e-310, rng.standard_normal(n) * 1e-310
    else:
        e = e.astype(np.float64)
        a = e * 10.0 ** rng.integers(-250, 250, n)
    for qs in ((0.99,), QS):
        assert_bitwise(vgct_ext.compare(a, e, quantiles=qs).quantiles, numpy_q(a, e, qs))
    # a torch bfloat16 pair takes the same path (the bf16 loaders)
    if shape in ("bf16_vs_bf16", "identical"):
        torch = pytest.importorskip("torch")
        ta, te = torch.from_numpy(a).bfloat16(), torch.from_numpy(e).bfloat16()
        assert_bitwise(vgct_ext.compare(ta, te, quantiles=QS).quantiles,
                       numpy_q(ta.double().numpy(), te.double().numpy(), QS))


# ---- ranks the reduction's record answers (csrc/vgct_stats.h vgct_rank_known) -------------------
#
# |d| = 0 exactly when a == e (finite pairs), and at most n_unequal finite pairs differ: every
# rank below n_finite - n_unequal is 0 and rank n_finite - 1 is max_abs_err; compare() answers
# those from the reduction's record and selects only the rest (csrc/module.c select_unknown).
# vgct_cpu_test_known_last = [ranks answered so, ranks selected] of the last CPU compare.

def _known_last():
    import ctypes

    from vgct_ext import _C

    return list((ctypes.c_longlong * 2).in_dll(ctypes.CDLL(_C.__file__), "vgct_cpu_test_known_last"))


def _sparse(n, k, rng, dtype=np.float32, start=0):
    """n pairs of which exactly k (random positions from `start` on) differ, by at least a quarter
    of 1 + |e| (no rounding to dtype makes them equal again)."""
    e = rng.standard_normal(n).astype(dtype)
    a = e.copy()
    idx = start + rng.choice(n - start, size=k, replace=False)
    a[idx] += ((0.25 + rng.random(k)) * (1.0 + np.abs(e[idx]))).astype(dtype)
    return a, e


@pytest.mark.parametrize("n", [1, 2, 1000, 65_537, (1 << 18) + 5, (1 << 20) + 3])
def test_record_answers_at_the_zero_count_boundary(n):
    """k differing pairs around the p99's upper rank hi: k = n - hi - 1 leaves rank hi the last
    zero (answered 0), k = n - hi makes it the smallest nonzero key (selected; a zero count one too
    high -- planted in vgct_rank_known, tried -- answers it 0 and fails numpy here).  Below and
    above VGCT_PRESEL_MIN_N (the key windows), and the identical pair (k = 0: no selection)."""
    rng = np.random.default_rng(n)
    hi = min(math.floor((n - 1) * 0.99) + 1, n - 1)
    qs = (0.0, 0.5, 0.99, 0.999, 1.0)
    for k in sorted({0, 1, max(n - hi - 1, 0), n - hi, n // 20}):
        a, e = _sparse(n, k, rng)
        r = vgct_ext.compare(a, e, quantiles=qs)
        assert r.n_unequal == k
        assert_bitwise(r.quantiles, numpy_q(a, e, qs))
        assert _known_last() == record_answered(n, k, qs), (n, k, _known_last())


def test_record_answers_with_non_finite_and_int64_pairs():
    """NaN against a number and Inf against -Inf are unequal non-finite pairs (40), so n_finite -
    n_unequal is 40 below the true zero count: a lower bound, still exact.  The finite zeros are
    exactly the p99's upper rank hi, so hi is the smallest nonzero key: a zero count over all
    pairs (n - n_unequal, 20 too many -- planted, tried) answers it 0 and fails numpy here.
    64-bit integer pairs (exact integer differences): a == e gives |d| = 0, a != e at least 1."""
    rng = np.random.default_rng(3)
    n = 10_000
    nf = n - 60
    hi = math.floor((nf - 1) * 0.99) + 1
    a, e = _sparse(n, nf - hi, rng, np.float64, start=60)
    a[:30] = np.nan
    a[30:40], e[30:40] = np.nan, np.nan
    a[40:50], e[40:50] = np.inf, np.inf
    a[50:60], e[50:60] = np.inf, -np.inf
    qs = (0.5, 0.99, 1.0)
    r = vgct_ext.compare(a, e, quantiles=qs)
    assert r.n_finite == nf and r.n_unequal == nf - hi + 40
    assert r.quantiles[0.99] > 0.0
    assert_bitwise(r.quantiles, numpy_q(a, e, qs))
    assert _known_last() == record_answered(nf, r.n_unequal, qs)
    ai = rng.integers(-(2 ** 62), 2 ** 62, n, dtype=np.int64)
    ei = ai.copy()
    ei[rng.choice(n, size=50, replace=False)] += 1  # 50 keys of 1, the others 0
    qs = (0.99, 0.995, 0.996, 1.0)
    r = vgct_ext.compare(ai, ei, quantiles=qs)
    keys = np.sort((ai != ei).astype(np.float64))  # the exact |d|: 0 or 1
    assert_bitwise(r.quantiles, {q: float(np.quantile(keys, q)) for q in qs})


def test_record_answers_property():
    """Hypothesis: any n, any number of differing pairs, any quantiles -- bitwise numpy."""
    hyp = pytest.importorskip("hypothesis")
    st = pytest.importorskip("hypothesis.strategies")

    @hyp.settings(max_examples=150, deadline=None, derandomize=True)
    @hyp.given(n=st.integers(1, 3000), frac=st.floats(0.0, 0.05),
               qs=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=6), seed=st.integers(0, 2 ** 32 - 1))
    def check(n, frac, qs, seed):
        rng = np.random.default_rng(seed)
        a, e = _sparse(n, int(frac * n), rng)
        assert_bitwise(vgct_ext.compare(a, e, quantiles=tuple(qs)).quantiles, numpy_q(a, e, tuple(qs)))

    check()
