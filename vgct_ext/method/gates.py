"""T1 and T2 gates: the method's tolerance gates over :func:`vgct_ext.compare`.

Source of every definition: the VisualGen component-test method, stated in this project's words in
``docs/method.md`` (section "Numerical evidence"); the statistics themselves are defined in
``docs/metrics.md``.

* **T1, transparent** features. The design card's bands are the ceiling: ``rtol = atol = 1e-3``
  elementwise, relative L2 ``<= 1e-2``, cosine ``>= 0.9999`` without a cause, and for a named accumulation
  cause (:class:`Relax`) at most the outer band, relative L2 ``5e-2``, cosine ``0.999`` (vgct_ext applies
  the same ``5e-2`` as the ceiling of the elementwise ``rtol``/``atol``). Under that ceiling the bars follow
  the compared dtypes: a bar is a multiple of the unit roundoff ``u`` of the coarser dtype
  (:func:`t1_band`, :data:`T1_MULTIPLES`), so a cause can widen a float32 comparison only as far as float32
  rounding can reach, never to the outer band. A looser request raises :class:`TransparencyFinding`.
* **T2, lossy** features: the same statistics, gated on bars calibrated from recorded evidence for the
  current hardware stratum (``"cpu-<isa>"`` or ``"sm_XY"``), never a built-in default
  (see :mod:`vgct_ext.evidence`).

Both gates accept a tensor or a (nested) tuple/list/dict of tensors, gate every tensor leaf and name it by
its path (``out[0]``, ``out["sample"]``). Both fail on any non-finite pair, on an empty comparison (the
message then says no finite pair was compared), and, for a zero-norm reference (where relative L2 and cosine
are undefined), gate on the maximum absolute error and say so. :func:`soft_gates` collects every failure of a
block and raises them together at its end.
"""

from __future__ import annotations

import dataclasses
import enum
import contextlib
import functools
import contextvars
import math
import os
import sys
import threading
import warnings
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from . import _context
from ._blocks import gate_block
from ._hardware import describe_device, stratum_of
from .evidence import PER_CHANNEL, RELATIVE, AmbiguousGate
from ..core._stats import PairedStats

#: What a gate returns: the PairedStats of a single tensor, or ``{leaf path: PairedStats}`` for a structure.
GateResult = Union[PairedStats, Dict[str, PairedStats]]

__all__ = [
    "Relax",
    "T1Bars",
    "T1_DEFAULT",
    "OUTER_BAND",
    "COSINE_INVESTIGATION_FLOOR",
    "Check",
    "GateFailure",
    "TransparencyFinding",
    "EvidenceMissing",
    "AmbiguousGate",
    "expect_evidence_missing",
    "assert_t1",
    "assert_t2",
    "resolve_t1_bars",
    "soft_gates",
    "DtypeClass",
    "dtype_class",
    "t1_band",
    "relaxation_table",
    "UNIT_ROUNDOFF",
    "T1_MULTIPLES",
    "MIXED_FACTOR",
    "SLACK_WARNING",
    "paired_leaves",
    "GateResult",
]


class Relax(str, enum.Enum):
    """The named accumulation causes for which the method allows relaxing a T1 gate.

    Pass a member, its value (``"reduction reordering"``, ``"backend or kernel swap"``,
    ``"compile fusion"``, ``"parallel partial-sum merge"``) or its name (``"BACKEND_SWAP"``) as
    ``assert_t1(..., relax=...)``; case, surrounding spaces and ``_`` versus a space are ignored
    (``"backend swap"`` is the name ``BACKEND_SWAP``), any other string is refused (:meth:`parse`).
    """

    REDUCTION_REORDERING = "reduction reordering"
    BACKEND_SWAP = "backend or kernel swap"
    COMPILE_FUSION = "compile fusion"
    PARALLEL_MERGE = "parallel partial-sum merge"

    @classmethod
    def parse(cls, value: Union["Relax", str]) -> "Relax":
        """Return the member for ``value``; raise ``ValueError`` (listing the causes) for anything else."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            norm = " ".join(value.strip().lower().replace("_", " ").split())
            for m in cls:
                if norm in (m.value, m.name.lower().replace("_", " ")):
                    return m
        causes = ", ".join(repr(m.value) for m in cls)
        raise ValueError(f"relax={value!r} is not a named accumulation cause; a T1 gate may be relaxed only "
                         f"for one of: {causes} (vgct_ext.Relax). Anything else is a finding to investigate.")

    def __str__(self) -> str:  # pragma: no cover - trivial
        return self.value


@dataclasses.dataclass(frozen=True)
class T1Bars:
    """The bars of a T1 gate. ``rel_l2``/``rtol``/``atol`` are upper bounds, ``cosine`` a lower bound."""

    rel_l2: float
    cosine: float
    rtol: float
    atol: float


#: The method's starting point for a transparent feature.
T1_DEFAULT = T1Bars(rel_l2=1e-2, cosine=0.9999, rtol=1e-3, atol=1e-3)
#: The method's outer reference band, the most a named cause may relax T1 to.
OUTER_BAND = T1Bars(rel_l2=5e-2, cosine=0.999, rtol=5e-2, atol=5e-2)
#: A calibrated T2 cosine bar below this needs an investigation note in the evidence.
COSINE_INVESTIGATION_FLOOR = 0.99

# --------------------------------------------------------------------------------------------------------------
# T1 bands per cause and dtype class
#
# The design card's bands (T1_DEFAULT without a cause, OUTER_BAND with one) are ceilings. Under them each bar is a
# multiple of the unit roundoff u of the coarser compared dtype: every accumulation cause the method names changes
# only the order or the number of roundings, so the difference it can make is a bounded number of roundings of
# that precision (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., sec. 2-4: a sum reordered or
# fused differs by at most ~n*u relatively, ~sqrt(n)*u in the typical case). docs/method.md states the derivation
# and the measured floors the multiples were chosen against.

#: Unit roundoff u = 2^-p (p = significand bits including the implicit one) of each floating dtype. "tfloat32"
#: stands for float32 tensors on a CUDA device whose float32 matmuls may run in TF32 (10 stored bits).
UNIT_ROUNDOFF: Dict[str, float] = {
    "float64": 2.0 ** -53,
    "float32": 2.0 ** -24,
    "tfloat32": 2.0 ** -11,
    "float16": 2.0 ** -11,
    "bfloat16": 2.0 ** -8,
    "float8_e4m3fn": 2.0 ** -4,
    "float8_e5m2": 2.0 ** -3,
}
#: Integer and bool dtypes are exact: they are gated as float64 (the finest class).
_EXACT_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
#: A mixed pair (two different dtypes, e.g. float32 against a float64 oracle, bf16 against an fp32 reference)
#: carries the coarse side's whole forward error, not only the rounding the feature moved: 4x the multiples.
MIXED_FACTOR = 4.0
#: The smallest ``1 - cosine`` a bar asks for: the float64 cosine of two equal tensors may itself come out
#: ``1 - 2^-52`` (rounding of the dot product and the norms), so no bar is closer to 1 than this.
COSINE_RESOLUTION = 1e-12
#: ``cause -> (k_rel, k_elem)``: the bars are ``relative L2 <= k_rel * u``, ``rtol = atol = k_elem * u``
#: (each capped by the ceiling), cosine ``>= max(ceiling, 1 - max((relative L2 bar)^2, 1e-12))``. ``None`` is the T1
#: default (no cause). Reordering a reduction or merging parallel partial sums keeps the accumulator precision
#: and changes only the rounding order (fewer roundings move than when a kernel or a fusion changes which
#: intermediates are rounded at all): 4x tighter than a backend swap or a compile fusion.
T1_MULTIPLES: Dict[Optional["Relax"], Tuple[float, float]] = {
    None: (16.0, 64.0),
    Relax.REDUCTION_REORDERING: (64.0, 256.0),
    Relax.PARALLEL_MERGE: (64.0, 256.0),
    Relax.BACKEND_SWAP: (256.0, 1024.0),
    Relax.COMPILE_FUSION: (256.0, 1024.0),
}


@dataclasses.dataclass(frozen=True)
class DtypeClass:
    """The precision a T1 comparison is judged at: the coarser of the two dtypes.

    ``name`` is the dtype whose unit roundoff ``u`` sets the bars (``"tfloat32"`` for float32 on a CUDA device
    with TF32 matmuls allowed), ``mixed`` whether the two dtypes differ (the bars are then ``MIXED_FACTOR``
    wider), ``dtypes`` the two dtype names as compared (actual, expected).
    """

    name: str
    u: float
    mixed: bool
    dtypes: Tuple[str, str]

    @property
    def coarse_reference(self) -> bool:
        """Whether the reference (``expected``) is coarser than the output under test: the bars are then the
        reference's, up to 2^16 times the output's own resolution (a float32 output against a bfloat16 copy of
        its reference passed a 0.5 % scale error: new-user trial of 2026-12-05)."""
        ua, ue = (UNIT_ROUNDOFF.get("float64" if n in _EXACT_DTYPES else n) for n in self.dtypes)
        return ua is not None and ue is not None and ue > ua

    def describe(self) -> str:
        pair = self.dtypes[0] if not self.mixed else f"{self.dtypes[0]} vs {self.dtypes[1]}"
        tf = " (TF32 matmuls allowed)" if self.name == "tfloat32" else ""
        return f"{pair}{tf}: u = 2^{round(math.log2(self.u))}" + (", mixed pair" if self.mixed else "")


def _norm_dtype(dt: Any) -> str:
    if isinstance(getattr(dt, "name", None), str):  # numpy.dtype, ml_dtypes
        name = dt.name
    elif isinstance(dt, type):  # numpy scalar types (numpy.float32)
        name = dt.__name__
    else:
        name = str(dt)
    for prefix in ("torch.", "jnp.", "numpy."):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return {"float": "float32", "double": "float64", "half": "float16", "bool_": "bool"}.get(name, name)


def _tf32_allowed() -> bool:
    """Whether this process lets torch run float32 matmuls in TF32 (or coarser) on CUDA."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        if torch.get_float32_matmul_precision() != "highest":
            return True
        return bool(torch.backends.cuda.matmul.allow_tf32)
    except Exception:  # noqa: BLE001 - a torch without these switches has no TF32
        return False


