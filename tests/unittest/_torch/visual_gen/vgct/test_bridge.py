"""The DLPack bridge (csrc/bridge.c) and the _C argument layer (csrc/module_args.c, csrc/module.c).

Oracles: float64 NumPy (math.fsum for sums, numpy.quantile for quantiles); capsule
bookkeeping is checked with a ctypes producer whose every DLPack field we choose and
whose deleter counts its calls, and with real numpy/torch capsules (names after use,
reference counts).
"""

from __future__ import annotations

import ctypes as C
import math
import sys

import numpy as np
import pytest

import vgct_ext
from oracle import quantile_linear
from vgct_ext import _C
from vgct_ext.core import _dlpack

# ---------------------------------------------------------------------------
# A DLPack producer written with ctypes (layouts: csrc/dlpack.h, DLPack spec v1.0)


class DLDevice(C.Structure):
    _fields_ = [("device_type", C.c_int), ("device_id", C.c_int32)]


class DLDataType(C.Structure):
    _fields_ = [("code", C.c_uint8), ("bits", C.c_uint8), ("lanes", C.c_uint16)]


class DLTensor(C.Structure):
    _fields_ = [("data", C.c_void_p), ("device", DLDevice), ("ndim", C.c_int32),
                ("dtype", DLDataType), ("shape", C.POINTER(C.c_int64)),
                ("strides", C.POINTER(C.c_int64)), ("byte_offset", C.c_uint64)]


class DLPackVersion(C.Structure):
    _fields_ = [("major", C.c_uint32), ("minor", C.c_uint32)]


DELETER = C.CFUNCTYPE(None, C.c_void_p)
DESTRUCTOR = C.CFUNCTYPE(None, C.c_void_p)


class DLManagedTensorVersioned(C.Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", C.c_void_p), ("deleter", DELETER),
                ("flags", C.c_uint64), ("dl_tensor", DLTensor)]


