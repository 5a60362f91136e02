"""The CUDA engine ([B]) against the CPU engine and the float64 NumPy oracle.

Every test is marked ``gpu`` and skips with a reason naming what is missing
(a CUDA build of vgct_ext, a CUDA device, torch with CUDA, a second device).
Each comparison runs the same ``vgct_ext.compare`` on the CUDA tensors, on
``.cpu()`` copies (the CPU engine) and through ``oracle.py``: sums within
1e-12 relative of the oracle, every maximum, index, count and quantile
exactly equal, and GPU == CPU on everything but the last bits of sums.
"""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest

import vgct_ext
from oracle import (SUM_FIELDS, EXACT_FIELDS, INDEX_FIELDS, mismatches_vs_oracle, record_answered, rel_close,
                    to_f64)


def _skip_reason():
    info = vgct_ext.build_info()
    if not info.get("cuda_compiled"):
        return "vgct_ext built without CUDA (no nvcc at build time, or VGCT_CUDA=0)"
    if not info.get("cuda_device_count"):
        return (f"no CUDA device (driver version {info.get('cuda_driver_version')}, "
                f"device count {info.get('cuda_device_count')})")
    try:
        import torch
    except ImportError:
        return "torch not installed (the GPU tests make their tensors with torch)"
    if not torch.cuda.is_available():
        return f"torch without CUDA (torch {torch.__version__})"
    return None


_REASON = _skip_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]

if _REASON is None:
    import torch

    DEV = torch.device("cuda", torch.cuda.current_device())
else:  # pragma: no cover - the module only collects
    torch = None
    DEV = None

QS = (0.0, 0.25, 0.5, 0.9, 0.99, 1.0)
GEN_SEED = 20261129


def _gen(seed=GEN_SEED):
    g = torch.Generator(device=DEV)
    g.manual_seed(seed)
    return g


def pair(shape, dt_a, dt_e=None, rel=1e-2, seed=0):
    """Reference-like data and a perturbed copy on the GPU, in the given torch dtypes."""
    dt_e = dt_e or dt_a
    g = _gen(GEN_SEED + seed)
    base = torch.randn(shape, generator=g, device=DEV, dtype=torch.float64) * 3
    noise = torch.randn(shape, generator=g, device=DEV, dtype=torch.float64) * rel * 3

    def cast(x, dt):
        if dt == torch.bool:
            return x > 0
        if not dt.is_floating_point:
            info = torch.iinfo(dt)
            return torch.clamp(torch.round(x * 20), info.min, info.max).to(dt)
        if dt in (torch.float8_e4m3fn, torch.float8_e5m2):
            return torch.clamp(x, -400, 400).to(dt)
        return x.to(dt)

    return cast(base + noise, dt_a), cast(base, dt_e)


def assert_same_stats(g, c, tol=4e-12):
    """GPU result g against the CPU engine's c."""
    bad = {}
    for f in SUM_FIELDS:
        if not rel_close(getattr(g, f), getattr(c, f), tol):
            bad[f] = (getattr(g, f), getattr(c, f))
    for f in tuple(EXACT_FIELDS) + tuple(INDEX_FIELDS) + ("n", "shape", "dtype_actual",
                                                         "dtype_expected", "dim"):
        x, y = getattr(g, f), getattr(c, f)
        same = x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x)
                          and math.isnan(y))
        if not same:
            bad[f] = (x, y)
    for q, v in c.quantiles.items():
        w = g.quantiles.get(q, "missing")
        if not (w == v or (w is None and v is None) or
                (isinstance(w, float) and isinstance(v, float) and math.isnan(w) and math.isnan(v))):
            bad[f"quantile[{q}]"] = (w, v)
    if c.slices is not None or g.slices is not None:
        if g.slices is None or c.slices is None:
            bad["slices"] = (g.slices, c.slices)
        else:
            for f in ("count", "max_abs_err"):
                if not np.array_equal(getattr(g.slices, f), getattr(c.slices, f), equal_nan=True):
                    bad[f"slices.{f}"] = "differ"
            for f in ("mean_shift", "rel_l2", "ref_rms"):
                x, y = np.asarray(getattr(g.slices, f)), np.asarray(getattr(c.slices, f))
                ok = np.array_equal(np.isnan(x), np.isnan(y)) and all(
                    rel_close(float(p), float(q), tol) for p, q in zip(x[~np.isnan(x)], y[~np.isnan(y)]))
                if not ok:
                    bad[f"slices.{f}"] = "differ"
    assert not bad, f"GPU vs CPU engine: {bad}"


def check3(a, e, rtol=1e-3, atol=1e-3, quantiles=QS, dim=None, oracle=True):
    """GPU result == CPU engine on .cpu() copies, and == the float64 oracle."""
    g = vgct_ext.compare(a, e, rtol=rtol, atol=atol, quantiles=quantiles, dim=dim)
    assert g.device == f"cuda:{a.device.index}"
    c = vgct_ext.compare(a.cpu(), e.cpu(), rtol=rtol, atol=atol, quantiles=quantiles, dim=dim)
    assert c.device == "cpu"
    assert_same_stats(g, c)
    if oracle:
        a64, e64 = to_f64(a.cpu()), to_f64(e.cpu())
        bad = mismatches_vs_oracle(g, a64, e64, rtol, atol, quantiles, dim)
        assert not bad, (f"{a.dtype}/{e.dtype} shape {tuple(a.shape)} strides {a.stride()}/"
                         f"{e.stride()}: {bad}")
    return g


# ---- dtypes -----------------------------------------------------------------------

@pytest.fixture
def lean_max():
    """The reduce's lean threshold hook (cuda/reduce.cu vgct_cuda_test_lean_max): .value = n
    forces k_reduce_lean for inputs of at most n pairs (0: never); reset to the default after."""
    import ctypes

    from vgct_ext import _C

    h = ctypes.c_longlong.in_dll(ctypes.CDLL(_C.__file__), "vgct_cuda_test_lean_max")
    yield h
    h.value = -1


@pytest.fixture(params=["lean", "fast"])
def reduce_mode(request, lean_max):
    """The test once with every input reduced by k_reduce_lean and once by the fast-path kernels
    (gate, vector loads, bulk-copy ring, non-finite fallbacks): by default inputs of up to
    VG_LEAN_MAX pairs take the lean kernel, which would leave the fast path untested on them."""
    lean_max.value = (1 << 62) if request.param == "lean" else 0
    return request.param


ALL_DTYPES = ["bfloat16", "float16", "float32", "float64", "float8_e4m3fn", "float8_e5m2",
              "int8", "int16", "int32", "int64", "uint8", "bool"]


@pytest.mark.parametrize("dt", ALL_DTYPES)
def test_each_dtype(dt, reduce_mode):
    t = getattr(torch, dt)
    a, e = pair((37, 61), t)
    check3(a, e)
    check3(a, e, dim=1)
    check3(a, e, dim=0)
    a, e = pair((300007,), t, seed=1)  # many blocks, a partial last chunk
    check3(a, e)


@pytest.mark.parametrize("dt_a,dt_e", [("bfloat16", "float32"), ("float16", "float32"),
                                       ("bfloat16", "float64"), ("float32", "float64"),
                                       ("float8_e4m3fn", "float32"), ("float8_e5m2", "bfloat16"),
                                       ("int32", "float64"), ("bool", "float16"),
                                       ("float32", "bfloat16"), ("uint8", "int8")])
def test_mixed_dtypes(dt_a, dt_e, reduce_mode):
    a, e = pair((5, 4099), getattr(torch, dt_a), getattr(torch, dt_e))
    check3(a, e)
    check3(a, e, dim=0)


# ---- layouts ----------------------------------------------------------------------

@pytest.mark.parametrize("dt", ["bfloat16", "float32", "float64", "float16"])
@pytest.mark.parametrize("layout", ["transposed", "permuted", "stepped", "misaligned",
                                    "misaligned_one_side", "stride0", "mixed_orders",
                                    "channels_last", "size1_dims"])
def test_layouts(layout, dt, reduce_mode):
    t = getattr(torch, dt)
    a, e = pair((24, 17, 130), t)
    if layout == "transposed":
        a, e = a.transpose(0, 2), e.transpose(0, 2)
    elif layout == "permuted":
        a, e = a.permute(1, 2, 0), e.permute(1, 2, 0)
    elif layout == "stepped":
        a, e = a[:, ::3, 1::2], e[:, ::3, 1::2]
    elif layout == "misaligned":  # storage offset 1: not 16-byte aligned
        a, e = pair((100001,), t)
        a, e = a[1:], e[1:]
    elif layout == "misaligned_one_side":
        a, e = pair((100001,), t)
        a, e = a[1:], e[:-1]
    elif layout == "stride0":
        a, e = pair((1, 17, 130), t)
        a, e = a.expand(24, 17, 130), e.expand(24, 17, 130)
    elif layout == "mixed_orders":
        e = e.transpose(0, 2).contiguous().transpose(0, 2)
    elif layout == "channels_last":
        a, e = pair((2, 8, 33, 35), t)
        a = a.contiguous(memory_format=torch.channels_last)
        e = e.contiguous(memory_format=torch.channels_last)
    elif layout == "size1_dims":
        a, e = pair((1, 24, 1, 130, 1), t)
    check3(a, e)
    for d in range(a.dim()):
        check3(a, e, dim=d)


@pytest.mark.parametrize("dim", [None, 0, 1])
@pytest.mark.parametrize("side", ["a", "e"])
def test_float32_strided_inner_dimension_one_chunk_in_flight(side, dim, reduce_mode):
    """float32 pairs whose inner dimension is strided for one operand run k_reduce_gen with one chunk in flight
    (RG = 1, cuda/reduce.cu): flat (dim None), row mode (dim 0: rows of 4160 >= VG_ROW_MIN) and column mode, with
    a partial last chunk (4160 = 520 chunks of 8; 4163 columns: 3 left over). GPU == CPU engine == oracle."""
    for cols in (4160, 4163):
        a, e = pair((4, cols), torch.float32)
        if side == "a":
            a = a.t().contiguous().t()  # same values, column-major
        else:
            e = e.t().contiguous().t()
        check3(a, e, dim=dim)


#: how the ring copies a step of each RUN_LAYOUTS layout it takes (cuda/reduce.cu
#: vgct_cuda_test_ring_run_last): 2 one memory run a block (A.rrun: rows back to back in both
#: operands), 1 or 2 where the rows are apart (2 when the grid puts every block inside one row:
#: the block size, hence the choice, follows the device's SM count)
RING_RUN = {"transposed": (2,), "transposed_batch": (2,), "rows_of_64_chunks": (2,),
            "transposed_slices": (2,), "rows_apart": (1, 2), "latent_channels": (1, 2),
            "channels_of_nhwc": (1, 2)}


@pytest.fixture
def ring_run_last():
    """The reduce's record of how the last ring launch copied a step (cuda/reduce.cu
    vgct_cuda_test_ring_run_last: 0 the flat run, 1 rows split at row ends, 2 rows as one run)."""
    import ctypes

    from vgct_ext import _C

    h = ctypes.c_longlong.in_dll(ctypes.CDLL(_C.__file__), "vgct_cuda_test_ring_run_last")
    h.value = -1
    yield h
    h.value = 0


@pytest.fixture
def kernel_last():
    """The reduce's record of the kernel the last reduction launched (cuda/reduce.cu
    vgct_cuda_test_kernel_last: 1 flat, 2 general strides, 3 column mode, 4 the ring, 5 lean)."""
    import ctypes

    from vgct_ext import _C

    h = ctypes.c_longlong.in_dll(ctypes.CDLL(_C.__file__), "vgct_cuda_test_kernel_last")
    h.value = 0
    yield h
    h.value = 0


RUN_LAYOUTS = {  # name: (base shape, view of the base, dim, the kernel: 4 the ring, 2 the general kernel)
    "transposed": ((1000, 1024), lambda x: x.t(), None, 4),  # k = 2: rows of 1024, index stride 1000
    # three inner axes stay with the general kernel (measured slower on the ring for float32)
    "nchw_as_nhwc": ((2, 16, 32, 64), lambda x: x.permute(0, 2, 3, 1), None, 2),  # k = 3: (2, 16, 2048)
    "transposed_outer": ((8, 24, 256), lambda x: x.transpose(0, 1), None, 2),  # k = 3, inner axis in order
    "transposed_batch": ((2, 1024, 1024), lambda x: x[1].t(), None, 4),  # k = 2, a base 2 MiB in
    "rows_apart": ((1000, 1536), lambda x: x[:, 256:1280], None, 4),  # rows apart in memory
    # rows of 512 elements (64 chunks of 16-bit pairs, the shortest row the ring takes): a 96-chunk
    # step crosses a row end at its 32nd or 64th chunk -- two bulk copies an operand (vg_ring_load)
    "rows_of_64_chunks": ((1000, 512), lambda x: x.t(), None, 4),
    "latent_channels": ((2, 16, 64, 256), lambda x: x, 1, 4),  # row mode: 16 slices of 2 rows apart
    # row mode over slices whose rows are back to back: 4 slices of a transposed 1000 x 1024 each,
    # one copy a step from each slice's own base (A.rrun with S > 1)
    "transposed_slices": ((4, 1000, 1024), lambda x: x.transpose(1, 2), 0, 4),
    "channels_of_nhwc": ((2, 16, 32, 64), lambda x: x.permute(0, 2, 3, 1), 3, 4),  # row mode, k = 2 a slice
    # not (yet) given to the ring -- ring_layout: two inner axes, rows of a multiple of 64 chunks
    # (RB 3: bfloat16, float16, float64 pairs; 32 for RB 1: float32 and mixed pairs)
    "rows_of_125_chunks": ((1024, 1000), lambda x: x.t(), None, 2),  # one run, cpr 125 (float64 500)
    "slices_of_one_axis": ((16, 8192), lambda x: x, 0, 2),  # row mode, k = 1 a slice
    "rows_not_whole_chunks": ((1000, 1021), lambda x: x.t(), None, 2),  # 1021 % CH != 0 for every CH
    # rows of 4290 (2 a slice, apart): not whole chunks (CH 8), for float64 (CH 2) not whole steps
    "latent_rows_not_whole_chunks": ((2, 16, 33, 130), lambda x: x, 1, 2),
    # storage offset 1: the run is not 16-byte aligned
    "misaligned_run": ((1000, 1024), lambda x: x.reshape(-1)[1:1 + 999 * 1024].view(999, 1024).t(), None, 2),
}


@pytest.mark.parametrize("dt_a,dt_e", [("bfloat16", None), ("float16", None), ("float32", None),
                                       ("float64", None), ("bfloat16", "float32"),
                                       ("float16", "float32")])
