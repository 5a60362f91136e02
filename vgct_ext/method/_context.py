"""Where gates and probes record what they measured, and which test they belong to.

Private. The pytest plugin (:mod:`vgct_ext.plugin`) pushes a :class:`Session` when pytest is configured
and a :class:`TestContext` around each test call; gates and probes append records to both. Without
the plugin (a plain script) nothing is recorded and the gates still raise. Sessions form a stack so that
a pytest run inside a test (``pytester``) does not disturb the outer one.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Dict, List, Optional

__all__ = ["Session", "TestContext", "current_session", "current_test", "is_current", "record", "strict_mode"]


@dataclasses.dataclass
class TestContext:
    """The test a comparison belongs to: its pytest node id, module file, component and feature markers."""

    nodeid: str
    path: Optional[Path] = None
    component: Optional[str] = None
    feature: Optional[str] = None
    repetition: int = 0
    #: the input seed of this run: 0 normally (or --vgct-seed), 0..N-1 under --vgct-calibrate (``vgct.seed``)
    seed: int = 0
    #: a paired test (t1/t2/component/feature marker or the vgct fixture): gate identities are enforced
    paired: bool = False
    #: (evidence file, key) gated in the current run (seed, repetition), see vgct_ext.evidence.claim
    claims: set = dataclasses.field(default_factory=set)
    records: List[Dict[str, Any]] = dataclasses.field(default_factory=list, repr=False)
    #: the EvidenceMissing errors gates raised in this test: one that does not fail it was swallowed
    missing: List[BaseException] = dataclasses.field(default_factory=list, repr=False)
    #: the exceptions other than a verdict that gates raised in this (paired) test: refusals of their arguments
    refused: List[BaseException] = dataclasses.field(default_factory=list, repr=False)
    #: calls of gates that read recorded evidence (assert_t2, a tightened assert_t1), whatever their outcome
    evidence_gates: int = 0


@dataclasses.dataclass(repr=False)
class Session:
    """One pytest session's settings and everything its gates and probes recorded."""

    strict: bool = False
    calibrate: bool = False
    headroom: float = 0.5
    repeat: int = 1
    calibrate_runs: int = 5
    seed: int = 0
    records: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
    # (evidence path, key, stratum) -> {"runs": [...], "meta": {...}, "tests": set()}
    calibration: Dict[tuple, Dict[str, Any]] = dataclasses.field(default_factory=dict)
    failed_tests: set = dataclasses.field(default_factory=set)
    #: an xdist worker's versions and precision switches (the first to report): the tests ran there
    worker_env: Optional[Dict[str, Any]] = None
    interrupted: bool = False  # Ctrl-C or pytest.exit() during the session (pytest_keyboard_interrupt)
    nondeterminism: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
    evidence_written: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
    test_stack: List[TestContext] = dataclasses.field(default_factory=list)
    tests: Dict[str, Dict[str, Any]] = dataclasses.field(default_factory=dict)  # nodeid -> outcome, reason
    started: Optional[str] = None
    report_path: Optional[str] = None
    report_error: Optional[str] = None
    evidence_errors: List[str] = dataclasses.field(default_factory=list)
    gate_errors: List[str] = dataclasses.field(default_factory=list)  # gate failures no test reported
    evidence_unused: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
    #: the test whose setup or teardown is running: a gate in a fixture (no test context yet, or none left)
    #: is recorded as that test's (record)
    phase_test: Optional[str] = None

    def __repr__(self) -> str:  # short: a traceback showing this object must not dump every record
        return (f"<vgct Session calibrate={self.calibrate} repeat={self.repeat} strict={self.strict} "
                f"records={len(self.records)} tests={len(self.tests)}>")


_SESSIONS: List[Session] = []


def push_session(session: Session) -> None:
    _SESSIONS.append(session)


def pop_session(session: Session) -> None:
    """Remove ``session`` (by identity: sessions are dataclasses, and two fresh ones compare equal)."""
    _SESSIONS[:] = [s for s in _SESSIONS if s is not session]


def current_session() -> Optional[Session]:
    try:  # (also from worker threads -- a future's hook -- while the main thread pops: never raises)
        return _SESSIONS[-1] if _SESSIONS else None
    except IndexError:
        return None


def is_current(session: Optional[Session]) -> bool:
    """Whether what was left under ``session`` (the innermost session when it was left) is the innermost
    session's now: it is that session, or that session has ended (a pytest run inside a test passes what it
    did not take to the session around it), or there was none."""
    return session is current_session() or all(session is not s for s in _SESSIONS)


def current_test() -> Optional[TestContext]:
    s = current_session()
    try:  # (as current_session)
        return s.test_stack[-1] if s is not None and s.test_stack else None
    except IndexError:
        return None


def record(rec: Dict[str, Any]) -> Dict[str, Any]:
    """Stamp ``rec`` with the current test and repetition and append it to the session and the test (a gate in a
    fixture's setup or teardown: the test whose setup or teardown runs it, ``Session.phase_test``)."""
    t = current_test()
    s = current_session()
    rec.setdefault("test", t.nodeid if t is not None else s.phase_test if s is not None else None)
    rec.setdefault("repetition", t.repetition if t is not None else 0)
    rec.setdefault("seed", t.seed if t is not None else 0)
    if s is not None:
        # the test's attempt (0, or n after n "rerun" reports of a rerun plugin: the verdicts across attempts)
        rec.setdefault("attempt", s.tests.get(rec["test"], {}).get("reruns", 0) if rec["test"] else 0)
        s.records.append(rec)
    if t is not None:
        t.records.append(rec)
    return rec


def strict_mode() -> bool:
    """True under ``--vgct-strict`` or ``VGCT_STRICT=1`` (missing checkpoints/references fail, not skip)."""
    s = current_session()
    if s is not None and s.strict:
        return True
    return os.environ.get("VGCT_STRICT", "").strip().lower() in ("1", "true", "yes", "on")