class DLManagedTensor(C.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", C.c_void_p), ("deleter", DELETER)]


_api = C.pythonapi
_api.PyCapsule_New.restype = C.py_object
_api.PyCapsule_New.argtypes = [C.c_void_p, C.c_char_p, C.c_void_p]
_api.PyCapsule_GetName.restype = C.c_char_p
_api.PyCapsule_GetName.argtypes = [C.py_object]

_get_name_raw = C.PYFUNCTYPE(C.c_char_p, C.c_void_p)(("PyCapsule_GetName", _api))
_get_pointer_raw = C.PYFUNCTYPE(C.c_void_p, C.c_void_p, C.c_char_p)(("PyCapsule_GetPointer", _api))

NUMPY_DL = {  # numpy dtype -> DLPack (code, bits)
    np.dtype(np.float32): (2, 32), np.dtype(np.float64): (2, 64), np.dtype(np.float16): (2, 16),
    np.dtype(np.int32): (0, 32), np.dtype(np.uint8): (1, 8), np.dtype(np.int8): (0, 8),
}


def capsule_name(cap) -> str:
    return _api.PyCapsule_GetName(cap).decode()


_KEEP_CALLBACKS = []  # ctypes callbacks must outlive every capsule that points at them


class CtypesProducer:
    """A DLPack producer with full control over the exported fields.

    Exports ``arr``'s memory (kept alive by the producer). Every keyword overrides one field.
    ``deleter_calls`` counts calls of the managed tensor's deleter, whoever made them: the
    consumer after renaming, or this producer's capsule destructor for a capsule left unused
    (the DLPack Python spec's rule).
    """

    def __init__(self, arr, *, versioned=True, version=(1, 0), device=(1, 0), capsule_device=None,
                 dtype=None, ndim=None, shape=None, strides="auto", data="auto", byte_offset=0,
                 name=None, flags=0, returns=None, legacy_signature=False):
        self.arr = arr
        self.versioned, self.version, self.device = versioned, version, device
        self.capsule_device = capsule_device or device
        self.dtype = dtype or (*NUMPY_DL[arr.dtype], 1)
        self.ndim = arr.ndim if ndim is None else ndim
        self.shape = list(arr.shape) if shape is None else list(shape)
        if strides == "auto":
            strides = [s // arr.itemsize for s in arr.strides]
        self.strides = strides
        self.data = arr.ctypes.data if data == "auto" else data
        self.byte_offset, self.flags = byte_offset, flags
        self.name = name or ("dltensor_versioned" if versioned else "dltensor")
        self.returns = returns
        self.calls = []
        self.capsules = []
        self._keep = []
        # the callbacks close over a counter, not self: a capsule may outlive our __dict__
        count = self._count = [0]

        def on_delete(ptr):
            count[0] += 1

        def on_destroy(cap_ptr):
            if _get_name_raw(cap_ptr) in (b"dltensor", b"dltensor_versioned"):
                count[0] += 1  # not consumed: the producer frees it

        self._deleter = DELETER(on_delete)
        self._destructor = DESTRUCTOR(on_destroy)
        _KEEP_CALLBACKS.append((self._deleter, self._destructor))

    @property
    def deleter_calls(self) -> int:
        return self._count[0]

    def __dlpack_device__(self):
        return self.device

    def _export(self):
        shape = (C.c_int64 * max(len(self.shape), 1))(*self.shape)
        strides = None
        if self.strides is not None:
            strides = (C.c_int64 * max(len(self.strides), 1))(*self.strides)
        t = DLTensor(C.c_void_p(self.data), DLDevice(*self.capsule_device), self.ndim,
                     DLDataType(*self.dtype), C.cast(shape, C.POINTER(C.c_int64)),
                     C.cast(strides, C.POINTER(C.c_int64)) if strides is not None else None,
                     self.byte_offset)
        if self.versioned:
            m = DLManagedTensorVersioned(DLPackVersion(*self.version), None, self._deleter,
                                         self.flags, t)
        else:
            m = DLManagedTensor(t, None, self._deleter)
        name = self.name.encode()
        self._keep += [shape, strides, m, name]
        cap = _api.PyCapsule_New(C.addressof(m), name, C.cast(self._destructor, C.c_void_p))
        self.capsules.append(cap)
        return cap

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        self.calls.append({"stream": stream, "max_version": max_version})
        if self.returns is not None:
            return self.returns
        return self._export()


class LegacyCtypesProducer(CtypesProducer):
    """A pre-1.0 producer: __dlpack__ has no max_version keyword (TypeError if passed)."""

    def __init__(self, arr, **kw):
        super().__init__(arr, versioned=False, **kw)

    def __dlpack__(self, stream=None):  # noqa: D105 - the legacy signature is the point
        self.calls.append({"stream": stream})
        return self._export()


class NumpyLegacyProducer:
    """Wraps numpy's own __dlpack__ behind the legacy signature (stream only)."""

    def __init__(self, arr):
        self.arr, self.calls, self.capsules = arr, [], []

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()

    def __dlpack__(self, stream=None):
        self.calls.append(stream)
        cap = self.arr.__dlpack__(stream=stream)
        self.capsules.append(cap)
        return cap


class NumpyVersionedProducer(NumpyLegacyProducer):
    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        self.calls.append((stream, max_version))
        cap = self.arr.__dlpack__(stream=stream, max_version=max_version)
        self.capsules.append(cap)
        return cap


# ---------------------------------------------------------------------------
# float64 oracle


def oracle(a, e, q=0.99):
    a = np.asarray(a, dtype=np.float64).ravel()
    e = np.asarray(e, dtype=np.float64).ravel()
    fin = np.isfinite(a) & np.isfinite(e)
    d = a[fin] - e[fin]
    ee = math.fsum((e[fin] ** 2).tolist())
    out = {"n_finite": int(fin.sum()),
           "rel_l2": math.sqrt(math.fsum((d * d).tolist())) / math.sqrt(ee) if ee else None}
    if d.size:
        ad = np.abs(d)
        k = int(np.argmax(ad))
        out["max_abs_err"] = float(ad[k])
        out["max_abs_err_flat"] = int(np.flatnonzero(fin)[k])
        out["q"] = float(np.quantile(ad, q))
        out["mean_diff"] = math.fsum(d.tolist()) / d.size
    return out


def check_against_oracle(s, a64, e64, q=0.99):
    o = oracle(a64, e64, q)
    assert s.n == np.asarray(a64).size
    assert s.n_finite == o["n_finite"]
    if o["rel_l2"] is None:
        assert s.rel_l2 is None and s.zero_reference
    else:
        assert s.rel_l2 == pytest.approx(o["rel_l2"], rel=1e-12, abs=0)
    if "max_abs_err" in o:
        assert s.max_abs_err == o["max_abs_err"]
        assert s.max_abs_err_index == tuple(int(i) for i in np.unravel_index(o["max_abs_err_flat"], s.shape))
        assert s.quantile(q) == o["q"]
        assert s.mean_diff == pytest.approx(o["mean_diff"], rel=1e-12, abs=1e-300)


def torch_or_skip():
    return pytest.importorskip("torch")


# ---------------------------------------------------------------------------
# zero copy


def test_numpy_zero_copy_in_place_change_changes_result():
    a = np.zeros((4, 5), np.float32)
    e = np.zeros((4, 5), np.float64)
    assert vgct_ext.compare(a, e).max_abs_err == 0.0
    a[2, 3] = 0.5  # in place: the next compare must read the same memory
    s = vgct_ext.compare(a, e)
    assert s.max_abs_err == 0.5 and s.max_abs_err_index == (2, 3)


def test_torch_cpu_zero_copy_in_place_change_changes_result():
    torch = torch_or_skip()
    a = torch.zeros(3, 4, dtype=torch.bfloat16)
    e = torch.zeros(3, 4, dtype=torch.float32)
    view = a[:, 1:]  # a view: shares a's storage
    assert vgct_ext.compare(view, e[:, 1:]).n_unequal == 0
    a[1, 2] = 2.0
    s = vgct_ext.compare(view, e[:, 1:])
    assert s.n_unequal == 1 and s.max_abs_err == 2.0 and s.max_abs_err_index == (1, 1)


def test_ctypes_producer_reads_the_exported_pointer():
    buf = np.arange(8, dtype=np.float32)
    p = CtypesProducer(buf)
    s = vgct_ext.compare(p, np.zeros(8))
    assert s.max_abs_err == 7.0 and s.max_abs_err_index == (7,)
    buf[0] = -100
    assert vgct_ext.compare(CtypesProducer(buf), np.zeros(8)).max_abs_err == 100.0


# ---------------------------------------------------------------------------
# versioned capsule, legacy fallback, renaming, deleter exactly once


def test_versioned_capsule_is_requested_renamed_and_deleted_once():
    p = CtypesProducer(np.arange(6, dtype=np.float32).reshape(2, 3))
    s = vgct_ext.compare(p, np.arange(6, dtype=np.float64).reshape(2, 3))
    assert s.n_unequal == 0
    assert p.calls == [{"stream": None, "max_version": (1, 0)}]  # CPU: stream None
    assert capsule_name(p.capsules[0]) == "used_dltensor_versioned"
    assert p.deleter_calls == 1
    del s
    p.capsules.clear()  # dropping the used capsule must not call the deleter again
    assert p.deleter_calls == 1


def test_legacy_producer_fallback_on_type_error():
    p = LegacyCtypesProducer(np.arange(5, dtype=np.float32))
    s = vgct_ext.compare(p, np.arange(5, dtype=np.float32) + 1)
    assert s.max_abs_err == 1.0 and s.mismatches == 5
    # first call with max_version raised TypeError (not recorded), then the legacy call
    assert p.calls == [{"stream": None}]
    assert capsule_name(p.capsules[0]) == "used_dltensor"
    assert p.deleter_calls == 1


def test_numpy_legacy_capsule_through_fallback():
    arr = np.linspace(-1, 1, 11)
    prod = NumpyLegacyProducer(arr)
    before = sys.getrefcount(arr)
    s = vgct_ext.compare(prod, arr * 0.5)
    check_against_oracle(s, arr, arr * 0.5)
    assert prod.calls == [None]
    assert capsule_name(prod.capsules[0]) == "used_dltensor"
    prod.capsules.clear()
    # numpy's deleter releases its reference on the array: called exactly once
    assert sys.getrefcount(arr) == before


def test_numpy_versioned_capsule_renamed_and_refcount_restored():
    arr = np.linspace(-1, 1, 11, dtype=np.float32)
    prod = NumpyVersionedProducer(arr)
    before = sys.getrefcount(arr)
    vgct_ext.compare(prod, arr)
    assert prod.calls == [(None, (1, 0))]
    assert capsule_name(prod.capsules[0]) == "used_dltensor_versioned"
    prod.capsules.clear()
    assert sys.getrefcount(arr) == before


def test_refcounts_restored_on_every_path():
    a = np.ones((3, 2), np.float32)
    e = np.ones((2, 3), np.float32)
    ra, re_ = sys.getrefcount(a), sys.getrefcount(e)
    for _ in range(20):
        with pytest.raises(ValueError):
            vgct_ext.compare(a, e)  # both imported, then refused: both deleters called
        vgct_ext.compare(a, a)
        with pytest.raises(ValueError):
            vgct_ext.compare(a, a, dim=5)
    assert (sys.getrefcount(a), sys.getrefcount(e)) == (ra, re_)


@pytest.mark.parametrize("case", ["shape_mismatch", "bad_dim", "ok", "bad_dtype_second"])
def test_ctypes_deleter_called_exactly_once_per_export(case):
    pa = CtypesProducer(np.zeros((2, 3), np.float32))
    if case == "shape_mismatch":
        pe = CtypesProducer(np.zeros((3, 2), np.float32))
        with pytest.raises(ValueError):
            vgct_ext.compare(pa, pe)
    elif case == "bad_dim":
        pe = CtypesProducer(np.zeros((2, 3), np.float32))
        with pytest.raises(ValueError):
            vgct_ext.compare(pa, pe, dim=2)
    elif case == "bad_dtype_second":
        pe = CtypesProducer(np.zeros((2, 3), np.float32), dtype=(5, 64, 1))  # complex64
        with pytest.raises(TypeError):
            vgct_ext.compare(pa, pe)
    else:
        pe = CtypesProducer(np.zeros((2, 3), np.float32))
        vgct_ext.compare(pa, pe)
    pa.capsules.clear()
    pe.capsules.clear()
    assert pa.deleter_calls == 1 and pe.deleter_calls == 1


def test_unsupported_version_is_refused_and_left_to_the_producer():
    p = CtypesProducer(np.zeros(3, np.float32), version=(2, 0))
    with pytest.raises(BufferError, match=r"actual: .*DLPack version 2\.0.*DLPack 1\.x"):
        vgct_ext.compare(p, np.zeros(3))
    assert capsule_name(p.capsules[0]) == "dltensor_versioned"  # not consumed
    assert p.deleter_calls == 0
    p.capsules.clear()  # the producer's capsule destructor frees it
    assert p.deleter_calls == 1


def test_minor_version_above_ours_is_accepted():
    p = CtypesProducer(np.arange(3, dtype=np.float32), version=(1, 3))
    assert vgct_ext.compare(p, np.arange(3, dtype=np.float32)).n_unequal == 0
    assert p.deleter_calls == 1


def test_read_only_flag_is_accepted():
    p = CtypesProducer(np.arange(3, dtype=np.float32), flags=1)  # DLPACK_FLAG_BITMASK_READ_ONLY
    assert vgct_ext.compare(p, np.arange(3.0)).n_unequal == 0


def test_read_only_numpy_arrays():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    e = a.astype(np.float64) + 0.25
    a.setflags(write=False)
    e.setflags(write=False)
    s = vgct_ext.compare(a, e)
    check_against_oracle(s, a, e)


# ---------------------------------------------------------------------------
# malformed capsules and producers


def test_object_without_dlpack():
    with pytest.raises(TypeError) as ei:
        vgct_ext.compare([1.0, 2.0], np.zeros(2))
    assert str(ei.value) == ("actual: expected an object implementing __dlpack__ (a torch.Tensor, "
                             "numpy.ndarray, cupy/jax array), got list")
    with pytest.raises(TypeError, match=r"^expected: .*got int$"):
        vgct_ext.compare(np.zeros(2), 3)


def test_dlpack_without_device_method():
    class NoDevice:
        def __dlpack__(self, **kw):
            return np.zeros(2).__dlpack__()

    with pytest.raises(TypeError, match=r"actual: expected an object implementing __dlpack__.*NoDevice"):
        vgct_ext.compare(NoDevice(), np.zeros(2))


def test_malformed_device_tuple():
    p = CtypesProducer(np.zeros(2, np.float32), device=("cpu", 0))
    with pytest.raises(TypeError, match=r"actual: __dlpack_device__\(\) returned a tuple of \(str, int\).*tuple of two ints"):
        vgct_ext.compare(p, np.zeros(2))
    assert p.calls == []  # refused before any export


def test_dlpack_returning_a_non_capsule():
    p = CtypesProducer(np.zeros(2, np.float32), returns=42)
    with pytest.raises(TypeError, match=r"expected: __dlpack__\(\) returned int, expected a PyCapsule named "
                                        r"'dltensor_versioned' or 'dltensor'"):
        vgct_ext.compare(np.zeros(2), p)


@pytest.mark.parametrize("name,hint", [("foo", ""), ("used_dltensor", "already consumed"),
                                       ("used_dltensor_versioned", "already consumed")])
def test_capsule_with_wrong_name(name, hint):
    p = CtypesProducer(np.zeros(2, np.float32), name=name)
    with pytest.raises(BufferError, match=rf"actual: __dlpack__\(\) returned a capsule named '{name}', "
                                          rf"expected 'dltensor_versioned' or 'dltensor'.*{hint}"):
        vgct_ext.compare(p, np.zeros(2))
    assert capsule_name(p.capsules[0]) == name  # untouched
    assert p.deleter_calls == 0  # not ours to free, and not a live name for the producer either


def test_producer_exception_propagates():
    class Refusing(NumpyVersionedProducer):
        def __dlpack__(self, **kw):
            raise BufferError("producer says no")

    with pytest.raises(BufferError, match="producer says no"):
        vgct_ext.compare(Refusing(np.zeros(2)), np.zeros(2))


def test_null_data_pointer_with_elements():
    p = CtypesProducer(np.zeros(4, np.float32), data=None)
    with pytest.raises(BufferError, match=r"actual: malformed DLTensor: data is NULL for a tensor of 4 elements"):
        vgct_ext.compare(p, np.zeros(4))
    p.capsules.clear()
    assert p.deleter_calls == 1


def test_null_data_pointer_zero_size_is_fine():
    p = CtypesProducer(np.zeros((0, 3), np.float32), data=None)
    s = vgct_ext.compare(p, np.zeros((0, 3)))
    assert s.n == 0 and s.n_finite == 0 and s.shape == (0, 3)
    assert s.rel_l2 is None and s.zero_reference and s.max_abs_err is None
    assert s.quantiles == {0.99: None}
    assert p.deleter_calls == 1


def test_negative_ndim_and_shape():
    with pytest.raises(BufferError, match="ndim is -1"):
        vgct_ext.compare(CtypesProducer(np.zeros(2, np.float32), ndim=-1), np.zeros(2))
    with pytest.raises(BufferError, match=r"shape\[0\] = -2"):
        vgct_ext.compare(CtypesProducer(np.zeros(2, np.float32), shape=[-2]), np.zeros(2))


def test_too_many_dimensions():
    arr = np.zeros([1] * 33, np.float32)
    p = CtypesProducer(arr)
    with pytest.raises(ValueError, match=r"actual: tensor has 33 dimensions; vgct_ext supports at most 32"):
        vgct_ext.compare(p, p)
    # 32 is fine
    a32 = np.zeros([1] * 32, np.float32)
    assert vgct_ext.compare(a32, a32).n == 1


def test_element_count_overflow_and_stride_overflow():
    p = CtypesProducer(np.zeros(1, np.float32), ndim=2, shape=[2 ** 62, 4], strides=[0, 0])
    with pytest.raises(ValueError, match=r"^actual: the element count of shape "
                                         r"\(4611686018427387904, 4\) overflows int64$"):
        vgct_ext.compare(p, p)
    # one shape format in every message: Python's tuples, "(2,)" for one axis
    q = CtypesProducer(np.zeros(2, np.float32), shape=[2], strides=[2 ** 62])
    with pytest.raises(ValueError, match=r"strides reach beyond the int64 byte range .*: "
                                         r"shape \(2,\) strides \(4611686018427387904,\) in elements of 4 bytes"):
        vgct_ext.compare(q, np.zeros(2))
    r = CtypesProducer(np.zeros(1, np.float32), ndim=10, shape=[2] * 10, strides=[2 ** 61] + [1] * 9)
    with pytest.raises(ValueError, match=r"shape \(2, 2, 2, 2, 2, 2, 2, 2, 2, 2\) "
                                         r"strides \(2305843009213693952, 1, 1, 1, 1, 1, 1, 1, 1, 1\) "):
        vgct_ext.compare(r, r)


def test_capsule_device_disagrees_with_dlpack_device():
    p = CtypesProducer(np.zeros(2, np.float32), device=(1, 0), capsule_device=(3, 0))
    with pytest.raises(BufferError, match=r"capsule is on device cuda_host:0 but __dlpack_device__\(\) said cpu:0"):
        vgct_ext.compare(p, np.zeros(2))


@pytest.mark.parametrize("code,bits,lanes,what", [
    (5, 64, 1, "code 5 'complex', bits 64, lanes 1"),
    (2, 32, 4, "code 2 'float', bits 32, lanes 4"),
    (1, 128, 1, "code 1 'uint', bits 128"),
    (8, 8, 1, "code 8 'float8_e4m3'"),
    (3, 64, 1, "'opaque_handle'"),
])
def test_unsupported_dtypes(code, bits, lanes, what):
    p = CtypesProducer(np.zeros(2, np.float32), dtype=(code, bits, lanes))
    with pytest.raises(TypeError) as ei:
        vgct_ext.compare(p, np.zeros(2))
    msg = str(ei.value)
    assert msg.startswith("actual: unsupported dtype") and what in msg
    assert ("supported: bool, int8, int16, int32, int64, uint8, float16, bfloat16, float32, float64, "
            "float8_e4m3fn, float8_e5m2") in msg


def test_unsupported_numpy_dtype_complex():
    with pytest.raises(TypeError, match=r"^expected: complex dtype complex64; .*np\.real\(expected\)") as ei:
        vgct_ext.compare(np.zeros(3), np.zeros(3, np.complex64))
    assert str(ei.value.__cause__).startswith("expected: unsupported dtype (DLPack code 5 'complex'")


@pytest.mark.parametrize("dev,name", [((4, 0), "opencl:0"), ((10, 1), "rocm:1"), ((8, 0), "metal:0"),
                                      ((99, 0), "unknown:0")])
def test_unsupported_devices(dev, name):
    p = CtypesProducer(np.zeros(2, np.float32), device=dev)
    with pytest.raises(BufferError, match=rf"actual: tensor on device {name} \(DLPack device type {dev[0]}\) "
                                          r"is not supported; vgct_ext reads cpu, cuda_host, cuda and cuda_managed"):
        vgct_ext.compare(p, np.zeros(2))
    assert p.calls == []


def test_cuda_host_memory_is_read_as_cpu():
    host = np.arange(4, dtype=np.float32)
    p = CtypesProducer(host, device=(3, 0))  # kDLCUDAHost (pinned host memory)
    s = vgct_ext.compare(p, np.arange(4.0))
    assert s.device == "cpu" and s.n_unequal == 0
    assert p.calls[0]["stream"] is None


def test_device_mismatch_cpu_vs_cuda_no_export():
    p = CtypesProducer(np.zeros(2, np.float32), device=(2, 0))
    with pytest.raises(ValueError, match=r"device mismatch: actual is on cpu, expected on cuda:0; vgct_ext makes "
                                         r"no hidden copies"):
        vgct_ext.compare(np.zeros(2), p)
    assert p.calls == []


def test_device_mismatch_two_cuda_devices():
    p0 = CtypesProducer(np.zeros(2, np.float32), device=(2, 0))
    p1 = CtypesProducer(np.zeros(2, np.float32), device=(13, 1))  # managed memory on device 1
    with pytest.raises(ValueError, match=r"device mismatch: actual is on cuda:0, expected on cuda:1"):
        vgct_ext.compare(p0, p1)
    assert p0.calls == [] and p1.calls == []


@pytest.mark.skipif(vgct_ext.build_info()["cuda_compiled"], reason="CPU-only build behaviour")
def test_cuda_input_on_cpu_only_build():
    p = CtypesProducer(np.zeros(2, np.float32), device=(2, 0))
    with pytest.raises(RuntimeError, match="vgct_ext was built without CUDA; rebuild with nvcc available"):
        vgct_ext.compare(p, p)
    with pytest.raises(RuntimeError, match="built without CUDA"):
        vgct_ext.fingerprint(p)


def test_shape_mismatch_names_both_shapes():
    with pytest.raises(ValueError) as ei:
        vgct_ext.compare(np.zeros((2, 3)), np.zeros((3, 2)))
    assert "shape mismatch: actual has shape (2, 3), expected has shape (3, 2)" in str(ei.value)
    with pytest.raises(ValueError, match=r"actual has shape \(6,\), expected has shape \(\)"):
        vgct_ext.compare(np.zeros(6), np.zeros(()))
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(1, 3\)"):  # no broadcasting
        vgct_ext.compare(np.zeros((2, 3)), np.zeros((1, 3)))


# ---------------------------------------------------------------------------
# argument validation


@pytest.mark.parametrize("kw,exc,msg", [
    ({"rtol": float("nan")}, ValueError, "rtol must be a finite number >= 0, got nan"),
    ({"rtol": -1e-3}, ValueError, "rtol must be a finite number >= 0, got -0.001"),
    ({"atol": float("inf")}, ValueError, "atol must be a finite number >= 0, got inf"),
    ({"quantiles": (0.5, 1.5)}, ValueError, r"quantiles\[1\] must be a finite float in \[0, 1\], got 1.5"),
    ({"quantiles": (float("nan"),)}, ValueError, r"quantiles\[0\] must be a finite float in \[0, 1\], got nan"),
    ({"quantiles": (-0.1,)}, ValueError, r"quantiles\[0\]"),
    ({"quantiles": ("a",)}, TypeError, r"quantiles\[0\] must be a float in \[0, 1\], got str"),
    ({"quantiles": tuple([0.5] * 65)}, ValueError, "at most 64 quantiles per call, got 65"),
    ({"dim": 2}, ValueError, r"dim 2 out of range for a tensor of 2 dims \(shape \(3, 4\)\)"),
    ({"dim": -3}, ValueError, r"dim -3 out of range"),
    ({"dim": 1.0}, TypeError, "dim must be None or an int, got float"),
])
def test_argument_errors(kw, exc, msg):
    with pytest.raises(exc, match=msg):
        vgct_ext.compare(np.zeros((3, 4)), np.zeros((3, 4)), **kw)


def test_c_level_argument_errors():
    x = np.zeros(3)
    with pytest.raises(ValueError, match="stream 0 is not allowed by the DLPack spec"):
        _C.compare(x, x, 1e-3, 1e-3, (), None, 0)
    with pytest.raises(TypeError, match="stream must be None or an int"):
        _C.compare(x, x, 1e-3, 1e-3, (), None, "s")
    with pytest.raises(ValueError, match="dtype_actual: unknown dtype name 'float7'"):
        _C.compare(x, x, dtype_actual="float7")
    with pytest.raises(ValueError, match=r"expected: dtype override bfloat16 \(itemsize 2\) cannot reinterpret "
                                         r"float64 \(itemsize 8\)"):
        _C.compare(x, x, dtype_expected="bfloat16")
    with pytest.raises(TypeError, match="must be None or a dtype name"):
        _C.compare(x, x, dtype_actual=3)


def test_quantile_arguments_accepted_forms():
    x = np.arange(10.0)
    y = np.zeros(10)
    assert vgct_ext.compare(x, y, quantiles=0.5).quantiles == {0.5: 4.5}
    assert vgct_ext.compare(x, y, quantiles=[0, 1]).quantiles == {0.0: 0.0, 1.0: 9.0}
    assert vgct_ext.compare(x, y, quantiles=None).quantiles == {}
    assert len(vgct_ext.compare(x, y, quantiles=np.linspace(0, 1, 64)).quantiles) == 64


def test_negative_dim_is_normalized():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    s = vgct_ext.compare(a, np.zeros((2, 3, 4)), dim=-1)
    assert s.dim == 2 and s.slices.dim == 2 and len(s.slices) == 4
    with pytest.raises(ValueError, match="dim 0 out of range for a tensor of 0 dims"):
        vgct_ext.compare(np.array(1.0), np.array(1.0), dim=0)


# ---------------------------------------------------------------------------
# strides, offsets, views


def test_strides_null_means_row_major():
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    e = np.zeros((3, 4))
    s_null = vgct_ext.compare(CtypesProducer(arr, strides=None), e)
    s_expl = vgct_ext.compare(arr, e)
    assert s_null == s_expl
    assert s_null.max_abs_err == 11.0 and s_null.max_abs_err_index == (2, 3)


def test_stride_zero_broadcast():
    a = np.broadcast_to(np.arange(4, dtype=np.float32), (5, 4))
    e = np.zeros((5, 4))
    assert a.strides[0] == 0
    s = vgct_ext.compare(a, e, quantiles=(0.5,))
    check_against_oracle(s, a, e, 0.5)
    assert s.max_abs_err_index == (0, 3)  # lowest flat index among the 5 ties


def test_negative_strides_numpy():
    base = np.arange(20, dtype=np.float64).reshape(4, 5)
    a = base[::-1, ::-2]
    e = np.ascontiguousarray(a) * 0.5
    assert a.strides[0] < 0 and a.strides[1] < 0
    s = vgct_ext.compare(a, e)
    check_against_oracle(s, a, e)
    assert s.max_abs_err_index == (0, 0)  # a[0, 0] = base[3, 4] = 19, the largest |a - a/2|
    i = s.max_abs_err_index
    assert s.max_abs_err_actual == a[i] and s.max_abs_err_expected == e[i]


def test_negative_strides_ctypes_with_byte_offset():
    buf = np.arange(6, dtype=np.float32)
    # a reversed view described as data=base, byte_offset=5*4, stride -1
    p = CtypesProducer(buf, strides=[-1], byte_offset=5 * 4)
    s = vgct_ext.compare(p, buf[::-1].astype(np.float64))
    assert s.n_unequal == 0 and s.n == 6


def test_non_contiguous_views():
    rng = np.random.default_rng(0)
    base = rng.standard_normal((6, 7, 8)).astype(np.float32)
    a = base.transpose(2, 0, 1)[::2, 1:, ::3]
    e = rng.standard_normal(a.shape)
    s = vgct_ext.compare(a, e, quantiles=(0.9,))
    check_against_oracle(s, a, e, 0.9)


def test_misaligned_data_pointer_cpu():
    raw = np.zeros(4 * 8 + 1, np.uint8)
    vals = np.array([1.5, -2.0, 3.25, 0.0, 7.0, 1e-3, -1e3, 2.0], np.float32)
    raw[1:] = vals.view(np.uint8)
    f32 = np.frombuffer(raw.data, dtype=np.float32, offset=1, count=8)  # address % 4 == 1
    assert not f32.flags.aligned
    s = vgct_ext.compare(f32, np.zeros(8))
    check_against_oracle(s, vals, np.zeros(8))
    # the same through byte_offset = 1 on an aligned base pointer
    p = CtypesProducer(raw, dtype=(2, 32, 1), shape=[8], strides=[1], byte_offset=1)
    assert vgct_ext.compare(p, vals).n_unequal == 0


def test_torch_bf16_misaligned_slice_and_views():
    torch = torch_or_skip()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1001, generator=g).to(torch.bfloat16)
    a = x[1:]  # data pointer at an odd multiple of 2 bytes
    e = torch.randn(1000, generator=g)
    s = vgct_ext.compare(a, e)
    check_against_oracle(s, a.double().numpy(), e.double().numpy())
    y = torch.randn(8, 9, 10, generator=g).to(torch.bfloat16)
    a2 = y.permute(2, 0, 1)[:, 1::2, ::3]
    e2 = torch.randn(a2.shape, generator=g)
    s2 = vgct_ext.compare(a2, e2, quantiles=(0.5, 0.99))
    check_against_oracle(s2, a2.double().numpy(), e2.double().numpy())
    # torch stride-0 expand
    a3 = torch.arange(4, dtype=torch.float16).expand(3, 4)
    s3 = vgct_ext.compare(a3, torch.zeros(3, 4))
    assert s3.max_abs_err == 3.0 and s3.max_abs_err_index == (0, 3)


def test_zero_size_inputs():
    for shape in [(0,), (3, 0), (0, 4, 5)]:
        s = vgct_ext.compare(np.zeros(shape, np.float32), np.zeros(shape), dim=0)
        assert s.n == 0 and s.n_finite == 0 and s.shape == shape
        assert s.rel_l2 is None and s.cosine is None and s.zero_reference
        assert s.max_abs_err is None and s.max_abs_err_index is None and s.mean_diff is None
        assert s.quantiles == {0.99: None} and s.mismatches == 0 and s.mismatch_fraction == 0.0
        assert len(s.slices) == shape[0]


def test_zero_size_torch():
    torch = torch_or_skip()
    s = vgct_ext.compare(torch.empty(0, 3, dtype=torch.bfloat16), torch.empty(0, 3))
    assert s.n == 0 and s.shape == (0, 3)


def test_scalar_zero_dim():
    s = vgct_ext.compare(np.array(2.5, np.float32), np.array(2.0))
    assert s.shape == () and s.n == 1 and s.max_abs_err == 0.5 and s.max_abs_err_index == ()


@pytest.mark.slow
def test_more_than_2_31_elements_stride_zero():
    n = 2 ** 31 + 3
    a = np.broadcast_to(np.float32(1.5), (n,))
    e = np.broadcast_to(np.float64(1.0), (n,))
    s = vgct_ext.compare(a, e, quantiles=())
    assert s.n == n and s.n_finite == n
    assert s.rel_l2 == 0.5  # exact: every partial sum is a multiple of 1/4 below 2^53
    assert s.norm_diff == math.sqrt(0.25 * n)
    assert s.mismatches == n and s.max_abs_err == 0.5 and s.max_abs_err_index == (0,)
    assert s.mean_diff == 0.5


# ---------------------------------------------------------------------------
# dtypes through the bridge


@pytest.mark.parametrize("dt", [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8,
                                np.float16, np.float32, np.float64])
def test_numpy_dtypes_against_float64_oracle(dt):
    rng = np.random.default_rng(1)
    if dt is np.bool_:
        a = rng.integers(0, 2, (7, 9)).astype(dt)
    elif np.issubdtype(dt, np.integer):
        info = np.iinfo(dt)
        a = rng.integers(max(info.min, -1000), min(info.max, 1000), (7, 9)).astype(dt)
    else:
        a = (rng.standard_normal((7, 9)) * 10).astype(dt)
    e = rng.standard_normal((7, 9))
    s = vgct_ext.compare(a, e, quantiles=(0.99,))
    assert s.dtype_actual == np.dtype(dt).name if dt is not np.bool_ else s.dtype_actual == "bool"
    check_against_oracle(s, a.astype(np.float64), e)


def test_mixed_bf16_vs_fp32_torch():
    torch = torch_or_skip()
    g = torch.Generator().manual_seed(2)
    e = torch.randn(64, 33, generator=g)
    a = (e * 1.01).to(torch.bfloat16)
    s = vgct_ext.compare(a, e, dim=1)
    assert (s.dtype_actual, s.dtype_expected) == ("bfloat16", "float32")
    a64, e64 = a.double().numpy(), e.double().numpy()
    check_against_oracle(s, a64, e64)
    d = a64 - e64
    np.testing.assert_allclose(s.slices.mean_shift, d.mean(axis=0), rtol=1e-12, atol=1e-300)
    np.testing.assert_array_equal(s.slices.max_abs_err, np.abs(d).max(axis=0))
    np.testing.assert_allclose(s.slices.rel_l2, np.linalg.norm(d, axis=0) / np.linalg.norm(e64, axis=0),
                               rtol=1e-12)
    np.testing.assert_allclose(s.slices.ref_rms, np.sqrt((e64 ** 2).mean(axis=0)), rtol=1e-12)
    np.testing.assert_array_equal(s.slices.count, np.full(33, 64))


def _fp8_decode(code: int, kind: str) -> float:
    """Independent decoder (OCP 8-bit FP spec v1.0) for the oracle."""
    sign = -1.0 if code & 0x80 else 1.0
    if kind == "e4m3fn":
        ex, m = (code >> 3) & 0xF, code & 0x7
        if ex == 0xF and m == 0x7:
            return math.nan
        return sign * (m / 8 * 2.0 ** -6 if ex == 0 else (1 + m / 8) * 2.0 ** (ex - 7))
    ex, m = (code >> 2) & 0x1F, code & 0x3
    if ex == 0x1F:
        return math.nan if m else sign * math.inf
    return sign * (m / 4 * 2.0 ** -14 if ex == 0 else (1 + m / 4) * 2.0 ** (ex - 15))


@pytest.mark.parametrize("kind", ["e4m3fn", "e5m2"])
@pytest.mark.parametrize("force_view", [False, True])
def test_fp8_torch_every_code_against_decoder(kind, force_view, monkeypatch):
    torch = torch_or_skip()
    tdt = getattr(torch, f"float8_{kind}")
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    a = codes.view(tdt)
    oracle64 = np.array([_fp8_decode(c, kind) for c in range(256)])
    if force_view:  # the uint8-view fallback for a torch without float8 DLPack export
        monkeypatch.setattr(_dlpack, "_torch_fp8_export", False)
    obj, override = _dlpack.prepare(a)
    assert (override == f"float8_{kind}") == force_view
    s = vgct_ext.compare(a, oracle64, quantiles=())
    assert s.dtype_actual == f"float8_{kind}"
    assert s.n_unequal == 0 and s.n_class_mismatch == 0  # every code decodes exactly (NaN == NaN)
    assert s.nan_actual == int(np.isnan(oracle64).sum()) == (2 if kind == "e4m3fn" else 6)
    assert s.posinf_actual == (0 if kind == "e4m3fn" else 1)
    assert s.max_abs_expected == (448.0 if kind == "e4m3fn" else 57344.0)


@pytest.mark.parametrize("kind", ["e4m3fn", "e5m2"])
def test_fp8_torch_values_against_float64_oracle(kind):
    torch = torch_or_skip()
    g = torch.Generator().manual_seed(3)
    e = torch.randn(500, generator=g) * 4
    a = e.to(getattr(torch, f"float8_{kind}"))
    s = vgct_ext.compare(a, e, quantiles=(0.5, 0.99))
    a64 = np.array([_fp8_decode(int(c), kind) for c in a.view(torch.uint8).tolist()])
    check_against_oracle(s, a64, e.double().numpy())
    check_against_oracle(s, a64, e.double().numpy(), 0.5)


def test_fp8_override_through_c_directly():
    torch = torch_or_skip()
    a = torch.tensor([1.0, -2.0, 448.0]).to(torch.float8_e4m3fn)
    d = _C.compare(a.view(torch.uint8), np.array([1.0, -2.0, 448.0]), dtype_actual="float8_e4m3fn")
    assert d["dtype_actual"] == "float8_e4m3fn" and d["n_unequal"] == 0


def test_requires_grad_tensor_is_detached_without_copy():
    torch = torch_or_skip()
    w = torch.nn.Parameter(torch.zeros(4, 4))
    e = torch.zeros(4, 4)
    assert vgct_ext.compare(w, e).n_unequal == 0
    with torch.no_grad():
        w[1, 1] = 3.0  # in place on the parameter: the detached view sees it
    s = vgct_ext.compare(w, e)
    assert s.max_abs_err == 3.0 and s.max_abs_err_index == (1, 1)
    x = torch.ones(3, requires_grad=True) * 2  # non-leaf requiring grad
    assert vgct_ext.compare(x, torch.full((3,), 2.0)).n_unequal == 0
    assert vgct_ext.fingerprint(x) == vgct_ext.fingerprint(x.detach())


def test_torch_and_numpy_mixed_producers():
    torch = torch_or_skip()
    e = np.linspace(-3, 3, 50)
    a = torch.from_numpy(e).to(torch.float16)
    s = vgct_ext.compare(a, e)
    check_against_oracle(s, a.double().numpy(), e)


# ---------------------------------------------------------------------------
# fingerprint through the bridge


def test_fingerprint_layout_independent_and_dtype_sensitive():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    f = vgct_ext.fingerprint(a)
    assert isinstance(f, int) and 0 <= f < 2 ** 64
    assert vgct_ext.fingerprint(np.asfortranarray(a)) == f
    assert vgct_ext.fingerprint(CtypesProducer(a, strides=None)) == f
    assert vgct_ext.fingerprint(a.astype(np.int32)) != f
    assert vgct_ext.fingerprint(a.reshape(4, 3)) != f
    b = a.copy()
    b[2, 3] = np.nextafter(b[2, 3], np.float32(100))
    assert vgct_ext.fingerprint(b) != f
    with pytest.raises(TypeError, match=r"^x: expected an object implementing __dlpack__"):
        vgct_ext.fingerprint([1, 2])


def test_fingerprint_fp8_override_matches_native():
    torch = torch_or_skip()
    a = torch.randn(64).to(torch.float8_e5m2)
    assert _C.fingerprint(a.view(torch.uint8), None, "float8_e5m2") == vgct_ext.fingerprint(a)


# ---------------------------------------------------------------------------
# GIL released: another Python thread runs while the engine works


def test_gil_released_during_compare():
    import threading
    import time

    a = np.broadcast_to(np.float32(1.0), (60_000_000,))
    e = np.broadcast_to(np.float64(1.0), (60_000_000,))
    ticks = []
    done = threading.Event()

    def ticker():
        while not done.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    t = threading.Thread(target=ticker)
    t.start()
    try:
        time.sleep(0.01)
        t0 = time.perf_counter()
        vgct_ext.compare(a, e, quantiles=())
        t1 = time.perf_counter()
    finally:
        done.set()
        t.join()
    during = [x for x in ticks if t0 < x < t1]
    if t1 - t0 > 0.05:  # only meaningful when the call takes a while
        assert len(during) >= 3, (t1 - t0, len(during))


# ---------------------------------------------------------------------------
# review regressions: each test pins one defect of the bridge / shims review


def _root():
    from pathlib import Path

    return Path(__file__).resolve().parents[5]


class _UnkeptProducer(CtypesProducer):
    """A CtypesProducer that keeps no reference to the capsules it returns: the consumer's
    reference is the last one, so dropping it runs the capsule destructor at once."""

    def __dlpack__(self, **kw):
        cap = super().__dlpack__(**kw)
        self.capsules.clear()
        return cap


class _RefusingProducer(CtypesProducer):
    """__dlpack__(**kw) that raises ``exc`` when a keyword of ``refuse`` is passed; records the
    keyword names of every attempt."""

    def __init__(self, arr, *, refuse=(), exc=TypeError, **kw):
        super().__init__(arr, **kw)
        self.refuse, self.exc, self.attempts = set(refuse), exc, []

    def __dlpack__(self, **kw):
        self.attempts.append(sorted(kw))
        bad = self.refuse & set(kw)
        if bad:
            raise self.exc(f"refused {sorted(bad)}")
        return self._export()


# -- 1. torch's lazy negation bit ----------------------------------------------------------------


def test_torch_negative_bit_is_resolved_not_exported_unsigned():
    torch = torch_or_skip()
    c = torch.tensor([1 + 2j, 3 - 4j, -0.5 + 0.25j], dtype=torch.complex128)
    x = c.conj().imag  # a real view carrying the neg bit: values -imag(c)
    assert x.is_neg() and x.dtype == torch.float64
    want = -np.imag(c.numpy())  # float64 oracle: [-2, 4, -0.25]
    e = np.array([0.5, 0.0, 1.0])
    s = vgct_ext.compare(x, e, quantiles=(0.5, 0.99))
    check_against_oracle(s, want, e)
    check_against_oracle(s, want, e, 0.5)
    assert s.max_abs_err_actual == 4.0 and s.max_abs_err_index == (1,)
    y = torch._neg_view(torch.tensor([1.0, -2.0, 3.5]))
    assert y.is_neg()
    s2 = vgct_ext.compare(y, np.array([-1.0, 2.0, -3.5]))
    assert s2.n_unequal == 0 and s2.max_abs_err == 0.0
    assert vgct_ext.fingerprint(y) == vgct_ext.fingerprint(torch.tensor([-1.0, 2.0, -3.5]))
    obj, override = _dlpack.prepare(y)
    assert not obj.is_neg() and override is None and y.is_neg()  # the caller's tensor is untouched
    plain = torch.ones(3)
    alias = _dlpack.prepare(plain)[0]  # no copy without the neg bit: an alias of the storage
    assert alias is not plain and alias.data_ptr() == plain.data_ptr()
    assert alias.untyped_storage().data_ptr() == plain.untyped_storage().data_ptr()


# -- 2. torch.Tensor subclasses defined outside torch --------------------------------------------


def test_torch_subclass_from_another_module_is_detached():
    torch = torch_or_skip()

    class MyTensor(torch.Tensor):
        pass

    vals = [0.5, -1.5, 2.0, 8.0]
    x = torch.tensor(vals, requires_grad=True).as_subclass(MyTensor)
    assert type(x).__module__ == __name__ and x.requires_grad
    e = np.array([0.0, -1.0, 2.0, 1.0])
    s = vgct_ext.compare(x, e)
    check_against_oracle(s, np.array(vals), e)
    assert vgct_ext.fingerprint(x) == vgct_ext.fingerprint(torch.tensor(vals))


def test_torch_subclass_gets_torchs_current_stream(monkeypatch):
    torch = torch_or_skip()

    class CudaLooking(torch.Tensor):
        def __dlpack_device__(self):  # only consumer_stream reads it here
            return (2, 0)

    x = torch.zeros(2).as_subclass(CudaLooking)
    seen = []
    handle = [0x1234]
    monkeypatch.setattr(_dlpack, "_torch_cuda_fns", (torch, None, None))  # the public torch.cuda path
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device=None: seen.append(device) or type("S", (), {"cuda_stream": handle[0]})())
    assert _dlpack.consumer_stream(x, x) == 0x1234
    assert seen == [x.device]
    handle[0] = 0  # torch's default stream handle 0 becomes the spec's legacy default, 1
    assert _dlpack.consumer_stream(x) == 1


