"""The DLPack C exchange API path of the bridge (csrc/bridge.c, vgct_bridge_import_exchange).

A producer whose own type carries ``__dlpack_c_exchange_api__`` (DLPack 1.3; torch from 2.10) is
exported by a C call instead of ``__dlpack_device__`` + ``__dlpack__``.  The path is taken only when
it needs no stream synchronisation and the producer's table and tensor are of DLPack major version 1;
everything else falls back to ``__dlpack__``, which raises the producer's own errors.  These tests
use torch's table where torch has one, and a producer made here with ctypes (a NumPy array exported
through a table whose behaviour each test sets) to plant every fault the bridge must survive:
a table of another major version, a failing export, a tensor of another major version, a subclass,
a stream given for host memory, an unsupported dtype.  Values are checked against float64 NumPy.
"""
import ctypes
import sys

import numpy as np
import pytest

import vgct_ext
from vgct_ext import _C

import oracle  # float64 NumPy, math.fsum


def _torch():
    return pytest.importorskip("torch")


def _torch_with_api():
    torch = _torch()
    if "__dlpack_c_exchange_api__" not in torch.Tensor.__dict__:
        pytest.skip("this torch has no DLPack C exchange API (torch < 2.10)")
    return torch


def _check_values(got, a, e):
    """_C.compare's dict against the float64 oracle: relative L2 error, max |a - e| (exact) and
    the mismatch count under the default rtol = atol = 1e-3 (exact)."""
    a, e = np.asarray(a, dtype=np.float64).ravel(), np.asarray(e, dtype=np.float64).ravel()
    d = a - e
    assert got["rel_l2"] == pytest.approx(oracle.norm_ratio(d, e), rel=1e-12, abs=0)
    assert got["max_abs_err"] == float(np.max(np.abs(d)))
    assert got["mismatches"] == int(np.count_nonzero(np.abs(d) > 1e-3 + 1e-3 * np.abs(e)))


# ---- torch's own table ------------------------------------------------------------------------


def test_torch_tensors_are_exported_without_calling_dunder_dlpack(monkeypatch):
    torch = _torch_with_api()

    def refuse(self, *a, **k):
        raise AssertionError("__dlpack__/__dlpack_device__ called on the exchange path")

    monkeypatch.setattr(torch.Tensor, "__dlpack__", refuse)
    monkeypatch.setattr(torch.Tensor, "__dlpack_device__", refuse)
    g = torch.Generator().manual_seed(7)
    e = torch.randn(4097, generator=g, dtype=torch.float64)
    a = e + 1e-3 * torch.randn(4097, generator=g, dtype=torch.float64)
    got = _C.compare(a, e, quantiles=())
    _check_values(got, a.numpy(), e.numpy())
    # strided views and a bfloat16 pair go the same way
    a2, e2 = a.reshape(17, 241)[:, ::3], e.reshape(17, 241)[:, ::3]
    _check_values(_C.compare(a2, e2, quantiles=()), a2.numpy(), e2.numpy())
    ab, eb = a.to(torch.bfloat16), e.to(torch.bfloat16)
    _check_values(_C.compare(ab, eb, quantiles=()), ab.double().numpy(), eb.double().numpy())
    st = vgct_ext.compare(ab, eb)  # the public path: prepare(), call_on_stream, the default p99
    assert st.quantiles[0.99] == float(np.quantile(np.abs(ab.double().numpy() - eb.double().numpy()), 0.99))


def test_a_torch_subclass_goes_through_its_dunder_dlpack(monkeypatch):
    torch = _torch_with_api()

    class Sub(torch.Tensor):
        pass

    calls = []
    real = torch.Tensor.__dlpack__

    def spy(self, *a, **k):
        calls.append(type(self).__name__)
        return real(self, *a, **k)

    monkeypatch.setattr(torch.Tensor, "__dlpack__", spy)
    e = torch.linspace(-1, 1, 257, dtype=torch.float64)
    a = e + 1e-4
    got = _C.compare(a.as_subclass(Sub), e.as_subclass(Sub), quantiles=())
    assert len(calls) >= 2 and set(calls) == {"Sub"}  # (torch re-enters it via __torch_function__)
    _check_values(got, a.numpy(), e.numpy())
    calls.clear()
    _C.compare(a, e, quantiles=())
    assert calls == []  # the exact type: the C table, never the (patched) method


