"""Hostile callers of the DLPack C exchange API path (csrc/bridge.c, vgct_bridge_import_exchange).

Every test checks behaviour against an independent expectation: float64 NumPy values (or torch's own
float64 conversion of its low-precision dtypes), the exception (type and message) that the same tensor
raises when it reaches the bridge through ``__dlpack__`` instead of the table, deleters run exactly
once and reference counts unchanged.  The producers are made here with ctypes: each builds a
DLManagedTensorVersioned by hand (so every field can be planted) and counts its deleter calls; the
same hand-built tensor can also be handed over in a "dltensor_versioned" capsule by ``__dlpack__``,
which is the reference path for the error messages.

Three of them found bugs the bridge now guards against (csrc/bridge.c): an export's KeyboardInterrupt /
SystemExit was cleared, the table was read after an export that can free it, and an export returning
success with an exception set was taken.
"""
import ctypes
import gc
import os
import subprocess
import sys
import sysconfig
import threading

import numpy as np
import pytest

import vgct_ext
from vgct_ext import _C

import oracle  # float64 NumPy, math.fsum
from test_exchange_api import _Forward  # torch's own __dlpack__ behind a type without the table
from test_exchange_api import _torch_with_api as _torch  # torch, skipping when it has no exchange table

# ---- the independent expectations ---------------------------------------------------------------


def _check_values(got, a, e):
    """_C.compare's dict against the float64 oracle (rtol = atol = 1e-3, the defaults)."""
    a, e = np.asarray(a, dtype=np.float64).ravel(), np.asarray(e, dtype=np.float64).ravel()
    d = a - e
    assert got["n"] == a.size
    if a.size == 0:
        assert got["max_abs_err"] is None and got["mismatches"] == 0
        return
    if np.any(e != 0):
        assert got["rel_l2"] == pytest.approx(oracle.norm_ratio(d, e), rel=1e-12, abs=0)
    assert got["max_abs_err"] == float(np.max(np.abs(d)))
    assert got["mismatches"] == int(np.count_nonzero(np.abs(d) > 1e-3 + 1e-3 * np.abs(e)))


def _outcome(fn):
    """('ok', dict) or (exception type, message)."""
    try:
        return "ok", fn()
    except Exception as exc:  # noqa: BLE001 - the outcome is what is compared
        return type(exc), str(exc)


# ---- torch's table: every kind of tensor against the __dlpack__ path and float64 -------------------


def _torch_pairs(torch):
    g = torch.Generator().manual_seed(5)
    e = torch.randn(6, 7, generator=g, dtype=torch.float64)
    a = e + 1e-3 * torch.randn(6, 7, generator=g, dtype=torch.float64)
    big = torch.randn(3, 5, 7, generator=g, dtype=torch.float64)
    pairs = {
        "float64": (a, e),
        "float32": (a.float(), e.float()),
        "float16": (a.half(), e.half()),
        "bfloat16": (a.bfloat16(), e.bfloat16()),
        "float8_e4m3fn": (a.to(torch.float8_e4m3fn), e.to(torch.float8_e4m3fn)),
        "float8_e5m2": (a.to(torch.float8_e5m2), e.to(torch.float8_e5m2)),
        "bool": (a > 0, e > 0),
        "int64": ((a * 100).long(), (e * 100).long()),
        "uint8": ((a.abs() * 40).to(torch.uint8), (e.abs() * 40).to(torch.uint8)),
        "uint16": ((a.abs() * 400).long().to(torch.uint16), (e.abs() * 400).long().to(torch.uint16)),
        "0-dim": (a[2, 3].clone(), e[2, 3].clone()),
        "zero-size": (a[:0], e[:0]),
        "zero-size 3-d": (torch.empty(4, 0, 2), torch.empty(4, 0, 2)),
        "expanded (stride 0)": (a[:1].expand(6, 7), e),
        "transposed": (a.t(), e.t().contiguous()),
        "strided, offset": (big[1:, ::2, 3:], big[:2, ::2, :4]),
        "channels_last": (big.reshape(1, 3, 5, 7).to(memory_format=torch.channels_last),
                          big.reshape(1, 3, 5, 7) * 1.001),
        "9 dims": (a.reshape(1, 2, 1, 3, 1, 7, 1, 1, 1), e.reshape(1, 2, 1, 3, 1, 7, 1, 1, 1)),
        "requires_grad": (a.clone().requires_grad_(), e),
    }
    with torch.inference_mode():
        pairs["inference tensor"] = (a * 1, e * 1)
    return pairs


