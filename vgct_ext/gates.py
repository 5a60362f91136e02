"""T1 and T2 gates: the method's tolerance gates over :func:`vgct_ext.compare`.

Source of every definition: the VisualGen component-test method (``shared/method/000_a30af0e7f981ddb5.txt``,
section "Assert useful numerical evidence"), in the project's words in ``docs/method.md``; the statistics
themselves are defined in ``docs/metrics.md``.

* **T1, transparent** features: ``rtol = atol = 1e-3`` elementwise, relative L2 ``<= 1e-2``, cosine
  ``>= 0.9999``. Relaxed only for a named accumulation cause (:class:`Relax`), and then at most to the
  outer band: relative L2 ``5e-2``, cosine ``0.999`` (vgct_ext applies the same ``5e-2`` as the ceiling of
  the elementwise ``rtol``/``atol``). A looser request raises :class:`TransparencyFinding`.
* **T2, lossy** features: the same statistics, gated on bars calibrated from recorded evidence for the
  current hardware stratum (``"cpu-<isa>"`` or ``"sm_XY"``), never a built-in default
  (see :mod:`vgct_ext.evidence`).

Both gates fail on any non-finite pair, on an empty comparison (the message then says no finite pair was
compared), and, for a zero-norm reference (where relative L2 and cosine are undefined), gate on the maximum
absolute error and say so.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _context
from ._hardware import describe_device, stratum_of

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
    "assert_t1",
    "assert_t2",
]


class Relax(str, enum.Enum):
    """The named accumulation causes for which the method allows relaxing a T1 gate.

    Pass a member or its exact value (``"reduction reordering"``, ``"backend or kernel swap"``,
    ``"compile fusion"``, ``"parallel partial-sum merge"``) as ``assert_t1(..., relax=...)``.
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


class TransparencyFinding(ValueError):
    """A T1 (transparent) gate was asked for a tolerance the method does not allow.

    Raised before any comparison: bars looser than the T1 default without a named cause, or looser than
    the outer band with one. The method treats this as a finding to investigate, never a tolerance to widen.
    """


class GateFailure(AssertionError):
    """A gate's statistics missed their bars. ``.stats`` is the PairedStats, ``.checks`` the list of Check."""

    def __init__(self, message: str, stats: Any = None, checks: Sequence["Check"] = ()):
        super().__init__(message)
        self.stats = stats
        self.checks = list(checks)


class EvidenceMissing(GateFailure):
    """A T2 gate found no usable calibration evidence for the current stratum (or evidence that does not fit)."""


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
        lines.append(f"  max relative error: {fmt_value('x', stats.max_rel_err)} at index "
                     f"{tuple(stats.max_rel_err_index)}")
    sl = getattr(stats, "slices", None)
    if sl is not None:
        try:
            k = int(sl.worst())
            lines.append(
                f"  worst slice along dim {sl.dim}: index {k} of {len(sl.count)}: relative L2 "
                f"{fmt_value('rel_l2', _nan_none(sl.rel_l2[k]))}, max abs error "
                f"{fmt_value('x', _nan_none(sl.max_abs_err[k]))}, mean shift "
                f"{fmt_value('x', _nan_none(sl.mean_shift[k]))} (reference RMS "
                f"{fmt_value('x', _nan_none(sl.ref_rms[k]))}, {int(sl.count[k])} finite pairs)")
        except (ValueError, IndexError, TypeError):
            lines.append(f"  worst slice along dim {sl.dim}: none (no finite pair in any slice)")
    lines.append(f"  non-finite: actual NaN {stats.nan_actual}, +Inf {stats.posinf_actual}, -Inf "
                 f"{stats.neginf_actual}; expected NaN {stats.nan_expected}, +Inf {stats.posinf_expected}, -Inf "
                 f"{stats.neginf_expected}; {stats.n_class_mismatch} positions differ in class"
                 + (f" (first at {tuple(stats.first_class_mismatch_index)})"
                    if stats.first_class_mismatch_index is not None else ""))
    return lines


def _nan_none(v: Any) -> Optional[float]:
    v = float(v)
    return None if math.isnan(v) else v