# -- 3. numpy >= 2.1 (versioned capsules with the read-only flag) --------------------------------


def test_numpy_floor_is_2_1_where_it_is_declared():
    root = _root()
    pp = (root / "pyproject.toml").read_text()
    assert "numpy>=1." not in pp
    assert pp.count('"numpy>=2.1"') == 3  # build-system requires, dependencies, the test extra
    env = (root / "scripts" / "_env.sh").read_text()
    assert '"numpy>=2.1"' in env and ">= (2, 1)" in env and "(1, 26)" not in env
    assert "NumPy >= 2.1" in (root / "README.md").read_text()
    assert np.lib.NumpyVersion(np.__version__) >= "2.1.0"


def test_numpy_read_only_array_exports_versioned_read_only_capsule():
    base = np.arange(4, dtype=np.float32)
    a = np.broadcast_to(base, (3, 4))  # read-only, stride 0
    assert not a.flags.writeable
    cap = a.__dlpack__(max_version=(1, 0))
    assert capsule_name(cap) == "dltensor_versioned"
    ptr = _get_pointer_raw(id(cap), b"dltensor_versioned")
    assert DLManagedTensorVersioned.from_address(ptr).flags & 1  # DLPACK_FLAG_BITMASK_READ_ONLY
    del cap
    e = np.full((3, 4), 1.0)
    s = vgct_ext.compare(a, e, quantiles=(0.5,))
    check_against_oracle(s, a, e, 0.5)


