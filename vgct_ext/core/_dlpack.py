"""DLPack hand-off from Python objects to :mod:`vgct_ext._C` (private).

The C bridge (``csrc/bridge.c``) does the import itself; this shim only does
what needs the producer's own Python API, without importing any framework
(``import vgct_ext`` never imports torch; a torch tensor is an instance of
``sys.modules["torch"].Tensor`` -- subclasses defined anywhere included -- and
can only exist once torch is imported):

* every torch tensor is passed as ``x.detach()``: a new tensor object sharing
  the storage (no copy).  It is the object torch's export holds, so the memory
  read stays alive for the whole call even when another thread replaces the
  caller's tensor's storage (``x.set_(...)``, ``x.data = ...``); it also
  satisfies torch's ``__dlpack__``, which refuses tensors that require grad;
* a torch tensor with the lazy negation bit (``x.is_neg()``, e.g.
  ``c.conj().imag`` or ``torch._neg_view(x)``) is passed as
  ``x.resolve_neg()``: torch's DLPack export carries the storage without the
  sign, so the values would silently be negated.  This is the one case where
  a copy is made (``resolve_neg`` materializes the negated values; every
  other tensor is read in place).  The conjugate bit needs nothing: it
  exists only for complex tensors, which vgct_ext does not read;
* a torch float8 tensor, when this torch cannot export float8 through
  DLPack, is passed as ``x.view(torch.uint8)`` (same bytes, no copy) with the
  dtype name as an override for ``_C`` (torch >= 2.7 exports float8 codes
  ``kDLFloat8_e4m3fn`` / ``kDLFloat8_e5m2`` itself);
* a NumPy array's data owner is pinned for the call (:func:`pin`): NumPy
  refuses to resize an array that has a weak reference, even with
  ``refcheck=False``, so ``resize`` from another thread cannot free the memory
  being read;
* a NumPy masked array is refused (TypeError): its export would carry the data
  without the mask;
* the consumer stream for CUDA inputs (docs/architecture.md; the Python array
  API / DLPack ``__dlpack__(stream=...)`` convention): torch's current
  stream on the tensor's device for torch tensors, CuPy's current stream on
  the array's device for CuPy arrays, else 1 (the legacy default stream; 0 is
  disallowed by the spec).  ``None`` for CPU inputs.  torch's stream and
  device are read through torch's C functions (``torch._C._cuda_getDevice``,
  ``torch._C._cuda_getCurrentRawStream``, looked up once per process; the
  public ``torch.cuda`` functions when a torch lacks them), never cached
  themselves: the current stream can change between calls.  A plain torch
  tensor is handed to ``_C`` as it is when torch's Tensor type has the DLPack
  C exchange API (torch >= 2.10): ``_C`` exports it by a C call and takes
  that path only when the tensor's current stream is the consumer stream
  (csrc/bridge.c, ``vgct_bridge_import_exchange``).  With an older torch, a
  plain torch tensor whose current stream IS that consumer stream is exported
  with ``__dlpack__(stream=-1)`` (:class:`_SameStreamExport`: nothing to
  synchronise, so torch is not asked to);
* a refusal -- by the producer (``__dlpack__`` raising) or by ``_C`` -- is
  re-raised by :func:`explain` naming the argument (``actual`` /
  ``expected``), what is wrong and what to pass instead, the original chained.

What the shim cannot guard: a producer that frees or reallocates the memory
of a tensor it exported (torch ``x.resize_()`` to a larger size or
``x.untyped_storage().resize_()``, NumPy ``x.__setstate__``, writes through
ctypes).  The rule for every input: do not free, resize or reallocate an input
while a compare reads it.  Writing into an input during a compare is not a
crash: the statistics then describe some mixture of old and new values, or
the quantile pass, seeing counts that changed, says that an input changed.
"""

from __future__ import annotations

import contextlib
import os
import sys
import weakref
from typing import Any, Callable, ContextManager, Optional, Sequence, Tuple

import numpy as np

