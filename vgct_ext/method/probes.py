"""Feature-active probes: prove the feature (or alternate path) ran and was not silently a no-op.

Source: the method, "Also add a feature-active assertion: prove the feature or alternate path ran and was not
silently a no-op. Prefer an observable path flag, call count, sharding state, or nonzero feature delta over
inspecting implementation details" and "For an external reference, verify that both frameworks actually
loaded the intended checkpoint and dtype" (weights fingerprints). ``poison``/``count_unwritten`` prove an
output buffer was written everywhere (an unwritten element can otherwise pass as a stale value).

Nothing here imports torch at import time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import inspect
import math
import numbers
import sys
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from . import _context
from ._blocks import gate_block

__all__ = [
    "FeatureInactive",
    "PlantedFaultNotCaught",
    "ProbeResult",
    "CallCounter",
    "assert_feature_active",
    "count_calls",
    "weights_fingerprint",
    "weights_fingerprints",
    "assert_same_weights",
    "poison",
    "count_unwritten",
    "assert_all_written",
    "attention_backend_calls",
    "CompileProbe",
    "expect_gate_failure",
    "ExpectedFailure",
]


class FeatureInactive(AssertionError):
    """A feature-active probe found no sign that the feature ran. ``.result`` is the :class:`ProbeResult`."""

    def __init__(self, message: str, result: "ProbeResult"):
        super().__init__(message)
        self.result = result


class PlantedFaultNotCaught(AssertionError):
    """:func:`expect_gate_failure` found its planted fault not caught as asked: the gate passed (or no gate
    ran in the block's thread), or it failed on other statistics, or its message lacks a FAIL row or the
    component.  An ``AssertionError`` (the test fails); its own class so that the pytest plugin also finds
    it where no code raises it in a test (an unread Future, a task never awaited, a thread)."""


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """The outcome of :func:`assert_feature_active`: one ``(form, passed, detail)`` per form given."""

    component: str
    feature: str
    forms: Tuple[Tuple[str, bool, str], ...]
    stats: Any = None

    @property
    def passed(self) -> bool:
        return all(ok for _, ok, _ in self.forms)


class CallCounter:
    """Counts calls seen by :func:`count_calls`. ``int(counter)`` and ``counter.count`` give the count."""

    def __init__(self, name: str):
        self.name = name
        self.count = 0

    def hit(self) -> None:
        self.count += 1

    def __int__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"CallCounter({self.name!r}, count={self.count})"


def _torch_module_type() -> Optional[type]:
    nn = sys.modules.get("torch.nn")
    return getattr(nn, "Module", None) if nn is not None else None


def _describe(obj: Any) -> str:
    if inspect.ismodule(obj):
        return obj.__name__
    if isinstance(obj, type):
        return obj.__qualname__
    return type(obj).__qualname__


def _wrap(fn: Any, counter: CallCounter) -> Any:
    @functools.wraps(fn)
    def counted(*args: Any, **kwargs: Any) -> Any:
        counter.hit()
        return fn(*args, **kwargs)

    return counted


def _restore(obj: Any, name: str, own: bool, old: Any) -> None:
    """Undo count_calls' wrapper: put back the attribute ``obj`` itself held, or drop the one it added."""
    if own:
        setattr(obj, name, old)
    else:
        delattr(obj, name)


@contextlib.contextmanager
def count_calls(obj: Any, name: str) -> Iterator[CallCounter]:
    """Count calls of ``obj.name`` inside the ``with`` block; yields a :class:`CallCounter`.

    * ``obj`` a ``torch.nn.Module`` and ``name`` ``"forward"`` or a dotted submodule path (``"blocks.0.attn1"``):
      counts that module's forward calls with a forward pre-hook (calls through ``module(...)``).
    * ``obj`` a Python module (``torch.nn.functional``) and ``name`` a function: the attribute is replaced by a
      counting wrapper; only calls that look the name up on the module at call time are seen (not names bound
      earlier by ``from ... import``).
    * ``obj`` a class (static, class and instance methods; every instance) or an instance (that one object).

    The original attribute is restored on exit, also on error. Raises ``AttributeError`` if ``obj`` has no
    such attribute or submodule, ``TypeError`` if it is not callable.
    """
    counter = CallCounter(f"{_describe(obj)}.{name}")
    mod_type = _torch_module_type()
    if mod_type is not None and isinstance(obj, mod_type):
        target = None
        if name == "forward":
            target = obj
        elif not (hasattr(type(obj), name) and callable(getattr(type(obj), name))):
            try:
                target = obj.get_submodule(name)
            except AttributeError:
                target = None
        if target is not None:
            handle = target.register_forward_pre_hook(lambda _m, _a: counter.hit())
            try:
                yield counter
            finally:
                handle.remove()
            return
    if not hasattr(obj, name):
        raise AttributeError(f"count_calls: {_describe(obj)} has no attribute or submodule {name!r}")
    if isinstance(obj, type):
        static = inspect.getattr_static(obj, name)
        own = name in obj.__dict__
        old = obj.__dict__.get(name)
        if isinstance(static, staticmethod):
            new: Any = staticmethod(_wrap(static.__func__, counter))
        elif isinstance(static, classmethod):
            new = classmethod(_wrap(static.__func__, counter))
        elif callable(static):
            new = _wrap(static, counter)
        else:
            raise TypeError(f"count_calls: {_describe(obj)}.{name} is not callable")
        setattr(obj, name, new)
        try:
            yield counter
        finally:
            _restore(obj, name, own, old)
        return
    original = getattr(obj, name)
    if not callable(original):
        raise TypeError(f"count_calls: {_describe(obj)}.{name} is not callable")
    d = getattr(obj, "__dict__", None)
    own = d is not None and name in d
    old = d[name] if own else None
    try:
        setattr(obj, name, _wrap(original, counter))
    except (AttributeError, TypeError) as exc:
        raise TypeError(f"count_calls: cannot wrap {_describe(obj)}.{name} ({exc}); count on its class "
                        f"instead") from exc
    try:
        yield counter
    finally:
        _restore(obj, name, own, old)


def _world_size(group: Any = None) -> Optional[int]:
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_world_size(group))
    except Exception:  # noqa: BLE001
        return None
    return None


