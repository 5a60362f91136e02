"""DLPack hand-off from Python objects to :mod:`vgct_ext._C` (private).

The C bridge (``csrc/bridge.c``) does the import itself; this shim only does
what needs the producer's own Python API, without importing any framework
(``import vgct_ext`` never imports torch; a torch tensor is an instance of
``sys.modules["torch"].Tensor`` -- subclasses defined anywhere included -- and
can only exist once torch is imported):

* a torch tensor with ``requires_grad=True`` is passed as ``x.detach()``
  (a view of the same storage, no copy): torch's ``__dlpack__`` refuses
  tensors that require grad;
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
* the consumer stream for CUDA inputs (docs/architecture.md; the Python array
  API / DLPack ``__dlpack__(stream=...)`` convention): torch's current
  stream on the tensor's device for torch tensors, CuPy's current stream on
  the array's device for CuPy arrays, else 1 (the legacy default stream; 0 is
  disallowed by the spec).  ``None`` for CPU inputs.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable, ContextManager, Optional, Tuple

_FP8 = ("float8_e4m3fn", "float8_e5m2")
_CUDA_DEVICE_TYPES = (2, 13)  # kDLCUDA, kDLCUDAManaged
_torch_fp8_export: Optional[bool] = None  # probed once per process


def _torch_of(x: Any) -> Any:
    """The torch module when ``x`` is a torch.Tensor (any subclass), else None."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, getattr(torch, "Tensor", ())):
        return torch
    return None


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


def prepare(x: Any, force_fp8_view: bool = False) -> Tuple[Any, Optional[str]]:
    """Return ``(object to export, dtype override name or None)`` for ``x``.

    Only torch tensors are touched (detach, resolve_neg, float8 view);
    anything else is returned unchanged and ``_C`` reports what is wrong with
    it.  ``force_fp8_view`` takes the uint8-view path even when torch could
    export float8 (tests use it to exercise the fallback).

    ``x.resolve_neg()`` is the only step that copies, and only for a tensor
    whose negation bit is set (``x.is_neg()``): torch exports such a tensor
    without the sign.
    """
    torch = _torch_of(x)
    if torch is None:
        return _ml_dtypes_view(x)
    if x.requires_grad:
        x = x.detach()
    if x.is_neg():
        x = x.resolve_neg()  # a copy with the sign applied (torch exports the storage unsigned)
    name = str(x.dtype).rpartition(".")[2]
    if name in _FP8 and (force_fp8_view or not _torch_exports_fp8(torch)):
        return x.view(torch.uint8), name
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


def _device(x: Any) -> Optional[Tuple[int, int]]:
    try:  # the look-up too: a failing __getattr__ is reported by _C, not from here
        t, i = x.__dlpack_device__()
        return int(t), int(i)
    except Exception:  # noqa: BLE001 - _C raises the precise error later
        return None


def call_on_stream(xs: Tuple[Any, ...], fn: Callable[[Optional[int]], Any]) -> Any:
    """``fn(stream)`` for a ``_C`` entry point reading ``xs``: under :func:`device_guard`
    with :func:`consumer_stream` when an input is on a CUDA device, else ``fn(None)`` at
    once (no device to make current, no stream: the CPU path skips both look-ups).  When
    the first CUDA input is a torch tensor on the current device the guard is skipped: it
    would make current the device that already is (the common case; the guard's enter and
    exit cost more than the engine's work on small tensors).  An input that cannot say
    where it lives is left to ``_C``, which names what is wrong."""
    devs = [_device(x) for x in xs]
    for x, d in zip(xs, devs):
        if d is not None and d[0] in _CUDA_DEVICE_TYPES:
            torch = _torch_of(x)
            if torch is not None and torch.cuda.current_device() == d[1]:
                return fn(_stream_of(xs, devs))
            with device_guard(*xs):
                return fn(_stream_of(xs, devs))
    return fn(None)


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
                h = int(torch.cuda.current_stream(x.device).cuda_stream)
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