# -- 4. legacy fallback: TypeError / NotImplementedError only, errors chained --------------------


def test_producer_refusing_max_version_with_not_implemented_gets_the_legacy_call():
    arr = np.array([1.0, -2.0, 3.0], np.float32)
    p = _RefusingProducer(arr, refuse={"max_version"}, exc=NotImplementedError, versioned=False)
    s = vgct_ext.compare(p, np.array([1.0, 2.0, 3.0]))
    check_against_oracle(s, arr, np.array([1.0, 2.0, 3.0]))
    assert p.attempts == [["copy", "max_version", "stream"], ["max_version", "stream"], ["stream"]]
    assert capsule_name(p.capsules[0]) == "used_dltensor"
    p.capsules.clear()
    assert p.deleter_calls == 1


def test_producer_rejecting_only_copy_keeps_the_versioned_capsule():
    arr = np.arange(5, dtype=np.float32)
    p = _RefusingProducer(arr, refuse={"copy"})
    assert vgct_ext.compare(p, arr.astype(np.float64)).n_unequal == 0
    assert p.attempts == [["copy", "max_version", "stream"], ["max_version", "stream"]]
    assert capsule_name(p.capsules[0]) == "used_dltensor_versioned"


def test_producer_type_error_is_not_hidden_by_the_retries():
    class Buggy:
        n = 0

        def __dlpack_device__(self):
            return (1, 0)

        def __dlpack__(self, **kw):
            self.n += 1
            raise TypeError(f"producer bug #{self.n} with {sorted(kw)}")

    b = Buggy()
    with pytest.raises(TypeError, match=r"^actual: .*Buggy could not be exported through DLPack \(TypeError: "
                                        r"producer bug #3 with \['stream'\]\)") as ei:
        vgct_ext.compare(b, np.zeros(1))
    assert b.n == 3
    e = ei.value.__cause__  # the producer's own error, chained
    assert str(e) == "producer bug #3 with ['stream']"
    assert str(e.__context__) == "producer bug #2 with ['max_version', 'stream']"
    assert str(e.__context__.__context__) == "producer bug #1 with ['copy', 'max_version', 'stream']"
    assert isinstance(e.__context__.__context__, TypeError)