def _sharding_form(sharding: Any) -> Tuple[bool, str]:
    placements = getattr(sharding, "placements", None)
    if placements is not None:  # a DTensor
        shards = [p for p in placements if getattr(p, "is_shard", lambda: False)()]
        mesh = getattr(sharding, "device_mesh", None)
        size = int(mesh.size()) if mesh is not None and hasattr(mesh, "size") else None
        ok = bool(shards) and (size is None or size > 1)
        return ok, (f"DTensor placements {tuple(placements)} on a mesh of {size} ranks"
                    + ("" if ok else ": not sharded"))
    if not (isinstance(sharding, (tuple, list)) and len(sharding) == 3):
        raise TypeError("sharding= takes a DTensor or a (local_tensor, global_shape, dim) tuple")
    local, global_shape, dim = sharding
    lshape, gshape = tuple(local.shape), tuple(int(s) for s in global_shape)
    if len(lshape) != len(gshape):
        return False, f"local shape {lshape} and global shape {gshape} differ in rank"
    d = dim % len(gshape)
    others_equal = all(lshape[i] == gshape[i] for i in range(len(gshape)) if i != d)
    ws = _world_size()
    ok = others_equal and lshape[d] < gshape[d] and (ws is None or ws > 1)
    detail = (f"local shape {lshape} of global {gshape} along dim {d}"
              + (f", world size {ws}" if ws is not None else ", torch.distributed not initialized"))
    if not others_equal:
        detail += ": other dims differ from the global shape"
    elif lshape[d] >= gshape[d]:
        detail += ": the local tensor is the whole tensor (not sharded)"
    elif ws is not None and ws <= 1:
        detail += ": world size 1 (no parallelism)"
    return ok, detail


def _flag_value(flag: Any) -> Optional[bool]:
    """A direct path flag's truth, or None when it is not a boolean: a bool (NumPy's included) or a one-element
    array or tensor of a boolean dtype. Anything else -- a callable, a string, a container, a number -- would be
    read by its truthiness, which says nothing about the path."""
    if isinstance(flag, bool) or type(flag).__name__ == "bool_":
        return bool(flag)
    dtype = getattr(flag, "dtype", None)
    n = flag.numel() if hasattr(flag, "numel") else getattr(flag, "size", None)  # (torch: numel(); NumPy: size)
    if dtype is not None and str(dtype).rsplit(".", 1)[-1] == "bool" and n == 1:
        return bool(flag)
    return None