_TORCH_KINDS = ["float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "bool",
                "int64", "uint8", "uint16", "0-dim", "zero-size", "zero-size 3-d", "expanded (stride 0)",
                "transposed", "strided, offset", "channels_last", "9 dims", "inference tensor"]


@pytest.mark.parametrize("kind", _TORCH_KINDS)
def test_torch_tensor_kinds_give_the_float64_values_and_the_dunder_paths_dict(kind):
    torch = _torch()
    a, e = _torch_pairs(torch)[kind]
    got = _C.compare(a, e, quantiles=())
    _check_values(got, a.double().numpy(), e.double().numpy())
    assert got == _C.compare(_Forward(a), _Forward(e), quantiles=())  # every key, not just three
    # the public path too (prepare(), call_on_stream, the default p99)
    st = vgct_ext.compare(a, e)
    assert st.max_abs_err == got["max_abs_err"] and st.mismatches == got["mismatches"]


def test_a_requires_grad_tensor_is_read_with_its_values():
    """torch's __dlpack__ refuses requires_grad tensors (BufferError) in Python; its C export does not.
    The bridge reads the values (correct ones): nothing is written, no autograd state is lost."""
    torch = _torch()
    a, e = _torch_pairs(torch)["requires_grad"]
    _check_values(_C.compare(a, e, quantiles=()), a.detach().numpy(), e.numpy())
    assert a.grad is None and a.requires_grad


def test_a_neg_bit_view_reads_the_same_memory_as_dunder_dlpack_and_the_public_path_resolves_it():
    torch = _torch()
    x = torch.linspace(-2, 3, 11, dtype=torch.float64)
    y = torch.linspace(1, -1, 11, dtype=torch.float64)
    nx = torch._neg_view(x)
    assert nx.is_neg()
    # _C reads the memory as exported: torch's C export and its __dlpack__ agree
    assert _C.compare(nx, y, quantiles=()) == _C.compare(_Forward(nx), _Forward(y), quantiles=())
    st = vgct_ext.compare(nx, y)  # prepare() resolves the neg bit: the logical values
    d = -x.numpy() - y.numpy()
    assert st.max_abs_err == float(np.max(np.abs(d)))
    assert st.rel_l2 == pytest.approx(oracle.norm_ratio(d, y.numpy()), rel=1e-12, abs=0)


@pytest.mark.parametrize("kind", ["float8_e4m3fnuz", "float8_e8m0fnu", "complex64", "33 dims",
                                  "shape mismatch"])
def test_refused_torch_tensors_raise_the_dunder_paths_error_and_free_their_storage(kind):
    torch = _torch()
    base = np.linspace(0.5, 2.0, 12)
    arr = (base + 1j * base).astype(np.complex64) if kind == "complex64" else base.copy()
    ref = sys.getrefcount(arr)
    t = torch.from_numpy(arr)  # the storage holds arr: a leaked export keeps its count up
    other = t
    if kind == "float8_e4m3fnuz":
        t = other = t.to(torch.float8_e4m3fnuz)
    elif kind == "float8_e8m0fnu":
        t = other = t.to(torch.float8_e8m0fnu)
    elif kind == "33 dims":
        t = other = t[:1].reshape([1] * 33)
    elif kind == "shape mismatch":
        other = t[:5]
    for _ in range(30):
        direct = _outcome(lambda t=t, other=other: _C.compare(t, other, quantiles=()))
    forwarded = _outcome(lambda t=t, other=other: _C.compare(_Forward(t), _Forward(other), quantiles=()))
    assert direct[0] != "ok" and issubclass(direct[0], Exception)
    assert direct == forwarded
    del t, other
    gc.collect()
    assert sys.getrefcount(arr) == ref


# ---- a producer made here: every field of the table and of the tensor planted ---------------------

_FROM = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(ctypes.c_void_p))
_STREAM = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p))
_DESTRUCTOR = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)


class _Table(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("prev_api", ctypes.c_void_p),
                ("allocator", ctypes.c_void_p), ("from_py", ctypes.c_void_p), ("to_py", ctypes.c_void_p),
                ("dltensor_from_py", ctypes.c_void_p), ("current_work_stream", ctypes.c_void_p)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _MTV(ctypes.Structure):
    pass


_DELETER = ctypes.PYFUNCTYPE(None, ctypes.POINTER(_MTV))
_MTV._fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("ctx", ctypes.c_void_p),
                 ("deleter", _DELETER), ("flags", ctypes.c_uint64), ("t", _DLTensor)]

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def _addr(cfunc):
    return ctypes.cast(cfunc, ctypes.c_void_p).value


