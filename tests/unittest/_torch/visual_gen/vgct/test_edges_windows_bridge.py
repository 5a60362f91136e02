"""Edge cases of the fused window loop (every code level),
u64_mselect's branch-free partition (through the window selection), and the host-side
path of compare() (the C bridge's vectorcall fall-backs, the interned result keys)."""

import gc


import numpy as np
import pytest

from test_engine_internals import check_ranks_around_p99


def _edge_data(kind, n, rng):
    e = rng.standard_normal(n)
    if kind == "overflow":  # finite float64 pairs whose |a - e| overflows to +inf: ~2% at the top
        a = e * 1e-3
        big = rng.random(n) < 0.02
        a[big] = 1.7e308
        e[big] = -1.7e308
        return a, e
    if kind == "signed_zero_f32":  # float32 -0.0 / +0.0 / subnormals / huge: many zero keys
        a = (e * 1e-3).astype(np.float32)
        ee = e.astype(np.float32) * 0
        pick = rng.random(n)
        a[pick < 0.3] = -0.0
        ee[(pick >= 0.3) & (pick < 0.5)] = -0.0
        a[(pick >= 0.5) & (pick < 0.6)] = np.float32(1e-45) * rng.integers(1, 1000, int(((pick >= 0.5) & (pick < 0.6)).sum()))
        top = pick > 0.985  # huge magnitudes, all distinct (no tie pivot: the fused loop)
        a[top] = (rng.uniform(0.5, 1.0, int(top.sum())) * 3.4e38
                  * np.sign(rng.standard_normal(int(top.sum())))).astype(np.float32)
        ee[pick > 0.995] = -a[pick > 0.995]
        return a, ee
    if kind == "two_values":  # two keys only: the partition's equal block is half the data
        a = np.where(rng.random(n) < 0.5, 1.0, 2.0)
        return a, np.zeros(n)
    if kind == "sorted":  # keys ascending along the data (the partition's sorted input)
        return np.sort(np.abs(e)), np.zeros(n)
    if kind == "reversed":
        return np.sort(np.abs(e))[::-1].copy(), np.zeros(n)
    raise AssertionError(kind)


@pytest.mark.parametrize("level", [0, 1, 2], ids=["sse2", "avx2", "avx512"])
@pytest.mark.parametrize("kind", ["overflow", "signed_zero_f32", "two_values", "sorted", "reversed"])
def test_select_windows_edge_keys_every_code_level(engine, kind, level):
    """The fused window loop and the sample's u64_mselect on keys the existing window tests do
    not plant: +inf keys from finite float64 pairs (the window's upper pivot is then the +inf
    key), float32 -0.0 against +0.0, float32 subnormals and overflow-free huge values, two key
    values only, and keys already sorted / reverse-sorted along the data.  Every rank around the
    p99 and the extremes equals the float64 NumPy order statistic, at every code level."""
    rng = np.random.default_rng(101)
    a, e = _edge_data(kind, (1 << 18) + 4099, rng)
    check_ranks_around_p99(engine, a, e, level, want_windows=False)


# ---- the host-side call path ------------------------------------------------------

def _stats_repr(s):
    return repr(s.as_dict())


def test_result_dicts_are_independent_of_the_template():
    """_C.compare's dict starts as a PyDict_Copy of a module-level template: a caller that
    mutates (or empties) one result must not change the keys, order or values of the next."""
    from vgct_ext import _C
    x = np.linspace(-1.0, 1.0, 13)
    y = x + 1e-6
    first = _C.compare(x, y, 1e-3, 1e-3, (0.5,), None, None)
    keys = list(first)
    snapshot = repr(first)
    first.clear()
    first["junk"] = object()
    sl1 = _C.compare(x.reshape(13, 1), y.reshape(13, 1), 1e-3, 1e-3, (), 0, None)["slices"]
    sl_keys = list(sl1)
    sl1.clear()
    second = _C.compare(x, y, 1e-3, 1e-3, (0.5,), None, None)
    assert list(second) == keys and repr(second) == snapshot
    assert list(_C.compare(x.reshape(13, 1), y.reshape(13, 1), 1e-3, 1e-3, (), 0, None)["slices"]) == sl_keys


class _PosOnly:
    """A producer whose __dlpack__ takes stream positional-only: every attempt of the bridge
    (keywords stream+max_version+copy, stream+max_version, stream) is a TypeError."""

    def __init__(self, x):
        self.x = x
        self.calls = 0

    def __dlpack_device__(self):
        return self.x.__dlpack_device__()

    def __dlpack__(self, stream=None, /):
        self.calls += 1
        return self.x.__dlpack__()