_FP8 = ("float8_e4m3fn", "float8_e5m2")
_KDLCUDA = 2  # DLPack's kDLCUDA (torch's and CuPy's CUDA tensors)
_CUDA_DEVICE_TYPES = (_KDLCUDA, 13)  # kDLCUDA, kDLCUDAManaged
_torch_fp8_export: Optional[bool] = None  # probed once per process
_torch_fp8: Optional[Tuple[Any, Tuple[Any, ...]]] = None  # (torch, its float8 dtypes)
_torch_tensor: Optional[Tuple[Any, type]] = None  # (torch, torch.Tensor): _torch_of's cache
_ndarray = np.ndarray
_type_dict = type.__dict__["__dict__"].__get__  # a type's own attribute dict, no metaclass in between
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# torch's C-level CUDA look-ups, found once per torch module: (torch, get_device, raw_stream);
# the functions are cached, never what they return (the current stream/device can change)
_torch_cuda_fns: Optional[Tuple[Any, Any, Any]] = None


def _torch_of(x: Any) -> Any:
    """The torch module when ``x`` is a torch.Tensor (any subclass), else None."""
    c = _torch_tensor
    if c is not None and c[0] is sys.modules.get("torch"):  # (the module found before)
        return c[0] if isinstance(x, c[1]) else None
    return _torch_of_lookup(x)


def _torch_of_lookup(x: Any) -> Any:
    """:func:`_torch_of` without its cache: torch and its Tensor class looked up in
    ``sys.modules`` (torch may be imported after vgct_ext, or replaced), then cached."""
    global _torch_tensor
    torch = sys.modules.get("torch")
    cls = getattr(torch, "Tensor", None) if torch is not None else None
    if not isinstance(cls, type):
        return None
    _torch_tensor = (torch, cls)
    return torch if isinstance(x, cls) else None


def _cupy_of(x: Any) -> Any:
    """The cupy module when ``x`` is a cupy.ndarray (any subclass), else None."""
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(x, getattr(cupy, "ndarray", ())):
        return cupy
    return None


def _torch_exports_fp8(torch: Any) -> bool:
    """Whether this torch's ``__dlpack__`` accepts float8 tensors."""
    global _torch_fp8_export
    if _torch_fp8_export is None:
        try:
            torch.zeros(1, dtype=torch.float8_e4m3fn).__dlpack__()  # unconsumed: freed by its capsule
            _torch_fp8_export = True
        except Exception:  # noqa: BLE001 - any refusal means "use the uint8 view"
            _torch_fp8_export = False
    return _torch_fp8_export


def _is_masked(x: Any) -> bool:
    """Whether ``x`` is a NumPy masked array (``numpy.ma`` is imported lazily by NumPy: while
    it is not, no masked array exists)."""
    ma = sys.modules.get("numpy.ma")
    return ma is not None and isinstance(x, ma.MaskedArray)


def prepare(x: Any, force_fp8_view: bool = False, argname: str = "x") -> Tuple[Any, Optional[str]]:
    """Return ``(object to export, dtype override name or None)`` for ``x``.

    torch tensors are exported as ``x.detach()`` (an alias of the same storage: the
    caller's tensor can be given another storage meanwhile without freeing what is read),
    with ``resolve_neg`` and the float8 view where needed; a NumPy masked array is refused
    (TypeError naming ``argname``); anything else is returned unchanged and ``_C`` reports
    what is wrong with it.  ``force_fp8_view`` takes the uint8-view path even when torch
    could export float8 (tests use it to exercise the fallback).

    ``x.resolve_neg()`` is the only step that copies, and only for a tensor
    whose negation bit is set (``x.is_neg()``): torch exports such a tensor
    without the sign.
    """
    if type(x) is _ndarray and x.dtype.isbuiltin == 1:
        return x, None  # a NumPy array of one of NumPy's own native dtypes: nothing to do
    torch = _torch_of(x)
    if torch is None:  # NumPy arrays of other dtypes (ml_dtypes ...) and other producers
        if _is_masked(x):
            raise TypeError(
                f"{argname}: a NumPy masked array (numpy.ma.MaskedArray); vgct_ext reads the "
                f"data through DLPack, which carries no mask, so the masked entries would be "
                f"compared as well: pass {argname}.filled(value) (masked entries set to a value) "
                f"or {argname}.data (the raw data, mask ignored) explicitly, or "
                f"{argname}.compressed() for both sides when they share one mask")
        return _ml_dtypes_view(x)
    x = x.detach()  # the alias torch's export holds (never the caller's tensor object)
    if x.is_neg():
        x = x.resolve_neg()  # a copy with the sign applied (torch exports the storage unsigned)
    dt = x.dtype
    if dt.itemsize == 1 and dt.is_floating_point and dt in _torch_fp8_dtypes(torch):
        if force_fp8_view or not _torch_exports_fp8(torch):
            return x.view(torch.uint8), str(dt).rpartition(".")[2]
    return x, None


