"""Property-based tests (hypothesis): vgct_ext.compare equals the float64 oracle for
any shape, any memory layout of either input (transposed, negative strides,
steps, stride 0), any dtype pair and any values (NaN, +-Inf, zeros, -0,
denormals, huge, tiny); torch dtypes (bfloat16, float16, float8_e4m3fn,
float8_e5m2) through torch tensors, zero-copy.
"""

import math

import numpy as np
import pytest

import vgct_ext
from oracle import decode_bf16, decode_e4m3, decode_e5m2, mismatches_vs_oracle

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import example, given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

NP_DTYPES = ["float64", "float32", "float16", "int8", "int16", "int32", "int64", "uint8", "bool"]
SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 5e-324, -2.5e-310, 1e-300, 1e-45, 1e300,
            -1e300, 65504.0, -65520.0, 3.4e38, 1.0, -1.0]
VALUES = st.one_of(st.floats(-1e3, 1e3, width=64), st.sampled_from(SPECIALS),
                   st.floats(allow_nan=True, allow_infinity=True, width=64))


def cast(x: np.ndarray, dt: str) -> np.ndarray:
    return np.asarray(_cast(np.asarray(x), dt))


def _cast(x: np.ndarray, dt: str):
    d = np.dtype(dt)
    with np.errstate(all="ignore"):
        if d == np.bool_:
            return np.nan_to_num(x) > 0
        if d.kind in "iu":
            info = np.iinfo(d)
            y = np.clip(np.nan_to_num(x, posinf=info.max, neginf=info.min), info.min, info.max)
            return np.round(y).astype(np.float64).clip(info.min, info.max).astype(d) \
                if d.itemsize < 8 else np.round(np.clip(y, -2.0 ** 62, 2.0 ** 62)).astype(d)
        return x.astype(d)


@st.composite
def layouts(draw, ndim):
    kind = draw(st.sampled_from(["C", "perm", "flip", "step", "F"]))
    perm = draw(st.permutations(range(ndim))) if ndim else []
    flips = [draw(st.booleans()) for _ in range(ndim)]
    return kind, tuple(perm), tuple(flips)


def apply_layout(x: np.ndarray, layout) -> np.ndarray:
    """The same logical array with another memory layout."""
    kind, perm, flips = layout
    if x.ndim == 0 or kind == "C":
        return x.copy()
    if kind == "perm":
        return np.ascontiguousarray(x.transpose(perm)).transpose(np.argsort(perm))
    if kind == "flip":
        sl = tuple(slice(None, None, -1) if f else slice(None) for f in flips)
        return np.ascontiguousarray(x[sl])[sl]
    if kind == "step":
        big = np.zeros(tuple(2 * s + 1 for s in x.shape), dtype=x.dtype)
        sl = tuple(slice(1, None, 2) for _ in x.shape)
        big[sl] = x
        return big[sl]
    return np.asfortranarray(x)


@st.composite
def paired(draw):
    ndim = draw(st.integers(0, 4))
    shape = tuple(draw(st.integers(0, 7) if ndim else st.just(1)) for _ in range(ndim))
    # stride-0 axes: the logical data is constant along them
    bcast = tuple(draw(st.booleans()) and s > 1 for s in shape)
    gen_shape = tuple(1 if b else s for s, b in zip(shape, bcast))
    a0 = draw(hnp.arrays(np.float64, gen_shape, elements=VALUES))
    how = draw(st.sampled_from(["close", "independent", "equal"]))
    if how == "independent":
        e0 = draw(hnp.arrays(np.float64, gen_shape, elements=VALUES))
    elif how == "equal":
        e0 = a0.copy()
    else:
        noise = draw(hnp.arrays(np.float64, gen_shape, elements=st.floats(-1e-2, 1e-2)))
        with np.errstate(all="ignore"):
            e0 = np.asarray(a0 * (1 + noise), dtype=np.float64)
    dt_a = draw(st.sampled_from(NP_DTYPES))
    dt_e = draw(st.sampled_from(NP_DTYPES + [dt_a] * 4))
    a, e = cast(a0, dt_a), cast(e0, dt_e)
    views = []
    for x in (a, e):
        if any(bcast) and draw(st.booleans()):
            views.append(np.broadcast_to(x, shape))  # stride 0, zero-copy
        else:
            views.append(apply_layout(np.broadcast_to(x, shape).copy() if x.ndim else x,
                                      draw(layouts(ndim))))
    dim = draw(st.none() | (st.integers(0, ndim - 1) if ndim else st.none()))
    qs = tuple(sorted(set(draw(st.lists(st.floats(0, 1), max_size=3)) + [0.5, 0.99])))
    rtol = draw(st.sampled_from([0.0, 1e-3, 0.5]))
    atol = draw(st.sampled_from([0.0, 1e-3, 1.0]))
    return views[0], views[1], dim, qs, rtol, atol