def dtype_class(dtype_actual: Any, dtype_expected: Any, device: Optional[str] = None) -> DtypeClass:
    """The :class:`DtypeClass` of a comparison of ``dtype_actual`` against ``dtype_expected`` on ``device``.

    Dtypes are names (``"bfloat16"``) or dtype objects (``torch.bfloat16``, ``numpy.float32``). A float32 side
    on a CUDA ``device`` (``"cuda:K"``) counts as ``"tfloat32"`` when torch allows TF32 matmuls
    (``torch.get_float32_matmul_precision() != "highest"`` or ``torch.backends.cuda.matmul.allow_tf32``).
    cuDNN's TF32 convolutions (``torch.backends.cudnn.allow_tf32``, on by default) are not counted: a float32
    convolution compared across backends on a GPU should turn them off.
    Raises ``TypeError`` for a dtype without a unit roundoff (complex, unknown).
    """
    names = (_norm_dtype(dtype_actual), _norm_dtype(dtype_expected))
    us = []
    for n in names:
        if n in _EXACT_DTYPES:
            n = "float64"
        if n == "float32" and device is not None and str(device).startswith("cuda") and _tf32_allowed():
            n = "tfloat32"
        if n not in UNIT_ROUNDOFF:
            raise TypeError(f"assert_t1: no unit roundoff is defined for dtype {n!r} (known: "
                            f"{', '.join(UNIT_ROUNDOFF)}, and integer/bool dtypes)")
        us.append((UNIT_ROUNDOFF[n], n))
    u, name = max(us)
    return DtypeClass(name=name, u=u, mixed=names[0] != names[1], dtypes=names)


def t1_band(relax: Union["Relax", str, None], dtypes: Optional[DtypeClass] = None) -> T1Bars:
    """The loosest T1 bars allowed for ``relax`` (``None``: the T1 default) at the dtype class ``dtypes``.

    ``rel_l2 = min(ceiling, k_rel * u * m)``, ``rtol = atol = min(ceiling, k_elem * u * m)`` and
    ``cosine = max(ceiling, 1 - max(rel_l2^2, 1e-12))`` (:data:`COSINE_RESOLUTION`), with ``(k_rel, k_elem)``
    from :data:`T1_MULTIPLES`, ``u`` the unit roundoff of the class, ``m = MIXED_FACTOR`` for a mixed pair (else 1) and the ceiling :data:`T1_DEFAULT`
    without a cause, :data:`OUTER_BAND` with one. Without ``dtypes`` the ceiling itself (used to validate a
    request before the dtypes are known). These are also the default bars.
    """
    cause = Relax.parse(relax) if relax is not None else None
    ceiling = OUTER_BAND if cause is not None else T1_DEFAULT
    if dtypes is None:
        return ceiling
    k_rel, k_elem = T1_MULTIPLES[cause]
    m = MIXED_FACTOR if dtypes.mixed else 1.0
    rel = min(ceiling.rel_l2, k_rel * dtypes.u * m)
    elem_r = min(ceiling.rtol, k_elem * dtypes.u * m)
    elem_a = min(ceiling.atol, k_elem * dtypes.u * m)
    cos = max(ceiling.cosine, 1.0 - max(rel * rel, COSINE_RESOLUTION))
    return T1Bars(rel_l2=rel, cosine=cos, rtol=elem_r, atol=elem_a)


def relaxation_table() -> List[Dict[str, Any]]:
    """Every cause (and the default) at every same-dtype class and at float32 vs float64 and bfloat16 vs float32:
    ``[{"cause", "dtypes", "rel_l2", "cosine", "rtol", "atol"}, ...]`` -- the table docs/method.md shows."""
    pairs = [(n, n) for n in ("float64", "float32", "tfloat32", "float16", "bfloat16", "float8_e4m3fn")]
    pairs += [("float32", "float64"), ("bfloat16", "float32"), ("float16", "float32")]
    rows = []
    for cause in [None] + list(Relax):
        for a, e in pairs:
            u = max(UNIT_ROUNDOFF[a], UNIT_ROUNDOFF[e])
            cls = DtypeClass(a if UNIT_ROUNDOFF[a] >= UNIT_ROUNDOFF[e] else e, u, a != e, (a, e))
            b = t1_band(cause, cls)
            rows.append({"cause": cause.value if cause else "(none: T1 default)",
                         "dtypes": a if a == e else f"{a} vs {e}", **dataclasses.asdict(b)})
    return rows


class TransparencyFinding(ValueError):
    """A T1 (transparent) gate was asked for a tolerance the method does not allow.

    Raised before any comparison: bars looser than the T1 default without a named cause, or looser than
    the outer band with one. The method treats this as a finding to investigate, never a tolerance to widen.
    """


class _GateError(Exception):
    """What a gate raises when it does not pass (the base of :class:`GateFailure` and :class:`EvidenceMissing`).
    ``.stats`` is the PairedStats, ``.checks`` the list of Check."""

    def __init__(self, message: str, stats: Any = None, checks: Sequence["Check"] = (), *,
                 name: Optional[str] = None):
        super().__init__(message)
        self.stats = stats
        self.checks = list(checks)
        self.name = name
        #: the individual failures when this one reports several (soft mode, leaves of a structure)
        self.failures: List["_GateError"] = [self]

    @property
    def failed_statistics(self) -> List[str]:
        """The names of the gated statistics that missed their bars (``"rel_l2"``, ``"cosine"``, ...), each once, in
        the order of the checks (of every failed gate, when this error reports several)."""
        return list(dict.fromkeys(c.statistic for c in self.checks if c.gating and not c.passed))


class GateFailure(_GateError, AssertionError):
    """A gate's statistics missed their bars (an ``AssertionError``). ``.stats`` is the PairedStats, ``.checks``
    the list of Check."""


class PlantedFaultWhileCalibrating(Exception):
    """A T2 gate or a tightened T1 gate (``tighten=k``) under ``pytest --vgct-calibrate`` inside
    :func:`vgct_ext.expect_gate_failure`, or while such a block is open elsewhere in the process (another thread
    or asyncio task: the gate may be running the planted fault's code): such gates record instead of gating at
    their evidence there, so a planted fault cannot be checked, and a faulty run must never become evidence.
    Raised by the gate before anything is recorded; ``expect_gate_failure`` ends its block quietly on it (the
    fault is checked in the gating run).  Outside a planted-fault block it fails the calibrating test, naming
    the open block as the reason."""


