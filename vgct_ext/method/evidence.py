"""Calibration evidence: a JSON file next to the test module, keyed by gate and hardware stratum.

Source: the method, "T2, lossy: measure the same statistics, calibrate the bar from the feature's observed
drift plus headroom on supported GPU architectures, and record that evidence. [...] Cosine 0.99 is a floor
that requires investigation", "For T2, test every supported GPU-architecture stratum used to justify the
bar", and for T1 "set the threshold above the measured deterministic floor with modest headroom". A stratum
is ``"cpu-<isa>"`` or ``"sm_<major><minor>"`` (:func:`vgct_ext.method._hardware.stratum_of`).

File ``<test module stem>.vgct-evidence.json`` (format ``vgct-evidence/2``; ``vgct-evidence/1`` files are
read, and upgraded when next written)::

    {"format": "vgct-evidence/2",
     "entries": {"<component> | <feature>[ | <label>]": {"<stratum>": {          # a T2 gate
         "kind": "t2", "component", "feature", "case", "dtype_actual", "dtype_expected", "shape", "dim",
         "device", "recorded" (UTC ISO 8601), "command", "tests", "versions", "precision",
         "runs": [{"rel_l2", "cosine", "p99", "max_abs_err", ["channel_mean_shift", "channel_rel_l2"], "test",
                   "test_module" (the test's module relative to this file), "seed"}, ...],
         "observed_worst", "observed_log_mean", "observed_log_std": {...},  # cosine: of 1 - cosine
         "headroom": h, "confidence": 0.99, "headroom_rule": "...",  # the rule below, in words
         "bars": {...}, "warnings": [...],
         "investigation": null | "note"}},                            # required when bars.cosine < 0.99
      "T1 floor | <component> | <feature>[ | <label>]": {"<stratum>": {  # the floor of a tightened T1 gate
         "kind": "t1_floor", ..., "runs": [{"rel_l2", "cosine", "max_abs_err", "test", "seed"}],
         "floor": {"rel_l2", "one_minus_cosine", "max_abs_err"}}}}}

**Bar rule** (one run per seed; ``--vgct-calibrate`` runs each paired test with seeds 0..N-1, N =
``--vgct-calibrate-runs``, default 5). For each upper-bounded statistic x (relative L2, p99, max abs error,
per-channel mean shift, per-channel relative L2) and for the cosine distance x = 1 - cosine, over the n runs,
with m and s the mean and sample standard deviation of ln x::

    bar(x) = max( worst(x) * (1 + h),  min( exp(m + t(0.99, n-1) * s * sqrt(1 + 1/n)),  4 * worst(x) ) )

and the cosine bar is ``1 - bar(1 - cosine)``. The first term is the headroom over the worst run
(``--vgct-headroom``, default 0.5); the second is the one-sided 99 % prediction bound for one new run of a
log-normal statistic (Student's t with n-1 degrees of freedom): error magnitudes are positive and
right-skewed (a maximum over channels, a cache that hits on some inputs more often), so their spread is
modelled on the log scale. A statistic that varies across inputs gets a bar that covers that variation, not
only the seeds that happened to be calibrated (measured on this suite's CPU stratum: calibrated on seeds 0..4,
seeds 5..9 pass; the normal bound on x failed 4 of 35 gates there). If a run has x = 0 the bound is taken on x
itself (normal). With n = 1 only the first term exists. The spread term is capped at ``SPREAD_CAP`` = 4 times
the worst run (16 times for 1 - cosine, which scales like relative L2 squared): a seed that measured far less
drift than the others (a cache that did not hit, a feature inactive on that input) widens the log-scale spread
without bound, and an uncapped bar would then pass any bug (a 50 % scale error passed one). A capped entry
gets a warning to investigate, and a cosine bar is never below -1. A run whose relative L2 is ``OUTLIER_RATIO`` = 4
times the low median of its test's runs, or whose per-channel relative L2 is ``CHANNEL_OUTLIER_RATIO`` = 3 times
theirs (a bug in one channel), is named with its test and seed, for T2 bars and T1 floors alike (bars follow
the worst run: a bug present on some inputs while calibrating becomes the bar), and the entry gates nothing until an
investigation note explains it or a recalibration removes it (:func:`outlier_refusal`); a run at ``WARN_RATIO`` = 8
times the low median of another statistic (64 for 1 - cosine; or non-zero where that median is 0; not the
per-channel mean shift, a signed mean near 0) is named in a warning only -- those vary far more on clean data. When all runs are bitwise identical (the test ignores
``vgct.seed``) the entry gets a warning; when they all measured no difference at all (a bit-identical feature, which
looks the same whether or not the inputs vary) the warning says so and that the bars are 0.

**Merging.** A recalibration replaces the runs of the tests it ran (all their seeds) and keeps the runs other
tests recorded for the same entry; the bars are derived from all of them. Runs of one entry must be one
experiment (dtype, shape, dim): a mismatch with kept runs is refused (nothing written for that entry) with a
message. One test gating one key twice in one run is refused at the gate (:class:`AmbiguousGate`).

**Files** are read, merged and written under an inter-process lock (``<file>.lock``, the ``filelock``
library) and replaced atomically (unique temporary file, fsync, rename): concurrent writers keep every entry.

A gate re-derives an entry's bars (a T1 floor) from its recorded runs and refuses the entry when a stored one is
looser, or when it holds no runs (:func:`_looser_than_runs`), and one whose recorded device is not of its
stratum: bars come only from calibration. (An edit that changes the runs, the headroom and the bars together
stays consistent and cannot be told from a calibration: review evidence diffs like code.)

Every T2 entry must carry a finite bar for rel_l2, cosine, p99 and max_abs_err (and channel_mean_shift and
channel_rel_l2 when the entry has a ``dim``): :func:`lookup` refuses an entry that lacks one (recalibrate; an
entry recorded before channel_rel_l2 was gated is refused the same way), except that relative L2, cosine and
channel_rel_l2 are not required when the gated run's reference has zero norm (the gate then uses absolute error).
Calibration refuses a run with a non-finite pair (``n_finite < n``), a zero-norm reference, or an undefined or
non-finite statistic, and :func:`derive_bars` never produces a missing or non-finite bar. A malformed file
(bad JSON, a field of the wrong type, a number that is not a finite float64) raises ``ValueError`` naming the file
and the field.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import datetime
import inspect
import json
import math
import os
import shlex
import stat
import statistics
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _context
from ._files import atomic_write_text, locked
from ._hardware import LEGACY_CPU_STRATUM, describe_device, described_in_stratum, precision_settings, versions

__all__ = [
    "FORMAT",
    "READ_FORMATS",
    "SUFFIX",
    "CONFIDENCE",
    "AmbiguousGate",
    "evidence_path",
    "evidence_key",
    "t1_floor_key",
    "t2_statistics",
    "derive_bars",
    "prediction_factor",
    "lookup",
    "load",
    "validate",
    "write_calibration",
    "annotate",
    "remove",
    "remove_test",
    "format_entry",
    "fmt_exact",
]

FORMAT = "vgct-evidence/2"
READ_FORMATS = ("vgct-evidence/1", FORMAT)
SUFFIX = ".vgct-evidence.json"
UPPER = ("rel_l2", "p99", "max_abs_err", "channel_mean_shift", "channel_rel_l2")
#: The most the spread term of the bar rule may reach, as a multiple of the worst run (of 1 - cosine: its square).
SPREAD_CAP = 4.0
#: The largest --vgct-headroom: bars at most (1 + MAX_HEADROOM) x the worst run, the reach of the spread cap (a
#: larger headroom would open every bar wider than the method's widest prediction bound; new-user trial: 1000
#: gave a relative L2 bar of 6.7 and nothing warned).
MAX_HEADROOM = 4.0
#: The most an entry pooled from several tests' runs may loosen one test's own bar (or floor): pooled bar / the
#: bar its own runs give (of 1 - cosine: the square root of that ratio, as SPREAD_CAP).
POOL_CAP = 4.0
REQUIRED = ("rel_l2", "cosine", "p99", "max_abs_err")  # plus PER_CHANNEL when dim is set
#: The per-channel statistics a T2 gate with ``dim`` records and gates (:func:`t2_statistics`).
PER_CHANNEL = ("channel_mean_shift", "channel_rel_l2")
RELATIVE = ("rel_l2", "cosine", "channel_rel_l2")  # undefined for a zero-norm reference
FLOOR_STATS = ("rel_l2", "cosine", "max_abs_err")
T1_FLOOR_PREFIX = "T1 floor | "
#: One-sided confidence of the prediction bound in the bar rule.
CONFIDENCE = 0.99
HEADROOM_RULE = ("per statistic x (cosine: x = 1 - cosine) over n runs (one per seed): bar = max(worst x (1 + "
                 "headroom), min(exp(mean(ln x) + t(0.99, n-1) * std(ln x) * sqrt(1 + 1/n)), 4 worst x (1 - cosine: 16 "
                 "worst x))); cosine bar = 1 - bar(1 - cosine)")

# Student's t quantiles t(0.99, df): one-sided 99 % (standard tables, e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2)
_T99 = {1: 31.821, 2: 6.965, 3: 4.541, 4: 3.747, 5: 3.365, 6: 3.143, 7: 2.998, 8: 2.896, 9: 2.821, 10: 2.764,
        11: 2.718, 12: 2.681, 13: 2.650, 14: 2.624, 15: 2.602, 16: 2.583, 17: 2.567, 18: 2.552, 19: 2.539,
        20: 2.528, 21: 2.518, 22: 2.508, 23: 2.500, 24: 2.492, 25: 2.485, 26: 2.479, 27: 2.473, 28: 2.467,
        29: 2.462, 30: 2.457, 40: 2.423, 50: 2.403, 60: 2.390, 80: 2.374, 100: 2.364, 120: 2.358}


def headroom_ok(h: Any) -> bool:
    """Whether ``h`` is a usable headroom: a real number (not a bool) in [0, MAX_HEADROOM]; NaN, infinities and
    anything larger are not (the one bound the plugin, the bar rule and the gate-time check apply)."""
    return isinstance(h, (int, float)) and not isinstance(h, bool) and 0.0 <= h <= MAX_HEADROOM


class AmbiguousGate(ValueError):
    """Two gates would share one evidence entry without saying so: one test gated the same
    ``component | feature[ | label]`` twice in one run (give each its own ``case=``/``name=``), or calibration
    runs of one key disagree on the experiment (dtype, shape, dim)."""


def evidence_key(component: str, feature: str, case: Optional[str] = None) -> str:
    """``"component | feature"`` or ``"component | feature | case"``."""
    return " | ".join([component, feature] + ([str(case)] if case is not None else []))


def t1_floor_key(component: str, feature: str, label: Optional[str] = None) -> str:
    """The key of a tightened T1 gate's floor: ``"T1 floor | component | feature[ | label]"``."""
    return T1_FLOOR_PREFIX + evidence_key(component, feature, label)


def _caller_file() -> Optional[Path]:
    pkg = os.path.dirname(os.path.abspath(__file__))
    f = inspect.currentframe()
    while f is not None:
        name = os.path.abspath(f.f_code.co_filename)
        if not name.startswith(pkg + os.sep) and not f.f_code.co_filename.startswith("<"):
            return Path(name)
        f = f.f_back
    return None


def evidence_path(explicit: Union[str, "os.PathLike[str]", None] = None) -> Path:
    """The evidence file: ``explicit`` made absolute against the working directory of this call (a calibration
    writes it at the session's end, when the directory may be another), else ``<module stem>.vgct-evidence.json``
    next to the running test's module (from the pytest plugin), else next to the calling file. Raises
    ``RuntimeError`` if none is known, ``ValueError`` for an empty ``explicit`` (``os.path.abspath("")`` is the
    working directory, which read as evidence= a folder), ``IsADirectoryError`` for an ``explicit`` that names an
    existing folder (``Path("")`` is ``"."``, the working directory: it failed later as an "unreadable" file
    whose advice was to restore or remove it)."""
    if explicit is not None:
        if not os.fspath(explicit):
            raise ValueError("evidence='' is an empty path; expected the evidence file's path (or leave evidence= "
                             "out for <test module>.vgct-evidence.json next to the test)")
        path = Path(os.path.abspath(explicit))
        if path.is_dir():
            raise IsADirectoryError(f"evidence={os.fspath(explicit)!r} names the folder {path}; expected the "
                                    f"evidence JSON file's path in it, e.g. {path / ('<test module>' + SUFFIX)} "
                                    f"(or leave evidence= out for that file next to the test)")
        return path
    t = _context.current_test()
    module = t.path if t is not None and t.path is not None else _caller_file()
    if module is None:
        raise RuntimeError("assert_t2: cannot tell which test module this is; pass evidence=PATH")
    module = Path(module)
    return module.with_name(module.stem + SUFFIX)


