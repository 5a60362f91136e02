"""The CPU engine's own guarantees, through the ctypes test build (_cengine.py).

* the fast tile fold (vectorised, all-finite tiles, patched non-finite pairs)
  is BITWISE the definition path (every tile through vgct_acc_update), for
  every dtype, layout, slice axis, value mix, and every x86 code level;
* results are bitwise independent of the thread count and repeatable;
* the radix selection is exact for any cap on its candidate buffer (several
  passes, several rank groups), and the fingerprint is layout- and
  thread-independent and follows its definition.
"""

import math

import numpy as np
import pytest

import _cengine
import vgct_ext
from oracle import decode_bf16, decode_e4m3, decode_e5m2, norm

hyp = pytest.importorskip("hypothesis")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

NP_DTYPES = ["float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8", "bool"]
RAW = {"bfloat16": (np.uint16, decode_bf16), "float8_e4m3fn": (np.uint8, decode_e4m3),
       "float8_e5m2": (np.uint8, decode_e5m2)}
SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 5e-324, 1e-310, 1e300, -1e300, 65504.0]


def make(rng, shape, dt, nonfinite=0.0, rel=1e-3):
    """(a, e, a64, e64, dta, dte): data of dtype dt (raw bits for the RAW types)."""
    base = rng.standard_normal(shape) * 2
    x = base + rng.standard_normal(shape) * rel
    if dt in RAW:
        bits_t, dec = RAW[dt]
        if bits_t == np.uint16:  # bfloat16: the upper half of float32 (truncation is fine here)
            def enc(v):
                return (v.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        else:
            def enc(v):
                return rng.integers(0, 256, size=v.shape, dtype=np.uint8)
        a, e = enc(x), enc(base)
        if nonfinite:
            m = rng.random(shape) < nonfinite
            a[m] = 0x7FC0 if bits_t == np.uint16 else 0x7F
        return a, e, dec(a), dec(e), dt, dt
    dtn = np.dtype(dt)
    if dtn == np.bool_:
        a, e = x > 0, base > 0
    elif dtn.kind in "iu":
        info = np.iinfo(dtn)
        a = np.clip(np.round(x * 30), info.min, info.max).astype(dtn)
        e = np.clip(np.round(base * 30), info.min, info.max).astype(dtn)
    else:
        a, e = x.astype(dtn), base.astype(dtn)
        if nonfinite:
            with np.errstate(over="ignore"):
                sp = np.array(SPECIALS).astype(dtn)
            for arr in (a, e):
                m = rng.random(shape) < nonfinite
                arr[m] = rng.choice(sp, size=int(m.sum()))
    return a, e, a.astype(np.float64), e.astype(np.float64), None, None


LAYOUTS = {
    "contiguous": lambda x: x,
    "transposed": lambda x: x.T,
    "reversed": lambda x: x[::-1, ::-1],
    "stepped": lambda x: x[::2, 1::3],
    "fortran": lambda x: np.asfortranarray(x),
}


def acc_bits(res):
    acc, sl = res
    return acc.as_tuple(), [bytes(s) for s in sl]


def run_both(eng, a, e, dim, dta, dte, **knobs):
    eng.configure(**knobs)
    fast = acc_bits(eng.reduce(a, e, dim=dim, dta=dta, dte=dte, nthreads=2))
    eng.configure(force_slow=1, **knobs)
    slow = acc_bits(eng.reduce(a, e, dim=dim, dta=dta, dte=dte, nthreads=1))
    eng.configure()
    return fast, slow


@given(dt=st.sampled_from(NP_DTYPES + list(RAW)), layout=st.sampled_from(sorted(LAYOUTS)),
       rows=st.integers(1, 40), cols=st.integers(1, 300), nonfinite=st.sampled_from([0, 0.002, 0.3]),
       dim=st.sampled_from([-1, 0, 1]), seed=st.integers(0, 2 ** 31),
       seg=st.sampled_from([0, 1024, 2048]))
def test_fast_path_is_the_definition_bitwise(cengine, dt, layout, rows, cols, nonfinite, dim, seed, seg):
    rng = np.random.default_rng(seed)
    a, e, _, _, dta, dte = make(rng, (rows, cols), dt, nonfinite)
    f = LAYOUTS[layout]
    a, e = f(a), f(e)
    fast, slow = run_both(cengine, a, e, dim, dta, dte, seg_min=seg, par_min=0)
    assert fast == slow


def wide_f64(rng, shape, nonfinite=0.0):
    """float64 pairs with mixed exponents (1e-320 .. 1.7e308), some a ~ e, some pairs near
    DBL_MAX with opposite signs (a - e overflows), optionally NaN/Inf."""
    n = int(np.prod(shape))
    mag = 10.0 ** rng.uniform(-300, 300, n)
    sp = rng.random(n) < 0.05
    mag[sp] = rng.choice([5e-324, 1e-310, 3e-320, 1.7e308, 1.2e308, 0.0], int(sp.sum()))
    a = mag * rng.choice([-1.0, 1.0], n)
    e = a * (1 + 1e-3 * rng.standard_normal(n))
    k = rng.random(n)
    e[k < 0.2] = 10.0 ** rng.uniform(-300, 300, int((k < 0.2).sum()))
    big = k > 0.97
    a[big] = 1.7e308 * rng.uniform(0.6, 1.0, int(big.sum()))
    e[big] = -1.6e308 * rng.uniform(0.6, 1.0, int(big.sum()))
    sub = (k > 0.94) & (k <= 0.97)
    a[sub] = rng.choice([5e-324, -1e-321, 3e-320, 0.0], int(sub.sum()))
    if nonfinite:
        m = rng.random(n) < nonfinite
        a[m] = rng.choice([np.nan, np.inf, -np.inf], int(m.sum()))
    return a.reshape(shape), e.reshape(shape)


@given(rows=st.integers(1, 30), cols=st.integers(1, 300), nonfinite=st.sampled_from([0, 0.003]),
       dim=st.sampled_from([-1, 0, 1]), layout=st.sampled_from(sorted(LAYOUTS)),
       seed=st.integers(0, 2 ** 31), seg=st.sampled_from([0, 1024]))
def test_fast_path_is_the_definition_bitwise_wide_float64(cengine, rows, cols, nonfinite, dim, layout,
                                                          seed, seg):
    """The scaled fold (per-family tile scales, the blended overflowing difference) reproduces
    the definition path bit for bit on float64 data spanning the whole exponent range."""
    rng = np.random.default_rng(seed)
    a, e = wide_f64(rng, (rows, cols), nonfinite)
    f = LAYOUTS[layout]
    fast, slow = run_both(cengine, f(a), f(e), dim, None, None, seg_min=seg, par_min=0)
    assert fast == slow


@pytest.mark.parametrize("nonfinite", [0.0, 0.01])
def test_code_levels_agree_bitwise_wide_float64(engine, nonfinite):
    rng = np.random.default_rng(6)
    a, e = wide_f64(rng, (61, 1003), nonfinite)
    outs = []
    for level in (0, 1, 2):
        engine.configure(level=level)
        outs.append(acc_bits(engine.reduce(a, e, dim=1)))
    engine.configure()
    assert outs == [outs[0]] * 3


@pytest.mark.parametrize("dt", ["float32", "float64", "bfloat16", "int16"])
@pytest.mark.parametrize("nonfinite", [0.0, 0.01])
def test_code_levels_agree_bitwise(engine, dt, nonfinite):
    """Baseline SSE2, AVX2 and AVX-512 instantiations of the fold give the same bits."""
    rng = np.random.default_rng(5)
    a, e, _, _, dta, dte = make(rng, (61, 1003), dt, nonfinite)
    outs = []
    for level in (0, 1, 2):
        engine.configure(level=level)
        outs.append(acc_bits(engine.reduce(a, e, dim=1, dta=dta, dte=dte)))
        outs.append(acc_bits(engine.reduce(a.T, e.T, dim=0, dta=dta, dte=dte)))
    assert all(o == outs[0] or o == outs[1] for o in outs)
    assert outs[0::2] == [outs[0]] * 3 and outs[1::2] == [outs[1]] * 3


@pytest.mark.parametrize("dim", [-1, 0, 2])
@pytest.mark.parametrize("dt", ["float32", "float64"])
def test_thread_count_independent(engine, dim, dt):
    rng = np.random.default_rng(11)
    a, e, *_ = make(rng, (7, 33, 1000), dt, 0.001)
    engine.configure(seg_min=1024, par_min=0)  # many segments, threads even for small n
    res = [acc_bits(engine.reduce(a.transpose(2, 0, 1), e.transpose(2, 0, 1), dim=dim, nthreads=t))
           for t in (1, 2, 3, 8, 1)]
    assert all(r == res[0] for r in res)


def test_reduce_matches_oracle_for_raw_dtypes(engine):
    """bf16 / fp8 decoding (vgct_dtypes.h) against the independent decoders of oracle.py."""
    rng = np.random.default_rng(2)
    for dt in RAW:
        a, e, a64, e64, dta, dte = make(rng, (40, 97), dt, 0.01)
        acc, _ = engine.reduce(a, e, dta=dta, dte=dte)
        fin = np.isfinite(a64) & np.isfinite(e64)
        d = np.where(fin, np.abs(a64 - e64), -1).ravel()
        i = int(np.argmax(d))
        assert acc.n_finite == fin.sum()
        assert acc.n_nan_a == np.isnan(a64).sum() and acc.n_posinf_a == (a64 == np.inf).sum()
        assert acc.n_neginf_e == (e64 == -np.inf).sum()
        assert (acc.max_abs, acc.max_abs_i, acc.max_abs_a, acc.max_abs_e) == (d[i], i, a64.ravel()[i], e64.ravel()[i])
        assert math.sqrt(acc.s_dd) * acc.scale_d == pytest.approx(norm((a64 - e64)[fin]), rel=1e-12)


def test_tile_boundaries_and_odd_lengths(engine):
    """Lengths around TILE and NLANE multiples: tails of every size."""
    rng = np.random.default_rng(3)
    for n in (1, 7, 8, 9, 1023, 1024, 1025, 2047, 4096 + 5):
        a, e, a64, e64, *_ = make(rng, (n,), "float32")
        fast, slow = run_both(engine, a, e, -1, None, None)
        assert fast == slow
        acc, _ = engine.reduce(a, e)
        assert acc.n == n and math.sqrt(acc.s_ee) == pytest.approx(norm(e64), rel=1e-12)


@pytest.mark.parametrize("case", ["smallest_ratio", "mixed"])
@pytest.mark.parametrize("layout", ["contiguous", "reversed", "stepped"])
def test_float32_rel_candidates_at_the_extremes(engine, layout, case):
    """The float32 fold's max_rel candidate test (relc raised to 2^-400 after a zero
    best): equal pairs first (best 0), then about the smallest nonzero ratio two
    float32 values have (one ulp against |e| near float32 max), subnormal pairs,
    e == 0 pairs, a later real winner; every code level agrees with the definition bit
    for bit, and with numpy."""
    rng = np.random.default_rng(21)
    n = 5 * 1024 + 13
    e = rng.standard_normal(n).astype(np.float32)
    a = e.copy()                                   # equal pairs: max_rel 0 so far
    big = np.float32(3.0e38)
    e[1500:2600] = big
    a[1500:2600] = big
    a[1600] = np.nextafter(big, np.float32(0))     # ratio ~2^-24: the only nonzero one
    if case == "mixed":
        tiny = np.float32(1.4e-45)                 # float32's smallest subnormal
        e[1700:1800] = tiny
        a[1700:1800] = tiny                        # subnormal pairs, equal
        a[1750] = 0.0                              # ratio 1, |d| subnormal
        e[2000:2010] = 0.0                         # e == 0: never a max_rel candidate
        a[2000:2010] = 5.0
        a[3000] = e[3000] + np.float32(2.0) * np.abs(e[3000]) + np.float32(1.0)
    f = LAYOUTS[layout]
    a2, e2 = f(a.reshape(1, -1)), f(e.reshape(1, -1))
    outs = []
    for level in (0, 1, 2):
        fast, slow = run_both(engine, a2, e2, -1, None, None, level=level, seg_min=1024, par_min=0)
        assert fast == slow
        outs.append(fast)
    assert outs[1] == outs[0] and outs[2] == outs[0]
    engine.configure(seg_min=1024, par_min=0)
    acc, _ = engine.reduce(a2, e2)
    engine.configure()
    a64, e64 = a2.astype(np.float64).ravel(), e2.astype(np.float64).ravel()
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(e64 != 0, np.abs(a64 - e64) / np.abs(e64), -1.0)
    i = int(np.argmax(r))
    assert (acc.max_rel, acc.max_rel_i) == (r[i], i)


# ---- select -------------------------------------------------------------------------

@given(n=st.integers(1, 5000), nr=st.integers(1, 80), cap=st.sampled_from([0, 1, 7, 100, 4096]),
       kind=st.sampled_from(["normal", "ties", "tiny", "wide", "inf"]), seed=st.integers(0, 2 ** 31),
       nthreads=st.sampled_from([1, 2]))
def test_select_exact(cengine, n, nr, cap, kind, seed, nthreads):
    rng = np.random.default_rng(seed)
    if kind == "ties":
        a = rng.integers(0, 4, n).astype(np.float64)
        e = np.zeros(n)
    elif kind == "tiny":
        a = rng.standard_normal(n) * 1e-310
        e = rng.standard_normal(n) * 1e-310
    elif kind == "wide":
        a = rng.standard_normal(n) * 10.0 ** rng.integers(-300, 300, n)
        e = rng.standard_normal(n)
    elif kind == "inf":  # finite pairs whose difference overflows
        a = np.where(rng.random(n) < 0.3, 1.7e308, rng.standard_normal(n))
        e = np.where(rng.random(n) < 0.3, -1.7e308, rng.standard_normal(n))
        a[rng.random(n) < 0.1] = np.nan
    else:
        a = rng.standard_normal(n).astype(np.float32)
        e = (a + rng.standard_normal(n).astype(np.float32) * 1e-3)
    with np.errstate(over="ignore", invalid="ignore"):
        keys = np.abs(a.astype(np.float64) - e.astype(np.float64))
    keys = np.sort(keys[np.isfinite(a) & np.isfinite(e)])
    if keys.size == 0:
        return
    ranks = rng.integers(0, keys.size, nr)
    cengine.configure(select_cap=cap, par_min=0, seg_min=1024)
    try:
        got = cengine.select(a, e, ranks, nthreads=nthreads)
    finally:
        cengine.configure()
    assert got.tobytes() == keys[ranks].tobytes()


def _msel_sample_positions(n):
    """The positions of the evenly spaced sample a two-pivot round of the in-memory multi-select
    draws from n keys (csrc/cpu_select.inc msel_pivots: s = 256 keys from 2048 keys on, else 128,
    key i at (2i + 1) n / 2s)."""
    s = 256 if n >= 2048 else 128
    return (2 * np.arange(s) + 1) * n // (2 * s)


def _msel_keys(layout, n, rng):
    """float64 differences d (a = d, e = 0: |a - e| = |d| exactly) laid out to mislead the
    two-pivot rounds' evenly spaced sample, or to tie."""
    d = np.abs(rng.standard_normal(n)) * 1e-3
    if layout == "ascending":
        d = np.sort(d)
    elif layout == "descending":
        d = np.sort(d)[::-1].copy()
    elif layout == "sampled_high":  # every sampled key larger than all others
        d[_msel_sample_positions(n)] = 1.0 + rng.random(_msel_sample_positions(n).size)
    elif layout == "sampled_low":  # every sampled key smaller than all others, distinct
        d[_msel_sample_positions(n)] = 1e-9 * rng.random(_msel_sample_positions(n).size)
    elif layout == "sampled_zero":  # every sampled key 0: its pivots tie
        d[_msel_sample_positions(n)] = 0.0
    elif layout == "sampled_at_p99":  # the sample all at one value near the p99: its pivots tie
        d[_msel_sample_positions(n)] = np.quantile(d, 0.99)
    elif layout == "two_values":
        d = np.where(rng.random(n) < 0.985, 1e-3, 2e-3)
    elif layout == "all_equal":
        d = np.full(n, 1e-3)
    elif layout == "organ_pipe":
        h = np.sort(d[: n // 2])
        d = np.concatenate([h, np.sort(d[n // 2:])[::-1]])
    return d


@pytest.mark.parametrize("n", [1024, 2047, 2048, 8191, 60_000, (1 << 20)])
@pytest.mark.parametrize("layout", ["random", "ascending", "descending", "sampled_high", "sampled_low",
                                    "sampled_zero", "sampled_at_p99", "two_values", "all_equal", "organ_pipe"])
def test_select_in_memory_two_pivot_rounds(engine, layout, n):
    """The in-memory multi-select's two-pivot rounds (csrc/cpu_select.inc u64_mselect with
    msel_pivots, from 1024 keys on, ranks close together): pivots from an evenly spaced sample,
    which these layouts make sorted, reversed, all above or below every other key, or tied, and
    ties throughout -- every rank set compare() and the windows ask (a quantile's two ranks, the
    extremes, a dense run around the p99, one rank) equals the sorted float64 oracle.  One
    gathering pass (n_finite given: every key fits the buffer), then the selection in memory."""
    rng = np.random.default_rng(n + len(layout))
    d = _msel_keys(layout, n, rng)
    e = np.zeros(n)
    keys = np.sort(d)
    p99 = int(0.99 * (n - 1))
    rank_sets = [[p99, p99 + 1], [0, 1], [n - 2, n - 1], [n // 2], [int(0.01 * (n - 1)), int(0.01 * (n - 1)) + 1],
                 list(range(p99 - 40, min(p99 + 41, n))), [int(0.5 * (n - 1)), p99, int(0.999 * (n - 1))]]
    for ranks in rank_sets:
        got = engine.select(d, e, ranks, expect_finite=n)
        assert engine.last_select_passes == 1
        assert got.tobytes() == keys[ranks].tobytes(), (layout, n, ranks[:3])


@given(n=st.integers(1024, 20_000), nv=st.integers(1, 40), q=st.floats(0.0, 1.0), span=st.integers(1, 60),
       seed=st.integers(0, 2 ** 31))
def test_select_in_memory_close_ranks_property(cengine, n, nv, q, span, seed):
    """Ranks close together (a run of `span` around the quantile q) among n keys of nv distinct
    values, or of noise (nv = 40): the in-memory multi-select's two-pivot rounds are exact."""
    rng = np.random.default_rng(seed)
    d = rng.standard_normal(n) if nv == 40 else rng.standard_normal(nv)[rng.integers(0, nv, n)]
    e = np.zeros(n)
    keys = np.sort(np.abs(d))
    at = int(q * (n - 1))
    ranks = sorted({min(max(at + k, 0), n - 1) for k in range(-(span // 2), span - span // 2)})
    got = cengine.select(d, e, ranks, expect_finite=n)
    assert got.tobytes() == keys[ranks].tobytes()


def test_presel_small_sample_reads_its_chunks(engine):
    """Below 2^18 pairs the windows' sample is read in 32-36 evenly spaced chunks
    (_presel_sampled mirrors csrc/cpu_select.inc): pairs unequal only outside them look like an
    identical pair to the sample -- no window (left to the record; the record does not answer,
    the selection's passes do, exactly) -- while the same differences on the sampled pairs
    alone give windows.  Planted: a sample of whole tiles, or chunks elsewhere, fails."""
    for n in (4096, 6000, 8191, 1 << 13, (1 << 16) + 1, (1 << 18) - 1):
        rng = np.random.default_rng(n)
        sampled = _presel_sampled(n)
        assert 1024 <= sampled.sum() <= max(n // 16, 1024), n
        e = rng.standard_normal(n).astype(np.float32)
        for where, windows in ((~sampled, False), (sampled, True)):
            a = e.copy()
            a[where] += np.float32(0.5) + rng.random(int(where.sum())).astype(np.float32)
            ps = engine.presel(a, e, [0.99])
            engine.presel_free(ps)
            assert bool(ps) == windows, (n, windows)
            keys = _sorted_finite_absdiff(a, e)
            assert vgct_ext.compare(a, e).quantiles[0.99] == float(np.quantile(keys, 0.99)), n


def test_select_passes_and_bounded_buffer(engine):
    """A small cap forces more histogram levels; the default gathers after one."""
    rng = np.random.default_rng(9)
    a = rng.standard_normal(300_000).astype(np.float32)
    e = a + rng.standard_normal(a.size).astype(np.float32) * 1e-3
    keys = np.sort(np.abs(a.astype(np.float64) - e))
    ranks = [0, 1, 150_000, 296_999, 297_000, 299_999]
    passes = {}
    for cap in (0, 64, 1):
        engine.configure(select_cap=cap)
        assert engine.select(a, e, ranks).tolist() == keys[ranks].tolist()
        passes[cap] = engine.last_select_passes
    # default: the sample's ranges hold every rank -> one pass; tiny caps: radix passes
    assert passes[0] == 1 and passes[1] >= passes[64] > passes[0]


@pytest.mark.parametrize("kind", ["normal", "ties", "adversarial", "wide", "nan"])
def test_select_sampled_first_pass_exact(engine, kind):
    """n >= 2^18: the first pass gathers sampled key ranges; exact whether the sample
    predicts well (one pass) or not (the radix passes take over)."""
    rng = np.random.default_rng(12)
    n = 1 << 19
    e = rng.standard_normal(n)
    a = e + rng.standard_normal(n) * 1e-3
    if kind == "ties":
        a = np.round(a * 4) / 4
        e = np.zeros(n)
    elif kind == "adversarial":  # the sampled tiles (every 32nd of 512 pairs) are outliers
        idx = (np.arange(n) // 512) % 32 == 0
        a[idx] += 1000.0
    elif kind == "wide":
        a = e * 10.0 ** rng.integers(-200, 200, n)
    elif kind == "nan":
        a[rng.random(n) < 0.3] = np.nan
    fin = np.isfinite(a) & np.isfinite(e)
    keys = np.sort(np.abs(a - e)[fin])
    m = keys.size
    ranks = [0, 1, m // 2, (99 * (m - 1)) // 100, (99 * (m - 1)) // 100 + 1, m - 2, m - 1,
             int(0.999 * (m - 1)), 7, 7]
    for nt in (1, 2):
        got = engine.select(a, e, ranks, nthreads=nt)
        assert got.tobytes() == keys[ranks].tobytes(), kind
    if kind == "adversarial":
        assert engine.last_select_passes >= 2  # the prediction failed for some rank


# ---- key windows read in the reduction's pass (vgct_cpu_presel) ---------------------

def _bf16(x):
    """float32 -> bfloat16 (round to nearest even) -> float32, in NumPy."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16 << 16
    return b.astype(np.uint32).view(np.float32)


def _window_data(kind, n, rng):
    e = rng.standard_normal(n).astype(np.float32)
    noise = rng.standard_normal(n).astype(np.float32) * np.float32(1e-3)
    if kind == "bf16_vs_fp32":
        return _bf16(e + noise), e
    if kind == "bf16_vs_bf16":  # many ties: the p99 key holds ~3% of the pairs
        return _bf16(e + noise), _bf16(e)
    if kind == "fp32":
        return e + noise, e
    if kind == "identical":  # every key 0
        return e.copy(), e
    if kind == "cauchy":
        return e + rng.standard_cauchy(n).astype(np.float32) * np.float32(1e-3), e
    if kind == "outliers":
        a = e + noise
        a[rng.integers(0, n, 16)] += np.float32(1e4)
        return a, e
    if kind == "offset":  # ~2000 distinct keys
        return e + np.float32(0.5), e
    if kind == "nonfinite":
        a = (e + noise).astype(np.float64)
        a[rng.random(n) < 0.05] = np.nan
        a[rng.random(n) < 0.01] = np.inf
        return a, e.astype(np.float64)
    if kind == "subnormal":
        return rng.standard_normal(n) * 1e-310, rng.standard_normal(n) * 1e-310
    if kind == "wide":  # huge key range
        return e.astype(np.float64) * 10.0 ** rng.integers(-250, 250, n), e.astype(np.float64)
    if kind in ("caching", "caching3"):  # a caching feature: ~1.1% / 3% of the bf16 outputs
        # recomputed, the rest identical -- the window's sample holds recurring keys (0, bf16 steps)
        e16 = _bf16(e)
        a = e16.copy()
        k = rng.random(n) < (0.011 if kind == "caching" else 0.03)
        a[k] = _bf16(e[k] + np.float32(1e-2) * rng.standard_normal(int(k.sum())).astype(np.float32))
        return a, e16
    if kind == "three_values":  # the window's pivots hold whole blocks of equal keys
        a = np.zeros(n)
        a[: n // 2] = 1.0
        a[n // 2: n - n // 200] = 2.0
        a[n - n // 200:] = 3.0
        return rng.permutation(a), np.zeros(n)
    raise AssertionError(kind)


WINDOW_KINDS = ["bf16_vs_fp32", "bf16_vs_bf16", "fp32", "identical", "cauchy", "outliers", "offset",
                "nonfinite", "subnormal", "wide", "three_values", "caching", "caching3"]


def _sorted_finite_absdiff(a, e):
    """The oracle: |a - e| in float64 over the finite pairs, sorted (order statistic r at [r])."""
    with np.errstate(over="ignore", invalid="ignore"):
        d = np.abs(a.astype(np.float64) - e.astype(np.float64))
    return np.sort(d[np.isfinite(a) & np.isfinite(e)])


def _windows_select(engine, a, e, qs, ranks, nthreads):
    """presel -> reduce (fills the windows) -> select, as compare() runs them."""
    ps = engine.presel(a, e, qs)
    try:
        acc, _ = engine.reduce(a, e, nthreads=nthreads, presel=ps)
        got = engine.select(a, e, ranks, nthreads=nthreads, expect_finite=acc.n_finite, presel=ps)
    finally:
        engine.presel_free(ps)
    return ps, acc, got


@pytest.mark.parametrize("qs", [[0.99], [0.5, 0.99, 0.999]], ids=["p99", "three"])
@pytest.mark.parametrize("kind", WINDOW_KINDS)
def test_select_windows_exact_every_rank_near_the_quantiles(engine, kind, qs):
    """Every rank around the quantiles -- so every position of each window: its lower edge,
    its pivot blocks (ties), its stored keys, its upper edge and beyond -- equals the float64
    NumPy order statistic; and the usual quantile ranks take no selection pass at all.  One
    quantile alone (one window: the fused loop of a window without ties) and three."""
    rng = np.random.default_rng(21)
    n = (1 << 18) + 12345
    a, e = _window_data(kind, n, rng)
    keys = _sorted_finite_absdiff(a, e)
    m = keys.size
    w = int(0.03 * m)  # wider than every window (sample margins: < 2.7% of the ranks at this n)
    dense = [r for q in qs for r in range(int(q * (m - 1)) - w, int(q * (m - 1)) + w) if 0 <= r < m]
    ranks = sorted(set(dense)) + [0, m - 1]
    ps, acc, got = _windows_select(engine, a, e, qs, ranks, 2)
    # n >= VGCT_PRESEL_MIN_N: windows were predicted -- except where the sample says the
    # reduction's zero count (vgct_rank_known; test_quantiles.py) will answer every window's ranks
    # (an identical pair; the caching shapes near 1% unequal: test_presel_leaves_to_the_record...):
    # no window, the selection's own passes here, as exact
    assert bool(ps) == (kind != "identical" and (kind != "caching" or len(qs) > 1)), kind
    assert acc.n_finite == m
    assert got.tobytes() == keys[ranks].tobytes(), kind
    # the ranks compare() asks for: finished inside the windows, no pass, any thread count
    want = [r for q in qs for r in (int(q * (m - 1)), min(int(q * (m - 1)) + 1, m - 1))]
    for nt in (1, 2):
        _, _, got = _windows_select(engine, a, e, qs, want, nt)
        assert got.tobytes() == keys[want].tobytes()
        if ps:
            assert engine.last_select_passes == 0, kind


@pytest.mark.parametrize("n", [(1 << 12) - 1, 1 << 12, 6000, (1 << 13) - 1, 1 << 13, (1 << 14) + 5,
                               (1 << 16) + 1, (1 << 18) - 1])
@pytest.mark.parametrize("kind", ["fp32", "bf16_vs_bf16", "cauchy", "identical", "clustered"])
def test_select_windows_from_4096_pairs(engine, kind, n):
    """Windows from VGCT_PRESEL_MIN_N = 2^12 pairs on, from a sample of n/16 pairs (at least 1024)
    read in 32-36 evenly spaced chunks below 2^18: the p50's and p99's ranks come off the windows with
    no selection pass; none below 4096 pairs; an identical pair none (the sample's zeros: the
    record answers).  An error in one run of 4% of the pairs (off by 1e-2) is sampled in
    proportion, so its windows hold the ranks too (two whole tiles of 512, the sample's shape
    before, held the run eight times over at 8192 pairs, or missed it, and left the ranks to the
    radix passes) -- every rank, and compare()'s quantiles, the float64 oracle's."""
    rng = np.random.default_rng(23)
    if kind == "clustered":
        a, e = _window_data("fp32", n, rng)
        lo, k = n // 64, n // 25
        a[lo:lo + k] += rng.standard_normal(k).astype(np.float32) * np.float32(1e-2)
    else:
        a, e = _window_data(kind, n, rng)
    keys = _sorted_finite_absdiff(a, e)
    m = keys.size
    qs = [0.5, 0.99]
    want = sorted({r for q in qs for r in (int(q * (m - 1)), min(int(q * (m - 1)) + 1, m - 1))})
    ps, acc, got = _windows_select(engine, a, e, qs, want + [0, m - 1], 2)
    assert acc.n_finite == m
    assert got.tobytes() == keys[want + [0, m - 1]].tobytes()
    assert bool(ps) == (n >= 1 << 12 and kind != "identical"), (kind, n)
    if ps:
        _, _, got = _windows_select(engine, a, e, qs, want, 1)
        assert got.tobytes() == keys[want].tobytes()
        assert engine.last_select_passes == 0, (kind, n)
    assert vgct_ext.compare(a, e, quantiles=qs).quantiles == {q: float(np.quantile(keys, q)) for q in qs}


@pytest.mark.parametrize("level", [0, 1, 2], ids=["sse2", "avx2", "avx512"])
@pytest.mark.parametrize("kind", ["fp32", "bf16_vs_fp32", "cauchy", "offset", "wide", "subnormal",
                                  "bf16_vs_bf16", "caching", "caching3", "three_values"])
def test_select_windows_fused_loop_every_code_level(engine, kind, level):
    """The fused window loop (one window: ps_fused, which returns the keys inside packed; pivots
    lo and hi only, or tie values too -- a caching feature's sparse differences; every pivot count:
    the next test) in its portable, AVX2 and AVX-512 forms: every rank around the p99 --
    below, at and inside the window, at its upper edge and past it -- equals the float64
    NumPy order statistic, on float32 tiles and float64 ones ("wide"), with a partial last
    tile (n % 512 != 0, n % 8 != 0).  A window counting one key too many or too few, or one
    inside key lost or stored twice, moves some rank by one and fails here."""
    rng = np.random.default_rng(37)
    a, e = _window_data(kind, (1 << 18) + 4099, rng)
    check_ranks_around_p99(engine, a, e, level, want_windows=True)


def _tie_pivot_data(k, share, seed, n=(1 << 18) + 4099):
    """float32 noise pairs (|d| ~ 1e-3 |N(0, 1)|) with k tie values spread around their p99 (e = 0,
    a = v: |d| = v exactly), each on a `share` of the pairs: the p99 window's sample holds up to k
    recurring keys inside it, which become its pivots."""
    rng = np.random.default_rng(seed)
    e = rng.standard_normal(n).astype(np.float32)
    a = e + rng.standard_normal(n).astype(np.float32) * np.float32(1e-3)
    vals = (np.float32(2.576e-3) * (1.0 + 0.002 * (np.arange(k) - (k - 1) / 2))).astype(np.float32)
    idx = rng.permutation(n)[: k * int(share * n)].reshape(k, -1)
    for i in range(k):
        a[idx[i]] = vals[i]
        e[idx[i]] = 0.0
    return a, e


# (k tie values, share of the pairs each, seed): windows of 3..8 pivots (lo, ties, hi) between them
TIE_PIVOT_CASES = [(1, 0.002, 0), (6, 0.0015, 1), (6, 0.0015, 0), (7, 0.001, 1), (10, 0.001, 0),
                   (10, 0.001, 2)]


@pytest.mark.parametrize("level", [0, 1, 2], ids=["sse2", "avx2", "avx512"])
def test_select_windows_fused_pivots_every_count(engine, level):
    """The fused window loop with tie pivots (ps_fused: the AVX-512 form has one function per
    pivot count) for every pivot count from 3 to 8 (1 and 2: the test above), at every code
    level: each window's ranks around the p99 equal the float64 NumPy order statistic, and the
    loop did count the tiles (test hooks: window 0's pivot count, the tiles it counted)."""
    seen = set()
    for k, share, seed in TIE_PIVOT_CASES:
        a, e = _tie_pivot_data(k, share, seed)
        engine.fused_tiles(reset=True)
        check_ranks_around_p99(engine, a, e, level, want_windows=True)
        npv = engine.last_npv
        assert npv >= 3 and engine.fused_tiles() > 0, (k, share, seed, npv)
        seen.add(npv)
    assert seen == set(range(3, 9)), seen


def check_ranks_around_p99(engine, a, e, level, want_windows):
    """At CPU code level `level`: compare()'s p99 window (presel -> reduce -> select) gives,
    for every rank within 4% of the p99's and a few far ones (the extremes, the median),
    exactly the float64 NumPy order statistic; want_windows: a window was predicted."""
    keys = _sorted_finite_absdiff(a, e)
    m = keys.size
    w = int(0.04 * m)
    at = int(0.99 * (m - 1))
    far = {r for r in (0, 1, m // 2, m - 2, m - 1) if 0 <= r < m}
    ranks = sorted({r for r in range(at - w, at + w) if 0 <= r < m} | far)
    engine.configure(level=level)  # before presel_new: it picks the fused loop's code level
    ps, acc, got = _windows_select(engine, a, e, [0.99], ranks, 2)
    assert acc.n_finite == m
    assert bool(ps) or not want_windows
    assert got.tobytes() == keys[ranks].tobytes(), level


@given(n=st.integers(1100, 6000), nv=st.integers(1, 12), tie=st.floats(0.0, 0.9),
       qs=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=5), seed=st.integers(0, 2 ** 31),
       nthreads=st.sampled_from([1, 2]))
def test_select_windows_property(cengine, n, nv, tie, qs, seed, nthreads):
    """Windows on small inputs (test hook: from n = 1024 on): few distinct values (window
    edges and tie values on equal keys), a share `tie` of one value, NaN pairs, any
    quantiles; every rank of the tensor equals the sorted float64 oracle."""
    rng = np.random.default_rng(seed)
    vals = rng.standard_normal(nv) * 10.0 ** rng.integers(-5, 5, nv)
    a = vals[rng.integers(0, nv, n)]
    a[rng.random(n) < tie] = vals[0]
    e = np.zeros(n)
    a[rng.random(n) < 0.02] = np.nan
    keys = np.sort(np.abs(a - e)[np.isfinite(a)])
    if keys.size == 0:
        return
    ranks = list(range(keys.size))
    cengine.configure(presel_min=1024, par_min=0, seg_min=1024)
    try:
        ps = cengine.presel(a, e, qs)
        acc, _ = cengine.reduce(a, e, nthreads=nthreads, presel=ps)
        got = cengine.select(a, e, ranks, nthreads=nthreads, expect_finite=acc.n_finite, presel=ps)
        cengine.presel_free(ps)
    finally:
        cengine.configure()
    assert got.tobytes() == keys.tobytes()


def test_select_windows_missed_fall_back_exactly(engine):
    """Windows predicted for other quantiles (or from a sample that misleads) leave the ranks
    to the radix passes: still exact."""
    rng = np.random.default_rng(5)
    n = 1 << 19
    a, e = _window_data("fp32", n, rng)
    idx = (np.arange(n) // 512) % 8 == 0  # the sampled tiles are outliers
    a = a.astype(np.float64)
    a[idx] += 1000.0
    keys = np.sort(np.abs(a - e))
    ranks = [0, n // 3, int(0.99 * (n - 1)), n - 1]
    ps, _, got = _windows_select(engine, a, e, [0.25], ranks, 2)
    assert ps
    assert got.tobytes() == keys[ranks].tobytes()
    assert engine.last_select_passes >= 1


@pytest.mark.parametrize("n", [4096, 6000, (1 << 14) - 1])
def test_presel_windows_with_a_few_non_finite_pairs_in_a_small_sample(engine, n):
    """Below 2^14 pairs the windows' sample is 1024 pairs: a few NaN/Inf pairs in it (an overflowing
    element, a NaN in a broken output) still leave enough finite ones to predict from (at least 512),
    so the windows stay on and answer the p99 with no selection pass.  Planted: the old bar of 1024
    finite sampled pairs (no window, the gathering pass: 1 pass)."""
    rng = np.random.default_rng(n + 7)
    e = rng.standard_normal(n).astype(np.float32)
    a = e + rng.standard_normal(n).astype(np.float32) * np.float32(1e-3)
    sampled = np.flatnonzero(_presel_sampled(n))
    a[sampled[[3, 500, 900]]] = [np.nan, np.inf, -np.inf]
    keys = _sorted_finite_absdiff(a, e)
    m = keys.size
    want = [int(0.99 * (m - 1)), int(0.99 * (m - 1)) + 1]
    ps, acc, got = _windows_select(engine, a, e, [0.99], want, 1)
    assert ps and acc.n_finite == m == n - 3
    assert got.tobytes() == keys[want].tobytes()
    assert engine.last_select_passes == 0
    assert vgct_ext.compare(a, e).quantiles[0.99] == float(np.quantile(keys, 0.99))


def _presel_sampled(n):
    """Boolean mask of the elements vgct_cpu_presel_new's sample reads for a flat contiguous pair
    of n elements (csrc/cpu_select.inc): K = n/256 keys within [min(max(n/16, 1024), 2^14), 2^18],
    ntiles = K / 512; at least 32 tiles: tiles of 512 at b = 0, step, 2 step, ... (step =
    ceil(n / 512) // ntiles), ntiles + 1 of them; fewer: K // L chunks (32-36) of L = (K / 32) & ~7 pairs,
    chunk k at k n / (K / L)."""
    tile, chunks = 512, 32
    want = min(max(n // 256, min(max(n // 16, 1024), 1 << 14)), 1 << 18)
    ntiles, nblk = want // tile, -(-n // tile)
    mask = np.zeros(n, dtype=bool)
    if ntiles < chunks:
        clen = (want // chunks) & ~7
        nch = want // clen
        for k in range(nch):
            mask[k * n // nch:k * n // nch + clen] = True
        return mask
    step = max(nblk // ntiles, 1)
    for k, b in enumerate(range(0, nblk, step)):
        if k > ntiles:
            break
        mask[b * tile:(b + 1) * tile] = True
    return mask


def _unequal_at(e, idx, rng):
    """A copy of e with the pairs at idx made unequal by at least a quarter of 1 + |e| (float32)."""
    a = e.copy()
    a[idx] += ((0.25 + rng.random(idx.size)) * (1.0 + np.abs(e[idx]))).astype(np.float32)
    return a


@pytest.mark.parametrize("share,qs,nan,windows", [
    (0.004, [0.99], 0.0, False), (0.009, [0.99], 0.0, False), (0.012, [0.99], 0.0, True),
    (0.02, [0.99], 0.0, True),
    (0.0125, [0.985, 0.99], 0.0, True),  # one window: its ranks include the p99's, above the zeros
    (0.005, [0.99], 0.01, True),  # 1% NaN: n_unequal counts them, the zeros are 98.5% of the finite
    # the sample's window is zeros alone (hi == 0: 0.1% unequal) -- with 1.5% NaN the record's
    # zero count n_finite - n_unequal is ~96.9% of n, below the p99's rank (~97.5%): a window
    # (left to the record, this fails: the rank goes to the selection's own passes, still exact);
    # with 0.3% NaN it is ~99.3%, above the rank (~98.7%): the record answers, no window
    (0.001, [0.99], 0.015, True), (0.001, [0.99], 0.003, False),
])
def test_presel_leaves_to_the_record_what_its_zero_count_answers(engine, share, qs, nan, windows):
    """A window whose sample keys reach the key 0 is left to the reduction's record when the
    sample's zero count puts all its ranks among the zeros (a caching feature's output: `share`
    of the pairs unequal, the rest identical; csrc/cpu_select.inc, the GPU's win_record_answers
    rule): no window below 1% unequal, a window counted (lo = 0) above it -- also where the p98.5
    and the p99 share one window (the rule must weigh the larger), and where NaN pairs, which the
    record's zero count n_finite - n_unequal subtracts, are ~1% (the sample's non-finite pairs
    are taken as unequal) -- also when the sample's window is the key 0 alone.  compare()'s
    quantiles are the oracle's either way."""
    rng = np.random.default_rng(91)
    n = (1 << 20) + 3
    e = rng.standard_normal(n).astype(np.float32)
    a = _unequal_at(e, rng.choice(n, int(share * n), replace=False), rng)
    if nan:
        a[rng.random(n) < nan] = np.nan
    ps = engine.presel(a, e, qs)
    engine.presel_free(ps)
    assert bool(ps) == windows
    keys = _sorted_finite_absdiff(a, e)
    got = vgct_ext.compare(a, e, quantiles=qs).quantiles
    for q in qs:
        assert got[q] == float(np.quantile(keys, q)), q


@pytest.mark.parametrize("share,nan", [(0.0, 0.005), (0.001, 0.003)])
def test_presel_zero_window_with_non_finite_pairs_still_left_to_the_record(engine, share, nan):
    """A sample whose window is the key 0 alone (an identical pair, or 0.1% unequal) with a few
    NaN pairs (0.3-0.5%, more than the window's margin of ~0.17% of a 2^18-key sample): the
    record's zero count (~99.5% / ~99.3% of n) still covers the p99's rank (~98.5-98.7%), so no
    window -- the estimate must count the sample's zeros above the window too (counting only up
    to its upper end, ~q + margin, less the NaN pairs, built a window: 45% slower, exact)."""
    rng = np.random.default_rng(93)
    n = 1 << 24
    e = rng.standard_normal(n).astype(np.float32)
    a = _unequal_at(e, rng.choice(n, int(share * n), replace=False), rng) if share else e.copy()
    a[rng.random(n) < nan] = np.nan
    ps = engine.presel(a, e, [0.99])
    engine.presel_free(ps)
    assert not ps
    keys = _sorted_finite_absdiff(a, e)
    assert vgct_ext.compare(a, e).quantiles[0.99] == float(np.quantile(keys, 0.99)) == 0.0


def test_presel_wrong_guess_is_still_exact(engine):
    """Planted: the sample reads 0.9% of its pairs unequal (so no window: the record will answer,
    it guesses) while exactly n - hi pairs are unequal overall (hi: the p99's upper rank, now the
    smallest nonzero key, which the record cannot answer).  The rank takes the selection's own
    passes: compare()'s p99 == the oracle's (> 0); a record that answered it 0 fails."""
    rng = np.random.default_rng(92)
    n = (1 << 20) + 3
    hi = math.floor((n - 1) * 0.99) + 1
    sampled = _presel_sampled(n)
    s_idx, u_idx = np.flatnonzero(sampled), np.flatnonzero(~sampled)
    k_s = (9 * s_idx.size) // 1000
    pick = np.concatenate([rng.choice(s_idx, k_s, replace=False),
                           rng.choice(u_idx, (n - hi) - k_s, replace=False)])
    e = rng.standard_normal(n).astype(np.float32)
    a = _unequal_at(e, pick, rng)
    ps = engine.presel(a, e, [0.99])
    engine.presel_free(ps)
    assert not ps  # the guess: answered by the record
    keys = _sorted_finite_absdiff(a, e)
    r = vgct_ext.compare(a, e)
    assert r.n_unequal == n - hi and keys[hi] > 0.0 and keys[hi - 1] == 0.0
    assert r.quantiles[0.99] == float(np.quantile(keys, 0.99)) > 0.0


def test_select_windows_torn_input_detected(engine):
    """A reduction count that disagrees with the windows' key count is an input change."""
    rng = np.random.default_rng(6)
    a, e = _window_data("fp32", 1 << 18, rng)
    ps = engine.presel(a, e, [0.99])
    try:
        acc, _ = engine.reduce(a, e, presel=ps)
        with pytest.raises(ValueError, match="input changed during compare"):
            engine.select(a, e, [10], expect_finite=acc.n_finite - 1, presel=ps)
    finally:
        engine.presel_free(ps)


def test_select_windows_small_inputs_and_no_windows(engine):
    """No windows below VGCT_PRESEL_MIN_N (2^12) or without quantiles; a known n_finite that
    fits the candidate buffer is finished by ONE gathering pass."""
    rng = np.random.default_rng(7)
    a, e = _window_data("fp32", 1000, rng)
    assert not engine.presel(a, e, [0.99])
    assert not engine.presel(*_window_data("fp32", 1 << 18, rng), [])
    keys = np.sort(np.abs(a.astype(np.float64) - e))
    got = engine.select(a, e, [0, 989, 990, 999], expect_finite=1000)
    assert got.tobytes() == keys[[0, 989, 990, 999]].tobytes()
    assert engine.last_select_passes == 1


def test_select_errors(engine):
    a = np.array([1.0, np.nan, 3.0])
    e = np.array([0.0, 0.0, np.inf])
    assert engine.select(a, e, [0]).tolist() == [1.0]
    with pytest.raises(ValueError, match="out of range"):
        engine.select(a, e, [1])  # one finite pair
    with pytest.raises(ValueError, match="negative"):
        engine.select(a, e, [-1])
    assert engine.select(a, e, []).tolist() == []


# ---- fingerprint ------------------------------------------------------------------------

M64 = (1 << 64) - 1


def _mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def fingerprint_py(x: np.ndarray, dtype_code: int) -> int:
    """The definition of vgct_stats.h, in Python (row-major logical order, raw bits)."""
    raw = np.ascontiguousarray(x).view(np.dtype(f"u{x.itemsize}")).ravel()
    s = 0
    for i, b in enumerate(raw.tolist()):
        s = (s + _mix64(b ^ _mix64((i + 0x9E3779B97F4A7C15) & M64))) & M64
    h = _mix64(s ^ ((0x5851F42D4C957F2D * (dtype_code + 1)) & M64))
    h = _mix64(h ^ x.ndim)
    for k in x.shape:
        h = _mix64(h ^ k)
    return h


def test_fingerprint_definition_layouts_threads(engine):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((37, 29)).astype(np.float32)
    x[0, 0] = -0.0
    want = fingerprint_py(x, _cengine.FLOAT32)
    for v in (x, np.asfortranarray(x), x.T.copy().T, x[::-1].copy()[::-1]):
        assert engine.fingerprint(v) == want
    y = x.copy()
    y[0, 0] = 0.0
    assert engine.fingerprint(y) != want  # bits, not values
    big = rng.standard_normal((3, 400_000)).astype(np.float16)
    engine.configure(seg_min=1024, par_min=0)
    assert len({engine.fingerprint(big.T.copy().T, nthreads=t) for t in (1, 2, 5)}) == 1
    assert engine.fingerprint(big) == engine.fingerprint(np.asfortranarray(big))


def test_max_rel_tie_whose_product_rounds_up(engine):
    """fl(fl(d/e) * e) > d for (7.007, 7.0): a tie of max_rel found later in memory
    order at a LOWER flat index must still win (the 2^-40 margin of the threshold)."""
    x = np.ones((1024, 2), np.float64)
    y = np.ones((1024, 2), np.float64)
    x[0, 1], y[0, 1] = 7.007, 7.0        # logical (1, 0) of the transposed view: index 1024
    x[1023, 0], y[1023, 0] = 7.007, 7.0  # logical (0, 1023): index 1023, visited later
    d = abs(7.007 - 7.0)
    assert (d / 7.0) * 7.0 > d
    for force_slow in (0, 1):
        engine.configure(force_slow=force_slow)
        acc, _ = engine.reduce(x.T, y.T)
        assert acc.max_rel_i == 1023 and acc.max_abs_i == 1023


def test_scaled_norms_at_the_float64_limits(engine):
    """|x| >= 2^1023 (scales capped at 2^1023) and subnormals, through the engine."""
    a = np.array([1.7e308, -1.2e308, 1.0, 5e-324])
    e = np.array([1.0e308, 0.0, -1.0, 0.0])
    acc, _ = engine.reduce(a, e)
    assert math.sqrt(acc.s_aa) * acc.scale_a == pytest.approx(norm(a), rel=1e-15)
    assert math.sqrt(acc.s_ee) * acc.scale_e == pytest.approx(norm(e), rel=1e-15)
    assert math.sqrt(acc.s_dd) * acc.scale_d == pytest.approx(norm(a - e), rel=1e-15)
    t = np.array([3e-320, -1e-321, 5e-324])
    acc, _ = engine.reduce(t, np.zeros(3))
    assert math.sqrt(acc.s_aa) * acc.scale_a == pytest.approx(norm(t), rel=1e-15)


def _is_pow2(x: float) -> bool:
    return x > 0 and math.frexp(x)[0] == 0.5


@pytest.mark.parametrize("force_slow", [0, 1])
def test_per_family_scales(engine, force_slow):
    """One power-of-two scale per sum family (vgct_stats.h): scale_a >= max|a|, scale_e >= max|e|,
    scale_d >= max|a-e| each, so a ~ 1e-200 against e ~ 1 keeps its norm (one shared scale
    flushed it to 0), and an overflowing float64 difference of finite values is scaled, not Inf."""
    engine.configure(force_slow=force_slow)
    rng = np.random.default_rng(11)
    e = rng.standard_normal(3000)
    a = 1e-200 * rng.standard_normal(3000)
    acc, sl = engine.reduce(a.reshape(3, 1000), e.reshape(3, 1000), dim=0)
    for x, sc in ((a, acc.scale_a), (e, acc.scale_e), (a - e, acc.scale_d)):
        assert _is_pow2(sc) and np.max(np.abs(x)) < sc <= 2 * np.max(np.abs(x))
    assert math.sqrt(acc.s_aa) * acc.scale_a == pytest.approx(norm(a), rel=1e-13)
    assert math.sqrt(acc.s_ee) * acc.scale_e == pytest.approx(norm(e), rel=1e-13)
    assert math.sqrt(acc.s_dd) * acc.scale_d == pytest.approx(norm(a - e), rel=1e-13)
    for j in range(3):
        assert sl[j].scale_e == pytest.approx(2.0 ** math.frexp(np.max(np.abs(e[j * 1000:(j + 1) * 1000])))[1], rel=0)
        assert math.sqrt(sl[j].s_ee) * sl[j].scale_e == pytest.approx(norm(e[j * 1000:(j + 1) * 1000]), rel=1e-13)
    # |a|, |e| near DBL_MAX with opposite signs: a - e overflows in float64; scale_d is 2^1023
    big = np.array([1.7e308, -1.6e308, 2.0, 5e-324] * 300)
    acc, _ = engine.reduce(big, -big)
    assert acc.scale_d == 2.0 ** 1023 and acc.max_abs == math.inf
    assert math.isfinite(acc.s_dd) and math.isfinite(acc.s_d)
    # ||a - e|| = 2 ||big||: the same sum as s_aa at scale 2^1023 / 2
    assert acc.scale_a == 2.0 ** 1023
    assert math.sqrt(acc.s_dd) == pytest.approx(2 * math.sqrt(acc.s_aa), rel=1e-14)
    assert acc.s_d == pytest.approx(2 * np.sum(np.ldexp(big, -1023)), rel=1e-14)


# ---- histogram (compare_sharded's distributed selection) ---------------------------------

def test_histogram_matches_numpy(engine):
    rng = np.random.default_rng(8)
    a = rng.standard_normal((300, 701)).astype(np.float32)
    e = a + rng.standard_normal(a.shape).astype(np.float32) * 1e-3
    a[rng.random(a.shape) < 0.01] = np.nan
    e[rng.random(a.shape) < 0.01] = np.inf
    fin = np.isfinite(a) & np.isfinite(e)
    keys = np.abs(a.astype(np.float64) - e.astype(np.float64))[fin].view(np.uint64)
    engine.configure(seg_min=1024, par_min=0)
    h = engine.histogram(a.T, e.T, [0], 0, 16, nthreads=2)
    assert h.shape == (1, 65536) and h.sum() == fin.sum()
    assert np.array_equal(h[0], np.bincount((keys >> np.uint64(48)).astype(np.int64), minlength=65536))
    top = np.argsort(h[0])[::-1][:3].astype(np.uint64)  # the three fullest 16-bit prefixes
    for width in (16, 5, 1):
        got = engine.histogram(a, e, top[::-1], 16, width, nthreads=3)
        for g, pre in enumerate(top[::-1]):
            sel = keys[(keys >> np.uint64(48)) == pre]
            digits = ((sel >> np.uint64(48 - width)) & np.uint64((1 << width) - 1)).astype(np.int64)
            assert np.array_equal(got[g], np.bincount(digits, minlength=1 << width))
        assert np.array_equal(got, engine.histogram(a, e, top[::-1], 16, width, nthreads=1))
    # the last digit: prefix_bits + width == 64
    pre48 = np.unique(keys >> np.uint64(16))[:2]
    got = engine.histogram(a, e, pre48, 48, 16)
    for g, pre in enumerate(pre48):
        sel = keys[(keys >> np.uint64(16)) == pre]
        assert np.array_equal(got[g], np.bincount((sel & np.uint64(0xFFFF)).astype(np.int64), minlength=65536))


def test_histogram_errors(engine):
    a = np.ones(4)
    for args in (([1], 0, 16), ([0, 1], 0, 16), ([0], 8, 17), ([0], 60, 8), ([3, 3], 4, 4),
                 ([16], 4, 4), ([], 4, 4)):
        with pytest.raises(ValueError, match="vgct_cpu_histogram"):
            engine.histogram(a, a, *args)
    assert engine.histogram(np.zeros(0), np.zeros(0), [0], 0, 4).sum() == 0


@pytest.mark.parametrize("shape,dim", [((50, 100), 0), ((7, 30, 100), 1), ((60, 70), 1),
                                       ((40, 513), 0), ((9, 3, 64), 0),
                                       # >= 8 tiles per slice: float32 tiles (csrc "float32")
                                       ((6, 4100), 0), ((3, 41, 101), 0)])
@pytest.mark.parametrize("dt", ["float32", "float64"])
@pytest.mark.parametrize("nonfinite", [0.0, 0.02])
def test_slice_paths_equal_definition(engine, shape, dim, dt, nonfinite):
    """Multi-run tiles (runs of 64+ and shorter), slice axis outer and inner."""
    rng = np.random.default_rng(sum(shape) + dim)
    a, e, *_ = make(rng, shape, dt, nonfinite)
    fast, slow = run_both(engine, a, e, dim, None, None, seg_min=1024, par_min=0)
    assert fast == slow


def test_every_allocation_failure_is_enomem_with_a_message(engine):
    """Each allocation of each entry point, made to fail in turn: VGCT_ENOMEM and a message
    naming the call, never a crash; the next call works."""
    rng = np.random.default_rng(6)
    a = rng.standard_normal((64, 5000)).astype(np.float32)
    e = a + np.float32(1e-3)
    calls = {
        "vgct_cpu_reduce": lambda: acc_bits(engine.reduce(a, e, nthreads=2)),
        "vgct_cpu_reduce ": lambda: acc_bits(engine.reduce(a, e, dim=0, nthreads=2)),
        "vgct_cpu_select": lambda: engine.select(a, e, [5, 100_000], nthreads=2).tolist(),
        "vgct_cpu_histogram": lambda: engine.histogram(a, e, [0], 0, 16, nthreads=2).tolist(),
        "vgct_cpu_fingerprint": lambda: engine.fingerprint(a, nthreads=2),
    }
    for name, call in calls.items():
        engine.configure(par_min=0)
        want = call()
        failures = 0
        for k in range(1, 40):
            engine.configure(par_min=0, fail_alloc=k)
            try:
                got = call()
            except MemoryError as ex:
                assert name.strip() in str(ex) and "out of memory" in str(ex)
                failures += 1
                continue
            # k beyond the call's allocations: a normal, identical result
            assert repr(got) == repr(want)
            break
        else:
            pytest.fail(f"{name}: still failing after 40 allocations")
        assert failures >= 1, name
    engine.configure()
