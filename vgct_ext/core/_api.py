"""The public functions of vgct_ext: compare, fingerprint, build_info."""

from __future__ import annotations

import numbers
import os
from typing import Any, Dict, Iterable, Optional, Union

from .. import _C
from . import _dlpack
from ._stats import PairedStats


def _is_bool(x: Any) -> bool:
    """bool, numpy.bool_, or a bool array/tensor (anything whose dtype is boolean)."""
    if isinstance(x, bool):
        return True
    dt = getattr(x, "dtype", None)
    return dt is not None and (getattr(dt, "kind", None) == "b" or str(dt) == "torch.bool")


_DEFAULT_QUANTILES = (0.99,)  # compare's default, the very object (and () the one empty tuple):
_NO_QUANTILES = ()  # _quantile_tuple returns either as it is
_ndarray = _dlpack._ndarray

_Q_TYPE_ERROR = "quantiles must be a float in [0, 1] or a sequence of them"


def _quantile_tuple(quantiles: Any) -> tuple:
    """``quantiles`` of :func:`compare` as a tuple for ``_C`` (which checks the values).

    A single number -- a Python/NumPy real scalar or a 0-d array -- is one quantile; None is
    none; anything else is iterated.  Booleans are refused (``True`` is not the quantile 1.0);
    so are strings, bytes and objects that cannot be iterated (TypeError naming quantiles).
    """
    if type(quantiles) is tuple:  # the default (0.99,) and most calls: floats, checked by _C
        for q in quantiles:
            if type(q) is not float:
                break
        else:
            return quantiles
    if quantiles is None:
        return ()
    if isinstance(quantiles, (str, bytes)):
        raise TypeError(f"{_Q_TYPE_ERROR}, got {type(quantiles).__name__}")
    if isinstance(quantiles, numbers.Real) or getattr(quantiles, "ndim", None) == 0:
        if _is_bool(quantiles):
            raise TypeError(f"{_Q_TYPE_ERROR}, got bool")
        return (quantiles,)
    try:
        qs = tuple(quantiles)
    except TypeError as exc:
        raise TypeError(f"{_Q_TYPE_ERROR}, got {type(quantiles).__name__}") from exc
    for i, q in enumerate(qs):
        if _is_bool(q):
            raise TypeError(f"quantiles[{i}] must be a float in [0, 1], got bool")
    return qs


def _tolerance(name: str, x: Any) -> float:
    """``rtol`` / ``atol`` as a float for ``_C`` (which checks finite and >= 0, and makes
    ``-0.0`` the ``0.0`` it is): a real number -- Python or NumPy scalar, or a 0-d
    array/tensor -- never a bool or a string (TypeError naming the argument).  No
    arithmetic here: Python's runs in the caller's floating-point environment, where
    flush-to-zero would turn a subnormal tolerance into 0 (``_C`` computes in the
    default one, docs/metrics.md)."""
    if type(x) is float:
        return x
    if not _is_bool(x) and not isinstance(x, (str, bytes)) and (
            isinstance(x, numbers.Real) or getattr(x, "ndim", None) == 0):
        try:
            return float(x)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{name} must be a real number >= 0 (a float), got "
                            f"{type(x).__name__}") from exc
    raise TypeError(f"{name} must be a real number >= 0 (a float), got {type(x).__name__}")