class _Tensors:
    """Hand-built DLManagedTensorVersioned kept alive until their deleter runs."""

    live = {}     # address -> the ctypes objects and the array
    deleted = []  # addresses, in deleter order
    twice = []    # deleter calls for a tensor already deleted


def _deleter(p):
    addr = ctypes.cast(p, ctypes.c_void_p).value
    _Tensors.deleted.append(addr)
    if _Tensors.live.pop(addr, None) is None:
        _Tensors.twice.append(addr)


_deleter_c = _DELETER(_deleter)
_KIND = {"f": 2, "i": 0, "u": 1, "b": 6, "c": 5}


def _make_tensor(arr, *, major=1, device=(1, 0), ndim=None, shape=None, strides="auto", code=None,
                 bits=None, lanes=1, data="auto", deleter=True, byte_offset=0):
    """A versioned managed tensor viewing `arr` (each field overridable); returns its address."""
    m = _MTV()
    m.major, m.minor = major, 0
    if deleter:
        m.deleter = _deleter_c
    sh = list(arr.shape) if shape is None else list(shape)
    st = [s // arr.itemsize for s in arr.strides] if strides == "auto" else strides
    sh_c = (ctypes.c_int64 * max(1, len(sh)))(*sh)
    st_c = None if st is None else (ctypes.c_int64 * max(1, len(st)))(*st)
    m.t.data = arr.ctypes.data if data == "auto" else data
    m.t.device_type, m.t.device_id = device
    m.t.ndim = len(sh) if ndim is None else ndim
    m.t.code = _KIND[arr.dtype.kind] if code is None else code
    m.t.bits = arr.itemsize * 8 if bits is None else bits
    m.t.lanes = lanes
    m.t.shape = ctypes.cast(sh_c, ctypes.POINTER(ctypes.c_int64))
    m.t.strides = None if st_c is None else ctypes.cast(st_c, ctypes.POINTER(ctypes.c_int64))
    m.t.byte_offset = byte_offset
    addr = ctypes.addressof(m)
    _Tensors.live[addr] = (m, arr, sh_c, st_c)
    return addr


class _Calls:
    exports = 0
    streams = 0
    stream_value = None  # what current_work_stream reports


def _current_work_stream(device_type, device_id, out):
    _Calls.streams += 1
    out[0] = _Calls.stream_value
    return 0


_cws_c = _STREAM(_current_work_stream)


def _producer(export=None, *, table_major=1, from_py="callback", stream_fn="callback", name="P",
              capsule_name=b"dlpack_exchange_api", attribute="capsule"):
    """A type whose instances (holding .arr and .kw) carry a table.  export(obj) -> an address, None
    (leave *out unset) or (rc, address); its __dlpack__ hands the same tensor over in a capsule."""
    export = export or (lambda o: _make_tensor(o.arr, **o.kw))

    def _from_py(obj, out):
        _Calls.exports += 1
        r = export(obj)
        rc, addr = r if isinstance(r, tuple) else (0, r)
        if addr is not None:
            out[0] = addr
        return rc

    from_c = _FROM(_from_py)
    fp = _addr(from_c) if from_py == "callback" else from_py
    sp = _addr(_cws_c) if stream_fn == "callback" else stream_fn
    table = _Table(table_major, 3, None, None, fp, None, None, sp)
    cap = _capsule_new(ctypes.addressof(table), capsule_name, None)

    def __init__(self, arr, **kw):
        self.arr, self.kw = arr, kw

    def __dlpack__(self, **kw):
        type(self).dunder_calls += 1
        if type(self).dunder_capsule:
            return _capsule_new(_make_tensor(self.arr, **self.kw), b"dltensor_versioned", None)
        return self.arr.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.kw.get("device", (1, 0)) if type(self).dunder_capsule else self.arr.__dlpack_device__()

    ns = {"_keep": (from_c, table, cap), "dunder_calls": 0, "dunder_capsule": False, "__init__": __init__,
          "__dlpack__": __dlpack__, "__dlpack_device__": __dlpack_device__}
    if attribute == "capsule":
        ns["__dlpack_c_exchange_api__"] = cap
    elif attribute == "property":
        ns["__dlpack_c_exchange_api__"] = property(lambda self: cap)
    elif attribute == "int":
        ns["__dlpack_c_exchange_api__"] = 12345
    elif attribute == "metaclass":
        return type("Meta", (type,), {"__dlpack_c_exchange_api__": cap})(name, (), ns)
    return type(name, (), ns)


@pytest.fixture
def calls():
    _Calls.exports = _Calls.streams = 0
    _Calls.stream_value = None
    _Tensors.deleted.clear()
    _Tensors.twice.clear()
    yield _Calls
    assert _Tensors.twice == []
    assert _Tensors.live == {}  # every export's deleter ran (a producer without one is not kept here)
    _Calls.stream_value = None


def _pair(n=257, seed=3):
    rng = np.random.default_rng(seed)
    e = rng.standard_normal(n)
    return e + 1e-3 * rng.standard_normal(n), e


@pytest.mark.parametrize("fault", ["table major 0", "table major 2", "NULL export", "NULL current_work_stream",
                                   "capsule of another name", "attribute is an int", "attribute is a property",
                                   "attribute on the metaclass only", "attribute deleted"])
def test_unusable_tables_fall_back_to_dunder_dlpack_without_exporting(calls, fault):
    kw = {}
    if fault.startswith("table major"):
        kw["table_major"] = int(fault[-1])
    elif fault == "NULL export":
        kw["from_py"] = None
    elif fault == "NULL current_work_stream":
        kw["stream_fn"] = None
    elif fault == "capsule of another name":
        kw["capsule_name"] = b"dlpack_exchange_api_v2"
    elif fault == "attribute is an int":
        kw["attribute"] = "int"
    elif fault == "attribute is a property":
        kw["attribute"] = "property"
    elif fault == "attribute on the metaclass only":
        kw["attribute"] = "metaclass"
    P = _producer(**kw)
    if fault == "attribute deleted":
        del P.__dlpack_c_exchange_api__
    a, e = _pair()
    ra, re_ = sys.getrefcount(a), sys.getrefcount(e)
    got = _C.compare(P(a), P(e), quantiles=())
    _check_values(got, a, e)
    assert (P.dunder_calls, calls.exports) == (2, 0)
    assert (sys.getrefcount(a), sys.getrefcount(e)) == (ra, re_)


def test_a_table_planted_after_the_class_was_made_is_used(calls):
    P = _producer(attribute="none")
    Q = _producer()  # holds the table and its export callback: alive as long as P uses them
    P.__dlpack_c_exchange_api__ = Q._keep[2]  # another type's table: this type now carries it
    a, e = _pair(seed=9)
    _check_values(_C.compare(P(a), P(e), quantiles=()), a, e)
    assert (P.dunder_calls, calls.exports, len(_Tensors.deleted)) == (0, 2, 2)


@pytest.mark.parametrize("fault", ["out left NULL", "export returns 1", "export raises in ctypes"])
def test_failed_exports_fall_back_and_leave_no_exception(calls, fault, monkeypatch):
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)

    def export(o):
        if fault == "out left NULL":
            return None
        if fault == "export returns 1":
            return 1, None
        raise ValueError("a producer bug")

    P = _producer(export)
    a, e = _pair(seed=4)
    _check_values(_C.compare(P(a), P(e), quantiles=()), a, e)
    assert (P.dunder_calls, calls.exports) == (2, 2)
    assert len(unraisable) == (2 if fault == "export raises in ctypes" else 0)  # ctypes' report, not ours