@pytest.mark.parametrize("layout", list(RUN_LAYOUTS))
def test_ring_reads_rows_slices_and_runs_in_another_order(layout, dt_a, dt_e, lean_max, kernel_last,
                                                          ring_run_last):
    """The ring kernel (k_reduce_bulk) reads more than a flat run (cuda/reduce.cu ring_layout,
    vg_ring_load, VgRowCur): a transposed matrix whose memory is one run in another logical
    order, rows apart in memory, and the slices of row mode (per-channel statistics, dim=) -- a
    warp step's chunks copied one bulk copy a row they touch (16-bit pairs: 96-chunk steps over
    rows of 64, 128, 2048 chunks), or one copy when the rows are back to back (A.rrun: the
    transposed matrices, and the slices of transposed ones from each slice's base -- which of the
    two, RING_RUN), each chunk's flat index stepped along its row. Rows that are not a
    multiple of 64 chunks (RB 3 pairs; 32 for RB 1), a misaligned run, one inner axis in row mode,
    or three inner axes keep the general kernel. The
    fast path forced (lean off). Planted where memory order and logical order disagree: an exact
    tie of max |a - e| and of the worst mismatch (|a - e| = 64, the same |e|) at two elements, the
    one later in memory having the lower flat index (it must win); the largest |a - e| / |e|; a
    NaN in `actual`, an inf in `expected`. Every field, the per-slice statistics and the
    quantiles equal the CPU engine's and the float64 oracle's, the maxima's indices are the
    planted ones, and the kernel is the one named."""
    shape, view, dim, kernel = RUN_LAYOUTS[layout]
    lean_max.value = 0
    a0, e0 = pair(shape, getattr(torch, dt_a), getattr(torch, dt_e) if dt_e else None, seed=7)
    a, e = view(a0), view(e0)
    n = a.numel()
    # the view's flat indices in the order of their memory addresses
    coords = np.unravel_index(np.arange(n), tuple(a.shape))
    order = np.argsort(sum(c * s for c, s in zip(coords, a.stride())), kind="stable")
    # `late` later in memory than `early` but the lower flat index (the first position from a
    # quarter of the run on that something earlier in memory follows in the flat order); where
    # memory order is the flat order (rows apart, slices), two elements half the run apart
    inv = np.maximum.accumulate(order)[n // 4 + 3:] > order[n // 4 + 3:]
    if inv.any():
        j = n // 4 + 3 + int(np.argmax(inv))
        late = int(order[j])
        early = int(order[:j][order[:j] > late][0])
    else:
        late, early = n // 4 + 3, 3 * n // 4 + 5

    def at(k):  # flat index -> multi-index of the view
        return tuple(int(x) for x in np.unravel_index(k, tuple(a.shape)))

    for k in (late, early):
        e[at(k)], a[at(k)] = 0.5, 64.5  # exact in every dtype here: |a - e| = 64 at both
    rel = at(int(order[n // 3]))
    e[rel], a[rel] = 2.0 ** -20, 3.0  # |a - e| / |e| ~ 3e6: the largest; |a - e| below 64
    a[at(int(order[7]))] = float("nan")
    e[at(int(order[n - 9]))] = float("inf")
    st = check3(a, e, quantiles=(0.5, 0.99), dim=dim)
    assert kernel_last.value == kernel, f"{layout}: kernel {kernel_last.value}, expected {kernel}"
    if kernel == 4:
        assert ring_run_last.value in RING_RUN[layout], f"{layout}: ring copies {ring_run_last.value}"
    assert st.max_abs_err == 64.0 and st.max_abs_err_index == at(late)
    assert st.worst_mismatch_index == at(late) and st.max_rel_err_index == rel
    assert (st.nan_actual, st.posinf_expected, st.n_finite) == (1, 1, n - 2)


@pytest.mark.parametrize("run_side", ["actual", "expected"])
def test_ring_one_run_only_when_both_operands_are_one(run_side, lean_max, kernel_last, ring_run_last):
    """The ring over rows copies a step as one memory run (cuda/reduce.cu vg_ring_load, A.rrun)
    only when the rows are back to back in BOTH operands: here one operand is a transposed
    contiguous matrix (rows of 1024 bfloat16, one run) and the other the same values with its rows
    1536 apart (a column slice), so the ring must split that one's steps at its row ends. A
    host test of only the first operand's strides reads the gaps between the other's rows. Every
    field and quantile equals the CPU engine's and the float64 oracle's; the kernel is the ring."""
    lean_max.value = 0
    a0, e0 = pair((1000, 1024), torch.bfloat16, seed=11)
    run = {"a": a0.t(), "e": e0.t()}  # (1024, 1000), strides (1, 1024)
    wide = {k: torch.zeros((1000, 1536), dtype=torch.bfloat16, device=DEV) for k in "ae"}
    for k, x in (("a", a0), ("e", e0)):
        wide[k][:, 256:1280] = x
    apart = {k: wide[k][:, 256:1280].t() for k in "ae"}  # (1024, 1000), strides (1, 1536)
    a, e = (run["a"], apart["e"]) if run_side == "actual" else (apart["a"], run["e"])
    assert a.stride() != e.stride() and torch.equal(a, run["a"]) and torch.equal(e, run["e"])
    check3(a, e, quantiles=(0.5, 0.99))
    assert kernel_last.value == 4, f"kernel {kernel_last.value}, expected the ring (4)"
    assert ring_run_last.value == 1, f"ring copies {ring_run_last.value}, expected split at row ends (1)"


@pytest.mark.parametrize("dt", ["bfloat16", "float32"])
@pytest.mark.parametrize("layout", ["transposed", "latent_channels"])
def test_ring_index_at_random_positions_of_long_runs(layout, dt, lean_max, kernel_last):
    """The ring's flat index on runs of many warp steps (cuda/reduce.cu k_reduce_bulk, RL 1:
    each chunk's index stepped along its row by a lane's cursor, VgRowCur, while the stages of VG_BP steps rotate).
    2^24 pairs (the latent 1.5 x 2^24): 16-32 steps a warp, where test_ring_reads_rows_slices_and_runs_in_another_order's
    inputs take one or two, so an index that goes wrong only in later steps, or in some stage or
    phase of the ring, is likely caught: 24 positions sample the (warp, step) pairs, they do not
    cover them (a planted fault in a per-step index tried and not merged -- step k's slot read
    from the other phase -- failed all four cases on the H200, 2026-12-03). At 24 positions
    drawn at random in memory: the transposed matrix (4096 x 4096 `.t()`) gets an exact tie of max |a - e| and of the
    worst mismatch (|a - e| = 64, the same |e|) at the position and at the element one memory row
    earlier and one column on -- earlier in memory, higher flat index: the position must win; the
    latent (3, 16, 512, 1024) with dim=1 (row mode, 16 slices of three rows of 2^19 elements apart,
    whose row ends fall inside blocks and steps: 12288-chunk blocks of bf16, 2^16-chunk rows) one
    largest |a - e| at the position. The maxima's indices must be the planted position's, the
    kernel the ring."""
    lean_max.value = 0
    tdt = getattr(torch, dt)
    if layout == "transposed":
        a0, e0 = pair((4096, 4096), tdt, seed=11)
        C = a0.shape[1]
        a, e, dim = a0.t(), e0.t(), None
    else:
        a0, e0 = pair((3, 16, 512, 1024), tdt, seed=12)
        a, e, dim = a0, e0, 1
    af, ef = a0.view(-1), e0.view(-1)  # memory order
    n = af.numel()
    rng = np.random.default_rng(5)
    for p in rng.choice(np.arange(4096, n - 4096), 24, replace=False).tolist():
        touched = [p]
        if layout == "transposed":
            r, c = divmod(p, C)  # r >= 1: p >= 4096 = C
            if c == C - 1:  # no element one column on
                continue
            touched.append((r - 1) * C + c + 1)  # earlier in memory, higher flat index
            want = (c, r)  # the view's index of memory position p
        else:
            want = tuple(int(x) for x in np.unravel_index(p, tuple(a.shape)))
        saved = [(af[q].clone(), ef[q].clone()) for q in touched]
        for q in touched:
            ef[q], af[q] = 0.5, 64.5  # exact in both dtypes: |a - e| = 64
        st = vgct_ext.compare(a, e, quantiles=None, dim=dim)
        assert kernel_last.value == 4, f"{layout}: kernel {kernel_last.value}, expected the ring"
        assert st.max_abs_err == 64.0
        assert st.max_abs_err_index == want, f"{layout} {dt}: memory position {p}"
        assert st.worst_mismatch_index == want, f"{layout} {dt}: memory position {p}"
        for q, (x, y) in zip(touched, saved):
            af[q], ef[q] = x, y


@pytest.mark.parametrize("apart", [False, True])
def test_ring_index_rows_wrapping_inside_one_chunk_steps(apart, lean_max, kernel_last):
    """The ring's flat index where a one-chunk-a-lane step (RB 1: float32 pairs, 8 pairs a chunk,
    256-chunk steps) crosses a row end inside most steps (cuda/reduce.cu k_reduce_bulk, VgRowCur):
    rows of 1280 float32 elements are 160 chunks, so a lane's cursor moves 96 columns on a step and
    wraps every few steps (RUN_LAYOUTS' rows of 64-256 chunks divide the 256-chunk step: no wrap
    inside a step; a review of 2026-12-05). The rows back to back (a transposed 2000 x 1280 matrix:
    one run, A.rrun) or 1536 apart (the split copies). At 24 positions drawn at random in memory, a
    largest |a - e| (64, exact): its index must be the position's, the kernel the ring."""
    lean_max.value = 0
    a0, e0 = pair((2000, 1536 if apart else 1280), torch.float32, seed=13)
    a0, e0 = a0[:, :1280], e0[:, :1280]
    a, e = a0.t(), e0.t()  # (1280, 2000): memory rows of 1280, the inner axis
    rng = np.random.default_rng(6)
    for p in rng.choice(2000 * 1280, 24, replace=False).tolist():
        r, c = divmod(p, 1280)
        saved = (a0[r, c].clone(), e0[r, c].clone())
        e0[r, c], a0[r, c] = 0.5, 64.5
        st = vgct_ext.compare(a, e, quantiles=None)
        assert kernel_last.value == 4, f"apart={apart}: kernel {kernel_last.value}, expected the ring"
        assert st.max_abs_err == 64.0 and st.max_abs_err_index == (c, r), f"apart={apart}: position {p}"
        a0[r, c], e0[r, c] = saved


def test_negative_strides_cupy():
    cp = pytest.importorskip("cupy", reason="cupy not installed (negative strides need a producer "
                                            "that makes them; torch has none)")
    rng = cp.random.default_rng(7)
    x = rng.standard_normal((64, 33, 40), dtype=cp.float32)
    y = x + rng.standard_normal((64, 33, 40), dtype=cp.float32) * 1e-3
    for sl in [(slice(None, None, -1),), (slice(None), slice(None, None, -2), slice(None)),
               (slice(None, None, -3), slice(None), slice(None, None, -1))]:
        a, e = x[sl], y[sl]
        for dim in (None, 0, 2):
            try:
                g = vgct_ext.compare(a, e, quantiles=QS, dim=dim)
            except ValueError as exc:
                # cupy 14 on the H200 (2026-11-29) exports x[::-1] of a (64, 33, 40) float32
                # array with strides (2**62 - 1320, 40, 1): its negative byte stride -5280
                # divided by the itemsize as an UNSIGNED 64-bit integer, instead of -1320.
                # The bridge rightly refuses that capsule; the bug is the producer's.
                if "int64 byte range" in str(exc) and "strides (4611686" in str(exc):
                    pytest.xfail(f"cupy's DLPack export of negative strides is malformed: {exc}")
                raise
            an, en = cp.asnumpy(a), cp.asnumpy(e)
            c = vgct_ext.compare(an, en, quantiles=QS, dim=dim)
            assert_same_stats(g, c)
            assert not mismatches_vs_oracle(g, an.astype(np.float64), en.astype(np.float64),
                                            1e-3, 1e-3, QS, dim)
        assert vgct_ext.fingerprint(a) == vgct_ext.fingerprint(cp.asnumpy(a))


def test_latent_slices_every_axis():
    a, e = pair((2, 16, 5, 24, 40), torch.bfloat16, torch.float32)
    for d in range(5):
        check3(a, e, dim=d)


@pytest.mark.parametrize("dt", ["bfloat16", "float32"])
def test_row_mode_slices_of_different_scales(dt, lean_max):
    lean_max.value = 0  # the per-slice gate thresholds live in the fast-path kernels only
    # Row mode (>= 4096 elements per slice): each slice's warps share gate
    # thresholds with that slice's blocks only.  Slices whose differences differ
    # by powers of ten, largest first and largest last: a threshold leaking from
    # another slice would skip a slice's own maximum (per-slice max_abs_err and
    # the whole-tensor maxima are compared bit for bit with the CPU engine).
    t = getattr(torch, dt)
    for order in (1, -1):
        a, e = pair((3, 8, 40000), t, seed=11)
        scale = torch.tensor([10.0 ** (order * -k) for k in range(8)], device=DEV)
        a = (e.double() + (a.double() - e.double()) * scale.view(1, 8, 1)).to(t)
        check3(a, e, dim=1, oracle=False, quantiles=(0.5,))
        check3(a, e, oracle=False, quantiles=(0.5,))


@pytest.mark.parametrize("dt", ["bfloat16", "float32"])
def test_shared_thresholds_reset_between_calls(dt, lean_max):
    lean_max.value = 0  # the shared thresholds live in the fast-path kernels only
    # The gate thresholds a reduce's warps share through the workspace are reset by its
    # last block: a compare with large differences, then one with small differences
    # (other tensors, same device), must give the second its own maxima -- a stale
    # threshold from the first would let its pairs skip them.
    t = getattr(torch, dt)
    a, e = pair((1 << 20,), t, rel=1.0, seed=21)
    check3(a, e, quantiles=(0.5,))
    a2, e2 = pair((1 << 20,), t, rel=1e-4, seed=22)
    check3(a2, e2, quantiles=(0.5,))
    check3(a.view(1024, 1024).t(), e.view(1024, 1024).t(), quantiles=(0.5,))
    check3(a2.view(1024, 1024).t(), e2.view(1024, 1024).t(), quantiles=(0.5,))  # the ring, rows
    check3(a.view(1024, 1024)[:, 3:].t(), e.view(1024, 1024)[:, 3:].t(), quantiles=(0.5,))
    check3(a2.view(1024, 1024)[:, 3:].t(), e2.view(1024, 1024)[:, 3:].t(),
           quantiles=(0.5,))  # the general kernel (rows of 1021: not whole chunks)


@pytest.fixture
def gate_words():
    """The whole-tensor gate words read back after every compare (cuda/select.cu
    vgct_cuda_test_gate_words): a function returning the last three; the hook off after."""
    import ctypes

    from vgct_ext import _C

    h = (ctypes.c_longlong * 4).in_dll(ctypes.CDLL(_C.__file__), "vgct_cuda_test_gate_words")
    h[0] = 1
    yield lambda: (h[1], h[2], h[3])
    h[0], h[1], h[2], h[3] = 0, -1, -1, -1


@pytest.fixture
def blocks_per_sm():
    """The reduce's grid hook (cuda/reduce.cu vgct_cuda_test_bpsm): .value = k aims the fast
    kernels' grids at k blocks an SM (k > 2: several waves); reset to the default after."""
    import ctypes

    from vgct_ext import _C

    h = ctypes.c_longlong.in_dll(ctypes.CDLL(_C.__file__), "vgct_cuda_test_bpsm")
    yield h
    h.value = 0


def test_gate_words_left_zero_after_every_call(lean_max, gate_words, blocks_per_sm, kernel_last,
                                               fuse_hooks):
    """The grid's gate words (cuda/reduce.cu: raised by atomicMax from every warp that falls back,
    read by the others, reset by the last block for the next launch; k_reduce_bulk takes a
    warp's words a step after it asks for them, vg_gate_ask) must read zero after every call,
    whatever the kernel, grid or timing: a word left raised -- an atomic landing after the reset
    -- gates the next call's pairs with this call's maxima, which skips its own (a review of
    2026-12-05 asked for this check; test_shared_thresholds_reset_between_calls sees only a
    leak that changes a result). |a - e| grows with the flat index (every warp raises its maxima
    in its last step, so its last publish is the one in flight at its end), 2^23 pairs: the flat
    ring (bf16, fp32, and a bf16 p99 through the fused window, hook vgct_cuda_test_fuse 5), its
    rows (a transposed matrix), the general kernel (rows of 2045), one block, each asserted by
    the kernel hook; grids of 2 and 8 blocks an SM alternately (8: several waves, blocks ending
    while others run), 40 rounds; every tenth round a small-|d| call after them is checked
    against the CPU engine."""
    lean_max.value = 0
    fuse_off, fuse_last = fuse_hooks
    n = 1 << 23
    ramp = torch.linspace(0.0, 1.0, n, device=DEV, dtype=torch.float64)
    base = torch.randn(n, generator=_gen(GEN_SEED + 91), device=DEV, dtype=torch.float64)
    cases = []  # (name, a, e, quantiles, the kernel hook's value, fused)
    for dt in (torch.bfloat16, torch.float32):
        e = base.to(dt)
        a = (base + ramp * 4.0).to(dt)
        cases.append((f"{dt} flat", a, e, None, 4, False))
        if dt == torch.bfloat16:
            cases.append((f"{dt} flat p99", a, e, (0.99,), 4, True))
        cases.append((f"{dt} transposed", a.view(4096, -1).t(), e.view(4096, -1).t(), None, 4, False))
        cases.append((f"{dt} general", a.view(4096, -1)[:, 3:].t(), e.view(4096, -1)[:, 3:].t(), None, 2,
                      False))
        cases.append((f"{dt} one block", a[:4096], e[:4096], None, 4, False))
    small = pair((1 << 20,), torch.bfloat16, rel=1e-4, seed=92)
    for rnd in range(40):
        blocks_per_sm.value = (0, 8)[rnd % 2]
        for name, a, e, qs, kernel, fused in cases:
            fuse_off.value = 5 if fused else 0
            vgct_ext.compare(a, e, quantiles=qs)
            assert kernel_last.value == kernel, f"{name}: kernel {kernel_last.value}, expected {kernel}"
            assert (fuse_last.value != 0) == fused, f"{name}: fused {fuse_last.value}"
            assert gate_words() == (0, 0, 0), f"round {rnd}, {name}: gate words {gate_words()} left raised"
        if rnd % 10 == 9:
            fuse_off.value = 0
            check3(*small, quantiles=(0.5,), oracle=False)
            assert gate_words() == (0, 0, 0)


@pytest.mark.parametrize("dt", ["bfloat16", "float32"])
def test_polled_thresholds_keep_the_lowest_index_of_a_tied_maximum(dt, lean_max, kernel_last):
    lean_max.value = 0  # the shared thresholds live in the fast-path kernels only
    # The ring kernel's warps take the grid's gate thresholds after steps 0, 1, 3, 7, 15, ...
    # even when none of their chunks fell back (cuda/reduce.cu vg_gate_refresh's poll).
    # Noise of 1e-3 (bf16: rounding ties) with max |a - e| planted as an exact tie: once in
    # the first block's pairs (the lowest index, but reached only in the middle of that
    # block's steps), and early in every other block's pairs, which publish it before.  The
    # polled threshold must still let the first block's warp fold its tie (the exact check
    # at a threshold's own value): max_abs_err_index must name the lowest index, bit for bit
    # the CPU engine's and the oracle's.  No pair mismatches (atol 1) and every planted
    # chunk (8 pairs) has |e| = 1, so only the max |d| threshold guards the tie.  With the
    # H200's grid (257 blocks of 8192 chunks) the low tie sits just after block 0's poll
    # after step 7 (bf16, 16 steps) or 15 (float32, 32 steps); a poll that raised the
    # threshold two float32 units past the grid's (planted in the kernel) failed here for
    # both dtypes (H200, 2026-12-05: index (65557,) for (33091,)), as the host check's gate
    # model does (cuda_host_check.cu check 3).
    n = (1 << 24) + 4096
    g = _gen(GEN_SEED + 31)
    e32 = torch.randn(n, generator=g, device=DEV)
    t = getattr(torch, dt)
    a = (e32 + 1e-3 * torch.randn(n, generator=g, device=DEV)).to(t)
    e = e32.to(t)
    low = 4136 * 8 + 3  # chunk 4136: block 0's step 8 (bf16) or 16 (float32) on an H200
    step = n // 4096  # 4097 pairs: a tie in every 512 chunks from pair 65557 on
    ties = [low] + [j * step + 5 for j in range(16, 4096)]  # all above low
    chunks = torch.tensor(sorted({(i // 8) * 8 + q for i in ties for q in range(8)}), device=DEV)
    e[chunks] = 1.0
    a[chunks] = 1.0
    idx = torch.tensor(ties, device=DEV)
    a[idx] = 1.5  # |d| 0.5 at every tie; the noise's |d| stays below 0.04
    s = check3(a, e, rtol=0.0, atol=1.0, quantiles=(0.5,))
    assert kernel_last.value == 4  # the ring
    assert s.mismatches == 0
    assert s.max_abs_err == 0.5 and s.max_abs_err_index == (low,)


def test_many_slices_column_and_row_modes():
    # column mode with more slices than one launch holds (65536)
    a, e = pair((70001, 3), torch.float32)
    check3(a, e, dim=0, oracle=False)
    # row mode with more slices than one launch holds (16384), >= 4096 elements each
    a, e = pair((16500, 4097), torch.bfloat16, seed=3)
    check3(a, e, dim=0, oracle=False, quantiles=(0.5,))


# ---- values -----------------------------------------------------------------------

@pytest.mark.parametrize("dt", ["bfloat16", "float16", "float32", "float64", "float8_e5m2"])
def test_nan_inf(dt, reduce_mode):
    t = getattr(torch, dt)
    a, e = pair((4096 + 13,), torch.float32)  # plant in fp32, then convert
    a[5], e[5] = float("nan"), float("nan")
    a[17] = float("nan")
    e[40] = float("inf")
    a[41], e[41] = float("inf"), float("inf")
    a[42], e[42] = float("-inf"), float("inf")
    a[4000] = float("-inf")
    a, e = a.to(t), e.to(t)
    check3(a, e)
    check3(a.view(1, -1), e.view(1, -1), dim=1)


def test_edge_values_float64():
    v = torch.tensor([1e300, -1e300, 1e-310, 5e-324, 0.0, -0.0, 3.0, 1.7e300, 2.0],
                     dtype=torch.float64, device=DEV)
    w = torch.tensor([1e300, 1e300, -1e-310, 0.0, -0.0, 0.0, 3.0, -1.7e300, 0.0],
                     dtype=torch.float64, device=DEV)
    check3(v, w)
    check3(w, v)
    # |a - e| overflowing to +Inf (the oracle's fsum cannot take it): GPU == CPU engine
    v2 = torch.tensor([1.7e308, -1.7e308, 1.0], dtype=torch.float64, device=DEV)
    w2 = torch.tensor([-1.7e308, 1.7e308, 2.0], dtype=torch.float64, device=DEV)
    check3(v2, w2, oracle=False)


def test_zero_reference_and_identical():
    a, _ = pair((1000,), torch.float32)
    z = torch.zeros_like(a)
    s = check3(a, z)
    assert s.zero_reference and s.rel_l2 is None
    s = check3(a, a.clone())
    assert s.n_unequal == 0 and s.max_abs_err == 0.0 and s.quantiles[0.99] == 0.0


def test_zero_size():
    a = torch.empty((0, 5), device=DEV, dtype=torch.bfloat16)
    s = vgct_ext.compare(a, a, dim=1)
    c = vgct_ext.compare(a.cpu(), a.cpu(), dim=1)
    assert s.n == 0 and s.n_finite == 0 and s.max_abs_err is None
    assert s.quantiles[0.99] is None
    assert_same_stats(s, c)


@pytest.mark.parametrize("plan", [0, 2])
def test_large_quantiles_compaction_and_ties(plan, sel_hooks):
    # plan 2 (no window plan): n > the select buffer (1.5M keys): level-0 histogram, then
    # compaction; plan 0: the window plan (issue #13)
    sel_hooks.set(plan=plan)
    a, e = pair((3_000_017,), torch.float32, seed=5)
    check3(a, e, quantiles=QS + (0.999, 0.1234))
    # heavy ties: most |d| identical, so a 1/16-octave bucket exceeds the buffer
    g = _gen(11)
    e = torch.randn(3_000_000, generator=g, device=DEV).to(torch.bfloat16)
    a = e.clone()
    m = torch.rand(3_000_000, generator=g, device=DEV) < 0.8
    a[m] = (e[m].float() + 0.5).to(torch.bfloat16)
    check3(a, e, quantiles=QS)


# ---- > 2^31 elements ---------------------------------------------------------------

def test_stride0_more_than_2_31():
    n = 2**31 + 7
    a = torch.tensor([1.5], device=DEV, dtype=torch.float32).expand(n)
    e = torch.tensor([1.0], device=DEV, dtype=torch.float32).expand(n)
    s = vgct_ext.compare(a, e, quantiles=(0.5, 0.99))
    assert s.n == n and s.n_finite == n
    assert s.max_abs_err == 0.5 and s.max_abs_err_index == (0,)
    assert s.mismatches == n and s.n_unequal == n
    assert s.quantiles == {0.5: 0.5, 0.99: 0.5}
    assert rel_close(s.mean_diff, 0.5) and rel_close(s.rel_l2, 0.5)
    assert rel_close(s.norm_expected, math.sqrt(n)) and rel_close(s.cosine, 1.0)


def test_real_tensor_more_than_2_31():
    n = 2**31 + 4099
    free, _ = torch.cuda.mem_get_info(DEV)
    if free < 12 * 2**30:
        pytest.skip(f"needs 12 GiB of free device memory, {free / 2**30:.1f} GiB free")
    g = _gen(13)
    e = torch.randn(n, generator=g, device=DEV, dtype=torch.float32).to(torch.bfloat16)
    a = e.clone()
    far = [2**31 + 1001, 2**31 + 5, 2**31 + 4000, 3]
    vals = [6.0, 6.0, -2.0, 1.0]  # a tie at the top: the lowest index wins
    for i, v in zip(far, vals):
        a[i] = (e[i].float() + v).to(torch.bfloat16)
    s = vgct_ext.compare(a, e, quantiles=(0.99, 1.0), dim=None)
    d = (a[far].double() - e[far].double()).abs()
    top = float(d.max())
    first = min(i for i, x in zip(far, d.tolist()) if x == top)
    assert s.n == n and s.n_finite == n and s.n_unequal == int((d != 0).sum())
    assert s.max_abs_err == top and s.max_abs_err_index == (first,)
    assert s.quantiles[0.99] == 0.0 and s.quantiles[1.0] == top
    sq = sum(float((e[i:i + 2**28].double() ** 2).sum()) for i in range(0, n, 2**28))
    assert rel_close(s.norm_expected, math.sqrt(sq), 1e-10)
    assert rel_close(s.norm_diff, float(d.norm()), 1e-12)
    del a, e
    torch.cuda.empty_cache()


def _sixteen_bit_pair(n, dt, seed):
    """n pairs of float16 / bfloat16 (dt) built from their bits, where counting the unequal pairs and
    min |e| from the 16-bit words could go wrong: subnormals of both signs (pairs one unit apart,
    and equal), +0 against -0, ties, one-unit differences, zeros among small |e| (the max |a - e| /
    |e| bound: min |e| over e != 0), and ordinary values."""
    rng = np.random.default_rng(seed)
    exp_mask, frac_bits = (0x7f80, 7) if dt == "bfloat16" else (0x7c00, 10)
    kind = rng.integers(0, 6, n)
    sign = rng.integers(0, 2, n).astype(np.uint16) << 15
    sub = rng.integers(1, 1 << frac_bits, n).astype(np.uint16)           # subnormal magnitudes
    normal = rng.integers(1 << frac_bits, exp_mask - 1, n).astype(np.uint16)
    e = np.where(kind <= 1, sub, normal) | sign
    e = np.where(kind == 2, sign, e)                                       # zeros of both signs
    step = rng.integers(-1, 2, n).astype(np.int32)                        # -1, 0, +1 units
    a = ((e.astype(np.int32) + np.where(kind == 5, 0, step)) & 0xffff).astype(np.uint16)
    a = np.where(kind == 2, e ^ (rng.integers(0, 2, n).astype(np.uint16) << 15), a)  # +-0 vs +-0
    a = np.where(kind == 3, ((e.astype(np.int32) + 3) & 0xffff).astype(np.uint16), a)
    # keep every element finite (a NaN or Inf chunk is folded by the definition, not the words)
    a = np.where((a & exp_mask) == exp_mask, e, a)
    t = getattr(torch, dt)
    return (torch.from_numpy(a.view(np.int16)).view(t).cuda(),
            torch.from_numpy(e.view(np.int16)).view(t).cuda())


@pytest.mark.parametrize("dt", ["bfloat16", "float16"])
@pytest.mark.parametrize("n", [300007, (1 << 21) + 8 * 7 + 3])
def test_sixteen_bit_pairs_counted_from_their_words(dt, n, lean_max):
    """vg_fast_chunk's 16-bit word path (two float16 or two bfloat16 operands): the unequal pairs
    counted by one HSET2 a word pair (no flush of subnormals: two subnormals one unit apart are
    unequal, +0 and -0 equal) and, for bfloat16, min |e| taken from the words, through the fast kernels (the
    ring above 2^21 pairs, the flat kernel below with the lean kernel off): every field equals the
    CPU engine's and the float64 oracle's -- n_unequal, max |a - e| / |e| and max |e| exactly."""
    lean_max.value = 0
    a, e = _sixteen_bit_pair(n, dt, seed=n % 97)
    g = check3(a, e, quantiles=())
    n_eq = int((to_f64(a.cpu()) == to_f64(e.cpu())).sum())
    assert g.n_unequal == n - n_eq and 0 < n_eq < n


# ---- determinism, streams, devices -------------------------------------------------

def test_bitwise_repeatable():
    a, e = pair((4, 16, 64, 1024), torch.bfloat16, torch.float32)
    ref = None
    for _ in range(10):
        s = vgct_ext.compare(a, e, quantiles=QS, dim=1)
        d = repr(s.as_dict())
        if ref is None:
            ref = d
        assert d == ref


@pytest.mark.parametrize("kernel,per_block", [("lean", 4096), ("fast", 8192)])
@pytest.mark.parametrize("blocks", [2, 31, 32, 33, 255, 256, 257, 264])
def test_last_block_fold_for_every_grid_size(kernel, per_block, blocks, lean_max):
    """The last block's fold of the grid's partials (cuda/reduce.cu vg_reduce_finish): grids of at
    most 256 blocks (the block's records) are copied in and merged field by field (fewer than 32
    partials: lanes with none), larger ones keep the merge a thread.  Grids of 2 .. 264 blocks of
    k_reduce_lean (2 chunks of 8 bf16 pairs a thread) and the fast path (4 a thread, the ring),
    with a ragged end; planted: an exact tie of max |a - e| and of the worst mismatch (|a - e| =
    64, the same |e|) in the middle block and the last one -- the lower flat index must win
    across partials -- the largest |a - e| / |e| in the first block, a NaN pair and an inf pair:
    every field and the quantiles equal the CPU engine's and the float64 oracle's."""
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    if blocks > 2 * sms:  # flat_grid: at most 2 blocks an SM
        pytest.skip(f"a grid of {blocks} blocks needs {blocks // 2 + blocks % 2}+ SMs (have {sms})")
    n = per_block * blocks - 3
    lean_max.value = (1 << 62) if kernel == "lean" else 0
    g = torch.Generator(device=DEV).manual_seed(blocks)
    e32 = torch.randn(n, device=DEV, generator=g)
    a32 = e32 + 1e-2 * torch.randn(n, device=DEV, generator=g)
    mid, last = (blocks // 2) * per_block + 17, n - 5
    e32[mid] = e32[last] = 0.5  # bf16-exact: |a - e| = 64 and the same tolerance at both
    a32[mid] = a32[last] = 64.5
    e32[9], a32[9] = 1e-6, 3.0  # the largest |a - e| / |e| (~3e6), its |a - e| below 64
    a32[(blocks // 3) * per_block + 1] = float("nan")
    e32[n - 2] = float("inf")
    a, e = a32.to(torch.bfloat16), e32.to(torch.bfloat16)
    st = check3(a, e, quantiles=(0.5, 0.99))
    assert st.max_abs_err == 64.0 and st.max_abs_err_index == (mid,)
    assert st.worst_mismatch_index == (mid,) and st.max_rel_err_index == (9,)
    assert (st.nan_actual, st.posinf_expected, st.n_finite) == (1, 1, n - 2)


@pytest.mark.parametrize("dt", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("n", [4096 + 13, (1 << 24) + 3])
def test_lean_last_flush_fresh_and_used_records(dt, n, lean_max):
    """k_reduce_lean's last flush (cuda/reduce.cu vg_lean_flush_last): a thread's register record
    is stored as it is only into a record nothing was folded into (vg_lean_store_fresh), else merged.
    Forced lean, typed pairs: at 4109 pairs each thread has at most 2 chunks of 8 (no flush
    before the last); at 2^24 + 3 the threads of every full block have 32 on a 132-SM H200
    (flushes after 128 pairs: their last flush merges). Planted: thread 3's first two chunks all
    NaN (at 4109 pairs its record only counts, its registers hold nothing), a NaN as the very first
    pair of thread 0 (its record used before any finite pair), an inf as the third pair of thread
    4 (a record used between register pairs), a tie of max |a - e| and of the worst mismatch in two
    threads of one warp (the lower index wins) -- every field and the quantiles equal the CPU
    engine's and the float64 oracle's (a store over a used record would lose its NaN and inf
    counts, a merge into a fresh one nothing)."""
    lean_max.value = 1 << 62
    t = getattr(torch, dt)
    g = torch.Generator(device=DEV).manual_seed(n % 1000)
    e32 = torch.randn(n, device=DEV, generator=g)
    a32 = e32 + 1e-2 * torch.randn(n, device=DEV, generator=g)
    a32[0] = float("nan")  # thread 0's first pair
    a32[3 * 8:4 * 8] = float("nan")  # thread 3's first chunk ...
    a32[259 * 8:260 * 8] = float("nan")  # ... and its second (at 4109 pairs: 2 blocks of 512 chunks)
    e32[4 * 8 + 2] = float("inf")  # thread 4's first chunk, its third pair
    e32[10 * 8 + 5] = e32[12 * 8 + 1] = 0.5  # one warp, two threads: |a - e| = 64 at both
    a32[10 * 8 + 5] = a32[12 * 8 + 1] = 64.5
    a, e = a32.to(t), e32.to(t)
    st = check3(a, e, quantiles=(0.5, 0.99))
    assert st.max_abs_err == 64.0 and st.max_abs_err_index == (10 * 8 + 5,)
    assert st.worst_mismatch_index == (10 * 8 + 5,)
    n_nan = 1 + 8 + 8
    assert (st.nan_actual, st.posinf_expected, st.n_finite) == (n_nan, 1, n - n_nan - 1)


@pytest.fixture
def mapped_hook():
    """The result record's destination hook (cuda/reduce.cu vgct_cuda_test_mapped): 1 = the
    device workspace and a copy back, 0 (default) = the mapped pinned buffer; reset after."""
    import ctypes

    from vgct_ext import _C

    h = ctypes.c_longlong.in_dll(ctypes.CDLL(_C.__file__), "vgct_cuda_test_mapped")
    yield h
    h.value = 0


MAPPED_CASES = [  # (dtype a, dtype e, shape, lean hook, layout): the kernel that writes the record
    ("bfloat16", None, (1000,), 1 << 62, "contiguous"),  # k_reduce_lean, one block
    ("float16", "float32", (257, 129), 1 << 62, "contiguous"),  # k_reduce_lean, several blocks
    ("bfloat16", None, (1 << 22,), 0, "contiguous"),  # k_reduce_bulk (the ring)
    ("bfloat16", None, (70001,), 0, "misaligned"),  # k_reduce_flat (x[1:]: no ring)
    ("float32", None, (300, 257), 0, "transposed"),  # k_reduce_gen
    ("float64", None, (4099,), 0, "contiguous"),  # the scaled kernel
    ("int32", "int64", (5000,), 0, "contiguous"),  # the generic-dtype kernel
]


def _two_records(dt_a, dt_e, shape, layout, seed):
    """Inputs P = a and Q = b against one reference e, with different records (a NaN and a large
    difference planted in P; Q the reference shifted by one, or every 7th integer by 3), laid out
    as `layout` says ("contiguous", "misaligned": x[1:], "transposed": x.t())."""
    a, e = pair(shape, getattr(torch, dt_a), getattr(torch, dt_e) if dt_e else None, seed=seed)
    if a.dtype.is_floating_point:
        fa = a.view(-1)
        fa[7] = float("nan")
        fa[-2] = fa[-2] + 8
    b = e.to(a.dtype) + (1 if a.dtype.is_floating_point else 0)
    if not a.dtype.is_floating_point:
        b[::7] += 3
    if layout == "misaligned":
        a, b, e = a[1:], b[1:], e[1:]
    elif layout == "transposed":
        a, b, e = a.t(), b.t(), e.t()
    return a, b, e


@pytest.mark.parametrize("dt_a,dt_e,shape,lean,layout", MAPPED_CASES)
def test_result_record_mapped_equals_copied(dt_a, dt_e, shape, lean, layout, mapped_hook, lean_max):
    """The reduction's result record written straight into the mapped pinned buffer equals the one
    the device workspace + cudaMemcpyAsync delivers, bit for bit, on every reduce kernel; each call
    == the CPU engine == the float64 oracle (check3).  Two inputs P and Q with different records
    alternate so that every mapped call follows a copied call on the OTHER input: a record left
    unwritten (the buffer still holding the previous call's) fails check3 and the equalities.  No
    quantiles: nothing else writes the pinned buffer between the reduction and its read."""
    a, b, e = _two_records(dt_a, dt_e, shape, layout, seed=41)
    lean_max.value = lean
    seen = {"P": set(), "Q": set()}
    for mode, which in ((1, "Q"), (0, "P"), (1, "P"), (0, "Q"), (1, "Q"), (0, "P")):
        mapped_hook.value = mode
        g = check3(a if which == "P" else b, e, quantiles=())
        seen[which].add(repr(g.as_dict()))
    assert len(seen["P"]) == 1 and len(seen["Q"]) == 1, seen
    assert seen["P"] != seen["Q"]


_MAPPED_TRACE_CHILD = r"""
import ctypes, sys
import torch, vgct_ext
hook = ctypes.c_longlong.in_dll(ctypes.CDLL(vgct_ext._C.__file__), "vgct_cuda_test_mapped")
a = torch.randn(4096, device="cuda")
for mode in (0, 1, 0):
    hook.value = mode
    vgct_ext.compare(a, a + 1e-3, quantiles=())
    torch.cuda.synchronize()
    print(f"=== mode {mode}", file=sys.stderr, flush=True)
"""


def test_result_record_mapped_path_is_the_default():
    """The copy-free path is the one that runs by default: with VGCT_CUDA_TRACE=1 (read once per
    process, hence a child) each entry point prints its host steps; the reduction's "memcpy" step
    appears only when the hook forces the copy back."""
    import os
    import re
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _MAPPED_TRACE_CHILD], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "VGCT_CUDA_TRACE": "1"})
    assert r.returncode == 0, r.stderr
    parts = re.split(r"=== mode \d\n", r.stderr)[:3]
    traces = [[ln for ln in part.splitlines() if " trace (us):" in ln] for part in parts]
    assert all(traces), r.stderr
    copied = [any(re.search(r" memcpy \d", ln) for ln in t) for t in traces]
    assert copied == [False, True, False], r.stderr


@pytest.fixture
def signal_hook():
    """The reduction's completion-word hook (cuda/reduce.cu vgct_cuda_test_signal): 0 (default) the
    host reads the word the last block writes, 1 it synchronises the stream instead, 2 it waits for a
    word no kernel is asked to write (a planted fault); reset after."""
    import ctypes

    from vgct_ext import _C

    h = ctypes.c_longlong.in_dll(ctypes.CDLL(_C.__file__), "vgct_cuda_test_signal")
    yield h
    h.value = 0


SIGNAL_CASES = MAPPED_CASES + [
    ("bfloat16", None, (1 << 22,), 1 << 62, "contiguous"),  # VG_SIGNAL_MAX: the word, lean kernel
    ("bfloat16", None, ((1 << 22) + 8,), 0, "contiguous"),  # above it: synchronised either way
]


@pytest.mark.parametrize("dt_a,dt_e,shape,lean,layout", SIGNAL_CASES)
def test_completion_word_equals_synchronising(dt_a, dt_e, shape, lean, layout, signal_hook, lean_max):
    """The host learning of the reduction's end from the word its last block writes (CallCtx::
    wait_signal) gives the record the stream's synchronisation gives, bit for bit, on every reduce
    kernel; each call == the CPU engine == the float64 oracle (check3); one host round trip a call
    either way. As in the mapped-record test, two inputs P and Q alternate so that a record read
    before the kernel wrote it (the previous call's, on the other input) fails; and once the stream
    is kept busy (torch.cuda._sleep, ~10 ms) before the reduction, so the wait outlasts its spin
    (VG_SPIN_US, cuda/runtime.cu) and ends in the driver's synchronisation, then reads the word."""
    a, b, e = _two_records(dt_a, dt_e, shape, layout, seed=43)
    lean_max.value = lean
    syncs = _sync_hooks()[0]
    seen = {"P": set(), "Q": set()}
    for i, (mode, which) in enumerate(((1, "Q"), (0, "P"), (1, "P"), (0, "Q"), (1, "Q"), (0, "P"))):
        signal_hook.value = mode
        if i == 3:
            torch.cuda._sleep(20_000_000)  # the stream busy for a while before the reduction
        before = syncs.value
        g = vgct_ext.compare(a if which == "P" else b, e, quantiles=())
        assert syncs.value == before + 1, (mode, syncs.value - before)
        seen[which].add(repr(g.as_dict()))
        check3(a if which == "P" else b, e, quantiles=())
    assert len(seen["P"]) == 1 and len(seen["Q"]) == 1, seen
    assert seen["P"] != seen["Q"]


@pytest.mark.parametrize("dt_a,dt_e,shape,lean,layout", SIGNAL_CASES)
def test_completion_word_never_written_is_an_error_not_a_hang(dt_a, dt_e, shape, lean, layout, signal_hook,
                                                              lean_max):
    """Planted: the host waits for a completion word the kernel is not asked to write (hook 2). On every
    reduce kernel of at most VG_SIGNAL_MAX = 2^22 pairs -- the calls that must take the word's way --
    the wait must end (the stream found finished without the word) in a RuntimeError naming the
    completion word, within seconds, and the next call must be right; above 2^22 pairs the call
    synchronises, so the planted fault cannot touch it."""
    import time

    a, _, e = _two_records(dt_a, dt_e, shape, layout, seed=44)
    lean_max.value = lean
    signal_hook.value = 2
    t0 = time.perf_counter()
    if a.numel() <= 1 << 22:
        with pytest.raises(RuntimeError, match="completion word .the stream finished without it"):
            vgct_ext.compare(a, e, quantiles=())
        assert time.perf_counter() - t0 < 30
    else:
        check3(a, e, quantiles=())
    signal_hook.value = 0
    check3(a, e, quantiles=(0.5,))


def test_completion_word_from_threads_on_their_own_streams():
    """Eight threads, each on its own stream with its own input (one block, several blocks, the
    ring), 30 calls each, at once: every call's record equals that input's record computed alone
    (the completion word and its sequence number are the device workspace's, taken under its lock:
    a word read for another call's kernel would hand over a record not yet written)."""
    inputs = []
    for k in range(8):
        n = (1000, 70_000, 1 << 20, 3 << 20)[k % 4] + k
        a, e = pair((n,), torch.bfloat16 if k % 2 else torch.float32, seed=50 + k)
        inputs.append((a, e, repr(check3(a, e, quantiles=()).as_dict())))
    _same_from_threads_on_own_streams(
        inputs, lambda a, e: repr(vgct_ext.compare(a, e, quantiles=()).as_dict()))


def _same_from_threads_on_own_streams(inputs, call, calls=30):
    """One thread per (a, e, want) of `inputs`, each on its own stream, `calls` calls of call(a, e)
    each, all at once: every result must equal its `want`."""
    import threading

    torch.cuda.synchronize()
    bad, errors = [], []

    def work(k):
        try:
            a, e, want = inputs[k]
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.default_stream())
            with torch.cuda.stream(s):
                for _ in range(calls):
                    if call(a, e) != want:
                        bad.append(k)
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and not bad, (errors, bad)


def test_producer_on_side_stream():
    """The input is written on a side stream right before compare: compare runs on torch's
    current stream (the shim passes it to __dlpack__), so it sees the new values."""
    n = 1 << 24
    e = torch.ones(n, device=DEV, dtype=torch.float32)
    a = torch.empty(n, device=DEV, dtype=torch.float32)
    big = torch.randn(4096, 4096, device=DEV)
    side = torch.cuda.Stream(device=DEV)
    torch.cuda.synchronize(DEV)
    for k in range(5):
        with torch.cuda.stream(side):
            for _ in range(8):  # keep the side stream busy for a while
                big = big @ big
                big = big / big.norm()
            a.fill_(float(k + 2))
            s = vgct_ext.compare(a, e, quantiles=(0.5,))
        assert s.max_abs_err == float(k + 1) and s.quantiles[0.5] == float(k + 1), k
        # producer on the side stream, consumer on the default stream after wait_stream
        with torch.cuda.stream(side):
            big = big @ big
            a.fill_(float(k + 10))
        torch.cuda.current_stream(DEV).wait_stream(side)
        s = vgct_ext.compare(a, e)
        assert s.max_abs_err == float(k + 9), k


def test_cross_device():
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 CUDA devices (have {torch.cuda.device_count()})")
    torch.cuda.set_device(0)
    d1 = torch.device("cuda", 1)
    a, e = pair((33, 1001), torch.bfloat16, torch.float32)
    a1, e1 = a.to(d1), e.to(d1)
    s = vgct_ext.compare(a1, e1, quantiles=QS, dim=0)  # tensors on cuda:1, cuda:0 current
    assert torch.cuda.current_device() == 0
    assert s.device == "cuda:1"
    assert_same_stats(s, vgct_ext.compare(a.cpu(), e.cpu(), quantiles=QS, dim=0))
    assert vgct_ext.fingerprint(a1) == vgct_ext.fingerprint(a.cpu())
    assert torch.cuda.current_device() == 0


def test_next_call_clean_after_an_error():
    a, e = pair((100,), torch.float32)
    with pytest.raises(ValueError):
        vgct_ext.compare(a, e[:50])
    check3(a, e)


# ---- fingerprint -------------------------------------------------------------------

@pytest.mark.parametrize("dt", ALL_DTYPES)
def test_fingerprint_gpu_equals_cpu(dt):
    a, _ = pair((19, 4, 67), getattr(torch, dt))
    views = [a, a.transpose(0, 2), a[:, 1:, ::2], a.reshape(-1)[1:],
             a[:1].expand(5, 4, 67)]
    for v in views:
        assert vgct_ext.fingerprint(v) == vgct_ext.fingerprint(v.cpu()), tuple(v.stride())
        assert vgct_ext.fingerprint(v) == vgct_ext.fingerprint(v.contiguous())
    z = torch.empty((0, 3), device=DEV, dtype=a.dtype)
    assert vgct_ext.fingerprint(z) == vgct_ext.fingerprint(z.cpu())


def test_build_info_reports_the_device():
    info = vgct_ext.build_info()
    assert info["cuda_compiled"] and info["cuda_device_count"] >= 1
    assert info["cuda_driver_version"] > 0


# ---- issue #12: exact integer pairs, quantiles at +inf, Ctrl-C between launches --------------

def _int_edges(dt, n, seed):
    rng = np.random.default_rng(seed)
    info = np.iinfo(dt)
    v = rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
    edges = [info.min, info.max, 0, 1] + ([2**53, 2**53 + 1, 2**62 + 1] if info.max > 2**53 else [])
    v[: len(edges)] = np.array(edges, dtype=object).astype(dt)
    return v


@pytest.mark.parametrize("dt_a,dt_e", [("int64", "int64"), ("int64", "uint64"), ("uint64", "uint64"),
                                       ("int64", "int8"), ("uint32", "int64")])
@pytest.mark.parametrize("layout", ["contiguous", "strided", "slices0", "slices1"])
def test_integer_pairs_exact_on_gpu(dt_a, dt_e, layout):
    """The generic GPU kernels fold integer pairs with vgct_int_pair (csrc/vgct_stats.h): the same
    exact comparison as the CPU engine (docs/metrics.md, "Integer pairs"), against the Fraction
    oracle of test_stats_oracle."""
    from test_stats_oracle import _int_oracle

    n = 3 * 4099
    a = _int_edges(dt_a, n, 1)
    e = _int_edges(dt_e, n, 2)
    near = np.arange(0, n, 3)
    e[near] = np.clip(a[near].astype(object) + 1, np.iinfo(dt_e).min, np.iinfo(dt_e).max).astype(dt_e)
    a2, e2 = a.reshape(3, 4099), e.reshape(3, 4099)
    if layout == "strided":
        a2, e2 = a2[:, ::2], e2[:, ::-2]
    kw = dict(quantiles=(0.0, 0.5, 0.99, 1.0), rtol=2.0 ** -20, atol=3.0)
    if layout.startswith("slices"):
        kw["dim"] = int(layout[-1])
    ta = torch.from_numpy(np.ascontiguousarray(a2)).to(DEV)
    te = torch.from_numpy(np.ascontiguousarray(e2)).to(DEV)
    if layout == "strided":
        ta, te = torch.from_numpy(a.reshape(3, 4099)).to(DEV)[:, ::2], \
            torch.from_numpy(e.reshape(3, 4099)[:, ::-1].copy()).to(DEV)[:, ::2]
        a2, e2 = ta.cpu().numpy(), te.cpu().numpy()
    g = vgct_ext.compare(ta, te, **kw)
    c = vgct_ext.compare(a2, e2, **kw)
    assert_same_stats(g, c)
    o = _int_oracle(a2, e2, kw["rtol"], kw["atol"], kw["quantiles"])
    assert (g.n_unequal, g.mismatches, g.max_abs_err) == (o["n_unequal"], o["mismatches"], o["max_abs_err"])
    assert dict(g.quantiles) == o["quantiles"]
    assert np.ravel_multi_index(g.max_abs_err_index, a2.shape) == o["max_abs_err_index"]


def test_integer_issue_example_on_gpu():
    g = vgct_ext.compare(torch.tensor([2**53 + 1, 2**62 + 1], device=DEV),
                         torch.tensor([2**53, 2**62], device=DEV), rtol=0, atol=0)
    assert (g.max_abs_err, g.mismatches, g.n_unequal) == (1.0, 2, 2)


def test_quantile_limit_at_an_infinite_order_statistic_on_gpu():
    a = torch.tensor([1.7e308, 1.0], dtype=torch.float64, device=DEV)
    e = torch.tensor([-1.7e308, 1.0], dtype=torch.float64, device=DEV)
    g = vgct_ext.compare(a, e, quantiles=(0.0, 0.5, 1.0))
    assert g.quantiles == {0.0: 0.0, 0.5: math.inf, 1.0: math.inf} and g.max_abs_err == math.inf
    # the float64 oracle itself overflows on d = 3.4e308 (rel_l2, mean_diff): GPU == CPU engine only
    check3(a, e, quantiles=(0.0, 0.5, 1.0), oracle=False)


_GPU_INTERRUPT_CHILD = r"""
import json, os, signal, sys, threading, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # as test_bridge.py's child: never ignored
import torch, vgct_ext
mode = sys.argv[1]
dev = torch.device("cuda", torch.cuda.current_device())
def make(log2n):  # stride-0 rows: long work on little memory
    rows = 1 << 16  # dim=0: 65536 slices, launched in chunks
    cols = (1 << log2n) // rows
    a = torch.randn(1, cols, device=dev).expand(rows, cols)
    e = torch.zeros(1, cols, device=dev).expand(rows, cols)
    return a, e
kw = dict(dim=0, quantiles=()) if mode == "slices" else dict(quantiles=tuple(i / 64 for i in range(64)))
log2n = 30
while True:  # grow until one compare takes >= 3 s
    a, e = make(log2n)
    t = time.perf_counter(); vgct_ext.compare(a, e, **kw); torch.cuda.synchronize()
    if time.perf_counter() - t >= 3.0 or log2n >= 44:
        break
    log2n += 2
sent = []
def fire():
    sent.append(time.perf_counter()); os.kill(os.getpid(), signal.SIGINT)
threading.Timer(1.0, fire).start()
try:
    vgct_ext.compare(a, e, **kw)
    print(json.dumps({"finished": True, "log2n": log2n}))
except KeyboardInterrupt:
    late = time.perf_counter() - sent[0]
    x = torch.arange(1000, dtype=torch.float32, device=dev)
    s = vgct_ext.compare(x, torch.zeros_like(x), quantiles=(0.5,), dim=0)
    print(json.dumps({"delay": late, "log2n": log2n, "again_ok": s.quantiles[0.5] == 499.5 and s.max_abs_err == 999.0}))
"""


@pytest.mark.parametrize("mode", ["slices", "quantiles"])
def test_ctrl_c_between_gpu_launches(mode):
    """SIGINT during a long GPU compare (chunked slice launches; batches of selection ranks)
    raises KeyboardInterrupt within 0.5 s of the signal, and the process compares again."""
    import json
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _GPU_INTERRUPT_CHILD, mode], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert "delay" in out, out
    assert out["delay"] < 0.5 and out["again_ok"], out


# ---- issue #13: the window plan of the exact selection (cuda/select.cu) ----------------------
#
# The plan is chosen by n (windows above SEL_CAP = 1.5M pairs, store-all up to it); the test hooks of
# cuda/select.cu (ctypes on vgct_ext._C: vgct_cuda_test_sel, vgct_cuda_test_sel_last) force each
# plan at small n and report which ran, so every path is checked on small, fast inputs against
# the CPU engine and the float64 np.quantile oracle (check3).

QW = (0.0, 0.001, 0.5, 0.501, 0.99, 0.999, 1.0)  # 0.0/0.001, 0.5/0.501, 0.99/0.999: overlapping windows
SEL_LAST = ("windows", "at_pivots", "in_stored", "overflowed", "radix_ranks", "radix_plan")


def _sel_hooks():
    import ctypes

    from vgct_ext import _C

    lib = ctypes.CDLL(_C.__file__)
    return ((ctypes.c_longlong * 4).in_dll(lib, "vgct_cuda_test_sel"),
            (ctypes.c_longlong * 6).in_dll(lib, "vgct_cuda_test_sel_last"))


def _known_hooks():
    """(knob, last) of cuda/select.cu: vgct_cuda_test_known (1 = every rank to the selection, 0 =
    the reduction's record answers the ranks it decides) and vgct_cuda_test_known_last ([ranks the
    record answered, ranks selected] of the last compare)."""
    import ctypes

    from vgct_ext import _C

    lib = ctypes.CDLL(_C.__file__)
    return (ctypes.c_longlong.in_dll(lib, "vgct_cuda_test_known"),
            (ctypes.c_longlong * 2).in_dll(lib, "vgct_cuda_test_known_last"))


@pytest.fixture
def selection_only():
    """Every rank to the selection while the test runs (its plans are what it checks: an identical
    pair or q = 1 would otherwise be answered by the reduction's record); back on after."""
    knob, _ = _known_hooks()
    knob.value = 1
    yield
    knob.value = 0


@pytest.fixture
def sel_hooks(selection_only):
    """The selection's test hooks: set(plan, sample, cap, shift) and last() -> dict; zeroed after."""
    knobs, last = _sel_hooks()

    class Hooks:
        @staticmethod
        def set(plan=0, sample=0, cap=0, shift=0):
            knobs[0], knobs[1], knobs[2], knobs[3] = plan, sample, cap, shift

        @staticmethod
        def last():
            return dict(zip(SEL_LAST, list(last)))

    yield Hooks
    for i in range(4):
        knobs[i] = 0


def _window_case(kind, n, seed=0):
    """GPU tensors (actual, expected) of n pairs with the |d| distribution `kind`."""
    g = _gen(GEN_SEED + 100 + seed)
    e32 = torch.randn(n, generator=g, device=DEV)
    noise = torch.randn(n, generator=g, device=DEV)
    if kind == "bf16_rounding":  # |d|: 0 or a few bf16 ulps: a handful of values, huge ties
        return (e32 + 1e-3 * noise).to(torch.bfloat16), e32.to(torch.bfloat16)
    if kind == "identical":
        return e32.clone(), e32
    if kind == "offset":  # fp32 e + 0.25: |d| 0.25 up to float32 rounding, few distinct values
        return e32 + 0.25, e32
    if kind == "cauchy":
        u = torch.rand(n, generator=g, device=DEV, dtype=torch.float64)
        return (e32.double() + 1e-3 * torch.tan(math.pi * (u - 0.5))).float(), e32
    if kind == "outliers":
        a = e32 + 1e-3 * noise
        a[torch.tensor([3, n // 2, n - 1], device=DEV)] = torch.tensor([1e30, -3e38, 7e20], device=DEV)
        return a, e32
    if kind == "nan_inf":
        a = e32 + 1e-3 * noise
        k = torch.rand(n, generator=g, device=DEV)
        a[k < 0.02] = float("nan")
        a[(k >= 0.02) & (k < 0.03)] = float("inf")
        e = e32.clone()
        e[(k >= 0.03) & (k < 0.035)] = float("-inf")
        return a, e
    if kind == "noise_fp32":
        return e32 + 1e-3 * noise, e32
    if kind == "sparse":  # a caching feature: ~1.1% of the pairs changed, the rest identical --
        # the p99 window's lo at 0 (the keys of 0 counted by number, the others keyed)
        a = e32.clone()
        k = torch.rand(n, generator=g, device=DEV) < 0.011
        a[k] += 1e-2 * noise[k]
        return a, e32
    if kind == "f32_overflow":  # 1% of the pairs (3e38, -3e38): finite, |d| overflows float32
        a = e32 + 1e-3 * noise
        e = e32.clone()
        k = torch.rand(n, generator=g, device=DEV) < 0.01
        a[k], e[k] = 3e38, -3e38
        return a, e
    raise ValueError(kind)


WINDOW_KINDS = ["bf16_rounding", "identical", "offset", "cauchy", "outliers", "nan_inf", "noise_fp32",
                "f32_overflow", "sparse"]


@pytest.mark.parametrize("kind", WINDOW_KINDS)
def test_window_plan_every_distribution(kind, sel_hooks):
    """The window plan forced at 2^17 pairs (sample of 2^14 keys in evenly spaced runs) answers
    every rank from its windows -- ties at the pivots, the rest from the stored keys -- exactly:
    GPU == CPU engine == np.quantile on float64."""
    a, e = _window_case(kind, 1 << 17)
    sel_hooks.set(plan=1)
    check3(a, e, quantiles=QW)
    last = sel_hooks.last()
    assert last["windows"] >= 3 and last["overflowed"] == 0, last
    assert last["radix_ranks"] == 0 and last["at_pivots"] + last["in_stored"] >= 1, last
    if kind in ("identical", "offset", "bf16_rounding"):  # ties: the pivots answer
        assert last["at_pivots"] >= 1, last


@pytest.mark.parametrize("layout", ["transposed", "strided", "mixed_bf16_fp32", "full_sample",
                                    "float64", "float64_strided"])
def test_window_plan_layouts_and_dtypes(layout, sel_hooks):
    """Non-contiguous inputs (element loads, the generic chunk walk, partial chunks), bf16 against
    fp32, an input smaller than the sample (every chunk sampled), and float64 pairs (the window
    pass makes every key first: no float32 chunk test) through the window plan."""
    a, e = _window_case("noise_fp32", 1 << 17, seed=1)
    if layout == "transposed":  # a's memory order differs from e's: no unit inner stride for both
        a, e = a.view(-1, 512).t(), e.view(512, -1)
    elif layout == "strided":
        a, e = a.view(256, -1)[:, ::3], e.view(256, -1)[:, 1::3]
    elif layout == "mixed_bf16_fp32":
        a = a.to(torch.bfloat16)
    elif layout == "float64":
        a, e = a.double(), e.double()
    elif layout == "float64_strided":
        a, e = a.double().view(256, -1)[:, ::3], e.double().view(256, -1)[:, 1::3]
    else:
        a, e = a[:3001], e[:3001]
    sel_hooks.set(plan=1)
    check3(a, e, quantiles=QW)
    last = sel_hooks.last()
    assert last["windows"] >= 3 and last["radix_ranks"] == 0, last


def test_window_plan_int64_pairs_exact(sel_hooks):
    """int64 pairs (exact integer keys, vgct_absdiff_key_at) through the window plan: the
    quantiles equal the exact integer oracle and the CPU engine."""
    from test_stats_oracle import _int_oracle

    n = 5 * 4099
    a = _int_edges("int64", n, 3)
    e = _int_edges("int64", n, 4)
    near = np.arange(0, n, 2)
    k = np.arange(near.size, dtype=np.int64) % 7  # many small |d| and ties, plus the huge edges
    e[near] = np.where(a[near] > 0, a[near] - k, a[near] + k)
    qs = (0.0, 0.25, 0.5, 0.99, 1.0)
    sel_hooks.set(plan=1, sample=1024)
    g = vgct_ext.compare(torch.from_numpy(a).to(DEV), torch.from_numpy(e).to(DEV), quantiles=qs)
    last = sel_hooks.last()
    assert last["windows"] >= 1, last
    assert dict(g.quantiles) == _int_oracle(a, e, 1e-3, 1e-3, qs)["quantiles"]
    assert_same_stats(g, vgct_ext.compare(a, e, quantiles=qs))


@pytest.mark.parametrize("shift", [1 << 12, -(1 << 12), 1 << 30])
def test_window_plan_planted_misprediction_falls_back(shift, sel_hooks):
    """Planted fault: every window's sample ranks moved by `shift` (above or below the true
    quantiles, or to the very top).  Ranks no window covers go to the radix path: the values are
    still exact, and the hooks show the fallback ran."""
    a, e = _window_case("noise_fp32", 1 << 17, seed=2)
    sel_hooks.set(plan=1, shift=shift)
    check3(a, e, quantiles=(0.25, 0.5, 0.99))
    last = sel_hooks.last()
    assert last["windows"] >= 1 and last["radix_ranks"] >= 2, last
    assert last["radix_plan"] == 1, last  # n <= the buffer: the fallback is store-all


def test_window_plan_overflow_falls_back(sel_hooks):
    """Planted fault: windows of 8 keys (far fewer than the keys inside them): every window
    overflows, and every rank is answered exactly by the radix path -- the data-histogram one, n
    being above the store-all buffer (1.6M pairs > 1.5M keys)."""
    a, e = _window_case("noise_fp32", 1_600_000, seed=3)
    sel_hooks.set(plan=1, cap=8)
    check3(a, e, quantiles=(0.5, 0.99), oracle=False)
    last = sel_hooks.last()
    assert last["windows"] >= 1 and last["overflowed"] == last["windows"], last
    assert last["radix_ranks"] == 4 and last["radix_plan"] == 2, last
    # the same inputs with the windows intact: nothing left to the radix path
    sel_hooks.set(plan=1)
    check3(a, e, quantiles=(0.5, 0.99), oracle=False)
    assert sel_hooks.last()["radix_ranks"] == 0


def test_window_plan_tiny_sample_still_exact(sel_hooks):
    """A 256-key sample (one run of 32 chunks): its windows are wide or wrong; whatever they
    cover is exact and the rest falls back."""
    a, e = _window_case("cauchy", 1 << 17, seed=4)
    sel_hooks.set(plan=1, sample=256)
    check3(a, e, quantiles=QW)
    assert sel_hooks.last()["windows"] >= 1


@pytest.mark.parametrize("plan,expect", [(0, 4), (2, 1), (3, 2)])
def test_small_n_plans(plan, expect, sel_hooks):
    """Past TINY_PREFER up to SEL_CAP (1.5M) pairs the automatic plan is k_sel_coop chained behind the
    reduction (4), where its grid holds the keys (2^16 pairs: 32 blocks); plan 2 (no window plan,
    no k_sel_coop) is store-all (no window pass, the data pass on every SM); plan 3 forces the
    data-histogram path at small n.  All exact."""
    from vgct_ext import _C

    n = 1 << 16
    a, e = _window_case("bf16_rounding", n, seed=5)
    sel_hooks.set(plan=plan)
    check3(a, e, quantiles=QW)
    last = sel_hooks.last()
    distinct = len({r for lo_hi in _C.quantile_ranks(n, QW) for r in lo_hi})
    assert last["windows"] == 0 and last["radix_plan"] == expect, last
    assert last["radix_ranks"] == distinct, (last, distinct)


@pytest.mark.parametrize("kind", ["bf16_rounding", "noise_fp32"])
def test_window_plan_is_automatic_above_sel_cap(kind, sel_hooks):
    """Above SEL_CAP (1.5M) pairs the window plan runs without any hook, and answers p99 by
    itself."""
    a, e = _window_case(kind, (3 << 19) + 12345, seed=6)
    check3(a, e, quantiles=(0.5, 0.99, 0.999))
    last = sel_hooks.last()
    assert last["windows"] >= 1 and last["radix_ranks"] == 0, last


@pytest.fixture
def cbuf_hooks(sel_hooks):
    """(knob, last) of cuda/select.cu: vgct_cuda_test_cbuf (1 = no k_sel_cbuf: the histogram levels
    and the finish, as before it; 2 = every launch of it refused, as a device that cannot hold the
    grid refuses it) and vgct_cuda_test_cbuf_last ([k_sel_cbuf's launches for the window plan's
    sample, its window batches by k_sel_cbuf] in the last call); the knob back to 0 after."""
    import ctypes

    from vgct_ext import _C

    lib = ctypes.CDLL(_C.__file__)
    knob = ctypes.c_longlong.in_dll(lib, "vgct_cuda_test_cbuf")
    last = (ctypes.c_longlong * 2).in_dll(lib, "vgct_cuda_test_cbuf_last")
    knob.value = 0
    yield knob, last
    knob.value = 0


@pytest.mark.parametrize("kind", ["noise_fp32", "cauchy", "bf16_rounding", "nan_inf", "outliers",
                                  "offset"])
def test_window_plan_cooperative_selections(kind, sel_hooks, cbuf_hooks):
    """The window plan at 2^22 pairs (automatic: above SEL_CAP) selects the sample's order statistics,
    and every window region of more than FIN_CAP stored keys, with one cooperative grid each
    (k_sel_cbuf: coop_select over the buffer's keys) instead of the histogram levels and the finish:
    GPU == CPU engine == float64 oracle, and == the same call with k_sel_cbuf off -- the same windows
    (the sample's order statistics decide them: window 0's counts below, at and between its bounds
    the same, and the same ranks answered at the pivots and inside), the quantiles bit for bit.  The noisy kinds store ~51K keys a p99 window: their regions take the grid;
    non-finite keys (nan_inf) are not counted; ties (bf16 rounding, an offset) are answered at the
    pivots."""
    knob, last = cbuf_hooks
    wl = _win_counts_hook()
    a, e = _window_case(kind, 1 << 22, seed=21)
    g = check3(a, e, quantiles=QW)
    on, used, win_on = sel_hooks.last(), list(last), list(wl)
    assert on["windows"] >= 3 and on["radix_ranks"] == 0 and on["overflowed"] == 0, on
    assert used[0] == 1, used  # the sample, once
    if kind in ("noise_fp32", "cauchy", "outliers", "nan_inf"):
        assert on["in_stored"] >= 1 and used[1] >= 1, (on, used)
    knob.value = 1
    h = vgct_ext.compare(a, e, quantiles=QW)
    assert list(last) == [0, 0]
    assert sel_hooks.last() == on
    # window 0's bounds, from the sample's order statistics: its counts below lo, at lo, at hi and
    # stored inside are the same (a sample key one rank off moves lo or hi, and these counts)
    assert list(wl) == win_on, (list(wl), win_on)
    assert _qbits(g) == _qbits(h)


def test_window_plan_cooperative_launch_refused_falls_back(sel_hooks, cbuf_hooks):
    """A device that refuses the cooperative grid (cudaErrorCooperativeLaunchTooLarge: a partial MPS
    share of its SMs; the hook vgct_cuda_test_cbuf = 2 refuses every launch) selects the sample and the
    regions through the histogram levels instead: no error, the same windows, counts and quantiles as
    the grid's, == CPU engine == float64 oracle."""
    knob, last = cbuf_hooks
    wl = _win_counts_hook()
    a, e = _window_case("noise_fp32", 1 << 22, seed=22)
    g = check3(a, e, quantiles=(0.5, 0.99))
    on, used, win_on = sel_hooks.last(), list(last), list(wl)
    assert used[0] == 1 and used[1] >= 1 and on["in_stored"] >= 1, (on, used)
    knob.value = 2
    h = check3(a, e, quantiles=(0.5, 0.99))
    assert list(last) == [0, 0]
    assert sel_hooks.last() == on and list(wl) == win_on
    assert _qbits(g) == _qbits(h)


# ---- issue #13: the fused key window (cuda/reduce.cu k_reduce_bulk<..., WIN = 1>) -------------
#
# vgct_cuda_compare (cuda/select.cu) starts the window plan's sample before the reduction, and
# k_reduce_bulk counts the one window in its own pass: keys >= lo, == lo, == hi, the keys inside
# stored.  The hooks: vgct_cuda_test_fuse (1 = never fuse), vgct_cuda_test_fuse_last (1 = the last
# compare fused); lean_max = 0 keeps small inputs on the ring kernel, plan = 1 forces the windows.

def _win_counts_hook():
    """cuda/select.cu vgct_cuda_test_win_last: window 0's counts of the last window answer."""
    import ctypes

    from vgct_ext import _C

    return (ctypes.c_longlong * 4).in_dll(ctypes.CDLL(_C.__file__), "vgct_cuda_test_win_last")


def _resume_hook():
    """cuda/select.cu vgct_cuda_test_resume_last: 1 when the last compare's fused plan did not count
    its window in the reduction and ran the sample's levels again after it (win_resume)."""
    import ctypes

    from vgct_ext import _C

    return ctypes.c_longlong.in_dll(ctypes.CDLL(_C.__file__), "vgct_cuda_test_resume_last")


@pytest.fixture
def fuse_hooks(selection_only):
    """(off, last): the fused window's hooks; off reset to 0 after."""
    import ctypes

    from vgct_ext import _C

    lib = ctypes.CDLL(_C.__file__)
    off = ctypes.c_longlong.in_dll(lib, "vgct_cuda_test_fuse")
    last = ctypes.c_longlong.in_dll(lib, "vgct_cuda_test_fuse_last")
    yield off, last
    off.value = 0


FUSE_DT = {"bf16": (torch.bfloat16, torch.bfloat16), "fp16": (torch.float16, torch.float16),
           "fp32": (torch.float32, torch.float32), "bf16_fp32": (torch.bfloat16, torch.float32),
           "fp16_fp32": (torch.float16, torch.float32)} if torch is not None else {}


@pytest.mark.parametrize("q", [0.0, 0.5, 0.99, 1.0])
@pytest.mark.parametrize("kind", WINDOW_KINDS)
@pytest.mark.parametrize("dt", ["bf16", "fp16", "fp32", "bf16_fp32"])
@pytest.mark.parametrize("mode", [3, 4, 2])
def test_fused_window_every_distribution(mode, dt, kind, q, sel_hooks, lean_max, fuse_hooks):
    """The reduction's own pass counts the window -- mode 3, the sparse way: the pairs not proved
    below lo keyed by their lane, keys of 0 counted by number (fuse_last == 1); mode 4, every
    pair of a whole finite chunk classified in the fold, VgWinCnt (fuse_last == 3) -- or, mode
    2, the plan started and the window left to the window pass after the reduction (fuse_last
    == 2), for every dtype pair with a fast path, every |d| distribution (ties at lo == hi, all
    d == 0, a constant offset, non-finite pairs, huge outliers, finite pairs whose float32
    difference overflows: chunks keyed pair by pair, most pairs identical: a caching feature)
    and a window at either end (q = 0: lo = 0; q = 1: hi = +Inf) or inside; the last chunk is partial
    (n = 2^17 + 5: its keys one by one).  GPU == CPU engine == np.quantile."""
    a, e = _window_case(kind, (1 << 17) + 5)
    ta, te = FUSE_DT[dt]
    a, e = a.to(ta), e.to(te)
    sel_hooks.set(plan=1)
    lean_max.value = 0
    fuse_hooks[0].value = mode
    check3(a, e, quantiles=(q,))
    assert fuse_hooks[1].value == {3: 1, 4: 3, 2: 2}[mode]
    # mode 2: k_sel_sample's last block left the window to the record, so the sample's levels
    # returned at once and ran again after the reduction (every rank goes to the selection here)
    assert _resume_hook().value == (1 if mode == 2 else 0)
    last = sel_hooks.last()
    assert last["windows"] == 1 and last["overflowed"] == 0, last
    if kind != "nan_inf" and not (kind == "f32_overflow" and dt == "fp16"):  # fp16: 3e38 is inf
        assert last["radix_ranks"] == 0, last  # (nan_inf: n_finite < n, the windows were
        # predicted for n finite pairs)


@pytest.mark.parametrize("kind", ["bf16_rounding", "noise_fp32", "offset", "outliers", "f32_overflow",
                                  "sparse", "nan_inf"])
def test_fused_window_equals_the_window_pass(kind, sel_hooks, lean_max, fuse_hooks):
    """The same call fused both ways (the sparse way, hook 3; every pair classified, hook 4) and with the
    window pass (hook 1): every field and the quantiles equal bit for bit, and the window's
    counts are the same (same ranks answered the same way) -- ties at lo (bf16 rounding), a
    quarter of the keys at or above lo (offset), outliers, chunks keyed pair by pair
    (f32_overflow, nan_inf), most keys 0 and lo at 0 (sparse: a caching feature's output)."""
    a, e = _window_case(kind, (1 << 18) + 77, seed=7)
    sel_hooks.set(plan=1)
    lean_max.value = 0
    qs = (0.99,)
    counts = _win_counts_hook()
    fuse_hooks[0].value = 1
    g0 = vgct_ext.compare(a, e, quantiles=qs)
    assert fuse_hooks[1].value == 0
    l0, c0 = sel_hooks.last(), list(counts)
    assert c0[0] >= 0 and c0[0] + c0[1] + c0[2] + c0[3] <= a.numel(), c0
    for hook, last in ((3, 1), (4, 3)):
        fuse_hooks[0].value = hook
        g1 = vgct_ext.compare(a, e, quantiles=qs)
        assert fuse_hooks[1].value == last
        l1 = sel_hooks.last()
        # bitwise, sums included: only bf16_rounding folds in another order here (the sparse
        # way's two chunks a lane and step against three), and its bf16 terms and partial sums
        # are exact in float64 -- the documented guarantee is within rounding (cuda/reduce.cu,
        # vg_bulk)
        assert_same_stats(g1, g0, tol=0.0)
        assert dict(g1.quantiles) == dict(g0.quantiles)
        assert l1 == l0, (hook, l1, l0)
        # window 0's counts (below lo, == lo, == hi, stored inside): the same keys counted
        assert list(counts) == c0, (hook, list(counts), c0)


@pytest.mark.parametrize("hook,way", [(3, 1), (4, 3)])
@pytest.mark.parametrize("shift", [1 << 12, -(1 << 12), 1 << 30])
def test_fused_window_planted_misprediction_falls_back(shift, hook, way, sel_hooks, lean_max,
                                                       fuse_hooks):
    """Planted fault: the fused window moved off the true p99 (above, below, to the top): the
    reduction still counts it (the sparse way, hook 3; every pair classified, hook 4), the ranks it
    misses go to the radix path, the values stay exact."""
    a, e = _window_case("noise_fp32", 1 << 17, seed=8)
    sel_hooks.set(plan=1, shift=shift)
    lean_max.value = 0
    fuse_hooks[0].value = hook  # a shifted window may hold many keys: fuse all the same
    check3(a, e, quantiles=(0.99,))
    assert fuse_hooks[1].value == way
    last = sel_hooks.last()
    assert last["windows"] == 1 and last["radix_ranks"] >= 1, last


@pytest.mark.parametrize("hook,way", [(3, 1), (4, 3)])
def test_fused_window_overflow_and_wide_windows(hook, way, sel_hooks, lean_max, fuse_hooks):
    """Planted faults: a region of 8 keys (the window overflows: every rank falls back), and a
    64-key sample whose window holds most keys (warps stage far more than their 48 slots: the
    keys go straight to the region).  Exact both ways, the sparse way (hook 3) and with every
    pair classified (hook 4), and the wide window's counts equal the window pass's."""
    a, e = _window_case("cauchy", (1 << 18) + 3, seed=9)
    lean_max.value = 0
    fuse_hooks[0].value = hook
    sel_hooks.set(plan=1, cap=8)
    check3(a, e, quantiles=(0.99,))
    assert fuse_hooks[1].value == way
    last = sel_hooks.last()
    assert last["overflowed"] == 1 and last["radix_ranks"] == 2, last
    sel_hooks.set(plan=1, sample=64)
    check3(a, e, quantiles=(0.5,))
    assert fuse_hooks[1].value == way
    assert sel_hooks.last()["windows"] == 1
    counts = _win_counts_hook()
    fused = list(counts)
    fuse_hooks[0].value = 1
    vgct_ext.compare(a, e, quantiles=(0.5,))
    assert fuse_hooks[1].value == 0 and list(counts) == fused, (list(counts), fused)
    assert fused[3] > 48 * 8 * 2, fused  # more stored keys than a block's stages hold


@pytest.mark.parametrize("layout", ["misaligned", "transposed", "two_windows", "dim", "fp64"])
def test_fused_window_only_where_it_applies(layout, sel_hooks, lean_max, fuse_hooks):
    """Inputs the ring kernel does not take (a misaligned base, a transposed view, float64), two
    windows, or per-slice statistics: the window plan makes its own pass (fuse_last == 0), exact."""
    a, e = _window_case("noise_fp32", (1 << 17) + 64, seed=10)
    qs, dim = (0.99,), None
    if layout == "misaligned":
        a, e = a[1:], e[1:]
    elif layout == "transposed":
        a, e = a[:1 << 17].view(256, -1).t(), e[:1 << 17].view(256, -1).t()
    elif layout == "two_windows":
        qs = (0.25, 0.99)
    elif layout == "dim":
        a, e, dim = a[:1 << 17].view(64, -1), e[:1 << 17].view(64, -1), 0
    else:
        a, e = a.double(), e.double()
    sel_hooks.set(plan=1)
    lean_max.value = 0
    check3(a, e, quantiles=qs, dim=dim)
    assert fuse_hooks[1].value == 0


@pytest.mark.parametrize("kind,fused", [("bf16_rounding", 3), ("offset", 3), ("identical", 1),
                                        ("noise_fp32", 1), ("cauchy", 1), ("outliers", 1),
                                        ("sparse", 1)])
def test_fused_window_is_automatic(kind, fused, sel_hooks, fuse_hooks):
    """From WIN_FUSE_MIN (2^25) pairs on, the default p99 of a contiguous pair is counted by the
    reduction without any hook: the sparse way (fuse_last 1) where ~1.1% of the keys are at or
    above the window's low end (keys of 0 at lo == 0 counted by number), with every pair classified
    (3) where more than WIN_FUSE_GE = 2% of the sample's keys are -- bf16 rounding differences
    (~3%, tied), a constant offset (~27%: the float32 roundings of e + 0.25 - e); answered from
    the window either way.  Below 2^25 pairs: no fusion (0)."""
    a, e = _window_case(kind, (1 << 25) + 1001, seed=11)
    check3(a, e, quantiles=(0.99,), oracle=False)
    assert fuse_hooks[1].value == fused
    last = sel_hooks.last()
    assert last["windows"] == 1 and last["radix_ranks"] == 0, last
    a, e = a[:(1 << 24) + 1001], e[:(1 << 24) + 1001]
    vgct_ext.compare(a, e, quantiles=(0.99,))
    assert fuse_hooks[1].value == 0 and sel_hooks.last()["windows"] == 1


# ---- issue #13: the ranks the reduction's record answers (csrc/vgct_stats.h vgct_rank_known) ----
#
# A finite pair has |d| = 0 exactly when a == e, and at most n_unequal finite pairs differ: every
# rank below n_finite - n_unequal is 0, and rank n_finite - 1 is max_abs_err -- with no selection
# (cuda/select.cu vgct_cuda_compare; vgct_cuda_test_known_last = [answered so, selected]).  Each
# case is checked against the CPU engine and the float64 oracle (check3), and against the same
# call with every rank selected (vgct_cuda_test_known = 1: an independent GPU path).

QK = (0.0, 0.5, 0.99, 0.999, 1.0)


@pytest.fixture
def known_hooks():
    """(knob, last) of the record's answers (_known_hooks); the answers on, and back on after."""
    knob, last = _known_hooks()
    knob.value = 0
    yield knob, last
    knob.value = 0


def _sparse_case(n, k, dt, seed=0):
    """GPU (actual, expected) of n pairs of which exactly k (random positions from 100 on) differ,
    each by at least a quarter of 1 + |e| (so no rounding to dt makes them equal again)."""
    g = _gen(GEN_SEED + 300 + seed)
    e32 = torch.randn(n, generator=g, device=DEV).to(dt).float()
    a32 = e32.clone()
    if k:
        idx = 100 + torch.randperm(n - 100, generator=g, device=DEV)[:k]
        bump = (0.25 + torch.rand(k, generator=g, device=DEV)) * (1.0 + e32[idx].abs())
        a32[idx] += bump
    return a32.to(dt), e32.to(dt)


def _p99_edge_ks(n):
    """k (pairs that differ) around the p99's upper rank hi: k = n - hi - 1 leaves rank hi the
    last zero (p99 = 0, answered), k = n - hi makes it the smallest nonzero key (selected): the
    planted off-by-one -- a zero count one too high -- fails the second."""
    hi = math.floor((n - 1) * 0.99) + 1
    return [0, 1, n - hi - 1, n - hi, n // 20]


@pytest.mark.parametrize("dt", ["bf16", "fp32"])
@pytest.mark.parametrize("n", [1000, (1 << 16) + 3, (1 << 21) + 5])
def test_record_answers_zero_and_max_ranks(n, dt, known_hooks):
    """An identical pair and sparse differences at either side of the p99's boundary, below the
    buffer (store-all) and above it (the window plan): every rank below the zero count and the
    largest answered by the record, the others selected; values == CPU == oracle, and == the same
    call with every rank selected."""
    knob, last = known_hooks
    dtt = {"bf16": torch.bfloat16, "fp32": torch.float32}[dt]
    for k in _p99_edge_ks(n):
        a, e = _sparse_case(n, k, dtt, seed=k % 97)
        g = check3(a, e, quantiles=QK)
        assert g.n_unequal == k
        assert list(last) == record_answered(n, k, QK), (k, list(last))
        if k <= n - math.floor((n - 1) * 0.99) - 2:
            assert g.quantiles[0.99] == 0.0
        knob.value = 1
        s = vgct_ext.compare(a, e, quantiles=QK)
        assert list(last) == [0, 2 * len(QK)]
        knob.value = 0
        assert dict(s.quantiles) == dict(g.quantiles), (k, s.quantiles, g.quantiles)


def test_record_answers_with_non_finite_pairs(known_hooks):
    """Non-finite pairs: NaN against a number and +Inf against -Inf are unequal (40: in n_unequal,
    not in n_finite, so n_finite - n_unequal is 40 below the true zero count), NaN against NaN and
    Inf against Inf equal (20).  The finite differences make the p99's upper rank the smallest
    nonzero key: a zero count taken over all pairs (n - n_unequal, 20 too many) would answer it
    0 -- planted, that fails the oracle."""
    knob, last = known_hooks
    n = (1 << 16) + 3
    nf = n - 60
    hi = math.floor((nf - 1) * 0.99) + 1
    a, e = _sparse_case(n, nf - hi, torch.float32, seed=5)  # finite zeros: exactly hi
    a[10:40] = float("nan")
    a[40:50], e[40:50] = float("nan"), float("nan")
    a[50:60], e[50:60] = float("inf"), float("inf")
    a[60:70], e[60:70] = float("inf"), float("-inf")
    g = check3(a, e, quantiles=QK)
    assert g.n_finite == nf and g.n_unequal == nf - hi + 40
    assert g.quantiles[0.99] > 0.0
    assert list(last) == record_answered(nf, g.n_unequal, QK), list(last)
    knob.value = 1
    assert dict(vgct_ext.compare(a, e, quantiles=QK).quantiles) == dict(g.quantiles)


@pytest.mark.parametrize("kind", ["identical_bf16", "sparse_fp32", "caching_bf16"])
def test_record_answers_skip_the_zero_window(kind, known_hooks, fuse_hooks_plain):
    """From WIN_FUSE_MIN (2^25) pairs on, a sample whose p99 window the record will answer makes
    the reduction run without the window (fuse_last == 2), and the record answers the p99 with no
    pass (known_last == [2, 0]); values == CPU engine.  The window is the key 0 alone (an identical
    pair; 0.1% of the pairs differ), or -- caching_bf16, cuda/select.cu win_record_answers -- it
    reaches from 0 to a nonzero key (0.9% of the pairs differ: the sample's 6-sigma window,
    ~0.23% of the keys either side of the p99, reaches past the zeros) while the sample's zero
    count puts the p99's ranks among the zeros (the old rule, hi == 0 only, fused it: fuse_last 1)."""
    _, last = known_hooks
    n = (1 << 25) + 1001
    if kind == "identical_bf16":
        a, e = _sparse_case(n, 0, torch.bfloat16, seed=1)
    elif kind == "sparse_fp32":
        a, e = _sparse_case(n, n // 1000, torch.float32, seed=2)
    else:
        a, e = _sparse_case(n, (9 * n) // 1000, torch.bfloat16, seed=3)
    g = check3(a, e, quantiles=(0.99,), oracle=False)
    assert g.quantiles[0.99] == 0.0
    assert fuse_hooks_plain.value == 2
    assert list(last) == [2, 0]
    assert _resume_hook().value == 0  # the sample's levels skipped, and not needed after


@pytest.mark.parametrize("nan,skipped", [(0.015, False), (0.003, True)])
def test_record_rule_counts_the_samples_non_finite_pairs(nan, skipped, known_hooks, fuse_hooks_plain):
    """0.1% of the pairs differ, so the sample's window is the key 0 alone (hi == 0); NaN pairs
    count in n_unequal, so the record's zero count n_finite - n_unequal is ~96.9% of n with 1.5%
    NaN -- below the p99's rank (~97.5%): the window must be counted in the reduction (fuse_last
    1; skipping it, the old rule for hi == 0, left the rank to the window plan's pass after the
    reduction, fuse_last 2) -- and ~99.3% with 0.3% NaN, above the rank (~98.7%): skipped, the
    record answers both ranks (known_last [2, 0]).  Values == CPU engine == float64 oracle."""
    _, last = known_hooks
    n = (1 << 25) + 1001
    a, e = _sparse_case(n, n // 1000, torch.float32, seed=7)
    g = _gen(GEN_SEED + 410)
    a[torch.rand(n, generator=g, device=DEV) < nan] = float("nan")
    r = check3(a, e, quantiles=(0.99,))
    assert fuse_hooks_plain.value == (2 if skipped else 1)
    if skipped:
        assert r.quantiles[0.99] == 0.0 and list(last) == [2, 0]
    else:
        assert r.n_finite - r.n_unequal < math.floor((r.n_finite - 1) * 0.99)


def _sampled_elements(n, ch=8):
    """Boolean mask (CPU) of the elements whose keys the window plan's sample reads, for a flat
    contiguous pair of n elements, chunks of ch pairs (cuda/select.cu win_plan, k_sel_sample:
    K = n/256 keys within [2^14, 2^20], nruns = ceil(K / (32 ch)) runs of WIN_RUN = 32 chunks,
    run r from chunk r step + (r rem) // nruns, step and rem = divmod(nchunk, nruns))."""
    nchunk = -(-n // ch)
    k = min(max(n // 256, 1 << 14), 1 << 20)
    nruns = -(-k // (32 * ch))
    step, rem = divmod(nchunk, nruns)
    mask = torch.zeros(n, dtype=torch.bool)
    for r in range(nruns):
        c = r * step + (r * rem) // nruns
        mask[c * ch:(c + 32) * ch] = True
    return mask


def _wrong_guess_case(n, seed):
    """GPU bf16 (actual, expected) of n pairs on which the record's rule guesses wrong: the sample
    (_sampled_elements) reads 0.9% of its pairs unequal, so win_record_answers leaves the p99's
    window to the record, while over all pairs exactly n - hi differ (hi = the p99's upper rank:
    the zero count is hi, so rank hi is the smallest nonzero key and the record answers only the
    lower rank).  Returns (a, e, hi)."""
    hi = math.floor((n - 1) * 0.99) + 1
    g = torch.Generator()  # (on the CPU: the placement follows the CPU-built mask)
    g.manual_seed(GEN_SEED + seed)
    sampled = _sampled_elements(n)
    s_idx = sampled.nonzero().flatten()
    u_idx = (~sampled).nonzero().flatten()
    k_s = (9 * s_idx.numel()) // 1000
    k_u = (n - hi) - k_s
    pick = torch.cat([s_idx[torch.randperm(s_idx.numel(), generator=g)[:k_s]],
                      u_idx[torch.randperm(u_idx.numel(), generator=g)[:k_u]]])
    e32 = torch.randn(n, generator=g).to(torch.bfloat16).float()
    a32 = e32.clone()
    a32[pick] += (0.25 + torch.rand(pick.numel(), generator=g)) * (1.0 + e32[pick].abs())
    return a32.to(torch.bfloat16).to(DEV), e32.to(torch.bfloat16).to(DEV), hi


def test_record_guess_wrong_falls_back_to_the_window_pass(known_hooks, fuse_hooks_plain):
    """The record's answer is a guess from the sample (win_record_answers); when it is wrong the
    result must still be exact.  Planted here (_wrong_guess_case): the sample says the record will
    answer (so the reduction runs without the window, fuse_last == 2, and the sample's levels
    return at once), while the record answers only the lower rank (known_last == [1, 1]) -- the
    sample's levels then run again (resume_last == 1) and the window plan's own pass selects the
    upper rank after the reduction (one window, the rank at its pivot or among its stored keys,
    none left to the radix path).  Values == CPU engine == float64 oracle: a record that
    answered rank hi as 0 fails it; a window pass after levels that did not run again has no
    bounds (win_bounds: WIN_SENT while SelState::skip is set), so the rank would go to the radix
    path (radix_ranks 1); and the window's stored keys must be fewer than the nonzero keys (a
    window of the whole range, the zeroed state's bounds, stores them all)."""
    _, last = known_hooks
    n = (1 << 25) + 1001
    a, e, hi = _wrong_guess_case(n, 400)
    r = check3(a, e, quantiles=(0.99,), oracle=True)
    assert r.n_unequal == n - hi
    assert r.quantiles[0.99] > 0.0
    assert fuse_hooks_plain.value == 2
    assert list(last) == [1, 1]
    assert _resume_hook().value == 1
    plan = dict(zip(SEL_LAST, list(_sel_hooks()[1])))
    assert plan["windows"] == 1 and plan["at_pivots"] + plan["in_stored"] == 1, plan
    assert plan["radix_ranks"] == 0, plan
    assert 0 <= _win_counts_hook()[3] < r.n_unequal  # keys stored strictly inside the window


def _verdict_case(kind, n, seed):
    """GPU (actual, expected) of n pairs for the record's verdict tests: identical_bf16; caching_bf16
    (0.5% of the pairs differ: the sample's zero count far above the p99's ranks); wrong_guess
    (_wrong_guess_case); bf16_rounding (_window_case); nan_sparse_fp32 (0.1% differ, 1.5% NaN: the
    record's zero count below the ranks).  Returns (a, e, hi): hi the wrong guess's p99 upper rank,
    else None."""
    if kind == "wrong_guess":
        return _wrong_guess_case(n, 400 + seed)
    if kind == "bf16_rounding":
        return (*_window_case("bf16_rounding", n, seed=seed), None)
    if kind == "nan_sparse_fp32":
        a, e = _sparse_case(n, n // 1000, torch.float32, seed=seed)
        a[torch.rand(n, generator=_gen(GEN_SEED + 403 + seed), device=DEV) < 0.015] = float("nan")
        return a, e, None
    k = {"identical_bf16": 0, "caching_bf16": n // 200}[kind]
    return (*_sparse_case(n, k, torch.bfloat16, seed=seed), None)


def _verdict_call(a, e, known_last, fuse_last, oracle=True):
    """compare(a, e, quantiles=(0.99,)) on a warm workspace, then the same call against the CPU
    engine (and the float64 oracle when `oracle`); returns the GPU result and what the hooks said
    of it: way (fuse_last), resumed (resume_last), known (known_last), pre (round trips before the
    reduction), syncs (round trips in all)."""
    total, pre = _sync_hooks()
    vgct_ext.compare(a, e, quantiles=(0.99,))  # the workspace allocated (its one-time sync)
    before = total.value
    r = vgct_ext.compare(a, e, quantiles=(0.99,))
    seen = dict(way=fuse_last.value, resumed=_resume_hook().value, known=list(known_last),
                pre=pre.value, syncs=total.value - before)
    check3(a, e, quantiles=(0.99,), oracle=oracle)
    return r, seen


@pytest.fixture
def fuse_auto_any_n(lean_max):
    """The fused window's automatic choice at any n (cuda/reduce.cu vgct_cuda_test_fuse = 5, below
    WIN_FUSE_MIN) on the ring kernel (lean off); both back to their defaults after."""
    import ctypes

    from vgct_ext import _C

    h = ctypes.c_longlong.in_dll(ctypes.CDLL(_C.__file__), "vgct_cuda_test_fuse")
    lean_max.value = 0
    h.value = 5
    yield
    h.value = 0


@pytest.mark.parametrize("kind", ["identical_bf16", "caching_bf16", "wrong_guess", "bf16_rounding",
                                  "nan_sparse_fp32"])
def test_record_verdict_from_the_sample_before_its_levels(kind, known_hooks, fuse_hooks_plain,
                                                           fuse_auto_any_n):
    """k_sel_sample's last block (cuda/select.cu win_early) decides from the sample's zero, nonzero
    and empty counts whether the record will answer (win_record_answers) -- before the sample's
    levels, which then return at once -- at 2^21 + 77 pairs through the automatic rule's hook:
    an identical pair and a caching feature's output are left to the record (fuse_last 2), which
    answers both ranks with the levels never run (resume_last 0; one host round trip in all);
    a wrong guess (_wrong_guess_case) is left to it too, and the levels run after the reduction
    (resume_last 1) for the window pass; bf16 rounding noise and 0.1% unequal with 1.5% NaN
    (whose record's zero count is below the rank) count the window in the reduction (every pair,
    the sparse way; resume_last 0).  Values == CPU engine == float64 oracle."""
    n = (1 << 21) + 77
    a, e, hi = _verdict_case(kind, n, seed=20)
    r, seen = _verdict_call(a, e, known_hooks[1], fuse_hooks_plain)
    way, resumed, known, calls = seen["way"], seen["resumed"], seen["known"], seen["syncs"]
    assert seen["pre"] == 0
    if kind in ("identical_bf16", "caching_bf16"):
        assert (way, resumed, known) == (2, 0, [2, 0])
        assert r.quantiles[0.99] == 0.0 and calls == 1
    elif kind == "wrong_guess":
        assert (way, resumed, known) == (2, 1, [1, 1])
        assert r.n_unequal == n - hi and r.quantiles[0.99] > 0.0
        plan = dict(zip(SEL_LAST, list(_sel_hooks()[1])))
        assert plan["windows"] == 1 and plan["radix_ranks"] == 0, plan
        assert 0 <= _win_counts_hook()[3] < r.n_unequal  # not the whole range stored
    else:
        assert (way, resumed) == ((3, 0) if kind == "bf16_rounding" else (1, 0))


@pytest.fixture
def fuse_hooks_plain():
    """vgct_cuda_test_fuse_last alone (the record's answers left on)."""
    import ctypes

    from vgct_ext import _C

    return ctypes.c_longlong.in_dll(ctypes.CDLL(_C.__file__), "vgct_cuda_test_fuse_last")


def _sync_hooks():
    """(total, pre_last): cuda/runtime.cu vgct_cuda_test_syncs, the host round trips (stream
    synchronisations) of every call so far; cuda/select.cu vgct_cuda_test_syncs_pre_last, those
    the last vgct_cuda_compare made before launching its reduction."""
    import ctypes

    from vgct_ext import _C

    lib = ctypes.CDLL(_C.__file__)
    return (ctypes.c_longlong.in_dll(lib, "vgct_cuda_test_syncs"),
            ctypes.c_longlong.in_dll(lib, "vgct_cuda_test_syncs_pre_last"))


@pytest.mark.parametrize("kind,way", [("identical_bf16", 2), ("nan_sparse_fp32", 1),
                                      ("bf16_rounding", 3)])
def test_fused_window_way_chosen_on_the_device(kind, way, known_hooks, fuse_hooks_plain):
    """From WIN_FUSE_MIN (2^25) pairs on, the device chooses the reduction's way (WinState::mode;
    the record by k_sel_sample's last block, the other two by k_win_count's) -- the window left to
    the record (fuse_last 2: an identical bf16 pair), the
    sparse way (1: 0.1% of the pairs differ, 1.5% NaN, so the record cannot answer), every pair
    classified (3: bf16 rounding noise, ~3% of the keys at or above lo) -- and the three
    k_reduce_bulk variants launched behind it run only the chosen one: no host round trip before
    the reduction (syncs_pre_last 0; it was 1, the verdict's copy), and a p99 the record answers
    costs the call one round trip in all.  Values == CPU engine (== float64 oracle for the
    sparse case, whose oracle is cheap).  (A variant that ran beside the chosen one would add its
    window counts twice: test_fused_window_equals_the_window_pass and
    test_fused_window_every_distribution, whose hooks 3 and 4 take this path too, compare the
    counts and values with the window plan's own pass.  Round trips outside CallCtx::sync, which
    the counter cannot see, are ruled out by test_build.py's source check.)"""
    n = (1 << 25) + 1001
    a, e, _ = _verdict_case(kind, n, seed=7)
    r, seen = _verdict_call(a, e, known_hooks[1], fuse_hooks_plain, oracle=(kind == "nan_sparse_fp32"))
    assert seen["way"] == way
    assert seen["pre"] == 0 and seen["resumed"] == 0
    if kind == "identical_bf16":
        assert r.quantiles[0.99] == 0.0 and seen["known"] == [2, 0]
        assert seen["syncs"] == 1
    else:  # the window counted in the reduction answered what the record could not
        assert seen["known"][1] >= 1
        assert (r.quantiles[0.99] > 0.0) == (kind == "bf16_rounding")  # (1.5% NaN: the record's
        # zero count, n_finite - n_unequal, is below the rank; the finite zeros are not)


# ---- issue #13: the one-block finish of the selection (cuda/select.cu k_sel_fin) ----------------
#
# After the level-0 pass k_sel_fin answers each rank from its bucket's extremes (one value: ties) or
# from a selection among the wanted buckets' keys (at most FIN_CAP = 8192; fin_select: a radix
# selection in shared memory), else it leaves the ranks to the
# four histogram levels.  Up to TINY_CAP pairs (a small call) one k_sel_tiny block chained behind the
# reduction keys every pair and selects among them all (below).  Hooks: vgct_cuda_test_fin = 1
# turns the finish off, 2 keeps it on but sends small calls through the level-0 histogram and the
# finish after it (what the fin_hooks tests check; the k_sel_tiny tests below use the default, 0);
# vgct_cuda_test_fin_last says what the last call did.  Every case is checked against the CPU
# engine, the float64 oracle and the same call with the finish off (the levels: an independent GPU
# path).

FIN_LAST = ("store_all_fins", "by_ties", "by_select", "left_to_levels", "window_direct",
            "window_level1", "tiny_batches")
FIN_CAP = 8192
TINY_CAP = 16384  # cuda/select.cu: the most pairs k_sel_tiny keys in one block
TINY_PREFER = 12288  # cuda/select.cu: k_sel_tiny up to this many pairs, k_sel_coop past it


@pytest.fixture
def fin_hooks(selection_only):
    """set(off) and last() -> dict for k_sel_fin's hooks; the default back after.  On (off=False)
    is the finish after the level-0 histogram at every n (knob 2: no k_sel_tiny for small calls);
    set_default() is the code's own choice (knob 0)."""
    import ctypes

    from vgct_ext import _C

    lib = ctypes.CDLL(_C.__file__)
    knob = ctypes.c_longlong.in_dll(lib, "vgct_cuda_test_fin")
    last = (ctypes.c_longlong * len(FIN_LAST)).in_dll(lib, "vgct_cuda_test_fin_last")

    class Hooks:
        @staticmethod
        def set(off):
            knob.value = 1 if off else 2

        @staticmethod
        def set_default():
            knob.value = 0

        @staticmethod
        def last():
            return dict(zip(FIN_LAST, list(last)))

    yield Hooks
    knob.value = 0


def _engine_ranks(nf, quantiles):
    """The two ranks the engine asks for each quantile, in order (csrc/vgct_stats.h
    vgct_quantile_ranks: h = (nf-1) q, floor(h) and floor(h) + 1, both nf - 1 when h >= nf - 1)."""
    out = []
    for q in quantiles:
        h = float(nf - 1) * float(q)
        out += [nf - 1, nf - 1] if h >= nf - 1 else [math.floor(h), math.floor(h) + 1]
    return out


def _distinct_ranks(nf, quantiles):
    """How many distinct ranks the engine asks for."""
    return len(set(_engine_ranks(nf, quantiles)))


def _fin_both_ways(a, e, quantiles, fin_hooks, after_on=None, oracle=True):
    """The call with the finish on (checked by check3), its hooks (and ``after_on()``, read right
    after it), and the same call with the finish off: the quantiles equal bit for bit.  When the
    finish answered every rank itself, its counts add up to the distinct ranks asked for."""
    fin_hooks.set(off=False)
    g = check3(a, e, quantiles=quantiles, oracle=oracle)
    last = fin_hooks.last()
    assert last["tiny_batches"] == 0, last
    other = after_on() if after_on is not None else None
    fin_hooks.set(off=True)
    h = vgct_ext.compare(a, e, quantiles=quantiles)
    off = fin_hooks.last()
    fin_hooks.set(off=False)
    assert off["store_all_fins"] == off["window_direct"] == off["window_level1"] == 0, off
    assert off["tiny_batches"] == 0, off
    assert dict(g.quantiles) == dict(h.quantiles)
    if last["store_all_fins"] and last["left_to_levels"] == 0:
        assert last["by_ties"] + last["by_select"] == _distinct_ranks(g.n_finite, quantiles), last
    return g, last, other


@pytest.mark.parametrize("kind", WINDOW_KINDS)
def test_fin_store_all_every_distribution(kind, fin_hooks):
    """Store-all (2^16 pairs) with the finish: exact for every data shape -- ties (bf16 rounding,
    identical, offset), smooth noise, heavy tails, outliers, non-finite pairs."""
    a, e = _window_case(kind, 1 << 16, seed=7)
    g, last, _ = _fin_both_ways(a, e, QW, fin_hooks)
    assert last["store_all_fins"] == 2, last  # QW: 13 distinct ranks (floor(h), floor(h) + 1), two batches
    if kind == "identical":  # every |d| is 0: one bucket, one value
        assert last["by_ties"] == 13 and last["by_select"] == 0 and last["left_to_levels"] == 0, last
    if kind in ("noise_fp32", "cauchy"):  # smooth: small buckets, answered by the selection
        assert last["by_select"] >= 1 and last["left_to_levels"] == 0, last


def test_fin_bf16_rounding_noise_is_answered_by_ties(fin_hooks):
    """The main use case (a bf16 cast of fp32 + 1e-3 noise against its bf16 reference): the p99's
    bucket holds tens of thousands of keys of ONE value; the finish answers from the extremes."""
    a, e = _window_case("bf16_rounding", 1 << 20, seed=8)
    g, last, _ = _fin_both_ways(a, e, (0.99,), fin_hooks)
    assert last["store_all_fins"] == 1 and last["left_to_levels"] == 0, last
    assert last["by_ties"] >= 1 and last["by_select"] == 0, last


def test_fin_planted_big_two_valued_bucket_goes_to_the_levels(fin_hooks):
    """Planted: the wanted bucket holds more than FIN_CAP keys of two values 2^-20 apart (one
    1/16-octave bucket, extremes differ, too many to select among): the finish must leave the ranks to the
    levels, whose answer is exact -- including the ranks at the boundary between the two values."""
    n = 4 * FIN_CAP + 1
    e = torch.ones(n, dtype=torch.float64, device=DEV)
    a = torch.full((n,), 1.5, dtype=torch.float64, device=DEV)  # |d| = 0.5 ...
    a[1::2] += 2.0 ** -20  # ... or 0.5 + 2^-20
    nlow = (n + 1) // 2
    qs = (0.0, (nlow - 1) / (n - 1), nlow / (n - 1), 0.5, 1.0)
    g, last, _ = _fin_both_ways(a, e, qs, fin_hooks)
    assert last["left_to_levels"] == 1 and last["by_ties"] == 0 and last["by_select"] == 0, last


@pytest.mark.parametrize("size,selected", [(FIN_CAP, True), (FIN_CAP + 1, False)])
def test_fin_cap_boundary(size, selected, fin_hooks):
    """One bucket of exactly FIN_CAP distinct keys is answered by the finish's selection (the
    shared-memory region full); one key more and it goes to the levels.  Both exact."""
    k = torch.arange(size, dtype=torch.float64, device=DEV)
    k = k[torch.randperm(size, generator=torch.Generator(device=DEV).manual_seed(GEN_SEED + 301),
                         device=DEV)]
    e = torch.ones(size, dtype=torch.float64, device=DEV)
    a = 2.0 + k * 2.0 ** -30  # |d| = 1 + k 2^-30: distinct, all in [1, 1.0625)
    g, last, _ = _fin_both_ways(a, e, (0.0, 0.37, 0.5, 0.99, 1.0), fin_hooks)
    if selected:
        assert last["by_select"] >= 1 and last["left_to_levels"] == 0, last
    else:  # 9 distinct ranks: two batches, both left to the levels
        assert last["left_to_levels"] == last["store_all_fins"] == 2, last


@pytest.mark.parametrize("size", [2, 3, 31, 700, 1024, 1025, 2047, 3000, 4097, 8000])
def test_fin_select_every_size_class(size, fin_hooks):
    """The finish's selection (k_sel_fin, fin_select) over regions of 2 to 8000 keys -- fewer
    than a block's threads, one key a thread, several keys a thread, a partial last round: one
    1/16-octave bucket of `size` keys with repeated values (about two copies each) at 33 ranks
    spread over it.  Values == the four histogram levels (finish off) == CPU engine == float64
    oracle."""
    gen = torch.Generator(device=DEV).manual_seed(GEN_SEED + 303 + size)
    i = torch.arange(size, device=DEV)
    k = (i - (i % 3 == 2).long()).double()  # 0, 1, 1, 3, 4, 4, ...: every third a repeat
    k = k[torch.randperm(size, generator=gen, device=DEV)]
    e = torch.ones(size, dtype=torch.float64, device=DEV)
    a = 2.0 + k * 2.0 ** -30  # |d| = 1 + k 2^-30, all in [1, 1.0625): one bucket
    qs = tuple(j / 32 for j in range(33))
    g, last, _ = _fin_both_ways(a, e, qs, fin_hooks)
    assert last["by_select"] >= 1 and last["left_to_levels"] == 0, last


# (offsets from the key of 1.0 in the low 48 bits -- one 1/16-octave bucket -- and copies of each:
#  the highest differing bit, where fin_select's digits start, at 0, 7, 8, 16, 20, 28, 30 and 47;
#  the lowest, where they stop, at 0, 12, 20, 30 and 40)
FIN_SELECT_SPREADS = {
    "last bit only": ([0, 1], [3000, 3000]),
    "one full digit": ([0, 0x80, 0xFF], [2000, 1, 2000]),
    "a one-bit second digit": ([0, 0xFF, 0x100], [1500, 1500, 1500]),
    "three digits (bits 0-16)": ([0x7FFF, 0x8000, 0x10000, 0xFFFF], [1000, 1000, 1000, 1000]),
    "top and bottom of the bucket": ([0, 1, (1 << 47), (1 << 48) - 1], [2500, 1, 2500, 1]),
    # the passes stop at the lowest bit in which keys differ: bf16-derived keys (low bits zero),
    # keys that share set low bits, one differing bit mid-key, a 9-bit span across a digit
    "low 40 bits zero (bf16-like)": ([0, 1 << 40, 3 << 40, 0xFF << 40], [1500, 700, 1, 1500]),
    "shared set low bits": ([0x555, 0x1555, 0x100555, 0x101555], [1200, 1, 1200, 1200]),
    "one bit mid-key": ([0, 1 << 30], [3000, 3000]),
    "nine-bit span (bits 20-28)": ([1 << 20, 1 << 28, (1 << 28) | (1 << 20), 3 << 20],
                                   [1000, 1000, 1000, 1000]),
}


@pytest.mark.parametrize("spread", list(FIN_SELECT_SPREADS))
def test_fin_select_digit_edges(spread, fin_hooks):
    """fin_select's radix passes start below the keys' common prefix (their AND against their OR)
    and step down 8 bits at a time, the last digit possibly narrower: keys of one bucket differing
    only in bit 0, in one full digit, in a digit and one bit, in three digits, at both ends of the
    bucket, and in bits that stop above the lowest (the passes end at the lowest bit in which two
    keys differ; the bits below are every key's) -- thousands of copies on a few values (their
    counters contend).  Every quantile at and beside each value's first and last position, plus 0
    and 1: == the four histogram levels (finish off) == CPU engine == float64 oracle, and the
    finish answered every rank by selection."""
    offs, copies = FIN_SELECT_SPREADS[spread]
    one = 0x3FF0000000000000  # the bits of 1.0
    keys = torch.tensor([one + o for o, c in zip(offs, copies) for _ in range(c)], dtype=torch.int64)
    a = keys.view(torch.float64)
    a = a[torch.randperm(a.numel(), generator=torch.Generator().manual_seed(GEN_SEED + 310))].to(DEV)
    e = torch.zeros_like(a)  # |d| = a exactly
    n, edges, at = a.numel(), [], 0
    for c in sorted(zip(offs, copies)):
        edges += [at, at + c[1] - 1]
        at += c[1]
    pos = sorted({min(max(p + d, 0), n - 1) for p in edges for d in (-1, 0, 1)})
    qs = sorted({0.0} | {p / (n - 1) for p in pos})
    # three a call (at most 6 ranks) and 1.0 (rank n - 1, the largest key) with the first: at most
    # SEL_NS (8) distinct ranks, one finish
    for k in range(0, len(qs), 3):
        part = tuple(qs[k:k + 3]) + ((1.0,) if k == 0 else ())
        g, last, _ = _fin_both_ways(a, e, part, fin_hooks)
        assert last["store_all_fins"] == 1 and last["left_to_levels"] == 0, last
        assert last["by_select"] >= 1, last


def test_fin_big_tie_bucket_beside_a_small_many_valued_one(fin_hooks):
    """One batch with a one-value bucket of far more than FIN_CAP keys (answered by its extremes)
    and a small bucket of many values (selected in): the big bucket's keys are not counted against the
    region, so the finish answers both."""
    gen = torch.Generator(device=DEV).manual_seed(GEN_SEED + 302)
    n_tie, n_small = 5 * FIN_CAP, 3000
    e = torch.ones(n_tie + n_small, dtype=torch.float64, device=DEV)
    a = torch.cat([torch.full((n_tie,), 2.0, dtype=torch.float64, device=DEV),  # |d| = 1 exactly
                   3.0 + 0.1 * torch.rand(n_small, generator=gen, device=DEV, dtype=torch.float64)])
    a = a[torch.randperm(a.numel(), generator=gen, device=DEV)]
    qs = (0.3, 0.97)  # one rank pair in the tie bucket, one among the [2, 2.1) values
    g, last, _ = _fin_both_ways(a, e, qs, fin_hooks)
    assert last["left_to_levels"] == 0 and last["by_ties"] == 2 and last["by_select"] == 2, last


def test_fin_select_across_groups_at_bucket_edges(fin_hooks):
    """Several groups in one finish (ranks in different 1/16-octave buckets) in one region: each
    rank's key is selected at its group's offset in the region's order.  Values at and just below
    the buckets' edges (1.0, the largest double below 1.0625, 2.0, 0.25 ...) and 1.0625 itself,
    the next bucket's lowest key; a downward jitter on some of them keeps them in their bucket."""
    g0 = torch.Generator(device=DEV).manual_seed(GEN_SEED + 300)
    n = 6000
    base = torch.tensor([1.0, 1.0625 * (1 - 2 ** -52), 2.0, 3.999999, 0.25, 0.2656249],
                        dtype=torch.float64, device=DEV)
    e = torch.zeros(n, dtype=torch.float64, device=DEV)
    a = base[torch.randint(0, base.numel(), (n,), generator=g0, device=DEV)]
    jit = torch.rand(n, generator=g0, device=DEV, dtype=torch.float64)
    a = torch.where(jit < 0.5, a, a * (1 - 1e-9 * jit))
    a[::97] = 1.0625
    qs = tuple(i / 16 for i in range(17))
    g, last, _ = _fin_both_ways(a, e, qs, fin_hooks)
    assert last["by_select"] >= 8 and last["left_to_levels"] == 0, last


def test_fin_window_regions_are_selected_directly(fin_hooks, sel_hooks):
    """The window plan (forced at 2^17): a window's few stored keys are selected by one
    k_sel_fin block instead of five histogram passes, and the sample's order statistics (its
    finish) give the same windows; same values as with the finish off."""
    a, e = _window_case("noise_fp32", 1 << 17, seed=9)
    sel_hooks.set(plan=1)
    g, last, on = _fin_both_ways(a, e, QW, fin_hooks, after_on=sel_hooks.last)
    off = sel_hooks.last()
    assert last["window_direct"] >= 1, last
    assert on["in_stored"] >= 1 and on["radix_ranks"] == 0, on
    assert on == off  # the same windows, the same ranks at their pivots and inside


@pytest.mark.parametrize("kind", ["noise_fp32", "cauchy"])
def test_fin_window_region_after_level_one(kind, fin_hooks, sel_hooks):
    """A window's region of more than FIN_CAP stored keys (the window plan forced at 2^22: a
    16384-key sample, ~1% of the keys stored) spans one or two level-0 buckets, so its ranks
    take levels 0 and 1 and then the finish over the rank's level-1 bucket (k_sel_fin with
    pshift 36: a few keys, selected among), and levels 2-4 return at once (window_level1 counts those
    batches).  Same values and windows as with the finish off (five levels) == CPU == oracle;
    a finish that grouped the keys by their level-0 bucket would match none and leave the
    ranks to the levels (window_level1 == 0: fails)."""
    a, e = _window_case(kind, 1 << 22, seed=13)
    sel_hooks.set(plan=1)
    g, last, on = _fin_both_ways(a, e, QW, fin_hooks, after_on=sel_hooks.last)
    off = sel_hooks.last()
    assert on["in_stored"] >= 1 and on["radix_ranks"] == 0 and on["overflowed"] == 0, on
    assert last["window_level1"] >= 1, last
    assert on == off


# ---- issue #13: a small call's selection chained behind the reduction (n <= TINY_CAP) ---------
#
# Up to TINY_CAP pairs one k_sel_tiny block is queued right behind the reduction (cuda/select.cu): it
# takes the ranks from the reduction's record on the device, keys every pair into shared memory (a
# non-finite pair's key has bit 63 set, above every finite key), counts the finite keys against the
# record's (the input-changed check) and selects among them all; the host waits once for both.
# Every case: the default call == CPU engine == float64 oracle, and == the same call through the
# level-0 histogram with the finish after it (knob 2) and through the four levels (knob 1).


def _qbits(r):
    return {q: struct.pack("<d", v) for q, v in r.quantiles.items()}  # NaN-safe, -0 != 0


def _tiny_three_ways(a, e, quantiles, fin_hooks, oracle=True, after_default=None):
    """The default call (checked by check3) and its hooks, then the two other ways: the same
    quantiles bit for bit, neither taking k_sel_tiny.  after_default(): called right after the
    default call (to read other hooks before the other ways overwrite them)."""
    fin_hooks.set_default()
    g = check3(a, e, quantiles=quantiles, oracle=oracle)
    last = fin_hooks.last()
    if after_default is not None:
        after_default()
    for off in (False, True):
        fin_hooks.set(off=off)
        h = vgct_ext.compare(a, e, quantiles=quantiles)
        assert fin_hooks.last()["tiny_batches"] == 0
        assert _qbits(g) == _qbits(h), (off, dict(g.quantiles), dict(h.quantiles))
    fin_hooks.set_default()
    return g, last


def _batches(nf, quantiles):
    return -(-_distinct_ranks(nf, quantiles) // 8)  # SEL_NS ranks a batch


@pytest.mark.parametrize("kind", WINDOW_KINDS)
def test_tiny_selection_every_distribution(kind, fin_hooks):
    """5000 pairs of every data shape (ties, identical, offset, heavy tails, outliers, NaN/inf,
    a float32 overflow, a sparse change): k_sel_tiny answers every quantile, exactly, one
    fin_select call per batch of 8 distinct ranks."""
    a, e = _window_case(kind, 5000, seed=21)
    g, last = _tiny_three_ways(a, e, QW, fin_hooks)
    assert last["tiny_batches"] == _batches(g.n_finite, QW), last
    assert last["store_all_fins"] == last["left_to_levels"] == 0, last


@pytest.mark.parametrize("shape,layout", [((1,), "flat"), ((2,), "flat"), ((33,), "flat"),
                                          ((1000,), "flat"), ((64, 128), "transposed"),
                                          ((3, 50, 40), "strided"), ((9000,), "inner stride 3"),
                                          ((120, 90), "rows and columns strided"),
                                          ((FIN_CAP + 3,), "flat"), ((TINY_CAP,), "flat"),
                                          ((96, 170), "transposed")])
@pytest.mark.parametrize("dt_a,dt_e", [("bfloat16", None), ("float16", "float32"), ("float32", None),
                                       ("float64", None), ("int32", "float32")])
def test_tiny_selection_sizes_dtypes_layouts(shape, layout, dt_a, dt_e, fin_hooks, coop_hooks):
    """One pair to TINY_CAP pairs, typed and generic dtype pairs, contiguous, transposed and
    strided views -- a non-unit innermost stride among them (every key at its iteration position
    in shared memory; a store-all call filled the candidate buffer with larger keys just before,
    which k_sel_tiny must not read): exact at 21 quantiles (six batches of ranks above 40
    pairs)."""
    coop_hooks.set(mode=1)  # k_sel_tiny up to TINY_CAP (by default k_sel_coop past TINY_PREFER)
    a, e = _laid_out(*pair(shape, getattr(torch, dt_a), dt_e and getattr(torch, dt_e), seed=22), layout, 3)
    qs = tuple(j / 20 for j in range(21))
    _poison_candidate_buffer()
    g, last = _tiny_three_ways(a, e, qs, fin_hooks)
    assert last["tiny_batches"] == _batches(g.n_finite, qs), last


def _laid_out(a, e, layout, step):
    """Views of (a, e) laid out as `layout` says: "flat"/"contiguous" as they are, "transposed"
    (.t()), "strided" (every step-th row of the middle axis, the last axis from 1), "inner stride 3"
    (x[::3]), "rows and columns strided" (a and e at different offsets)."""
    if layout == "transposed":
        return a.t(), e.t()
    if layout == "strided":
        return a[:, ::step, 1:], e[:, ::step, 1:]
    if layout == "inner stride 3":
        return a[::3], e[::3]
    if layout == "rows and columns strided":
        return a[1::2, ::3], e[::2, 1::3]
    return a, e


def _poison_candidate_buffer():
    """A store-all call of 20000 pairs with |d| = 1e6 leaves its keys at buffer positions 0..19999
    (a selection that read the buffer instead of the inputs would find keys above every real one);
    k_sel_coop, which would take the call and store nothing, held off by its hook."""
    import ctypes

    from vgct_ext import _C

    lib = ctypes.CDLL(_C.__file__)
    mode = (ctypes.c_longlong * 2).in_dll(lib, "vgct_cuda_test_coop")
    plan = (ctypes.c_longlong * 6).in_dll(lib, "vgct_cuda_test_sel_last")
    old = mode[0]
    mode[0] = 1
    try:
        x = torch.full((20000,), 1e6, dtype=torch.float32, device=DEV)
        vgct_ext.compare(x, torch.zeros_like(x), quantiles=(0.5,))
        assert plan[5] == 1, list(plan)  # store-all ran: the buffer holds the keys
    finally:
        mode[0] = old


def test_tiny_selection_takes_tiny_cap_pairs_and_not_one_more(fin_hooks, coop_hooks):
    """TINY_PREFER pairs take k_sel_tiny, TINY_PREFER + 1 k_sel_coop (the faster from there); with
    k_sel_coop off (hook 1) TINY_CAP pairs take k_sel_tiny and TINY_CAP + 1 the level-0 histogram
    and the finish after it.  The same quantiles every way."""
    for n, tiny in ((TINY_PREFER, True), (TINY_PREFER + 1, False)):
        a, e = pair((n,), torch.float32, seed=23)
        g, last = _tiny_three_ways(a, e, (0.5, 0.99), fin_hooks)
        assert (last["tiny_batches"] == 1) == tiny and last["store_all_fins"] == 0, last
        g2 = vgct_ext.compare(a, e, quantiles=(0.5, 0.99))  # (the three ways leave the default last)
        assert (coop_hooks.last()["grid"] > 1) != tiny and _qbits(g2) == _qbits(g), coop_hooks.last()
    coop_hooks.set(mode=1)
    for n, tiny in ((TINY_CAP, True), (TINY_CAP + 1, False)):
        a, e = pair((n,), torch.float32, seed=24)
        g, last = _tiny_three_ways(a, e, (0.5, 0.99), fin_hooks)
        assert (last["tiny_batches"] == 1) == tiny and (last["store_all_fins"] == 1) != tiny, last
        assert coop_hooks.last()["grid"] == 0, coop_hooks.last()


@pytest.mark.parametrize("finite", [1, 2, 7, 700])
def test_tiny_selection_nonfinite_pairs_above_every_finite_key(finite, fin_hooks):
    """A call of mostly non-finite pairs (NaN, +inf, -inf, in a or in e): their keys sort above
    every finite key, so rank n_finite - 1 (q = 1) is the largest finite |d|; the finite count the
    block makes matches the record's (else: an input-changed error).  With one finite value
    repeated, the keys' highest differing bit is bit 63 (a finite key against a non-finite one)."""
    n = 3000
    gen = torch.Generator(device=DEV).manual_seed(GEN_SEED + 320 + finite)
    e = torch.randn(n, generator=gen, device=DEV, dtype=torch.float32)
    a = e + 1e-3 * torch.randn(n, generator=gen, device=DEV, dtype=torch.float32)
    keep = torch.randperm(n, generator=gen, device=DEV)[:finite]
    bad = torch.ones(n, dtype=torch.bool, device=DEV)
    bad[keep] = False
    vals = torch.tensor([float("nan"), float("inf"), -float("inf")], device=DEV)
    junk = vals[torch.arange(n, device=DEV) % 3]
    a = torch.where(bad & (torch.arange(n, device=DEV) % 2 == 0), junk, a)
    e = torch.where(bad & (torch.arange(n, device=DEV) % 2 == 1), junk, e)
    if finite == 7:  # one finite |d| value, seven times
        a[keep], e[keep] = 1.5, 1.0
    qs = (0.0, 0.3, 0.5, 0.99, 1.0)
    g, last = _tiny_three_ways(a, e, qs, fin_hooks)
    assert g.n_finite == finite and last["tiny_batches"] == _batches(finite, qs), (g.n_finite, last)
    d = (a[keep].double() - e[keep].double()).abs()
    assert g.quantiles[1.0] == float(d.max()) and g.quantiles[0.0] == float(d.min())


def _tiny_hooks():
    """(fin_last, sel_last, known_last) after the last call, as dicts / a list."""
    import ctypes

    from vgct_ext import _C

    lib = ctypes.CDLL(_C.__file__)
    fin_last = (ctypes.c_longlong * len(FIN_LAST)).in_dll(lib, "vgct_cuda_test_fin_last")
    fin = dict(zip(FIN_LAST, list(fin_last)))
    sel = dict(zip(SEL_LAST, list(_sel_hooks()[1])))
    return fin, sel, list(_known_hooks()[1])


@pytest.mark.parametrize("n", [3000, 200_000])
def test_tiny_selection_one_host_round_trip(n, fin_hooks):
    """A small or mid-size p99 call waits once (the chained kernel's completion word: k_sel_tiny,
    k_sel_coop past TINY_PREFER pairs), where the finish after the level-0 histogram (knob 2) waits
    twice; the record's answers on or off."""
    total = _sync_hooks()[0]
    a, e = pair((n,), torch.bfloat16, seed=63)
    for knob, want in ((0, 1), (2, 2)):
        if knob == 0:
            fin_hooks.set_default()
        else:
            fin_hooks.set(off=False)
        for known in (0, 1):
            _known_hooks()[0].value = known
            vgct_ext.compare(a, e, quantiles=(0.5, 0.99))
            before = total.value
            vgct_ext.compare(a, e, quantiles=(0.5, 0.99))
            assert total.value - before == want, (knob, known, total.value - before)
    _known_hooks()[0].value = 0
    fin_hooks.set_default()


def _chained_kernel():
    """Which kernel chained behind the reduction selected in the last call: "tiny", "coop" or None
    (cuda/select.cu vgct_cuda_test_sel_last[5]: 3 k_sel_tiny, 4 k_sel_coop)."""
    return {3: "tiny", 4: "coop"}.get(_sel_hooks()[1][5])


@pytest.mark.parametrize("dt_a,dt_e,shape,layout,kernel", [
    ("bfloat16", None, (1000,), "contiguous", "tiny"), ("float16", "float32", (57, 129), "transposed", "tiny"),
    ("int32", "int64", (5000,), "contiguous", "tiny"), ("bfloat16", None, (300_000,), "contiguous", "coop"),
    ("float16", "float32", (257, 129), "transposed", "coop")])
def test_tiny_selection_answers_read_after_its_word(dt_a, dt_e, shape, layout, kernel, signal_hook):
    """Two inputs P and Q alternate (different quantile values), with the host learning of the end from
    the chained kernel's word (hook 0) and from a stream synchronisation (hook 1), once with the
    stream kept busy before the call (the wait outlasts its spin): every call's quantiles equal
    that input's computed alone on the CPU -- answers read before k_sel_tiny (or k_sel_coop, past
    TINY_PREFER pairs) wrote them (the previous call's, on the other input) would not."""
    a, b, e = _two_records(dt_a, dt_e, shape, layout, seed=64)
    qs = (0.1, 0.5, 0.99)
    want = {w: _qbits(vgct_ext.compare(x.cpu(), e.cpu(), quantiles=qs)) for w, x in (("P", a), ("Q", b))}
    assert want["P"] != want["Q"]
    for i, (mode, which) in enumerate(((1, "Q"), (0, "P"), (1, "P"), (0, "Q"), (1, "Q"), (0, "P"), (0, "Q"))):
        signal_hook.value = mode
        if i in (3, 6):
            torch.cuda._sleep(20_000_000)
        g = vgct_ext.compare(a if which == "P" else b, e, quantiles=qs)
        assert _qbits(g) == want[which], (i, mode, which)
        assert _chained_kernel() == kernel, (i, mode, which)


@pytest.mark.parametrize("n,kernel", [(1000, "tiny"), (100_000, "coop")])
def test_tiny_selection_word_never_written_is_an_error_not_a_hang(n, kernel, signal_hook):
    """Planted: neither the reduction nor the chained kernel (k_sel_tiny; k_sel_coop past TINY_PREFER
    pairs) is asked to write its completion word (hook 2): the wait ends in a RuntimeError naming
    the chained kernel's word, and the next call is right."""
    import time

    a, _, e = _two_records("bfloat16", None, (n,), "contiguous", seed=65)
    signal_hook.value = 2
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match="chained kernel's completion word .the stream finished"):
        vgct_ext.compare(a, e, quantiles=(0.99,))
    assert time.perf_counter() - t0 < 30
    signal_hook.value = 0
    check3(a, e, quantiles=(0.5, 0.99))
    assert _chained_kernel() == kernel


@pytest.mark.parametrize("n,kernel", [(2000, "tiny"), (60_000, "coop")])
def test_tiny_selection_input_changed_is_reported(n, kernel, fin_hooks):
    """Planted (cuda/select.cu vgct_cuda_test_tiny_plant = 1): the chained kernel (k_sel_tiny;
    k_sel_coop's grid past TINY_PREFER pairs) counts one finite key less than the record's
    n_finite, as if a pair had turned non-finite while compare read the inputs -- the call raises
    vgct_ext's input-changed error (a RuntimeError) instead of answering, with the record answering
    no rank (selection_only) or some (the default); the next call is right."""
    import ctypes

    from vgct_ext import _C

    plant = ctypes.c_longlong.in_dll(ctypes.CDLL(_C.__file__), "vgct_cuda_test_tiny_plant")
    a, e = pair((n,), torch.bfloat16, seed=67)
    try:
        for known in (1, 0):
            _known_hooks()[0].value = known
            plant.value = 1
            with pytest.raises(RuntimeError, match=f"^input changed during compare: {n} finite pairs in "
                                                   f"the reduction, {n - 1} in the quantile pass"):
                vgct_ext.compare(a, e, quantiles=(0.5, 0.99))
            plant.value = 0
            check3(a, e, quantiles=(0.5, 0.99))
            assert _chained_kernel() == kernel
            _tiny_three_ways(a, e, (0.5, 0.99), fin_hooks)
    finally:
        plant.value = 0
        _known_hooks()[0].value = 1  # (selection_only's value; it resets to 0 after)


@pytest.mark.parametrize("shape,dim,kernel", [((40, 150), 0, "tiny"), ((40, 150), 1, "tiny"),
                                               ((6, 40_000), 0, "coop")])
def test_tiny_selection_with_per_slice_statistics(shape, dim, kernel):
    """compare(dim=k) with quantiles: the record and the slices come back by a copy, the chained
    kernel (k_sel_tiny; k_sel_coop past TINY_PREFER pairs) reads the record in the workspace and the
    host synchronises the stream once -- slices and quantiles == CPU engine == float64 oracle."""
    a, e = pair(shape, torch.bfloat16, seed=66)
    total = _sync_hooks()[0]
    vgct_ext.compare(a, e, quantiles=QS, dim=dim)
    before = total.value
    vgct_ext.compare(a, e, quantiles=QS, dim=dim)
    assert total.value - before == 1
    check3(a, e, quantiles=QS, dim=dim)
    assert _chained_kernel() == kernel


@pytest.mark.parametrize("base,step,kernel", [(500, 900, "tiny"), (20_000, 37_000, "coop")])
def test_tiny_selection_from_threads_on_their_own_streams(base, step, kernel):
    """Eight threads, each on its own stream with its own input, 30 p99 calls each, at once: every
    call's quantiles equal that input's computed alone (the chained kernel's answers and its word --
    k_sel_tiny's, or k_sel_coop's grid for the larger inputs -- are the device workspace's, taken
    under its lock)."""
    inputs = []
    for k in range(8):
        a, e = pair((base + step * k,), torch.bfloat16 if k % 2 else torch.float32, seed=70 + k)
        inputs.append((a, e, _qbits(check3(a, e, quantiles=(0.5, 0.99)))))
        assert _chained_kernel() == kernel  # (the hooks are global: checked here, alone)
    _same_from_threads_on_own_streams(
        inputs, lambda a, e: _qbits(vgct_ext.compare(a, e, quantiles=(0.5, 0.99))))


# ---- issue #13: a mid-size call's selection, one cooperative launch (k_sel_coop) -------------
# Past TINY_PREFER pairs, up to a block's COOP_KEYS = 16384 keys on every SM, the selection is one
# cooperative grid chained behind the reduction: each block keys its pairs into its shared memory,
# and the grid runs fin_select's radix selection together (a grid barrier per 8-bit digit).  Hooks
# (cuda/select.cu): vgct_cuda_test_coop [mode: 0 automatic, 1 off, 2 from one pair on; the most
# blocks]; vgct_cuda_test_coop_last [blocks, radix passes, batches] of the last call.  Every case
# == the CPU engine == the float64 oracle (check3) == the store-all finish and the four levels
# (_tiny_three_ways: knobs 2 and 1 take neither chained kernel).

COOP_LAST = ("grid", "passes", "batches")


@pytest.fixture
def coop_hooks():
    """set(mode=0, blocks=0) and last() -> dict of k_sel_coop's hooks; zeroed after."""
    import ctypes

    from vgct_ext import _C

    lib = ctypes.CDLL(_C.__file__)
    knobs = (ctypes.c_longlong * 2).in_dll(lib, "vgct_cuda_test_coop")
    last = (ctypes.c_longlong * 3).in_dll(lib, "vgct_cuda_test_coop_last")

    class Hooks:
        @staticmethod
        def set(mode=0, blocks=0):
            knobs[0], knobs[1] = mode, blocks

        @staticmethod
        def last():
            return dict(zip(COOP_LAST, list(last)))

    yield Hooks
    knobs[0] = knobs[1] = 0


def _coop_three_ways(a, e, quantiles, fin_hooks, coop_hooks, oracle=True):
    """_tiny_three_ways, and k_sel_coop's and the selection's hooks of the default call."""
    hooks = {}

    def read():
        hooks["coop"], hooks["sel"] = coop_hooks.last(), dict(zip(SEL_LAST, list(_sel_hooks()[1])))

    g, _ = _tiny_three_ways(a, e, quantiles, fin_hooks, oracle=oracle, after_default=read)
    return g, hooks["coop"], hooks["sel"]


@pytest.mark.parametrize("kind", WINDOW_KINDS)
def test_coop_selection_every_distribution(kind, fin_hooks, coop_hooks):
    """300,000 pairs of every data shape (ties, identical, offset, heavy tails, outliers, NaN/inf, a
    float32 overflow, a sparse change): k_sel_coop answers every quantile of QW exactly, on
    several blocks, one batch per 8 distinct ranks."""
    a, e = _window_case(kind, 300_000, seed=81)
    g, cl, sl = _coop_three_ways(a, e, QW, fin_hooks, coop_hooks)
    assert cl["grid"] > 1 and cl["batches"] == _batches(g.n_finite, QW), cl
    assert sl["radix_plan"] == 4 and sl["radix_ranks"] == _distinct_ranks(g.n_finite, QW), sl
    if kind == "identical":  # every key 0: one value, no radix pass
        assert cl["passes"] == 0, cl


@pytest.mark.parametrize("shape,layout", [((TINY_CAP + 1,), "flat"), ((250, 1201), "transposed"),
                                          ((3, 300, 400), "strided"), ((90_001,), "inner stride 3"),
                                          ((700, 900), "rows and columns strided"),
                                          ((1 << 20,), "flat")])
@pytest.mark.parametrize("dt_a,dt_e", [("bfloat16", None), ("float16", "float32"), ("float32", None),
                                       ("float64", None), ("int32", "float32")])
def test_coop_selection_sizes_dtypes_layouts(shape, layout, dt_a, dt_e, fin_hooks, coop_hooks):
    """TINY_CAP + 1 to 2^20 pairs, typed and generic dtype pairs, contiguous, transposed and strided
    views (chunks cut at rows: a block's last chunks partly empty), 21 quantiles (six batches):
    exact, the candidate buffer poisoned first (k_sel_coop reads the inputs, never the buffer)."""
    a, e = _laid_out(*pair(shape, getattr(torch, dt_a), dt_e and getattr(torch, dt_e), seed=82), layout, 2)
    qs = tuple(j / 20 for j in range(21))
    _poison_candidate_buffer()
    g, cl, sl = _coop_three_ways(a, e, qs, fin_hooks, coop_hooks)
    assert cl["grid"] >= 1 and cl["batches"] == _batches(g.n_finite, qs), cl
    assert sl["radix_plan"] == 4, sl


@pytest.mark.parametrize("n,blocks", [(1, 0), (2, 0), (33, 0), (1000, 0), (5000, 3), (TINY_CAP, 1),
                                      (40_000, 7), (40_000, 64)])
@pytest.mark.parametrize("kind", ["bf16_rounding", "noise_fp32", "nan_inf", "cauchy"])
def test_coop_selection_small_and_few_blocks(n, blocks, kind, fin_hooks, coop_hooks):
    """Hook 2 sends calls from one pair on to k_sel_coop (instead of k_sel_tiny), and the block cap
    makes one, three, seven, 64 blocks hold the keys: exact against the CPU engine, the oracle and
    the other plans; the hooks report the grid it ran."""
    if n < 40:
        a, e = pair((n,), torch.float32, seed=83)
    else:
        a, e = _window_case(kind, n, seed=83)
    coop_hooks.set(mode=2, blocks=blocks)
    g, cl, sl = _coop_three_ways(a, e, QW, fin_hooks, coop_hooks)
    if g.n_finite:
        want = min(blocks, -(-n // 2048)) if blocks else -(-n // 2048)  # COOP_MIN_KEYS pairs a block
        assert sl["radix_plan"] == 4 and cl["grid"] == max(1, want), (cl, sl, want)


def test_coop_selection_takes_its_capacity_and_not_one_more(fin_hooks, coop_hooks):
    """With two blocks (the cap hook) k_sel_coop holds 2 x 16384 keys (float32: chunks of 8): 32768
    pairs take it, 32769 the store-all plan -- both exact and equal."""
    coop_hooks.set(blocks=2)
    for n, coop in ((32768, True), (32769, False)):
        a, e = pair((n,), torch.float32, seed=84)
        g, cl, sl = _coop_three_ways(a, e, (0.5, 0.99), fin_hooks, coop_hooks)
        assert (cl["grid"] == 2) == coop and (sl["radix_plan"] == 4) == coop, (n, cl, sl)
        assert coop or sl["radix_plan"] == 1, sl


def test_coop_selection_grid_refused_falls_back(fin_hooks, coop_hooks):
    """Planted (hook 3): a cooperative grid of 65535 blocks, which no device holds at once -- the
    launch is refused (cudaErrorCooperativeLaunchTooLarge), nothing is queued, and the call selects
    after the record (store-all, two host waits): exact; the next default call takes k_sel_coop."""
    total = _sync_hooks()[0]
    a, e = pair((70_000,), torch.bfloat16, seed=92)
    want = _qbits(check3(a, e, quantiles=(0.5, 0.99)))
    assert coop_hooks.last()["grid"] > 1
    coop_hooks.set(mode=3)
    before = total.value
    g = vgct_ext.compare(a, e, quantiles=(0.5, 0.99))
    assert total.value - before == 2 and _qbits(g) == want
    assert coop_hooks.last()["grid"] == 0 and _sel_hooks()[1][5] == 1, coop_hooks.last()
    coop_hooks.set()
    assert _qbits(vgct_ext.compare(a, e, quantiles=(0.5, 0.99))) == want
    assert coop_hooks.last()["grid"] > 1


def test_coop_selection_one_value_and_one_digit(fin_hooks, coop_hooks):
    """Every |d| one value (no radix pass: the keys' AND equals their OR) and |d| in two values one
    bit apart (one pass): exact, and the passes the hooks report."""
    n = 50_000
    e = torch.zeros(n, device=DEV)
    a = torch.full((n,), 0.5, device=DEV)
    g, cl, _ = _coop_three_ways(a, e, (0.1, 0.99), fin_hooks, coop_hooks)
    assert cl["passes"] == 0 and cl["grid"] > 1 and g.quantiles[0.99] == 0.5, cl
    a[::3] = 0.75  # 0.5 and 0.75: the keys differ in one mantissa bit
    g, cl, _ = _coop_three_ways(a, e, (0.1, 0.99), fin_hooks, coop_hooks)
    assert cl["passes"] == 1 and g.quantiles[0.1] == 0.5 and g.quantiles[0.99] == 0.75, cl


@pytest.mark.parametrize("kind", ["identical", "sparse", "zeros_and_noise", "noise_fp32"])
@pytest.mark.parametrize("nq", [1, 7, 64])
@pytest.mark.parametrize("n,kernel", [(4000, "tiny"), (100_000, "coop")])
def test_chained_selection_ranks_the_record_decides_on_the_device(kind, nq, n, kernel, coop_hooks):
    """With the record's answers on (the default): the chained selection (k_sel_tiny at 4000 pairs,
    k_sel_coop at 100,000) takes each quantile's ranks from the record on the device and drops the
    ones the record decides (zeros below n_finite - n_unequal, the maximum at n_finite - 1) and the
    duplicates -- the same ranks the host leaves to it, or the host reports an internal error --
    for 1, 7 and VGCT_MAX_QUANTILES = 64 quantiles (128 ranks: four warps' ballots, up to 16
    batches).  An identical pair leaves it nothing (the inputs not read: 0 batches); values == CPU
    engine == float64 oracle."""
    seed = 61 if kernel == "tiny" else 85
    if kind == "zeros_and_noise":  # 70% of the pairs equal: the low ranks are zeros
        a, e = pair((n,), torch.float32, seed=seed)
        a = torch.where(torch.arange(n, device=DEV) % 10 < 7, e, a)
    else:
        a, e = _window_case(kind, n, seed=seed + 1)
    qs = {1: (0.99,), 7: (0.0, 0.1, 0.3, 0.5, 0.9, 0.99, 1.0)}.get(nq) or tuple(j / 63 for j in range(64))
    assert len(qs) == nq
    g = check3(a, e, quantiles=qs)
    fin, sel, known = _tiny_hooks()
    cl = coop_hooks.last()
    left = known[1]
    assert known[0] + left == 2 * len(qs), known
    nf = g.n_finite
    ranks = _engine_ranks(nf, qs)
    decided = {r for r in ranks if r < nf - g.n_unequal or r == nf - 1}
    distinct_left = len(set(ranks) - decided)
    assert left == sum(r not in decided for r in ranks), (left, known)
    assert sel["radix_ranks"] == distinct_left, sel
    batches = fin["tiny_batches"] if kernel == "tiny" else cl["batches"]
    assert batches == -(-distinct_left // 8), (fin, cl)
    plan = 3 if kernel == "tiny" else 4
    assert sel["radix_plan"] == (plan if distinct_left else 0), sel
    assert (cl["grid"] > 1) == (kernel == "coop"), cl  # (the grid is reported when nothing is left)
    if kind == "identical":
        assert distinct_left == 0 and all(v == 0.0 for v in g.quantiles.values())


@pytest.fixture
def counter_hook():
    """The reduction's last-block counter read back after every compare (cuda/select.cu
    vgct_cuda_test_counter): a function returning its last value; the hook off after."""
    import ctypes

    from vgct_ext import _C

    h = (ctypes.c_longlong * 2).in_dll(ctypes.CDLL(_C.__file__), "vgct_cuda_test_counter")
    h[0], h[1] = 1, -1
    yield lambda: h[1]
    h[0], h[1] = 0, -1


@pytest.mark.parametrize("n,blocks", [(16_000, 1), (100_000, 7), (200_000, 0)])
def test_coop_selection_with_nothing_left_leaves_the_counter_zero(n, blocks, coop_hooks, counter_hook):
    """A mid-size call whose record answers every rank: k_sel_coop's blocks read the record and
    leave -- no key, no grid barrier -- and the last to arrive at the reduction's last-block
    counter answers and sets it back to zero.  On 1, 7 and all blocks (the cap hook), three
    rounds of: an identical pair (its answer and hooks checked), a reduction on fresh data (many
    blocks), every pair NaN (n_finite 0: the host reads no answer then, so only the word and the
    counter show the kernel ran and left), a p99 that selects, per-slice statistics (column mode
    on two blocks) -- all exact, and the counter read back as zero after every call (a counter
    left at the grid's size would make a later reduction's last block fold before every partial
    is in, most often unseen in the results: the read-back is the check)."""
    a, e = _window_case("bf16_rounding", n, seed=87)
    same = e.clone()
    nan = torch.full_like(e, float("nan"))
    coop_hooks.set(blocks=blocks)
    want_grid = min(blocks, -(-n // 2048))  # COOP_MIN_KEYS pairs a block
    for rnd in range(3):
        g = check3(same, e, quantiles=(0.5, 0.99))
        cl, sel = coop_hooks.last(), _tiny_hooks()[1]
        assert cl["passes"] == cl["batches"] == 0 and sel["radix_plan"] == 0, (cl, sel)
        assert cl["grid"] == want_grid if blocks else cl["grid"] > 1, cl
        assert g.quantiles[0.99] == 0.0 and g.n_unequal == 0 and counter_hook() == 0
        check3(*pair((1 << 20,), torch.float32, seed=88 + rnd), quantiles=())
        assert counter_hook() == 0
        g = check3(nan, nan, quantiles=(0.99,))
        assert g.n_finite == 0 and g.quantiles[0.99] is None and counter_hook() == 0, g
        g = check3(a, e, quantiles=(0.5, 0.99))
        cl, sel = coop_hooks.last(), _tiny_hooks()[1]
        assert cl["batches"] == 1 and sel["radix_plan"] == 4 and counter_hook() == 0, (cl, sel)
        check3(a.view(-1, 500), e.view(-1, 500), quantiles=(), dim=1)  # 500 slices: 2 blocks
        assert counter_hook() == 0


# ---- issue #13: the small-input reduce (VG_MODE_LEAN) against the fast path ------------------
# (fixtures lean_max and reduce_mode: near the top)

LEAN_CASES = [
    ("bfloat16", None, (1000,), "contiguous"), ("bfloat16", None, (257, 129), "transposed"),
    ("float16", None, (64, 33, 40), "strided"), ("float32", None, (3 << 16,), "contiguous"),
    ("bfloat16", "float32", (1 << 18,), "contiguous"), ("float8_e4m3fn", None, (4099,), "contiguous"),
    ("int32", "int64", (5000,), "contiguous"), ("bfloat16", None, (2, 16, 32, 8, 16), "dim1"),
]


@pytest.mark.parametrize("dt_a,dt_e,shape,layout", LEAN_CASES)
def test_lean_and_fast_reduce_agree(dt_a, dt_e, shape, layout, lean_max):
    """The lean kernel (every pair through the register update) and the fast-path kernels
    give the definition's maxima, indices and counters exactly and the sums within rounding,
    on every layout and dtype family; each checked against the CPU engine and the float64
    oracle (check3), and the two against each other field by field."""
    a, e = pair(shape, getattr(torch, dt_a), getattr(torch, dt_e) if dt_e else None, seed=31)
    dim = None
    if layout == "transposed":
        a, e = a.t(), e.t()
    elif layout == "strided":
        a, e = a[:, ::2, 1:], e[:, ::2, 1:]
    elif layout == "dim1":
        dim = 1
    # a planted record at the last index and an exact tie of it at a lower index k: both
    # kernels must report k (the lowest index among equal maxima)
    k = None
    if a.is_contiguous() and e.is_contiguous() and a.dtype in (torch.bfloat16, torch.float16,
                                                               torch.float32):
        fa, fe = a.view(-1), e.view(-1)
        k = fa.numel() // 3
        fa[-1] = fe[-1] + 64
        fa[k], fe[k] = fa[-1], fe[-1]
    out = {}
    for mode, n in (("lean", 1 << 62), ("fast", 0)):
        lean_max.value = n
        out[mode] = check3(a, e, quantiles=(0.5, 0.99), dim=dim)
        if k is not None:
            assert out[mode].max_abs_err_index == tuple(int(i) for i in np.unravel_index(k, a.shape)), mode
    assert_same_stats(out["lean"], out["fast"])


# ---- the DLPack C exchange API on CUDA (csrc/bridge.c vgct_bridge_import_exchange) ----------

def _torch_exchange_api():
    if "__dlpack_c_exchange_api__" not in torch.Tensor.__dict__:
        pytest.skip(f"torch {torch.__version__} has no DLPack C exchange API (torch < 2.10)")


def test_exchange_api_on_the_current_stream_reads_what_the_stream_wrote(monkeypatch):
    """A plain torch CUDA tensor whose device's current stream is the stream compare() computes on
    is exported by the C table (torch's __dlpack__ / __dlpack_device__ never called: patched to
    fail) with no synchronisation -- on the default stream and on a side stream made current,
    the pair written by kernels queued just before on that stream, read right after."""
    _torch_exchange_api()

    def refuse(self, *a, **k):
        raise AssertionError("__dlpack__/__dlpack_device__ called on the exchange path")

    monkeypatch.setattr(torch.Tensor, "__dlpack__", refuse)
    monkeypatch.setattr(torch.Tensor, "__dlpack_device__", refuse)
    side = torch.cuda.Stream()
    for stream in (torch.cuda.current_stream(), side):
        with torch.cuda.stream(stream):
            e = torch.randn(1 << 20, device="cuda", dtype=torch.float32)
            torch.cuda._sleep(2_000_000)  # keep the stream busy: a missing order would read early
            a = (e + 1e-3 * torch.randn_like(e)).to(torch.bfloat16)
            g = check3(a, e, quantiles=(0.5, 0.99))
        assert g.n == 1 << 20


def test_compare_takes_the_producers_stream_without_python_look_ups(monkeypatch):
    """vgct_ext.compare of two plain torch CUDA tensors leaves the stream to the producer
    (_C.PRODUCER_STREAM: _C reads torch's current work stream on the tensors' device through the
    C table; vgct_ext.core._dlpack.call_on_stream, the Python look-ups, patched to fail): on a
    side stream made current and on the default stream, the pair written by kernels queued just
    before on that stream (kept busy: a wrong stream would read early) is read after them, the
    p99's launches included -- values equal to the CPU engine's and the float64 oracle's."""
    _torch_exchange_api()
    from vgct_ext.core import _dlpack

    def refuse(xs, fn):
        raise AssertionError("call_on_stream on the producer's path")

    monkeypatch.setattr(_dlpack, "call_on_stream", refuse)
    side = torch.cuda.Stream()
    for stream in (side, torch.cuda.current_stream()):
        for n in (1 << 12, 1 << 21):
            with torch.cuda.stream(stream):
                e = torch.randn(n, device="cuda", dtype=torch.float32)
                torch.cuda._sleep(2_000_000)
                a = (e + 1e-3 * torch.randn_like(e)).to(torch.bfloat16)
                g = check3(a, e, quantiles=(0.5, 0.99))
            assert g.n == n


def test_exchange_api_on_another_stream_goes_through_dunder_dlpack(monkeypatch):
    """compare() on a stream that is not the tensors' current stream (an explicit stream= to
    _C.compare) must not take the no-synchronisation export: torch's __dlpack__(stream=...)
    orders its work first.  The spy counts the calls; the values match the CPU engine."""
    _torch_exchange_api()
    from vgct_ext import _C

    calls = []
    real = torch.Tensor.__dlpack__

    def spy(self, *a, **k):
        calls.append(k.get("stream"))
        return real(self, *a, **k)

    monkeypatch.setattr(torch.Tensor, "__dlpack__", spy)
    e = torch.randn(4096, device="cuda", dtype=torch.float32)
    a = e + 1e-3
    other = torch.cuda.Stream()
    got = _C.compare(a, e, quantiles=(), stream=other.cuda_stream)
    torch.cuda.synchronize()
    assert calls == [other.cuda_stream, other.cuda_stream]
    ref = _C.compare(a.cpu(), e.cpu(), quantiles=())
    assert got["max_abs_err"] == ref["max_abs_err"] and got["mismatches"] == ref["mismatches"]
    assert got["rel_l2"] == pytest.approx(ref["rel_l2"], rel=1e-12)


# ---- the chunk fast path's mismatch count at the tolerance boundary ----------------------------

def _in_dtype(x32, dt):
    """float32 NumPy values rounded to dt (bfloat16: to nearest, by torch), as float32."""
    if dt == "bfloat16":
        return torch.from_numpy(x32).to(torch.bfloat16).float().numpy()
    return x32


def _ulp(x32, dt):
    """The spacing of dt at |x| (float64), for stepping values of dt."""
    return np.spacing(np.abs(x32)).astype(np.float64) * (65536.0 if dt == "bfloat16" else 1.0)


def _boundary_pair(n, dt, rtol, atol, seed):
    """Pairs of dt values (as float32 NumPy arrays a, e) in groups of 8 -- one chunk of the fast path when
    contiguous: groups 0 mod 3 below atol + rtol |e| (by 2^-1 .. 2^-29 of it, then 0-2 ulps down: chunks
    where vg_fast_chunk may skip the exact count on its bound), 1 mod 3 within +-3 ulps of it, 2 mod 3 on it,
    with pairs 4x above it and equal pairs mixed in."""
    rng = np.random.default_rng(seed)
    e = _in_dtype((rng.standard_normal(n) * np.exp2(rng.integers(-12, 8, n))).astype(np.float32), dt)
    e[rng.random(n) < 0.05] = 0.0
    e64 = e.astype(np.float64)
    tol = atol + rtol * np.abs(e64)
    sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    group = (np.arange(n) // 8) % 3
    frac = np.where(group == 0, 1.0 - np.exp2(-rng.integers(1, 30, n).astype(np.float64)), 1.0)
    frac = np.where((group == 2) & (rng.random(n) < 0.3), 4.0, frac)
    a = _in_dtype((e64 + sign * tol * frac).astype(np.float32), dt)
    steps = np.where(group == 1, rng.integers(-3, 4, n), np.where(group == 0, -rng.integers(0, 3, n), 0))
    a = _in_dtype((a.astype(np.float64) + sign * steps * _ulp(a, dt)).astype(np.float32), dt)
    eq = (group == 2) & (rng.random(n) < 0.2)
    a[eq] = e[eq]
    return a, e


@pytest.mark.parametrize("dt", ["bfloat16", "float32"])
@pytest.mark.parametrize("layout", ["contiguous", "mixed", "dim1"])
@pytest.mark.parametrize("rtol,atol", [(1e-3, 1e-3), (1.6e-2, 1e-5), (0.0, 1e-3), (1e-3, 0.0)])
def test_mismatch_count_at_the_tolerance_boundary(dt, layout, rtol, atol, lean_max):
    """vg_fast_chunk counts the mismatches of a chunk exactly, skipping the per-pair test only when its
    float32 bound proves that no pair can mismatch (cuda/vgct_cuda_internal.cuh): on pairs within a few
    ulps of atol + rtol |e| (and chunks just below it), the GPU's n_mismatch and n_unequal equal the CPU
    engine's and the float64 oracle's (check3), on the ring kernel (contiguous), the strided kernel (a
    column-major against e row-major) and the row kernel (dim=1); the fast path forced (no lean kernel)."""
    lean_max.value = 0
    n = 1 << 21
    a_np, e_np = _boundary_pair(n, dt, rtol, atol, seed=sum(map(ord, f"{dt} {layout} {rtol} {atol}")))
    t = getattr(torch, dt)
    a = torch.from_numpy(a_np).to(DEV).to(t)
    e = torch.from_numpy(e_np).to(DEV).to(t)
    assert torch.equal(a.float().cpu(), torch.from_numpy(a_np))  # representable: no rounding by .to()
    dim = None
    if layout == "mixed":
        a, e = a.view(1 << 11, 1 << 10).t().contiguous().t(), e.view(1 << 11, 1 << 10)
    elif layout == "dim1":
        a, e, dim = a.view(16, 1 << 10, 128), e.view(16, 1 << 10, 128), 1
    g = check3(a, e, rtol=rtol, atol=atol, quantiles=(0.99,), dim=dim)
    # the data is what the test says: mismatches and non-mismatches both, at the boundary
    d = np.abs(a_np.astype(np.float64) - e_np.astype(np.float64))
    mism = d > atol + rtol * np.abs(e_np.astype(np.float64))
    assert g.mismatches == int(mism.sum()) and 0 < g.mismatches < n
    tol = atol + rtol * np.abs(e_np.astype(np.float64))
    near = np.abs(d - tol) <= 4 * _ulp(a_np, dt)
    assert near.sum() > n // 20