def assert_feature_active(*, component: str, feature: str, on: Any = None, off: Any = None, floor: float = 0.0,
                          calls: Optional[CallCounter] = None, min_calls: int = 1,
                          flag: Union[bool, Tuple[Any, str], None] = None, sharding: Any = None) -> ProbeResult:
    """Prove that ``feature`` was active in ``component``, in one or more of the method's preferred forms.

    Every form given must hold:

    * ``on``/``off``: the feature-on and feature-off outputs (DLPack tensors of one shape): a nonzero feature
      delta, ``n_unequal > 0`` and relative L2 ``> floor`` (``floor`` is a fraction, default 0; when the
      feature-off output has zero norm, ``||on - off||_2 > 0`` instead, and the detail says so).
    * ``calls``: a :class:`CallCounter` from :func:`count_calls`: ``calls.count >= min_calls`` (an integer
      ``>= 1``).
    * ``flag``: a path flag, ``True``/``False`` (a bool, or a one-element boolean array or tensor) or
      ``(obj, "attribute")`` read with ``getattr``; must be truthy. A method or other callable is refused in
      either form: it is always truthy (pass its result, ``flag=obj.is_compiled()``); so is a string.
    * ``sharding``: a DTensor (some placement is a shard, mesh larger than 1) or
      ``(local_tensor, global_shape, dim)``: the local tensor is a strict part of the global one along ``dim``
      and, when torch.distributed is initialized, the world size is above 1.

    Returns: :class:`ProbeResult` (also recorded in the pytest report).
    Raises: ``TypeError`` when no form (or half of ``on``/``off``) is given, or a flag cannot fail (a callable,
    a non-boolean value); ``ValueError`` for ``min_calls < 1`` or a ``floor`` that is negative or not finite
    (settings under which the form can never fail: hostile review of 2026-12-05); :class:`FeatureInactive`
    (an AssertionError naming component, feature and every form's evidence) when any form fails.
    """
    __tracebackhide__ = True
    if not isinstance(component, str) or not component or not isinstance(feature, str) or not feature:
        raise TypeError("assert_feature_active: component and feature must be non-empty strings")
    if (on is None) != (off is None):
        raise TypeError("assert_feature_active: give both on= (feature-on output) and off= (feature-off output)")
    if on is None and calls is None and flag is None and sharding is None:
        raise TypeError("assert_feature_active: give at least one form: on=/off=, calls=, flag= or sharding=")
    if isinstance(min_calls, bool) or not isinstance(min_calls, numbers.Integral) or min_calls < 1:
        raise ValueError(f"assert_feature_active({component!r}, {feature!r}): min_calls must be an integer >= 1, "
                         f"got {min_calls!r}" + (f" (a count of at least {min_calls} holds with no call at all)"
                                                 if isinstance(min_calls, numbers.Integral) else ""))
    if isinstance(floor, bool) or not isinstance(floor, numbers.Real) or not 0.0 <= float(floor) < math.inf:
        raise ValueError(f"assert_feature_active({component!r}, {feature!r}): floor must be a finite relative L2 "
                         f">= 0, got {floor!r}")
    forms: List[Tuple[str, bool, str]] = []
    stats = None
    if on is not None:
        from vgct_ext import compare

        stats = compare(on, off)
        if stats.zero_reference:
            ok = stats.n_unequal > 0 and stats.norm_diff > 0
            detail = (f"{stats.n_unequal} of {stats.n} elements differ; feature-off output has zero norm, "
                      f"||on - off||_2 = {stats.norm_diff:.4e} (> 0 required)")
        else:
            ok = stats.n_unequal > 0 and stats.rel_l2 is not None and stats.rel_l2 > floor
            detail = (f"{stats.n_unequal} of {stats.n} elements differ (> 0 required), relative L2 "
                      f"{stats.rel_l2:.4e} (> floor {floor:g} required)")
        if stats.n_unequal == 0:
            detail += ": feature-on output equals feature-off output bitwise, the feature was a no-op or not applied"
        detail += f"; on {stats.dtype_actual}, off {stats.dtype_expected}, shape {tuple(stats.shape)}, {stats.device}"
        forms.append(("feature delta", ok, detail))
    if calls is not None:
        if not isinstance(calls, CallCounter):
            raise TypeError("calls= takes the CallCounter yielded by count_calls(obj, name)")
        ok = calls.count >= min_calls
        forms.append(("call count", ok, f"{calls.name} called {calls.count} time(s) (>= {min_calls} required)"))
    if flag is not None:
        if isinstance(flag, tuple):
            if len(flag) != 2 or not isinstance(flag[1], str):
                raise TypeError(f"assert_feature_active({component!r}, {feature!r}): flag= takes True/False or "
                                f"(obj, \"attribute\"), got {flag!r}")
            obj, attr = flag
            if not hasattr(obj, attr):
                raise AttributeError(f"assert_feature_active({component!r}, {feature!r}): the path flag "
                                     f"{_describe(obj)}.{attr} does not exist (a misspelt flag would prove "
                                     f"nothing): name an attribute that the feature's path sets")
            value = getattr(obj, attr)
            if callable(value):
                raise TypeError(f"assert_feature_active({component!r}, {feature!r}): the path flag "
                                f"{_describe(obj)}.{attr} is a method or other callable, which is always truthy "
                                f"whatever it would return: pass its result (flag=obj.{attr}()) or name an "
                                f"attribute that holds the flag")
            if isinstance(value, (str, bytes, bytearray, list, tuple, dict, set, frozenset)) or (
                    getattr(value, "dtype", None) is not None and _flag_value(value) is None):
                raise TypeError(f"assert_feature_active({component!r}, {feature!r}): the path flag "
                                f"{_describe(obj)}.{attr} is {type(value).__name__} {value!r:.40}, whose truthiness "
                                f"says nothing (\"False\" and [False] are truthy): name an attribute holding a "
                                f"bool, a number or the object the path sets")
            forms.append(("path flag", bool(value), f"{_describe(obj)}.{attr} = {value!r} (truthy required)"))
        else:
            value = _flag_value(flag)
            if value is None:
                raise TypeError(f"assert_feature_active({component!r}, {feature!r}): flag= takes True/False (a "
                                f"bool, or a one-element boolean array or tensor) or (obj, \"attribute\"), got "
                                f"{type(flag).__name__} {flag!r:.60}" + (" -- a callable is always truthy: pass its "
                                                                        "result" if callable(flag) else ""))
            forms.append(("path flag", value, f"flag = {flag!r} (truthy required)"))
    if sharding is not None:
        ok, detail = _sharding_form(sharding)
        forms.append(("sharding state", ok, detail))
    result = ProbeResult(component, feature, tuple(forms), stats)
    _context.record({"kind": "probe", "component": component, "feature": feature,
                     "forms": [{"form": f, "passed": ok, "detail": d} for f, ok, d in forms],
                     "passed": result.passed})
    if not result.passed:
        lines = [f"feature-active probe failed: component {component!r}, feature {feature!r}: no evidence the "
                 f"feature ran"]
        lines += [f"  {'ok  ' if ok else 'FAIL'} {f}: {d}" for f, ok, d in forms]
        raise FeatureInactive("\n".join(lines), result)
    return result