_DLTENSOR_FAULTS = {
    "33 dims": dict(ndim=33, shape=[1] * 33, strides=None),
    "ndim -1": dict(ndim=-1),
    "negative shape": dict(shape=[-3, 1], strides=[1, 1]),
    "complex dtype": dict(code=5),
    "2 lanes": dict(lanes=2),
    "opaque handle": dict(code=3),
    "data NULL": dict(data=None),
    "strides overflow": dict(strides=[2 ** 62]),
    "element count overflow": dict(shape=[2 ** 40, 2 ** 40], strides=[0, 0]),
    "negative CUDA ordinal": dict(device=(2, -1)),
    "shorter shape": dict(shape=[100]),
}


@pytest.mark.parametrize("fault", list(_DLTENSOR_FAULTS))
@pytest.mark.parametrize("side", ["actual", "expected"])
def test_malformed_tensors_raise_the_capsule_paths_error_and_are_released_once(calls, fault, side):
    a, e = _pair()
    ra = sys.getrefcount(a)
    bad, good = dict(_DLTENSOR_FAULTS[fault]), {}
    P = _producer()
    R = _producer(name="R")
    R.dunder_capsule = True  # the same hand-built tensor through __dlpack__ + a capsule
    R.__dlpack_c_exchange_api__ = None
    args_p = (P(a, **bad), P(e, **good)) if side == "actual" else (P(a, **good), P(e, **bad))
    args_r = (R(a, **bad), R(e, **good)) if side == "actual" else (R(a, **good), R(e, **bad))
    via_table = _outcome(lambda args_p=args_p: _C.compare(*args_p, quantiles=()))
    assert P.dunder_calls == 0 and calls.exports in (1, 2)  # a refused actual stops the call
    assert len(_Tensors.deleted) == calls.exports and _Tensors.live == {}  # each released once
    via_capsule = _outcome(lambda args_r=args_r: _C.compare(*args_r, quantiles=()))
    assert via_table[0] != "ok" and issubclass(via_table[0], Exception)
    assert via_table == via_capsule
    # the capsule path's refused tensor is dropped with its capsule, which has no destructor here
    _Tensors.live.clear()
    del args_p, args_r
    assert sys.getrefcount(a) == ra