def header(gate: str, component: str, feature: str, stats: Any, extra: str = "") -> List[str]:
    return [f"{gate}: component {component!r}, feature {feature!r}{extra}",
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
                    component: str = "?", feature: str = "?") -> Tuple[T1Bars, Optional[Relax]]:
    """The bars a T1 gate will apply, or :class:`TransparencyFinding` when the request is too loose.

    Without ``relax`` every bar defaults to :data:`T1_DEFAULT` and may only be tightened. With a named cause
    the defaults become :data:`OUTER_BAND` and a bar may be set anywhere up to it.
    """
    cause = Relax.parse(relax) if relax is not None else None
    base = OUTER_BAND if cause is not None else T1_DEFAULT
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
            looser.append(f"{name} {'>=' if name == 'cosine' else '<='} {v:g} (limit {lim:g})")
    if looser:
        what = "; ".join(looser)
        if cause is None:
            raise TransparencyFinding(
                f"T1 request refused for component {component!r}, feature {feature!r}: {what} is looser than the "
                f"T1 default (relative L2 <= 1e-2, cosine >= 0.9999, rtol = atol = 1e-3) and no cause was named. "
                f"Widening a transparent feature's tolerance is a finding, not a fix: name the accumulation cause "
                f"with relax=vgct_ext.Relax.<cause> ({', '.join(m.value for m in Relax)}), which allows at most the "
                f"outer band (relative L2 5e-2, cosine 0.999), or investigate why the feature is not transparent.")
        raise TransparencyFinding(
            f"T1 request refused for component {component!r}, feature {feature!r} (relax: {cause.value}): {what} "
            f"is looser than the outer band (relative L2 <= 5e-2, cosine >= 0.999, rtol/atol <= 5e-2). A "
            f"supposedly transparent feature that needs a lossy-width tolerance is a finding: investigate it, or, "
            f"if the feature is really lossy, gate it with assert_t2 on calibrated evidence. The bar is never "
            f"widened silently.")
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


def assert_t1(actual: Any, expected: Any, *, component: str, feature: str,
              relax: Union[Relax, str, None] = None, rel_l2: Optional[float] = None,
              cosine: Optional[float] = None, rtol: Optional[float] = None, atol: Optional[float] = None,
              dim: Optional[int] = None, quantiles: Sequence[float] = (0.99,), name: Optional[str] = None,
              tighten: Optional[float] = None, evidence: Union[str, "os.PathLike[str]", None] = None) -> Any:
    """Gate a transparent (T1) feature: ``actual`` (feature on) against ``expected`` (the trusted reference).

    Args:
        actual, expected: any DLPack tensors of one shape on one device (torch, NumPy, CuPy, ...); dtypes may
            differ (bf16 against an fp32 reference). Statistics are computed in float64 by ``vgct_ext.compare``.
        component, feature: names for the message, the report and the summary table (required).
        relax: ``None`` or a named accumulation cause (:class:`Relax` or its value string).
        rel_l2, cosine, rtol, atol: explicit bars. Defaults: ``T1_DEFAULT`` (1e-2, 0.9999, 1e-3, 1e-3); with
            ``relax``, ``OUTER_BAND`` (5e-2, 0.999, 5e-2, 5e-2).
        dim: an axis for per-slice statistics; the message then names the worst slice.
        quantiles: quantiles of ``|a-e|`` to report (0.99 is always added).
        tighten: ``k`` (1 to 1e6): relative L2 and cosine bars become the measured floor of this gate times
            ``k`` (when tighter than the bars above), the floor being recorded per stratum by ``pytest
            --vgct-calibrate`` in the evidence file under ``"T1 floor | component | feature[ | name]"``; see
            :func:`vgct_ext.evidence.tighten_t1`. Without a recorded floor the gate fails (EvidenceMissing).
        evidence: the evidence file for ``tighten`` (default as for :func:`assert_t2`).

    Gates (all must hold): no non-finite pair; relative L2 ``<=`` bar and cosine ``>=`` bar (for a zero-norm
    reference instead: max abs error ``<= atol``, and the message says so); no element with
    ``|a-e| > atol + rtol*|e|``; at least one element.

    Returns: the ``vgct_ext.PairedStats``.
    Raises:
        TransparencyFinding: bars looser than allowed (see :func:`resolve_t1_bars`), before comparing.
        ValueError: ``relax`` is not a named cause.
        GateFailure (AssertionError): a bar was missed. The message names component, feature, both dtypes,
            shape, device and architecture, every statistic against its bar with the margin, the worst
            element's index and values, the worst slice (with ``dim``) and the non-finite counts.
    Source: the method, "Assert useful numerical evidence" (T1 bars, named causes, outer band).
    """
    __tracebackhide__ = True
    _check_names(component, feature)
    bars, cause = resolve_t1_bars(relax, rel_l2=rel_l2, cosine=cosine, rtol=rtol, atol=atol,
                                  component=component, feature=feature)
    from vgct_ext import compare

    stats = compare(actual, expected, rtol=bars.rtol, atol=bars.atol, quantiles=_quantiles(quantiles), dim=dim)
    from .evidence import tighten_t1

    bars, tight = tighten_t1(bars, tighten, stats, component=component, feature=feature, label=name,
                             evidence=evidence)
    checks = t1_checks(stats, bars)
    passed = all(c.passed for c in checks)
    _record("t1", component, feature, stats, checks,
            extra={"gate": "T1", "relax": cause.value if cause else None, "bars": dataclasses.asdict(bars),
                   **tight})
    if not passed:
        relax_txt = f" (relax: {cause.value})" if cause else ""
        lines = header("T1 gate failed", component, feature, stats, relax_txt)
        lines += check_table(checks)
        lines += diagnostics(stats)
        raise GateFailure("\n".join(lines), stats, checks)
    return stats