# --------------------------------------------------------------------------------------------------------------
# Probes for the features this suite tests: diffusers attention backends, torch.compile


@contextlib.contextmanager
def attention_backend_calls(name: str) -> Iterator[CallCounter]:
    """Count the calls that reach diffusers' registered attention backend ``name`` inside the block.

    ``name``: an ``AttentionBackendName`` value (``"native"``, ``"_native_math"``, ``"flash"``, ...). diffusers
    (``diffusers.models.attention_dispatch``) dispatches every attention through
    ``_AttentionBackendRegistry._backends[name]``; for the duration of the block that entry is replaced by a
    forwarder that counts and calls the original, so a count ``> 0`` proves the backend ran (not a silent
    fallback to another one). The registry's argument filter (``_supported_arg_names``) is left alone, so
    the backend receives exactly the arguments it would have. Yields a :class:`CallCounter` named
    ``diffusers attention backend '<name>'``. The entry is restored on exit, also on error.

    Raises ``ImportError`` without diffusers, ``ValueError`` for a name diffusers does not know, ``LookupError``
    for a known backend that is not registered in this diffusers build.
    """
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    try:
        key = AttentionBackendName(name)
    except ValueError:
        known = ", ".join(repr(m.value) for m in AttentionBackendName)
        raise ValueError(f"attention_backend_calls: {name!r} is not a diffusers attention backend ({known})") \
            from None
    reg = _AttentionBackendRegistry._backends
    if key not in reg:
        raise LookupError(f"attention_backend_calls: diffusers has no registered function for backend {name!r}")
    original = reg[key]
    counter = CallCounter(f"diffusers attention backend {name!r}")

    @functools.wraps(original)
    def counted(*args: Any, **kwargs: Any) -> Any:
        counter.hit()
        return original(*args, **kwargs)

    reg[key] = counted
    try:
        yield counter
    finally:
        if reg.get(key) is counted:
            reg[key] = original