def test_a_stream_for_host_memory_is_still_refused_on_the_exchange_path():
    torch = _torch_with_api()
    x = torch.ones(3)
    with pytest.raises(ValueError, match="stream must be None for a tensor in host memory"):
        _C.compare(x, x, stream=5)


class _Forward:
    """torch's own __dlpack__ / __dlpack_device__ behind a type without the exchange table."""

    def __init__(self, x):
        self.x = x

    def __dlpack__(self, **kw):
        return self.x.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.x.__dlpack_device__()


def test_non_exportable_torch_tensors_keep_their_errors():
    """torch's exchange export fails (RuntimeError with a C++ trace) for meta, sparse, sparse CSR and
    quantized tensors; the bridge clears that and lets torch's __dlpack_device__ / __dlpack__ raise:
    the same exception, type and message, as for the same tensor behind a type without the table."""
    torch = _torch_with_api()
    xs = [torch.ones(3, device="meta"), torch.ones(3).to_sparse(), torch.ones(2, 2).to_sparse_csr()]
    for x in xs:
        with pytest.raises(Exception) as direct:
            _C.compare(x, x, quantiles=())
        with pytest.raises(Exception) as forwarded:
            _C.compare(_Forward(x), _Forward(x), quantiles=())
        assert type(direct.value) is type(forwarded.value)
        assert str(direct.value) == str(forwarded.value)
        assert "Exception raised from" not in str(direct.value)  # not the C++ trace of the export


# ---- a producer made here: every fault planted ---------------------------------------------------

_FROM = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(ctypes.c_void_p))
_STREAM = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p))


