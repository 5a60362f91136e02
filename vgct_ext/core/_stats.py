"""PairedStats and SliceStats: the results of :func:`vgct_ext.compare`.

Every number is defined once, in ``csrc/vgct_stats.h`` (prose and sources:
``docs/metrics.md``); these classes only carry and format them.
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Mapping
from typing import Any, Dict, Optional, Tuple

import numpy as np

Index = Tuple[int, ...]


_MappingProxy = types.MappingProxyType
_set_attr = object.__setattr__
_PAIRED_FIELDS: Dict[type, Tuple[str, ...]] = {}  # PairedStats._from_c: field names per class
# the fields of PairedStats holding a flat index from _C (PairedStats._from_c unravels them)
_INDEX_FIELDS = ("max_abs_err_index", "max_rel_err_index", "worst_mismatch_index",
                 "first_class_mismatch_index")


def _unravel(flat: Optional[int], shape: Tuple[int, ...]) -> Optional[Index]:
    """Row-major flat index -> multi-index (numpy.unravel_index, as plain ints)."""
    if flat is None:
        return None
    if len(shape) == 1:
        return (flat,)
    out = []
    for s in reversed(shape):  # % and // (divmod's two results) without a call per axis
        if s:
            out.append(flat % s)
            flat //= s
        else:
            out.append(0)
    out.reverse()
    return tuple(out)


def _fmt(x: Optional[float], spec: str = ".4g") -> str:
    return "None" if x is None else format(x, spec)


def _json_float(v: float) -> Any:
    """A finite float as itself; inf, -inf, NaN as the strings "inf", "-inf", "nan"
    (strict JSON has no non-finite numbers; ``float(s)`` reads each string back)."""
    if math.isfinite(v):
        return v
    return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")


def _jsonable(x: Any) -> Any:
    """Strict-JSON form of a field value: tuples/arrays -> lists, mappings -> dicts, NaN
    entries of arrays -> None (an undefined slice), other non-finite floats -> strings."""
    if isinstance(x, np.ndarray):
        return [None if (isinstance(v, float) and math.isnan(v)) else _jsonable(v) for v in x.tolist()]
    if isinstance(x, (tuple, list)):
        return [_jsonable(v) for v in x]
    if isinstance(x, Mapping):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, float):  # np.float64 too (a float subclass)
        return _json_float(float(x))
    return x


def _order_bits(x: np.ndarray) -> np.ndarray:
    """Non-negative float64 values (or NaN) as int64 keys that order like the values: their
    bits, NaN as -1 (below every value), -0.0 as 0.  Integer comparisons: no floating-point
    mode of the caller changes them."""
    x = np.ascontiguousarray(x, dtype=np.float64)
    b = x.view(np.int64) & np.int64(0x7FFFFFFFFFFFFFFF)  # -0.0 -> 0 (the values are >= 0)
    return np.where(np.isnan(x), np.int64(-1), b)


@dataclasses.dataclass(frozen=True, eq=False)
class SliceStats:
    """Per-index statistics along one axis (``compare(..., dim=k)``).

    Each array has length ``shape[dim]``; entry ``j`` describes the finite
    pairs of the slice ``index[dim] == j`` (definitions: docs/metrics.md,
    ``vgct_slice_finalize`` in csrc/vgct_stats.h). The arrays are read-only.

    Attributes:
        dim: the axis (non-negative).
        mean_shift: float64, ``mean(a - e)``; NaN where the slice has no finite pair.
            The per-channel mean shift of quantization checks (units of the tensor).
        rel_l2: float64, ``||a - e||_2 / ||e||_2``; NaN where the slice's reference norm is 0.
        max_abs_err: float64, ``max |a - e|``; NaN where the slice has no finite pair.
        ref_rms: float64, ``sqrt(mean(e^2))``; NaN where the slice has no finite pair.
        count: int64, number of finite pairs in the slice.
    """

    dim: int
    mean_shift: np.ndarray
    rel_l2: np.ndarray
    max_abs_err: np.ndarray
    ref_rms: np.ndarray
    count: np.ndarray

    def __post_init__(self) -> None:
        for f in ("mean_shift", "rel_l2", "max_abs_err", "ref_rms", "count"):
            getattr(self, f).setflags(write=False)

    def __len__(self) -> int:
        return int(self.count.shape[0])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SliceStats):
            return NotImplemented
        return self.dim == other.dim and all(
            np.array_equal(getattr(self, f), getattr(other, f), equal_nan=f != "count")
            for f in ("mean_shift", "rel_l2", "max_abs_err", "ref_rms", "count"))

    __hash__ = None  # type: ignore[assignment]

    def worst(self) -> Optional[int]:
        """Index along ``dim`` of the worst slice, or None when no slice has a finite pair.

        A zero-reference slice (``ref_rms == 0``) with a non-zero error is worse than any
        relative error: among those the largest ``max_abs_err`` wins. Otherwise the largest
        ``rel_l2``; when every ``rel_l2`` is undefined, the largest ``max_abs_err``.
        Ties go to the lowest index.  The values are compared by their bits (a
        non-negative float64 orders like its bits as an integer): the same answer in any
        floating-point environment of the caller -- under flush-to-zero a subnormal error
        would otherwise compare equal to 0 (docs/metrics.md, "Floating-point environment").
        """
        has = self.count > 0
        if not has.any():
            return None
        mabs, ref = _order_bits(self.max_abs_err), _order_bits(self.ref_rms)
        zero_ref = has & (ref == 0) & (mabs > 0)
        if zero_ref.any():
            return int(np.argmax(np.where(zero_ref, mabs, -1)))
        if np.isfinite(self.rel_l2).any():
            return int(np.argmax(_order_bits(self.rel_l2)))
        return int(np.argmax(np.where(has, mabs, -1)))

    def as_dict(self) -> Dict[str, Any]:
        """Strict-JSON dict (``json.dumps(..., allow_nan=False)`` works): arrays become lists,
        NaN (an undefined slice) becomes None, +-inf become the strings "inf" / "-inf"."""
        return {"dim": self.dim, **{f: _jsonable(getattr(self, f)) for f in
                                    ("mean_shift", "rel_l2", "max_abs_err", "ref_rms", "count")}}


@dataclasses.dataclass(frozen=True)
class PairedStats:
    """Paired statistics of ``actual`` against ``expected`` (returned by :func:`vgct_ext.compare`).

    All values are computed in float64 over the flattened tensors (row-major logical order,
    whatever the strides); only *finite pairs* (both values finite) enter norms, maxima,
    mismatches and quantiles. Definitions and sources: docs/metrics.md; the single
    implementation: csrc/vgct_stats.h. Indices are multi-indices into ``shape`` (the lowest
    flat index among ties). ``None`` means "undefined" (e.g. no finite pair), never 0.

    Attributes:
        n: number of pairs (elements).
        shape: the logical shape of both tensors.
        dtype_actual, dtype_expected: numpy/torch dtype names ("bfloat16", "float32", ...).
        device: "cpu" or "cuda:K".
        n_finite: pairs with both values finite.
        rel_l2: ``||a-e||_2 / ||e||_2``; None when ``zero_reference``.
        cosine: ``<a,e> / (||a||_2 ||e||_2)`` clamped to [-1, 1]; None when either norm is 0.
        zero_reference: ``||e||_2 == 0`` (use ``max_abs_err`` against ``atol`` instead).
        norm_actual, norm_expected, norm_diff: L2 norms of a, e, a-e over finite pairs.
        mean_diff: mean of ``a-e`` over finite pairs; None when there is none.
        max_abs_err, max_abs_err_index, max_abs_err_actual, max_abs_err_expected:
            ``max |a-e|``, where, and the two values there.
        max_rel_err, max_rel_err_index: ``max |a-e|/|e|`` over finite pairs with ``e != 0``.
        max_abs_expected: ``max |e|`` over finite pairs (scale for zero-reference gates).
        quantiles: ``{p: exact p-quantile of |a-e|}`` over finite pairs, numpy's default
            definition (``numpy.quantile(..., method="linear")``, Hyndman & Fan type 7);
            the value is None when there is no finite pair. A read-only mapping
            (``types.MappingProxyType``; ``dict(s.quantiles)`` for a copy).
        rtol, atol: the tolerances of ``mismatches``.
        mismatches: finite pairs with ``|a-e| > atol + rtol*|e|`` (torch.allclose convention).
        mismatch_fraction: ``mismatches / n_finite`` (0.0 when n_finite == 0).
        worst_mismatch_index, worst_mismatch_excess: largest ``|a-e| - (atol + rtol*|e|)``.
        n_unequal: pairs whose values differ (+0 == -0; NaN vs NaN counts as equal).
        nan_actual, posinf_actual, neginf_actual, nan_expected, posinf_expected,
        neginf_expected: non-finite counts.
        n_class_mismatch, first_class_mismatch_index: positions whose class
            (finite, NaN, +Inf, -Inf) differs between the two, and the first one.
        dim: the slice axis of ``slices`` (non-negative), or None.
        slices: :class:`SliceStats` along ``dim``, or None.
    """

    n: int
    shape: Tuple[int, ...]
    dtype_actual: str
    dtype_expected: str
    device: str
    n_finite: int
    rel_l2: Optional[float]
    cosine: Optional[float]
    zero_reference: bool
    norm_actual: float
    norm_expected: float
    norm_diff: float
    mean_diff: Optional[float]
    max_abs_err: Optional[float]
    max_abs_err_index: Optional[Index]
    max_abs_err_actual: Optional[float]
    max_abs_err_expected: Optional[float]
    max_rel_err: Optional[float]
    max_rel_err_index: Optional[Index]
    max_abs_expected: Optional[float]
    quantiles: Mapping[float, Optional[float]]
    rtol: float
    atol: float
    mismatches: int
    mismatch_fraction: float
    worst_mismatch_index: Optional[Index]
    worst_mismatch_excess: Optional[float]
    n_unequal: int
    nan_actual: int
    posinf_actual: int
    neginf_actual: int
    nan_expected: int
    posinf_expected: int
    neginf_expected: int
    n_class_mismatch: int
    first_class_mismatch_index: Optional[Index]
    dim: Optional[int] = None
    slices: Optional[SliceStats] = None

    __hash__ = None  # type: ignore[assignment]  # holds a mapping

    def __post_init__(self) -> None:
        # frozen all the way down: the quantiles of a result cannot be edited in place
        object.__setattr__(self, "quantiles", types.MappingProxyType(dict(self.quantiles)))

    def __getstate__(self) -> Dict[str, Any]:
        # mappingproxy does not pickle or deepcopy: store a plain dict
        state = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        state["quantiles"] = dict(self.quantiles)
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        for k, v in state.items():
            object.__setattr__(self, k, v)
        self.__post_init__()

    @classmethod
    def _from_c(cls, d: Dict[str, Any], _owned: bool = False) -> "PairedStats":
        """Build from the dict of ``_C.compare`` (flat indices -> multi-indices).

        The same object ``cls(**fields)`` gives, without the frozen ``__init__``'s one
        ``object.__setattr__`` per field: this is on the path of every ``compare`` (a third
        of a small comparison's Python time went here).  The dict's keys are checked against
        the fields in full the first time (per class), then by their number.  The instance's
        ``__dict__`` is a copy of ``d`` (one C-level copy, not one insertion per field) --
        ``d`` itself, and its quantiles dict the read-only mapping's, when ``_owned`` says
        that no one else holds them (``compare``: the fresh dict ``_C`` returned).
        """
        names = _PAIRED_FIELDS.get(cls)
        state = d if _owned else dict(d)
        state.setdefault("dim", None)
        state.setdefault("slices", None)
        if names is None or len(state) != len(names):
            full = tuple(f.name for f in dataclasses.fields(cls))
            missing = [k for k in full if k not in state]
            if missing:  # the C module and this class disagree: say so, as cls(**...) would
                raise TypeError(f"PairedStats: _C.compare gave no {missing}")
            extra = [k for k in state if k not in full]
            if extra:
                raise TypeError(f"PairedStats: _C.compare gave unknown fields {extra}")
            _PAIRED_FIELDS[cls] = full
        shape = state["shape"]
        if type(shape) is not tuple:
            shape = state["shape"] = tuple(shape)
        if len(shape) == 1:  # _unravel, without a call per index: its 1-d case, and None as None
            for k in _INDEX_FIELDS:
                i = state[k]
                if i is not None:
                    state[k] = (i,)
        else:
            for k in _INDEX_FIELDS:
                i = state[k]
                if i is not None:
                    state[k] = _unravel(i, shape)
        sl = state["slices"]
        if sl is not None:
            state["slices"] = SliceStats(**sl)
        # frozen all the way down (as __post_init__): a read-only copy of the quantiles
        q = state["quantiles"]
        state["quantiles"] = _MappingProxy(q if _owned and type(q) is dict else dict(q))
        obj = cls.__new__(cls)
        _set_attr(obj, "__dict__", state)  # past the frozen __setattr__, as __init__ goes
        return obj

    def quantile(self, p: float) -> Optional[float]:
        """The p-quantile of ``|a-e|`` computed by ``compare`` (None when no finite pair).

        Raises KeyError when ``p`` was not requested (pass ``quantiles=(..., p)``).
        """
        p = float(p)
        if p in self.quantiles:
            return self.quantiles[p]
        for k, v in self.quantiles.items():
            if abs(k - p) <= 1e-12:
                return v
        raise KeyError(f"quantile {p!r} was not computed (computed: {sorted(self.quantiles)}); "
                       f"pass quantiles=(..., {p!r}) to vgct_ext.compare")

    @property
    def p99(self) -> Optional[float]:
        """``quantile(0.99)``: the 99th percentile of ``|a-e|`` (KeyError if not requested)."""
        return self.quantile(0.99)

    def as_dict(self) -> Dict[str, Any]:
        """Strict-JSON dict of every field (``json.dumps(..., allow_nan=False)`` works).

        Tuples and arrays become lists, ``quantiles`` a plain dict; NaN entries of the slice
        arrays (undefined slices) become None, like every undefined value; any other
        non-finite float (an overflowing ``norm_diff``, an infinite ``max_abs_err`` ...)
        becomes the string ``"inf"``, ``"-inf"`` or ``"nan"`` (``float(s)`` reads it back).
        """
        out: Dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.name] = v.as_dict() if isinstance(v, SliceStats) else _jsonable(v)
        return out

    def summary(self) -> str:
        """One line: dtypes, shape, device and the headline statistics."""
        q = " ".join(f"p{_pct(p)}={_fmt(v, '.3e')}" for p, v in sorted(self.quantiles.items()))
        parts = [
            f"{self.dtype_actual} vs {self.dtype_expected} {tuple(self.shape)} {self.device}:",
            f"rel_l2={_fmt(self.rel_l2, '.3e')}" + (" (zero reference)" if self.zero_reference else ""),
            f"cos={_fmt(self.cosine, '.6f')}",
            f"max_abs={_fmt(self.max_abs_err, '.3e')}"
            + (f"@{self.max_abs_err_index}" if self.max_abs_err_index is not None else ""),
        ]
        if q:
            parts.append(q)
        parts.append(f"mismatches={self.mismatches}/{self.n_finite} ({self.mismatch_fraction:.2%})")
        nonfinite = self.n - self.n_finite
        if nonfinite:
            parts.append(f"non-finite pairs={nonfinite} (class mismatches {self.n_class_mismatch})")
        return " ".join(parts)

    def __str__(self) -> str:
        rows = [
            ("pairs", f"{self.n} ({self.n_finite} finite), shape {tuple(self.shape)}, {self.device}"),
            ("dtypes", f"actual {self.dtype_actual}, expected {self.dtype_expected}"),
            ("rel_l2", _fmt(self.rel_l2, ".6e") + ("  (zero reference: ||e|| = 0)" if self.zero_reference else "")),
            ("cosine", _fmt(self.cosine, ".9f")),
            ("norms", f"||a|| {self.norm_actual:.6e}  ||e|| {self.norm_expected:.6e}  "
                      f"||a-e|| {self.norm_diff:.6e}"),
            ("mean(a-e)", _fmt(self.mean_diff, ".6e")),
            ("max |a-e|", _fmt(self.max_abs_err, ".6e") + (
                f" at {self.max_abs_err_index} (a={self.max_abs_err_actual!r}, e={self.max_abs_err_expected!r})"
                if self.max_abs_err_index is not None else "")),
            ("max |a-e|/|e|", _fmt(self.max_rel_err, ".6e") + (
                f" at {self.max_rel_err_index}" if self.max_rel_err_index is not None else "")),
            ("max |e|", _fmt(self.max_abs_expected, ".6e")),
        ]
        for p, v in sorted(self.quantiles.items()):
            rows.append((f"p{_pct(p)} |a-e|", _fmt(v, ".6e")))
        rows.append(("mismatches", f"{self.mismatches} ({self.mismatch_fraction:.4%}) with rtol={self.rtol:g}, "
                                   f"atol={self.atol:g}" + (
            f"; worst at {self.worst_mismatch_index} by {self.worst_mismatch_excess:.6e}"
            if self.worst_mismatch_index is not None else "")))
        rows.append(("unequal", str(self.n_unequal)))
        rows.append(("non-finite", f"actual nan/+inf/-inf {self.nan_actual}/{self.posinf_actual}/"
                                   f"{self.neginf_actual}, expected {self.nan_expected}/"
                                   f"{self.posinf_expected}/{self.neginf_expected}, class mismatches "
                                   f"{self.n_class_mismatch}" + (
            f" (first at {self.first_class_mismatch_index})"
            if self.first_class_mismatch_index is not None else "")))
        if self.slices is not None:
            w = self.slices.worst()
            rows.append((f"slices dim={self.dim}", f"{len(self.slices)} slices" + (
                f"; worst index {w}: rel_l2 {self.slices.rel_l2[w]:.4e}, max |a-e| "
                f"{self.slices.max_abs_err[w]:.4e}, mean shift {self.slices.mean_shift[w]:.4e}"
                if w is not None else "")))
        from .._table import render, terminal_width  # rich, imported on the first str()

        return "PairedStats\n" + "\n".join(render(("", ""), rows, terminal_width(), show_header=False, indent=2))


def _pct(p: float) -> str:
    """0.99 -> '99', 0.999 -> '99.9', 0.5 -> '50'."""
    s = f"{p * 100:.10g}"
    return s