class EvidenceMissing(_GateError):
    """A T2 gate (or a tightened T1 gate) found no usable calibration evidence for the current stratum (or
    evidence that does not fit): the gate did not run.  The test fails, but it is neither a
    :class:`GateFailure` nor an ``AssertionError``: a planted-fault check written as
    ``pytest.raises(GateFailure)`` or ``pytest.raises(AssertionError)`` must not pass when no gate ran (new-user
    trial, 2026-12-01: a module of planted faults without evidence passed all its checks; review of 2026-12-05:
    the same through ``pytest.raises(AssertionError)``).  In a test under the plugin, one that is caught
    and does not fail the test (``pytest.raises(Exception)``, a broad ``except``, an ``xfail``) fails it anyway
    (or the session): the gate never ran; since 2026-12-05 (review of the plugin) in a plain test too.  To check
    EvidenceMissing on purpose use :func:`expect_evidence_missing`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._expected = False  # set by expect_evidence_missing's block that caught it (the plugin then skips it)
        t = _context.current_test()
        if t is not None:
            t.missing.append(self)


@contextlib.contextmanager
def expect_evidence_missing(match: Optional[str] = None) -> Iterator[Any]:
    """Assert that the block raises :class:`EvidenceMissing` -- for a test of the evidence wiring itself (a
    wrapper's calibration hint, an entry that must not apply), never around a planted fault.

    Under the plugin an EvidenceMissing that a test catches fails the test anyway (a broad ``except`` or
    ``pytest.raises(Exception)`` around a gate without evidence would otherwise pass: the gate never ran); this
    block is the one place where catching it is meant.  ``match``: a regular expression searched in the error's
    message (``re.search``), as ``pytest.raises(match=)``.  Yields pytest's ``ExceptionInfo`` (``.value`` is the
    error).  Raises pytest's ``Failed`` (an ``OutcomeException``) when the block raises nothing, an
    ``AssertionError`` when the message does not match (``ExceptionInfo.match``, as ``pytest.raises``); lets every other exception through (a GateFailure included), and an EvidenceMissing that also
    reports a gate's failure (a soft block's, a structure's leaves) too: a missed bar is never expected.  Under
    ``--vgct-calibrate`` in a paired test, where gates record instead of gating, the block records nothing and
    ends quietly (as a planted-fault block; its ExceptionInfo stays empty: read it only when not
    ``vgct.calibrating``).  Needs pytest (imported on call).
    """
    __tracebackhide__ = True
    import pytest

    s, t = _context.current_session(), _context.current_test()
    if s is not None and s.calibrate and t is not None and t.paired:
        info = pytest.ExceptionInfo.for_later()
        try:
            with _hard_gates(expecting=True):  # (its T2 gates raise PlantedFaultWhileCalibrating, recording none)
                yield info
        except PlantedFaultWhileCalibrating:
            return
        except EvidenceMissing as exc:  # (not a gate's: a wrapper's own, say -- checked as when gating)
            info.fill_unfilled((type(exc), exc, exc.__traceback__))
        else:
            return
    else:
        with pytest.raises(EvidenceMissing) as info:
            yield info
    if match is not None:
        info.match(match)  # (pytest's own check, as pytest.raises(match=) makes it)
    failures = [info.value, *getattr(info.value, "failures", ())]
    if any(not isinstance(e, EvidenceMissing) for e in failures):
        raise info.value  # (hostile review: a missed bar of one leaf rode out with another leaf's EvidenceMissing)
    for e in failures:
        e._expected = True


# --------------------------------------------------------------------------------------------------------------
# Checks and messages


@dataclasses.dataclass(frozen=True)
class Check:
    """One statistic against its bar. ``op`` is ``"<="``, ``">="`` or ``"=="``; ``gating=False`` only reports."""

    statistic: str
    label: str
    value: Optional[float]
    op: str = "<="
    bar: Optional[float] = None
    gating: bool = True
    note: str = ""

    @property
    def passed(self) -> bool:
        if not self.gating:
            return True
        if self.value is None or self.bar is None:
            return False
        v = float(self.value)
        if math.isnan(v):
            return False
        if self.op == "<=":
            return v <= self.bar
        if self.op == ">=":
            return v >= self.bar
        if self.op == "==":
            return v == self.bar
        raise ValueError(f"unknown comparison {self.op!r}")

    @property
    def margin(self) -> Optional[float]:
        """Signed distance to the bar: positive is headroom, negative is how far the statistic missed it."""
        if self.value is None or self.bar is None:
            return None
        if isinstance(self.value, int) and isinstance(self.bar, int):
            v: float = self.value
        else:
            v = float(self.value)
        return v - self.bar if self.op == ">=" else self.bar - v

    def as_dict(self) -> Dict[str, Any]:
        return {"statistic": self.statistic, "label": self.label, "value": _jsonable(self.value), "op": self.op,
                "bar": _jsonable(self.bar), "margin": _jsonable(self.margin), "gating": self.gating,
                "passed": self.passed, "note": self.note}


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return repr(v)
    return v


def fmt_value(statistic: str, v: Any) -> str:
    """Format a statistic for a table: cosine with 8 decimals, counts as integers, the rest as %.4e."""
    if v is None:
        return "undefined"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return str(v)
    v = float(v)
    if statistic.startswith("cosine"):
        return f"1 - {1.0 - v:.3e}" if 0.99999999 <= v < 1.0 else f"{v:.8f}"
    return f"{v:.4e}"


def fmt_margin(m: Optional[float]) -> str:
    if m is None:
        return "n/a"
    return f"{m:+d}" if isinstance(m, int) else f"{m:+.3e}"


def _fmt_elem(v: Any) -> str:
    return "n/a" if v is None else f"{float(v):.9g}"


def check_table(checks: Sequence[Check]) -> List[str]:
    """The checks as aligned text rows: statistic, value, bar, margin, verdict, note."""
    rows = [("statistic", "value", "bar", "margin", "verdict", "")]
    for c in checks:
        bar = "(reported)" if not c.gating else f"{c.op} {fmt_value(c.statistic, c.bar)}"
        verdict = "-" if not c.gating else ("ok" if c.passed else "FAIL")
        rows.append((c.label, fmt_value(c.statistic, c.value), bar, fmt_margin(c.margin) if c.gating else "",
                     verdict, c.note))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return ["  " + "  ".join([r[i].ljust(widths[i]) for i in range(5)] + [r[5]]).rstrip() for r in rows]


def diagnostics(stats: Any, *, mismatch: bool = True) -> List[str]:
    """Worst element, worst mismatch, worst slice (when ``dim`` was given) and the non-finite counts."""
    lines = []
    if stats.max_abs_err_index is not None:
        lines.append(f"  worst element: index {tuple(stats.max_abs_err_index)}: actual "
                     f"{_fmt_elem(stats.max_abs_err_actual)}, expected {_fmt_elem(stats.max_abs_err_expected)}, "
                     f"|a-e| {fmt_value('max_abs_err', stats.max_abs_err)}")
    if mismatch and getattr(stats, "worst_mismatch_index", None) is not None and stats.mismatches:
        lines.append(f"  worst mismatch: index {tuple(stats.worst_mismatch_index)} exceeds atol + rtol*|e| by "
                     f"{fmt_value('x', stats.worst_mismatch_excess)} (rtol={stats.rtol:g}, atol={stats.atol:g})")
    if getattr(stats, "max_rel_err", None) is not None and stats.max_rel_err_index is not None:
        lines.append(f"  max relative error |a-e|/|e| (over e != 0; unbounded where e is near 0, so it "
                     f"need not point at the bug): {fmt_value('x', stats.max_rel_err)} at index "
                     f"{tuple(stats.max_rel_err_index)}")
    sl = getattr(stats, "slices", None)
    if sl is not None:
        nd = len(getattr(stats, "shape", ()) or ())
        axis = f"dim {sl.dim}" + (f" (= {sl.dim - nd})" if nd and sl.dim >= 0 else "")  # as dim=-1 was written
        try:
            k = int(sl.worst())
            lines.append(
                f"  worst slice along {axis}: index {k} of {len(sl.count)}: relative L2 "
                f"{fmt_value('rel_l2', _nan_none(sl.rel_l2[k]))}, max abs error "
                f"{fmt_value('x', _nan_none(sl.max_abs_err[k]))}, mean shift "
                f"{fmt_value('x', _nan_none(sl.mean_shift[k]))} (reference RMS "
                f"{fmt_value('x', _nan_none(sl.ref_rms[k]))}, {int(sl.count[k])} finite pairs)")
        except (ValueError, IndexError, TypeError):
            lines.append(f"  worst slice along {axis}: none (no finite pair in any slice)")
    lines.append(f"  non-finite: actual NaN {stats.nan_actual}, +Inf {stats.posinf_actual}, -Inf "
                 f"{stats.neginf_actual}; expected NaN {stats.nan_expected}, +Inf {stats.posinf_expected}, -Inf "
                 f"{stats.neginf_expected}; {stats.n_class_mismatch} positions differ in class"
                 + (f" (first at {tuple(stats.first_class_mismatch_index)})"
                    if stats.first_class_mismatch_index is not None else ""))
    return lines


def _nan_none(v: Any) -> Optional[float]:
    v = float(v)
    return None if math.isnan(v) else v


def header(gate: str, component: str, feature: str, stats: Any, extra: str = "", *,
           name: Optional[str] = None) -> List[str]:
    label = f", name {name!r}" if name else ""
    return [f"{gate}: component {component!r}, feature {feature!r}{label}{extra}",
            f"  actual {stats.dtype_actual} vs expected {stats.dtype_expected}, shape {tuple(stats.shape)}, "
            f"n={stats.n}, device {describe_device(stats.device)}"]


def _common_checks(stats: Any) -> List[Check]:
    checks = []
    if stats.n == 0:
        checks.append(Check("n", "elements compared", 0, ">=", 1,
                            note="an empty comparison proves nothing"))
    checks.append(Check("non_finite_pairs", "non-finite pairs", stats.n - stats.n_finite, "==", 0))
    return checks


def _reported(stats: Any) -> List[Check]:
    out = [Check("max_abs_err", "max abs error", stats.max_abs_err, gating=False)]
    for p in sorted(stats.quantiles):
        out.append(Check(f"p{_pct(p)}", f"p{_pct(p)} abs error", stats.quantiles[p], gating=False))
    out.append(Check("mean_diff", "mean(a-e)", stats.mean_diff, gating=False))
    return out


def _pct(p: float) -> str:
    s = f"{p * 100:.6g}"
    return s


def _quantiles(q: Sequence[float]) -> Tuple[float, ...]:
    qs = tuple(float(x) for x in q)
    return qs if 0.99 in qs else qs + (0.99,)


def _check_names(component: str, feature: str) -> None:
    for n, v in (("component", component), ("feature", feature)):
        if not isinstance(v, str) or not v.strip():
            raise TypeError(f"{n} must be a non-empty string naming the {n} under test, got {v!r}")


# --------------------------------------------------------------------------------------------------------------
# Labels, slack, structured outputs, soft mode


def _refusals_tracked(gate: Any) -> Any:
    """``gate`` (assert_t1, assert_t2) noting on the running paired test each exception it raises that is not a
    gate's verdict (GateFailure, EvidenceMissing) -- a refusal of its arguments: a TransparencyFinding, an
    AmbiguousGate, a shape or device mismatch.  The plugin fails a paired test that catches one and passes (a
    ``pytest.raises(Exception)`` planted-fault check around a gate whose bars exceed the band passed without a
    fault: new-user trial of 2026-12-05), or whose xfail absorbs it: the gate measured nothing."""

    @functools.wraps(gate)
    def tracked(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        try:
            return gate(*args, **kwargs)
        except (_GateError, PlantedFaultWhileCalibrating):
            raise
        except Exception as exc:
            _note_refusal(exc)
            raise

    return tracked


def _note_refusal(exc: BaseException) -> None:
    """Note ``exc``, a refusal of a gate's arguments, on the running paired test (once): the plugin fails a test
    that catches it (:func:`_refusals_tracked`; the ``vgct`` fixture's own refusals too)."""
    t = _context.current_test()
    if t is not None and t.paired and all(e is not exc for e in t.refused):
        t.refused.append(exc)


def _evidence_gate_called() -> None:
    """Count a gate that reads recorded evidence (assert_t2, a tightened assert_t1) for the running test, whatever
    its outcome: the plugin fails a ``t2``-marked test that called none (it checked nothing against evidence)."""
    t = _context.current_test()
    if t is not None:
        t.evidence_gates += 1


def _check_label(name: Optional[str]) -> None:
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise TypeError(f"name must be a non-empty string labelling this gate, or None; got {name!r}")


def first_line(gate: str, checks: Sequence[Check], component: str, feature: str, name: Optional[str] = None,
               extra: str = "") -> str:
    """The first line of a failure message: the failing statistics, each measured against its bar, then
    component, feature and label. It is what ``pytest -rf`` and ``--tb=line`` show."""
    failed = [c for c in checks if c.gating and not c.passed]
    parts = []
    for c in failed:
        if c.statistic == "mismatches":
            parts.append(f"{c.value} elements beyond atol+rtol*|e| (bar 0; {c.note.split(';')[0]})")
        else:
            parts.append(f"{c.label} {fmt_value(c.statistic, c.value)} (bar {c.op} {fmt_value(c.statistic, c.bar)})")
    label = f" [{name}]" if name else ""
    what = "; ".join(parts) if parts else "no statistic failed"
    return f"{gate}{label}: {what} -- component {component!r}, feature {feature!r}{extra}"


#: Gated statistics that are counts (bar 0 or 1): they have no headroom ratio.
_COUNT_STATISTICS = ("mismatches", "non_finite_pairs", "n", "evidence")
#: A passing gate whose bars are more than this many times its measurement is reported as slack.
SLACK_WARNING = 100.0


def slack(checks: Sequence[Check]) -> Optional[float]:
    """The smallest headroom ratio of the gated statistics: ``bar / measured`` for an upper bound,
    ``(1 - bar) / (1 - measured)`` for cosine (a lower bound). Below 1 the gate failed; above
    :data:`SLACK_WARNING` (100) the bars are far looser than what was measured (tighten them: see
    docs/method.md). ``None`` when no gated statistic has a positive measurement (bitwise equal, or a
    statistic undefined): then no ratio exists.
    """
    ratios = [r for r in (check_ratio(c.statistic, c.op, c.value, c.bar, c.gating) for c in checks)
              if r is not None]
    return min(ratios) if ratios else None


def check_ratio(statistic: str, op: str, value: Any, bar: Any, gating: bool) -> Optional[float]:
    """One gated statistic's headroom ratio as :func:`slack` takes it (0.0 for a NaN measurement), or None
    when it has none (not gating, a count, no bar or value, 1 - cosine under the cosine's resolution, or a
    zero measurement).  The report puts a gate's slack on the row of the statistic with the smallest ratio."""
    if not gating or value is None or bar is None or statistic in _COUNT_STATISTICS:
        return None
    v = float(value)
    if math.isnan(v):
        return 0.0
    num, den = (1.0 - float(bar), 1.0 - v) if op == ">=" else (float(bar), v)
    if op == ">=" and den < COSINE_RESOLUTION:
        return None  # 1 - cosine below the float64 cosine's own resolution: no measurable distance
    return max(num, 0.0) / den if den > 0 else None


def _key_path(k: Any) -> str:
    return f'["{k}"]' if isinstance(k, str) else f"[{k!r}]"


def _is_mapping(x: Any) -> bool:
    return isinstance(x, Mapping)


def _is_sequence(x: Any) -> bool:
    return isinstance(x, (tuple, list))


def _kind(x: Any) -> str:
    if _is_mapping(x):
        return f"a {type(x).__name__} with keys {list(x.keys())!r}"
    if _is_sequence(x):
        return f"a {type(x).__name__} of {len(x)}"
    return f"a {type(x).__name__}"


def paired_leaves(actual: Any, expected: Any, name: Optional[str] = None) -> List[Tuple[Optional[str], Any, Any]]:
    """``[(path, actual_leaf, expected_leaf), ...]`` of two outputs of the same structure.

    A single tensor (anything that is not a tuple, list or mapping) gives ``[(name, actual, expected)]``. Nested
    tuples/lists (a tuple may pair with a list of the same length) and mappings (same keys; order of
    ``expected``) give one entry per tensor leaf, its path written from the root ``name`` (default ``"out"``):
    ``out[0]``, ``out["sample"]``, ``out[1]["k"]``. ``None`` leaves must pair with ``None`` and are skipped;
    other non-tensor leaves (numbers, strings) must be equal and are skipped.
    Raises ``ValueError`` naming the path where the two structures differ (type, length, keys, unequal
    non-tensor leaves) or when a structure holds no tensor.
    """
    if not (_is_mapping(actual) or _is_sequence(actual) or _is_mapping(expected) or _is_sequence(expected)):
        return [(name, actual, expected)]
    out: List[Tuple[Optional[str], Any, Any]] = []

    def walk(path: str, a: Any, e: Any) -> None:
        if _is_mapping(a) or _is_mapping(e):
            if not (_is_mapping(a) and _is_mapping(e)):
                raise ValueError(f"actual and expected differ in structure at {path}: actual is {_kind(a)}, "
                                 f"expected {_kind(e)}")
            only_a = [k for k in a if k not in e]
            only_e = [k for k in e if k not in a]
            if only_a or only_e:
                raise ValueError(f"actual and expected differ in keys at {path}: only in actual {only_a!r}, only "
                                 f"in expected {only_e!r}")
            for k in e:
                walk(path + _key_path(k), a[k], e[k])
            return
        if _is_sequence(a) or _is_sequence(e):
            if not (_is_sequence(a) and _is_sequence(e)) or len(a) != len(e):
                raise ValueError(f"actual and expected differ in structure at {path}: actual is {_kind(a)}, "
                                 f"expected {_kind(e)}")
            for i, (x, y) in enumerate(zip(a, e)):
                walk(f"{path}[{i}]", x, y)
            return
        tensors = (hasattr(a, "__dlpack__"), hasattr(e, "__dlpack__"))
        if tensors == (True, True):
            out.append((path, a, e))
        elif tensors == (False, False):
            if a is None and e is None:
                return
            try:
                same = bool(a == e)
            except Exception:  # noqa: BLE001 - an object without a truthful ==
                same = False
            if not same and isinstance(a, float) and isinstance(e, float) and math.isnan(a) and math.isnan(e):
                same = True  # a NaN scalar leaf on both sides is the same leaf, not a structure difference
            if not same:
                raise ValueError(f"actual and expected differ at {path} (not tensors): actual {a!r}, "
                                 f"expected {e!r}")
        else:
            raise ValueError(f"actual and expected differ in structure at {path}: actual is {_kind(a)}, expected "
                             f"{_kind(e)} (a tensor pairs only with a tensor)")

    walk(name or "out", actual, expected)
    if not out:
        raise ValueError(f"no tensor to compare in {name or 'out'}: the structures hold no tensor leaf")
    return out


def is_structure(x: Any) -> bool:
    """Whether a gate treats ``x`` as a structure of leaves (a tuple, list or mapping) rather than a tensor."""
    return _is_mapping(x) or _is_sequence(x)


# Soft mode.  A stack of entries per context (context variables: per thread, and per asyncio task), innermost last:
# a _Collect gathers failures (soft_gates), a _Raise makes gates raise (expect_gate_failure).  An entry counts only
# while its block is open -- it is closed when the block is left, wherever that happens (a generator finished in
# another thread, a task that outlives the block), and the pytest plugin closes what a test leaves open -- and only
# in the thread that opened it (a thread-local token: a context copied into another thread, as Python 3.14's
# free-threaded builds copy it into new threads, keeps the entries but they are skipped there, even when the OS
# reuses a dead thread's id).  Process-wide state let one thread's soft block swallow another thread's failing gate
# (that gate returned, its test passed) and one thread's planted fault mark another thread's records.
# Separately, _OPEN holds every open entry of the process: while any of them is a planted-fault block, no thread
# records calibration evidence (a faulty run must never become evidence).
_THREAD = threading.local()


def _thread_token() -> object:
    """An object unique to the calling thread for its lifetime (unlike its id, never reused by a later thread)."""
    tok = getattr(_THREAD, "token", None)
    if tok is None:
        tok = _THREAD.token = object()
    return tok


class _Entry:
    """A soft-mode stack entry: open until closed (when its block is left); owned by the thread that opened it."""

    def _own(self) -> None:
        self.open = True
        self.owner = _thread_token()
        self.session = _context.current_session()  # (a pytest run inside a test must not take the test's)
        with _OPEN_LOCK:
            _OPEN.add(self)

    def live(self) -> bool:
        """Whether this entry counts here: its block is open and this is its thread."""
        return self.open and self.owner is _thread_token()

    def close(self) -> None:
        """Never count again (idempotent)."""
        self.open = False
        with _OPEN_LOCK:
            _OPEN.discard(self)


class _Collect(list, _Entry):
    """A soft-mode stack entry that collects failures (the list :func:`soft_gates` yields); ``reported``: the
    pytest plugin already failed a test with them (a block the test left open), so its block's end is quiet."""

    __hash__ = object.__hash__  # by identity (in _OPEN), while == still compares the failures like a list

    def __init__(self) -> None:
        super().__init__()
        self.reported = False
        self._own()


class _Raise(_Entry):
    """A soft-mode stack entry under which gates raise; ``expecting``: an expect_gate_failure block."""

    def __init__(self, expecting: bool = False) -> None:
        self.expecting = expecting
        self.records: List[Dict[str, Any]] = []  # the block's gate records (expecting only)
        self._own()


_SOFT: "contextvars.ContextVar[Tuple[_Entry, ...]]" = contextvars.ContextVar("vgct_soft_gates", default=())
_OPEN: "set[_Entry]" = set()  # every open entry of the process, any thread or context (under _OPEN_LOCK)
_OPEN_LOCK = threading.Lock()
_UNREPORTED: List[Tuple[Any, _GateError]] = []  # (the innermost pytest session then, the failures of a soft block
#                                                   ended by GeneratorExit/CancelledError): the plugin reports them


def _take_unreported() -> List[_GateError]:
    """The failures of :data:`_UNREPORTED` that are the innermost session's (:func:`_context.is_current`),
    removed; call under _OPEN_LOCK."""
    mine = [f for session, f in _UNREPORTED if _context.is_current(session)]
    _UNREPORTED[:] = [x for x in _UNREPORTED if not _context.is_current(x[0])]
    return mine


def _planted_block() -> Optional[_Raise]:
    """The innermost :func:`vgct_ext.expect_gate_failure` block of this thread open in this context, or None."""
    for x in reversed(_SOFT.get()):
        if isinstance(x, _Raise) and x.expecting and x.live():
            return x
    return None


def _expecting() -> bool:
    """Whether a gate here runs inside an :func:`vgct_ext.expect_gate_failure` block of this thread."""
    return _planted_block() is not None


def _planted_open() -> bool:
    """Whether an :func:`vgct_ext.expect_gate_failure` block is open anywhere in this process (this thread's
    included): then nothing may be recorded as calibration evidence."""
    with _OPEN_LOCK:
        return any(isinstance(x, _Raise) and x.expecting for x in _OPEN)


def _planted_message(gate: str, component: str, feature: str) -> str:
    """Why a calibrating ``gate`` records nothing: it runs inside a planted-fault block, or one is open elsewhere
    in the process."""
    if _expecting():
        return (f"planted fault around the {gate} of {component!r} | {feature!r}: not checked under "
                f"--vgct-calibrate ({gate}s record instead of gating there) and not recorded; the fault is checked "
                f"in the gating run")
    return (f"{gate} of {component!r} | {feature!r} under --vgct-calibrate while an expect_gate_failure block is "
            f"open elsewhere in this process (another thread or asyncio task): nothing is recorded meanwhile, "
            f"since the gate may be running the planted fault's code; calibrate it outside that block")


def _collector() -> Optional[_Collect]:
    """The innermost live entry's collector, or None when it is a _Raise or there is none (gates raise)."""
    for x in reversed(_SOFT.get()):
        if x.live():
            return x if isinstance(x, _Collect) else None
    return None


@contextlib.contextmanager
def _pushed(entry: _Entry) -> Iterator[None]:
    """``entry`` on top of this context's soft-mode stack for the block.  On leaving it is closed (it never counts
    again, whichever context still holds it) and the leaving context's stack drops it and every closed entry."""
    try:
        _SOFT.set(_SOFT.get() + (entry,))
        yield
    finally:
        entry.close()
        _SOFT.set(tuple(x for x in _SOFT.get() if x.open))


def _test_begin() -> Tuple[Any, "set[_Entry]"]:
    """For the pytest plugin: the running test starts with an empty soft-mode stack; returns what
    :func:`_test_end` needs (the entries open before the test, in any thread or context)."""
    with _OPEN_LOCK:
        before = set(_OPEN)
    return _SOFT.set(()), before


def _test_end(state: Tuple[Any, "set[_Entry]"]) -> List[str]:
    """For the pytest plugin, after the test: close every block opened during the test and still open -- in any
    thread or context (a suspended generator, an async test's task, a pool's worker) -- restore the stack, and
    say what was lost: failures collected by such a block or by one ended by GeneratorExit/CancelledError, and
    planted-fault blocks never left, as lines for the test's failure (empty: nothing).  Only the innermost
    session's (:func:`vgct_ext.method._context.is_current`): a pytest run inside a test (pytester) neither
    takes nor closes what the test around it left or opened."""
    token, before = state
    _SOFT.reset(token)
    with _OPEN_LOCK:
        left = [x for x in _OPEN if x not in before and _context.is_current(x.session)]
        unreported = _take_unreported()
    lost: List[_GateError] = [f for x in left if isinstance(x, _Collect) for f in x] + unreported
    for x in left:
        x.close()
        if isinstance(x, _Collect):
            x.reported = True
    problems = [f"a gate failure collected by a soft_gates block that never reported it (left open, or ended "
                f"by GeneratorExit/CancelledError): {str(f).splitlines()[0]}" for f in lost]
    me = _thread_token()  # (an empty soft block of another thread -- a fixture's consumer thread, joined in its
    # teardown -- is closed, its later gates then raise there, but it is not a problem of the test's)
    n_soft = sum(isinstance(x, _Collect) and (x.owner is me or len(x) > 0) for x in left)
    n_planted = sum(isinstance(x, _Raise) and x.expecting for x in left)
    if n_soft:
        problems.append(f"{n_soft} soft_gates block(s) left open by the test (a suspended generator or task?): "
                        f"closed now")
    if n_planted:
        problems.append(f"{n_planted} expect_gate_failure block(s) left open by the test: the planted fault was "
                        f"never checked")
    return problems


def _drain_unreported(when: str = "") -> List[str]:
    """For the pytest plugin, after a test's teardown and at the session's end: the failures of soft blocks
    ended by GeneratorExit/CancelledError since the last look (a fixture's teardown), as lines (``when``:
    where, for the line)."""
    with _OPEN_LOCK:
        unreported = _take_unreported()
    return [f"a gate failure collected by a soft_gates block ended by GeneratorExit/CancelledError{when}: "
            f"{str(f).splitlines()[0]}" for f in unreported]


def _session_end() -> List[str]:
    """For the pytest plugin, at the session's end (after the last test and the session fixtures' teardown):
    the gate failures no test reported -- collected by a soft block ended by GeneratorExit/CancelledError after
    the last test's teardown, or held by a soft_gates block still open outside every test -- as lines for the
    session's failure (empty: nothing); the blocks are marked reported.  Only the innermost session's: a
    block the test around a pytest run inside it (pytester) holds open is that test's.  Called at the start of the plugin's
    pytest_sessionfinish and again after every implementation of it; a failure collected later (interpreter
    exit) can only be warned about."""
    with _OPEN_LOCK:
        held = [x for x in _OPEN if isinstance(x, _Collect) and x and not x.reported and _context.is_current(x.session)]
        for x in held:
            x.reported = True
    return (_drain_unreported(" after the last test") +
            [f"a gate failure held by a soft_gates block open outside every test: {str(f).splitlines()[0]}"
             for x in held for f in x])


def _combine(failures: Sequence[_GateError], what: str) -> _GateError:
    """One exception for several gate failures: an :class:`EvidenceMissing` when any of them is one (a gate
    that did not run is never reported as a GateFailure), else a :class:`GateFailure`."""
    if len(failures) == 1:
        return failures[0]
    heads = [str(f).split("\n", 1)[0] for f in failures]
    body = "\n".join(f"[{i + 1}/{len(failures)}] {str(f)}" for i, f in enumerate(failures))
    missing = sum(isinstance(f, EvidenceMissing) for f in failures)
    if missing:  # say which failed and which could not run: a reader must not just recalibrate
        first = (f"{len(failures)} {what} did not pass ({len(failures) - missing} failed, {missing} could not run: "
                 f"no usable evidence): " + " || ".join(heads))
    else:
        first = f"{len(failures)} {what} failed: " + " || ".join(heads)
    checks = [c for f in failures for c in f.checks]
    cls = EvidenceMissing if missing else GateFailure
    exc = cls(first + "\n" + body, None, checks)
    exc.failures = list(failures)
    return exc


def _raise_or_collect(failures: Sequence[_GateError], gate: str, component: str, feature: str) -> None:
    __tracebackhide__ = True
    if not failures:
        return
    exc = _combine(failures, f"{gate} gates on leaves of one output ({component!r}, {feature!r})")
    into = _collector()
    if into is not None:
        into.append(exc)
        return
    raise exc


def _is_cancel(exc: BaseException) -> bool:
    """Whether ``exc`` cancels an asyncio task (asyncio.CancelledError; imported only when asyncio is)."""
    asyncio = sys.modules.get("asyncio")
    return asyncio is not None and isinstance(exc, asyncio.CancelledError)


@gate_block
def soft_gates() -> Iterator[List[_GateError]]:
    """Run every gate in the block and report all failures at its end.

    Inside the block a failing :func:`assert_t1` / :func:`assert_t2` records its failure (statistics, summary
    table, report as usual) and returns its statistics instead of raising; the block yields the list the failures
    are collected in. On leaving the block one :class:`GateFailure` is raised when any gate failed (an
    :class:`EvidenceMissing` when any T2 gate found no usable evidence; a tightened T1 gate without a recorded
    floor raises EvidenceMissing at once): its first line names every failed gate with its failing statistics,
    the rest holds each gate's full message, ``.failures`` the individual exceptions and ``.checks`` all their
    checks. When the block itself raises after a gate failed, that failure is raised, chained from the block's
    exception (``__cause__``; the failures are also added to it as a note), so a ``pytest.raises`` around the
    block (nor a ``pytest.skip``/``xfail`` in it) cannot hide it; KeyboardInterrupt and SystemExit propagate as
    they are, and so do GeneratorExit and asyncio's CancelledError, the failures then reported by the pytest
    plugin at the end of the test (after the last test: at the session's end, failing the session). Without a
    gate failure the block's exception propagates unchanged. Blocks nest; a failure belongs to the innermost
    block. The block belongs to the thread that opens it: a gate run in
    another thread meanwhile raises there as usual -- also in a thread started inside the block. asyncio tasks
    created inside the block share it while it is open (their failures are collected when they run before it
    ends); a gate that runs after the block has ended raises, wherever the block's context was copied. Also
    ``vgct.soft()`` on the pytest fixture.
    """
    __tracebackhide__ = True
    collected = _Collect()
    try:
        with _pushed(collected):
            yield collected
    except BaseException as exc:
        if not collected or collected.reported:
            raise
        if hasattr(exc, "add_note"):
            exc.add_note("vgct soft_gates: also failed in this block:\n" +
                         "\n".join(str(f).split("\n", 1)[0] for f in collected))
        if not isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit)) and not _is_cancel(exc):
            # the block's failures are never lost to its exception (pytest.skip/xfail/fail included)
            raise _combine(collected, "gates") from exc
        if isinstance(exc, GeneratorExit) or _is_cancel(exc):  # closing or cancelling must stay what it is
            lost = _combine(collected, "gates")
            with _OPEN_LOCK:
                _UNREPORTED.append((_context.current_session(), lost))  # the pytest plugin fails the test with them
            warnings.warn(f"vgct soft_gates: a block ended by {type(exc).__name__} had collected gate failures, "
                          f"which cannot be raised there: {str(lost).splitlines()[0]}", RuntimeWarning, stacklevel=3)
        raise
    if collected and not collected.reported:
        raise _combine(collected, "gates")


