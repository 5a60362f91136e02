"""The vgct pytest plugin (entry point ``pytest11: vgct = "vgct_ext.plugin"``, the stable path of this module).

* Markers ``gpu``, ``t1``, ``t2``, ``component(name)``, ``feature(name)`` (component and feature names are also
  keywords, so ``pytest -k wan`` selects a test marked ``component("wan.transformer_block")``), and
  ``vgct_requires`` (written by :mod:`vgct_ext.skips`).
* The ``vgct`` fixture: the gates and probes bound to the test's component and feature markers.
* A terminal summary table (rich, fitted to the terminal width) of the comparisons: test, gate label,
  component, feature, gate, dtypes, shape, each statistic, its bar, the margin, the slack, pass/fail.
  ``--vgct-summary=failures`` (default: the failed gates and probes only), ``all`` or ``none``; passing gates
  whose bars are more than 100x their measurement are counted (and listed under ``all``).
* junit XML: each gate's statistics, bars and slack as ``record_property`` entries (``item.user_properties``).
* A ``pytest_report_header`` line with vgct_ext's build (``build_info``).
* ``--vgct-report=FILE.json``: command line, hardware, precision, statistics, bars, skips with reasons.
* ``--vgct-calibrate`` (with ``--vgct-calibrate-runs=N``, ``--vgct-headroom=H``): run each paired test with
  seeds 0..N-1 (``vgct.seed``) and merge every T2 run (and every ``tighten=`` T1 floor) into the evidence of
  the current stratum; a diff of the bars and the unused entries of the touched files are printed.
* ``--vgct-seed=S``: the input seed of a normal (gating) run (default 0), e.g. to check a calibrated gate on
  seeds it was not calibrated on.
* ``--vgct-repeat=N``: run each paired test N times; any statistic that differs bitwise fails the test.
* Under pytest-xdist each worker sends its records and calibration runs to the controller
  (``workeroutput``), which writes the one report and merges the evidence once.
* Evidence files are merged under a file lock and written atomically; the report too, and its path is checked
  at startup (a usage error names it); a write error at the end still prints the summary and one error line.
* ``--vgct-strict`` (or ``VGCT_STRICT=1``): a missing checkpoint or reference fails instead of skipping.

Source of the policy: the method ("Execute and calibrate": run the reference-paired test twice to detect
nondeterminism; report exact commands, hardware, precision, observed statistics, thresholds, skips).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shlex
import stat
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

from . import _context, _files, _unhandled, skips
from ._hardware import hardware_info, precision_settings, versions

__all__ = ["VgctFixture"]

STATE = pytest.StashKey[_context.Session]()
SKIPPED_HERE = pytest.StashKey[bool]()  # skipped by this plugin: the report names the test's line
LOST = pytest.StashKey[List[str]]()  # what the test's call lost (gates._test_end), for its report
LOST_IN_TEARDOWN = pytest.StashKey[List[str]]()  # what an erring teardown lost, for its report's outcome
CONTEXT = pytest.StashKey[_context.TestContext]()  # the test's context, for its report (the refusals it caught)
UNHANDLED = pytest.StashKey[Any]()  # undoes the hooks of _unhandled (threads, futures, event loops) when set


def _pending_gate_errors(session_end: bool = False, last: bool = False) -> List[str]:
    """Gate failures lost since the last look, as lines: soft blocks ended by GeneratorExit/CancelledError
    (at the session's end also the failures held by a block open outside every test) and what the hooks of
    _unhandled caught (threads, unread futures, event loops; at the ``last`` look, after every
    pytest_sessionfinish implementation, after one garbage collection and with the futures still unread)."""
    gates = sys.modules.get(__package__ + ".gates")  # (not imported: no gate ran, nothing lost)
    lost = [] if gates is None else gates._session_end() if session_end else gates._drain_unreported()
    return lost + _unhandled.take(session_end=last)


PAIRED_MARKERS = ("t1", "t2", "component", "feature")
#: the kinds of gate records that satisfy a t1 marker (whatever the verdict: a planted fault's gate counts)
GATE_KINDS = ("t1", "t2")
MARKERS = (
    "gpu: needs a CUDA GPU (vgct: added by requires_gpu/requires_gpus; skipped without one)",
    "t1: vgct T1 gate: a transparent feature against its reference (tolerance bars from the method); the test must "
    "call one",
    "t2: vgct T2 gate: a lossy feature against bars calibrated from recorded evidence (a t2 test calling no T2 "
    "gate fails)",
    "component(name): vgct: the component under test (also a -k keyword)",
    "feature(name): vgct: the feature under test (also a -k keyword)",
    "vgct_requires(kind, **kw): vgct skip policy (written by vgct_ext.requires_*)",
)


#: The plugin's names: the ``pytest11`` entry point's (pyproject.toml) and its modules' (``-p vgct_ext.plugin``,
#: ``pytest_plugins = ["vgct_ext.plugin"]``).
PLUGIN_NAMES = ("vgct", "vgct_ext.plugin", "vgct_ext.method.plugin")


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    """Called as this module is registered (under any of :data:`PLUGIN_NAMES`): its other names are blocked, so
    that a second registration -- the entry point after ``-p vgct_ext.plugin`` where the package is installed, or
    ``pytest_plugins = ["vgct_ext.plugin"]`` after the entry point -- is skipped instead of failing the whole run
    with pluggy's "Plugin already registered under a different name" (docs/method.md says ``-p vgct_ext.plugin``
    loads the plugin where the package is not installed: the same command failed where it is).  A name blocked
    by the user (``-p no:vgct``) stays blocked."""
    name = pluginmanager.get_name(sys.modules[__name__])
    for other in PLUGIN_NAMES:
        if other != name and pluginmanager.get_plugin(other) is None and not pluginmanager.is_blocked(other):
            pluginmanager.set_blocked(other)


#: The largest input seed (``--vgct-seed``, and the last of a calibration's): numpy's legacy ``RandomState`` takes
#: seeds below 2^32, the narrowest of the common seeding calls (``torch.manual_seed``: 2^64).
SEED_MAX = (1 << 32) - 1


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("vgct", "vgct_ext component-test method")
    g.addoption("--vgct-report", metavar="FILE.json", default=None,
                help="write the evidence report (command, hardware, precision, statistics, bars, skips) as JSON")
    g.addoption("--vgct-calibrate", action="store_true", default=False,
                help="record T2 evidence for this hardware stratum next to each test module instead of gating")
    g.addoption("--vgct-calibrate-runs", type=int, default=5, metavar="N",
                help="--vgct-calibrate runs each paired test with seeds S..S+N-1 (vgct.seed; default 5, at least 3)")
    g.addoption("--vgct-seed", type=int, default=0, metavar="S",
                help="input seed of the runs (vgct.seed; default 0, at most 2^32 - 1); the first seed under "
                     "--vgct-calibrate")
    g.addoption("--vgct-headroom", type=float, default=0.5, metavar="H",
                help="headroom for --vgct-calibrate: bar = max(worst x (1+H), 99%% prediction bound of the runs); "
                     "cosine on 1 - cosine (default 0.5, at most 4)")
    g.addoption("--vgct-repeat", type=int, default=1, metavar="N",
                help="run each paired test N times and fail any whose statistics differ bitwise")
    g.addoption("--vgct-strict", action="store_true", default=False,
                help="a missing checkpoint or reference fails instead of skipping (also VGCT_STRICT=1)")
    g.addoption("--vgct-summary", choices=("failures", "all", "none"), default="failures",
                help="the vgct comparisons table at the end: failed gates/probes only (default), all, or none")


def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    repeat = int(config.getoption("--vgct-repeat"))
    if repeat < 1:
        raise pytest.UsageError("--vgct-repeat must be >= 1")
    headroom = float(config.getoption("--vgct-headroom"))
    from .evidence import MAX_HEADROOM, headroom_ok

    if not headroom_ok(headroom):  # NaN and inf too, before any test runs
        raise pytest.UsageError(f"--vgct-headroom must be a number in [0, {MAX_HEADROOM:g}] (bar = worst run x "
                                f"(1 + H), at most {1 + MAX_HEADROOM:g}x: the reach of the spread cap), got "
                                f"{config.getoption('--vgct-headroom')!r}")
    runs = int(config.getoption("--vgct-calibrate-runs"))
    if runs < 3:
        raise pytest.UsageError(f"--vgct-calibrate-runs must be >= 3 (a spread needs several seeds), got {runs}")
    seed = int(config.getoption("--vgct-seed"))
    if seed < 0:
        raise pytest.UsageError(f"--vgct-seed must be >= 0, got {seed}")
    last = seed + (runs - 1 if config.getoption("--vgct-calibrate") else 0)
    if last > SEED_MAX:  # (an attack: 10^23 was taken, and every test then failed in its own seeding call)
        raise pytest.UsageError(f"--vgct-seed must be at most {SEED_MAX} (2^32 - 1, numpy's legacy seed range, the "
                                f"narrowest of the common seeding calls) with the calibration's seeds after it, "
                                f"got {seed}" + (f" (last seed {last})" if last != seed else ""))
    report = config.getoption("--vgct-report")
    if report is not None and not report.strip():  # (an attack: --vgct-report= wrote nothing and said nothing)
        raise pytest.UsageError("--vgct-report= is empty; expected the report's path (FILE.json)")
    if report and not _is_xdist_worker(config):
        p = _report_path(config, report)
        try:
            _files.check_writable(p)
        except OSError as exc:
            raise pytest.UsageError(f"--vgct-report={report}: cannot write {p}: {exc}") from None
        why = _not_a_report(p)
        if why:
            raise pytest.UsageError(f"--vgct-report={report}: {p} {why}; the report replaces the file it is given, "
                                    f"so only a missing or empty file or an earlier vgct report is overwritten "
                                    f"(the path after --vgct-report without '=' is taken as the report's: a test "
                                    f"module there would be lost). Give another path.")
    strict = bool(config.getoption("--vgct-strict")) or os.environ.get("VGCT_STRICT", "").strip().lower() in (
        "1", "true", "yes", "on")
    session = _context.Session(strict=strict, calibrate=bool(config.getoption("--vgct-calibrate")),
                               headroom=headroom, repeat=repeat, calibrate_runs=runs, seed=seed)
    session.started = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()
    config.stash[STATE] = session
    _context.push_session(session)


def pytest_report_header(config: pytest.Config) -> str:
    """One line: vgct_ext's version, the folder it was imported from (a stale copy earlier on sys.path shows),
    and its build (CUDA compiled for which architectures, CPU threads)."""
    try:
        from ..core._api import build_info

        b = build_info()
    except Exception as exc:  # noqa: BLE001 - the header must never stop a session
        return f"vgct_ext: build info unavailable ({type(exc).__name__}: {exc})"
    cuda = (f"CUDA {b.get('nvcc_version')} [{_archs(b.get('cuda_archs'))}], runtime {b.get('cuda_runtime_version')}, "
            f"{b.get('cuda_device_count')} device(s)" if b.get("cuda_compiled") else "CPU only")
    line = (f"vgct_ext {b.get('version')} ({b.get('package_path')}): {cuda}; compiler {b.get('compiler')}; "
            f"DLPack {b.get('dlpack_version')}; {b.get('max_threads')} CPU threads; "
            f"summary {config.getoption('--vgct-summary')}")
    return line + _extension_note(b.get("package_path"), b.get("extension_path"))


def _extension_note(package_path: Optional[str], extension_path: Optional[str]) -> str:
    """A warning for the header when the compiled _C does not sit in the package's own folder (an editable
    install of another checkout: this tree's Python with another tree's C), else ''."""
    if not package_path or not extension_path:
        return ""
    if os.path.dirname(extension_path) == package_path:
        return ""
    return f"; WARNING: _C loaded from {extension_path}, not from this package ({package_path})"


def _archs(gencode: Optional[str]) -> str:
    if not gencode:
        return "-"
    import re

    return ",".join(dict.fromkeys(re.findall(r"code=(sm_\d+|compute_\d+)", gencode))) or gencode


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


_REPORT_HEAD = re.compile(rb'\A\s*\{\s*"format"\s*:\s*"vgct-report/')


def _not_a_report(p: Path) -> Optional[str]:
    """Why ``--vgct-report`` must not replace the existing ``p`` (hostile review: ``--vgct-report test_x.py``
    replaced the test module, an evidence file lost its entries past its lock, a device node became a regular
    file), or None: ``p`` is missing, empty, or a report this plugin wrote (its first key is ``"format":
    "vgct-report/..."``)."""
    try:
        st = os.stat(p)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be examined ({exc})"
    if not stat.S_ISREG(st.st_mode):
        return "exists and is not a regular file (a device, a pipe: /dev/stdout, /dev/null)"
    if st.st_size == 0:
        return None
    try:
        with open(p, "rb") as f:
            head = f.read(256)
            if _REPORT_HEAD.match(head):
                return None
            doc = json.loads(head + f.read(64 << 20))  # (a report reformatted with sorted keys: "format" later)
    except OSError as exc:
        return f"cannot be read ({exc})"
    except ValueError:
        doc = None
    if isinstance(doc, dict) and str(doc.get("format", "")).startswith("vgct-report/"):
        return None
    return "exists and is not a vgct report (format vgct-report/1)"


def _report_path(config: pytest.Config, path: str) -> Path:
    p = Path(path)
    return p if p.is_absolute() else Path(str(config.invocation_params.dir)) / p


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    config = session.config
    if UNHANDLED not in config.stash:  # (after every pytest_configure, for pytest's thread hook: _unhandled)
        undo_thread_hook = _unhandled.install_thread_hook()
        _unhandled.install()
        config.stash[UNHANDLED] = lambda: (undo_thread_hook(), _unhandled.uninstall())


def pytest_collection_finish(session: pytest.Session) -> None:
    s = session.config.stash.get(STATE, None)
    if s is not None:  # a thread's gate failure during collection (a test module's import) is no test's
        s.gate_errors.extend(f"{x} (during collection)" for x in _unhandled.take())


def pytest_unconfigure(config: pytest.Config) -> None:
    undo = config.stash.get(UNHANDLED, None)
    if undo is not None:  # (the thread hook: before pytest's own cleanup restores the hook it replaced)
        undo()
        del config.stash[UNHANDLED]
    s = config.stash.get(STATE, None)
    if s is not None:
        _context.pop_session(s)


def _marker_arg(item: pytest.Item, name: str) -> Optional[str]:
    m = item.get_closest_marker(name)
    if m is None:
        return None
    if m.args:
        return str(m.args[0])
    return str(m.kwargs["name"]) if "name" in m.kwargs else None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    for item in items:
        for name in ("component", "feature"):
            v = _marker_arg(item, name)
            if v:
                item.extra_keyword_matches.add(v)
        if any(m.args and m.args[0] in ("gpu", "gpus") for m in item.iter_markers(name=skips.MARK)):
            if item.get_closest_marker("gpu") is None:
                item.add_marker("gpu")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    s = item.config.stash.get(STATE, None)
    if s is not None:
        s.phase_test = item.nodeid  # (its records are this test's: _context.record; cleared after the teardown)
    unmet = skips.unmet_requirement(item)
    if unmet is None:
        return
    reason, hard = unmet
    if hard:
        pytest.fail(f"vgct strict mode: {reason} (a missing checkpoint or reference must not turn a parity test "
                    f"into a smoke test; run without --vgct-strict/VGCT_STRICT=1 to skip)", pytrace=False)
    item.stash[SKIPPED_HERE] = True
    pytest.skip(reason)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    rep = yield
    st = item.config.stash.get(STATE, None)
    ctx_now = item.stash.get(CONTEXT, None)
    # a failed report made while the test's call still runs is a subtest's (pytest's subtests): its failure is
    # reported, not caught -- not to be named again as caught (_swallowed_missing).  Not a skip's or an xfail's:
    # `except EvidenceMissing: pytest.skip()` swallowed the error (hostile review of 9f08869)
    if rep.failed and call.excinfo is not None and st is not None and ctx_now is not None and \
            any(c is ctx_now for c in st.test_stack):
        for e in _unhandled.exceptions_in(call.excinfo.value):
            try:
                e._vgct_reported = True  # type: ignore[attr-defined]  (_swallowed_missing)
            except Exception:  # (__slots__, or a __setattr__ that refuses)
                pass
    # a skip or an xfail (raised, by its marker, or a teardown error's) must not hide lost gate failures
    key = {"call": LOST, "teardown": LOST_IN_TEARDOWN}.get(call.when)
    lost = item.stash.get(key, None) if key is not None else None
    if lost and not rep.failed:
        how = "xfailed" if hasattr(rep, "wasxfail") else rep.outcome
        fmt = ("{test} ({how}): {x}" if call.when == "call" else
               "{x} (in or after the teardown of {test}, whose error was {how})")
        item.config.stash[STATE].gate_errors.extend(fmt.format(test=item.nodeid, how=how, x=x) for x in lost)
    if hasattr(rep, "wasxfail") and call.excinfo is not None:  # (a fixture's gate in the setup or teardown too)
        from .gates import EvidenceMissing, GateFailure

        raised = _unhandled.exceptions_in(call.excinfo.value)
        for e in raised:  # the verdicts the xfail absorbed: named under the summary (xfailed_verdicts)
            rec = getattr(e, "_vgct_record", None) if isinstance(e, GateFailure) else None
            if isinstance(rec, dict):
                rec["xfailed"] = True

        ctx = item.stash.get(CONTEXT, None)
        refused = {id(e) for e in ctx.refused} if ctx is not None else set()
        gone = [e for e in raised if (isinstance(e, EvidenceMissing) and not e._expected) or id(e) in refused]
        if gone:  # an xfail cannot expect a gate that never ran: the session fails
            what = "EvidenceMissing" if isinstance(gone[0], EvidenceMissing) else "a refusal of its arguments"
            item.config.stash[STATE].gate_errors.append(
                f"{item.nodeid} (xfailed): a gate could not run ({what}), which an xfail must not "
                f"expect: {_first(gone[0])}")
    if rep.skipped and item.stash.get(SKIPPED_HERE, False) and isinstance(rep.longrepr, tuple):
        path, line = item.reportinfo()[:2]
        rep.longrepr = (str(path), (line or 0) + 1, rep.longrepr[2])  # report the test, not this plugin
    return rep


def _is_paired(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(m) is not None for m in PAIRED_MARKERS) or \
        "vgct" in getattr(item, "fixturenames", ())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: Optional[pytest.Item]) -> Any:
    """Gate failures lost during the test's teardown (a fixture abandoning a soft block; a thread's) fail the
    session, named with the test -- not the next test, whose skip or xfail could otherwise hide them.  When the
    teardown itself errs (under ``-W error`` that error is pytest's warning about the thread's exception, or the
    soft block's RuntimeWarning: the gate failure itself), they are shown with its error instead, which fails
    the session already: not counted a second time as a failure no test failed with -- unless the teardown's
    report does not fail after all (an xfail-marked test's teardown error is an xfail): then
    pytest_runtest_makereport fails the session with them."""
    erred = False
    s = item.config.stash.get(STATE, None)
    if s is not None:
        s.phase_test = item.nodeid  # a fixture's gate in the teardown: this test's (_context.record)
    try:
        return (yield)
    except Exception:
        erred = True
        raise
    finally:
        if s is not None:
            s.phase_test = None
        late = _pending_gate_errors()
        if late and erred:
            item.add_report_section("teardown", "vgct", "gate failures lost during this teardown:\n  " +
                                    "\n  ".join(late))
            item.stash[LOST_IN_TEARDOWN] = late
        elif s is not None:
            s.gate_errors.extend(f"{x} (in or after the teardown of {item.nodeid})" for x in late)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    session = item.config.stash[STATE]
    session.phase_test = None  # the setup is over (its teardown sets it again: a fixture's gates there)
    item.stash[LOST] = []  # (a rerun's subtests report before this call sets it: not the failed attempt's)
    paired = _is_paired(item)
    ctx = _context.TestContext(nodeid=item.nodeid, path=Path(str(item.path)),
                               component=_marker_arg(item, "component"), feature=_marker_arg(item, "feature"),
                               paired=paired)
    session.test_stack.append(ctx)
    item.stash[CONTEXT] = ctx
    n = session.repeat if paired else 1
    n_seeds = session.calibrate_runs if session.calibrate and paired else 1
    plan = [(session.seed + k, i) for k in range(n_seeds) for i in range(n)]
    from . import gates  # (on first use: the plugin loads before the test modules)

    _unhandled.install_loop_hook()  # (asyncio imported since the session started: by a test module, say)
    soft = gates._test_begin()  # the test's own soft-mode stack; what it leaves open is closed after it
    raised: Optional[BaseException] = None
    try:
        for seed, i in plan[:-1]:
            ctx.seed, ctx.repetition = seed, i
            ctx.claims.clear()
            item.runtest()
            if getattr(item, "_excinfo", None):  # a unittest TestCase's skip, expected failure or failure
                break  # (kept, not raised: its outcome is decided; the last run below reports it)
        ctx.seed, ctx.repetition = plan[-1]
        ctx.claims.clear()
        result = yield
        if len(getattr(item, "_excinfo", None) or ()) > 1:  # one outcome a test: pytest reports the first in
            del item._excinfo[1:]  # the call and would report a second in the teardown (a skip counted twice)
    except BaseException as exc:
        raised = exc
        raise
    finally:
        lost = _once_each(gates._test_end(soft) + _unhandled.take() + _swallowed_missing(ctx, raised))
        item.stash[LOST] = lost  # (pytest_runtest_makereport: the session fails if the test does not)
        if lost:  # shown with the test's failure, whatever failed it
            lost_text = "gate failures this test never reported, or blocks it left open:\n  " + "\n  ".join(lost)
            item.add_report_section("call", "vgct", lost_text)
        session.test_stack.remove(ctx)
        _record_properties(item, ctx.records)
    if lost:  # (reached only when the test itself passed)
        pytest.fail("vgct: " + lost_text, pytrace=False)
    why = _unchecked(item, ctx)
    sub = session.tests.get(item.nodeid, {}).get("subtests")
    if why and sub and sub["skipped"] and not sub["ran"]:  # its checks all skipped here: skipped, not passed
        item.stash[SKIPPED_HERE] = True
        what = "T2 gate" if item.get_closest_marker("t2") is not None else "gate"
        pytest.skip(f"vgct: every subtest skipped ({sub['reason']}) and the test called no {what} outside them: "
                    f"nothing was checked")
    if why:
        item.stash[LOST] = [why]  # (an xfail that absorbs the failure below fails the session: makereport)
        pytest.fail(f"vgct: {item.nodeid} is {why}", pytrace=False)
    if n > 1:
        _check_repeats(session, ctx, n)
    return result


def _unchecked(item: pytest.Item, ctx: _context.TestContext) -> Optional[str]:
    """Why a test marked t2 or t1 that completed checked nothing: a t2 test that called no T2 gate, a t1 test that
    called no gate at all (a loop over an empty list of outputs, a gate behind a condition that never held); None
    when it did, or when its call ended in a unittest skip or expected failure (pytest keeps those in
    ``item._excinfo`` instead of raising them here).  (When every subtest it opened -- pytest's ``subtests`` --
    skipped, the caller skips the test with their reason instead of failing it: its checks all skip here, no CUDA
    say, and pytest would report it passed.)  A gate the test's call ran counts whatever its verdict, and so does
    one that could not run for want of evidence (``ctx.evidence_gates``); a fixture's gate does not (two reviews
    of 2026-12-05: a fixture checking the reference against an oracle -- with the test's own markers, through
    the vgct fixture -- let a test whose feature gate sat in a skipped subtest or an empty loop pass)."""
    if getattr(item, "_excinfo", None) or ctx.evidence_gates:
        return None
    if item.get_closest_marker("t2") is not None:
        return ("marked t2 but called no T2 gate (assert_t2, vgct.assert_t2, or a tightened assert_t1): nothing was "
                "checked against recorded evidence -- a loop over an empty list of outputs, or a gate behind a "
                "condition that never held? (a test that gates only on the method's T1 bands is marked t1)")
    if item.get_closest_marker("t1") is None:
        return None
    if not any(r.get("kind") in GATE_KINDS for r in ctx.records):
        return ("marked t1 but called no gate (assert_t1, vgct.assert_t1, or a T2 gate): nothing was checked "
                "against the method's bars -- a loop over an empty list of outputs, or a gate behind a condition "
                "that never held? (an exact check that needs no bars, such as an index oracle, is not marked t1: "
                "its component and feature markers keep it a paired test; a gate in a fixture does not count -- a "
                "check of the reference against an oracle there is not this test's check: gate in the test's body)")
    return None


def _once_each(lines: List[str]) -> List[str]:
    """``lines`` with repeats merged, in first-seen order, a merged line ending in how many times it came: the same
    refusal caught once per seed of a --vgct-calibrate or --vgct-repeat run is one line, not five."""
    count: Dict[str, int] = {}
    for ln in lines:
        count[ln] = count.get(ln, 0) + 1
    return [ln if n == 1 else f"{ln} ({n} times)" for ln, n in count.items()]


def _swallowed_missing(ctx: _context.TestContext, raised: Optional[BaseException]) -> List[str]:
    """Lines for the EvidenceMissing errors a test's gates raised that do not reach its outcome: caught by
    ``pytest.raises(Exception)`` or a broad ``except`` around a planted fault, the gate never ran and the test
    would pass (second review of 2026-12-05; a plain test's too since a later review) -- but for
    those an :func:`~vgct_ext.gates.expect_evidence_missing` block caught on purpose."""
    # (a skip does not fail the test: one raised while handling the gate's error hides it -- hostile review)
    out = set() if isinstance(raised, pytest.skip.Exception) else {id(e) for e in _unhandled.exceptions_in(raised)}
    return [f"a gate could not run, and its EvidenceMissing was caught before it failed the test (a broad "
            f"except or pytest.raises(Exception); a planted fault goes inside expect_gate_failure, a check of "
            f"EvidenceMissing itself inside expect_evidence_missing): {(str(e).splitlines() or [''])[0]}"
            for e in ctx.missing if id(e) not in out and not getattr(e, "_expected", False)
            and not getattr(e, "_vgct_reported", False)] + [
        f"a gate refused its arguments and measured nothing, and the test caught the refusal before it failed "
        f"the test (a broad except or pytest.raises(Exception) around a planted fault passes without any fault "
        f"so; a test of the gates' own refusals has no vgct markers or fixture): {_first(e)}"
        for e in ctx.refused if id(e) not in out and not getattr(e, "_vgct_reported", False)]


def _first(e: BaseException) -> str:
    """``Type: first line of the message``."""
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"


def _record_properties(item: pytest.Item, records: List[Dict[str, Any]]) -> None:
    """Each gate's statistics, bars, slack and verdict as junit ``record_property`` entries
    ``vgct.<k>.<field>`` (``k`` counts the test's gates from 1), like the ``record_property`` fixture."""
    k = 0
    for r in records:
        if r.get("kind") not in ("t1", "t2"):
            continue
        k += 1
        pre = f"vgct.{k}"
        props = [("gate", r.get("gate")), ("name", r.get("name")), ("component", r.get("component")),
                 ("feature", r.get("feature")), ("relax", r.get("relax")),
                 ("dtypes", f"{r.get('dtype_actual')}/{r.get('dtype_expected')}"),
                 ("shape", "x".join(str(d) for d in r.get("shape", ()))), ("passed", r.get("passed")),
                 ("slack", r.get("slack"))]
        for c in r.get("checks", ()):
            props.append((c["statistic"], c["value"]))
            if c.get("gating"):
                props.append((f"{c['statistic']}.bar", f"{c['op']} {c['bar']}"))
        if r.get("expected_failure"):
            props.append(("expected_failure", True))
        item.user_properties.extend((f"{pre}.{key}", v) for key, v in props if v is not None)


def _check_repeats(session: _context.Session, ctx: _context.TestContext, n: int) -> None:
    """Compare the i-th record of every repetition with the first one's (of the same seed), bitwise."""
    problems: List[str] = []
    for seed in sorted({r.get("seed", 0) for r in ctx.records}):
        recs = [r for r in ctx.records if r.get("seed", 0) == seed]
        _compare_repetitions(recs, n, problems, f" (seed {seed})" if seed else "")
    if problems:
        session.nondeterminism.append({"test": ctx.nodeid, "repeat": n, "differences": problems})
        pytest.fail(f"nondeterminism (--vgct-repeat={n}) in {ctx.nodeid}: statistics differ bitwise between runs "
                    f"on the same inputs\n  " + "\n  ".join(problems), pytrace=False)


def _compare_repetitions(records: List[Dict[str, Any]], n: int, problems: List[str], seed: str) -> None:
    runs: List[List[Dict[str, Any]]] = [[r for r in records if r.get("repetition") == i] for i in range(n)]
    base = runs[0]
    for i in range(1, n):
        if len(runs[i]) != len(base):
            problems.append(f"repetition {i + 1} made {len(runs[i])} comparisons, the first made {len(base)}")
            continue
        for j, (a, b) in enumerate(zip(base, runs[i])):
            sa, sb = a.get("signature") or {}, b.get("signature") or {}
            diff = sorted((k for k in set(sa) | set(sb) if sa.get(k) != sb.get(k) and k != "#"), key=_priority)
            if diff or sa.get("#") != sb.get("#"):
                what = f"{a.get('kind')} #{j + 1} ({a.get('component')} / {a.get('feature')}){seed}"
                shown = ", ".join(f"{k.lstrip('.')}: {_show(sa.get(k))} vs {_show(sb.get(k))}" for k in diff[:6])
                if not diff:
                    shown = "per-slice or other statistics (exact digest differs)"
                problems.append(f"{what}: repetition {i + 1} differs from repetition 1 in {len(diff) or 'some'} "
                                f"statistic(s): {shown}")


_FIRST = (".rel_l2", ".cosine", ".max_abs_err", ".quantiles", ".mismatches", ".n_unequal", ".mean_diff")


def _priority(key: str) -> tuple:
    """Headline statistics first in a nondeterminism report, then the rest by name."""
    for i, p in enumerate(_FIRST):
        if key == p or key.startswith(p + ".") or key.startswith(p + "["):
            return (i, key)
    return (len(_FIRST), key)


def _show(v: Optional[str]) -> str:
    if v is None:
        return "absent"
    if v.lstrip("-").startswith("0x") or v in ("inf", "-inf", "nan"):
        return repr(float.fromhex(v))
    return v


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    s = _context.current_session()
    if s is None:
        return
    t = s.tests.setdefault(report.nodeid, {"nodeid": report.nodeid, "outcome": "passed", "duration": 0.0})
    t["duration"] += float(getattr(report, "duration", 0.0))
    subtest = hasattr(report, "context")  # (pytest's subtests: a SubtestReport; the test's own report follows)
    if report.when == "call" and not subtest:
        t["call"] = report.outcome  # (calibration records a test whose call completed and passed)
    if report.outcome == "rerun":  # (a rerun plugin: a failed attempt's runs are in the calibration queue)
        t["rerun"] = True
        t["reruns"] = t.get("reruns", 0) + 1  # (records stamp their attempt with it: _context.record)
        t["outcome"] = "passed"  # the next attempt's outcome is the test's (a failed subtest of this one set it)
        t.pop("subtests", None)  # (the next attempt's subtests: _unchecked)
        return
    if subtest and report.when == "call":  # this attempt's subtests, skipped or run (the t1 and t2 rules)
        sub = t.setdefault("subtests", {"skipped": 0, "ran": 0, "reason": ""})
        sub["skipped" if report.skipped else "ran"] += 1
        if report.skipped and not sub["reason"]:
            lr = report.longrepr
            why = str(lr[2]) if isinstance(lr, tuple) and len(lr) == 3 else str(getattr(report, "wasxfail", "") or lr)
            sub["reason"] = why[len("Skipped: "):] if why.startswith("Skipped: ") else why
    if report.failed:
        t["outcome"] = "failed" if report.when == "call" else "error"
        s.failed_tests.add(report.nodeid)
    elif report.skipped and subtest:
        pass  # a skipped subtest (no CUDA here, say) does not skip the test
    elif report.skipped and t["outcome"] == "passed":
        t["outcome"] = "skipped"
        lr = report.longrepr
        t["reason"] = str(lr[2]) if isinstance(lr, tuple) and len(lr) == 3 else str(lr)
        if getattr(report, "wasxfail", None) is not None:
            t["outcome"] = "xfailed"


# ------------------------------------------------------------------------------------------------------------------
# The vgct fixture


class VgctFixture:
    """The gates and probes bound to one test: ``component``/``feature`` default to the test's markers."""

    def __init__(self, item: pytest.Item):
        self.nodeid = item.nodeid
        self.component = _marker_arg(item, "component")
        self.feature = _marker_arg(item, "feature")
        self._session = item.config.stash[STATE]

    def _names(self, kw: Dict[str, Any]) -> Dict[str, Any]:
        for n in ("component", "feature"):
            if kw.get(n) is None:
                v = getattr(self, n)
                if v is None:
                    from .gates import _note_refusal

                    exc = TypeError(f"{self.nodeid}: no {n} named: mark the test with @pytest.mark.{n}(\"...\") "
                                    f"or pass {n}=")
                    _note_refusal(exc)  # a refusal like the gates'
                    raise exc
                kw[n] = v
        return kw

    def assert_t1(self, actual: Any, expected: Any, **kw: Any) -> Any:
        """:func:`vgct_ext.gates.assert_t1` with this test's component and feature."""
        __tracebackhide__ = True
        from .gates import assert_t1

        return assert_t1(actual, expected, **self._names(kw))

    def assert_t2(self, actual: Any, expected: Any, **kw: Any) -> Any:
        """:func:`vgct_ext.gates.assert_t2` with this test's component and feature."""
        __tracebackhide__ = True
        from .gates import assert_t2

        return assert_t2(actual, expected, **self._names(kw))

    def assert_feature_active(self, **kw: Any) -> Any:
        """:func:`vgct_ext.probes.assert_feature_active` with this test's component and feature."""
        __tracebackhide__ = True
        from .probes import assert_feature_active

        return assert_feature_active(**self._names(kw))

    def soft(self) -> Any:
        """:func:`vgct_ext.gates.soft_gates`: ``with vgct.soft(): ...`` runs every gate of the block and raises one
        GateFailure listing all failed gates at its end."""
        from .gates import soft_gates

        return soft_gates()

    def run_twice(self, fn: Any, *inputs: Any, **kwargs: Any) -> Any:
        """:func:`vgct_ext.experiment.run_twice`."""
        from .experiment import run_twice

        return run_twice(fn, *inputs, **kwargs)

    @property
    def records(self) -> List[Dict[str, Any]]:
        """Everything recorded so far by this test (gates, probes, run_twice), the gates of the fixtures its setup
        ran included -- a module- or session-scoped fixture's belong to the test whose setup ran it first."""
        return [r for r in self._session.records if r.get("test") == self.nodeid]

    @property
    def calibrating(self) -> bool:
        return self._session.calibrate

    @property
    def seed(self) -> int:
        """The input seed of this run: ``--vgct-seed`` (default 0) in a normal run; under ``--vgct-calibrate``
        the test runs once per seed (``--vgct-seed`` .. ``+ --vgct-calibrate-runs - 1``). Derive every noise
        tensor / input of the experiment from it (``make_noise(shape, seed=1000 * vgct.seed + k)``), inside the
        test body, so the calibration measures the spread over inputs, not one input."""
        t = _context.current_test()
        if t is not None and t.nodeid == self.nodeid:
            return t.seed
        return self._session.seed


@pytest.fixture
def vgct(request: pytest.FixtureRequest) -> VgctFixture:
    """Ties each comparison to the test id, component and feature (from ``@pytest.mark.component`` /
    ``@pytest.mark.feature``): ``vgct.assert_t1(a, e)``, ``vgct.assert_t2(a, e)``,
    ``vgct.assert_feature_active(on=..., off=...)``, ``vgct.run_twice(fn, *inputs)``."""
    return VgctFixture(request.node)


# ------------------------------------------------------------------------------------------------------------------
# End of session: evidence, report, summary


def _command(config: pytest.Config) -> str:
    args = list(config.invocation_params.args)
    return "pytest " + " ".join(shlex.quote(str(a)) for a in args)


WORKER_KEY = "vgct"


def _worker_payload(s: _context.Session) -> str:
    """What an xdist worker hands the controller (JSON text: execnet carries only plain types)."""
    return json.dumps({"records": s.records, "nondeterminism": s.nondeterminism, "gate_errors": s.gate_errors,
                       "interrupted": bool(s.interrupted),
                       "software": versions(), "precision": precision_settings(),
                       "calibration": [[p, k, st, slot] for (p, k, st), slot in s.calibration.items()]},
                      default=_json_default)


def merge_worker_payload(s: _context.Session, text: str, worker: str = "worker") -> None:
    """Merge an xdist worker's records, nondeterminism findings and calibration runs into the controller's
    session. Calibration runs of one key that disagree on the experiment are refused (an evidence error)."""
    from .evidence import _meta_diff

    data = json.loads(text)
    if s.worker_env is None and "software" in data:  # (the tests ran there: the report's software and precision)
        s.worker_env = {"software": data["software"], "precision": data.get("precision", {})}
    s.records.extend(data.get("records", []))
    s.nondeterminism.extend(data.get("nondeterminism", []))
    if data.get("interrupted"):  # (Ctrl-C or pytest.exit in that worker: the calibration is cut short there)
        s.interrupted = True
    s.gate_errors.extend(f"{e} (on {worker})" for e in data.get("gate_errors", []))
    for path, key, stratum, slot in data.get("calibration", []):
        mine = s.calibration.get((path, key, stratum))
        if mine is None:
            s.calibration[(path, key, stratum)] = slot
            continue
        diff = _meta_diff(mine["meta"], slot["meta"])
        if diff:
            s.evidence_errors.append(f"{path} [{key}] {stratum}: not merged: runs from {worker} are another "
                                     f"experiment ({diff}); give each gate its own case=/name=")
            continue
        mine["runs"].extend(slot["runs"])
        mine["tests"].extend(t for t in slot["tests"] if t not in mine["tests"])


def pytest_keyboard_interrupt(excinfo: Any) -> None:
    """Ctrl-C or ``pytest.exit()`` (whatever its returncode: the session's status is then that code, not
    INTERRUPTED): the calibration runs so far are not written (hostile review of 2026-12-05).  Not pytest-xdist's
    own stop after ``-x``/``--maxfail`` (its ``Interrupted``): the tests whose call completed are complete, and a
    test cut short has no passing call report, so it is not recorded anyway."""
    s = _context.current_session()
    e = getattr(excinfo, "value", None)
    if e is not None and type(e).__name__ == "Interrupted" and type(e).__module__.startswith("xdist"):
        return
    if s is not None:
        s.interrupted = True


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """pytest-xdist (controller): a worker finished; merge what it recorded.  A worker that went down without
    handing it over (a crash: ``error`` set, or no payload) lost the calibration runs of every test it ran -- said
    as an evidence error, not left to "recorded no evidence" (hostile review of 2026-12-05)."""
    s = node.config.stash.get(STATE, None)
    text = getattr(node, "workeroutput", {}).get(WORKER_KEY)
    worker = str(getattr(node, "gateway", None) and node.gateway.id)
    if s is not None and text:
        merge_worker_payload(s, text, worker=worker)
    elif s is not None and s.calibrate:
        s.evidence_errors.append(f"xdist worker {worker} went down without handing over its records "
                                 f"({error or 'no payload'}): the calibration runs of the tests it ran are lost "
                                 f"(their entries are not written); rerun pytest --vgct-calibrate for them")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    s = config.stash.get(STATE, None)
    if s is None:
        return
    s.phase_test = None  # (a test interrupted in its call -- pytest.exit, Ctrl-C -- never reached its teardown)
    s.gate_errors.extend(_pending_gate_errors(session_end=True))
    if _is_xdist_worker(config):  # the controller writes evidence and report once, for every worker
        config.workeroutput[WORKER_KEY] = _worker_payload(s)  # type: ignore[attr-defined]
        return
    if s.calibrate and s.interrupted:  # (pytest_keyboard_interrupt: not xdist's -x stop)
        # Ctrl-C (or pytest.exit) part-way: a test's seeds cut short would replace its complete runs; before any
        # run was recorded it is still the interruption that wrote nothing, not an absence of gates
        s.evidence_errors.append("calibration interrupted: no evidence was written " + (
            "(the runs recorded so far may miss seeds or tests; an entry's runs are replaced by a rerun's)"
            if s.calibration else "(no calibrating gate -- assert_t2, a tightened assert_t1 -- had recorded a run "
            "yet)") + ". Rerun pytest --vgct-calibrate to the end.")
    elif s.calibrate and s.calibration:
        from .evidence import write_calibration

        queued = {r.get("test") for slot in s.calibration.values() for r in slot["runs"]}
        s.evidence_errors += [f"{t} ran again after a failed attempt (a rerun plugin): its calibration runs are not "
                              f"recorded (the failed attempt's are queued beside the passing one's); calibrate "
                              f"without reruns" for t, o in sorted(s.tests.items()) if o.get("rerun") and t in queued]

        s.evidence_written = write_calibration(s, _command(config))
    elif not s.calibrate and not s.interrupted:
        from .evidence import ungated_entries

        s.gate_errors += ungated_entries(s)
    s.gate_errors += _verdicts_across_reruns(s)
    if s.gate_errors and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED  # a gate failed where no test could report it
    if s.evidence_errors and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED  # calibration refused (not pytest's INTERNAL_ERROR, 3)
    _write_report(session, s)


def _verdicts_across_reruns(s: _context.Session) -> List[str]:
    """Lines for the tests a rerun plugin (pytest-rerunfailures' ``--reruns``) ran again after a failed attempt
    whose last attempt passed or skipped while an earlier one saw a gate verdict the last did not -- a gate that
    failed there and passed (or did not run) later: one paired experiment, two verdicts, nondeterminism or a real
    failure retried away -- or a ``--vgct-repeat`` nondeterminism finding; the session fails with them (the method
    runs a paired test twice to detect nondeterminism: ``--vgct-repeat``).  Attempts are told apart by the records'
    ``attempt`` stamp; a gate by kind, component, feature, name and case, its verdicts in one attempt as a set (a
    planted fault caught by ``pytest.raises`` beside a clean gate of one name gives the same set each time).
    Records a planted-fault block expected to fail, and calibrating ones, are left out."""
    out = []
    for nodeid, t in sorted(s.tests.items()):
        if not t.get("reruns") or t.get("outcome") not in ("passed", "skipped"):
            continue
        last = t["reruns"]
        seen: Dict[int, Dict[tuple, set]] = {}
        for r in s.records:
            if (r.get("test") != nodeid or r.get("kind") not in GATE_KINDS or r.get("expected_failure")
                    or r.get("calibrating")):
                continue
            key = (r.get("kind"), r.get("component"), r.get("feature"), r.get("name"), r.get("case"))
            seen.setdefault(int(r.get("attempt", 0)), {}).setdefault(key, set()).add(bool(r.get("passed")))
        final = seen.get(last, {})
        flips = [k for a, gates_of in seen.items() if a != last for k, v in gates_of.items()
                 if False in v and final.get(k) != v]
        nondet = [n for n in s.nondeterminism if n.get("test") == nodeid]
        if flips:
            kind, component, feature, name, case = flips[0]
            label = f"{component!r} | {feature!r}" + (f" [{name}]" if name else "") + (f" ({case})" if case else "")
            later = "passed in the last" if final.get(flips[0]) else f"did not run in the last ({t['outcome']})"
            out.append(f"{nodeid} {t['outcome']} on a rerun after a failed attempt, and its {str(kind).upper()} gate "
                       f"of {label}{f' and {len(set(flips)) - 1} more' if len(set(flips)) > 1 else ''} failed in an "
                       f"earlier attempt and {later}: the same experiment gave two verdicts -- nondeterminism, or a "
                       f"real failure retried away; find out which (pytest --vgct-repeat=2 runs it twice and names "
                       f"what differs) instead of rerunning it")
        elif nondet:
            out.append(f"{nodeid} {t['outcome']} on a rerun after an attempt whose --vgct-repeat repetitions differed "
                       f"(vgct NONDETERMINISM above): the rerun retried the finding away; fix the nondeterminism")
    return out


def _write_report(session: pytest.Session, s: _context.Session) -> None:
    """The --vgct-report document, with the session's status as it ends (the report's own failure aside,
    which it cannot hold: that makes the status INTERNAL_ERROR)."""
    config = session.config
    path = config.getoption("--vgct-report")
    if path:
        p = _report_path(config, path)
        try:
            why = _not_a_report(p)  # (checked at startup too: a file put there meanwhile is kept as well)
            if why:
                raise FileExistsError(f"{p} {why}")
            report = build_report(config, s, int(session.exitstatus))
            _files.atomic_write_text(p, json.dumps(report, indent=2, default=_json_default) + "\n")
            s.report_path, s.report_error = str(p), None
        except (OSError, TypeError, ValueError) as exc:
            s.report_error = f"vgct: the report was not written to {p}: {exc}"
    if s.report_error and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.INTERNAL_ERROR


@pytest.hookimpl(wrapper=True, specname="pytest_sessionfinish")
def pytest_sessionfinish_late_gate_errors(session: pytest.Session, exitstatus: int) -> Any:
    """After every pytest_sessionfinish implementation (a conftest's; pytest's own, which tears the session
    fixtures down after pytest.exit()): gate failures lost meanwhile still fail the session -- added to the
    report (written again) or, on an xdist worker, to what it hands the controller (xdist's own wrapper sends
    it after this one).  Only hook wrappers registered after this plugin's run later."""
    result = yield
    config = session.config
    s = config.stash.get(STATE, None)
    late = _pending_gate_errors(session_end=True, last=True)
    if s is None or not late:
        return result
    s.gate_errors.extend(late)
    if _is_xdist_worker(config):
        config.workeroutput[WORKER_KEY] = _worker_payload(s)  # type: ignore[attr-defined]
        return result
    if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    _write_report(session, s)
    return result


def _json_default(o: Any) -> Any:
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, (set, tuple)):
        return list(o)
    return str(o)


def build_report(config: pytest.Config, s: _context.Session, exitstatus: int) -> Dict[str, Any]:
    """The ``--vgct-report`` document (format ``vgct-report/1``)."""
    tests = list(s.tests.values())
    comparisons = [{k: v for k, v in r.items() if k != "signature"} for r in s.records]
    return {
        "format": "vgct-report/1",
        "command": _command(config),
        "argv": list(sys.argv),
        "cwd": str(config.invocation_params.dir),
        "started": s.started,
        "finished": datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat(),
        "exitstatus": exitstatus,
        "hardware": hardware_info(),
        "software": s.worker_env["software"] if s.worker_env else versions(),
        "precision": {"torch": s.worker_env["precision"] if s.worker_env else precision_settings(),
                      "dtypes": sorted({f"{r['dtype_actual']} vs {r['dtype_expected']}" for r in s.records
                                        if "dtype_actual" in r})},
        "options": {"strict": s.strict, "calibrate": s.calibrate, "headroom": s.headroom, "repeat": s.repeat,
                    "calibrate_runs": s.calibrate_runs, "seed": s.seed},
        "summary": {o: sum(1 for t in tests if t["outcome"] == o)
                    for o in ("passed", "failed", "error", "skipped", "xfailed")},
        "comparisons": comparisons,
        "tests": tests,
        "skips": [{"test": t["nodeid"], "reason": t.get("reason", "")} for t in tests if t["outcome"] == "skipped"],
        "nondeterminism": s.nondeterminism,
        "evidence_written": s.evidence_written,
        "evidence_unused": s.evidence_unused,
        "evidence_errors": s.evidence_errors,
        "gate_errors": s.gate_errors,
    }


def _fmt(stat: str, v: Any) -> str:
    from .gates import fmt_value

    return fmt_value(stat, v)


SUMMARY_HEADER = ("test", "name", "component", "feature", "gate", "dtype (a/e)", "shape", "statistic", "value",
                  "bar", "margin", "slack", "result")


def fmt_slack(r: Dict[str, Any]) -> str:
    """A gate record's slack for the table: ``"42x"``, ``"1.8e+02x !"`` above 100x on a passing gate, ``"exact"``
    when every gated statistic measured 0 (bitwise equal), ``""`` when undefined."""
    from .gates import SLACK_WARNING

    v = r.get("slack")
    if v is None:
        return "exact" if r.get("passed") and r.get("statistics", {}).get("n_unequal") == 0 else ""
    txt = f"{v:.3g}x" if v < 1000 else f"{v:.1e}x"
    return txt + (" !" if r.get("passed") and v > SLACK_WARNING else "")


def _is_failure(r: Dict[str, Any]) -> bool:
    if r.get("expected_failure"):
        return False
    if r.get("kind") == "run_twice":
        return not r.get("identical", True)
    return not r.get("passed", True)


def slack_warnings(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The passing gate records whose slack exceeds :data:`vgct_ext.gates.SLACK_WARNING` (100x), each gate once:
    the records of ``--vgct-repeat``'s later repetitions (the same gate again) are not counted."""
    from .gates import SLACK_WARNING

    return [r for r in records if r.get("kind") in ("t1", "t2") and r.get("passed") and not r.get("calibrating")
            and not r.get("expected_failure") and not r.get("repetition")
            and r.get("slack") is not None and r["slack"] > SLACK_WARNING]


def exact_under_relaxation(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The passing T1 gate records that claim a relaxation (``relax=``) and measured the two outputs bitwise equal
    (max abs error 0): a feature that reorders a reduction, swaps a kernel or fuses under compile almost never
    gives the reference's bits, so the feature likely did not run (new-user trial of 2026-12-05: the feature not
    applied, a relaxed gate compared the reference with itself and passed silently).  Each gate once."""
    return _passing_t1(records, lambda r: r.get("relax") and (r.get("statistics") or {}).get("max_abs_err") == 0.0)


def _test_feature(r: Dict[str, Any]) -> tuple:
    """A record's (test, component, feature)."""
    return r.get("test"), r.get("component"), r.get("feature")


def exact_under_relaxation_split(records: List[Dict[str, Any]]) -> Tuple[List[Dict[str, Any]],
                                                                            List[Dict[str, Any]]]:
    """:func:`exact_under_relaxation`'s gates in two lists: those of a test with no passing feature-active probe of
    the same component and feature (did the feature run?), and those whose probe passed (it ran -- a call count,
    a flag -- and gave the reference's bits: the relaxation is not needed there; GPU run of 2026-12-05, a float32
    attention-backend swap whose backend was called twice).  The summary says each its own way."""
    probed = {_test_feature(r) for r in records if r.get("kind") == "probe" and r.get("passed")}
    exact = exact_under_relaxation(records)
    return ([r for r in exact if _test_feature(r) not in probed],
            [r for r in exact if _test_feature(r) in probed])


def _first_per_gate(records: List[Dict[str, Any]], which: Any) -> List[Dict[str, Any]]:
    """The first record of each gate (test, label, component, feature; a gate runs once per seed under
    ``--vgct-calibrate``, once per repetition under ``--vgct-repeat``) for which ``which(record)`` holds."""
    seen: Dict[tuple, Dict[str, Any]] = {}
    for r in records:
        if which(r):
            seen.setdefault((r.get("test"), r.get("name"), r.get("component"), r.get("feature")), r)
    return list(seen.values())


def _passing_t1(records: List[Dict[str, Any]], which: Any) -> List[Dict[str, Any]]:
    """The first record of each passing T1 gate for which ``which(record)`` holds -- not an expected failure, not
    a repetition."""
    return _first_per_gate(records, lambda r: r.get("kind") == "t1" and r.get("passed") and not
                           r.get("expected_failure") and not r.get("repetition") and which(r))


def _name_gates(tr: Any, records: List[Dict[str, Any]], what: str, detail: Any) -> None:
    """``vgct: N <what>`` and a line per gate (test [label]: component / feature: ``detail(record)``), in
    yellow; nothing for no records."""
    if not records:
        return
    tr.write_line(f"vgct: {len(records)} {what}", yellow=True)
    for r in records:
        label = f" [{r['name']}]" if r.get("name") else ""
        tr.write_line(f"  {r.get('test')}{label}: {r['component']} / {r['feature']}: {detail(r)}", yellow=True)


def xfailed_verdicts(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The failing T1/T2 gate records whose GateFailure an xfail absorbed (the plugin's makereport marks them,
    ``xfailed``: the failure is among the exceptions of the xfailed call -- raised into an xfail marker, or
    ``pytest.xfail()`` called while handling it; not one the test caught, nor one lost in a thread, which fails
    the session; ``_is_failure``: not a planted fault expect_gate_failure caught), each gate once (the first
    failing run: a ``--vgct-repeat`` repetition too).  An xfail mark --
    strict or not -- turns a verdict into an expected failure, so a real divergence in a component marked xfail
    leaves the run green and, under the default ``--vgct-summary=failures``, out of the table too."""
    return _first_per_gate(records, lambda r: r.get("kind") in ("t1", "t2") and r.get("xfailed") and _is_failure(r))


def _first_miss(r: Dict[str, Any]) -> str:
    """A failed gate's first missed bar: ``statistic value (bar op bar)``."""
    for c in r.get("checks") or []:
        if c.get("gating") and not c.get("passed"):
            return f"{c['statistic']} {_fmt(c['statistic'], c['value'])} (bar {c['op']} {_fmt(c['statistic'], c['bar'])})"
    return "evidence missing" if r.get("problem") else "failed"


def coarse_references(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The passing T1 gate records whose reference is coarser than the output under test (``expected``
    bfloat16, ``actual`` float32): judged at the reference's resolution, a bug below it passes.  Each gate
    once."""
    return _passing_t1(records, lambda r: r.get("coarse_reference"))


def summary_rows(records: List[Dict[str, Any]], *, which: str = "all",
                 failed_tests: Optional[set] = None) -> List[tuple]:
    """Rows in :data:`SUMMARY_HEADER` order (test, name, component, feature, gate, dtype, shape, statistic, value,
    bar, margin, slack, result) for the records; ``which="failures"`` keeps failed gates, probes and run_twice
    comparisons only, and, given ``failed_tests`` (node ids), only those of tests that failed (a gate failure a
    passing test expected, e.g. under ``pytest.raises``, is not one; a planted fault caught by
    ``expect_gate_failure`` reads ``caught``)."""
    from .gates import check_ratio, fmt_margin

    rows = []
    for r in records:
        kind = r.get("kind")
        if kind not in ("t1", "t2", "probe", "run_twice"):
            continue
        if which == "failures" and (not _is_failure(r) or (failed_tests is not None and r.get("test") is not None
                                                           and r.get("test") not in failed_tests)):
            continue
        rep = f" #{r['repetition'] + 1}" if r.get("repetition") else ""
        test = (r.get("test") or "-") + rep
        if kind == "probe":
            for f in r["forms"]:
                rows.append((test, "", r["component"], r["feature"], "active", "", "", f["form"], "", "", "", "",
                             "pass" if f["passed"] else "FAIL"))
            continue
        if kind == "run_twice":
            rows.append((test, "", "", "", "twice", "", "", f"{len(r['outputs'])} outputs", "identical" if
                         r["identical"] else "DIFFER", "", "", "", "pass" if r["identical"] else "FAIL"))
            continue
        gate = r.get("gate", kind.upper())
        if r.get("relax"):
            gate += f" ({r['relax']})"
        if r.get("calibrating"):
            gate += " calibrating"
        dtype = f"{r['dtype_actual']}/{r['dtype_expected']}"
        shape = "x".join(str(d) for d in r["shape"]) or "()"
        fail_word = "caught" if r.get("expected_failure") else "FAIL"
        shown = [c for c in r["checks"] if c["statistic"] != "mean_diff"]
        # the slack goes on the row of the statistic that sets it (the smallest headroom ratio), else the first
        ratios = [check_ratio(c["statistic"], c["op"], c["value"], c["bar"], c["gating"]) for c in shown]
        at = min((i for i, x in enumerate(ratios) if x is not None), key=lambda i: ratios[i], default=0)
        first = True
        for i, c in enumerate(shown):
            label = r.get("name") or r.get("case") or ""  # a T2 gate's case= tells its gates of one test apart
            head = ((test, label, r["component"], r["feature"], gate, dtype, shape) if first
                    else ("",) * 7)
            sl = fmt_slack(r) if i == at else ""
            first = False
            if c["gating"]:
                bar = f"{c['op']} {_fmt(c['statistic'], c['bar'])}"
                margin = fmt_margin(c["margin"])
                res = "pass" if c["passed"] else fail_word
            else:
                bar, margin, res = "-", "", ("recorded" if r.get("calibrating") else "-")
            rows.append(head + (c["statistic"], _fmt(c["statistic"], c["value"]), bar, margin, sl, res))
        if r.get("problem"):
            rows.append(("",) * 7 + ("evidence", "missing", "", "", "", fail_word))
    return rows


def render_table(rows: List[tuple], width: int) -> List[str]:
    """The rows as text lines at most ``width`` columns wide (:func:`vgct_ext._table.render_grouped`, rich).

    When every column fits, one table with a row per statistic. Otherwise each gate gets heading lines (test and
    label; component, feature, gate, dtypes, shape; cut with "..." to the width) over a table of its statistics
    (statistic, value, bar, result, then slack and margin as far as they fit: the slack, bar / value, is what
    the "looser than their measurement" warning reads), so numbers are never cut.
    """
    from .._table import render_grouped

    return render_grouped(SUMMARY_HEADER, rows, width, key=7, heading=_gate_heading, priority=(7, 8, 9, 12, 11, 10))


def _gate_heading(head: Any) -> List[str]:
    """The heading lines of one gate in the narrow summary: ``test [name]``, then ``  component / feature  gate
    dtypes  shape``."""
    test, name, comp, feat, gate, dtype, shape = head
    lines = [f"{test}{f' [{name}]' if name else ''}"]
    what = "  ".join(x for x in (f"{comp} / {feat}" if comp else "", gate, dtype, shape) if x)
    if what:
        lines.append("  " + what)
    return lines


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    s = config.stash.get(STATE, None)
    if s is None:
        return
    which = config.getoption("--vgct-summary", "failures") or "failures"
    if which != "none":
        rows = summary_rows(s.records, which=which, failed_tests=set(s.failed_tests))
        if rows:
            width = int(getattr(getattr(terminalreporter, "_tw", None), "fullwidth", 0) or 120)
            title = "vgct comparisons" + (" (failed only; --vgct-summary=all lists every one)"
                                          if which == "failures" else "")
            terminalreporter.write_sep("=", title)
            for line in render_table(rows, width):
                terminalreporter.write_line(line, red=" FAIL" in line)
        slack = slack_warnings(s.records)
        if slack:
            terminalreporter.write_line(
                f"vgct: {len(slack)} passing gate(s) have bars more than 100x looser than their measurement "
                f"(slack column): a bug smaller than the bar passes them. Tighten a T1 gate to its recorded floor "
                f"(assert_t1(..., tighten=10), calibrated by --vgct-calibrate; docs/method.md, \"Tightening a T1 "
                f"gate\") or give it explicit bars a modest factor above the measurement; a T2 gate's bars are its "
                f"calibrated runs' (a run far noisier than this one: check the seeds)"
                + ("; --vgct-summary=all lists them" if which != "all" else ""), yellow=True)
            if which == "all":
                for r in slack:
                    label = f" [{r['name']}]" if r.get("name") else ""
                    terminalreporter.write_line(f"  {r.get('test')}{label}: {r['component']} / {r['feature']}: "
                                                f"slack {r['slack']:.3g}x", yellow=True)
        unproved, ran = exact_under_relaxation_split(s.records)
        _name_gates(terminalreporter, unproved,
                    "passing T1 gate(s) claim a relaxation (relax=) but measured the outputs bitwise equal: is the "
                    "feature active? (a reordered reduction, a swapped kernel or a compiled fusion almost never gives "
                    "the reference's bits; a feature-active probe proves it ran -- or drop relax=)",
                    lambda r: f"relax {r['relax']!r}, max abs error 0")
        _name_gates(terminalreporter, ran,
                    "passing T1 gate(s) claim a relaxation (relax=) and measured the outputs bitwise equal while a "
                    "feature-active probe of the same test passed: the feature ran and gave the reference's bits "
                    "here, so the relaxation is not needed on this stratum -- an exact gate (no relax=) fails on "
                    "any change; keep relax= only where the feature changes the bits",
                    lambda r: f"relax {r['relax']!r}, max abs error 0, probe passed")
        _name_gates(terminalreporter, coarse_references(s.records),
                    "passing T1 gate(s) compared an output against a reference coarser than it: the bars are the "
                    "reference's dtype's, a bug below its resolution passes (keep the reference at least as precise "
                    "as the output under test)",
                    lambda r: f"actual {r.get('dtype_actual')} vs expected {r.get('dtype_expected')}")
        _name_gates(terminalreporter, xfailed_verdicts(s.records),
                    "gate(s) failed inside xfailed tests: the xfail turned their divergence into an expected failure "
                    "and does not fail the run. If this is a known bug, keep the mark with its reason; otherwise "
                    "remove it (a strict xfail fails the run only once the gate passes)",
                    _first_miss)
    for n in s.nondeterminism:
        terminalreporter.write_line(f"vgct NONDETERMINISM in {n['test']} (--vgct-repeat={n['repeat']}): "
                                    f"{len(n['differences'])} difference(s)", red=True)
    terminal_files(terminalreporter, s)


def terminal_files(tr: Any, s: _context.Session) -> None:
    """The files part of the summary: each evidence entry written (a diff: runs added/replaced/kept, each
    bar old -> new, with every digit), warnings, unused entries of the touched files, errors, the report."""
    from .evidence import NOTE_DROPPED_WHY, fmt_exact

    for w in s.evidence_written:
        what = "T1 floor" if w.get("kind") == "t1_floor" else "bars"
        seeds = w.get("seeds") or []
        seed_txt = f", seeds {seeds[0]}..{seeds[-1]}" if seeds else ""
        tr.write_line(f"vgct evidence written: {w['file']} [{w['key']}] stratum {w['stratum']}: {w['status']}, "
                      f"{w['runs']} run(s): +{w['added']} added{seed_txt}, {w['replaced']} replaced, {w['kept']} "
                      f"kept" + (f" (from {', '.join(w['kept_tests'])})" if w["kept"] else ""))
        looser = w.get("looser") or ()
        for k, old, new in w.get("values", []):
            change = "(new)" if old is None else ("(unchanged)" if old == new else f"(was {fmt_exact(k, old)})")
            tr.write_line(f"    {what} {k}: {fmt_exact(k, new)} {change}" + ("  LOOSER" if k in looser else ""),
                          yellow=k in looser)
        if looser:  # a recalibration with a bug present loosens the bars as readily as real drift (new-user trial)
            tr.write_line(f"vgct WARNING [{w['key']}] {w['stratum']}: {len(looser)} bar(s) looser than before "
                          f"({', '.join(looser)}): a run measured more drift than the runs it replaced -- a bug "
                          f"present while calibrating passes every later gate; review the evidence diff before "
                          f"committing it", yellow=True)
        if w.get("note_dropped"):
            why = NOTE_DROPPED_WHY.get(w["note_dropped"], NOTE_DROPPED_WHY["cosine"])
            tr.write_line(f"vgct: the investigation note of [{w['key']}] {w['stratum']} was dropped: {why}",
                          yellow=True)
        for warning in w.get("warnings", []):
            tr.write_line(f"vgct WARNING [{w['key']}] {w['stratum']}: {warning}", yellow=True)
        if w.get("needs_investigation"):
            cos = (w.get("bars") or {}).get("cosine")
            why = [f"cosine bar {fmt_exact('cosine', cos)} < 0.99"] if cos is not None and cos < 0.99 else []
            if w.get("outlier_runs"):
                why.append("outlier run(s) " + ", ".join(f"({t}, seed {sd})" for t, sd in w["outlier_runs"]))
            tr.write_line(f"vgct: {' and '.join(why)} for {w['key']}: the gate will fail until an investigation "
                          f"note is recorded" + (" (or the entry recalibrated without the outliers' cause)"
                                                 if w.get("outlier_runs") else "") +
                          f": python -m vgct_ext evidence annotate {w['file']} \"{w['key']}\" --stratum "
                          f"{w['stratum']} --investigation \"...\"", yellow=True)
    for u in s.evidence_unused:
        why = ("stale? its test(s) ran in this session and did not gate it; remove with: python -m vgct_ext "
               f"evidence remove {u['file']} \"{u['key']}\" --stratum {u['stratum']}" if u["stale"]
               else "not recalibrated here (its tests did not run)")
        tr.write_line(f"vgct evidence unused: {u['file']} [{u['key']}] stratum {u['stratum']}: {why}")
    if s.calibrate and not s.evidence_written and not s.evidence_errors:
        tr.write_line("vgct: --vgct-calibrate recorded no evidence (no passing assert_t2 or tighten= T1 gate ran)",
                      yellow=True)
    for e in s.evidence_errors:
        tr.write_line(f"vgct ERROR: {e}", red=True)
    for e in s.gate_errors:
        tr.write_line(f"vgct ERROR (no test failed with it; the session fails): {e}", red=True)
    if s.report_path:
        tr.write_line(f"vgct report: {s.report_path}")
    if s.report_error:
        tr.write_line(s.report_error, red=True)