class _KwargsOnly:
    """**kwargs: records the keyword names of each call, refuses copy= and max_version=."""

    def __init__(self, x, refuse):
        self.x = x
        self.refuse = refuse
        self.seen = []

    def __dlpack_device__(self):
        return self.x.__dlpack_device__()

    def __dlpack__(self, **kw):
        self.seen.append(tuple(kw))
        bad = [k for k in self.refuse if k in kw]
        if bad:
            raise TypeError(f"refused {bad[0]}")
        return self.x.__dlpack__(**{k: v for k, v in kw.items() if k in ("stream", "max_version")})


def test_vectorcall_fallbacks_kwargs_and_positional_only_producers():
    from vgct_ext import compare
    x = np.linspace(-1.0, 1.0, 29)
    y = x + 1e-5
    want = _stats_repr(compare(x, y))
    p = _KwargsOnly(x, refuse=("copy", "max_version"))
    assert _stats_repr(compare(p, y)) == want
    assert p.seen == [("stream", "max_version", "copy"), ("stream", "max_version"), ("stream",)]
    q = _PosOnly(x)
    with pytest.raises(TypeError) as ei:
        compare(q, y)
    assert q.calls == 0  # never entered: every attempt passes stream by keyword
    chain, exc = [], ei.value
    while exc is not None:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    assert sum("positional-only" in str(c) for c in chain) >= 3, [str(c) for c in chain]


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")
def test_compare_equals_the_stream_call_for_host_inputs():
    """compare() (its inline tolerance and default-quantile checks, its prepared inputs) equals
    the raw _C.compare call through _dlpack.call_on_stream for ndarray subclasses, torch
    subclasses, Parameters, tensors requiring grad, negative-bit views and mixed inputs."""
    torch = pytest.importorskip("torch")
    from vgct_ext import _C, compare
    from vgct_ext.core import _dlpack
    from vgct_ext.core._stats import PairedStats

    class Sub(torch.Tensor):
        pass

    x = np.linspace(-1.0, 1.0, 40, dtype=np.float32)
    y = x + np.float32(1e-4)
    tx, ty = torch.from_numpy(x.copy()), torch.from_numpy(y.copy())
    z = torch.complex(ty, tx).conj()  # .imag: a negative-bit view
    pairs = [(np.matrix(x), np.matrix(y)), (tx.as_subclass(Sub), ty), (torch.nn.Parameter(tx.clone()), y),
             (tx.clone().requires_grad_(), ty), (z.imag, -tx), (x, ty), (tx[::3], ty[::3])]
    for a0, e0 in pairs:
        a, da = _dlpack.prepare(a0, argname="actual")
        e, de = _dlpack.prepare(e0, argname="expected")
        ref = PairedStats._from_c(_dlpack.call_on_stream(
            (a, e), lambda s, xa, xe: _C.compare(xa, xe, 1e-3, 1e-3, (0.99,), None, s, da, de)))
        assert _stats_repr(compare(a0, e0)) == _stats_repr(ref), type(a0)
        assert _stats_repr(compare(a0, e0, quantiles=(0.99,), rtol=np.float64(1e-3))) == _stats_repr(ref)
    with pytest.raises(TypeError, match="masked array"):
        compare(np.ma.masked_array(x), y)


def test_host_calls_do_not_grow_memory():
    """Accepted and refused compare() calls, 20k each: no Python-heap growth (tracemalloc)."""
    import tracemalloc
    from vgct_ext import compare
    x = np.linspace(-1.0, 1.0, 17, dtype=np.float32)
    y = x + np.float32(1e-4)
    p = _KwargsOnly(x, refuse=("copy",))
    calls = [lambda: compare(x, y), lambda: compare(x.reshape(17, 1), y.reshape(17, 1), dim=1),
             lambda: compare(p, y), lambda: compare(_PosOnly(x), y), lambda: compare(x, y[:3]),
             lambda: compare(x, y, quantiles=(2.0,))]
    for fn in calls:
        def loop(n):
            for _ in range(n):
                try:
                    fn()
                except Exception:  # noqa: BLE001 - the refusals are the point
                    pass
            p.seen.clear()
        loop(500)
        gc.collect()
        tracemalloc.start()
        s0 = tracemalloc.take_snapshot()
        loop(20000)
        gc.collect()
        s1 = tracemalloc.take_snapshot()
        tracemalloc.stop()
        grown = sum(d.size_diff for d in s1.compare_to(s0, "filename"))
        assert grown < 64 * 1024, grown