def compare(actual: Any, expected: Any, *, rtol: float = 1e-3, atol: float = 1e-3,
            quantiles: Union[float, Iterable[float], None] = _DEFAULT_QUANTILES,
            dim: Optional[int] = None) -> PairedStats:
    """Paired statistics of ``actual`` against the reference ``expected``, in one pass, float64.

    Args:
        actual, expected: any objects implementing the DLPack protocol (``__dlpack__`` /
            ``__dlpack_device__``: torch.Tensor, numpy.ndarray, CuPy and JAX arrays), read
            zero-copy through DLPack (DLPack spec v1.x, versioned capsule with a legacy
            fallback). Same logical shape (no broadcasting), same device (CPU, or one CUDA
            device: no hidden copies), any strides (0, negative, non-contiguous, any byte
            offset), any of the dtypes bool, int8/16/32/64, uint8, float16, bfloat16,
            float32, float64, float8_e4m3fn, float8_e5m2 -- the two may differ (bf16
            against an fp32 reference). torch tensors are read through ``detach()`` (an
            alias of the same storage, no copy; tensors that require grad included).
            Complex inputs are refused: compare ``torch.view_as_real(x)`` /
            ``x.view(x.real.dtype)`` (real and imaginary parts) instead. NumPy masked
            arrays are refused: pass ``x.filled(value)`` or ``x.data`` explicitly.
            While the call runs (the GIL is released), do not free, resize or reallocate
            an input from another thread: torch ``x.set_(...)`` / ``x.data = ...`` and NumPy
            ``resize`` are safe (the export holds its own alias; NumPy refuses the resize),
            a torch ``resize_`` or ``untyped_storage().resize_()`` is not.  Writing into an
            input meanwhile gives the statistics of some mixture of old and new values.
        rtol, atol: real numbers (Python/NumPy scalars, 0-d arrays; not bools), finite,
            >= 0: a finite pair mismatches when ``|a-e| > atol + rtol*|e|``
            (torch.allclose's convention).
        quantiles: up to 64 probabilities in [0, 1]; each gives the exact quantile of
            ``|a-e|`` over finite pairs as ``numpy.quantile(..., method="linear")`` defines
            it (any n, not an approximation). A single number is accepted (a Python or NumPy
            scalar, a 0-d array); bools are refused (TypeError). The default ``(0.99,)`` costs
            1.3-1.9x the compare without quantiles on a 2-core CPU at 2^20..2^28 pairs; on an
            H200 about 10-45 us more up to 2^20 pairs, ~50-130 us more from 1.5M to 2^25
            pairs and 1.1-1.9x at 2^28 (docs/metrics.md, "Cost of the default quantiles");
            little more where fewer than 1% of the pairs differ (an identical pair: the
            reduction's zero count answers it, "Ranks the reduction answers"); pass ``()`` or
            ``None`` when no quantile is needed.
        dim: an axis (an integer, NumPy integers included, not a bool; negative counts
            from the end) for per-slice statistics
            (``PairedStats.slices``), e.g. the channel axis for per-channel mean shift.

    Returns:
        :class:`vgct_ext.PairedStats` (definitions: docs/metrics.md).

    Raises (every refusal of an input names it, ``actual`` or ``expected``, says what is
    wrong and what to pass instead; a producer's own error is chained as ``__cause__``):
        TypeError: an input without DLPack, an unsupported dtype (complex, object, string,
            long double, non-native byte order ...) or layout (sparse, nested, quantized),
            a masked array, an argument of a wrong type (naming the argument).
        ValueError: shapes differ (both shapes named), devices differ, a bad rtol/atol/
            quantile/dim, too many dimensions (> 32).
        BufferError: an unsupported device (a torch meta tensor) or DLPack version, a
            malformed capsule, or the producer's own refusal to export.
        RuntimeError: a CUDA input with a build without CUDA, or a CUDA failure.
        MemoryError: the engine could not allocate its work space.
    """
    # the defaults and plain floats as they are, without the calls (what the two return for them)
    qs = quantiles if quantiles is _DEFAULT_QUANTILES or quantiles is _NO_QUANTILES else _quantile_tuple(quantiles)
    if type(rtol) is not float:
        rtol = _tolerance("rtol", rtol)
    if type(atol) is not float:
        atol = _tolerance("atol", atol)
    a, e = actual, expected
    try:
        a, da = _dlpack.prepare(actual, argname="actual")
        e, de = _dlpack.prepare(expected, argname="expected")
        # NumPy arrays cannot be resized until the call returns (pin: nothing for other objects)
        keep = _dlpack.pin(a, e) if isinstance(a, _ndarray) or isinstance(e, _ndarray) else ()  # noqa: F841
        d = NotImplemented
        if _dlpack.producer_streams(a, e):  # torch tensors: _C takes the producer's stream
            d = _C.compare(a, e, rtol, atol, qs, dim, _C.PRODUCER_STREAM, da, de)
        if d is NotImplemented:
            d = _dlpack.call_on_stream(
                (a, e), lambda s, xa, xe: _C.compare(xa, xe, rtol, atol, qs, dim, s, da, de))
    except Exception as exc:  # a refusal: named by _dlpack.explain, else as raised
        better = _dlpack.explain(exc, (("actual", actual, a), ("expected", expected, e)))
        if better is None:
            raise
        try:
            raise better from exc
        finally:
            del better  # no frame <-> exception cycle (the inputs would live until a GC pass)
    return PairedStats._from_c(d, True)  # d: the fresh dict _C returned, no one else's


def fingerprint(x: Any) -> int:
    """64-bit hash (unsigned int) of a tensor's logical contents: raw element bits in row-major
    logical order, dtype and shape (definition: csrc/vgct_stats.h "fingerprint"; strides and
    memory layout do not matter; -0.0 and +0.0 differ, as do NaN payloads). Same input types
    and errors as :func:`compare`.
    """
    obj = x
    try:
        obj, override = _dlpack.prepare(x, argname="x")
        keep = _dlpack.pin(obj)  # noqa: F841 - see compare
        return _dlpack.call_on_stream((obj,), lambda s, xo: _C.fingerprint(xo, s, override))
    except Exception as exc:  # see compare
        better = _dlpack.explain(exc, (("x", x, obj),))
        if better is None:
            raise
        try:
            raise better from exc
        finally:
            del better


def build_info() -> Dict[str, Any]:
    """How this vgct_ext was built and what CUDA it sees now.

    Keys: ``version``; ``cuda_compiled`` (bool); ``nvcc_version`` and ``cuda_archs`` (the
    ``-gencode`` list; both None for a CPU-only build); at run time ``cuda_runtime_version``,
    ``cuda_driver_version`` (0 without a driver) and ``cuda_device_count`` (0 without a GPU;
    all three 0 for a CPU-only build); ``compiler``; ``dlpack_version``; ``max_threads`` (CPU
    worker threads, ``VGCT_NUM_THREADS`` or the CPU count); ``phase_trace`` (bool: True only for
    a ``VGCT_PHASE_TRACE=1`` diagnostic build, whose small-input CUDA reduce prints its phases'
    times on every launch -- bench/phase_trace.py; never for use); ``extension_path`` (the file the
    compiled ``_C`` was loaded from) and ``package_path`` (this package's folder): with an
    editable install of another checkout the two can be in different trees, and then the C code
    is not this tree's.
    """
    info = dict(_C.build_info())
    info["extension_path"] = os.path.abspath(_C.__file__)
    info["package_path"] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return info