_ML_FLOATS = ("bfloat16", "float8_e4m3fn", "float8_e5m2")


def _ml_dtypes_view(x: Any) -> Tuple[Any, Optional[str]]:
    """A NumPy array of an ml_dtypes float (bfloat16, float8_e4m3fn, float8_e5m2: NumPy's
    ``__dlpack__`` refuses them) as ``(x.view(uint16/uint8), dtype name)``: the same bytes, no
    copy; ``_C`` reads the view as the named dtype (a same-width override, checked in C).
    Anything else is returned unchanged."""
    np = sys.modules.get("numpy")
    if np is None or not isinstance(x, np.ndarray):  # nothing else is looked at (no __getattr__)
        return x, None
    dt = x.dtype
    if getattr(dt.type, "__module__", None) == "ml_dtypes" and dt.name in _ML_FLOATS:
        return x.view(f"u{dt.itemsize}"), dt.name
    return x, None


def _torch_fp8_dtypes(torch: Any) -> Tuple[Any, ...]:
    """torch's float8 dtypes named in ``_FP8`` (found once per torch module)."""
    global _torch_fp8
    c = _torch_fp8
    if c is None or c[0] is not torch:
        c = _torch_fp8 = (torch, tuple(getattr(torch, n) for n in _FP8 if hasattr(torch, n)))
    return c[1]


def pin(*xs: Any) -> Tuple[Any, ...]:
    """Weak references that keep the NumPy arrays among ``xs`` from being resized.

    ``numpy.ndarray.resize`` refuses an array with a weak reference, even with
    ``refcheck=False`` (NumPy's ``PyArray_Resize``: "cannot resize an array that references
    or is referenced by another object in this way"), so an array -- and every ndarray
    along its ``.base`` chain, the data's owner included -- cannot have its memory freed
    by a resize while the returned tuple is alive.  Hold it for the whole call.  Other
    objects give nothing (a torch tensor is exported as an alias, see :func:`prepare`).
    """
    refs = []
    for x in xs:
        while isinstance(x, _ndarray):
            refs.append(weakref.ref(x))
            x = x.base
    return tuple(refs)


def _device(x: Any) -> Optional[Tuple[int, int]]:
    """``x.__dlpack_device__()`` as two ints, or None when it cannot be read (``_C`` then
    raises the precise error).  Without the call for the two common cases: a NumPy
    ``ndarray`` (host memory) and a plain ``torch.Tensor`` on the CPU or a CUDA device
    (torch's ``__dlpack_device__`` is Python code; its subclasses may override it, so they
    go through it)."""
    tp = type(x)
    if tp is _ndarray:
        return (1, 0)
    torch = sys.modules.get("torch")
    if torch is not None and tp is getattr(torch, "Tensor", None):
        if x.is_cuda:
            return (2, x.get_device())
        if x.is_cpu:
            return (1, 0)  # pinned memory (kDLCUDAHost) too: read as host memory, no stream
    try:  # the look-up too: a failing __getattr__ is reported by _C, not from here
        t, i = x.__dlpack_device__()
        return int(t), int(i)
    except Exception:  # noqa: BLE001 - _C raises the precise error later
        return None


def _torch_cuda(torch: Any) -> Tuple[Any, Any]:
    """``(get_device, raw_stream)`` for ``torch``: the current CUDA device as an int, and
    ``raw_stream(index)`` the current stream's ``cudaStream_t`` on device ``index`` as an
    int; torch's C functions when this torch has them (found once per torch module), else
    None each (the caller uses the public ``torch.cuda`` functions)."""
    global _torch_cuda_fns
    c = _torch_cuda_fns
    if c is None or c[0] is not torch:
        tc = getattr(torch, "_C", None)
        c = _torch_cuda_fns = (torch, getattr(tc, "_cuda_getDevice", None),
                               getattr(tc, "_cuda_getCurrentRawStream", None))
    return c[1], c[2]