class CompileProbe:
    """A ``torch.compile`` backend that proves compiled code ran: ``torch.compile(m, backend=probe)``.

    It compiles each graph dynamo hands it with the wrapped backend (``backend``, default ``"inductor"``,
    any name ``torch._dynamo.list_backends()`` knows or a backend callable) and wraps the compiled callable, so
    ``probe.graphs`` counts graphs compiled and ``probe.calls`` (a :class:`CallCounter`) counts executions of
    compiled code. ``assert_feature_active(calls=probe.calls)`` then proves the compiled path ran; a graph
    break that sends everything back to eager leaves ``calls.count`` at 0. ``probe.graph_breaks`` is dynamo's
    graph-break count since the probe was made (``torch._dynamo.utils.counters``).
    """

    def __init__(self, backend: Any = "inductor"):
        self.backend = backend
        self.graphs = 0
        self.calls = CallCounter(f"torch.compile[{backend if isinstance(backend, str) else 'custom'}] graphs")
        self._breaks0 = self._break_count()

    @staticmethod
    def _break_count() -> int:
        try:
            from torch._dynamo.utils import counters
        except ImportError:
            return 0
        return int(sum(counters["graph_break"].values()))

    @property
    def graph_breaks(self) -> int:
        return self._break_count() - self._breaks0

    def __call__(self, gm: Any, example_inputs: Any) -> Any:
        import torch._dynamo

        inner = torch._dynamo.lookup_backend(self.backend) if isinstance(self.backend, str) else self.backend
        compiled = inner(gm, example_inputs)
        self.graphs += 1
        counter = self.calls

        def run(*args: Any, **kwargs: Any) -> Any:
            counter.hit()
            return compiled(*args, **kwargs)

        if getattr(compiled, "_boxed_call", False):
            run._boxed_call = True  # type: ignore[attr-defined]
        return run

    def __repr__(self) -> str:
        return f"CompileProbe(backend={self.backend!r}, graphs={self.graphs}, calls={self.calls.count})"


class ExpectedFailure:
    """What :func:`expect_gate_failure` caught: ``.error`` (the GateFailure), ``.failed`` (failed statistics),
    ``.calibrating`` (the block ended at a T2 gate or a tightened T1 gate under ``--vgct-calibrate``: nothing was
    checked)."""

    def __init__(self) -> None:
        self.error: Any = None
        self.failed: List[str] = []
        #: True when the block ended at a T2 or tightened T1 gate under ``--vgct-calibrate`` (nothing checked,
        #: nothing recorded)
        self.calibrating = False

    def __repr__(self) -> str:
        first = (str(self.error).splitlines() or [""])[0]
        err = None if self.error is None else f"{type(self.error).__name__}: {first}"
        return f"ExpectedFailure(failed={self.failed!r}, calibrating={self.calibrating!r}, error={err!r})"


#: The statistic names a gate can fail on (the ``Check`` names of vgct_ext.gates).
GATED_STATISTICS = ("rel_l2", "cosine", "mismatches", "max_abs_err", "p99", "channel_mean_shift",
                    "channel_rel_l2", "non_finite_pairs", "n")


def _statistic_names(names: Any, arg: str) -> Tuple[str, ...]:
    """``names`` as a tuple of known gated statistic names; a single string is one name (not its letters).
    Raises ``ValueError`` for an unknown name, listing the known ones."""
    if names is None:
        return ()
    out = (names,) if isinstance(names, str) else tuple(names)
    bad = [n for n in out if n not in GATED_STATISTICS]
    if bad:
        raise ValueError(f"expect_gate_failure: {arg}={names!r}: unknown statistic name(s) {bad}; a gate fails on "
                         f"{', '.join(GATED_STATISTICS)}")
    return out