@pytest.mark.parametrize("device", [(13, 0), (4, 0)])
def test_managed_and_foreign_device_tensors_fall_back_and_are_released(calls, device):
    a, e = _pair(seed=21)
    P = _producer()
    _check_values(_C.compare(P(a, device=device), P(e, device=device), quantiles=()), a, e)
    assert (P.dunder_calls, calls.exports, len(_Tensors.deleted)) == (2, 2, 2)  # exported, released, re-read


def test_cuda_host_memory_is_taken_and_a_stream_for_it_is_refused_as_on_the_dunder_path(calls):
    a, e = _pair(seed=22)
    P = _producer()
    _check_values(_C.compare(P(a, device=(3, 0)), P(e, device=(3, 0)), quantiles=()), a, e)
    assert (P.dunder_calls, calls.exports, calls.streams) == (0, 2, 0)
    R = _producer(name="R")
    R.dunder_capsule = True
    del R.__dlpack_c_exchange_api__
    with_table = _outcome(lambda: _C.compare(P(a, device=(3, 0)), P(e, device=(3, 0)), stream=7, quantiles=()))
    assert with_table == _outcome(lambda: _C.compare(R(a, device=(3, 0)), R(e, device=(3, 0)), stream=7,
                                                     quantiles=()))
    assert with_table[0] is ValueError and "stream must be None" in with_table[1]


def test_a_tensor_without_a_deleter_is_read(calls):
    a, e = _pair(seed=23)
    P = _producer()
    _check_values(_C.compare(P(a, deleter=False), P(e, deleter=False), quantiles=()), a, e)
    assert calls.exports == 2 and _Tensors.deleted == []
    _Tensors.live.clear()  # nothing frees them: the producer said so


@pytest.mark.parametrize("fault", ["device mismatch", "__dlpack_device__ raises", "__dlpack__ raises",
                                   "shape mismatch", "unsupported object"])
def test_a_table_import_is_released_when_the_other_input_fails(calls, fault):
    a, e = _pair(seed=31)
    P = _producer()

    class Other:
        def __init__(self, arr):
            self.arr = arr

        def __dlpack_device__(self):
            if fault == "__dlpack_device__ raises":
                raise RuntimeError("no device")
            return (2, 0) if fault == "device mismatch" else (1, 0)

        def __dlpack__(self, **kw):
            if fault == "__dlpack__ raises":
                raise BufferError("cannot export")
            return self.arr.__dlpack__(**kw)

    other = "not a tensor" if fault == "unsupported object" else Other(e[:7] if fault == "shape mismatch" else e)
    ref = _outcome(lambda: _C.compare(a, other, quantiles=()))  # numpy: the __dlpack__ path both sides
    assert ref[0] not in ("ok", str)
    ra = sys.getrefcount(a)
    for _ in range(10):
        assert _outcome(lambda: _C.compare(P(a), other, quantiles=())) == ref
    assert calls.exports == 10 and len(_Tensors.deleted) == 10
    assert sys.getrefcount(a) == ra