def test_retry_failing_differently_is_chained_to_the_first_error():
    class Odd:
        calls = []

        def __dlpack_device__(self):
            return (1, 0)

        def __dlpack__(self, **kw):
            self.calls.append(sorted(kw))
            if "copy" in kw:
                raise TypeError("no copy keyword")
            raise BufferError("cannot export this one")

    o = Odd()
    with pytest.raises(BufferError, match=r"^actual: .*Odd could not be exported through DLPack \(BufferError: "
                                          r"cannot export this one\)") as ei:
        vgct_ext.compare(o, np.zeros(1))
    orig = ei.value.__cause__
    assert str(orig) == "cannot export this one"
    assert isinstance(orig.__context__, TypeError) and str(orig.__context__) == "no copy keyword"
    assert o.calls == [["copy", "max_version", "stream"], ["max_version", "stream"]]  # BufferError: no more retries


def test_other_producer_errors_are_not_retried():
    p = _RefusingProducer(np.zeros(2, np.float32), refuse={"stream"}, exc=BufferError)
    with pytest.raises(BufferError, match=r"^actual: .*_RefusingProducer could not be exported through DLPack "
                                          r"\(BufferError: refused \['stream'\]\)") as ei:
        vgct_ext.compare(p, np.zeros(2))
    assert str(ei.value.__cause__) == "refused ['stream']"
    assert p.attempts == [["copy", "max_version", "stream"]] and ei.value.__cause__.__context__ is None


# -- 5. empty tensors with huge other dims (no signed overflow) ----------------------------------


@pytest.mark.parametrize("shape", [(0, 2 ** 62, 2 ** 62), (2 ** 62, 2 ** 62, 0), (2 ** 62, 0, 2 ** 62)])
@pytest.mark.parametrize("strides", [None, [2 ** 40, 2 ** 40, 2 ** 40]])
def test_empty_tensor_with_huge_dims(shape, strides):
    def prod(st):
        return CtypesProducer(np.zeros(1, np.float32), ndim=3, shape=shape, strides=st, data=None)

    k = shape.index(0)
    s = vgct_ext.compare(prod(strides), prod(None), dim=k, quantiles=(0.5,))
    assert s.n == 0 and s.n_finite == 0 and s.shape == shape
    assert s.max_abs_err is None and s.rel_l2 is None and s.quantiles == {0.5: None}
    assert len(s.slices) == 0 and s.slices.dim == k
    # layout-independent even when empty: the producer's strides do not matter
    assert vgct_ext.fingerprint(prod(strides)) == vgct_ext.fingerprint(prod(None))
    assert vgct_ext.fingerprint(prod(None)) != vgct_ext.fingerprint(np.zeros((0, 3), np.float32))


def test_numel_of_empty_shapes_matches_numpy():
    for shape in [(0,), (5, 0), (0, 7, 3), (3, 0, 0)]:
        s = vgct_ext.compare(np.zeros(shape, np.float32), np.zeros(shape))
        assert s.n == int(np.prod(shape)) == 0 and s.shape == shape


# -- 6. the failing import's exception survives the capsule destructor ---------------------------