def _measured(records: List[Dict[str, Any]]) -> str:
    """What the gates of a planted-fault block measured against their bars, one line a gate, and what to try
    (PLANTED_FAULT_FIX), for the "planted fault not caught" message (or that no gate ran in the block's thread)."""
    lines = []
    for r in records:
        label = f"{r.get('component')} / {r.get('feature')}" + (f" [{r['name']}]" if r.get("name") else "")
        rows = [f"{c.get('label') or c.get('statistic')} {c.get('value')!r} {c.get('op')} {c.get('bar')!r}"
                for c in r.get("checks", ()) if c.get("gating")]
        lines.append(f"  {r.get('gate') or r.get('kind')} gate {label}: " + "; ".join(rows))
    if not lines:
        return "\n  (no gate ran in this block's thread)"
    return ("\nwhat the block's gates measured (all within their bars):\n" + "\n".join(lines) + "\n" +
            PLANTED_FAULT_FIX)


#: What to try when a planted fault passes its gates (a new-user trial of 2026-12-06: the message said the fault
#: passed, not what to do about it). docs/method.md: the per-channel statistics and their detection limits.
PLANTED_FAULT_FIX = (
    "what to try: the bars are looser than this fault. For a T2 gate, check its calibration first (a bug on some "
    "seeds while calibrating becomes the bars: rerun those seeds against known-good code, read the calibration's "
    "warnings and the evidence diff); pass dim= (the channel axis) so that an error in one channel is gated per "
    "channel; gate where the fault is not diluted (the sublayer's output, its own case=); an exact feature belongs "
    "under a T1 gate (tighten= from a calibrated floor). Make the planted fault larger only if smaller ones of its "
    "kind do not matter.")


@gate_block
def expect_gate_failure(*, statistics: Optional[Sequence[str]] = None, any_of: Optional[Sequence[str]] = None,
                        component: Optional[str] = None) -> Iterator[ExpectedFailure]:
    """Assert that a planted fault fails its gate, and on which statistics.

    The block must raise :class:`vgct_ext.gates.GateFailure` (also inside :func:`vgct_ext.soft_gates`: gates
    raise in this block); its records are marked ``"expected_failure": True`` so the summary does not count
    them as failures. The block is the calling thread's: gates that other threads run meanwhile are not marked and
    raise or are collected by their own thread's blocks as usual (under ``--vgct-calibrate`` they record nothing
    while the block is open: see below). Plant and run the fault inside the block. Then:

    * ``statistics``: every one of these statistic names (``"rel_l2"``, ``"cosine"``, ``"mismatches"``,
      ``"max_abs_err"``, ``"p99"``, ``"channel_mean_shift"``, ``"channel_rel_l2"``, ``"non_finite_pairs"``) must be
      among the failed ones, and its message row must say FAIL;
    * ``any_of``: at least one of these must have failed;
    * ``component``: the message must name it.

    Yields an :class:`ExpectedFailure` filled in on exit. Raises :class:`PlantedFaultNotCaught` (an
    ``AssertionError``: pytest reports it as a test failure) when the block passes -- the gate let the planted
    fault through -- or fails on other statistics; other exceptions propagate, also one that ends a
    :func:`vgct_ext.soft_gates` block inside after a gate failed there (the soft block's GateFailure, chained
    from it, is its context). :class:`EvidenceMissing` does not count: a T2 gate without evidence proves
    nothing about the fault. Under ``pytest --vgct-calibrate`` a T2 gate or a tightened T1 gate
    (``tighten=k``) in the block records nothing and ends the block quietly (``.calibrating`` is True): such gates
    record instead of gating at their evidence there, so the fault is checked in the gating run, and a faulty run
    never becomes evidence -- nor does any gate's run anywhere in the process while the block is open (another
    thread's gate raises PlantedFaultWhileCalibrating); the test's gates outside the block still calibrate.
    """
    __tracebackhide__ = True
    from .gates import EvidenceMissing, GateFailure, PlantedFaultWhileCalibrating, _hard_gates

    want = _statistic_names(statistics, "statistics")
    anyof = _statistic_names(any_of, "any_of")
    caught = ExpectedFailure()
    try:
        with _hard_gates(expecting=True) as block:
            yield caught
    except EvidenceMissing:
        raise
    except PlantedFaultWhileCalibrating:
        caught.calibrating = True
        return
    except GateFailure as exc:
        own = exc.__cause__
        if own is not None and not isinstance(own, (GateFailure, EvidenceMissing)):
            # a soft block inside ended by its own exception after a gate failed: soft_gates chains its
            # failures from that exception; the exception is the block's (a harness error, a skip) and
            # propagates -- the gate failure stays attached as its context
            raise own
        caught.error = exc
        caught.failed = exc.failed_statistics
    else:
        raise PlantedFaultNotCaught(f"planted fault not caught: the gate passed (expected it to fail"
                                    f"{' on ' + ', '.join(want or anyof) if (want or anyof) else ''}); a gate "
                                    f"that lets a real bug pass is the worst defect" + _measured(block.records))
    msg = str(caught.error)
    missing = [s for s in want if s not in caught.failed]
    if missing:
        raise PlantedFaultNotCaught(f"planted fault caught, but not on {missing} (failed: {caught.failed}):\n"
                                    f"{msg}")
    if anyof and not any(s in caught.failed for s in anyof):
        raise PlantedFaultNotCaught(f"planted fault caught, but on none of {list(anyof)} "
                                    f"(failed: {caught.failed}):\n{msg}")
    labels = {c.statistic: c.label for c in caught.error.checks}
    for s in want:
        if not any(labels.get(s, s) in ln and "FAIL" in ln for ln in msg.splitlines()):
            raise PlantedFaultNotCaught(f"no FAIL row for {labels.get(s, s)!r} in the message:\n{msg}")
    if component is not None and f"'{component}'" not in msg:
        raise PlantedFaultNotCaught(f"the failure does not name component {component!r}:\n{msg}")