def test_reference_counts_hold_over_many_succeeding_and_failing_calls(calls):
    torch = pytest.importorskip("torch")
    a, e = _pair(n=1001, seed=41)
    z = np.ones(8, dtype=np.complex128)
    P = _producer()
    ta, te, tz = torch.from_numpy(a), torch.from_numpy(e), torch.from_numpy(z)
    pa, pe, pz = P(a), P(e), P(z)
    counts = [sys.getrefcount(x) for x in (a, e, z, ta, te, tz, pa, pe, pz)]
    for k in range(300):
        got = _C.compare(pa, pe, quantiles=())
        got2 = _C.compare(ta, te, quantiles=())
        for bad in ((pz, pz), (tz, tz), (ta, tz[:1].real), (pa, te[:5])):
            with pytest.raises((TypeError, ValueError)):
                _C.compare(*bad, quantiles=())
    _check_values(got, a, e)
    assert got2 == got
    del bad  # its views hold their bases
    gc.collect()
    assert [sys.getrefcount(x) for x in (a, e, z, ta, te, tz, pa, pe, pz)] == counts
    assert calls.exports == 300 * 4  # pa, pe, pz (its refusal stops the call), pa


def test_concurrent_calls_on_torch_and_the_ctypes_producer_give_the_float64_values(calls):
    torch = pytest.importorskip("torch")
    a, e = _pair(n=100_003, seed=51)
    ta, te = torch.from_numpy(a), torch.from_numpy(e)
    P = _producer()
    ra, re_ = sys.getrefcount(a), sys.getrefcount(e)
    ref = _C.compare(a, e, quantiles=())
    _check_values(ref, a, e)
    bad = []

    def work(i):
        try:
            for k in range(60):
                x, y = [(ta, te), (P(a), P(e)), (ta, P(e)), (P(a), te)][(i + k) % 4]
                got = _C.compare(x, y, quantiles=())
                if got != ref:
                    bad.append(("values", i, k))
                if k % 5 == 0:
                    st = vgct_ext.compare(ta, te)
                    if (st.max_abs_err, st.mismatches) != (ref["max_abs_err"], ref["mismatches"]):
                        bad.append(("public", i, k))
                try:
                    _C.compare(ta, P(e[:3]), quantiles=())
                    bad.append(("no shape error", i, k))
                except ValueError:
                    pass
        except BaseException as exc:  # noqa: BLE001 - reported below
            bad.append(repr(exc))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bad == []
    gc.collect()
    assert (sys.getrefcount(a), sys.getrefcount(e)) == (ra, re_)
    assert len(_Tensors.deleted) == calls.exports > 0


# ---- the three faults that were bugs (now guarded in csrc/bridge.c) ------------------------------

_is_true = _addr(ctypes.pythonapi.PyObject_IsTrue)  # int f(PyObject *): __bool__, -1 with its exception


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
def test_a_keyboard_interrupt_inside_the_export_is_not_swallowed(calls, exc):
    # the export is PyObject_IsTrue(obj): it runs obj.__bool__, which raises; a C export that calls
    # back into Python (a Python-level producer, a dispatch mode) raises the same way on Ctrl-C
    P = _producer(from_py=_is_true)

    class B(P):
        pass

    B.__dlpack_c_exchange_api__ = P.__dlpack_c_exchange_api__
    B.__bool__ = lambda self: (_ for _ in ()).throw(exc("interrupted"))
    a, e = _pair(seed=61)
    with pytest.raises(exc):
        _C.compare(B(a), B(e), quantiles=())


def test_a_keyboard_interrupt_inside_dunder_dlpack_propagates():
    """The reference behaviour the test above expects of the table path."""
    class K:
        def __dlpack_device__(self):
            return (1, 0)

        def __dlpack__(self, **kw):
            raise KeyboardInterrupt("interrupted")

    with pytest.raises(KeyboardInterrupt):
        _C.compare(K(), K(), quantiles=())