class _Table(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("prev_api", ctypes.c_void_p),
                ("allocator", ctypes.c_void_p), ("from_py", _FROM), ("to_py", ctypes.c_void_p),
                ("dltensor_from_py", ctypes.c_void_p), ("current_work_stream", _STREAM)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_ptr = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_ptr.restype = ctypes.c_void_p
_capsule_ptr.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_rename = ctypes.pythonapi.PyCapsule_SetName
_capsule_rename.restype = ctypes.c_int
_capsule_rename.argtypes = [ctypes.py_object, ctypes.c_char_p]
_USED = b"used_dltensor_versioned"


class _Mode:
    fail = False         # the export returns -1
    tensor_major = 1     # the exported tensor's version.major
    exports = 0
    streams = 0


def _from_py(obj, out):
    _Mode.exports += 1
    if _Mode.fail:
        return -1
    cap = obj.arr.__dlpack__(max_version=(1, 0))
    p = _capsule_ptr(cap, b"dltensor_versioned")
    _capsule_rename(cap, _USED)  # ownership moves to the consumer (it calls the deleter)
    ctypes.c_uint32.from_address(p).value = _Mode.tensor_major
    out[0] = p
    return 0


def _current_work_stream(device_type, device_id, out):
    _Mode.streams += 1
    out[0] = None
    return 0


_from_py_c = _FROM(_from_py)
_stream_c = _STREAM(_current_work_stream)


def _table(major):
    t = _Table(major, 3, None, None, _from_py_c, None, None, _stream_c)
    return t, _capsule_new(ctypes.addressof(t), b"dlpack_exchange_api", None)


_TABLE, _CAPSULE = _table(1)
_TABLE2, _CAPSULE2 = _table(2)


class Producer:
    """A NumPy array behind a DLPack C exchange table; its __dlpack__ counts the fallbacks."""

    __dlpack_c_exchange_api__ = _CAPSULE
    dunder_calls = 0

    def __init__(self, arr):
        self.arr = arr

    def __dlpack__(self, **kw):
        type(self).dunder_calls += 1
        return self.arr.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()


class ProducerV2(Producer):
    __dlpack_c_exchange_api__ = _CAPSULE2


class SubProducer(Producer):
    pass  # the table is its base's: not the object's own type


@pytest.fixture
def mode():
    _Mode.fail, _Mode.tensor_major, _Mode.exports, _Mode.streams = False, 1, 0, 0
    Producer.dunder_calls = ProducerV2.dunder_calls = SubProducer.dunder_calls = 0
    yield _Mode
    _Mode.fail, _Mode.tensor_major = False, 1


def _pair(n=1000, seed=3):
    rng = np.random.default_rng(seed)
    e = rng.standard_normal(n)
    return e + 1e-3 * rng.standard_normal(n), e


def test_the_table_is_used_and_each_tensor_released_once(mode):
    a, e = _pair()
    pa, pe = Producer(a), Producer(e)
    ra, re_ = sys.getrefcount(a), sys.getrefcount(e)
    for _ in range(50):
        got = _C.compare(pa, pe, quantiles=())
    _check_values(got, a, e)
    assert (mode.exports, Producer.dunder_calls, mode.streams) == (100, 0, 0)  # host memory: no stream asked
    assert (sys.getrefcount(a), sys.getrefcount(e)) == (ra, re_)  # every export's deleter ran, once


FAULTS = ["table of major version 2", "export fails", "tensor of major version 2", "subclass"]


def _plant(mode, fault):
    """The producer class for one of FAULTS (the export's faults set on `mode`); Producer for
    any other name."""
    if fault == "export fails":
        mode.fail = True
    elif fault == "tensor of major version 2":
        mode.tensor_major = 2
    return {"table of major version 2": ProducerV2, "subclass": SubProducer}.get(fault, Producer)


@pytest.mark.parametrize("fault", FAULTS)
def test_every_planted_fault_falls_back_to_dunder_dlpack(mode, fault):
    a, e = _pair(seed=11)
    cls = _plant(mode, fault)
    pa, pe = cls(a), cls(e)
    ra = sys.getrefcount(a)
    got = _C.compare(pa, pe, quantiles=())
    _check_values(got, a, e)
    assert cls.dunder_calls == 2
    assert mode.exports == (2 if fault in ("export fails", "tensor of major version 2") else 0)
    assert sys.getrefcount(a) == ra  # a refused tensor's deleter ran too


def test_a_refused_dtype_raises_the_capsule_paths_error_and_leaks_nothing(mode):
    z = np.ones(8, dtype=np.complex128)
    pz = Producer(z)
    rz = sys.getrefcount(z)
    with pytest.raises(TypeError) as via_numpy:
        _C.compare(z, z, quantiles=())
    for _ in range(20):
        with pytest.raises(TypeError) as via_table:
            _C.compare(pz, pz, quantiles=())
    assert str(via_table.value) == str(via_numpy.value)
    assert Producer.dunder_calls == 0 and mode.exports == 20  # the first input's refusal stops the call
    assert sys.getrefcount(z) == rz


# ---- compare's stream=PRODUCER_STREAM: the stream left to the producer ------------------------


def test_producer_stream_takes_both_inputs_through_the_table(mode):
    """_C.compare(..., stream=PRODUCER_STREAM) (vgpy_open_pair's `producer`): both inputs through the
    table, no __dlpack__, each export released once; host memory asks no stream."""
    a, e = _pair(seed=5)
    pa, pe = Producer(a), Producer(e)
    ra, re_ = sys.getrefcount(a), sys.getrefcount(e)
    for _ in range(20):
        got = _C.compare(pa, pe, quantiles=(0.5,), stream=_C.PRODUCER_STREAM)
    _check_values(got, a, e)
    assert got["quantiles"] == {0.5: float(np.quantile(np.abs(a - e), 0.5))}
    assert got == _C.compare(a, e, quantiles=(0.5,))  # the general path's dict, every field
    assert (mode.exports, Producer.dunder_calls, mode.streams) == (40, 0, 0)
    assert (sys.getrefcount(a), sys.getrefcount(e)) == (ra, re_)


@pytest.mark.parametrize("fault", FAULTS + ["one NumPy array"])
def test_producer_stream_does_nothing_where_the_table_cannot_take_an_input(mode, fault):
    """Every planted fault: NotImplemented, no __dlpack__ called, nothing held (the caller, compare,
    then goes the general way) -- also when the first input was taken and the second is not."""
    a, e = _pair(seed=13)
    cls = _plant(mode, fault)
    pa = cls(a)
    pe = e if fault == "one NumPy array" else cls(e)
    ra, re_ = sys.getrefcount(a), sys.getrefcount(e)
    assert _C.compare(pa, pe, quantiles=(), stream=_C.PRODUCER_STREAM) is NotImplemented
    assert cls.dunder_calls == 0
    assert (sys.getrefcount(a), sys.getrefcount(e)) == (ra, re_)
    _check_values(_C.compare(pa, pe, quantiles=()), a, e)  # the general way still reads them
    st = vgct_ext.compare(pa, pe, quantiles=())  # compare() falls back to it by itself
    d = a - e
    assert st.max_abs_err == float(np.max(np.abs(d)))
    assert st.rel_l2 == pytest.approx(oracle.norm_ratio(d, e), rel=1e-12, abs=0)


def test_producer_stream_keeps_the_general_paths_errors(mode):
    """Refusals -- an unsupported dtype of either input (the second one's after the first was
    exported), shapes that differ, a bad argument -- raise what the general path raises, and
    release every export."""
    a, e = _pair(seed=17)
    z, ez = np.ones(8, dtype=np.complex128), e[:999]
    for x, y in ((z, z), (a, z), (a, ez)):
        px, py = Producer(x), Producer(y)
        rx, ry = sys.getrefcount(x), sys.getrefcount(y)
        with pytest.raises((TypeError, ValueError)) as general:
            _C.compare(px, py, quantiles=())
        with pytest.raises(type(general.value)) as producer:
            _C.compare(px, py, quantiles=(), stream=_C.PRODUCER_STREAM)
        assert str(producer.value) == str(general.value)
        assert (sys.getrefcount(x), sys.getrefcount(y)) == (rx, ry)
    with pytest.raises(ValueError, match="quantile"):
        _C.compare(Producer(a), Producer(e), quantiles=(1.5,), stream=_C.PRODUCER_STREAM)


def test_only_compare_takes_the_producer_stream():
    """reduce_raw, histogram and fingerprint refuse it as any non-int stream (TypeError)."""
    a, e = _pair(seed=19)
    for call in (lambda: _C.reduce_raw(a, e, stream=_C.PRODUCER_STREAM),
                 lambda: _C.histogram(a, e, [0], 0, 8, stream=_C.PRODUCER_STREAM),
                 lambda: _C.fingerprint(a, stream=_C.PRODUCER_STREAM)):
        with pytest.raises(TypeError, match="stream must be None or an int"):
            call()


def test_compare_leaves_the_stream_to_torch_and_other_inputs_to_call_on_stream(monkeypatch):
    """vgct_ext.compare on two plain torch tensors passes PRODUCER_STREAM (no device or stream
    look-up in Python: call_on_stream patched to fail) and gives the general path's result; a
    torch subclass, a NumPy array, or a mixed pair still go through call_on_stream."""
    torch = _torch_with_api()
    from vgct_ext.core import _dlpack

    real = _dlpack.call_on_stream
    calls = []

    def spy(xs, fn):
        calls.append(tuple(type(x).__name__ for x in xs))
        return real(xs, fn)

    def refuse(xs, fn):
        raise AssertionError("call_on_stream on the producer's path")

    g = torch.Generator().manual_seed(23)
    e = torch.randn(3001, generator=g, dtype=torch.float32)
    a = (e + 1e-3 * torch.randn(3001, generator=g)).to(torch.bfloat16)
    monkeypatch.setattr(_dlpack, "call_on_stream", refuse)
    st = vgct_ext.compare(a, e, quantiles=(0.5, 0.99))
    ref = _C.compare(a, e, quantiles=(0.5, 0.99))  # stream None: the general path
    assert st.max_abs_err == ref["max_abs_err"] and st.mismatches == ref["mismatches"]
    assert st.rel_l2 == ref["rel_l2"] and st.quantiles == ref["quantiles"]
    d = np.abs(a.double().numpy() - e.double().numpy())
    assert st.quantiles[0.99] == float(np.quantile(d, 0.99))

    class Sub(torch.Tensor):
        pass

    monkeypatch.setattr(_dlpack, "call_on_stream", spy)
    for x, y in ((a.as_subclass(Sub), e.as_subclass(Sub)), (a, e.numpy()), (a.float().numpy(), e.numpy())):
        vgct_ext.compare(x, y, quantiles=())
    assert calls == [("Sub", "Sub"), ("Tensor", "ndarray"), ("ndarray", "ndarray")]


def test_a_metaclass_that_overrides_dunder_dict_does_not_break_compare():
    """compare() asks whether an input's own type carries the table (_dlpack.producer_streams)
    for every pair of one type: a type whose metaclass makes ``__dict__`` raise is read through
    ``type``'s own descriptor (as _C reads tp_dict), not through the metaclass -- the pair still
    goes the general way (``__dlpack__``), values against float64 NumPy."""

    class Meta(type):
        @property
        def __dict__(cls):
            raise RuntimeError("a metaclass's __dict__")

    class Wrapped(_Forward, metaclass=Meta):
        pass

    a, e = _pair(seed=29)
    st = vgct_ext.compare(Wrapped(a), Wrapped(e), quantiles=(0.5,))
    d = a - e
    assert st.max_abs_err == float(np.max(np.abs(d)))
    assert st.quantiles[0.5] == float(np.quantile(np.abs(d), 0.5))