def test_import_error_survives_a_capsule_destructor_that_runs_python(monkeypatch):
    pyerr_occurred = C.PYFUNCTYPE(C.c_void_p)(("PyErr_Occurred", _api))
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    p = _UnkeptProducer(np.zeros(2, np.float32), ndim=-1)  # refused after the export
    pending_at_entry = []
    count = p._count

    def on_destroy(cap_ptr):
        pending_at_entry.append(pyerr_occurred())
        if _get_name_raw(cap_ptr) in (b"dltensor", b"dltensor_versioned"):
            count[0] += 1
        raise KeyError("noise from the producer's destructor")  # ctypes reports and clears it

    p._destructor = DESTRUCTOR(on_destroy)
    _KEEP_CALLBACKS.append(p._destructor)
    with pytest.raises(BufferError, match=r"^actual: malformed DLTensor: ndim is -1$"):
        vgct_ext.compare(p, np.zeros(2))
    assert pending_at_entry == [None]  # no exception was pending while the destructor ran
    assert p.deleter_calls == 1  # the unconsumed capsule was freed by its destructor, once
    assert [type(u.exc_value) for u in unraisable] == [KeyError]


# -- 7. stream argument: bools, -1, CPU inputs ---------------------------------------------------


def test_stream_argument_rules_on_cpu():
    x = np.zeros(3)
    for fn in (lambda st: _C.compare(x, x, stream=st), lambda st: _C.fingerprint(x, st)):
        for b in (True, False):
            with pytest.raises(TypeError, match=r"^stream must be None or an int \(a cudaStream_t\), got bool$"):
                fn(b)
        with pytest.raises(ValueError, match="^stream 0 is not allowed by the DLPack spec"):
            fn(0)
        with pytest.raises(ValueError, match=r"^stream must be -1 \(no synchronization\) or a positive "
                                             r"cudaStream_t, got a negative int$"):
            fn(-2)
        with pytest.raises(ValueError, match="^stream is out of range for a cudaStream_t$"):
            fn(2 ** 64)
    for dev in ((1, 0), (3, 0)):  # CPU and pinned host memory: only None
        p = CtypesProducer(np.zeros(2, np.float32), device=dev)
        for st in (-1, 1, 2, 0x7F00):
            with pytest.raises(ValueError, match=r"^actual: stream must be None for a tensor in host memory "
                                                 r"\(the DLPack Python specification allows only None on the CPU\), "
                                                 r"got int$"):
                _C.compare(p, p, stream=st)
            with pytest.raises(ValueError, match="^x: stream must be None for a tensor in host memory"):
                _C.fingerprint(p, st)
        assert p.calls == []  # refused before any export
        assert _C.compare(p, p, stream=None)["n"] == 2


@pytest.mark.skipif(not vgct_ext.build_info()["cuda_compiled"], reason="needs a CUDA build")
def test_stream_minus_one_reaches_cuda_producers():
    p = CtypesProducer(np.zeros(0, np.float32), device=(2, 0), data=None)  # empty: nothing is read
    d = _C.compare(p, p, stream=-1)
    assert d["n"] == 0 and d["device"] == "cuda:0"
    assert [c["stream"] for c in p.calls] == [-1, -1]
    q = CtypesProducer(np.zeros(0, np.float32), device=(2, 0), data=None)
    with pytest.raises(ValueError, match="^stream 0 is not allowed by the DLPack spec"):
        _C.compare(q, q, stream=0)
    assert q.calls == []


# -- 8. CuPy: the current stream of the array's own device ---------------------------------------


def test_cupy_stream_is_taken_on_the_arrays_device(monkeypatch):
    import types

    seen = []

    class FakeCupyArray:
        def __init__(self, dev):
            self.device = types.SimpleNamespace(id=dev)

        def __dlpack_device__(self):
            return (2, self.device.id)

    def get_current_stream(device_id=-1):
        seen.append(device_id)
        return types.SimpleNamespace(ptr=0 if device_id == 0 else 0x5000 + device_id)

    fake = types.ModuleType("cupy")
    fake.ndarray = FakeCupyArray
    fake.cuda = types.SimpleNamespace(get_current_stream=get_current_stream)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    assert _dlpack.consumer_stream(FakeCupyArray(3), FakeCupyArray(3)) == 0x5003
    assert _dlpack.consumer_stream(FakeCupyArray(0)) == 1  # handle 0 -> the legacy default, 1
    assert seen == [3, 0]


# -- 9. attribute look-up errors are not hidden; non-callable protocol attributes ----------------


def test_dlpack_attribute_lookup_errors_propagate():
    class GetattrRaises:
        def __getattr__(self, name):
            raise RuntimeError(f"lookup of {name} failed")

    with pytest.raises(RuntimeError, match="^lookup of __dlpack__ failed$"):
        _C.compare(GetattrRaises(), np.zeros(1))
    # the public functions name the argument, the producer's error chained
    for call, name in ((lambda o: vgct_ext.compare(np.zeros(1), o), "expected"),
                       (lambda o: vgct_ext.fingerprint(o), "x")):
        with pytest.raises(BufferError, match=rf"^{name}: .*GetattrRaises could not be exported through DLPack "
                                              r"\(RuntimeError: lookup of __dlpack__ failed\)") as ei:
            call(GetattrRaises())
        assert type(ei.value.__cause__) is RuntimeError

    class GetattrMissing:
        def __getattr__(self, name):
            raise AttributeError(name)

    with pytest.raises(TypeError, match=r"^actual: expected an object implementing __dlpack__ .*got GetattrMissing$"):
        vgct_ext.compare(GetattrMissing(), np.zeros(1))


def test_non_callable_protocol_attributes():
    class NoneDlpack:
        __dlpack__ = None

        def __dlpack_device__(self):
            return (1, 0)

    with pytest.raises(TypeError, match=r"^actual: NoneDlpack\.__dlpack__ is NoneType, not a method; expected "
                                        r"an object implementing the DLPack protocol"):
        vgct_ext.compare(NoneDlpack(), np.zeros(1))

    class IntDevice:
        __dlpack_device__ = 5

        def __dlpack__(self, **kw):
            raise AssertionError("must not be exported")

    with pytest.raises(TypeError, match=r"^expected: IntDevice\.__dlpack_device__ is int, not a method"):
        vgct_ext.compare(np.zeros(1), IntDevice())


# -- 10. device tuple errors: TypeError naming the argument; type names, never repr --------------


class _BadRepr(tuple):
    def __repr__(self):
        raise KeyError("repr must not be called")

    __str__ = __repr__


@pytest.mark.parametrize("device,msg", [
    ((2 ** 70, 0), r"^actual: __dlpack_device__\(\) returned a device_type that does not fit a C long"),
    ((1, -2 ** 70), r"^actual: __dlpack_device__\(\) returned a device_id that does not fit a C long"),
    (_BadRepr((1, 0, 0)), r"^actual: __dlpack_device__\(\) returned a tuple of 3 items, expected a "
                          r"\(device_type, device_id\) tuple of two ints"),
    (_BadRepr((1, "0")), r"^actual: __dlpack_device__\(\) returned a tuple of \(int, str\)"),
    ([1, 0], r"^actual: __dlpack_device__\(\) returned list, expected"),
])
def test_device_tuple_errors(device, msg):
    p = CtypesProducer(np.zeros(2, np.float32), device=device)
    with pytest.raises(TypeError, match=msg):
        vgct_ext.compare(p, np.zeros(2))
    assert p.calls == []


def test_device_type_beyond_int32_is_a_buffer_error():
    p = CtypesProducer(np.zeros(2, np.float32), device=(2 ** 40, 0))
    with pytest.raises(BufferError, match=r"^actual: __dlpack_device__\(\) device_type 1099511627776 is not a "
                                          r"DLPack device type$"):
        vgct_ext.compare(p, np.zeros(2))


# -- 11. zero copy requested: copy=False -------------------------------------------------------


def test_zero_copy_is_requested_with_copy_false():
    class Recording(CtypesProducer):
        def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
            self.calls.append({"stream": stream, "max_version": max_version, "copy": copy})
            return self._export()

    arr = np.arange(4, dtype=np.float32)
    p = Recording(arr)
    assert vgct_ext.compare(p, arr.astype(np.float64)).n_unequal == 0
    assert p.calls == [{"stream": None, "max_version": (1, 0), "copy": False}]
    # a producer that copied anyway (DLPACK_FLAG_BITMASK_IS_COPIED) is still read
    q = CtypesProducer(arr, flags=2)
    assert vgct_ext.compare(q, arr.astype(np.float64)).n_unequal == 0
    # numpy honours copy=False: the exported memory is the array's own
    a = np.zeros(3, np.float32)
    cap = a.__dlpack__(max_version=(1, 0), copy=False)
    ptr = _get_pointer_raw(id(cap), b"dltensor_versioned")
    m = DLManagedTensorVersioned.from_address(ptr)
    assert m.dl_tensor.data == a.ctypes.data and not m.flags & 2
    del cap


def test_producer_refusing_to_export_without_copy_is_not_retried():
    p = _RefusingProducer(np.zeros(2, np.float32), refuse={"copy"}, exc=BufferError)
    with pytest.raises(BufferError, match=r"^actual: .*\(BufferError: refused \['copy'\]\)") as ei:
        vgct_ext.compare(p, np.zeros(2))
    assert str(ei.value.__cause__) == "refused ['copy']"
    assert p.attempts == [["copy", "max_version", "stream"]]


# -- 12. dim: any integer (numpy's too), never a bool; quantiles: numpy scalars, no bools -------


@pytest.mark.parametrize("dim", [np.int64(1), np.int32(-1), np.uint8(1), 1])
def test_dim_accepts_numpy_integers(dim):
    rng = np.random.default_rng(12)
    a = rng.standard_normal((3, 4))
    e = rng.standard_normal((3, 4))
    s = vgct_ext.compare(a, e, dim=dim)
    assert s.dim == 1 and len(s.slices) == 4
    d = a - e
    np.testing.assert_allclose(s.slices.mean_shift, d.mean(axis=0), rtol=1e-12, atol=1e-300)
    np.testing.assert_array_equal(s.slices.max_abs_err, np.abs(d).max(axis=0))


@pytest.mark.parametrize("dim,exc,msg", [
    (True, TypeError, "^dim must be None or an int, got bool$"),
    (False, TypeError, "^dim must be None or an int, got bool$"),
    (np.bool_(True), TypeError, r"^dim must be None or an int, got numpy\.bool_?$"),
    (np.float64(1.0), TypeError, r"^dim must be None or an int, got numpy\.float64$"),
    (2 ** 70, ValueError, r"^dim 1180591620717411303424 out of range \(vgct_ext supports at most 32 dims\)$"),
    (-2 ** 70, ValueError, r"^dim -1180591620717411303424 out of range"),
])
def test_dim_rejects_bools_and_out_of_range(dim, exc, msg):
    with pytest.raises(exc, match=msg):
        vgct_ext.compare(np.zeros((2, 3)), np.zeros((2, 3)), dim=dim)


@pytest.mark.parametrize("q", [np.float32(0.25), np.float64(0.25), np.array(0.25), np.array(0.75, np.float32),
                               np.int64(1), 0.5, 0])