# --------------------------------------------------------------------------------------------------------------
# Weights fingerprints


def _state_dict(obj: Any) -> Mapping[str, Any]:
    if hasattr(obj, "state_dict") and callable(obj.state_dict):
        return obj.state_dict()
    if isinstance(obj, Mapping):
        return obj
    raise TypeError(f"expected a torch.nn.Module or a state dict (mapping name -> tensor), got {type(obj)!r}")


def weights_fingerprints(module_or_state_dict: Any) -> Dict[str, int]:
    """``{name: vgct_ext.fingerprint(tensor)}`` over a module's ``state_dict()`` (or a mapping); non-tensor
    entries are hashed by ``repr``."""
    from vgct_ext import fingerprint

    out: Dict[str, int] = {}
    for name, v in _state_dict(module_or_state_dict).items():
        if hasattr(v, "__dlpack__"):
            out[str(name)] = int(fingerprint(v))
        else:
            out[str(name)] = int.from_bytes(hashlib.blake2b(repr(v).encode(), digest_size=8).digest(), "little")
    return out


def weights_fingerprint(module_or_state_dict: Any) -> int:
    """A 64-bit fingerprint of all weights: names, dtypes, shapes and values in logical order.

    Combines :func:`vgct_ext.fingerprint` of every state-dict entry with its name, in sorted name order
    (BLAKE2b, 8 bytes, little-endian). Equal on CPU and GPU for the same weights; differs when any name, dtype,
    shape (a transposed layout) or value differs. Memory strides do not count.
    """
    h = hashlib.blake2b(digest_size=8)
    for name, fp in sorted(weights_fingerprints(module_or_state_dict).items()):
        h.update(name.encode("utf-8") + b"\0" + fp.to_bytes(8, "little"))
    return int.from_bytes(h.digest(), "little")


def assert_same_weights(a: Any, b: Any, *, component: str) -> int:
    """Prove both sides of an experiment loaded the same weights (names, dtypes, layouts, values).

    ``a``, ``b``: modules or state dicts. Returns the common :func:`weights_fingerprint`. Raises
    ``AssertionError`` naming the component, the missing/extra names and the first differing tensors.
    """
    __tracebackhide__ = True
    fa, fb = weights_fingerprints(a), weights_fingerprints(b)
    if fa == fb:
        return weights_fingerprint(a)
    only_a = sorted(set(fa) - set(fb))
    only_b = sorted(set(fb) - set(fa))
    diff = sorted(k for k in set(fa) & set(fb) if fa[k] != fb[k])
    sa, sb = _state_dict(a), _state_dict(b)

    def desc(sd: Mapping[str, Any], k: str) -> str:
        v = sd[k]
        return f"{getattr(v, 'dtype', type(v).__name__)} {tuple(getattr(v, 'shape', ()))}"

    lines = [f"weights differ for component {component!r}: {len(diff)} tensor(s) differ, {len(only_a)} only in "
             f"the first, {len(only_b)} only in the second"]
    lines += [f"  differs: {k}: {desc(sa, k)} vs {desc(sb, k)}" for k in diff[:10]]
    lines += [f"  only in first: {k}" for k in only_a[:10]]
    lines += [f"  only in second: {k}" for k in only_b[:10]]
    raise AssertionError("\n".join(lines))


