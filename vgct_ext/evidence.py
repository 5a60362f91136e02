"""T2 calibration evidence: a JSON file next to the test module, keyed by component/feature and stratum.

Source: the method, "T2, lossy: measure the same statistics, calibrate the bar from the feature's observed
drift plus headroom on supported GPU architectures, and record that evidence. [...] Cosine 0.99 is a floor
that requires investigation", and "For T2, test every supported GPU-architecture stratum used to justify the
bar". A stratum is ``"cpu"`` or ``"sm_<major><minor>"`` (see :func:`vgct_ext._hardware.stratum_of`).

File ``<test module stem>.vgct-evidence.json``::

    {"format": "vgct-evidence/1",
     "entries": {"<component> | <feature>[ | <case>]": {"<stratum>": {
         "component", "feature", "case", "dtype_actual", "dtype_expected", "shape", "dim", "device",
         "recorded" (UTC ISO 8601), "command", "tests", "versions", "precision",
         "runs": [{"rel_l2", "cosine", "p99", "max_abs_err", ["channel_mean_shift"]}, ...],   # raw, each run
         "observed_worst": {...},                  # worst of each statistic over the runs
         "headroom": h, "headroom_rule": "...",    # the headroom applied
         "bars": {...},                            # the resulting bars
         "investigation": null | "note"}}}}        # required when bars.cosine < 0.99

Bars: ``worst x (1 + h)`` for the upper-bounded statistics (relative L2, p99, max abs error, per-channel
mean shift) and ``1 - (1 - worst cosine) x (1 + h)`` for cosine; ``h`` is ``--vgct-headroom`` (default 0.5).
Recalibrating a stratum replaces its runs and bars and keeps its investigation note; other strata are kept.

Every entry must carry a finite bar for rel_l2, cosine, p99 and max_abs_err (and channel_mean_shift when the
entry has a ``dim``): :func:`lookup` refuses an entry that lacks one (recalibrate), except that relative L2 and
cosine are not required when the gated run's reference has zero norm (the gate then uses absolute error).
Calibration refuses a run with a non-finite pair (``n_finite < n``), a zero-norm reference, or an undefined or
non-finite statistic, and :func:`derive_bars` never produces a missing or non-finite bar.
"""

from __future__ import annotations

import datetime
import inspect
import json
import math
import os
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _context
from ._hardware import describe_device, precision_settings, versions

__all__ = [
    "FORMAT",
    "SUFFIX",
    "evidence_path",
    "evidence_key",
    "t2_statistics",
    "derive_bars",
    "lookup",
    "load",
    "write_calibration",
]

FORMAT = "vgct-evidence/1"
SUFFIX = ".vgct-evidence.json"
UPPER = ("rel_l2", "p99", "max_abs_err", "channel_mean_shift")
REQUIRED = ("rel_l2", "cosine", "p99", "max_abs_err")  # plus channel_mean_shift when dim is set
RELATIVE = ("rel_l2", "cosine")  # undefined for a zero-norm reference
HEADROOM_RULE = ("upper-bounded statistics: bar = worst x (1 + headroom); cosine: bar = 1 - (1 - worst) x "
                 "(1 + headroom)")


def evidence_key(component: str, feature: str, case: Optional[str] = None) -> str:
    """``"component | feature"`` or ``"component | feature | case"``."""
    return " | ".join([component, feature] + ([str(case)] if case is not None else []))


def _caller_file() -> Optional[Path]:
    pkg = os.path.dirname(os.path.abspath(__file__))
    for fi in inspect.stack(context=0)[1:]:
        f = os.path.abspath(fi.filename)
        if not f.startswith(pkg + os.sep) and not f.startswith("<"):
            return Path(f)
    return None


def evidence_path(explicit: Union[str, "os.PathLike[str]", None] = None) -> Path:
    """The evidence file: ``explicit``, else ``<module stem>.vgct-evidence.json`` next to the running test's
    module (from the pytest plugin), else next to the calling file. Raises ``RuntimeError`` if none is known."""
    if explicit is not None:
        return Path(explicit)
    t = _context.current_test()
    module = t.path if t is not None and t.path is not None else _caller_file()
    if module is None:
        raise RuntimeError("assert_t2: cannot tell which test module this is; pass evidence=PATH")
    module = Path(module)
    return module.with_name(module.stem + SUFFIX)


def t2_statistics(stats: Any) -> Dict[str, Any]:
    """The statistics a T2 gate records and gates: rel_l2, cosine, p99, max_abs_err, and with ``dim`` the
    per-channel mean shift ``max_c |mean(a-e)[c]|`` (plus its channel index, not gated)."""
    out: Dict[str, Any] = {"rel_l2": stats.rel_l2, "cosine": stats.cosine, "p99": stats.quantiles.get(0.99),
                           "max_abs_err": stats.max_abs_err}
    sl = getattr(stats, "slices", None)
    if sl is not None:
        best, idx = None, None
        for i, v in enumerate(sl.mean_shift):
            v = abs(float(v))
            if not math.isnan(v) and (best is None or v > best):
                best, idx = v, i
        out["channel_mean_shift"] = best
        out["channel_mean_shift_index"] = idx
    return out