def _table_freed_during_export_scenario():
    """Run in a child under PYTHONMALLOC=debug (freed blocks are filled with 0xDD): a producer whose
    capsule owns its table and whose export drops the type's last reference to that capsule.  The
    tensor says "CUDA" (so the bridge asks the table's current_work_stream) and is complex (refused
    before any kernel).  Prints the current_work_stream calls; a read of the freed table calls 0xDD..."""
    keep, streams = {}, []

    def _cws(device_type, device_id, out):
        streams.append(device_id)
        out[0] = None
        return 0

    def _destroy(_):
        keep.pop("table")  # the capsule owns the table: it dies with it

    def _from_py(obj, out):
        out[0] = _make_tensor(obj.arr, device=(2, 0), code=5)
        del type(obj).__dlpack_c_exchange_api__  # the last reference to the capsule, hence the table
        return 0

    cws_c, destroy_c, from_c = _STREAM(_cws), _DESTRUCTOR(_destroy), _FROM(_from_py)
    table = _Table(1, 3, None, None, _addr(from_c), None, None, _addr(cws_c))
    addr = ctypes.addressof(table)
    keep["table"] = table
    del table
    U = type("U", (), {"__dlpack_c_exchange_api__": _capsule_new(addr, b"dlpack_exchange_api", _addr(destroy_c)),
                       "__init__": lambda s, arr: setattr(s, "arr", arr),
                       "__dlpack_device__": lambda s: (1, 0),
                       "__dlpack__": lambda s, **kw: (_ for _ in ()).throw(BufferError("fallback"))})
    a = np.ones(4)
    try:
        _C.compare(U(a), a, quantiles=())
    except (TypeError, BufferError) as exc:
        print("refused:", type(exc).__name__)
    print("table freed:", "table" not in keep, "current_work_stream calls:", streams, flush=True)


def test_the_table_is_not_read_after_the_export_freed_it():
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONMALLOC="debug",
               PYTHONPATH=os.pathsep.join([here] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    r = subprocess.run([sys.executable, "-c", "import test_exchange_attacks as t; "
                        "t._table_freed_during_export_scenario()"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    # the producer's own current_work_stream, asked once; the tensor refused as complex
    assert r.stdout.splitlines()[-2:] == ["refused: TypeError", "table freed: True current_work_stream calls: [0]"]


_STALE_C = r"""
#include <Python.h>
#include <stdint.h>
typedef struct { uint32_t major, minor; void *ctx; void (*deleter)(void *); uint64_t flags; void *data;
  int32_t dt, di, ndim; uint8_t code, bits; uint16_t lanes; int64_t *shape, *strides; uint64_t bo; } MTV;
static int64_t shape4[1] = {4};
static double buf[4] = {1, 2, 3, 4};
static MTV t;
static int deleted;
static void del(void *p) { (void)p; deleted++; }
int export_ok_with_exception(void *obj, MTV **out) {
  (void)obj;
  t = (MTV){1, 0, NULL, del, 0, buf, 1, 0, 1, 2, 64, 1, shape4, NULL, 0};
  *out = &t;
  PyErr_SetString(PyExc_RuntimeError, "left set by an export that reported success");
  return 0;
}
int deleted_count(void) { return deleted; }
"""


@pytest.fixture(scope="module")
def stale_lib(tmp_path_factory):
    cc = os.environ.get("CC") or "cc"
    d = tmp_path_factory.mktemp("stale")
    (d / "stale.c").write_text(_STALE_C)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    try:
        subprocess.run([cc, "-shared", "-fPIC", "-O1", "-I", sysconfig.get_paths()["include"],
                        str(d / "stale.c"), "-o", str(d / "libstale.so")], check=True, env=env,
                       capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("no C compiler for the producer that leaves an exception set")
    return ctypes.PyDLL(str(d / "libstale.so"))


@pytest.mark.parametrize("order", ["table first", "table second", "both"])
def test_an_export_that_succeeds_with_an_exception_set_is_not_taken(stale_lib, order):
    table = _Table(1, 3, None, None, _addr(stale_lib.export_ok_with_exception), None, None, _addr(_cws_c))
    cap = _capsule_new(ctypes.addressof(table), b"dlpack_exchange_api", None)
    ref = np.array([1.0, 2.0, 3.0, 4.0])

    class S:
        __dlpack_c_exchange_api__ = cap
        _keep = table

        def __dlpack__(self, **kw):
            return ref.__dlpack__(**kw)

        def __dlpack_device__(self):
            return ref.__dlpack_device__()

    e = np.array([1.0, 2.0, 3.0, 5.0])
    args = {"table first": (S(), e), "table second": (e, S()), "both": (S(), S())}[order]
    # expected: the export treated as failed (its exception cleared, its tensor released), the values
    # read through __dlpack__, no exception left behind
    got = _C.compare(*args, quantiles=())
    _check_values(got, *[ref if isinstance(x, S) else x for x in args])