@contextlib.contextmanager
def _hard_gates(expecting: bool = False) -> Iterator["_Raise"]:
    """Gates raise inside this block even within :func:`soft_gates` (for ``expect_gate_failure``); with
    ``expecting`` their records are marked ``"expected_failure": True`` and kept in the yielded entry's
    ``records`` (what the planted fault's gates measured)."""
    entry = _Raise(expecting)
    with _pushed(entry):
        yield entry


def _of_record(exc: "GateFailure", rec: Dict[str, Any]) -> "GateFailure":
    """``exc`` tied to the gate's record (the session's dict): the pytest plugin marks the record of a verdict an
    xfail absorbed (``rec["xfailed"]``, named under the summary)."""
    exc._vgct_record = rec
    return exc


def _record(kind: str, component: str, feature: str, stats: Any, checks: Sequence[Check], *,
            extra: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    try:
        stratum = stratum_of(stats.device)
    except RuntimeError:
        stratum = None
    rec: Dict[str, Any] = {
        "kind": kind, "component": component, "feature": feature,
        "dtype_actual": stats.dtype_actual, "dtype_expected": stats.dtype_expected,
        "shape": list(stats.shape), "device": stats.device, "stratum": stratum,
        "statistics": {"rel_l2": stats.rel_l2, "cosine": stats.cosine, "max_abs_err": stats.max_abs_err,
                       **{f"p{_pct(p)}": v for p, v in stats.quantiles.items()},
                       "mismatches": stats.mismatches, "n": stats.n, "n_finite": stats.n_finite,
                       "n_unequal": stats.n_unequal, "zero_reference": stats.zero_reference},
        "checks": [c.as_dict() for c in checks],
        "passed": all(c.passed for c in checks),
    }
    session = _context.current_session()
    if session is not None and session.repeat > 1:  # only --vgct-repeat compares signatures
        rec["signature"] = signature(stats)
    if extra:
        rec.update(extra)
    rec.setdefault("name", None)
    rec.setdefault("slack", slack(checks))
    block = _planted_block()
    if block is not None:  # the innermost planted-fault block of this thread keeps it
        rec["expected_failure"] = True
        block.records.append(rec)
    return _context.record(rec)


_SIGNATURE_HEADLINE = ("rel_l2", "cosine", "max_abs_err", "quantiles", "mismatches", "n_unequal", "mean_diff", "n",
                       "n_finite")


def signature(stats: Any) -> Dict[str, str]:
    """A bounded, exact fingerprint of ``stats`` for ``--vgct-repeat``: the headline statistics as exact strings
    (floats via ``float.hex``) under ``.rel_l2``, ``.cosine``, ... (so a difference can be named), plus ``"#"``,
    the SHA-256 of every statistic (per-slice arrays included) in the same exact form. At most ~20 entries
    whatever the tensor size."""
    import hashlib

    h = hashlib.sha256()
    out: Dict[str, str] = {}

    def exact(v: Any) -> str:
        return v.hex() if isinstance(v, float) else repr(v)

    def walk(prefix: str, v: Any) -> None:
        if isinstance(v, dict):
            for k in sorted(v, key=str):
                walk(f"{prefix}.{k}", v[k])
        elif isinstance(v, (list, tuple)):
            h.update(f"{prefix}[{len(v)}]\x1e".encode())
            for x in v:
                walk(prefix + "[]", x)
        else:
            h.update(f"{prefix}={exact(v)}\x1e".encode())

    sl = getattr(stats, "slices", None)
    if sl is not None and hasattr(stats, "as_dict"):
        # the per-slice arrays by their bytes (exact: float64 bit patterns), not element by element: the walk
        # below would call float.hex ~5 times per slice (13 M calls for 300 gates over 4096 slices)
        h.update(f".slices.dim={sl.dim}\x1e".encode())
        for f in ("mean_shift", "rel_l2", "max_abs_err", "ref_rms", "count"):
            a = getattr(sl, f)
            h.update(f".slices.{f}:{a.dtype.str}{a.shape}\x1e".encode())
            h.update(a.tobytes())
        d = {f.name: getattr(stats, f.name) for f in dataclasses.fields(stats) if f.name != "slices"}
        d = {k: (dict(v) if isinstance(v, Mapping) else list(v) if isinstance(v, tuple) else v) for k, v in d.items()}
    else:
        d = stats.as_dict() if hasattr(stats, "as_dict") else dict(stats)
    for k in _SIGNATURE_HEADLINE:
        if k in d:
            v = d[k]
            if isinstance(v, dict):
                for q in sorted(v, key=str):
                    out[f".{k}.{q}"] = exact(v[q])
            else:
                out[f".{k}"] = exact(v)
    walk("", d)
    out["#"] = h.hexdigest()
    return out


# --------------------------------------------------------------------------------------------------------------
# T1


def resolve_t1_bars(relax: Union[Relax, str, None] = None, *, rel_l2: Optional[float] = None,
                    cosine: Optional[float] = None, rtol: Optional[float] = None, atol: Optional[float] = None,
                    component: str = "?", feature: str = "?",
                    dtypes: Optional[DtypeClass] = None) -> Tuple[T1Bars, Optional[Relax]]:
    """The bars a T1 gate will apply, or :class:`TransparencyFinding` when the request is too loose.

    The allowed band is :func:`t1_band` of ``relax`` at the dtype class ``dtypes`` (:func:`dtype_class`):
    without a cause the dtype-aware T1 default (ceiling :data:`T1_DEFAULT`), with a named cause the most that
    cause can legitimately move a comparison of those dtypes (ceiling :data:`OUTER_BAND`). A bar not given is
    the band's value; a bar given may be anywhere up to the band (tightening is always allowed). Without
    ``dtypes`` the ceiling is the band (used to validate a command line before any tensor is seen).

    Raises: ``TypeError`` (a bar that is not a finite number), ``ValueError`` (cosine outside (0, 1], a negative
    bar, ``relax`` not a named cause), :class:`TransparencyFinding` (a bar looser than the band).
    """
    cause = Relax.parse(relax) if relax is not None else None
    base = t1_band(cause, dtypes)
    given = {"rel_l2": rel_l2, "cosine": cosine, "rtol": rtol, "atol": atol}
    for name, v in given.items():
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise TypeError(f"assert_t1: {name} must be a finite number, got {v!r}")
        if name == "cosine" and not 0.0 < v <= 1.0:
            raise ValueError(f"assert_t1: cosine bar must lie in (0, 1], got {v!r}")
        if name != "cosine" and v < 0:
            raise ValueError(f"assert_t1: {name} bar must be >= 0, got {v!r}")
    looser = []
    for name, v in given.items():
        if v is None:
            continue
        lim = getattr(base, name)
        if (v < lim) if name == "cosine" else (v > lim):
            looser.append(f"{name} {'>=' if name == 'cosine' else '<='} {v:g} (allowed: {lim:.4g})")
    if looser:
        what = "; ".join(looser)
        at = f" for {dtypes.describe()}" if dtypes is not None else ""
        band = (f"relative L2 <= {base.rel_l2:.4g}, cosine >= {fmt_value('cosine', base.cosine)}, "
                f"rtol <= {base.rtol:.4g}, "
                f"atol <= {base.atol:.4g}")
        if cause is None:
            raise TransparencyFinding(
                f"T1 request refused for component {component!r}, feature {feature!r}: {what} is looser than the "
                f"T1 default{at} ({band}; the design card's 1e-2 / 0.9999 / 1e-3 is the ceiling) and no cause was "
                f"named. Widening a transparent feature's tolerance is a finding, not a fix: name the accumulation "
                f"cause with relax=vgct_ext.Relax.<cause> ({', '.join(m.value for m in Relax)}), which allows at "
                f"most what that cause can produce at these dtypes (docs/method.md, 'Relaxation scope'), or "
                f"investigate why the feature is not transparent.")
        raise TransparencyFinding(
            f"T1 request refused for component {component!r}, feature {feature!r} (relax: {cause.value}): {what} "
            f"is looser than what {cause.value!r} can produce{at} ({band}; the outer band relative L2 5e-2, cosine "
            f"0.999, rtol/atol 5e-2 is the ceiling). A supposedly transparent feature that needs a wider tolerance "
            f"is a finding: investigate it, or, if the feature is really lossy, gate it with assert_t2 on "
            f"calibrated evidence. The bar is never widened silently.")
    bars = T1Bars(**{k: float(getattr(base, k) if v is None else v) for k, v in given.items()})
    return bars, cause


_NO_FINITE_NOTE = "no finite pair was compared: no statistic is defined, nothing is proven"


def t1_checks(stats: Any, bars: T1Bars) -> List[Check]:
    checks: List[Check] = []
    if stats.zero_reference:
        note = (_NO_FINITE_NOTE if stats.n_finite == 0 else
                "zero-norm reference: relative L2 and cosine undefined, gating on absolute error <= atol")
        checks.append(Check("max_abs_err", "max abs error", stats.max_abs_err, "<=", bars.atol, note=note))
    else:
        checks.append(Check("rel_l2", "relative L2", stats.rel_l2, "<=", bars.rel_l2))
        checks.append(Check("cosine", "cosine similarity", stats.cosine, ">=", bars.cosine,
                            note="" if stats.cosine is not None else "undefined: ||actual||_2 = 0"))
    checks.append(Check("mismatches", "elements beyond atol+rtol*|e|",
                        stats.mismatches, "<=", 0,
                        note=f"rtol={bars.rtol:g}, atol={bars.atol:g}"
                        + (f"; {stats.mismatch_fraction:.3%} of finite pairs" if stats.mismatches else "")))
    checks += _common_checks(stats)
    if not stats.zero_reference:
        checks += _reported(stats)
    else:
        checks += [c for c in _reported(stats) if c.statistic != "max_abs_err"]
    return checks


def _dtype_of(x: Any) -> Optional[str]:
    """The dtype name of a tensor-like (torch, NumPy, CuPy, JAX) without importing any framework; None if the
    object does not say."""
    dt = getattr(x, "dtype", None)
    if dt is None:
        return None
    name = getattr(dt, "name", None)
    return _norm_dtype(name if isinstance(name, str) else dt)


def _device_of(x: Any) -> Optional[str]:
    dev = getattr(x, "device", None)
    return None if dev is None or not isinstance(str(dev), str) else str(dev)


def _gate_t1_leaf(actual: Any, expected: Any, *, component: str, feature: str, name: Optional[str],
                  relax: Union[Relax, str, None], given: Mapping[str, Optional[float]], dim: Optional[int],
                  quantiles: Sequence[float], tighten: Optional[float] = None,
                  evidence: Union[str, "os.PathLike[str]", None] = None) -> Tuple[Any, Optional[GateFailure]]:
    from vgct_ext import compare

    da, de = _dtype_of(actual), _dtype_of(expected)
    if da is None or de is None:  # a DLPack object that does not say its dtype: ask the engine once
        probe = compare(actual, expected, quantiles=())
        da, de = probe.dtype_actual, probe.dtype_expected
    cls = dtype_class(da, de, _device_of(actual))
    bars, cause = resolve_t1_bars(relax, **given, component=component, feature=feature, dtypes=cls)
    stats = compare(actual, expected, rtol=bars.rtol, atol=bars.atol, quantiles=_quantiles(quantiles), dim=dim)
    from .evidence import tighten_t1

    bars, tight = tighten_t1(bars, tighten, stats, component=component, feature=feature, label=name,
                             evidence=evidence)
    checks = t1_checks(stats, bars)
    passed = all(c.passed for c in checks)
    rec = _record("t1", component, feature, stats, checks,
            extra={"gate": "T1", "relax": cause.value if cause else None, "bars": dataclasses.asdict(bars),
                   "name": name, "slack": slack(checks), "dtype_class": cls.name, "unit_roundoff": cls.u,
                   "mixed_dtypes": cls.mixed, "coarse_reference": cls.coarse_reference, **tight})
    if passed:
        return stats, None
    relax_txt = f" (relax: {cause.value}; bars for {cls.describe()})" if cause else f" (bars for {cls.describe()})"
    used = tight.get("floor_used")
    if used:  # a tightened gate: say so, and (below) where its relative L2 and cosine bars came from
        relax_txt += f" (tighten={tight['tighten']:g} x the recorded floor)"
    lines = [first_line("T1 gate failed", checks, component, feature, name, relax_txt)]
    lines += header("T1 gate failed", component, feature, stats, relax_txt, name=name)[1:]
    if used:
        k = tight["tighten"]
        lines.append(f"  tighten={k:g}: relative L2 bar = min(band, {k:g} x {used['rel_l2']:.4g}), cosine bar = "
                     f"max(band, 1 - {k:g} x {used['one_minus_cosine']:.4g}): the floor recorded for "
                     f"{used['stratum']} in {tight.get('evidence')}, each raised to the dtype's resolution "
                     f"(u = {used['unit_roundoff']:.4g}; u^2/2 for 1 - cosine) where it was below it")
    lines += check_table(checks)
    lines += diagnostics(stats)
    return stats, _of_record(GateFailure("\n".join(lines), stats, checks, name=name), rec)


@_refusals_tracked
def assert_t1(actual: Any, expected: Any, *, component: str, feature: str,
              relax: Union[Relax, str, None] = None, rel_l2: Optional[float] = None,
              cosine: Optional[float] = None, rtol: Optional[float] = None, atol: Optional[float] = None,
              dim: Optional[int] = None, quantiles: Sequence[float] = (0.99,), name: Optional[str] = None,
              tighten: Optional[float] = None, evidence: Union[str, "os.PathLike[str]", None] = None) -> GateResult:
    """Gate a transparent (T1) feature: ``actual`` (feature on) against ``expected`` (the trusted reference).

    Args:
        actual, expected: any DLPack tensors of one shape on one device (torch, NumPy, CuPy, ...); dtypes may
            differ (bf16 against an fp32 reference). Statistics are computed in float64 by ``vgct_ext.compare``.
            Or two structures of the same shape -- nested tuples/lists (same lengths) and dicts (same keys) with
            tensor leaves, as ``torch.testing.assert_close`` takes them: every leaf is gated on its own bars and
            named by its path (``out[0]``, ``out["sample"]``, prefixed by ``name`` instead of ``out`` when given);
            ``None`` leaves must match ``None``. A structure mismatch raises ``ValueError`` naming the path.
        component, feature: names for the message, the report and the summary table (required).
        relax: ``None`` or a named accumulation cause (:class:`Relax` or its value string).
        rel_l2, cosine, rtol, atol: explicit bars, each at most the allowed band (below).
        dim: an axis for per-slice statistics; the message then names the worst slice.
        quantiles: quantiles of ``|a-e|`` to report (0.99 is always added).
        name: a label for this gate (shown first in the failure message, in the summary table and the report
            as ``"name"``); needed to tell apart several gates of one test.

    Bars (docs/method.md, "Relaxation scope"): :func:`t1_band` of ``relax`` at the dtype class of the pair
    (:func:`dtype_class`: the coarser dtype's unit roundoff ``u``; a mixed pair 4x wider). Defaults without a
    cause: relative L2 ``16u``, ``rtol = atol = 64u``, capped by the design card (1e-2, 1e-3): float32 vs
    float32 gets relative L2 9.5e-7 and rtol = atol = 3.8e-6, bfloat16 the design card's 1e-2 / 1e-3. With a
    cause at most ``64u`` / ``256u`` (reduction reordering, parallel partial-sum merge) or ``256u`` / ``1024u``
    (backend or kernel swap, compile fusion), capped by the outer band (5e-2, 0.999, 5e-2): a backend swap of
    float32 vs float32 may reach relative L2 1.5e-5 and rtol = atol = 6.1e-5, never 5e-2. Cosine is gated at
    ``max(ceiling, 1 - max(rel_l2_bar^2, 1e-12))``.
        tighten: ``k`` (1 to 1e6): relative L2 and cosine bars become the measured floor of this gate times
            ``k`` (when tighter than the bars above), the floor being recorded per stratum by ``pytest
            --vgct-calibrate`` in the evidence file under ``"T1 floor | component | feature[ | name]"``; see
            :func:`vgct_ext.evidence.tighten_t1`. Without a recorded floor the gate fails (EvidenceMissing).
        evidence: the evidence file for ``tighten`` (default as for :func:`assert_t2`).

    Gates (all must hold): no non-finite pair; relative L2 ``<=`` bar and cosine ``>=`` bar (for a zero-norm
    reference instead: max abs error ``<= atol``, and the message says so); no element with
    ``|a-e| > atol + rtol*|e|``; at least one element.

    Returns: the ``vgct_ext.PairedStats`` for a single tensor; for a structure a ``dict`` mapping each leaf's
    path (``"out[0]"``, ``'out["sample"]'``) to its ``PairedStats``, in the structure's order.
    Raises:
        TransparencyFinding: bars looser than allowed (see :func:`resolve_t1_bars`), before comparing.
        ValueError: ``relax`` is not a named cause; the two structures differ (the path is named).
        TypeError: a dtype without a unit roundoff (complex), a bar that is not a number.
        GateFailure (AssertionError): a bar was missed (under :func:`soft_gates`: collected, raised at the end
            of the block). The first line names the failing statistics, measured against bar (what
            ``pytest -rf`` / ``--tb=line`` show), then component, feature and label; the rest names both dtypes,
            shape, device and architecture, every statistic against its bar with the margin, the worst element's
            index and values, the worst slice (with ``dim``) and the non-finite counts. For a structure, one
            GateFailure lists every failing leaf.
    Source: the method, "Assert useful numerical evidence" (T1 bars, named causes, outer band), stated in
    docs/method.md.
    """
    __tracebackhide__ = True
    _check_names(component, feature)
    _check_label(name)
    if tighten is not None:
        _evidence_gate_called()
    given = {"rel_l2": rel_l2, "cosine": cosine, "rtol": rtol, "atol": atol}
    resolve_t1_bars(relax, **given, component=component, feature=feature)  # refuse early: before any compare
    leaves = paired_leaves(actual, expected, name)
    results: Dict[str, Any] = {}
    failures: List[_GateError] = []
    for path, a, e in leaves:
        stats, failure = _gate_t1_leaf(a, e, component=component, feature=feature, name=path, relax=relax,
                                       given=given, dim=dim, quantiles=quantiles,
                                       tighten=tighten, evidence=evidence)
        results[path if path is not None else ""] = stats
        if failure is not None:
            failures.append(failure)
    _raise_or_collect(failures, "T1", component, feature)
    if is_structure(actual) or is_structure(expected):
        return results
    return results[leaves[0][0] if leaves[0][0] is not None else ""]


# --------------------------------------------------------------------------------------------------------------
# T2


@_refusals_tracked
def assert_t2(actual: Any, expected: Any, *, component: str, feature: str,
              evidence: Union[str, "os.PathLike[str]", None] = None, case: Optional[str] = None,
              dim: Optional[int] = None, quantiles: Sequence[float] = (0.99,),
              name: Optional[str] = None) -> GateResult:
    """Gate a lossy (T2) feature on bars calibrated from recorded evidence for the current hardware stratum.

    Args:
        actual, expected: DLPack tensors as for :func:`assert_t1`, or two structures of the same shape (nested
            tuples/lists/dicts): every tensor leaf is gated on its own evidence entry, whose case is the leaf's
            path (``out[0]``, or ``"<case>: out[0]"`` with ``case``), and a dict path -> ``PairedStats`` returned.
        name: a label for this gate (message, summary table, report key ``"name"``).
        component, feature: names; with ``case`` they form the evidence key ``"component | feature[ | case]"``.
        evidence: the evidence JSON file. Default: ``<test module stem>.vgct-evidence.json`` next to the
            test module (the running pytest item's file, else the calling file).
        case: distinguishes several T2 gates of one component and feature (e.g. a timestep); ``name`` is
            its synonym (``case`` wins when both are given). In a paired test (and under ``--vgct-calibrate`` in
            any test) a second gate of the same key in one run raises :class:`vgct_ext.evidence.AmbiguousGate`
            (a ValueError): each output needs its own label, else both would share one bar.
        dim: the channel axis of a quantization feature: the per-channel mean shift
            ``max_c |mean(a-e)[c]|`` (units of the tensor) and the per-channel relative L2
            ``max_c ||a-e||_c / ||e||_c`` (over the channels whose reference norm is nonzero) are then
            recorded and gated.
        quantiles: quantiles of ``|a-e|`` to report (0.99 is always added and gated as ``p99``).

    The stratum is ``"cpu-<isa>"`` (``cpu-avx512``, ``cpu-avx2``, ``cpu-neon``, ...) for CPU tensors and
    ``"sm_<major><minor>"`` for CUDA tensors. Under ``pytest --vgct-calibrate`` nothing is gated: each run
    (one per seed, ``vgct.seed``) is recorded and merged into the evidence file at the end of the session
    (bar rule: :mod:`vgct_ext.evidence`).

    Gated statistics (bars from the evidence): relative L2 ``<=``, cosine ``>=``, p99 abs error ``<=``,
    max abs error ``<=``, per-channel mean shift and per-channel relative L2 ``<=`` (with ``dim``); no
    non-finite pair; at least one element. Every one of these bars must be in the evidence entry -- an entry
    lacking one (e.g. only a ``max_abs_err`` bar) is refused with :class:`EvidenceMissing` and a recalibration hint, never gated on
    the bars it has. The only exception: when the gated run's reference has zero norm, relative L2 and cosine
    are undefined, their bars are not required, and the gate says it gates on absolute error. Under
    calibration a run with a non-finite pair, a zero-norm reference or an undefined statistic is refused
    (``ValueError``), so no entry is written without a required bar.

    Returns: the ``vgct_ext.PairedStats`` (a dict path -> ``PairedStats`` for a structure).
    Raises:
        EvidenceMissing (an Exception, not an AssertionError): no evidence for this key and stratum (the message says how to record
            it: ``pytest --vgct-calibrate <test id>``), evidence recorded for another dtype/shape/dim, evidence
            lacking a required bar (or with a non-finite one), or a cosine bar under 0.99 without an
            investigation note.
        ValueError: under ``--vgct-calibrate``, a run that cannot calibrate bars (see above).
        GateFailure (AssertionError): a bar was missed (message as for :func:`assert_t1`).
    Source: the method, "T2, lossy" (calibrated bars, evidence per GPU-architecture stratum, 0.99 cosine floor
    requires investigation).
    """
    __tracebackhide__ = True
    from . import evidence as ev
    from vgct_ext import compare

    _check_names(component, feature)
    _evidence_gate_called()
    _check_label(name)
    if is_structure(actual) or is_structure(expected):
        results: Dict[str, Any] = {}
        leaves = paired_leaves(actual, expected, name)
        collected = _Collect()
        with _pushed(collected):  # gate every leaf, then report the failed ones together
            for path, a, e in leaves:
                results[str(path)] = assert_t2(a, e, component=component, feature=feature, evidence=evidence,
                                               case=str(path) if case is None else f"{case}: {path}", dim=dim,
                                               quantiles=quantiles, name=path)
        _raise_or_collect(collected, "T2", component, feature)
        return results
    stats = compare(actual, expected, quantiles=_quantiles(quantiles), dim=dim)
    stratum = stratum_of(stats.device)
    path = ev.evidence_path(evidence)
    label = case if case is not None else name
    key = ev.evidence_key(component, feature, label)
    ev.claim(path, key, gate="assert_t2")
    observed = ev.t2_statistics(stats)
    session = _context.current_session()
    base_extra = {"gate": "T2", "case": label, "evidence": str(path), "evidence_key": key, "name": name}

    if session is not None and session.calibrate:
        if _planted_open():
            # a planted fault (expect_gate_failure) under --vgct-calibrate: T2 gates record instead of gating, so
            # the fault cannot be checked here, and its run must never become evidence -- nor any run while a
            # planted-fault block is open in another thread (the gate may be running the faulty code for it)
            raise PlantedFaultWhileCalibrating(_planted_message("T2 gate", component, feature))
        ev.add_calibration_run(session, path, key, stratum, stats, observed, component=component,
                               feature=feature, case=label, dim=dim)
        checks = _t2_report_checks(stats, observed)
        _record("t2", component, feature, stats, checks, extra={**base_extra, "calibrating": True})
        return stats

    entry, problem = ev.lookup(path, key, stratum, stats, dim, evidence)
    if problem is not None:
        checks = _t2_report_checks(stats, observed)
        _record("t2", component, feature, stats, checks, extra={**base_extra, "passed": False, "problem": problem})
        lines = header("T2 gate cannot run", component, feature, stats, f" (stratum {stratum})", name=name)
        lines[0] = (f"T2 gate cannot run{f' [{label}]' if label else ''}: no usable calibration evidence -- "
                    f"component {component!r}, feature {feature!r} (stratum {stratum}, key {key!r})")
        lines.append("  " + problem.replace("\n", "\n  "))
        lines.append("  measured now:")
        lines += check_table(checks)
        lines += diagnostics(stats, mismatch=False)
        checks_failed = [Check("evidence", "calibration evidence", None, "==", 1)]
        _raise_or_collect([EvidenceMissing("\n".join(lines), stats, checks_failed, name=name)], "T2", component,
                          feature)
        return stats

    checks = t2_checks(stats, observed, entry["bars"])
    passed = all(c.passed for c in checks)
    rec = _record("t2", component, feature, stats, checks, extra={**base_extra, "bars": dict(entry["bars"])})
    if not passed:
        where = f" (stratum {stratum}, evidence {os.path.basename(str(path))} [{key}])"
        lines = header("T2 gate failed", component, feature, stats, where, name=name)
        lines[0] = first_line("T2 gate failed", checks, component, feature, label, where)  # case= or name= first
        lines += check_table(checks)
        lines += diagnostics(stats, mismatch=False)
        _raise_or_collect([_of_record(GateFailure("\n".join(lines), stats, checks, name=name), rec)], "T2", component,
                          feature)
    return stats


_T2_LABELS = {
    "rel_l2": ("relative L2", "<="),
    "cosine": ("cosine similarity", ">="),
    "p99": ("p99 abs error", "<="),
    "max_abs_err": ("max abs error", "<="),
    "channel_mean_shift": ("per-channel mean shift max_c|mean(a-e)|", "<="),
    "channel_rel_l2": ("per-channel relative L2 max_c ||a-e||/||e||", "<="),
}


def _channel_note(name: str, observed: Mapping[str, Any]) -> str:
    """``"channel <i>"`` for a per-channel statistic: the slice that attained it (evidence.t2_statistics)."""
    idx = observed.get(name + "_index") if name in PER_CHANNEL else None
    return f"channel {idx}" if idx is not None else ""


def _t2_report_checks(stats: Any, observed: Mapping[str, Any]) -> List[Check]:
    out = []
    for name, (label, _) in _T2_LABELS.items():
        if name in observed:
            out.append(Check(name, label, observed[name], gating=False, note=_channel_note(name, observed)))
    out.append(Check("non_finite_pairs", "non-finite pairs", stats.n - stats.n_finite, gating=False))
    return out


def t2_checks(stats: Any, observed: Mapping[str, Any], bars: Mapping[str, float]) -> List[Check]:
    """The T2 checks against ``bars``. ``bars`` must be complete (:func:`vgct_ext.evidence.lookup` refuses
    evidence lacking a required bar), so every statistic gated here has a bar; a zero-norm reference skips
    relative L2, cosine and the per-channel relative L2 (undefined) and says so on the max-abs-error row."""
    checks: List[Check] = []
    zero = stats.zero_reference
    for name, (label, op) in _T2_LABELS.items():
        if name not in observed and name not in bars:
            continue
        if zero and name in RELATIVE:
            continue
        note = ""
        if zero and name == "max_abs_err":
            note = (_NO_FINITE_NOTE if stats.n_finite == 0 else
                    "zero-norm reference: relative L2, cosine and per-channel relative L2 undefined, gating on "
                    "absolute error")
        note = _channel_note(name, observed) or note
        if name == "cosine" and observed.get("cosine") is None:
            note = "undefined: ||actual||_2 = 0"
        bar = bars.get(name)
        if bar is None:
            checks.append(Check(name, label, observed.get(name), gating=False, note=note))
        else:
            checks.append(Check(name, label, observed.get(name), op, float(bar), note=note))
    return checks + _common_checks(stats)