def _torch_current_device(torch: Any) -> int:
    get_device = _torch_cuda(torch)[0]
    return int(get_device()) if get_device is not None else int(torch.cuda.current_device())


def _torch_stream(torch: Any, x: Any) -> int:
    """torch's current stream on ``x``'s CUDA device, as an int ``cudaStream_t``."""
    raw = _torch_cuda(torch)[1]
    if raw is not None:
        return int(raw(x.get_device()))
    return int(torch.cuda.current_stream(x.device).cuda_stream)


def call_on_stream(xs: Tuple[Any, ...], fn: Callable[..., Any]) -> Any:
    """``fn(stream, *xs)`` for a ``_C`` entry point reading ``xs``: under :func:`device_guard`
    with :func:`consumer_stream` when an input is on a CUDA device, else ``fn(None, *xs)`` at
    once (no device to make current, no stream: the CPU path skips both look-ups).  When
    the first CUDA input is a torch tensor on the current device the guard is skipped: it
    would make current the device that already is (the common case; the guard's enter and
    exit cost more than the engine's work on small tensors).  A plain torch CUDA tensor whose
    current stream IS the consumer stream is passed as a :class:`_SameStreamExport` (see
    there: no cross-stream synchronisation to ask torch for).  An input that cannot say
    where it lives is left to ``_C``, which names what is wrong."""
    for x in xs:
        if type(x) is not _ndarray:
            break
    else:
        return fn(None, *xs)  # NumPy arrays: host memory
    devs = [_device(x) for x in xs]
    for x, d in zip(xs, devs):
        if d is not None and d[0] in _CUDA_DEVICE_TYPES:
            torch = _torch_of(x)
            if torch is not None and _torch_current_device(torch) == d[1]:
                s = _stream_of(xs, devs)
                return fn(s, *_same_stream_exports(xs, devs, s))
            with device_guard(*xs):
                s = _stream_of(xs, devs)
                return fn(s, *_same_stream_exports(xs, devs, s))
    return fn(None, *xs)


class _SameStreamExport:
    """A plain torch CUDA tensor whose current stream is the stream ``_C`` computes on,
    exported with ``__dlpack__(stream=-1)``.

    The DLPack / array-API ``__dlpack__(stream=...)`` convention: the consumer names the
    stream it will read on, and the producer makes the data ready on it -- for torch, an
    event recorded on its current stream and waited for on the consumer's (a new
    ``torch.cuda.ExternalStream`` and ``current_stream`` object, ~10-30 us of Python each
    call).  When the consumer's stream IS torch's current stream on that device, the work
    that wrote the tensor is already ordered before the read, so there is nothing to
    synchronise, and the spec's ``stream=-1`` ("the producer must not perform any
    synchronization"; torch: "If -1 is passed then no synchronization is performed") says
    exactly that.  Everything else -- the checks of torch's ``__dlpack__``, the capsule,
    its ``max_version`` / ``copy`` keywords -- is torch's own.  ``__dlpack_device__`` is the
    tensor's.  Made only by :func:`_same_stream_exports`."""

    __slots__ = ("x", "dev")

    def __init__(self, x: Any, dev: Tuple[int, int]) -> None:
        self.x, self.dev = x, dev

    def __dlpack_device__(self) -> Tuple[int, int]:
        return self.dev

    def __dlpack__(self, *, stream: Any = None, **kw: Any) -> Any:
        # max_version, copy, dl_device: passed on as given (None: torch's own default)
        return self.x.__dlpack__(stream=-1, **{k: v for k, v in kw.items() if v is not None})


def _same_stream_exports(xs: Tuple[Any, ...], devs: Any, stream: Optional[int]) -> Tuple[Any, ...]:
    """``xs`` with each plain torch CUDA tensor whose current stream on its device is
    ``stream`` (0 counted as 1, the legacy default) wrapped in :class:`_SameStreamExport`;
    every other input unchanged (CuPy arrays, torch subclasses, tensors on another stream:
    their producers synchronise as the spec says; a torch whose Tensor type has the DLPack C
    exchange API: ``_C`` takes that path, see :func:`_has_exchange_api`)."""
    if stream is None:
        return xs
    out = []
    for x, d in zip(xs, devs):
        torch = sys.modules.get("torch") if d is not None and d[0] == _KDLCUDA else None
        if torch is not None and type(x) is getattr(torch, "Tensor", None) and not _has_exchange_api(type(x)):
            try:
                h = _torch_stream(torch, x)
            except Exception:  # noqa: BLE001 - leave the export to torch's own path
                h = None
            if h is not None and (h if h != 0 else 1) == stream:
                x = _SameStreamExport(x, d)
        out.append(x)
    return tuple(out)