def required_bars(dim: Optional[int], zero_reference: bool = False) -> Tuple[str, ...]:
    """The bars an entry must carry: rel_l2, cosine, p99, max_abs_err, plus channel_mean_shift with ``dim``;
    without rel_l2 and cosine when the gated run's reference has zero norm (they are undefined there)."""
    names = REQUIRED + (("channel_mean_shift",) if dim is not None else ())
    return tuple(n for n in names if not (zero_reference and n in RELATIVE))


def _finite_number(v: Any) -> bool:
    return (not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(float(v)))


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


def derive_bars(runs: Sequence[Mapping[str, Any]], headroom: float,
                dim: Optional[int] = None) -> Tuple[Dict[str, float], Dict[str, float]]:
    """``(observed_worst, bars)`` from raw runs: worst of each statistic, then headroom (module docstring).

    Raises ``ValueError`` when there is no run, when a run lacks a required statistic (rel_l2, cosine, p99,
    max_abs_err; channel_mean_shift with ``dim``) or has a non-finite one, or when a bar would be non-finite:
    an entry is never written with a missing or non-finite bar."""
    if headroom < 0 or not math.isfinite(headroom):
        raise ValueError(f"headroom must be a finite number >= 0, got {headroom!r}")
    if not runs:
        raise ValueError("derive_bars: no calibration run")
    need = required_bars(dim)
    worst: Dict[str, float] = {}
    for i, r in enumerate(runs):
        bad = [f"{k}={r.get(k)!r}" for k in need if not _finite_number(r.get(k))]
        bad += [f"{k}={r.get(k)!r}" for k in UPPER + ("cosine",)
                if k not in need and r.get(k) is not None and not _finite_number(r.get(k))]
        if bad:
            raise ValueError(f"calibration run {i} has undefined or non-finite statistic(s) {', '.join(bad)}; "
                             f"refusing to derive bars from it (a zero-norm reference or non-finite output "
                             f"cannot calibrate a T2 bar)")
        for k in UPPER:
            v = r.get(k)
            if v is not None and (k not in worst or v > worst[k]):
                worst[k] = float(v)
        c = r.get("cosine")
        if c is not None and ("cosine" not in worst or c < worst["cosine"]):
            worst["cosine"] = float(c)
    f = 1.0 + headroom
    bars = {k: v * f for k, v in worst.items() if k != "cosine"}
    if "cosine" in worst:
        bars["cosine"] = 1.0 - (1.0 - worst["cosine"]) * f
    bad = [f"{k}={v!r}" for k, v in bars.items() if not math.isfinite(v)]
    if bad:
        raise ValueError(f"derive_bars: non-finite bar(s) {', '.join(bad)}; not written")
    return worst, bars


def load(path: Union[str, "os.PathLike[str]"]) -> Dict[str, Any]:
    """Read an evidence file (``{"format", "entries": {}}`` when absent). Raises ``ValueError`` on a bad file."""
    p = Path(path)
    if not p.exists():
        return {"format": FORMAT, "entries": {}}
    with open(p, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{p}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
        raise ValueError(f"{p}: not a {FORMAT} evidence file")
    return data


def _calibrate_hint(stratum: str) -> str:
    t = _context.current_test()
    tid = t.nodeid if t is not None else "<test id>"
    where = "on this machine" if stratum == "cpu" else f"on a {stratum} GPU"
    return f"Record it {where} (and commit the JSON file):\n    pytest --vgct-calibrate \"{tid}\""


def lookup(path: Path, key: str, stratum: str, stats: Any, dim: Optional[int]) -> Tuple[Optional[dict], Optional[str]]:
    """``(entry, None)`` when usable evidence exists for ``key`` on ``stratum``, else ``(None, why)``."""
    try:
        data = load(path)
    except (OSError, ValueError) as exc:
        return None, f"evidence file unreadable: {exc}. {_calibrate_hint(stratum)}"
    strata = data["entries"].get(key)
    if not strata:
        return None, (f"no T2 evidence for {key!r} in {path}. T2 bars come only from recorded calibration "
                      f"evidence, never from a default. {_calibrate_hint(stratum)}")
    entry = strata.get(stratum)
    if entry is None:
        return None, (f"no T2 evidence for stratum {stratum} under {key!r} in {path} (recorded strata: "
                      f"{', '.join(sorted(strata))}). A bar from another stratum does not apply. "
                      f"{_calibrate_hint(stratum)}")
    want = {"dtype_actual": stats.dtype_actual, "dtype_expected": stats.dtype_expected,
            "shape": list(stats.shape), "dim": dim}
    diff = [f"{k}: evidence {entry.get(k)!r}, now {v!r}" for k, v in want.items() if entry.get(k) != v]
    if diff:
        return None, (f"T2 evidence for {key!r} on {stratum} in {path} was recorded for a different experiment ("
                      + "; ".join(diff) + f"). Recalibrate. {_calibrate_hint(stratum)}")
    bars = entry.get("bars")
    if not isinstance(bars, dict) or not bars:
        return None, f"T2 evidence for {key!r} on {stratum} in {path} has no bars. {_calibrate_hint(stratum)}"
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
                      + f"; a statistic is never left ungated. Recalibrate. {_calibrate_hint(stratum)}")
    cos = bars.get("cosine")
    note = entry.get("investigation")
    if cos is not None and cos < 0.99 and not (isinstance(note, str) and note.strip()):
        return None, (f"T2 evidence for {key!r} on {stratum} in {path} sets a cosine bar of {cos:.6f}, under the "
                      f"0.99 floor that requires investigation, and has no investigation note. Investigate the "
                      f"drift, then write what was found into the entry's \"investigation\" field.")
    return entry, None