# --------------------------------------------------------------------------------------------------------------
# Poison / count_unwritten

# dtype name -> (bit pattern, signed integer dtype name of the same width). Float patterns are NaNs with a payload
# no arithmetic produces (quiet NaN, payload 0xA5...), so a legitimately computed NaN is not counted as unwritten.
_PATTERNS = {
    "float64": (0x7FF8A5A5A5A5A5A5, "int64"),
    "float32": (0x7FC5A5A5, "int32"),
    "float16": (0x7E5A, "int16"),
    "bfloat16": (0x7FDA, "int16"),
    "float8_e4m3fn": (0x7F, "uint8"),
    "float8_e5m2": (0x7E, "uint8"),
    "int64": (-(2 ** 63), "int64"),
    "int32": (-(2 ** 31), "int32"),
    "int16": (-(2 ** 15), "int16"),
    "int8": (-(2 ** 7), "int8"),
    "uint8": (0xA5, "uint8"),
}


def _bits_view(t: Any) -> Tuple[Any, int, str]:
    """``(integer view of t's storage, sentinel pattern, framework)``; no copy."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(t, torch.Tensor):
        name = str(t.dtype).replace("torch.", "")
        if name not in _PATTERNS:
            raise TypeError(f"poison/count_unwritten: unsupported dtype {t.dtype}")
        pattern, iname = _PATTERNS[name]
        return t.view(getattr(torch, iname)), pattern, "torch"
    np = sys.modules.get("numpy")
    if np is not None and isinstance(t, np.ndarray):
        name = t.dtype.name
        if name not in _PATTERNS:
            raise TypeError(f"poison/count_unwritten: unsupported dtype {t.dtype}")
        pattern, iname = _PATTERNS[name]
        return t.view(getattr(np, iname)), pattern, "numpy"
    raise TypeError(f"poison/count_unwritten take a torch.Tensor or numpy.ndarray, got {type(t)!r}")


def poison(t: Any) -> Any:
    """Fill ``t`` in place with a sentinel bit pattern and return it (before a kernel writes its output).

    Floating dtypes get a quiet NaN with payload 0xA5.. (``float8_e4m3fn``: its NaN 0x7F), integer dtypes
    their minimum (``uint8``: 0xA5). Works on any strides and devices (torch) and on NumPy arrays.
    Raises ``TypeError`` for unsupported types/dtypes (bool, complex).
    """
    v, pattern, fw = _bits_view(t)
    if fw == "torch":
        v.fill_(pattern)
    else:
        v[...] = pattern
    return t


def count_unwritten(t: Any) -> int:
    """Number of elements of ``t`` still bitwise equal to the :func:`poison` sentinel (0: all written)."""
    v, pattern, fw = _bits_view(t)
    return int((v == pattern).sum().item()) if fw == "torch" else int((v == pattern).sum())


def assert_all_written(t: Any, *, component: str, feature: Optional[str] = None) -> None:
    """Raise ``AssertionError`` (count, fraction, first unwritten index, dtype, shape) unless every element of
    a :func:`poison`-ed output was overwritten."""
    __tracebackhide__ = True
    n = count_unwritten(t)
    if n == 0:
        return
    v, pattern, fw = _bits_view(t)
    mask = v == pattern
    first = tuple(int(i) for i in (mask.nonzero()[0].tolist() if fw == "torch" else
                                   sys.modules["numpy"].argwhere(mask)[0]))
    total = int(math.prod(tuple(t.shape)))
    feat = f", feature {feature!r}" if feature else ""
    raise AssertionError(f"unwritten output: component {component!r}{feat}: {n} of {total} elements "
                         f"({n / max(total, 1):.3%}) still hold the poison sentinel; first at index {first}; "
                         f"dtype {t.dtype}, shape {tuple(t.shape)}, device {getattr(t, 'device', 'cpu')}")