def producer_streams(a: Any, e: Any) -> bool:
    """Whether ``compare`` may pass ``_C.PRODUCER_STREAM`` for ``(a, e)`` (prepared inputs):
    both of one type that itself carries the DLPack C exchange API (torch.Tensor from torch
    2.10).  ``_C`` then takes both through it and computes on the producer's current work
    stream on the first CUDA input's device -- for torch the stream :func:`call_on_stream`
    would have looked up (torch's current stream there), without this module's device and
    stream look-ups (~4 us of a small CUDA call); for another producer with the table, the
    stream the DLPack 1.3 exchange API says a consumer should launch on (where
    :func:`consumer_stream` would name 1 and have that producer synchronise with it).  ``_C``
    returns NotImplemented, having done nothing, where it cannot take an input that way
    (managed memory, inputs on two devices with other streams), and the caller goes through
    :func:`call_on_stream`."""
    tp = type(a)
    return tp is type(e) and tp is not _ndarray and _has_exchange_api(tp)


def _has_exchange_api(tp: type) -> bool:
    """Whether ``tp`` itself (not a base class) carries the DLPack C exchange API
    (``__dlpack_c_exchange_api__``, DLPack 1.3; torch from 2.10): ``_C`` then exports its
    tensors by a C call and checks itself that the producer's current stream is the one it
    computes on (``vgct_bridge_import_exchange`` in csrc/bridge.c), so no
    :class:`_SameStreamExport` is needed.  The type's own dict is read as ``_C`` reads it
    (``tp_dict``), through ``type``'s descriptor: a metaclass that overrides ``__dict__`` (or
    makes it raise) cannot change the answer or fail the call."""
    return "__dlpack_c_exchange_api__" in _type_dict(tp)


def consumer_stream(*xs: Any) -> Optional[int]:
    """The stream ``_C`` passes to ``__dlpack__`` and computes on.

    ``None`` when the inputs are not on a CUDA device; else the current
    stream, on its own device, of the first torch tensor or CuPy array among ``xs`` (its integer
    ``cudaStream_t``; the default stream, handle 0, becomes 1, the spec's
    legacy default), else 1.
    """
    return _stream_of(xs, [_device(x) for x in xs])


def _stream_of(xs: Tuple[Any, ...], devs: Any) -> Optional[int]:
    """:func:`consumer_stream` given each input's ``__dlpack_device__`` (``devs``)."""
    if not any(d is not None and d[0] in _CUDA_DEVICE_TYPES for d in devs):
        return None
    for x, d in zip(xs, devs):
        if d is None or d[0] not in _CUDA_DEVICE_TYPES:
            continue
        try:
            torch = _torch_of(x)
            if torch is not None:
                h = _torch_stream(torch, x)
                return h if h != 0 else 1
            cupy = _cupy_of(x)
            if cupy is not None:
                h = int(cupy.cuda.get_current_stream(x.device.id).ptr)
                return h if h != 0 else 1
        except Exception:  # noqa: BLE001 - fall back to the legacy default stream
            pass
    return 1


def device_guard(*xs: Any) -> ContextManager[Any]:
    """A context that makes the inputs' CUDA device current for the export and the call.

    torch refuses ``__dlpack__(stream=...)`` for a tensor on another device than the current
    one ("Can't export tensors on a different CUDA device index"), so a tensor on ``cuda:1``
    while ``cuda:0`` is current is exported under ``torch.cuda.device(1)`` (CuPy:
    ``cupy.cuda.Device(1)``); the previous device is restored on exit.  A null context for
    CPU inputs and other producers (the C engine switches and restores the device itself).
    """
    for x in xs:
        d = _device(x)
        if d is None or d[0] not in _CUDA_DEVICE_TYPES:
            continue
        torch = _torch_of(x)
        if torch is not None:
            return torch.cuda.device(x.device)
        cupy = _cupy_of(x)
        if cupy is not None:
            return cupy.cuda.Device(x.device.id)
    return contextlib.nullcontext()