@given(paired())
def test_compare_equals_oracle(case):
    a, e, dim, qs, rtol, atol = case
    s = vgct_ext.compare(a, e, rtol=rtol, atol=atol, quantiles=qs, dim=dim)
    # sums against the exact (integer) oracle: no flushing for any dtype (float64: per-family
    # scales, docs/metrics.md "Overflow, underflow and the scaling")
    bad = mismatches_vs_oracle(s, a.astype(np.float64), e.astype(np.float64), rtol, atol, qs, dim,
                               cond_aware=True, exact=True)
    assert not bad, (a.dtype, e.dtype, a.shape, a.strides, e.strides, dim, bad)


# ---- float64 over the whole exponent range, against the exact oracle ---------------------

@st.composite
def wide_float64(draw):
    """float64 pairs whose magnitudes mix exponents from 1e-300 to 1e300 (and subnormals,
    values near DBL_MAX with opposite signs), related in several ways, any layout."""
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 9)) for _ in range(ndim))
    n = int(np.prod(shape))
    expo = st.floats(-300, 300)
    mant = st.floats(1.0, 9.999)
    sign = st.sampled_from([-1.0, 1.0])
    mag = st.builds(lambda s, m, x: s * m * 10.0 ** x, sign, mant, expo)
    elem = st.one_of(mag, mag, mag, st.sampled_from([0.0, 5e-324, -3e-320, 2.2e-308, 1.7e308,
                                                     -1.6e308, 1e-300, -1e300]))
    a = np.array(draw(st.lists(elem, min_size=n, max_size=n)), np.float64).reshape(shape)
    how = draw(st.sampled_from(["independent", "close", "tiny_diff", "scaled", "opposite"]))
    if how == "independent":
        e = np.array(draw(st.lists(elem, min_size=n, max_size=n)), np.float64).reshape(shape)
    elif how == "close":
        noise = np.array(draw(st.lists(st.floats(-1e-6, 1e-6), min_size=n, max_size=n)))
        e = a * (1 + noise.reshape(shape))
    elif how == "tiny_diff":  # a = e + tiny differences, next to huge values
        tiny = np.array(draw(st.lists(st.builds(lambda s, m, x: s * m * 10.0 ** x, sign, mant,
                                                st.floats(-310, -280)), min_size=n, max_size=n)))
        e = a.copy()
        a = e + tiny.reshape(shape)
    elif how == "scaled":  # one side at a far-away magnitude: e ~ 10^k a
        k = draw(st.integers(-600, 600))
        with np.errstate(all="ignore"):
            e = a * 10.0 ** (k // 2) * 10.0 ** (k - k // 2)
        e = np.where(np.isfinite(e), e, 1.0)
    else:
        e = -a * draw(st.floats(0.5, 1.0))
    e = np.asarray(e, np.float64)
    if draw(st.booleans()):
        a, e = e, a
    la, le = draw(layouts(ndim)), draw(layouts(ndim))
    dim = draw(st.none() | st.integers(0, ndim - 1))
    return apply_layout(a, la), apply_layout(e, le), dim


@given(wide_float64())
def test_float64_any_exponents_equal_exact_oracle(case):
    """No overflow or underflow for any finite float64 input: every sum-based statistic
    within 1e-12 relative of the exact oracle (signed sums: of their magnitudes)."""
    a, e, dim = case
    qs = (0.5, 0.99)
    s = vgct_ext.compare(a, e, quantiles=qs, dim=dim)
    bad = mismatches_vs_oracle(s, a, e, 1e-3, 1e-3, qs, dim, cond_aware=True, exact=True)
    assert not bad, (a.shape, dim, bad)


@given(paired())
def test_repeatable_and_layout_free_counts(case):
    """Bitwise repeatable; counts, maxima, indices and quantiles do not depend on the layout."""
    a, e, dim, qs, rtol, atol = case
    s1 = vgct_ext.compare(a, e, rtol=rtol, atol=atol, quantiles=qs, dim=dim).as_dict()
    s2 = vgct_ext.compare(a, e, rtol=rtol, atol=atol, quantiles=qs, dim=dim).as_dict()
    assert repr(s1) == repr(s2)
    c = vgct_ext.compare(np.array(a, order="C"), np.array(e, order="C"), rtol=rtol, atol=atol,
                         quantiles=qs).as_dict()
    for k in ("n", "n_finite", "n_unequal", "mismatches", "max_abs_err", "max_abs_err_index",
              "max_rel_err_index", "worst_mismatch_index", "first_class_mismatch_index",
              "quantiles", "nan_actual", "posinf_expected", "n_class_mismatch"):
        assert repr(c[k]) == repr(s1[k]), k


# ---- torch dtypes, zero-copy --------------------------------------------------------------

RAW = {"bfloat16": (np.uint16, decode_bf16), "float8_e4m3fn": (np.uint8, decode_e4m3),
       "float8_e5m2": (np.uint8, decode_e5m2),
       "float16": (np.uint16, lambda b: b.view(np.float16).astype(np.float64))}


@st.composite
def torch_pairs(draw):
    dt = draw(st.sampled_from(sorted(RAW)))
    bits_t, dec = RAW[dt]
    rows, cols = draw(st.integers(1, 9)), draw(st.integers(1, 40))
    hi = 65536 if bits_t == np.uint16 else 256
    ints = st.integers(0, hi - 1)
    a = draw(hnp.arrays(bits_t, (rows, cols), elements=ints))
    if draw(st.booleans()):  # close values: flip low mantissa bits only
        e = a ^ draw(hnp.arrays(bits_t, (rows, cols), elements=st.integers(0, 3))).astype(bits_t)
    else:
        e = draw(hnp.arrays(bits_t, (rows, cols), elements=ints))
    view = draw(st.sampled_from(["C", "T", "step", "offset"]))
    dim = draw(st.sampled_from([None, 0, 1]))
    return dt, a, e, dec, view, dim


@given(torch_pairs())
@example(case=("bfloat16", np.array([[0, 7769, 7769]], dtype=np.uint16),  # found by hypothesis
                np.array([[1, 7770, 7768]], dtype=np.uint16), decode_bf16, "C", None))
def test_torch_dtypes_equal_oracle(case):
    torch = pytest.importorskip("torch")
    dt, a, e, dec, view, dim = case
    tdt = getattr(torch, dt)
    ib = torch.int16 if a.dtype == np.uint16 else torch.uint8
    ta = torch.from_numpy(a.view(np.int16) if a.dtype == np.uint16 else a).view(tdt)
    te = torch.from_numpy(e.view(np.int16) if e.dtype == np.uint16 else e).view(tdt)
    a64, e64 = dec(a), dec(e)
    if view == "T":
        ta, te, a64, e64 = ta.T, te.T, a64.T, e64.T
    elif view == "step":  # torch has no negative strides; a stepped view instead
        ta, te, a64, e64 = ta[:, ::2], te[:, ::2], a64[:, ::2], e64[:, ::2]
    elif view == "offset":  # data pointer at an odd element offset (misaligned for 2-byte types)
        ta, te, a64, e64 = ta.reshape(-1)[1:], te.reshape(-1)[1:], a64.ravel()[1:], e64.ravel()[1:]
        dim = None if dim == 1 else dim
    del ib
    qs = (0.5, 0.99)
    s = vgct_ext.compare(ta, te, quantiles=qs, dim=dim)
    assert s.dtype_actual == dt
    # signed sums held to docs/metrics.md's bound (1e-12 of the sum of magnitudes): the
    # example above cancels -u + u next to a subnormal d, which float64 sums in any
    # order but the exact one lose
    bad = mismatches_vs_oracle(s, np.ascontiguousarray(a64), np.ascontiguousarray(e64), 1e-3, 1e-3,
                               qs, dim, cond_aware=True, exact=True)
    assert not bad, (dt, view, dim, bad)


def test_torch_zero_copy_in_place_change_is_seen():
    """The engine reads the tensor's memory: an in-place change changes the result."""
    torch = pytest.importorskip("torch")
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        ref = torch.linspace(-1, 1, 4097, dtype=torch.float32)
        act = ref.to(dt, copy=True)
        view = act[1:]  # an offset view (misaligned for 2-byte types)
        s1 = vgct_ext.compare(view, ref[1:])
        act[2000] = 100.0  # through the base tensor
        s2 = vgct_ext.compare(view, ref[1:])
        assert s2.max_abs_err_index == (1999,) and s2.max_abs_err > 98 > s1.max_abs_err
        g = ref.clone().requires_grad_(True)
        assert vgct_ext.compare(g, ref).n_unequal == 0


def test_torch_fp8_every_bit_pattern():
    torch = pytest.importorskip("torch")
    bits = np.arange(256, dtype=np.uint8)
    for name, dec in (("float8_e4m3fn", decode_e4m3), ("float8_e5m2", decode_e5m2)):
        t = torch.from_numpy(bits).view(getattr(torch, name))
        z = torch.zeros(256, dtype=torch.float32)
        s = vgct_ext.compare(t, z, quantiles=(0.0, 0.5, 1.0))
        bad = mismatches_vs_oracle(s, dec(bits), np.zeros(256), 1e-3, 1e-3, (0.0, 0.5, 1.0))
        assert not bad, (name, bad)
        v = dec(bits)
        assert s.nan_actual == int(np.isnan(v).sum()) and s.posinf_actual == int((v == np.inf).sum())
        assert s.max_abs_err == float(np.nanmax(np.abs(v[np.isfinite(v)])))
    assert math.isnan(decode_e4m3(np.array([0x7F], np.uint8))[0]) and decode_e4m3(np.array([0x7E], np.uint8))[0] == 448.0


def test_float16_every_bit_pattern():
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    x = bits.view(np.float16)
    s = vgct_ext.compare(x, np.zeros(65536, np.float32), quantiles=(0.5,), dim=None)
    bad = mismatches_vs_oracle(s, x.astype(np.float64), np.zeros(65536), 1e-3, 1e-3, (0.5,))
    assert not bad
    assert s.nan_actual == 2046 and s.posinf_actual == 1 and s.neginf_actual == 1


@st.composite
def identical_pairs(draw):
    """An array and a bit-identical copy of it (any dtype numpy has, any layout of the copy), with
    at least one nonzero value; sizes up to 5000 so the CPU engine's tiles and threads split it."""
    dt = draw(st.sampled_from(NP_DTYPES))
    n = draw(st.integers(1, 5000))
    seed = draw(st.integers(0, 2 ** 32 - 1))
    scale = 10.0 ** draw(st.integers(-300, 300)) if dt == "float64" else 10.0 ** draw(st.integers(-3, 3))
    x = cast(np.random.default_rng(seed).standard_normal(n) * scale, dt)
    if not np.any(x.astype(np.float64) != 0.0):
        x = cast(np.ones(n), dt)
    return x, apply_layout(x, ("step", (0,), (False,))) if draw(st.booleans()) else x.copy()


@given(identical_pairs())
def test_identical_pair_cosine_is_exactly_one(case):
    """A bit-identical pair's cosine is exactly 1.0 (csrc/vgct_stats.h vgct_acc_finalize: s_ae /
    sqrt(s_aa s_ee) on equal sums).  The two divisions used before (s_ae / sqrt(s_aa) / sqrt(s_ee))
    gave 1 - 1.1e-16 or 1 - 2.2e-16 for about half of all sums -- and a T2 gate calibrated on
    identical runs (cosine bar 1.0) then failed a later identical run (new-user trial)."""
    a, e = case
    s = vgct_ext.compare(a, e, quantiles=())
    assert s.n_unequal == 0 and s.rel_l2 == 0.0
    assert s.cosine == 1.0, (a.dtype, a.size, s.cosine)
