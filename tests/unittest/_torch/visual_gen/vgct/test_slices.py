"""Per-slice statistics (compare(..., dim=k)) against the oracle.

One vgct_slice_acc per index along dim: mean shift, rel_l2, max |d|, reference
RMS and the finite count of each slice, for the slice axis outermost,
innermost (channels-last) and in between, every memory order, slices without
finite pairs (NaN) and with a zero reference (rel_l2 NaN).
"""

import numpy as np
import pytest

import vgct_ext
from oracle import exact_sums, mismatches_vs_oracle


def check(a, e, dim, quantiles=()):
    s = vgct_ext.compare(a, e, dim=dim, quantiles=quantiles)
    d = dim % a.ndim
    bad = mismatches_vs_oracle(s, np.asarray(a, np.float64), np.asarray(e, np.float64), 1e-3, 1e-3,
                               quantiles, d)
    assert not bad, (a.shape, a.strides, dim, bad)
    assert s.slices.dim == d and len(s.slices) == a.shape[d]
    return s


def video(shape=(2, 16, 5, 12, 20), dt=np.float32, seed=0):
    """(B, C, T, H, W) with a per-channel bias in `a`: the mean shift to find."""
    rng = np.random.default_rng(seed)
    e = rng.standard_normal(shape)
    bias = np.linspace(-0.01, 0.01, shape[1]).reshape(1, -1, 1, 1, 1)
    a = e + bias + rng.standard_normal(shape) * 1e-3
    return a.astype(dt), e.astype(dt), bias.ravel()


@pytest.mark.parametrize("dim", [0, 1, 2, 3, 4, -1, -4])
def test_video_axes(dim):
    a, e, _ = video()
    check(a, e, dim)


def test_channel_mean_shift_found():
    a, e, bias = video(dt=np.float64)
    s = check(a, e, 1)
    assert np.allclose(s.slices.mean_shift, bias, atol=2e-4)
    assert s.slices.count.tolist() == [a.size // a.shape[1]] * a.shape[1]


@pytest.mark.parametrize("order", ["channels_last", "transposed", "reversed", "fortran"])
def test_memory_orders(order):
    a, e, _ = video()
    if order == "channels_last":  # (B, C, T, H, W) view of a (B, T, H, W, C) buffer
        a = np.ascontiguousarray(a.transpose(0, 2, 3, 4, 1)).transpose(0, 4, 1, 2, 3)
        e = np.ascontiguousarray(e.transpose(0, 2, 3, 4, 1)).transpose(0, 4, 1, 2, 3)
    elif order == "transposed":
        a, e = a.T, e.T
    elif order == "reversed":
        a, e = a[:, ::-1, :, ::-1], e[:, ::-1, :, ::-1]
    else:
        a, e = np.asfortranarray(a), np.asfortranarray(e)
    for dim in range(a.ndim):
        check(a, e, dim)


@pytest.mark.parametrize("layout", ["outer", "inner"])
def test_large_slices_multi_segment(layout):
    """> 2^18 pairs (threads, several segments and slice blocks)."""
    rng = np.random.default_rng(1)
    e = rng.standard_normal((64, 9000)).astype(np.float32)
    a = (e + rng.standard_normal(e.shape).astype(np.float32) * 1e-2)
    if layout == "outer":
        check(a, e, 0)
    else:
        check(a.T, e.T, 1)  # slice axis innermost in memory
        check(a, e, 1)      # 9000 slices, one element per row


def test_nan_zero_reference_and_empty_slices():
    e = np.ones((4, 6), np.float32)
    a = e.copy()
    e[1] = 0.0                # slice 1: zero reference -> rel_l2 NaN, ref_rms 0
    a[1] = 0.5
    a[2] = np.nan             # slice 2: no finite pair -> NaN everywhere, count 0
    a[3, :3] = np.inf         # slice 3: half finite
    a[0, 5] = 3.0
    s = check(a, e, 0)
    sl = s.slices
    assert sl.count.tolist() == [6, 6, 0, 3]
    assert np.isnan(sl.rel_l2[1]) and sl.ref_rms[1] == 0.0 and sl.mean_shift[1] == 0.5
    assert np.isnan(sl.mean_shift[2]) and np.isnan(sl.max_abs_err[2]) and np.isnan(sl.ref_rms[2])
    assert sl.max_abs_err[0] == 2.0 and sl.max_abs_err[3] == 0.0
    t = vgct_ext.compare(a.T, e.T, dim=1).slices
    for f in ("mean_shift", "rel_l2", "max_abs_err", "ref_rms", "count"):
        assert np.array_equal(getattr(t, f), getattr(sl, f), equal_nan=True), f


def test_float64_extremes_per_slice():
    rng = np.random.default_rng(2)
    e = rng.standard_normal((3, 500))
    a = e * (1 + 1e-6)
    scale = np.array([1e300, 1e-300, 1.0]).reshape(3, 1)
    s = check(a * scale, e * scale, 0)
    assert np.allclose(s.slices.rel_l2, 1e-6, rtol=1e-9)


@pytest.mark.parametrize("dim", [0, 1])
def test_float64_slices_with_far_apart_families(dim):
    """Per slice, e and d have their own scales (vgct_slice_acc.scale_e, scale_d): a slice
    whose reference is ~1e-250 of its actual (rel_l2 ~ 1e250; used to be NaN: sum e^2
    underflowed against the shared scale), tiny differences next to a huge value (rel_l2 and
    mean_shift non-zero), a difference that overflows float64; against the exact oracle."""
    rng = np.random.default_rng(9)
    e = rng.standard_normal((5, 400))
    a = e * (1 + 1e-5 * rng.standard_normal(e.shape))
    e[0] *= 1e-250
    e[1] *= 1e-290
    e[1, 3] = 1e-20
    a[1] = e[1] + 1e-300 * rng.standard_normal(400)
    a[1, 3] = 1e-20
    a[2, 0], e[2, 0] = -1.5e308, 1.5e308
    a[3] *= 1e-200
    x, y = (a, e) if dim == 0 else (a.T.copy(), e.T.copy())
    s = vgct_ext.compare(x, y, dim=dim, quantiles=())
    bad = mismatches_vs_oracle(s, x, y, 1e-3, 1e-3, (), dim, exact=True, cond_aware=True)
    assert not bad, bad
    sl = s.slices
    ex = exact_sums(x, y, dim)["slices"]
    for f in ("rel_l2", "ref_rms", "mean_shift"):
        np.testing.assert_allclose(getattr(sl, f), ex[f], rtol=1e-12, err_msg=f)
    assert sl.rel_l2[0] == pytest.approx(1e250, rel=1e-3) and 1e-280 < sl.rel_l2[1] < 1e-276
    assert sl.mean_shift[1] != 0 and np.isfinite(sl.rel_l2[2]) and sl.max_abs_err[2] == np.inf


def test_size_one_axis_and_bool_ints():
    a = np.arange(12, dtype=np.int16).reshape(3, 1, 4)
    e = a[::-1].copy()
    check(a, e, 1)
    check(a > 4, e > 4, 2)