# -- refusals named ----------------------------------------------------------------------------

# what vgct_ext reads, in words (the exact list: vgct_ext.compare's docstring; _C names it in
# its own dtype refusals)
_REAL_DTYPES = "a real dtype: bool, an integer or a floating-point type of at most 64 bits"


def _typename(x: Any) -> str:
    t = type(x)
    mod = t.__module__
    return t.__qualname__ if mod in ("builtins", None) else f"{mod}.{t.__qualname__}"


def _complex_hint(name: str, torch: bool) -> str:
    if torch:
        return (f"torch.view_as_real({name}) (a real view with a last axis of 2: real and "
                f"imaginary parts, no copy) on both sides, or {name}.real / {name}.imag separately")
    return (f"np.real({name}) and np.imag({name}) separately, or {name}.view({name}.real.dtype) "
            f"(real and imaginary parts interleaved along the last axis, no copy; needs a "
            f"contiguous last axis) on both sides")


def known_refusal(x: Any, name: str) -> Optional[BaseException]:
    """The error for an input that vgct_ext cannot read, recognized without exporting it
    (torch meta / nested / sparse / quantized / complex tensors; NumPy-style arrays of
    complex, object, string, structured, datetime, long double or non-native byte order
    dtypes), or None.  The message names ``name``, what is wrong and what to
    pass instead."""
    torch = _torch_of(x)
    if torch is not None:
        try:
            if x.is_meta:
                return BufferError(
                    f"{name}: a torch meta tensor (device 'meta', shape {tuple(x.shape)}) has no "
                    f"data to read; expected a tensor on the CPU or a CUDA device: run the model "
                    f"on a real device (or materialize it, e.g. with to_empty() and a load)")
            if x.is_nested:
                return TypeError(
                    f"{name}: a nested tensor (torch.nested) has no single strided layout; "
                    f"expected a strided tensor: compare {name}.unbind() component by component, "
                    f"or {name}.to_padded_tensor(0.0) against an equally padded reference")
            if x.layout != torch.strided:
                return TypeError(
                    f"{name}: a tensor of layout {x.layout}; expected torch.strided: pass "
                    f"{name}.to_dense()")
            if x.is_quantized:
                return TypeError(
                    f"{name}: a quantized tensor ({x.dtype}); expected a real dtype: pass "
                    f"{name}.dequantize() (the real values) or {name}.int_repr() (the integer codes)")
            if x.is_complex():
                return TypeError(f"{name}: complex dtype {x.dtype}; vgct_ext compares real "
                                 f"tensors: pass {_complex_hint(name, True)}")
        except Exception:  # noqa: BLE001 - an exotic subclass: leave the error as it was
            return None
        return None
    try:
        dt = getattr(x, "dtype", None)
    except Exception:  # noqa: BLE001 - a failing attribute says nothing about the dtype
        return None
    if not isinstance(dt, np.dtype):  # NumPy, CuPy and JAX arrays carry NumPy dtypes
        return None
    what = None
    if dt.kind == "c":
        return TypeError(f"{name}: complex dtype {dt}; vgct_ext compares real arrays: pass "
                         f"{_complex_hint(name, False)}")
    if dt.kind == "O":
        what = f"dtype object (Python objects) has no DLPack type; pass {name}.astype(np.float64)"
    elif dt.fields is not None or dt.kind in "USVMm":
        what = (f"dtype {dt} (strings, structured, void or datetime) has no DLPack type; pass a "
                f"numeric array (e.g. one field of a structured array, or .astype(np.float64))")
    elif not dt.isnative:
        what = (f"dtype {dt.str!r} has non-native byte order (DLPack carries native byte order "
                f"only); pass {name}.astype({name}.dtype.newbyteorder('='))")
    elif dt.kind == "f" and dt.itemsize > 8:
        what = (f"dtype {dt} (long double) has no DLPack type; pass {name}.astype(np.float64) "
                f"(rounds to float64)")
    if what is None:
        return None
    return TypeError(f"{name}: {what}; expected {_REAL_DTYPES}")