def test_single_quantile_in_numpy_forms(q):
    x = np.arange(10.0) ** 1.5
    y = np.ones(10)
    s = vgct_ext.compare(x, y, quantiles=q)
    p = float(q)
    assert s.quantiles == {p: float(np.quantile(np.abs(x - y), p))}


@pytest.mark.parametrize("q,msg", [
    (True, r"^quantiles must be a float in \[0, 1\] or a sequence of them, got bool$"),
    (np.bool_(False), r"^quantiles must be a float in \[0, 1\] or a sequence of them, got bool$"),
    (np.array(True), r"^quantiles must be a float in \[0, 1\] or a sequence of them, got bool$"),
    ([0.5, True], r"^quantiles\[1\] must be a float in \[0, 1\], got bool$"),
    (np.array([True, False]), r"^quantiles\[0\] must be a float in \[0, 1\], got bool$"),
    ("0.5", r"^quantiles must be a float in \[0, 1\] or a sequence of them, got str$"),
])
def test_quantiles_reject_bools(q, msg):
    with pytest.raises(TypeError, match=msg):
        vgct_ext.compare(np.zeros(3), np.zeros(3), quantiles=q)


# -- 13. as_dict is strict JSON; quantiles is read-only ------------------------------------------


def _json_expect(v):
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def test_as_dict_is_strict_json_with_non_finite_values():
    import json

    a = np.array([1e308, 1.0, 2.0, -1e308])
    e = np.array([-1e308, 1.0, 2.5, 1e308])
    with np.errstate(over="ignore", invalid="ignore"):
        d64 = np.abs(a - e)  # float64 oracle: [inf, 0, 0.5, inf]
        q_oracle = {p: quantile_linear(d64, p) for p in (0.25, 0.5)}
    assert q_oracle[0.5] == math.inf  # docs/metrics.md: lerp(0.5, inf, 0.5) is inf (numpy: nan)
    s = vgct_ext.compare(a, e, dim=0, quantiles=(0.25, 0.5))
    assert s.max_abs_err == math.inf == float(d64.max()) and s.max_abs_err_index == (0,)
    for p, want in q_oracle.items():
        got = s.quantiles[p]
        assert (math.isnan(got) and math.isnan(want)) or got == want
    text = json.dumps(s.as_dict(), allow_nan=False)  # raised ValueError before the fix
    back = json.loads(text)
    assert back["max_abs_err"] == "inf" and float(back["max_abs_err"]) == s.max_abs_err
    for k in ("rel_l2", "cosine", "norm_actual", "norm_expected", "norm_diff", "mean_diff",
              "max_rel_err", "worst_mismatch_excess", "max_abs_expected"):
        assert back[k] == _json_expect(getattr(s, k)), k
    assert back["quantiles"] == {str(p): _json_expect(v) for p, v in s.quantiles.items()}
    assert back["slices"]["max_abs_err"] == ["inf", 0.0, 0.5, "inf"]
    assert back["slices"]["count"] == [1, 1, 1, 1]
    # NaN in a slice array (an undefined slice) stays None; -inf is a string
    s2 = vgct_ext.compare(np.array([[np.nan, -1e308]]), np.array([[0.0, 1e308]]), dim=1)
    b2 = json.loads(json.dumps(s2.as_dict(), allow_nan=False))
    assert b2["slices"]["mean_shift"][0] is None and b2["slices"]["count"] == [0, 1]
    assert b2["slices"]["mean_shift"][1] == _json_expect(float(s2.slices.mean_shift[1]))
    assert s2.slices.mean_shift[1] == -math.inf and b2["slices"]["mean_shift"][1] == "-inf"


def test_quantiles_mapping_is_read_only():
    import copy
    import dataclasses
    import pickle
    import types

    x = np.arange(10.0)
    s = vgct_ext.compare(x, np.zeros(10), quantiles=(0.5, 0.99))
    want = {0.5: float(np.quantile(x, 0.5)), 0.99: float(np.quantile(x, 0.99))}
    assert isinstance(s.quantiles, types.MappingProxyType) and s.quantiles == want
    with pytest.raises(TypeError, match="does not support item assignment"):
        s.quantiles[0.5] = 0.0
    d = s.as_dict()
    assert type(d["quantiles"]) is dict and d["quantiles"] == want
    for other in (pickle.loads(pickle.dumps(s)), copy.deepcopy(s), copy.copy(s),
                  dataclasses.replace(s, rtol=0.5)):
        assert isinstance(other.quantiles, types.MappingProxyType) and other.quantiles == want
    assert pickle.loads(pickle.dumps(s)) == s
    assert s.p99 == want[0.99] and s.quantile(0.5) == want[0.5]
    from vgct_ext import gates

    sig = gates.signature(s)
    assert sig[".quantiles.0.5"] == want[0.5].hex()


# -- 14. setup.py: PTX for the plain arch, config header and pyproject in depends, one nvcc -V ---


def _setup_globals(monkeypatch):
    import runpy

    import setuptools

    captured = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kw: captured.update(kw))
    monkeypatch.chdir(_root())
    runpy.run_path(str(_root() / "setup.py"), run_name="vgct_setup_under_test")
    ext = captured["ext_modules"][0]
    cmd_cls = captured["cmdclass"]["build_ext"]
    return ext, cmd_cls, cmd_cls.build_extension.__globals__


def test_setup_gencode_ptx_only_for_the_plain_arch(monkeypatch):
    _, _, g = _setup_globals(monkeypatch)
    gencode = g["_gencode"]
    assert gencode("90") == ["-gencode", "arch=compute_90,code=sm_90", "-gencode", "arch=compute_90,code=compute_90"]
    assert gencode("90a") == ["-gencode", "arch=compute_90a,code=sm_90a",
                              "-gencode", "arch=compute_90,code=compute_90"]
    assert gencode("80;90a") == ["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90a,code=sm_90a",
                                 "-gencode", "arch=compute_90,code=compute_90"]
    assert gencode("90a, 100f 90a")[-1] == "arch=compute_100,code=compute_100"
    with pytest.raises(RuntimeError, match="bad arch 'sm_90'"):
        gencode("sm_90")


@pytest.mark.parametrize("trace", ["", "1"])
def test_setup_depends_and_single_nvcc_version_call(monkeypatch, tmp_path, trace):
    """The config header (a dependency of the module) records the nvcc version, the archs and
    whether this is the VGCT_PHASE_TRACE=1 diagnostic build -- so switching that relinks -- and
    the kernels get -DVGCT_PHASE_TRACE only then."""
    from setuptools import Distribution
    from setuptools.command.build_ext import build_ext

    ext, cmd_cls, g = _setup_globals(monkeypatch)
    assert "pyproject.toml" in ext.depends
    calls = {"version": 0, "compile": []}

    def fake_version(nvcc):
        calls["version"] += 1
        return "12.8.93"

    monkeypatch.setitem(g, "_find_nvcc", lambda: ("/fake/bin/nvcc", "/fake"))
    monkeypatch.setitem(g, "_nvcc_version", fake_version)
    monkeypatch.setitem(g, "_cudart_dir", lambda home: "/fake/lib64")
    monkeypatch.setitem(g, "_cu_sources", lambda: ["cuda/fake.cu"])
    monkeypatch.setattr(cmd_cls, "_compile_cuda",
                        lambda self, nvcc, nvcc_version, *a: calls["compile"].append((nvcc_version, a[-1])) or [])
    seen = []
    monkeypatch.setattr(build_ext, "build_extension", lambda self, e: seen.append(list(e.depends)))
    monkeypatch.delenv("VGCT_CUDA", raising=False)
    monkeypatch.setenv("VGCT_CUDA_ARCHS", "90a")
    monkeypatch.setenv("VGCT_PHASE_TRACE", trace)
    cmd = cmd_cls(Distribution())
    cmd.build_temp = str(tmp_path)
    cmd.build_extension(ext)
    config = tmp_path / "vgct_gen" / "vgct_build_config.h"
    assert calls == {"version": 1, "compile": [("12.8.93", int(trace == "1"))]}
    assert seen and str(config) in seen[0] and "pyproject.toml" in seen[0]
    text = config.read_text()
    assert '"-gencode arch=compute_90a,code=sm_90a -gencode arch=compute_90,code=compute_90"' in text
    assert '#define VGCT_NVCC_VERSION "12.8.93"' in text
    assert f"#define VGCT_PHASE_TRACE_BUILD {int(trace == '1')}" in text


# -- minor: dtype names, overrides from byte views only, deleter errors, lazy dunders ------------


def test_unknown_dtype_name_lists_every_supported_dtype():
    x = np.zeros(3)
    with pytest.raises(ValueError) as ei:
        _C.compare(x, x, dtype_actual="float7")
    assert str(ei.value) == ("dtype_actual: unknown dtype name 'float7' (expected one of bool, int8, int16, "
                             "int32, int64, uint8, float16, bfloat16, float32, float64, float8_e4m3fn, "
                             "float8_e5m2, uint16, uint32, uint64)")


def test_dtype_override_only_from_a_byte_view():
    with pytest.raises(ValueError, match=r"^actual: dtype override int32 applies only to an unsigned integer "
                                         r"view of the same width .*, but the tensor is float32$"):
        _C.compare(np.ones(3, np.float32), np.ones(3, np.int32), dtype_actual="int32")
    with pytest.raises(ValueError, match=r"^x: dtype override float16 applies only to an unsigned integer "
                                         r"view of the same width .*, but the tensor is int16$"):
        _C.fingerprint(np.ones(3, np.int16), None, "float16")
    # an override names a floating dtype: a uint32 view read as int32 would be silently wrong
    with pytest.raises(ValueError, match=r"^actual: dtype override int32 is an integer dtype"):
        _C.compare(np.ones(3, np.uint32), np.ones(3, np.int32), dtype_actual="int32")
    with pytest.raises(ValueError, match=r"cannot reinterpret uint16 \(itemsize 2\)"):
        _C.compare(np.ones(3, np.uint16), np.ones(3), dtype_actual="float32")
    codes = np.array([0x38, 0xC0, 0x7E, 0x01], np.uint8)  # e4m3fn: 1.0, -2.0, 448.0, 2^-9
    want = np.array([_fp8_decode(int(c), "e4m3fn") for c in codes])
    for src in (codes, codes.view(np.int8)):
        d = _C.compare(src, want, dtype_actual="float8_e4m3fn")
        assert d["dtype_actual"] == "float8_e4m3fn" and d["n_unequal"] == 0 and d["max_abs_expected"] == 448.0