# --------------------------------------------------------------------------------------------------------------
# T2


def assert_t2(actual: Any, expected: Any, *, component: str, feature: str,
              evidence: Union[str, "os.PathLike[str]", None] = None, case: Optional[str] = None,
              dim: Optional[int] = None, quantiles: Sequence[float] = (0.99,), name: Optional[str] = None) -> Any:
    """Gate a lossy (T2) feature on bars calibrated from recorded evidence for the current hardware stratum.

    Args:
        actual, expected: DLPack tensors as for :func:`assert_t1`.
        component, feature: names; with ``case`` they form the evidence key ``"component | feature[ | case]"``.
        evidence: the evidence JSON file. Default: ``<test module stem>.vgct-evidence.json`` next to the
            test module (the running pytest item's file, else the calling file).
        case: distinguishes several T2 gates of one component and feature (e.g. a timestep); ``name`` is
            its synonym (``case`` wins when both are given). In a paired test a second gate of the same key in
            one run raises :class:`vgct_ext.evidence.AmbiguousGate` (a ValueError): each output needs its own
            label, else both would share one bar.
        dim: the channel axis of a quantization feature: the per-channel mean shift
            ``max_c |mean(a-e)[c]|`` (units of the tensor) is then recorded and gated.
        quantiles: quantiles of ``|a-e|`` to report (0.99 is always added and gated as ``p99``).

    The stratum is ``"cpu-<isa>"`` (``cpu-avx512``, ``cpu-avx2``, ``cpu-neon``, ...) for CPU tensors and
    ``"sm_<major><minor>"`` for CUDA tensors. Under ``pytest --vgct-calibrate`` nothing is gated: each run
    (one per seed, ``vgct.seed``) is recorded and merged into the evidence file at the end of the session
    (bar rule: :mod:`vgct_ext.evidence`).

    Gated statistics (bars from the evidence): relative L2 ``<=``, cosine ``>=``, p99 abs error ``<=``,
    max abs error ``<=``, per-channel mean shift ``<=`` (with ``dim``); no non-finite pair; at least one
    element. Every one of these bars must be in the evidence entry -- an entry lacking one (e.g. only a
    ``max_abs_err`` bar) is refused with :class:`EvidenceMissing` and a recalibration hint, never gated on
    the bars it has. The only exception: when the gated run's reference has zero norm, relative L2 and cosine
    are undefined, their bars are not required, and the gate says it gates on absolute error. Under
    calibration a run with a non-finite pair, a zero-norm reference or an undefined statistic is refused
    (``ValueError``), so no entry is written without a required bar.

    Returns: the ``vgct_ext.PairedStats``.
    Raises:
        EvidenceMissing (AssertionError): no evidence for this key and stratum (the message says how to record
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
    stats = compare(actual, expected, quantiles=_quantiles(quantiles), dim=dim)
    stratum = stratum_of(stats.device)
    path = ev.evidence_path(evidence)
    label = case if case is not None else name
    key = ev.evidence_key(component, feature, label)
    ev.claim(path, key, gate="assert_t2")
    observed = ev.t2_statistics(stats)
    session = _context.current_session()
    base_extra = {"gate": "T2", "case": label, "evidence": str(path), "evidence_key": key}

    if session is not None and session.calibrate:
        ev.add_calibration_run(session, path, key, stratum, stats, observed, component=component,
                               feature=feature, case=label, dim=dim)
        checks = _t2_report_checks(stats, observed)
        _record("t2", component, feature, stats, checks, extra={**base_extra, "calibrating": True})
        return stats

    entry, problem = ev.lookup(path, key, stratum, stats, dim)
    if problem is not None:
        checks = _t2_report_checks(stats, observed)
        _record("t2", component, feature, stats, checks, extra={**base_extra, "passed": False, "problem": problem})
        lines = header("T2 gate cannot run", component, feature, stats, f" (stratum {stratum})")
        lines.append("  " + problem.replace("\n", "\n  "))
        lines.append("  measured now:")
        lines += check_table(checks)
        lines += diagnostics(stats, mismatch=False)
        checks_failed = [Check("evidence", "calibration evidence", None, "==", 1)]
        raise EvidenceMissing("\n".join(lines), stats, checks_failed)

    checks = t2_checks(stats, observed, entry["bars"])
    passed = all(c.passed for c in checks)
    _record("t2", component, feature, stats, checks, extra={**base_extra, "bars": dict(entry["bars"])})
    if not passed:
        lines = header("T2 gate failed", component, feature, stats,
                       f" (stratum {stratum}, evidence {os.path.basename(str(path))} [{key}])")
        lines += check_table(checks)
        lines += diagnostics(stats, mismatch=False)
        raise GateFailure("\n".join(lines), stats, checks)
    return stats


_T2_LABELS = {
    "rel_l2": ("relative L2", "<="),
    "cosine": ("cosine similarity", ">="),
    "p99": ("p99 abs error", "<="),
    "max_abs_err": ("max abs error", "<="),
    "channel_mean_shift": ("per-channel mean shift max_c|mean(a-e)|", "<="),
}


def _t2_report_checks(stats: Any, observed: Mapping[str, Any]) -> List[Check]:
    out = []
    for name, (label, _) in _T2_LABELS.items():
        if name in observed:
            note = ""
            if name == "channel_mean_shift" and observed.get("channel_mean_shift_index") is not None:
                note = f"channel {observed['channel_mean_shift_index']}"
            out.append(Check(name, label, observed[name], gating=False, note=note))
    out.append(Check("non_finite_pairs", "non-finite pairs", stats.n - stats.n_finite, gating=False))
    return out


def t2_checks(stats: Any, observed: Mapping[str, Any], bars: Mapping[str, float]) -> List[Check]:
    """The T2 checks against ``bars``. ``bars`` must be complete (:func:`vgct_ext.evidence.lookup` refuses
    evidence lacking a required bar), so every statistic gated here has a bar; a zero-norm reference skips
    relative L2 and cosine (undefined) and says so on the max-abs-error row."""
    checks: List[Check] = []
    zero = stats.zero_reference
    for name, (label, op) in _T2_LABELS.items():
        if name not in observed and name not in bars:
            continue
        if zero and name in ("rel_l2", "cosine"):
            continue
        note = ""
        if zero and name == "max_abs_err":
            note = (_NO_FINITE_NOTE if stats.n_finite == 0 else
                    "zero-norm reference: relative L2 and cosine undefined, gating on absolute error")
        if name == "channel_mean_shift" and observed.get("channel_mean_shift_index") is not None:
            note = f"channel {observed['channel_mean_shift_index']}"
        if name == "cosine" and observed.get("cosine") is None:
            note = "undefined: ||actual||_2 = 0"
        bar = bars.get(name)
        if bar is None:
            checks.append(Check(name, label, observed.get(name), gating=False, note=note))
        else:
            checks.append(Check(name, label, observed.get(name), op, float(bar), note=note))
    return checks + _common_checks(stats)