def _export_error(x: Any) -> Optional[BaseException]:
    """What exporting ``x`` raises -- ``__dlpack_device__()``, then ``__dlpack__`` with the
    bridge's keyword fall-backs (csrc/bridge.c ``call_dlpack``) -- or None when it exports
    (the capsule is dropped unconsumed: its destructor frees it)."""
    try:
        dev = x.__dlpack_device__()
        stream = None
        if int(dev[0]) in _CUDA_DEVICE_TYPES:
            stream = consumer_stream(x)
        last = None
        for kw in ({"stream": stream, "max_version": (1, 0), "copy": False},
                   {"stream": stream, "max_version": (1, 0)}, {"stream": stream}):
            try:
                x.__dlpack__(**kw)
                return None
            except (TypeError, NotImplementedError) as exc:
                last = exc
        return last
    except Exception as exc:  # noqa: BLE001 - what the producer raised is the answer
        return exc


# the starts of _C's messages about its other arguments and about the pair (module.c): no input
# to blame alone, nothing to probe
_C_ARGUMENT_ERRORS = ("shape mismatch", "device mismatch", "rtol", "atol", "quantiles", "at most",
                      "dim ", "dim:", "stream", "dtype")


def explain(exc: BaseException, named: Sequence[Tuple[str, Any, Any]]) -> Optional[BaseException]:
    """A clearer exception for ``exc``, raised by a ``_C`` entry point reading ``named``
    (``(argument name, the caller's object, the object exported)`` each), or None to let
    ``exc`` stand.

    ``_C`` names the argument in its own refusals ("actual: ..."); a producer's exception
    (``__dlpack__`` / ``__dlpack_device__`` raising: a torch meta or nested tensor, a NumPy
    object array ...) arrives as the producer raised it.  Known cases get a message saying
    what to pass instead (:func:`known_refusal`; restricted to the argument ``_C`` named,
    if any); an unnamed exception is traced to the argument whose own method raised it (its
    frame in the traceback), else to the first argument whose export fails again in
    isolation (exported once more: only on this failure path), and re-raised naming it --
    a TypeError stays a TypeError, any other refusal becomes a BufferError.  Errors that
    are not an input's (engine failures, MemoryError, shapes that differ, the other
    arguments' values) give None.
    """
    if not isinstance(exc, Exception) or isinstance(exc, MemoryError):
        return None
    msg = str(exc)
    if msg.startswith(_C_ARGUMENT_ERRORS):
        return None
    side = next((n for n, _, _ in named if msg.startswith(n + ":")), None)
    for name, x, _ in named:
        if side is None or name == side:
            better = known_refusal(x, name)
            if better is not None:
                return better
    if side is not None:
        return None
    culprit = _raised_by(exc, named)
    if culprit is not None:
        return _export_refusal(culprit[0], culprit[1], exc)
    for name, _, obj in named:
        err = _export_error(obj)
        if err is not None:
            return _export_refusal(name, obj, err)
    return None


def _raised_by(exc: BaseException, named: Sequence[Tuple[str, Any, Any]]) -> Optional[Tuple[str, Any]]:
    """``(name, object)`` of the input whose own Python method raised ``exc`` (a frame of
    its traceback whose ``self`` is that input: its ``__dlpack__``, ``__dlpack_device__``,
    ``__getattr__`` ...), else None (C-level producers leave no frame)."""
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        me = None
        # not vgct_ext's own frames: reading f_locals snapshots a frame's locals into a dict
        # it keeps (Python < 3.13), and the frames of compare hold this very exception
        if not frame.f_code.co_filename.startswith(_PACKAGE_DIR):
            try:
                me = frame.f_locals.get("self")
            except Exception:  # noqa: BLE001 - a frame we cannot read says nothing
                me = None
        if me is not None:
            for name, x, obj in named:
                if me is obj or me is x:
                    return name, obj
        tb = tb.tb_next
    return None


def _export_refusal(name: str, obj: Any, err: BaseException) -> BaseException:
    """``err`` (a producer's refusal to export ``obj``) restated naming the argument: a
    TypeError stays a TypeError, any other exception becomes a BufferError."""
    cls = TypeError if isinstance(err, TypeError) else BufferError
    return cls(f"{name}: {_typename(obj)} could not be exported through DLPack "
               f"({type(err).__name__}: {err}); expected an array whose __dlpack__ exports "
               f"its memory (a torch tensor, a NumPy/CuPy/JAX array) of {_REAL_DTYPES}, on "
               f"the CPU or a CUDA device")