def t2_statistics(stats: Any) -> Dict[str, Any]:
    """The statistics a T2 gate records and gates: rel_l2, cosine, p99, max_abs_err, and with ``dim`` two
    per-channel statistics over the slices ``c`` along ``dim`` (docs/metrics.md, "Per-slice statistics"):

    * ``channel_mean_shift`` = ``max_c |mean(a - e)[c]|`` (slices with no finite pair left out), the bias of one
      channel;
    * ``channel_rel_l2`` = ``max_c ||a - e||_c / ||e||_c`` over the slices whose reference norm is nonzero (a
      slice with ``||e||_c = 0`` has no relative error; it is seen by max_abs_err), the error of one channel
      relative to that channel's own scale: a per-channel scale or zero-point error in a low-gain channel,
      which the global relative L2 dilutes below its bar and a zero-mean input hides from the mean shift
      (the method: "Add per-channel mean shift for quantization"; this is its per-channel relative L2).

    Each comes with the index of the channel that attained it (``..._index``, reported, not gated); a statistic
    with no defined slice is ``None``."""
    out: Dict[str, Any] = {"rel_l2": stats.rel_l2, "cosine": stats.cosine, "p99": stats.quantiles.get(0.99),
                           "max_abs_err": stats.max_abs_err}
    sl = getattr(stats, "slices", None)
    if sl is not None:
        for name, values in (("channel_mean_shift", sl.mean_shift), ("channel_rel_l2", sl.rel_l2)):
            v = np.abs(np.asarray(values, dtype=np.float64))
            defined = not np.isnan(v).all() if v.size else False
            idx = int(np.nanargmax(v)) if defined else None  # the first channel attaining the maximum
            out[name] = float(v[idx]) if defined else None
            out[name + "_index"] = idx
    return out


def required_bars(dim: Optional[int], zero_reference: bool = False) -> Tuple[str, ...]:
    """The bars an entry must carry: rel_l2, cosine, p99, max_abs_err, plus channel_mean_shift and channel_rel_l2
    with ``dim``; without rel_l2, cosine and channel_rel_l2 when the gated run's reference has zero norm (they are
    undefined there)."""
    names = REQUIRED + (PER_CHANNEL if dim is not None else ())
    return tuple(n for n in names if not (zero_reference and n in RELATIVE))


def _finite_number(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and _finite_float(v)


def check_calibration_run(stats: Any, observed: Mapping[str, Any], dim: Optional[int]) -> Optional[str]:
    """Why a run cannot calibrate bars (``None`` when it can): a non-finite pair, a zero-norm reference, or a
    required statistic that is undefined or non-finite."""
    if stats.n == 0 or stats.n_finite == 0:
        return "no finite pair was compared (an empty or all-non-finite comparison proves nothing)"
    if stats.n_finite < stats.n:
        return (f"{stats.n - stats.n_finite} of {stats.n} pairs are non-finite (NaN/Inf); a T2 bar must be "
                f"calibrated from finite output only")
    if stats.zero_reference:
        return ("the reference has zero norm, so relative L2 and cosine are undefined and no bar could be recorded "
                "for them; calibrate on an experiment with a nonzero reference")
    bad = [f"{k}={observed.get(k)!r}" for k in required_bars(dim) if not _finite_number(observed.get(k))]
    if bad:
        return ("undefined or non-finite statistic(s) " + ", ".join(bad)
                + " (cosine is undefined when ||actual||_2 = 0); no bar can be derived from them")
    return None


# --------------------------------------------------------------------------------------------------------------
# The bar rule


def prediction_factor(n: int) -> float:
    """``t(0.99, n-1) * sqrt(1 + 1/n)``: the one-sided 99 % normal prediction bound for one new observation is
    ``mean + prediction_factor(n) * s`` (s the sample standard deviation of n observations). ``n >= 2``."""
    if n < 2:
        raise ValueError(f"a prediction bound needs at least 2 runs, got {n}")
    df = n - 1
    if df in _T99:
        t = _T99[df]
    else:  # between or beyond the tabulated points: the next smaller tabulated df (a larger t: conservative)
        t = _T99[max(d for d in _T99 if d < df)]
    return t * math.sqrt(1.0 + 1.0 / n)


def _spread(values: Sequence[float]) -> Tuple[float, float]:
    n = len(values)
    mean = math.fsum(values) / n
    if n < 2:
        return mean, 0.0
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var)


def bar_summary(runs: Sequence[Mapping[str, Any]], headroom: float,
                dim: Optional[int] = None) -> Dict[str, Dict[str, float]]:
    """``{"worst", "log_mean", "log_std", "bars"}`` from raw runs by the module's bar rule (the cosine's log mean
    and std are of ``ln(1 - cosine)``; its worst and bar are cosines). Raises ``ValueError`` as
    :func:`derive_bars`."""
    if not headroom_ok(headroom):
        raise ValueError(f"headroom must be a number in [0, {MAX_HEADROOM:g}], got {headroom!r}")
    if not runs:
        raise ValueError("derive_bars: no calibration run")
    need = required_bars(dim)
    for i, r in enumerate(runs):
        bad = [f"{k}={r.get(k)!r}" for k in need if not _finite_number(r.get(k))]
        bad += [f"{k}={r.get(k)!r}" for k in UPPER + ("cosine",)
                if k not in need and r.get(k) is not None and not _finite_number(r.get(k))]
        if bad:
            raise ValueError(f"calibration run {i} has undefined or non-finite statistic(s) {', '.join(bad)}; "
                             f"refusing to derive bars from it (a zero-norm reference or non-finite output "
                             f"cannot calibrate a T2 bar)")
    out: Dict[str, Dict[str, float]] = {"worst": {}, "log_mean": {}, "log_std": {}, "bars": {}, "capped": {}}
    for k in UPPER + ("cosine",):
        vals = [float(r[k]) for r in runs if r.get(k) is not None]
        if not vals:
            continue
        if k in need and len(vals) != len(runs):
            raise ValueError(f"derive_bars: {k} is missing from some runs")
        x = [1.0 - v for v in vals] if k == "cosine" else vals
        worst = max(x)
        bar = worst * (1.0 + headroom)
        # the spread term may add at most SPREAD_CAP x the worst run (1 - cosine: its square, since it scales
        # like relative L2 squared): a seed that measured far less drift must not open the bar to any bug
        cap = worst * (SPREAD_CAP ** 2 if k == "cosine" else SPREAD_CAP)
        spread = None
        if min(x) > 0.0:
            mean, std = _spread([math.log(v) for v in x])
            out["log_mean"][k], out["log_std"][k] = mean, std
            if len(x) >= 2:
                z = mean + prediction_factor(len(x)) * std
                spread = math.inf if z > min(709.0, math.log(cap) + 1.0) else math.exp(z)  # no overflow in exp
        elif len(x) >= 2:  # a zero run: no log scale; the normal bound on x itself
            mean, std = _spread(x)
            spread = mean + prediction_factor(len(x)) * std
        if spread is not None and spread > cap:
            out["capped"][k] = spread
            spread = cap
        if spread is not None:
            bar = max(bar, spread)
        if k == "cosine":
            bar = min(bar, 2.0)  # a cosine bar is never below -1
        out["worst"][k] = 1.0 - worst if k == "cosine" else worst
        out["bars"][k] = 1.0 - bar if k == "cosine" else bar
    bad = [f"{k}={v!r}" for k, v in out["bars"].items() if not math.isfinite(v)]
    if bad:
        raise ValueError(f"derive_bars: non-finite bar(s) {', '.join(bad)}; not written")
    return out


def derive_bars(runs: Sequence[Mapping[str, Any]], headroom: float,
                dim: Optional[int] = None) -> Tuple[Dict[str, float], Dict[str, float]]:
    """``(observed_worst, bars)`` from raw runs by the bar rule of this module's docstring.

    Raises ``ValueError`` when there is no run, when a run lacks a required statistic (rel_l2, cosine, p99,
    max_abs_err; channel_mean_shift and channel_rel_l2 with ``dim``) or has a non-finite one, or when a bar would
    be non-finite: an entry is never written with a missing or non-finite bar."""
    s = bar_summary(runs, headroom, dim)
    return s["worst"], s["bars"]


# --------------------------------------------------------------------------------------------------------------
# Reading and validating


def _bad(path: Any, field: str, want: str, got: Any) -> ValueError:
    if _is_int(got) and not _finite_float(got):  # (beyond float: its digits say more than its first 77)
        try:
            g = f"an integer of {len(str(abs(got)))} digits"
        except ValueError:  # beyond Python's digit limit for conversion to a string
            g = f"an integer of {got.bit_length()} bits"
    else:
        g = repr(got)
    if len(g) > 80:
        g = g[:77] + "..."
    return ValueError(f"{path}: evidence field {field}: expected {want}, got {g}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


_ENTRY_FIELDS: Dict[str, Tuple[str, Any]] = {
    "kind": ("'t2' or 't1_floor'", lambda v: v in ("t2", "t1_floor")),
    "component": ("a string", lambda v: isinstance(v, str)),
    "feature": ("a string", lambda v: isinstance(v, str)),
    "case": ("a string or null", lambda v: v is None or isinstance(v, str)),
    "dtype_actual": ("a dtype name (string)", lambda v: isinstance(v, str)),
    "dtype_expected": ("a dtype name (string)", lambda v: isinstance(v, str)),
    "shape": ("a list of non-negative integers", lambda v: isinstance(v, list) and all(_is_int(d) and d >= 0
                                                                                      for d in v)),
    "dim": ("an integer or null", lambda v: v is None or _is_int(v)),
    "investigation": ("a string or null", lambda v: v is None or isinstance(v, str)),
    "tests": ("a list of test ids (strings)", lambda v: isinstance(v, list) and all(isinstance(t, str) for t in v)),
    "headroom": ("a number", _is_num),
    "warnings": ("a list of strings", lambda v: isinstance(v, list) and all(isinstance(t, str) for t in v)),
}
_NUMBER_MAPS = ("bars", "floor", "observed_worst", "observed_log_mean", "observed_log_std")


def _finite_float(v: Any) -> bool:
    try:
        return math.isfinite(float(v))
    except OverflowError:  # an integer beyond float (10**400)
        return False


#: What validate expects of every number in an evidence document.
_FINITE = "a finite number (a float64)"


def _finite_numbers(path: Any, where: str, value: Any) -> None:
    """Raise ``ValueError`` (:func:`_bad`) naming the first number under ``value`` (``where`` its field) that is
    not a finite float64: NaN, an infinity, or an integer beyond float (a 401-digit one made ``float()`` raise
    OverflowError in the bar rule and crashed pytest's session end; hostile review of 2026-12-05).  Iterative: a deeply
    nested value is no recursion here."""
    stack = [(where, value)]
    while stack:
        w, v = stack.pop()
        if isinstance(v, dict):
            stack.extend((f"{w}.{k}", x) for k, x in reversed(list(v.items())))
        elif isinstance(v, list):
            stack.extend((f"{w}[{i}]", x) for i, x in reversed(list(enumerate(v))))
        elif _is_num(v) and not _finite_float(v):
            raise _bad(path, w, _FINITE, v)


#: What a run's test identity fields hold.
_ID_TEXT = {"test": "a string (a pytest node id)",
            "test_module": "a string (a module path, relative to the evidence file)"}

#: Statistics whose value may be negative or is bounded: their allowed range in words (all others: >= 0).
_RANGE_TEXT = {"cosine": "a cosine in [-1, 1]", "mean_diff": "a number", "mean_shift": "a number",
               "one_minus_cosine": "a number in [0, 2]", "seed": "an integer",
               "channel_mean_shift_index": "an integer >= 0", "channel_rel_l2_index": "an integer >= 0"}


def _in_range(k: str, v: Any) -> bool:
    """A statistic's value in its definition's range (docs/metrics.md): cosines in [-1, 1], 1 - cosine in
    [0, 2], signed means anything, every error magnitude, count and index >= 0."""
    if k == "cosine":
        return -1.0 <= v <= 1.0
    if k == "one_minus_cosine":
        return 0.0 <= v <= 2.0
    if k in ("mean_diff", "mean_shift") or k.startswith("log") or k.endswith("_log_mean"):
        return True
    return v >= 0


def validate(data: Any, path: Any = "<evidence>") -> Dict[str, Any]:
    """Check the structure and field types of an evidence document; return it. Raises ``ValueError`` naming
    ``path`` and the first bad field (e.g. ``entries["c | f"]["cpu-avx512"].bars.rel_l2``). Every number in it
    must be a finite float64 (no NaN, infinity, or integer beyond float): nothing downstream converts one that
    is not."""
    if not isinstance(data, dict):
        raise _bad(path, "(top level)", "a JSON object", type(data).__name__)
    if data.get("format") not in READ_FORMATS:
        raise _bad(path, "format", " or ".join(repr(f) for f in READ_FORMATS), data.get("format"))
    entries = data.get("entries")
    if not isinstance(entries, dict):
        raise _bad(path, "entries", "an object of keys", entries)
    for key, strata in entries.items():
        where = f"entries[{key!r}]"
        if not isinstance(strata, dict):
            raise _bad(path, where, "an object of strata", strata)
        for stratum, entry in strata.items():
            w = f"{where}[{stratum!r}]"
            if not isinstance(entry, dict):
                raise _bad(path, w, "an object (one stratum's evidence)", entry)
            for name, (want, ok) in _ENTRY_FIELDS.items():
                if name in entry and not ok(entry[name]):
                    raise _bad(path, f"{w}.{name}", want, entry[name])
            for name in _NUMBER_MAPS:
                if name not in entry:
                    continue
                m = entry[name]
                if not isinstance(m, dict):
                    raise _bad(path, f"{w}.{name}", "an object of numbers", m)
                for k, v in m.items():
                    if not _is_num(v):
                        raise _bad(path, f"{w}.{name}.{k}", "a number", v)
                    if not _finite_float(v):
                        raise _bad(path, f"{w}.{name}.{k}", "a number (finite)", v)
                    if name in ("bars", "floor", "observed_worst") and not _in_range(k, v):
                        raise _bad(path, f"{w}.{name}.{k}", _RANGE_TEXT.get(k, "a number >= 0"), v)
            if "runs" in entry:
                runs = entry["runs"]
                if not isinstance(runs, list):
                    raise _bad(path, f"{w}.runs", "a list of runs", runs)
                for i, r in enumerate(runs):
                    if not isinstance(r, dict):
                        raise _bad(path, f"{w}.runs[{i}]", "an object of statistics", r)
                    for k, v in r.items():
                        if k in ("test", "test_module"):
                            if not (v is None or isinstance(v, str)):
                                raise _bad(path, f"{w}.runs[{i}].{k}", _ID_TEXT[k] + " or null", v)
                            continue
                        if _is_num(v) and not _finite_float(v):
                            raise _bad(path, f"{w}.runs[{i}].{k}", _FINITE + " or null", v)
                        elif k == "seed":
                            ok = v is None or _is_int(v)
                        elif k in ("channel_mean_shift_index", "channel_rel_l2_index"):
                            ok = v is None or (_is_int(v) and v >= 0)
                        else:
                            ok = v is None or (_is_num(v) and _in_range(k, v))
                        if not ok:
                            raise _bad(path, f"{w}.runs[{i}].{k}", _RANGE_TEXT.get(k, "a number >= 0") + " (or null)",
                                       v)
            _finite_numbers(path, w, entry)  # (headroom, shape, dim, a field no check above names)
    for name, v in data.items():
        if name != "entries":
            _finite_numbers(path, name, v)
    return data


def _open_regular(name: str) -> Any:
    """``name`` opened for binary reading, refused unless it is a regular file (after symbolic links): a FIFO
    would block the open and the read forever, and ``/dev/zero`` or ``/dev/urandom`` (a link named
    ``*.vgct-evidence.json`` to one) would be read until memory runs out (an attack of 2026-12-06). Opened
    without blocking (``O_NONBLOCK``: a FIFO's open returns at once) and checked on the open file (``fstat``).
    Raises ``FileNotFoundError`` as ``open``, ``OSError`` naming the file and what it is otherwise."""
    fd = os.open(name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode) else
                    "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else
                    "a folder" if stat.S_ISDIR(mode) else "not a regular file")
            raise OSError(f"{name} is {kind}, not a regular file: expected the evidence JSON file "
                          f"(a regular file, or a symbolic link to one)")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def load(path: Union[str, "os.PathLike[str]"]) -> Dict[str, Any]:
    """Read and :func:`validate` an evidence file (``{"format", "entries": {}}`` when absent).
    Raises ``ValueError`` naming the file (and the field) for a file that is not valid evidence, ``OSError``
    for one that cannot be read or is not a regular file (a FIFO, a device: :func:`_open_regular`)."""
    p = Path(path)
    try:
        with _open_regular(os.fspath(p)) as f:
            raw = f.read()
    except FileNotFoundError:
        return {"format": FORMAT, "entries": {}}
    return _parse(raw, p)