def test_deleter_exception_goes_to_unraisablehook(monkeypatch):
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    # a deleter that leaves MemoryError set (PyErr_NoMemory ignores the tensor argument)
    sets_error = DELETER(C.cast(_api.PyErr_NoMemory, C.c_void_p).value)
    arr = np.arange(3, dtype=np.float32)
    p = CtypesProducer(arr)
    p._deleter = sets_error
    s = vgct_ext.compare(p, arr.astype(np.float64))  # succeeds: the deleter's error is not raised
    assert s.n_unequal == 0
    assert [type(u.exc_value) for u in unraisable] == [MemoryError]
    # on an error path the caller's exception is the one raised; the deleter's is reported
    q = CtypesProducer(arr)
    q._deleter = sets_error
    with pytest.raises(ValueError, match=r"^shape mismatch: actual has shape \(3,\), expected has shape \(2,\)"):
        vgct_ext.compare(q, np.zeros(2))
    assert [type(u.exc_value) for u in unraisable] == [MemoryError, MemoryError]


def test_package_getattr_answers_dunders_without_loading_the_method_layer():
    import subprocess

    code = ("import sys, vgct_ext\n"
            "for n in ('__wrapped__', '__path_hooks__', '__test__'):\n"
            "    try:\n"
            "        getattr(vgct_ext, n)\n"
            "    except AttributeError as e:\n"
            "        assert str(e) == f\"module 'vgct_ext' has no attribute {n!r}\", e\n"
            "    else:\n"
            "        raise SystemExit('no AttributeError for ' + n)\n"
            "loaded = [m for m in sys.modules if m.startswith('vgct_ext.method')\n"
            "          or m in ('vgct_ext.gates', 'vgct_ext.probes', 'vgct_ext.experiment', 'vgct_ext.skips')]\n"
            "assert not loaded, loaded\n"
            "assert callable(vgct_ext.assert_t1)  # a method-layer name still loads lazily\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_producer_reraising_one_instance_makes_no_context_cycle():
    err = TypeError("always this one")

    class Same:
        def __dlpack_device__(self):
            return (1, 0)

        def __dlpack__(self, **kw):
            raise err

    with pytest.raises(TypeError, match=r"^actual: .*\(TypeError: always this one\)") as ei:
        vgct_ext.compare(Same(), np.zeros(1))
    assert ei.value.__cause__ is err and err.__context__ is None


# -- issue #12: Ctrl-C during a long compare, inputs written during a compare, shape counts --------

_INTERRUPT_CHILD = r"""
import json, os, signal, sys, threading, time
# Python raises KeyboardInterrupt on SIGINT only when it starts with SIGINT's default disposition;
# a shell's background job (`cmd &` without job control, e.g. a CI step sent to the background)
# starts with SIGINT ignored, and then the signal below would be lost, not the poll tested
signal.signal(signal.SIGINT, signal.default_int_handler)
import numpy as np
import vgct_ext
n, quantiles, dim, when = int(sys.argv[1]), sys.argv[2] == "q", sys.argv[3], sys.argv[4]
shape = (n,) if dim == "-" else (4, n // 4)
a = np.broadcast_to(np.float32(1.5), shape)  # stride 0: long work on no memory
e = np.broadcast_to(np.float32(1.0), shape)
kw = dict(quantiles=(0.5,) if quantiles else (), dim=None if dim == "-" else int(dim))
if when == "select":  # fire once the reduction is over: inside the quantile passes
    # 1024 distinct differences, each n/1024 times: the selection needs full passes over the data.
    # Grow n until the quantile work alone lasts >= 1 s, then fire in its middle (robust to load).
    row = np.random.default_rng(0).standard_normal(1024).astype(np.float32)
    while True:
        a = np.broadcast_to(row, (n // 1024, 1024))
        e = np.broadcast_to(np.zeros(1024, np.float32), (n // 1024, 1024))
        t = time.perf_counter(); vgct_ext.compare(a, e, quantiles=()); t_reduce = time.perf_counter() - t
        t = time.perf_counter(); vgct_ext.compare(a, e, **kw); t_all = time.perf_counter() - t
        if t_all - t_reduce >= 1.0 or n >= 1 << 36:
            break
        n *= 4
    delay = (t_reduce + t_all) / 2
else:
    delay = float(when)
sent = []
def fire():
    sent.append(time.perf_counter())
    os.kill(os.getpid(), signal.SIGINT)
threading.Timer(delay, fire).start()
try:
    vgct_ext.compare(a, e, **kw)
    print(json.dumps({"finished": True}))
except KeyboardInterrupt:
    late = time.perf_counter() - sent[0]
    # the process compares again, and correctly (no state left behind)
    x = np.arange(1000, dtype=np.float32)
    s = vgct_ext.compare(x, np.zeros_like(x), quantiles=(0.5, 0.99), dim=0)
    ok = s.quantiles == {0.5: 499.5, 0.99: float(np.quantile(np.arange(1000.0), 0.99))} and s.max_abs_err == 999.0
    print(json.dumps({"delay": late, "again_ok": bool(ok)}))
"""


@pytest.mark.parametrize("log2n,quantiles,dim,when", [
    (34, "-", "-", "0.4"),       # the reduction (2^34 pairs: ~10 s without the poll)
    (34, "-", "0", "0.4"),       # the reduction with slices (units are slice blocks)
    (27, "q", "-", "select"),    # the quantile passes (reduction ~0.1 s, selection ~1 s)
])
def test_ctrl_c_stops_a_long_compare(log2n, quantiles, dim, when):
    """SIGINT during a compare raises KeyboardInterrupt within 0.5 s (measured here: 2-15 ms;
    before issue #12 the compare ran to its end, 60 s and more for 2^36 pairs)."""
    import json
    import subprocess

    r = subprocess.run([sys.executable, "-c", _INTERRUPT_CHILD, str(1 << log2n), quantiles, dim, when],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert "delay" in out, f"the compare was not interrupted: {out}"
    assert out["delay"] < 0.5, out
    assert out["again_ok"], out


def test_input_written_during_compare_is_reported_not_an_internal_error():
    """docs/architecture.md: an input written while compare() reads it gives either a result or
    vgct_ext._C.InputChangedError (a RuntimeError, "input changed during compare: ..."), never an
    internal error (before issue #12: ValueError "vgct_cpu_select: rank ... out of range")."""
    import threading

    assert issubclass(_C.InputChangedError, RuntimeError)
    n = 1 << 22
    a = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    e = np.zeros(n, np.float32)
    stop = threading.Event()

    def writer():  # NaNs come and go: the count of finite pairs changes under the engine
        while not stop.is_set():
            a[::7] = np.nan   # numpy releases the GIL for the copy
            a[::7] = 1.0

    th = threading.Thread(target=writer)
    th.start()
    outcomes = []
    try:
        for _ in range(12):
            try:
                s = vgct_ext.compare(a, e, quantiles=(0.001, 0.5, 0.999))
                outcomes.append("ok" if s.n_finite <= n else "bad")
            except _C.InputChangedError as ex:
                assert str(ex).startswith("input changed during compare: "), ex
                outcomes.append("changed")
    finally:
        stop.set()
        th.join()
    assert "bad" not in outcomes
    assert "changed" in outcomes, outcomes  # the change is seen (n_finite differs between passes)
    s = vgct_ext.compare(a, e, quantiles=(0.5,))  # and the next compare is a normal one
    assert s.n_finite == n and s.quantiles[0.5] == float(np.quantile(np.abs(a.astype(np.float64)), 0.5))


def test_finalize_raw_refuses_a_shape_whose_count_overflows_int64():
    r = _C.reduce_raw(np.zeros(4), np.zeros(4))
    # before issue #12: the product wrapped and the message said "the shape 0 elements"
    with pytest.raises(ValueError, match=r"^shape \(4611686018427387904, 4\) has more elements than int64 "
                                         r"can count$"):
        _C.finalize_raw(r["acc"], None, [2 ** 62, 4], "float64", "float64", 1, 0, 0.0, 0.0, (), None, None)
    with pytest.raises(ValueError, match=r"the record holds 4 pairs, the shape 0 elements"):
        _C.finalize_raw(r["acc"], None, [0, 2 ** 62, 2 ** 62], "float64", "float64", 1, 0, 0.0, 0.0, (),
                        None, None)  # an empty shape: no product is formed
    d = _C.finalize_raw(r["acc"], None, (4,), "float64", "float64", 1, 0, 0.0, 0.0, (), None, None)
    assert d["n"] == 4 and d["shape"] == (4,)


def test_a_slice_count_that_cannot_be_allocated_is_a_memory_error():
    # 2^40 slices of a stride-0 view: 56 TiB of slice statistics
    a = np.broadcast_to(np.float32(1.0), (2, 2 ** 40))
    with pytest.raises(MemoryError, match=r"^dim=1: cannot allocate the statistics of 1099511627776 slices "
                                          r"\(61572651155456 bytes\)$"):
        vgct_ext.compare(a, a, dim=1)
    with pytest.raises(MemoryError, match=r"1099511627776 slices"):
        _C.reduce_raw(a, a, dim=-1)
    assert vgct_ext.compare(a[:, :3], a[:, :3], dim=1).slices.count.tolist() == [2, 2, 2]


def test_ml_dtypes_numpy_arrays_are_read_through_a_same_width_view():
    """NumPy arrays of ml_dtypes' bfloat16 / float8_e4m3fn / float8_e5m2 (which NumPy's DLPack
    export refuses) are read through a uint16/uint8 view with the dtype passed to _C; values
    against a float64 oracle decoded independently (oracle.py)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from oracle import decode_bf16, decode_e4m3, decode_e5m2

    rng = np.random.default_rng(3)
    x = rng.standard_normal((33, 17)) * 4
    for name, bits_t, dec in (("bfloat16", np.uint16, decode_bf16), ("float8_e4m3fn", np.uint8, decode_e4m3),
                              ("float8_e5m2", np.uint8, decode_e5m2)):
        dt = getattr(ml_dtypes, name)
        a = x.astype(dt)
        e = (x * 1.01).astype(dt)[:, ::-1]  # a reversed view too
        a64, e64 = dec(a.view(bits_t)), dec(np.ascontiguousarray(e).view(bits_t))
        s = vgct_ext.compare(a, e, quantiles=(0.5, 1.0))
        assert s.dtype_actual == name and s.dtype_expected == name
        d = np.abs(a64 - e64)
        assert s.max_abs_err == d.max() and s.max_abs_err_index == np.unravel_index(np.argmax(d), d.shape)
        assert s.quantiles == {0.5: float(np.quantile(d, 0.5)), 1.0: float(d.max())}
        assert s.n_unequal == int(np.sum(a64 != e64))
        assert math.isclose(s.norm_expected, float(np.sqrt(np.sum(e64 * e64))), rel_tol=1e-12)
        # the same values as float64 arrays: the same statistics
        t = vgct_ext.compare(a64, e64, quantiles=(0.5, 1.0))
        assert (t.max_abs_err, t.n_unequal, dict(t.quantiles)) == (s.max_abs_err, s.n_unequal, dict(s.quantiles))
        assert vgct_ext.fingerprint(a) != vgct_ext.fingerprint(a.view(bits_t))  # the dtype is hashed