def add_calibration_run(session: "_context.Session", path: Path, key: str, stratum: str, stats: Any,
                        observed: Mapping[str, Any], *, component: str, feature: str, case: Optional[str],
                        dim: Optional[int]) -> None:
    """Queue one calibration run (written by :func:`write_calibration` at the end of the session).

    Raises ``ValueError`` (the run is refused, nothing queued) for a run :func:`check_calibration_run` rejects:
    a non-finite pair, a zero-norm reference, or an undefined/non-finite statistic."""
    why = check_calibration_run(stats, observed, dim)
    if why is not None:
        raise ValueError(f"calibration of {key!r} on {stratum} refused: {why}. No evidence is recorded from this "
                         f"run; fix the experiment and rerun pytest --vgct-calibrate.")
    slot = session.calibration.setdefault((str(path), key, stratum), {"runs": [], "meta": None, "tests": []})
    t = _context.current_test()
    run = {k: v for k, v in observed.items()}
    run["_test"] = t.nodeid if t is not None else None
    slot["runs"].append(run)
    meta = {"component": component, "feature": feature, "case": case, "dtype_actual": stats.dtype_actual,
            "dtype_expected": stats.dtype_expected, "shape": list(stats.shape), "dim": dim,
            "device": describe_device(stats.device)}
    if slot["meta"] is None:
        slot["meta"] = meta
    elif {k: slot["meta"][k] for k in ("dtype_actual", "dtype_expected", "shape", "dim")} != \
            {k: meta[k] for k in ("dtype_actual", "dtype_expected", "shape", "dim")}:
        raise ValueError(f"calibration of {key!r} on {stratum}: runs disagree on dtype/shape/dim "
                         f"({slot['meta']} vs {meta}); give each experiment its own case=")
    if run["_test"] is not None and run["_test"] not in slot["tests"]:
        slot["tests"].append(run["_test"])


def write_calibration(session: "_context.Session", command: str) -> List[Dict[str, Any]]:
    """Write every queued calibration (runs of failed tests are dropped) and return what was written."""
    written = []
    by_file: Dict[str, List[Tuple[str, str, Dict[str, Any]]]] = {}
    for (path, key, stratum), slot in session.calibration.items():
        by_file.setdefault(path, []).append((key, stratum, slot))
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()
    for path, items in sorted(by_file.items()):
        data = load(path)
        changed = False
        for key, stratum, slot in items:
            runs = [{k: v for k, v in r.items() if k != "_test"} for r in slot["runs"]
                    if r["_test"] not in session.failed_tests]
            if not runs:
                continue
            worst, bars = derive_bars(runs, session.headroom, slot["meta"]["dim"])
            old = data["entries"].get(key, {}).get(stratum, {})
            entry = dict(slot["meta"])
            entry.update({
                "recorded": now, "command": command, "tests": slot["tests"], "versions": versions(),
                "precision": precision_settings(), "runs": runs, "observed_worst": worst,
                "headroom": session.headroom, "headroom_rule": HEADROOM_RULE, "bars": bars,
                "investigation": old.get("investigation"),
            })
            data["entries"].setdefault(key, {})[stratum] = entry
            changed = True
            needs_note = bars.get("cosine") is not None and bars["cosine"] < 0.99 and not entry["investigation"]
            written.append({"file": path, "key": key, "stratum": stratum, "runs": len(runs), "bars": bars,
                            "needs_investigation": needs_note})
        if changed:
            p = Path(path)
            tmp = p.with_name(p.name + ".tmp")
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=2, sort_keys=True, default=_json_default)
                f.write("\n")
            os.replace(tmp, p)
    return written


def _json_default(o: Any) -> Any:
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)
