"""Inputs that change under a compare, and refusals that name the argument (issue [G] items 2, 4, 7).

* An input whose memory another thread frees during a compare (torch ``x.set_(...)`` /
  ``x.data = ...``, NumPy ``resize(refcheck=False)`` of the array or of its base) must not
  crash the process: each case runs in a subprocess (a crash fails the test, not pytest) with
  a compare long enough for the other thread to act while the engine reads, and the result
  must be the statistics of the original values (the pair is equal: every error is 0).
* Every refusal names the argument (``actual`` / ``expected`` / ``x``), what is wrong and what
  to pass instead, with the original error chained (``__cause__``).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import vgct_ext
from vgct_ext.core import _dlpack


def _torch():
    return pytest.importorskip("torch")


# -- 1. inputs freed or resized by another thread during a compare --------------------------------

_ATTACK = textwrap.dedent("""
    import sys, threading, time
    import numpy as np
    import vgct_ext
    kind = sys.argv[1]
    n = 1 << 24  # 64-128 MiB per input: freed memory goes back to the OS (munmap), so a read crashes
    if kind.startswith("torch"):
        import torch
        # float64, as the NumPy cases: an equal float32 pair of 2^24 takes ~9 ms on one thread
        # (2026-12-02, the development host), less than the other thread's 10 ms sleep, so
        # every try could end before the attack; float64 takes 33-44 ms
        x = torch.randn(n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        y = x.clone()
        if kind == "torch_set":
            def attack():
                x.set_(torch.empty(0, dtype=x.dtype))
        else:
            def attack():
                x.data = torch.empty(0, dtype=x.dtype)
        owner = None
    else:
        base = np.random.default_rng(0).standard_normal(n + 1)
        if kind == "numpy_resize":
            x, owner = base, base
        else:  # a view: the base owns the memory
            x, owner = base[1:], base
        y = x.copy()
        def attack():
            owner.resize((0,), refcheck=False)
    go = threading.Event()
    seen = {}
    def run():
        go.wait()
        time.sleep(0.01)  # the main thread is in the engine by now (GIL released)
        try:
            attack()
            seen["error"] = None
        except Exception as exc:
            seen["error"] = f"{type(exc).__name__}: {exc}"
        seen["t"] = time.perf_counter()
    th = threading.Thread(target=run)
    th.start()
    t0 = time.perf_counter()
    go.set()
    s = vgct_ext.compare(x, y, quantiles=(0.5, 0.99))
    t1 = time.perf_counter()
    th.join()
    during = t0 < seen["t"] < t1
    after = None
    if owner is not None:  # the pin is gone with the call: the resize works again
        owner.resize((0,), refcheck=False)
        after = owner.shape
    size = y.numel() if hasattr(y, "numel") else y.size
    print(repr(dict(during=during, size=size, n=s.n, n_unequal=s.n_unequal, max_abs_err=s.max_abs_err,
                    rel_l2=s.rel_l2, quantiles=dict(s.quantiles), error=seen["error"], after=after)))
""")


@pytest.mark.parametrize("kind", ["torch_set", "torch_data", "numpy_resize", "numpy_base_resize"])
def test_input_freed_by_another_thread_during_compare_does_not_crash(kind):
    if kind.startswith("torch"):
        _torch()
    env = dict(os.environ, VGCT_NUM_THREADS="1")  # a longer call: the other thread acts mid-way
    for _ in range(3):  # a loaded machine may schedule the other thread only after the call
        r = subprocess.run([sys.executable, "-c", _ATTACK, kind], capture_output=True, text=True,
                           env=env, timeout=300)
        assert r.returncode == 0, (f"{kind}: the compare crashed or failed (returncode "
                                   f"{r.returncode})\n{r.stdout}\n{r.stderr[-3000:]}")
        out = eval(r.stdout.strip().splitlines()[-1])  # noqa: S307 - our own repr of plain values
        if out["during"]:
            break
    assert out["during"], f"{kind}: the other thread never acted during the compare: {out}"
    # the original values were read: the pair is equal, every error exactly 0
    assert out["n"] == out["size"] >= 1 << 24 and out["n_unequal"] == 0 and out["max_abs_err"] == 0.0
    assert out["rel_l2"] == 0.0 and out["quantiles"] == {0.5: 0.0, 0.99: 0.0}
    if kind.startswith("numpy"):
        # NumPy itself refused the resize while the compare held its pin, and allowed it after
        assert out["error"] is not None and out["error"].startswith("ValueError: cannot resize"), out
        assert out["after"] == (0,)
    else:
        assert out["error"] is None  # torch replaced the caller's storage; the export kept its own


def test_pin_covers_the_base_chain_and_ends_with_the_call():
    base = np.zeros(10)
    view = base[2:5]
    keep = _dlpack.pin(view, 3.0, [1])
    assert len(keep) == 2  # the view and its base; other objects give nothing
    with pytest.raises(ValueError, match="cannot resize"):
        base.resize(3, refcheck=False)
    del keep
    base.resize(3, refcheck=False)
    assert base.shape == (3,)


def test_torch_export_is_an_alias_not_the_callers_tensor():
    torch = _torch()
    x = torch.arange(4.0)
    obj, override = _dlpack.prepare(x)
    assert obj is not x and override is None and obj.data_ptr() == x.data_ptr()
    x.set_(torch.empty(0))  # the caller's tensor gets another storage; the alias keeps the old one
    assert obj.tolist() == [0.0, 1.0, 2.0, 3.0]


# -- 2. producers' refusals name the argument and say what to pass --------------------------------


def _refusal(call, exc_type, pattern):
    with pytest.raises(exc_type, match=pattern) as ei:
        call()
    return ei.value


@pytest.mark.parametrize("side", ["actual", "expected"])
def test_torch_meta_tensor_names_the_side(side):
    torch = _torch()
    m, ok = torch.ones(3, device="meta"), torch.ones(3)
    args = (m, ok) if side == "actual" else (ok, m)
    err = _refusal(lambda: vgct_ext.compare(*args), BufferError,
                   rf"^{side}: a torch meta tensor \(device 'meta', shape \(3,\)\) has no data to read; "
                   r"expected a tensor on the CPU or a CUDA device")
    assert isinstance(err.__cause__, Exception)  # torch's own error, chained
    _refusal(lambda: vgct_ext.fingerprint(m), BufferError, r"^x: a torch meta tensor")


def test_torch_nested_sparse_quantized_tensors_name_the_side_and_the_fix():
    torch = _torch()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nt = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    err = _refusal(lambda: vgct_ext.compare(torch.ones(2), nt), TypeError,
                   r"^expected: a nested tensor \(torch\.nested\).*expected\.unbind\(\).*to_padded_tensor")
    assert err.__cause__ is not None
    sp = torch.ones(3).to_sparse()
    _refusal(lambda: vgct_ext.compare(sp, torch.ones(3)), TypeError,
             r"^actual: a tensor of layout torch\.sparse_coo; expected torch\.strided: pass actual\.to_dense\(\)$")
    q = torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8)
    _refusal(lambda: vgct_ext.compare(torch.ones(3), q), TypeError,
             r"^expected: a quantized tensor \(torch\.qint8\).*expected\.dequantize\(\)")


def test_torch_complex_points_to_view_as_real():
    torch = _torch()
    c = torch.ones(3, dtype=torch.complex64)
    err = _refusal(lambda: vgct_ext.compare(c, torch.ones(3)), TypeError,
                   r"^actual: complex dtype torch\.complex64; .*torch\.view_as_real\(actual\)")
    assert "unsupported dtype" in str(err.__cause__)
    # the advice works: the real views compare, and the oracle agrees
    a = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex128)
    e = torch.tensor([1 + 2.5j, 2 - 1j], dtype=torch.complex128)
    s = vgct_ext.compare(torch.view_as_real(a), torch.view_as_real(e), quantiles=())
    d = np.abs(torch.view_as_real(a).numpy() - torch.view_as_real(e).numpy())
    assert s.shape == (2, 2) and s.max_abs_err == d.max() == 1.0 and s.max_abs_err_index == (1, 0)


@pytest.mark.parametrize("arr,pattern", [
    (np.ones(3, dtype=object), r"dtype object \(Python objects\) has no DLPack type; pass {s}\.astype\(np\.float64\)"),
    (np.ones(3, dtype=np.longdouble), r"dtype \S+ \(long double\) has no DLPack type; pass {s}\.astype\(np\.float64\)"),
    (np.ones(3, dtype=">f4"), r"dtype '>f4' has non-native byte order .*{s}\.astype\({s}\.dtype\.newbyteorder\('='\)\)"),
    (np.array(["a", "b", "c"]), r"dtype <U1 \(strings, structured, void or datetime\) has no DLPack type"),
    (np.zeros(3, dtype="M8[s]"), r"dtype datetime64\[s\] \(strings"),
    (np.zeros(3, dtype="f4,f4"), r"dtype \[\('f0', '<f4'\), \('f1', '<f4'\)\] \(strings"),
])
@pytest.mark.parametrize("side", ["actual", "expected"])
def test_numpy_dtypes_without_dlpack_name_the_side_and_the_fix(arr, pattern, side):
    if arr.dtype == np.longdouble and np.dtype(np.longdouble).itemsize == 8:
        pytest.skip("long double is float64 on this platform")
    ok = np.ones(3)
    args = (arr, ok) if side == "actual" else (ok, arr)
    err = _refusal(lambda: vgct_ext.compare(*args), TypeError, "^" + side + ": " + pattern.format(s=side))
    assert "expected a real dtype" in str(err)
    assert isinstance(err.__cause__, BufferError)  # NumPy's own refusal, chained


def test_numpy_complex_points_to_real_views():
    c = np.array([1 + 2j, 3 - 1j])
    err = _refusal(lambda: vgct_ext.compare(np.zeros(2), c), TypeError,
                   r"^expected: complex dtype complex128; .*np\.real\(expected\).*expected\.view\(expected\.real\.dtype\)")
    assert err.__cause__ is not None
    # the advice works: interleaved real/imaginary parts, compared against a float64 oracle
    e = np.array([1 + 2.5j, 2 - 1j])
    s = vgct_ext.compare(c.view(c.real.dtype), e.view(e.real.dtype), quantiles=())
    assert s.shape == (4,) and s.max_abs_err == 1.0 and s.max_abs_err_index == (2,)
    assert s.norm_diff == pytest.approx(np.hypot(0.5, 1.0), rel=1e-15)


class _PyRefuses:
    """A producer whose Python __dlpack__ raises (a frame with ``self``)."""

    def __init__(self, exc):
        self.exc = exc
        self.calls = 0

    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, **kw):
        self.calls += 1
        raise self.exc


class _NoFrameRefuses:
    """A producer whose __dlpack__ leaves no frame with ``self`` (as C-level producers do)."""

    def __dlpack_device__(self):
        return (1, 0)

    __dlpack__ = staticmethod(lambda **kw: (_ for _ in ()).throw(RuntimeError("no export from C")))


@pytest.mark.parametrize("side", ["actual", "expected"])
def test_any_producer_error_is_reraised_naming_the_side(side):
    ok = np.zeros(2)
    p = _PyRefuses(RuntimeError("device lost"))
    args = (p, ok) if side == "actual" else (ok, p)
    err = _refusal(lambda: vgct_ext.compare(*args), BufferError,
                   rf"^{side}: .*_PyRefuses could not be exported through DLPack \(RuntimeError: device lost\); "
                   r"expected an array whose __dlpack__ exports its memory")
    assert err.__cause__ is p.exc and p.calls == 1  # traced by its frame: not exported again
    q = _NoFrameRefuses()
    args = (q, ok) if side == "actual" else (ok, q)
    err = _refusal(lambda: vgct_ext.compare(*args), BufferError,
                   rf"^{side}: .*_NoFrameRefuses could not be exported through DLPack \(RuntimeError: no export from C\)")
    assert isinstance(err.__cause__, RuntimeError)


def test_errors_that_are_not_an_inputs_are_left_alone():
    with pytest.raises(ValueError, match=r"^shape mismatch: actual has shape \(3,\), expected has shape \(3, 1\)"):
        vgct_ext.compare(np.ones(3), np.ones((3, 1)))
    with pytest.raises(ValueError, match=r"^dim 3 out of range for a tensor of 1 dims \(shape \(3,\)\)$"):
        vgct_ext.compare(np.ones(3), np.ones(3), dim=3)
    with pytest.raises(ValueError, match=r"^quantiles\[0\] must be a finite float in \[0, 1\]"):
        vgct_ext.compare(np.ones(3), np.ones(3), quantiles=(1.5,))
    with pytest.raises(TypeError, match=r"^actual: expected an object implementing __dlpack__ .*got list$") as ei:
        vgct_ext.compare([1.0], np.ones(1))
    assert ei.value.__cause__ is None


def test_named_refusals_leave_no_references_behind():
    import gc

    class _Refuses:
        def __dlpack_device__(self):
            return (1, 0)

        def __dlpack__(self, **kw):
            raise RuntimeError("gone")  # a new exception each time: no cycle of the producer's own

    ok, bad = np.ones(3), np.ones(3, dtype=object)
    before = (sys.getrefcount(ok), sys.getrefcount(bad))
    gc.disable()  # a reference cycle through the traceback would keep the inputs until a GC pass
    try:
        for _ in range(20):
            with pytest.raises(TypeError, match="^expected: dtype object"):
                vgct_ext.compare(ok, bad)
            with pytest.raises(BufferError, match="^actual: "):
                vgct_ext.compare(_Refuses(), ok)
            with pytest.raises(TypeError, match="^x: dtype object"):
                vgct_ext.fingerprint(bad)
        assert (sys.getrefcount(ok), sys.getrefcount(bad)) == before
    finally:
        gc.enable()


# -- 3. argument types: the argument is named ------------------------------------------------------


@pytest.mark.parametrize("kw,pattern", [
    (dict(rtol=None), r"^rtol must be a real number >= 0 \(a float\), got NoneType$"),
    (dict(atol=None), r"^atol must be a real number >= 0 \(a float\), got NoneType$"),
    (dict(rtol="1e-3"), r"^rtol must be a real number >= 0 \(a float\), got str$"),
    (dict(atol=True), r"^atol must be a real number >= 0 \(a float\), got bool$"),
    (dict(rtol=np.bool_(False)), r"^rtol must be a real number >= 0 \(a float\), got bool_?$"),
    (dict(rtol=[1e-3]), r"^rtol must be a real number >= 0 \(a float\), got list$"),
    (dict(quantiles=object()), r"^quantiles must be a float in \[0, 1\] or a sequence of them, got object$"),
    (dict(quantiles=3 + 0j), r"^quantiles must be a float in \[0, 1\] or a sequence of them, got complex$"),
    (dict(dim=1.5), r"^dim must be None or an int, got float$"),
    (dict(dim="0"), r"^dim must be None or an int, got str$"),
])
def test_argument_type_errors_name_the_argument(kw, pattern):
    with pytest.raises(TypeError, match=pattern):
        vgct_ext.compare(np.ones(3), np.ones(3), **kw)


@pytest.mark.parametrize("tol", [np.float32(0.25), np.float64(0.25), np.array(0.25), 1, np.int64(1)])
def test_tolerances_in_numpy_forms_are_the_same_tolerance(tol):
    a = np.array([0.0, 1.0, 2.0, 3.0])
    e = np.array([0.1, 1.6, 2.0, 4.5])
    s = vgct_ext.compare(a, e, rtol=tol, atol=tol)
    t = float(tol)
    want = int(np.count_nonzero(np.abs(a - e) > t + t * np.abs(e)))
    assert s.rtol == s.atol == t and s.mismatches == want


@pytest.mark.parametrize("zero", [-0.0, np.float64(-0.0), np.array(-0.0), 0.0])
def test_a_negative_zero_tolerance_is_reported_as_zero(zero):
    """rtol = atol = -0.0 is the tolerance 0 (every unequal pair mismatches) and is reported as
    +0.0, not -0.0 (a report or a recorded bar must not carry the sign of a zero)."""
    a = np.array([0.0, 1.0, 2.0, 3.0])
    e = np.array([0.0, 1.0, 2.5, 3.0 + 2.0 ** -50])
    s = vgct_ext.compare(a, e, rtol=zero, atol=zero)
    assert s.mismatches == int(np.count_nonzero(a != e)) == 2
    assert math.copysign(1.0, s.rtol) == math.copysign(1.0, s.atol) == 1.0 and s.rtol == s.atol == 0.0


# -- 4. masked arrays: refused, never compared with the mask ignored ------------------------------


@pytest.mark.parametrize("side", ["actual", "expected"])
@pytest.mark.parametrize("mask", [[False, True, False], [False, False, False]])
def test_masked_arrays_are_refused(side, mask):
    m = np.ma.masked_array([1.0, 2.0, 3.0], mask=mask)
    ok = np.array([1.0, 99.0, 3.0])
    args = (m, ok) if side == "actual" else (ok, m)
    err = _refusal(lambda: vgct_ext.compare(*args), TypeError,
                   rf"^{side}: a NumPy masked array \(numpy\.ma\.MaskedArray\); .*{side}\.filled\(value\).*{side}\.data")
    assert err.__cause__ is None
    _refusal(lambda: vgct_ext.fingerprint(m), TypeError, r"^x: a NumPy masked array")
    # the explicit forms are read as asked
    f = vgct_ext.compare(m.filled(99.0), ok, quantiles=())
    want = np.abs(np.where(mask, 99.0, [1.0, 2.0, 3.0]) - ok)
    assert f.max_abs_err == want.max() and f.n_unequal == int(np.count_nonzero(want))
    d = vgct_ext.compare(m.data, ok, quantiles=())
    assert d.max_abs_err == 97.0 and d.max_abs_err_index == (1,)


# -- 5. torch's CUDA stream and device: C-level look-ups, the stream read at every call -----------


def test_torch_stream_and_device_read_through_the_cached_functions_at_every_call(monkeypatch):
    torch = _torch()

    class CudaLooking(torch.Tensor):
        def __dlpack_device__(self):  # a CPU tensor that says it lives on cuda:0
            return (2, 0)

    x = torch.zeros(2).as_subclass(CudaLooking)
    asked, handle, current = [], [0x5678], [0]

    def raw_stream(index):
        asked.append(index)
        return handle[0]

    monkeypatch.setattr(_dlpack, "_torch_cuda_fns", (torch, lambda: current[0], raw_stream))
    assert _dlpack.call_on_stream((x, x), lambda s, *xs: s) == 0x5678
    assert asked == [x.get_device()]
    handle[0] = 0x9abc  # another current stream: seen by the next call (only the functions are cached)
    assert _dlpack.call_on_stream((x, x), lambda s, *xs: s) == 0x9abc
    handle[0] = 0  # the default stream's handle 0 is the spec's legacy default, 1
    assert _dlpack.consumer_stream(x) == 1
    # another torch module (a reload) finds its own functions again
    other = type(sys)("torch_other")
    assert _dlpack._torch_cuda(other) == (None, None) and _dlpack._torch_cuda_fns[0] is other


# -- 6. PairedStats._from_c: the same object as the constructor, key mismatches refused ------------


def test_from_c_equals_the_constructor_and_refuses_a_disagreeing_dict():
    import dataclasses
    import pickle

    from vgct_ext import _C
    from vgct_ext.core._stats import PairedStats, _unravel

    a = np.arange(24.0).reshape(2, 3, 4)
    e = a.copy()
    e[1, 2, 3] += 5.0
    e[0, 1, 0] = 0.0
    d = _C.compare(a, e, 1e-3, 1e-3, (0.5, 0.99), 1, None, None, None)
    got = PairedStats._from_c(d)
    fields = {k: d[k] for k in (f.name for f in dataclasses.fields(PairedStats))}
    for k in ("max_abs_err_index", "max_rel_err_index", "worst_mismatch_index", "first_class_mismatch_index"):
        fields[k] = None if d[k] is None else tuple(int(i) for i in np.unravel_index(d[k], a.shape))
    fields["slices"] = type(got.slices)(**d["slices"])
    want = PairedStats(**fields)
    assert got == want and got.max_abs_err_index == (1, 2, 3) == want.max_abs_err_index
    assert got.max_rel_err_index == (1, 2, 3) and got.first_class_mismatch_index is None
    assert type(got.quantiles) is type(want.quantiles) and got.quantiles == {0.5: 0.0, 0.99: np.quantile(np.abs(a - e), 0.99)}
    with pytest.raises(TypeError):
        got.quantiles[0.5] = 1.0  # read-only, as the constructor's
    assert pickle.loads(pickle.dumps(got)) == got
    assert _unravel(7, (10,)) == (7,) and _unravel(None, (3,)) is None and _unravel(5, (2, 3)) == (1, 2)
    bad = dict(d)
    del bad["n_unequal"]
    with pytest.raises(TypeError, match=r"_C\.compare gave no \['n_unequal'\]"):
        PairedStats._from_c(bad)
    bad = dict(d, n_unequal=0, surprise=1)
    with pytest.raises(TypeError, match=r"unknown fields \['surprise'\]"):
        PairedStats._from_c(bad)


def test_from_c_copies_a_callers_dict_and_unravels_as_numpy():
    """_from_c(d) keeps nothing of the caller's dict (compare alone hands over its fresh dict,
    _owned=True); the flat indices unravel as numpy.unravel_index does, any rank."""
    from vgct_ext import _C
    from vgct_ext.core._stats import PairedStats, _unravel

    a = np.arange(6.0)
    d = _C.compare(a, a + 1.0, 1e-3, 1e-3, (0.5,), None, None, None, None)
    got = PairedStats._from_c(d)
    d["n"], d["quantiles"][0.5] = -1, -1.0
    assert got.n == 6 and got.quantiles == {0.5: 1.0} and got.max_abs_err_index == (0,)
    for shape in ((5,), (2, 3), (4, 1, 3), (2, 3, 4, 5), (1, 1, 1, 7)):
        for flat in (0, 1, int(np.prod(shape)) - 1, int(np.prod(shape)) // 2):
            want = tuple(int(i) for i in np.unravel_index(flat, shape))
            assert _unravel(flat, shape) == want and all(type(i) is int for i in _unravel(flat, shape))
    assert _unravel(5, (3, 0, 2)) == (2, 0, 1) and _unravel(0, ()) == ()


def test_same_stream_export_asks_torch_for_no_synchronisation_only_on_its_own_stream(monkeypatch):
    """A plain torch tensor on CUDA whose current stream is the consumer stream is exported with
    __dlpack__(stream=-1) (nothing to synchronise: the DLPack spec's -1); on another stream, a
    subclass, or a CPU tensor, the input is passed unchanged (torch's own synchronising path)."""
    torch = _torch()
    x = torch.arange(4.0)
    calls = []
    real = torch.Tensor.__dlpack__

    def spy(self, **kw):
        calls.append(kw)
        return real(self, **kw)

    monkeypatch.setattr(torch.Tensor, "__dlpack__", spy)
    monkeypatch.setattr(_dlpack, "_torch_cuda_fns", (torch, lambda: 0, lambda index: 0x77))
    # a torch whose Tensor has the DLPack C exchange API: the tensor itself goes to _C, which
    # exports it by the C call and checks the stream itself (test_exchange_api.py)
    monkeypatch.setattr(_dlpack, "_has_exchange_api", lambda tp: True)
    assert _dlpack._same_stream_exports((x,), [(2, 0)], 0x77)[0] is x
    # a torch without it: the wrapper
    monkeypatch.setattr(_dlpack, "_has_exchange_api", lambda tp: False)
    (w,) = _dlpack._same_stream_exports((x,), [(2, 0)], 0x77)
    assert isinstance(w, _dlpack._SameStreamExport) and w.__dlpack_device__() == (2, 0)
    cap = w.__dlpack__(stream=0x77, max_version=(1, 0), copy=False)
    assert calls == [{"stream": -1, "max_version": (1, 0), "copy": False}]
    assert type(cap).__name__ == "PycapsuleType" or "capsule" in type(cap).__name__.lower()
    # another stream current, the default stream against the legacy 1, a subclass, the CPU
    assert _dlpack._same_stream_exports((x,), [(2, 0)], 0x78) == (x,)
    monkeypatch.setattr(_dlpack, "_torch_cuda_fns", (torch, lambda: 0, lambda index: 0))
    assert isinstance(_dlpack._same_stream_exports((x,), [(2, 0)], 1)[0], _dlpack._SameStreamExport)

    class Sub(torch.Tensor):
        pass

    y = x.as_subclass(Sub)
    assert _dlpack._same_stream_exports((y,), [(2, 0)], 1)[0] is y
    assert _dlpack._same_stream_exports((x,), [(1, 0)], 1)[0] is x
    assert _dlpack._same_stream_exports((x,), [(2, 0)], None)[0] is x
    # through call_on_stream, as compare() calls it: fn gets the consumer stream and the wrappers
    monkeypatch.setattr(_dlpack, "_torch_cuda_fns", (torch, lambda: 0, lambda index: 0x77))
    monkeypatch.setattr(_dlpack, "_device", lambda obj: (2, 0))
    s, xs = _dlpack.call_on_stream((x, x), lambda s, *xs: (s, xs))
    assert s == 0x77 and all(isinstance(w, _dlpack._SameStreamExport) and w.x is x for w in xs)