def _parse(raw: bytes, p: Path) -> Dict[str, Any]:
    """The evidence in ``raw`` (the bytes of file ``p``), validated; raises as :func:`load`."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{p}: not UTF-8 text ({exc})") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{p}: not valid JSON ({exc})") from exc
    except ValueError as exc:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise ValueError(f"{p}: not an evidence file: a number in it cannot be read ({exc}); expected "
                         f"{_FINITE} for every number") from exc
    except RecursionError as exc:  # nesting deeper than the parser's stack: no evidence file is built so
        raise ValueError(f"{p}: not an evidence file (JSON nested too deeply)") from exc
    return validate(data, p)


def _calibrate_hint(stratum: str, key: Optional[str] = None) -> str:
    """How to record the missing evidence: calibrate the running test -- unless the gate runs inside
    :func:`vgct_ext.expect_gate_failure` (a planted-fault test), which records nothing under
    calibration: then the clean test that gates the same key must be calibrated."""
    from .gates import _expecting
    t = _context.current_test()
    where = "on this machine" if stratum.startswith("cpu") else f"on a {stratum} GPU"
    if _expecting():
        what = f"key {key!r}" if key else "this gate's key"
        return (f"This gate runs inside expect_gate_failure (a planted-fault test), which records no "
                f"evidence: record it {where} by calibrating the clean test that gates {what} (and "
                f"commit the JSON file), e.g.\n    pytest --vgct-calibrate -k <that test>")
    s = _context.current_session()
    if t is None and s is not None:  # a fixture's gate (new-user trial: "<test id>")
        tid = s.phase_test or "<its test id>"
        return (f"This gate runs outside a test's call (a fixture, at import), which records and owns no evidence: "
                f"gate in the test's body, then calibrate that test (pytest --vgct-calibrate \"{tid}\").")
    tid = t.nodeid if t is not None else "<test id>"
    return f"Record it {where} (and commit the JSON file):\n    pytest --vgct-calibrate \"{tid}\""


#: Parsed and validated evidence files read by gates: resolved path -> (file identity, data, size), least
#: recently used first. Bounded by count and by bytes; larger files are parsed on every gate.
_GATE_CACHE: "collections.OrderedDict[str, Tuple[Tuple[int, ...], Dict[str, Any], int]]" = collections.OrderedDict()
_GATE_CACHE_FILES = 64
_GATE_CACHE_BYTES = 64 << 20
_GATE_CACHE_FILE_MAX = 8 << 20
#: A file whose modification or change time is this close to the moment it was opened is not cached (git's rule
#: for "racily clean" files): where timestamps are coarser than a rewrite (a 1-4 ms clock on Linux before 6.13,
#: 1 s on HFS+ and some network mounts, 2 s on FAT), a same-size rewrite within one tick keeps the identity.
_RACY_NS = 3_000_000_000
_GATE_CACHE_LOCK = threading.Lock()  # gates may run in several threads


def _load_for_gate(path: Path) -> Dict[str, Any]:
    """:func:`load` for gates, parsed once per version of the file: a gate per channel slice (docs/method.md)
    reads one file hundreds of times (7.6 ms a read for a 577 KB file).

    The file is opened once (its absolute path taken once: another thread's ``chdir`` cannot mix two files),
    and its version is the identity ``(st_dev, st_ino, st_mtime_ns, st_ctime_ns, st_size)`` of that open file
    (``fstat``): writers here replace the file by rename (a new inode); any other write moves the change time,
    which no user call can set back (``cp -p``/``touch -r`` restore the modification time only). A file changed
    within _RACY_NS of the read is not cached, nor one larger than _GATE_CACHE_FILE_MAX; the cache keeps at most
    _GATE_CACHE_FILES files and _GATE_CACHE_BYTES bytes, least recently used dropped first. Callers must not
    modify what it returns (:func:`_find_entry` hands out copies). Raises as :func:`load`."""
    name = os.path.abspath(path)
    p = Path(name)
    try:
        with _open_regular(name) as f:
            st = os.fstat(f.fileno())
            now = time.time_ns()  # before the read: a rewrite during the read is within the racy window too
            ident = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
            with _GATE_CACHE_LOCK:
                hit = _GATE_CACHE.get(name)
                if hit is not None and hit[0] == ident:
                    _GATE_CACHE.move_to_end(name)
                    return hit[1]
            raw = f.read()
    except FileNotFoundError:
        with _GATE_CACHE_LOCK:
            _GATE_CACHE.pop(name, None)
        return {"format": FORMAT, "entries": {}}
    data = _parse(raw, p)
    racy = now - max(st.st_mtime_ns, st.st_ctime_ns) < _RACY_NS
    with _GATE_CACHE_LOCK:
        _GATE_CACHE.pop(name, None)
        if not racy and st.st_size <= _GATE_CACHE_FILE_MAX:
            total = sum(v[2] for v in _GATE_CACHE.values())
            while _GATE_CACHE and (len(_GATE_CACHE) >= _GATE_CACHE_FILES
                                   or total + st.st_size > _GATE_CACHE_BYTES):
                total -= _GATE_CACHE.popitem(last=False)[1][2]
            _GATE_CACHE[name] = (ident, data, st.st_size)
    return data


def _no_file(path: Path, given: Union[str, "os.PathLike[str]", None] = None) -> str:
    """``": no such file (<path>)"`` when ``path`` does not exist (``": a broken symbolic link (<path> -> <target>)"``
    for a link to nothing) -- with the working directory a relative ``given`` (the gate's ``evidence=``) was
    resolved against, e.g. one written relative to the test's folder and run from elsewhere -- else ``""``."""
    full = os.path.abspath(path)
    if os.path.exists(full):
        return ""
    rel = "" if given is None or Path(given).is_absolute() else \
        f"; the relative evidence={os.fspath(given)!r} was resolved against the working directory, {os.getcwd()} " \
        f"-- Path(__file__).with_name(...) ties a file to the test"
    if os.path.islink(full):
        try:
            return f": a broken symbolic link ({full} -> {os.readlink(full)}{rel})"
        except OSError:
            pass
    return f": no such file ({full}{rel})"


#: what to do with an evidence file that is not one (malformed JSON, a merge's conflict markers, a field of the
#: wrong kind): a calibration merges into the file and stops at the same error, so it must be mended first
UNREADABLE_FIX = ("A calibration merges into this file and stops at the same error: restore the file from version "
                  "control (e.g. git checkout -- FILE, or finish the merge that left conflict markers in it), or "
                  "remove it if it holds nothing worth keeping, then record the evidence again.")


def _unreadable_fix(path: Union[str, "os.PathLike[str]"]) -> str:
    return UNREADABLE_FIX.replace("FILE", shlex.quote(os.fspath(path)))


def _find_entry(path: Path, key: str, stratum: str, what: str,
                given: Union[str, "os.PathLike[str]", None] = None) -> Tuple[Optional[dict], Optional[str]]:
    try:
        data = _load_for_gate(path)
    except ValueError as exc:  # not an evidence file: calibrating first would fail the same way
        return None, f"evidence file unreadable: {exc}. {_unreadable_fix(path)} {_calibrate_hint(stratum, key)}"
    except OSError as exc:
        return None, f"evidence file unreadable: {exc}. {_calibrate_hint(stratum, key)}"
    strata = data["entries"].get(key)
    if not strata:
        return None, (f"no {what} evidence for {key!r} in {path}{_no_file(path, given)}. {what} bars come only from "
                      f"recorded calibration evidence, never from a default. {_calibrate_hint(stratum, key)}")
    entry = strata.get(stratum)
    if entry is None:
        if stratum.startswith("cpu-") and LEGACY_CPU_STRATUM in strata:
            return None, (f"no {what} evidence for stratum {stratum} under {key!r} in {path}: it has evidence for "
                          f"the plain stratum {LEGACY_CPU_STRATUM!r}, recorded before strata named the CPU "
                          f"instruction set that decides the kernels; it is not used. Recalibrate on a "
                          f"{stratum} machine. {_calibrate_hint(stratum, key)}")
        return None, (f"no {what} evidence for stratum {stratum} under {key!r} in {path} (recorded strata: "
                      f"{', '.join(sorted(strata))}). A bar from another stratum does not apply. "
                      f"{_calibrate_hint(stratum, key)}")
    missing = [k for k in ("dtype_actual", "dtype_expected", "shape", "dim") if k not in entry]
    if missing:
        return None, (f"{what} evidence for {key!r} on {stratum} in {path} lacks the field(s) "
                      f"{', '.join(missing)}. Recalibrate. {_calibrate_hint(stratum, key)}")
    try:
        return copy.deepcopy(entry), None
    except RecursionError:  # a field nested deeper than copying allows: no calibration writes such an entry
        return None, (f"{what} evidence for {key!r} on {stratum} in {path} has a field nested too deeply to "
                      f"read; not evidence this library wrote. Recalibrate. {_calibrate_hint(stratum, key)}")


def _axis(dim: Any, shape: Any) -> Any:
    """``dim`` as a non-negative axis of ``shape`` (``dim=-1`` and ``dim=2`` of a 3-d tensor are one axis); any
    other value (None, out of range, not an int) as it is."""
    if isinstance(dim, int) and not isinstance(dim, bool) and isinstance(shape, (list, tuple)) and \
            -len(shape) <= dim < len(shape):
        return dim % len(shape)
    return dim


_EXPERIMENT = ("dtype_actual", "dtype_expected", "shape", "dim")  # the fields that make one experiment


def _differs(k: str, a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two experiment records (entry fields or calibration metadata) differ in field ``k`` of
    ``_EXPERIMENT``; ``dim`` compared as an axis of each one's shape (``-1`` and ``ndim - 1`` are one axis)."""
    if k == "dim":
        return _axis(a.get("dim"), a.get("shape")) != _axis(b.get("dim"), b.get("shape"))
    return a.get(k) != b.get(k)


def _same_experiment(entry: Mapping[str, Any], stats: Any, dim: Optional[int]) -> List[str]:
    now = {"dtype_actual": stats.dtype_actual, "dtype_expected": stats.dtype_expected,
           "shape": list(stats.shape), "dim": dim}
    return [f"{k}: evidence {entry.get(k)!r}, now {now[k]!r}" for k in _EXPERIMENT if _differs(k, entry, now)]


def _pair_u(meta: Mapping[str, Any]) -> float:
    """The unit roundoff of the less precise dtype of an entry's pair (:func:`tighten_t1`'s resolution)."""
    return max(_UNIT_ROUNDOFF.get(str(meta.get("dtype_actual")), 2.0 ** -24),
               _UNIT_ROUNDOFF.get(str(meta.get("dtype_expected")), 2.0 ** -24))


def _unusable(entry: Mapping[str, Any], path: Path, key: str, stratum: str, kind: str) -> Optional[str]:
    """Why ``entry`` must not gate the current test although it exists and fits the experiment, or None:

    * its runs pool several tests that :func:`pooling_problem` refuses (an entry written before that check), or
      cannot be re-derived (a headroom outside [0, MAX_HEADROOM], a non-finite or absurd value): an entry that
      cannot be checked is not used;
    * a T2 entry's headroom outside [0, MAX_HEADROOM] (bars wider than the method allows);
    * the entry names the tests that recorded it and the current test is not one of them: a case of
      a parametrized test added or left out of calibration, or another test under the same component and
      feature labels (a test added later, an fp16 variant of a calibrated bf16 test), would gate on bars it
      never recorded -- the pooling check cannot see a test that has no runs (new-user trial of 2026-12-05:
      a 0.4 % scale fault in the fp16 test passed on the bf16 test's bars); a run belongs to a test by
      :func:`_same_owner` (:func:`_same_test` for runs recorded without their module).  An entry without a
      ``tests`` list is recorded by the tests its runs name (hostile review of 2026-12-05: an empty list let a
      test never calibrated gate on another's bars); only one whose runs name no test (written before runs
      named their test) gates any test.  Not inside the calling thread's :func:`vgct_ext.expect_gate_failure`
      (a planted fault reads the clean test's evidence on purpose), nor for a gate outside a test's call, which
      owns no evidence."""
    hint = f"Recalibrate. {_calibrate_hint(stratum, key)}"
    if kind == "t2":
        h = entry.get("headroom", 0.5)
        if not headroom_ok(h):
            return (f"T2 evidence for {key!r} on {stratum} in {path} was derived with headroom {h!r}, outside "
                    f"[0, {MAX_HEADROOM:g}]: its bars are wider than the method allows. {hint}")
    runs = _entry_runs(entry)
    dev = str(entry.get("device") or "")
    if not described_in_stratum(dev, stratum):
        return (f"{kind} evidence for {key!r} on {stratum} in {path} cannot gate: it was recorded on {dev!r}, "
                f"not a {stratum} device (an entry copied between strata). {hint}")
    looser = _looser_than_runs(entry, runs, kind)
    if looser:
        return f"{kind} evidence for {key!r} on {stratum} in {path} cannot gate: {looser}. {hint}"
    if len({_owner(r) for r in runs}) >= 2:
        try:
            why = pooling_problem(runs, kind=kind, headroom=float(entry.get("headroom", 0.5)), dim=entry.get("dim"),
                                  floor_u=_pair_u(entry))
        except (ValueError, TypeError, KeyError, ArithmeticError) as exc:
            why = f"its runs of several tests cannot be checked for pooling ({exc})"
        if why:
            return f"{kind} evidence for {key!r} on {stratum} in {path} cannot gate: {why}. {hint}"
    t = _context.current_test()
    tests = entry.get("tests")
    tests = [x for x in tests if isinstance(x, str)] if isinstance(tests, list) else []
    ids = [r for r in runs if isinstance(r.get("test"), str)]
    # the tests that recorded it: its tests list, or without one the tests its runs name
    tests = tests or list(dict.fromkeys(r["test"] for r in ids))
    from .gates import _expecting

    if t is None and tests and _context.current_session() is not None:
        if not _expecting():  # a fixture's gate, at collection: owned by no test (calibration refuses it too)
            return (f"{kind} evidence for {key!r} on {stratum} in {path} was recorded by {', '.join(tests)}, and "
                    f"this gate runs outside a test's call (a fixture, at import), which records and owns no "
                    f"evidence: gate in the test's body. {hint}")
    # runs recorded with their test's module relative to the evidence file name their tests whatever the root
    # directory; older runs by their test ids alone
    me = {"test": t.nodeid, "test_module": _test_module(t, path)} if t is not None else {}
    owned = t is None or any(
        _same_owner(r, me) if isinstance(r.get("test_module"), str) else _same_test(r["test"], t.nodeid, t.path)
        for r in ids) or (not ids and (not tests or any(_same_test(x, t.nodeid, t.path) for x in tests)))
    if not owned:
        if not _expecting():  # a planted fault (this thread's block) gates on its clean test's evidence
            fn = t.nodeid.split("[", 1)[0]
            case = "[" in t.nodeid and any(_same_test(x.split("[", 1)[0], fn) for x in tests)
            label = "name=" if kind == "t1_floor" else "case="
            return (f"{kind} evidence for {key!r} on {stratum} in {path} was recorded by {', '.join(tests)}, "
                    f"not by this {'case' if case else 'test'} ({t.nodeid}): a test gates on its own runs, and "
                    f"tests share bars only when each recorded runs into them (calibrate this one; give it its own "
                    f"{label} when it is another experiment; a planted-fault test reads a clean test's evidence inside "
                    f"vgct_ext.expect_gate_failure; a renamed or moved test: recalibrate it, and drop the old "
                    f"id's runs, whose drift would stay pooled in the bars: python -m vgct_ext evidence remove "
                    f"{path} \"{key}\" --test OLD_ID). {hint}")
    return None


# a stored bar or floor may exceed the one its runs re-derive by this much (relative; of 1 - cosine for the cosine)
# before the entry counts as looser than its runs: the JSON holds exact doubles, and the rule's arithmetic is the
# same as the calibration's (fsum, log, exp), so only a change of libm could move a bar by an ulp or two
_REDERIVE_RTOL = 1e-9


def _looser_than_runs(entry: Mapping[str, Any], runs: Sequence[Mapping[str, Any]], kind: str) -> Optional[str]:
    """Why an entry's bars (T2) or floor (T1 floor) cannot be trusted against its own recorded runs, or None: it
    holds no runs (bars come only from recorded runs; a hand-written entry, or a merge that dropped them), its
    runs cannot re-derive them, or a stored bar (floor) is looser than the one its runs give by the bar rule at
    the entry's headroom (a hand edit, a careless merge-conflict resolution: hostile review of 2026-12-05 raised
    three bars 1000x and a 1.5x scale fault passed).  A tighter stored bar is kept (it can only fail more)."""
    what = "bars" if kind == "t2" else "floor"
    if not runs:
        return (f"it holds no calibration runs, so its {what} cannot be checked against them ({what} come only "
                f"from recorded runs: a hand-written entry, or a merge that dropped its runs)")
    try:
        if kind == "t2":
            stored = entry.get("bars") or {}
            derived = bar_summary(runs, float(entry.get("headroom", 0.5)), entry.get("dim"))["bars"]
        else:
            stored = entry.get("floor") or {}
            derived = _floor_of(runs)
        worse = []
        for k, v in stored.items():
            if k in derived and _finite_number(v):
                # a distance from "no difference": the cosine's 1 - cosine, every other bar itself
                mine, theirs = (1.0 - float(v), 1.0 - derived[k]) if k == "cosine" else (float(v), derived[k])
                if mine > theirs + _REDERIVE_RTOL * abs(theirs):
                    worse.append(f"{k} {float(v):.6g} (its runs give {float(derived[k]):.6g})")
    except (ValueError, TypeError, KeyError, ArithmeticError) as exc:
        return f"its runs cannot re-derive its {what} ({exc})"
    if worse:
        return (f"its {what} are looser than its own recorded runs give by the bar rule: " + ", ".join(worse) +
                f" -- edited by hand, or merged from another entry; {what} come only from calibration")
    return None


def _test_module(t: Any, evidence: Path) -> Optional[str]:
    """The module of test ``t`` relative to the evidence file's directory (``test_x.py``, ``sub/test_x.py``,
    ``../wan/test_x.py``; "/" separators), or None when it is not known.

    One test must get one module however the paths are named, and the links between the evidence file and the
    test must count as named.  So the test's path is resolved, and of the evidence file's directory (as named)
    the deepest ancestor that resolves into the test's tree is resolved; what lies below it is kept as named:
    a checkout reached through a link (an IDE's absolute path, ``Path(__file__).resolve()``) is one checkout; an
    evidence file, or an evidence folder, that is a link into a shared place (moved there and linked back, or
    shared by several checkouts) gives each checkout's test the module it has beside the link.  Resolving the
    whole evidence path made every run recorded before such a move another test's, kept and pooled with the
    test's new runs; resolving none made the same test two through a checkout link (hostile reviews of
    2026-12-05: a 3x, and a 1.5x, drift passed on the pooled bars)."""
    p = getattr(t, "path", None)
    if p is None:
        return None
    try:
        test = os.path.realpath(p)
        anchor, below = os.path.dirname(os.path.abspath(evidence)), []
        while True:
            real = os.path.realpath(anchor)
            if os.path.commonpath([test, real]) == real:  # (the root at the latest)
                break
            below.append(os.path.basename(anchor))
            anchor = os.path.dirname(anchor)
        return os.path.relpath(test, os.path.join(real, *reversed(below))).replace(os.sep, "/")
    except (OSError, ValueError):  # (Windows: another drive)
        return None


def _same_owner(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two runs (or a run and the running test, ``{"test": nodeid, "test_module": ...}``) belong to one
    test: equal test ids; or, when both carry their module relative to the evidence file, equal modules and test
    names with one id the other under a longer path (pytest run from another root directory).  Equal modules
    alone are not enough: two directories that are one through a symbolic link hold different tests (third
    review of 2026-12-05); nor are suffix ids alone: ``test_x.py::f`` and ``sub/test_x.py::f`` from one root
    are two tests (second review)."""
    ta, tb = a.get("test"), b.get("test")
    ma, mb = a.get("test_module"), b.get("test_module")
    if not (isinstance(ta, str) and isinstance(tb, str)):
        return False
    if isinstance(ma, str) and isinstance(mb, str):  # (equal ids from two root directories differ in module)
        return ma == mb and _nested_ids(ta, tb)
    return ta == tb


def _owner(r: Mapping[str, Any]) -> Tuple[Optional[str], str]:
    """The test a run belongs to, as runs are grouped per test (:func:`pooling_problem`, :func:`_unusable`):
    its module relative to the evidence file and its id (``(None, id)`` for a run recorded without its module;
    ``"None"`` for one without an id), as :func:`_same_owner` tells tests apart -- one id recorded from two
    modules (same-named tests of two folders sharing a file through ``evidence=``) is two tests."""
    m = r.get("test_module")
    return (m if isinstance(m, str) else None), str(r.get("test"))


def _nested_ids(a: str, b: str) -> bool:
    """Two test ids equal, or one the other under a longer path (``sub/test_x.py::f``, ``test_x.py::f``)."""
    return a == b or a.endswith("/" + b) or b.endswith("/" + a)


def _same_test(recorded: str, nodeid: str, path: Optional[Path] = None) -> bool:
    """Whether a test id an entry recorded names the running test (``nodeid``, whose module is ``path``): equal,
    or one is the other under a longer path (``a/test_x.py::test_f`` and ``test_x.py::test_f``: pytest run from
    another root directory) -- unless the recorded module path, taken from this session's root directory, is
    another file that exists (``test_x.py::test_f`` beside ``sub/test_x.py::test_f``: two tests sharing one
    evidence file; review of 2026-12-05)."""
    if recorded == nodeid:
        return True
    if not _nested_ids(recorded, nodeid):
        return False
    if path is None:
        return True
    try:
        root = Path(path)
        for _ in Path(nodeid.split("::", 1)[0]).parts:  # this session's root directory
            root = root.parent
        other = root / recorded.split("::", 1)[0]
        return not other.exists() or other.resolve() == Path(path).resolve()
    except (OSError, ValueError):
        return False


def _with_tests(entry: Mapping[str, Any]) -> str:
    """`` every test whose runs the entry holds (...)`` when it holds another test's than the running one: a
    recalibration of one test keeps the others' runs, which lack a statistic they were recorded without."""
    tests = [t for t in entry.get("tests") or [] if isinstance(t, str)]
    t = _context.current_test()
    if not tests or (t is not None and tests == [t.nodeid]):
        return ""
    return " every test whose runs it holds, together (" + ", ".join(tests) + ")"


def lookup(path: Path, key: str, stratum: str, stats: Any, dim: Optional[int],
           given: Union[str, "os.PathLike[str]", None] = None) -> Tuple[Optional[dict], Optional[str]]:
    """``(entry, None)`` when usable T2 evidence exists for ``key`` on ``stratum``, else ``(None, why)`` (also for
    an entry :func:`_unusable` refuses: pooled runs of several tests, a headroom out of range, another case's
    evidence)."""
    entry, why = _find_entry(path, key, stratum, "T2", given)
    if entry is None:
        return None, why
    if entry.get("kind", "t2") != "t2":
        return None, f"evidence {key!r} on {stratum} in {path} is a {entry.get('kind')} entry, not T2 evidence"
    diff = _same_experiment(entry, stats, dim)
    if diff:
        return None, (f"T2 evidence for {key!r} on {stratum} in {path} was recorded for a different experiment ("
                      + "; ".join(diff) + f"). Recalibrate. {_calibrate_hint(stratum, key)}")
    bars = entry.get("bars")
    if not isinstance(bars, dict) or not bars:
        return None, f"T2 evidence for {key!r} on {stratum} in {path} has no bars. {_calibrate_hint(stratum, key)}"
    stray = [k for k in PER_CHANNEL if k in bars] if dim is None else []
    if stray:  # calibration never writes these without dim: a hand edit, or another entry's bars
        return None, (f"T2 evidence for {key!r} on {stratum} in {path} has per-channel bar(s) "
                      f"{', '.join(stray)} but no dim, so they cannot be gated: the entry does not fit this "
                      f"gate. Recalibrate. {_calibrate_hint(stratum, key)}")
    zero = bool(stats.zero_reference)
    need = required_bars(dim, zero_reference=zero)
    missing = [k for k in need if k not in bars]
    bad = [f"{k}={v!r}" for k, v in bars.items() if not _finite_number(v)]
    if missing or bad:
        what = []
        if missing:
            what.append("no bar for " + ", ".join(missing))
        if bad:
            what.append("non-finite or non-numeric bar(s) " + ", ".join(bad))
        return None, (f"T2 evidence for {key!r} on {stratum} in {path} is incomplete: {'; '.join(what)}. A T2 gate "
                      f"needs a calibrated bar for each of {', '.join(need)}"
                      + (" (relative L2 and cosine are not required: the reference has zero norm)" if zero else "")
                      + f"; a statistic is never left ungated. Recalibrate{_with_tests(entry)}. "
                      f"{_calibrate_hint(stratum, key)}")
    why = _unusable(entry, path, key, stratum, "t2")
    if why:
        return None, why
    cos = bars.get("cosine")
    if cos is not None and cos < 0.99 and not _has_note(entry):
        return None, (f"T2 evidence for {key!r} on {stratum} in {path} sets a cosine bar of {fmt_exact('cosine', cos)}, "
                      f"under the 0.99 floor that requires investigation, and has no investigation note. "
                      f"Investigate the drift, then record what was found:\n    python -m vgct_ext evidence "
                      f"annotate {path} \"{key}\" --stratum {stratum} --investigation \"...\"")
    why = outlier_refusal(entry, path, key, stratum, "T2")
    if why:
        return None, why
    return entry, None


# --------------------------------------------------------------------------------------------------------------
# Gate identity and calibration runs


def claim(path: Path, key: str, *, gate: str, label_hint: str = "case=") -> None:
    """Within one run of a paired test, each evidence key may be gated once; under ``--vgct-calibrate`` within
    one run of any test (one without the markers and the vgct fixture records its gates' runs into one entry
    just the same, where they would pool: hostile review of 2026-12-05, a quiet output passed with 200x its
    drift on a noisy one's bars). Outside calibration such a test may gate one key repeatedly (unseen inputs in
    a loop). Raises :class:`AmbiguousGate` when ``key`` in ``path`` was already gated in this run (two outputs
    would share one bar)."""
    from .gates import _expecting

    t = _context.current_test()
    s = _context.current_session()
    paired = getattr(t, "paired", False)
    if t is None or not (paired or (s is not None and s.calibrate)) or _expecting():
        return  # (a planted fault in this thread's expect_gate_failure records nothing: it may reuse the key)
    ident = (str(path), key)
    if ident in t.claims:
        raise AmbiguousGate(
            f"{gate} gated {key!r} twice in one run of {t.nodeid}: each gate needs its own identity, otherwise "
            f"both outputs share one calibrated bar (the worst one's). Give each {gate} of this test its own "
            f"label: {label_hint}'...' (or name='...')." + ("" if paired else
            " A test without the vgct fixture runs once under --vgct-calibrate: to calibrate one gate on "
            "several inputs, take the vgct fixture and make the inputs from vgct.seed (--vgct-calibrate runs "
            "it once a seed)."))
    t.claims.add(ident)


def add_calibration_run(session: Any, path: Path, key: str, stratum: str, stats: Any,
                        observed: Mapping[str, Any], *, component: str, feature: str, case: Optional[str],
                        dim: Optional[int], kind: str = "t2") -> None:
    """Queue one calibration run (written by :func:`write_calibration` at the end of the session).

    A run made inside :func:`vgct_ext.expect_gate_failure` (a planted fault), or while such a block is open
    anywhere in the process, is never queued: a faulty run must not become evidence (a floor or a bar); the
    gates raise :class:`vgct_ext.gates.PlantedFaultWhileCalibrating` before calling this, and so does this
    (a block opened in between).  Raises ``ValueError`` (the run is refused, nothing queued)
    for a run :func:`check_calibration_run` rejects (T2 only): a non-finite pair, a zero-norm reference, or an
    undefined/non-finite statistic; :class:`AmbiguousGate` when the runs queued for one key disagree on
    dtype, shape or dim; ``FileNotFoundError`` / ``NotADirectoryError`` when the evidence file's folder does not
    exist (at the first run, not when the session ends with every run measured: a review of 2026-12-05)."""
    from .gates import PlantedFaultWhileCalibrating, _planted_message, _planted_open

    if _planted_open():  # never a silent skip: a bar built from fewer runs than claimed
        raise PlantedFaultWhileCalibrating(_planted_message("calibration run", component, feature))
    what = "calibration" if kind == "t2" else "T1 floor calibration"
    from . import _files

    _files.check_lockable(path)  # (the write at the session's end needs it: fail this test now)
    t = _context.current_test()
    if t is None:  # (a fixture's gate, a collection-time one: a run of no test)
        raise ValueError(f"{what} of {key!r} on {stratum} refused: the gate runs outside a test's call (in a "
                         f"fixture, at import), so its run would belong to no test and any test could gate on it. "
                         f"Gate in the test's body; nothing is recorded from this run.")
    if kind == "t2":
        why = check_calibration_run(stats, observed, dim)
    else:
        why = None if stats.n_finite == stats.n and stats.n > 0 and not stats.zero_reference and all(
            _finite_number(observed.get(k)) for k in FLOOR_STATS) else (
            "a floor needs a finite comparison with a nonzero reference and defined statistics")
    if why is not None:
        raise ValueError(f"{what} of {key!r} on {stratum} refused: {why}. No evidence is recorded from this "
                         f"run; fix the experiment and rerun pytest --vgct-calibrate.")
    if not t.paired:  # (new-user trial: a plain test's one run became an entry, its bars 1.5x one sample)
        raise ValueError(f"{what} of {key!r} on {stratum} refused: {t.nodeid} has no t1/t2/component/feature marker "
                         f"and does not use the vgct fixture, so --vgct-calibrate runs it once, on one seed: one "
                         f"run cannot calibrate a bar (at least 3 seeds, --vgct-calibrate-runs). Mark the test and "
                         f"make its inputs from vgct.seed; nothing is recorded from this run.")
    if t.repetition > 0:
        return  # --vgct-repeat: a repetition of a seed already recorded (identical, or the test fails anyway)
    slot = session.calibration.get((str(path), key, stratum))
    if slot is None:  # with the test process's versions and precision switches (under xdist the controller
        # writes the file, and runs no test: its torch may not even be imported -- new-user trial, 2026-12-05:
        # "precision" became {})
        slot = session.calibration[(str(path), key, stratum)] = {
            "kind": kind, "runs": [], "meta": None, "tests": [], "versions": versions(),
            "precision": precision_settings()}
    run = {k: v for k, v in observed.items()}
    run["test"] = t.nodeid
    module = _test_module(t, path)
    if module is not None:  # (the test's module from the evidence file: an id no root directory changes)
        run["test_module"] = module
    run["seed"] = int(t.seed)
    meta = {"kind": kind, "component": component, "feature": feature, "case": case,
            "dtype_actual": stats.dtype_actual, "dtype_expected": stats.dtype_expected, "shape": list(stats.shape),
            "dim": dim, "device": describe_device(stats.device)}
    if slot["meta"] is None:
        slot["meta"] = meta
    else:
        diff = _meta_diff(slot["meta"], meta)
        if diff:
            raise AmbiguousGate(f"{what} of {key!r} on {stratum}: runs disagree on the experiment ({diff}); one key "
                                f"names one experiment: give each its own case= (or name=)")
    slot["runs"].append(run)
    if run["test"] not in slot["tests"]:
        slot["tests"].append(run["test"])


def pooling_problem(runs: Sequence[Mapping[str, Any]], *, kind: str, headroom: float,
                    dim: Optional[int], floor_u: float = 0.0) -> Optional[str]:
    """Why the runs of several tests must not share one entry, or None.

    Runs of one key from several tests (a parametrized test whose cases share the component and feature
    labels, or two tests) are pooled into one set of bars (or one T1 floor), which gates each of them.  When
    the tests are different experiments that the dtype/shape/dim check cannot tell apart (bf16 and fp16
    autocast both returning float32), the pooled bar is the noisiest test's and a real bug in a quieter test
    passes (new-user trial, 2026-12-01: a 5 % softmax-scale error in the fp16 case passed a bar pooled with
    the bf16 case).  The pooled bar of each statistic is compared with the bar each test's own runs give (the
    same rule, the same headroom): more than ``POOL_CAP`` x looser for any test (1 - cosine: ``POOL_CAP``
    squared; a statistic that is 0 in all of a test's own runs and not in the pool: infinitely looser) is
    refused.  T1 floors are compared as :func:`tighten_t1` uses them: relative L2 and 1 - cosine, each raised to
    the pair's resolution (``floor_u``, the unit roundoff u of the less precise dtype: u and u^2 / 2), so floors
    below it are equal.  Runs without a test id (written before test ids were recorded) count as one test; a
    test is its module and id (:func:`_owner`): one id recorded from two modules is two tests, named with
    their modules."""
    by_test: Dict[Tuple[Optional[str], str], List[Mapping[str, Any]]] = {}
    for r in runs:
        by_test.setdefault(_owner(r), []).append(r)
    if len(by_test) < 2:
        return None
    ids = collections.Counter(t for _, t in by_test)

    def label(o: Tuple[Optional[str], str]) -> str:  # a test's id, with its module where two share the id
        return o[1] if ids[o[1]] == 1 or o[0] is None else f"{o[1]} (from {o[0]})"

    if kind == "t1_floor":
        def clamp(f: Mapping[str, float]) -> Dict[str, float]:
            return {"rel_l2": max(f["rel_l2"], floor_u), "one_minus_cosine": max(f["one_minus_cosine"],
                                                                                 floor_u * floor_u / 2.0)}
        pooled = clamp(_floor_of(runs))
        own = {t: clamp(_floor_of(rs)) for t, rs in by_test.items()}
        sq = ("one_minus_cosine",)
        what = "T1 floor"
    else:
        pooled = {k: (1.0 - v if k == "cosine" else v) for k, v in bar_summary(runs, headroom, dim)["bars"].items()}
        own = {t: {k: (1.0 - v if k == "cosine" else v) for k, v in bar_summary(rs, headroom, dim)["bars"].items()}
               for t, rs in by_test.items()}
        sq = ("cosine",)
        what = "bar"
    worst: Optional[Tuple[float, Tuple[Optional[str], str], str, float, float]] = None
    for t, bars in own.items():
        for k, mine in bars.items():
            pv = pooled.get(k)
            if pv is None or not pv > mine:
                continue
            cap = POOL_CAP ** 2 if k in sq else POOL_CAP
            ratio = pv / mine if mine > 0.0 else math.inf
            if ratio > cap and (worst is None or ratio > worst[0]):
                worst = (ratio, t, k, mine, pv)
    if worst is None:
        return None
    ratio, t, k, mine, pv = worst
    name = "1 - cosine" if k in sq else k
    others = sorted(label(x) for x in by_test if x != t)
    return (f"the runs of {len(by_test)} tests pool into this entry, and the pooled {what} of {name} "
            f"({pv:.3g}) is {'infinitely' if math.isinf(ratio) else f'{ratio:.3g}x'} the one {label(t)}'s own runs "
            f"give ({mine:.3g}; at most {POOL_CAP ** 2 if k in sq else POOL_CAP:g}x): pooled with "
            f"{', '.join(others)}, its gate would pass drift its own runs never showed"
            f"{' (its own value is exactly 0)' if mine == 0.0 else ''}. Give each test its own "
            + ("name= (e.g. name=<the parametrization>) so that each gets its own floor" if kind == "t1_floor" else
               "case= (e.g. case=<the parametrization>) so that each gets its own bars"))


def _meta_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> str:
    return "; ".join(f"{k} {a.get(k)!r} vs {b.get(k)!r}" for k in _EXPERIMENT if _differs(k, a, b))


def floor_statistics(stats: Any) -> Dict[str, Any]:
    """What a tightened T1 gate records as its floor: relative L2, cosine, max abs error."""
    return {"rel_l2": stats.rel_l2, "cosine": stats.cosine, "max_abs_err": stats.max_abs_err}


# unit roundoff of each dtype (2^-p, p the significand precision); a floor below it is the dtype's resolution
_UNIT_ROUNDOFF = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8,
                  "float8_e4m3fn": 2.0 ** -4, "float8_e4m3fnuz": 2.0 ** -4, "float8_e5m2": 2.0 ** -3,
                  "float8_e5m2fnuz": 2.0 ** -3}


def tighten_t1(bars: Any, tighten: Optional[float], stats: Any, *, component: str, feature: str,
               label: Optional[str], evidence: Union[str, "os.PathLike[str]", None] = None) -> Tuple[Any, Dict]:
    """``(bars, extra_record_fields)`` for ``assert_t1(..., tighten=k)``.

    Without ``tighten``: ``(bars, {})``. Under ``--vgct-calibrate``: the gate's relative L2, cosine and max abs
    error are queued as a floor run for ``"T1 floor | component | feature[ | label]"`` and ``bars`` are returned
    unchanged. Otherwise the floor recorded for this stratum sets
    ``rel_l2 bar = min(bar, k * max(floor rel L2, u))`` and ``cosine bar = max(bar, 1 - k * max(floor of
    1 - cosine, u^2 / 2))``, u the unit roundoff of the less precise dtype of the pair (a floor below the
    dtype's resolution is not a floor: bit-exactness is never required). Raises ``ValueError`` for ``k``
    outside [1, 1e6], :class:`vgct_ext.gates.EvidenceMissing` when no usable floor is recorded, and -- under
    ``--vgct-calibrate`` inside :func:`vgct_ext.expect_gate_failure` or while such a block is open elsewhere in
    the process, before anything is recorded -- :class:`vgct_ext.gates.PlantedFaultWhileCalibrating` (the block
    ends quietly on it, as for T2 gates).
    """
    if tighten is None:
        return bars, {}
    if isinstance(tighten, bool) or not isinstance(tighten, (int, float)) or not 1.0 <= float(tighten) <= 1e6:
        raise ValueError(f"assert_t1: tighten must be a number in [1, 1e6] (bar = measured floor x tighten), "
                         f"got {tighten!r}")
    from ._hardware import stratum_of

    k = float(tighten)
    path = evidence_path(evidence)
    key = t1_floor_key(component, feature, label)
    claim(path, key, gate="assert_t1(tighten=)", label_hint="name=")  # (two outputs would share one floor)
    stratum = stratum_of(stats.device)
    session = _context.current_session()
    extra: Dict[str, Any] = {"tighten": k, "evidence": str(path), "evidence_key": key}
    if session is not None and session.calibrate:
        from .gates import PlantedFaultWhileCalibrating, _planted_message, _planted_open

        if _planted_open():
            # a planted fault (expect_gate_failure) under --vgct-calibrate: the gate would record its floor and
            # gate at the loose bars, which a fault only floor x k catches passes -- a false "not caught" alarm;
            # the fault is checked in the gating run, and no run becomes a floor while a planted-fault block is
            # open in any thread
            raise PlantedFaultWhileCalibrating(_planted_message("tightened T1 gate", component, feature))
        add_calibration_run(session, path, key, stratum, stats, floor_statistics(stats), component=component,
                            feature=feature, case=label, dim=None, kind="t1_floor")
        extra["calibrating"] = True
        return bars, extra
    entry, why = _find_entry(path, key, stratum, "T1 floor", evidence)
    if entry is not None:
        if entry.get("kind") != "t1_floor" or not isinstance(entry.get("floor"), dict):
            entry, why = None, f"evidence {key!r} on {stratum} in {path} is not a T1 floor entry. Recalibrate."
        else:
            diff = _same_experiment(entry, stats, None)
            unusable = _unusable(entry, path, key, stratum, "t1_floor")
            if unusable:
                diff = diff + [unusable]
            miss = [f for f in ("rel_l2", "one_minus_cosine") if not _finite_number(entry["floor"].get(f))]
            if diff or miss:
                why = (f"T1 floor evidence for {key!r} on {stratum} in {path} does not fit: "
                       + "; ".join(diff + [f"no floor for {m}" for m in miss]) + ". Recalibrate. "
                       + _calibrate_hint(stratum, key))
                entry = None
            else:
                why = outlier_refusal(entry, path, key, stratum, "T1 floor")
                if why:
                    entry = None
    if entry is None:
        from .gates import EvidenceMissing

        raise EvidenceMissing(f"T1 gate with tighten={k:g} cannot run: component {component!r}, feature "
                              f"{feature!r}: {why}", stats, [])
    u = max(_UNIT_ROUNDOFF.get(stats.dtype_actual, 2.0 ** -24), _UNIT_ROUNDOFF.get(stats.dtype_expected, 2.0 ** -24))
    f_rel = max(float(entry["floor"]["rel_l2"]), u)
    f_cos = max(float(entry["floor"]["one_minus_cosine"]), u * u / 2.0)
    new = dataclasses.replace(bars, rel_l2=min(bars.rel_l2, k * f_rel), cosine=max(bars.cosine, 1.0 - k * f_cos))
    extra["floor"] = dict(entry["floor"])
    extra["floor_used"] = {"rel_l2": f_rel, "one_minus_cosine": f_cos, "unit_roundoff": u, "stratum": stratum}
    return new, extra


# --------------------------------------------------------------------------------------------------------------
# Writing


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


def _legacy_test(old: Mapping[str, Any]) -> Optional[str]:
    tests = old.get("tests") or []
    return tests[0] if len(tests) == 1 else None


#: A run whose relative L2 is this many times the low median of its test's runs is an outlier: named when
#: calibrating, and the entry gates nothing until it is investigated or recalibrated (:func:`outlier_refusal`) --
#: bars and floors follow the worst run, so a bug present on some inputs when calibrating becomes the bar
#: (new-user trials of 2026-12-05: one bugged seed of five raised a T1 floor 66x without a word; at 8x, a seed
#: at 7.85x loosened the bars 21x unnamed, and a calibration's warnings were never seen again when gating).
#: Relative L2 (and the per-channel one, CHANNEL_OUTLIER_RATIO): it averages over the tensor, so clean seeds agree -- the repository's 14 entries of 3+
#: runs measure worst / low median 1.07-1.44, and bf16 rounding of normal, Student-t(3), log-normal and softmax
#: data of 8-4096 elements reaches 4x in 0-2 % of 5-seed calibrations (8 elements; 0 from 64 on); a maximum
#: (max abs error), 1 - cosine of a peaked tensor, or one exact seed among inexact ones vary far more on clean
#: data (a review: 5-90 % of such calibrations), and are only warned about (WARN_RATIO).
OUTLIER_RATIO = 4.0
#: The same for the per-channel relative L2 (``channel_rel_l2``, the largest of the channels' relative L2 errors):
#: each channel's error averages over that channel, so clean seeds agree as they do for relative L2, while a bug in
#: one channel moves it alone (a new-user trial of 2026-12-06: an offset in one channel of 64 on one seed of five
#: measured 3.6x the others' per-channel relative L2 and 1.2x their relative L2, and loosened the per-channel bars
#: 9-15x without a word; the bug then passed on every seed). Measured clean: bf16 rounding of normal, Student-t(3),
#: log-normal and softmax data, 4-320 channels of 16-4096 elements, 40 five-seed calibrations each (1920): the
#: worst run never reached 2.5x the low median (medians 1.01-1.24x); the repository's entries: at most 1.66x.
CHANNEL_OUTLIER_RATIO = 3.0
#: The statistics :func:`outlier_refusal` refuses for, and their ratios.
REFUSE_RATIOS = {"rel_l2": OUTLIER_RATIO, "channel_rel_l2": CHANNEL_OUTLIER_RATIO}
#: The other statistics' warning ratio (1 - cosine: its square); a run non-zero where the others' low median
#: is 0 is warned about too.
WARN_RATIO = 8.0

_OUTLIER_WHY = (": the bars follow the worst run, so a bug present on some inputs when calibrating becomes the bar "
                "-- check that input (rerun the seed against known-good code) before trusting these bars")


#: Why :func:`merge_entry` (calibration, ``evidence remove --test``) dropped an entry's investigation note, by
#: its ``change["note_dropped"]``: the summary and the CLI say it in these words.
NOTE_DROPPED_WHY = {
    "cosine": "it explained the old cosine bar, and the new one is looser and under 0.99",
    "outliers": "it explained other outlier runs, or the same ones at tighter bars, than the entry holds now",
}


def _stat_values(runs: Sequence[Mapping[str, Any]], k: str) -> List[Tuple[float, Mapping[str, Any]]]:
    """``(value, run)`` for each run with a finite statistic ``k`` -- for ``"cosine"`` its 1 - cosine, the
    drift that grows like the others."""
    return [(1.0 - float(r[k]) if k == "cosine" else float(r[k]), r) for r in runs if _finite_number(r.get(k))]


def _owner_groups(runs: Sequence[Mapping[str, Any]]) -> List[List[Mapping[str, Any]]]:
    """The runs by the test that recorded them (an entry pooling several tests: each is compared with its own
    runs, whose drift may differ from another test's by more than the outlier ratio, clean)."""
    groups: Dict[Any, List[Mapping[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r.get("test"), r.get("test_module")), []).append(r)
    return list(groups.values())


def _outlier_findings(runs: Sequence[Mapping[str, Any]], *, refuse: bool = False, floor_u: Optional[float] = None,
                      zero_u: Optional[float] = None) -> Dict[str, Tuple[str, List[Mapping[str, Any]]]]:
    """For each statistic some of whose runs measured at least its ratio times the low median of their test's
    runs (``statistics.median_low``: a run's own value when their number is odd, the lower middle one when it
    is even; three runs of the test or more) -- relative L2 ``OUTLIER_RATIO``, the per-channel relative L2
    ``CHANNEL_OUTLIER_RATIO``, the others ``WARN_RATIO`` (1 - cosine its square; not the per-channel mean shift, a
    signed mean near 0) -- or, for a warning, above 0 where that median is 0: ``(text, runs)``, a sentence naming
    every such run's test and seed, worst first, and those runs. ``refuse``: those two statistics alone
    (``REFUSE_RATIOS``, what :func:`outlier_refusal` refuses), where the median is 0
    only a run above ``zero_u`` (the pair's unit roundoff: a real error, not a few ties rounded the other way);
    ``floor_u``: values raised to it first (a T1 floor's resolution: below it the gate is the same). A test with
    fewer than three runs in a pooled entry is compared with the low median of all the runs. The low median is a
    clean run's while fewer than half the runs are bugged (two of five, two of four), so each bugged seed is
    named; with most runs bugged the bugs are the bars' reference and nothing here can tell them."""
    out: Dict[str, Tuple[str, List[Mapping[str, Any]]]] = {}
    groups = _owner_groups(runs)
    for k in (tuple(REFUSE_RATIOS) if refuse else UPPER + ("cosine",)):
        if k == "channel_mean_shift":  # a signed mean near 0 under unbiased noise: its ratios are unbounded on clean
            continue  # data (one channel: 4-5 % of clean bf16 calibrations warned; a review); rel_l2 shows a bug
        ratio = REFUSE_RATIOS.get(k, WARN_RATIO ** 2 if k == "cosine" else WARN_RATIO)
        # (a median of 0: the feature exact on most seeds, and not on these -- warned; relative L2 refused above
        # zero_u. The per-channel relative L2 there is warned only: one tie rounded the other way in a small
        # channel is 1-2 unit roundoffs of that channel, which no bound on u tells from a bug, and relative L2
        # over the tensor refuses a real error there; a review of 2026-12-06: 3-100 % of such clean calibrations
        # were refused at 1-8 elements a channel)
        zero = 0.0 if not refuse else zero_u if zero_u is not None and k == "rel_l2" else math.inf
        hits: List[Tuple[float, float, Mapping[str, Any]]] = []  # (value, its test's median, run)

        def values(rs: Sequence[Mapping[str, Any]]) -> List[Tuple[float, Mapping[str, Any]]]:
            vals = _stat_values(rs, k)
            return [(max(v, floor_u), r) for v, r in vals] if floor_u is not None else vals

        pooled = [v for v, _ in values(runs)]
        for g in groups:
            vals = values(g)
            if len(vals) >= 3:
                med = statistics.median_low([v for v, _ in vals])
            elif len(groups) > 1 and len(pooled) >= 3:  # (a test of one or two runs: against the pool's)
                med = statistics.median_low(pooled)
            else:
                continue
            hits += [(v, med, r) for v, r in vals if (v >= ratio * med if med > 0.0 else v > zero)]
        if not hits:
            continue
        hits.sort(key=lambda h: -h[0])
        what = "1 - cosine" if k == "cosine" else k
        who = "one run" if len(hits) == 1 else f"{len(hits)} runs"
        where = ", ".join(f"({r.get('test')}, seed {r.get('seed')})" for _, _, r in hits)
        if all(m > 0.0 for _, m, _ in hits):
            times = " / ".join(f"{v / m:.3g}x" for v, m, _ in hits)
            text = f"{k}: {who} measured {times} the median of the runs' {what} {where}"
        else:
            vs = " / ".join(f"{v:.3g}" for v, _, _ in hits)
            text = f"{k}: {who} measured {what} {vs} where the median of the runs is 0 {where}"
        out[k] = (text, [r for _, _, r in hits])
    return out


def _outliers(runs: Sequence[Mapping[str, Any]], floor_u: Optional[float] = None) -> Dict[str, str]:
    """The calibration's warnings of :func:`_outlier_findings`, one a statistic (a T1 floor's: its values raised
    to ``floor_u`` first, as the gate uses them)."""
    return {k: text + _OUTLIER_WHY for k, (text, _) in _outlier_findings(runs, floor_u=floor_u).items()}


def _outlier_runs(runs: Sequence[Mapping[str, Any]], floor_u: Optional[float] = None,
                  zero_u: Optional[float] = None) -> List[Tuple[str, Any]]:
    """The (test, seed) of every run :func:`outlier_refusal` refuses for, sorted: what an investigation note
    explains (a recalibration with an outlier it did not explain drops the note)."""
    return sorted({(str(r.get("test")), str(r.get("seed"))) for _, rs in
                   _outlier_findings(runs, refuse=True, floor_u=floor_u, zero_u=zero_u).values() for r in rs})


def _entry_runs(entry: Mapping[str, Any]) -> List[Mapping[str, Any]]:
    """The entry's runs that are records (a hand-edited file may hold anything: the gate's checks name it)."""
    runs = entry.get("runs")
    return [r for r in runs if isinstance(r, dict)] if isinstance(runs, list) else []


def _has_note(entry: Mapping[str, Any]) -> bool:
    note = entry.get("investigation")
    return isinstance(note, str) and bool(note.strip())


def outlier_refusal(entry: Mapping[str, Any], path: Any, key: str, stratum: str, what: str) -> Optional[str]:
    """Why ``entry`` must not gate, or None: a run's relative L2 is ``OUTLIER_RATIO`` x the low median of its
    test's runs, or its per-channel relative L2 ``CHANNEL_OUTLIER_RATIO`` x theirs (:func:`_outlier_findings`
    with ``refuse``; a T1 floor's raised to the pair's unit roundoff
    first, as the gate uses it) and the entry has no investigation note. The bars follow the worst run, so a bug present on some inputs while calibrating
    would be the bar for every later gate -- the calibration's warning scrolls past, and the gate kept
    passing on those bars (new-user trial of 2026-12-05: a 10 % scale error passed on bars set by two bugged
    seeds). ``what``: "T2" or "T1 floor"."""
    if _has_note(entry):
        return None
    runs = _entry_runs(entry)
    u = _pair_u(entry)
    found = _outlier_findings(runs, refuse=True, floor_u=u if what == "T1 floor" else None, zero_u=u)
    if not found:
        return None
    return (f"{what} evidence for {key!r} on {stratum} in {path} was calibrated with runs far above the others "
            f"({'; '.join(text for text, _ in found.values())}): the bars follow the worst run, so a bug present "
            f"on those inputs while calibrating would be the bar of every later gate. Rerun those seeds against "
            f"known-good code; then recalibrate without the bug, or, if those inputs are genuinely harder, record "
            f"what you found:\n    python -m vgct_ext evidence annotate {path} \"{key}\" --stratum {stratum} "
            f"--investigation \"...\"\n{_calibrate_hint(stratum, key)}")


def _runs_identical(runs: Sequence[Mapping[str, Any]]) -> bool:
    if len(runs) < 2:
        return False
    strip = [{k: v for k, v in r.items() if k not in ("test", "seed")} for r in runs]
    return all(s == strip[0] for s in strip[1:])


def _runs_exact(runs: Sequence[Mapping[str, Any]]) -> bool:
    """Every run measured no difference: relative L2 and max abs error 0 (and so p99 and the per-channel ones)."""
    return all(r.get("rel_l2") == 0.0 and r.get("max_abs_err") == 0.0 for r in runs)


def _floor_of(runs: Sequence[Mapping[str, Any]]) -> Dict[str, float]:
    return {"rel_l2": max(float(r["rel_l2"]) for r in runs),
            "one_minus_cosine": max(1.0 - float(r["cosine"]) for r in runs),
            "max_abs_err": max(float(r["max_abs_err"]) for r in runs)}


def _looser_bars(old: Mapping[str, Any], new: Mapping[str, Any]) -> List[str]:
    """The names of the bars (or floors) in both ``old`` and ``new`` that ``new`` makes looser: a lower cosine
    bar, a higher bar of any other statistic; sorted."""
    return sorted(k for k in set(old) & set(new) if old[k] is not None and new[k] is not None and
                  ((new[k] < old[k]) if k == "cosine" else (new[k] > old[k])))


def merge_entry(old: Optional[Mapping[str, Any]], slot: Mapping[str, Any], new_runs: List[Dict[str, Any]],
                *, headroom: float, command: str, now: str, key: str, stratum: str, path: str,
                old_runs: Optional[List[Mapping[str, Any]]] = None) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """``(entry, change)``: ``old`` with the runs of the tests in ``new_runs`` replaced by them, the runs of
    other tests kept, and the bars re-derived. Raises :class:`AmbiguousGate` when kept runs belong to another
    experiment (dtype, shape or dim). ``old_runs``: for a re-derivation of an entry's own runs (remove_test, which
    passes ``old`` without runs), those runs -- what its investigation note explained."""
    meta = dict(slot["meta"])
    kind = meta.pop("kind", "t2")
    rerun = {r.get("test") for r in new_runs}
    owners = list({(r.get("test"), r.get("test_module")): r for r in new_runs}.values())
    # a run is replaced only by its own test's (_same_owner): an equal id under another test_module is
    # another test sharing the file through evidence= (a same-named test in another folder), whose runs stay
    kept: List[Dict[str, Any]] = []
    replaced: List[Dict[str, Any]] = []
    if old:
        legacy = _legacy_test(old)
        for r in old.get("runs") or []:
            r = dict(r)
            if "test" not in r:
                r["test"] = legacy
            # (the same test from another root directory: its old runs are replaced, not kept as another's)
            (replaced if any(_same_owner(r, n) for n in owners) else kept).append(r)
        if kept:
            diff = _meta_diff(old, meta)
            if diff:
                others = sorted({str(r.get("test")) for r in kept})
                raise AmbiguousGate(
                    f"{path} [{key}] {stratum}: not merged: the recorded runs of {', '.join(others)} are another "
                    f"experiment ({diff}); one key names one experiment. Give the gates distinct case=/name= "
                    f"labels, or remove the old entry: python -m vgct_ext evidence remove {path} \"{key}\" "
                    f"--stratum {stratum}")
        if kind == "t2" and kept:
            need = required_bars(meta.get("dim"))
            stale = sorted({str(r.get("test")) for r in kept if any(r.get(k) is None for k in need)})
            if stale:  # recorded before a statistic was gated (channel_rel_l2): their runs cannot give its bar
                lacking = sorted({k for r in kept for k in need if r.get(k) is None})
                raise AmbiguousGate(
                    f"{path} [{key}] {stratum}: not written: the runs kept from {', '.join(stale)} lack "
                    f"{', '.join(lacking)} (recorded before it was gated), so no bar can be derived from them; "
                    f"recalibrate those tests together with this one: pytest --vgct-calibrate "
                    + " ".join(f'"{t}"' for t in sorted(rerun | set(stale), key=str)))
    runs = kept + new_runs
    pooled = pooling_problem(runs, kind=kind, headroom=headroom, dim=meta.get("dim"), floor_u=_pair_u(meta))
    if pooled:
        raise AmbiguousGate(f"{path} [{key}] {stratum}: not written: {pooled}")
    entry: Dict[str, Any] = {"kind": kind, **meta}
    tests: List[str] = []
    for r in runs:
        if r.get("test") and r["test"] not in tests:
            tests.append(r["test"])
    entry.update({"recorded": now, "command": command, "tests": tests,
                  "versions": slot["versions"] if "versions" in slot else versions(),
                  "precision": slot["precision"] if "precision" in slot else precision_settings(), "runs": runs,
                  "investigation": (old or {}).get("investigation")})
    warnings: List[str] = []
    if _runs_identical(new_runs):
        if _runs_exact(new_runs):
            # every seed measured no difference at all: a bit-identical feature (a cache hit) looks the same
            # whether or not the test varies its inputs, so the warning says both (new-user trial: the
            # "does not vary its inputs" form misled on a test that did)
            warnings.append(f"all {len(new_runs)} calibration runs measured no difference (actual == expected bit "
                            f"for bit on every seed): the bars are 0 and cosine 1, so any difference fails this "
                            f"gate; check that the test varies its inputs with vgct.seed (if it does not, the "
                            f"bars rest on a single input)")
        else:
            warnings.append(f"all {len(new_runs)} calibration runs were bitwise identical: the test does not vary "
                            f"its inputs with vgct.seed, so the bars rest on a single input")
    change: Dict[str, Any] = {"file": path, "key": key, "stratum": stratum, "kind": kind,
                              "status": "updated" if old else "new", "added": len(new_runs),
                              "replaced": len(replaced), "kept": len(kept),
                              "kept_tests": sorted({str(r.get("test")) for r in kept}),
                              "seeds": sorted({r.get("seed") for r in new_runs if r.get("seed") is not None}),
                              "runs": len(runs), "identical_runs": bool(warnings), "warnings": warnings}
    u = _pair_u(meta)
    floor_u = u if kind == "t1_floor" else None
    outliers = _outliers(runs, floor_u)
    warnings.extend(outliers[k] for k in sorted(outliers))
    out_runs = _outlier_runs(runs, floor_u, u)
    change["outlier_runs"] = out_runs
    if kind == "t1_floor":
        entry["floor"] = _floor_of(runs)
        old_vals = dict((old or {}).get("floor") or {})
        change["values"] = [(k, old_vals.get(k), v) for k, v in entry["floor"].items()]
        change["bars"] = entry["floor"]
        change["looser"] = _looser_bars(old_vals, entry["floor"])
    else:
        summ = bar_summary(runs, headroom, meta.get("dim"))
        entry.update({"observed_worst": summ["worst"], "observed_log_mean": summ["log_mean"],
                      "observed_log_std": summ["log_std"],
                      "headroom": headroom, "confidence": CONFIDENCE, "headroom_rule": HEADROOM_RULE,
                      "bars": summ["bars"]})
        old_vals = dict((old or {}).get("bars") or {})
        change["values"] = [(k, old_vals.get(k), v) for k, v in sorted(summ["bars"].items())]
        change["bars"] = summ["bars"]
        change["looser"] = _looser_bars(old_vals, summ["bars"])
        cos = summ["bars"].get("cosine")
        if "cosine" in change["looser"] and cos < 0.99 and entry["investigation"]:
            # the note explained the old bar, not this looser one (hostile review: a recalibration with more
            # drift kept the note, and the gate passed a bar nobody investigated): the gate asks for a new note
            entry["investigation"] = None
            change["note_dropped"] = "cosine"
        # (not the per-channel mean shift: a signed mean near 0 under unbiased noise, one seed's far smaller
        # than another's on clean bf16 rounding -- a carried note; its bar is still capped, and an input where
        # the feature was inactive shows in relative L2's spread, warned here)
        for k in sorted(set(summ["capped"]) - {"channel_mean_shift"}):
            # (which way: the worst run far above the others -- a bug on its input, named by _outliers too --
            # or one far below -- the feature inactive there; a new-user trial read only the second)
            vals = sorted(_stat_values(runs, k), key=lambda v: v[0])
            spread = ""
            if len(vals) >= 2:
                (lo, lrun), (hi, hrun) = vals[0], vals[-1]
                spread = (f"the worst run ({hrun.get('test')}, seed {hrun.get('seed')}) measured "
                          + (f"{hi / lo:.3g}x" if lo > 0.0 else "more than 0 where")
                          + f" the least ({lrun.get('test')}, seed {lrun.get('seed')}): ")
            warnings.append(f"{k}: the runs spread so widely ({spread}a bug on the worst run's input? the feature "
                            f"inactive on the least's? or, for a small tensor such as one channel slice, few pairs "
                            f"per run: more --vgct-calibrate-runs) that the spread term was capped at "
                            f"{SPREAD_CAP:g}x the worst run{' squared' if k == 'cosine' else ''}; investigate")
        change["warnings"] = warnings
    # an investigation note explains the outliers it was written for, at the bars they set: an outlier run it did not
    # explain, or (new runs: a calibration) bars looser than those -- the same seeds, worse -- drop it; the gate asks
    # again. (old_runs given: the entry's own runs re-derived without some, remove_test -- no new measurement, and
    # fewer runs loosen the bars by the rule alone)
    rederived = old_runs is not None
    if old_runs is None:
        old_runs = _entry_runs(old or {})
    if out_runs and entry["investigation"] and (not set(out_runs) <= set(_outlier_runs(old_runs, floor_u, u)) or
                                                (change["looser"] and not rederived)):
        entry["investigation"] = None
        change["note_dropped"] = "outliers"
    cos = (entry.get("bars") or {}).get("cosine") if kind != "t1_floor" else None
    change["needs_investigation"] = ((cos is not None and cos < 0.99) or bool(out_runs)) and not entry["investigation"]
    if warnings:
        entry["warnings"] = warnings
    return entry, change


def dump(data: Mapping[str, Any]) -> str:
    return json.dumps(data, indent=2, sort_keys=True, default=_json_default) + "\n"


def _passed(session: Any, test: Any) -> bool:
    """Whether the calibration runs of ``test`` may be recorded: it did not fail, and -- where the session knows
    the tests' outcomes -- its call completed and passed, at the first attempt: a test that gated and then was
    xfailed or skipped (hostile review: an xfailed test's drift of 3x became a 1-run entry, its seeds cut short at
    the first), one whose call never reported (stopped by pytest.exit), and one a rerun plugin ran again (the
    failed attempt's runs are queued beside the passing one's: 8 runs, a bar 78x looser) are not evidence."""
    if test in session.failed_tests:
        return False
    outcomes = getattr(session, "tests", None) or {}
    if not outcomes:
        return True
    t = outcomes.get(test, {})
    return t.get("outcome") == "passed" and t.get("call") == "passed" and not t.get("rerun")


def ungated_entries(session: Any) -> List[str]:
    """A gating (not calibrating) session's calibrated entries that their tests passed without gating: one line
    each. An entry counts when its file was read by a gate of this session, its stratum is one gated here, no gate
    of this session read it, and every test that recorded it (the entry's ``tests``) ran here and passed at the
    first attempt with no subtest skipped -- a case the test calibrated and no longer gates: an output dropped on
    both sides (a dict that lost a key), a loop over layers that ran fewer times (an attack of 2026-12-06: the
    test passed checking one of its three calibrated gates, and nothing said so). Files that cannot be read are
    the gates' own errors, skipped here."""
    gated = set()
    strata: Dict[str, set] = {}
    for r in getattr(session, "records", []) or []:
        f, k, st = r.get("evidence"), r.get("evidence_key"), r.get("stratum")
        if f and k and st and not r.get("calibrating"):
            f = os.path.realpath(f)  # (one file reached by two spellings: a link to its folder, a resolved path)
            gated.add((f, k, st))
            strata.setdefault(f, set()).add(st)
    outcomes = getattr(session, "tests", None) or {}

    def clean(t: Any) -> bool:  # (_passed: the call passed at the first attempt)
        return t in outcomes and _passed(session, t) and not (outcomes[t].get("subtests") or {}).get("skipped")

    out = []
    for f in sorted(strata):
        try:
            data = load(f)
        except (OSError, ValueError):
            continue
        for key, per in sorted(data["entries"].items()):
            for st, entry in sorted(per.items()):
                if st not in strata[f] or (f, key, st) in gated or not isinstance(entry, dict):
                    continue
                tests = [t for t in entry.get("tests") or [] if isinstance(t, str)]
                if tests and all(clean(t) for t in tests):
                    out.append(f"{', '.join(tests)} passed without gating the evidence it calibrated: {f} [{key}] "
                               f"stratum {st} was read by no gate of this run -- a case that is no longer gated "
                               f"(an output dropped on both sides, a loop that ran fewer times) lets its bug pass. "
                               f"Gate it again; if the test gates it only where something is present (an optional "
                               f"kernel library, an OS), skip that case where it is not, in a subtest "
                               f"(subtests.test + pytest.skip) or a case of its own, so the run says why; if the "
                               f"case is gone for good remove it: python -m vgct_ext "
                               f"evidence remove {shlex.quote(f)} {shlex.quote(key)} --stratum {st}")
    return out


def write_calibration(session: Any, command: str) -> List[Dict[str, Any]]:
    """Merge every queued calibration into its evidence file (runs of tests that did not pass are dropped) under the
    file's lock, write each file atomically, and return what changed (one dict per entry, see
    :func:`merge_entry`). Entries that cannot be merged (:class:`AmbiguousGate`) and files that cannot be read
    or written are reported in ``session.evidence_errors`` (nothing is written for them). For each touched file,
    ``session.evidence_unused`` lists its entries of the strata written here that this session did not
    record: stale ones (their tests ran and did not gate them) and ones whose tests did not run."""
    written: List[Dict[str, Any]] = []
    errors = getattr(session, "evidence_errors", None)
    if errors is None:
        errors = []
    unused = getattr(session, "evidence_unused", None)
    if unused is None:
        unused = []
    by_file: Dict[str, List[Tuple[str, str, Dict[str, Any]]]] = {}
    for (path, key, stratum), slot in session.calibration.items():
        by_file.setdefault(path, []).append((key, stratum, slot))
    now = _now()
    ran = set(getattr(session, "tests", {}) or {})
    for path, items in sorted(by_file.items()):
        try:
            with locked(path):
                try:
                    data = load(path)
                except ValueError as exc:  # not an evidence file (OSError: as every other write error)
                    errors.append(f"evidence not written to {path}: {exc}. {_unreadable_fix(path)}")
                    continue
                data["format"] = FORMAT
                changes = []
                for key, stratum, slot in items:
                    runs = [dict(r) for r in slot["runs"] if _passed(session, r.get("test"))]
                    if not runs:
                        continue
                    old = data["entries"].get(key, {}).get(stratum)
                    try:
                        entry, change = merge_entry(old, slot, runs, headroom=session.headroom, command=command,
                                                    now=now, key=key, stratum=stratum, path=path)
                    except (AmbiguousGate, ValueError) as exc:
                        errors.append(str(exc))
                        continue
                    data["entries"].setdefault(key, {})[stratum] = entry
                    changes.append(change)
                if changes:
                    atomic_write_text(path, dump(data))
                    written += changes
                    touched = {(c["key"], c["stratum"]) for c in changes}
                    strata = {c["stratum"] for c in changes}
                    for key, st in sorted(data["entries"].items()):
                        for stratum, entry in sorted(st.items()):
                            if stratum not in strata or (key, stratum) in touched:
                                continue
                            tests = list(entry.get("tests") or [])
                            stale = bool(tests) and all(t in ran and t not in session.failed_tests for t in tests)
                            unused.append({"file": path, "key": key, "stratum": stratum, "tests": tests,
                                           "stale": stale})
        except (OSError, ValueError) as exc:
            errors.append(f"evidence not written to {path}: {exc}")
    session.evidence_errors = errors
    session.evidence_unused = unused
    return written


def _json_default(o: Any) -> Any:
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)


# --------------------------------------------------------------------------------------------------------------
# Command-line helpers (python -m vgct_ext evidence ...)


def fmt_exact(stat: str, v: Any) -> str:
    """A bar or statistic with every digit (``repr``); a cosine also as ``1 - d`` so 0.99999989 never reads 1."""
    if v is None:
        return "undefined"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if stat.startswith("cosine"):
        return f"{float(v)!r} (1 - {1.0 - float(v):.6g})"
    return repr(float(v)) if isinstance(v, float) else str(v)


def format_entry(key: str, stratum: str, entry: Mapping[str, Any], width: Optional[int] = None) -> List[str]:
    """Human-readable lines describing one entry (for ``evidence show``): the experiment, the runs, then the bars
    (or the T1 floor) as a table (:func:`vgct_ext._table.render`) with every digit, at most ``width`` columns wide
    (None: unlimited; a cell too wide folds onto the next line, nothing is cut)."""
    from .._table import render

    kind = entry.get("kind", "t2")
    lines = [f"[{key}] {stratum} ({kind})"]
    lines.append(f"  experiment: {entry.get('dtype_actual')} vs {entry.get('dtype_expected')}, shape "
                 f"{entry.get('shape')}, dim {entry.get('dim')}; device {entry.get('device')}")
    lines.append(f"  recorded: {entry.get('recorded')} by {entry.get('command')}")
    runs = entry.get("runs") or []
    seeds = sorted({r.get("seed") for r in runs if r.get("seed") is not None})
    lines.append(f"  runs: {len(runs)}" + (f" (seeds {', '.join(map(str, seeds))})" if seeds else "")
                 + f"; tests: {', '.join(entry.get('tests') or []) or '-'}")
    if kind == "t1_floor":
        floor = sorted((entry.get("floor") or {}).items())
        if floor:
            lines += render(("floor", "value"), [(k, fmt_exact(k, v)) for k, v in floor], width, indent=2)
    else:
        worst, mean, std = (entry.get(n) or {} for n in ("observed_worst", "observed_log_mean", "observed_log_std"))
        rows = []
        for k, v in sorted((entry.get("bars") or {}).items()):
            op = ">=" if k == "cosine" else "<="
            fit = "-"
            if k in mean:
                what = "ln(1 - cosine)" if k == "cosine" else f"ln {k}"
                fit = f"{what}: mean {mean[k]:.10g}, std {std.get(k, 0.0):.10g}"
            rows.append((f"{k} {op} {fmt_exact(k, v)}", fmt_exact(k, worst[k]) if k in worst else "-", fit))
        if rows:
            lines += render(("bar", "worst observed", "log-normal fit"), rows, width, indent=2)
        if "headroom_rule" in entry:
            lines.append(f"  rule: {entry['headroom_rule']} (headroom {entry.get('headroom')})")
    for w in entry.get("warnings") or []:
        lines.append(f"  warning: {w}")
    lines.append(f"  investigation: {entry.get('investigation') or '-'}")
    return lines


def _locate(data: Mapping[str, Any], path: Any, key: str, stratum: Optional[str]) -> Dict[str, Any]:
    strata = data["entries"].get(key)
    if strata is None:
        keys = ", ".join(repr(k) for k in sorted(data["entries"])) or "none"
        raise KeyError(f"{path}: no entry {key!r} (entries: {keys})")
    if stratum is not None and stratum not in strata:
        raise KeyError(f"{path}: entry {key!r} has no stratum {stratum!r} (strata: {', '.join(sorted(strata))})")
    return strata


def annotate(path: Union[str, "os.PathLike[str]"], key: str, stratum: str, investigation: Optional[str]) -> None:
    """Set (or with ``None`` clear) the investigation note of one entry, under the file's lock, atomically.
    Raises ``KeyError`` for an unknown key or stratum, ``ValueError`` for a malformed file."""
    with locked(path):
        data = load(path)
        if not Path(path).exists():
            raise KeyError(f"{path}: no such evidence file")
        strata = _locate(data, path, key, stratum)
        strata[stratum]["investigation"] = investigation
        atomic_write_text(path, dump(data))


# the fields of an entry that calibration takes from the gate (record_calibration's meta)
_META = ("kind", "component", "feature", "case", "dtype_actual", "dtype_expected", "shape", "dim", "device")


def remove_test(path: Union[str, "os.PathLike[str]"], key: str, test: str, stratum: Optional[str] = None,
                test_module: Optional[str] = None) -> List[Dict[str, Any]]:
    """Remove the runs of one test (its id exactly as the entry records it: ``evidence show`` lists them; with
    ``test_module``, only its runs recorded from that module, for two tests of one id sharing a file through
    ``evidence=``) from an entry -- every stratum, or ``stratum`` -- under the file's lock, atomically, and
    re-derive each touched stratum's bars (T2) or floor (T1 floor) from the runs left, by calibration's own rule
    (:func:`merge_entry`) at the entry's headroom, keeping its ``command``, ``recorded``, ``versions`` and
    ``precision`` (no run is measured again).  The runs of a renamed or deleted test otherwise stay pooled with
    the new ones, and a run that measured more drift keeps every bar looser than the tests now there give.
    Fewer runs can also give a LOOSER bar (the spread term); each change lists every bar old -> new.  The
    investigation note is kept unless the cosine bar loosened below 0.99 (the note was about the old bar: the
    gate then asks for a new one) or an outlier run is left that it did not explain (``NOTE_DROPPED_WHY``).  A
    stratum left without runs is removed, an entry without strata too.

    Returns one dict per stratum touched: ``stratum``, ``removed``, ``left`` (runs), ``kind``, ``bars``
    (``[(name, old, new)]``), ``looser`` (names of bars that loosened), ``note_dropped``, ``warnings``.
    Raises ``KeyError`` (unknown key or stratum; no run of ``test`` there, naming the tests recorded and any id
    that differs only by its root path; one id recorded from several modules without ``test_module``; runs
    without test ids, recorded before runs named their test), :class:`AmbiguousGate` (the runs left cannot be
    pooled; nothing is written), ``ValueError`` (a malformed file, runs the rule refuses; nothing is written)."""
    with locked(path):
        data = load(path)
        if not Path(path).exists():
            raise KeyError(f"{path}: no such evidence file")
        strata = _locate(data, path, key, stratum)
        done: List[Dict[str, Any]] = []
        seen: List[str] = []
        for s in ([stratum] if stratum is not None else sorted(strata)):
            entry = strata[s]
            legacy = _legacy_test(entry)
            runs = [dict(r) for r in entry.get("runs") or []]
            ids = [r.get("test", legacy) for r in runs]
            for t in ids:
                if isinstance(t, str) and t not in seen:
                    seen.append(t)
            hit = [t == test and (test_module is None or r.get("test_module") == test_module)
                   for r, t in zip(runs, ids)]
            if not any(hit):
                continue
            modules = sorted({str(r.get("test_module")) for r, h in zip(runs, hit) if h})
            if test_module is None and len(modules) > 1:
                raise KeyError(f"{path} [{key}] {s}: {test!r} names runs of {len(modules)} tests (their modules: "
                               f"{', '.join(modules)}); give --test-module to say whose. Nothing was written")
            left = [r for r, h in zip(runs, hit) if not h]
            kind = entry.get("kind", "t2")
            what = "floor" if kind == "t1_floor" else "bars"
            old_bars = dict(entry.get(what) or {})
            info: Dict[str, Any] = {"stratum": s, "removed": len(runs) - len(left), "left": len(left), "kind": kind,
                                    "bars": [], "looser": [], "note_dropped": False, "warnings": []}
            done.append(info)
            if not left:
                del strata[s]
                continue
            if any(not isinstance(r.get("test"), str) for r in left):
                raise KeyError(f"{path} [{key}] {s}: the runs left include runs without a test id (recorded before "
                               f"runs named their test), which would own no test after this: remove the stratum "
                               f"(evidence remove {path} \"{key}\" --stratum {s}) and recalibrate. Nothing was "
                               f"written")
            meta = {k: entry[k] for k in _META if k in entry}
            try:
                # (the entry without runs as the old one: its bars and note are what the runs left are compared to)
                new, change = merge_entry({**entry, "runs": []}, {"meta": meta}, left,
                                          headroom=float(entry.get("headroom", 0.5)),
                                          command=str(entry.get("command", "")), now=_now(), key=key, stratum=s,
                                          path=str(path),
                                          old_runs=_entry_runs(entry))
            except AmbiguousGate as exc:
                raise AmbiguousGate(f"{exc} (after removing {test!r}'s runs; nothing was written)") from exc
            except ValueError as exc:
                raise ValueError(f"{path} [{key}] {s}: the runs left after removing {test!r}'s cannot give "
                                 f"{what}: {exc}. Nothing was written") from exc
            # no new measurement: the runs left keep the record of where and when they were measured
            for k in ("command", "recorded", "versions", "precision"):
                if k in entry:
                    new[k] = entry[k]
            new_bars = dict(new.get(what) or {})
            info["bars"] += [(name, old_bars.get(name), new_bars.get(name))
                             for name in sorted(set(old_bars) | set(new_bars))]
            # (merge_entry's rule: a note that explained a cosine bar now looser and under 0.99 is dropped)
            info.update(looser=change["looser"], note_dropped=change.get("note_dropped") or False,
                        warnings=list(change.get("warnings") or []))
            strata[s] = new
        if not done:
            where = f"stratum {stratum!r}" if stratum is not None else "any stratum"
            near = [t for t in seen if _nested_ids(t, test)]
            raise KeyError(f"{path} [{key}]: no run of {test!r}"
                           + (f" from {test_module!r}" if test_module is not None else "") + f" in {where} "
                           f"(runs recorded by: {', '.join(seen) or 'no named test'})"
                           + (f"; did you mean {' or '.join(repr(t) for t in near)}?" if near else ""))
        if not strata:
            del data["entries"][key]
        data["format"] = FORMAT
        atomic_write_text(path, dump(data))
    return done


def remove(path: Union[str, "os.PathLike[str]"], key: str, stratum: Optional[str] = None) -> List[str]:
    """Remove one stratum of an entry (or, without ``stratum``, the whole entry); return the strata removed."""
    with locked(path):
        data = load(path)
        if not Path(path).exists():
            raise KeyError(f"{path}: no such evidence file")
        strata = _locate(data, path, key, stratum)
        gone = [stratum] if stratum is not None else sorted(strata)
        for s in gone:
            del strata[s]
        if not strata:
            del data["entries"][key]
        atomic_write_text(path, dump(data))
    return gone
