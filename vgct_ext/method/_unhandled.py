"""Gate failures that nothing raises in a test: the pytest plugin's hooks that catch them.

A gate that fails raises (:class:`vgct_ext.GateFailure`); the test fails only if that exception reaches it.
These holders keep it from the test without any error of their own, where pytest at most warns:

* a thread that does not handle it (``threading.excepthook``: pytest warns);
* a :class:`concurrent.futures.Future` that stores it (``set_exception``: an executor's work item) and is
  destroyed with neither ``result()`` (``Executor.map``'s iterator calls it) nor ``exception()`` called --
  nobody can read it any more (the rule asyncio applies to its own futures) -- or is still unread at the
  session's end; a future's done-callback that raises it (``concurrent.futures`` only logs that);
* an asyncio event loop's exception handler (``call_exception_handler``, unless the code set its own with
  ``loop.set_exception_handler``), which asyncio hands what no code can receive any more: a task or future
  whose exception was never retrieved (when it is destroyed), a callback's exception (asyncio logs it);
* ``asyncio.gather(..., return_exceptions=True)``, which retrieves its children's exceptions (asyncio never
  reports them then) and returns them as values (also a child's caught gate failure it returns): they count
  as read only once one of that gather's gate failures is raised again (``pytest.raises``,
  ``expect_gate_failure`` around ``raise``; a "raise the first failure" helper reads them all) by the time
  the plugin looks -- one only looked at (``isinstance``) cannot be told from one ignored, nor one raised
  only inside an ExceptionGroup or as another exception's ``__cause__`` (the test fails: raise a member).

:func:`install` wraps them (once per process; nested in-process sessions only count, and each takes only what
was caught while it was the innermost), :func:`uninstall` restores them, and :func:`take` returns, as report
lines, what was caught since the last look and forgets it.  The plugin calls :func:`take` at the end of each
test's call (the test fails), of each teardown and of the session (the session fails).  Only the method's
verdicts count (:class:`vgct_ext.GateFailure`, :class:`vgct_ext.EvidenceMissing`,
:class:`vgct_ext.FeatureInactive`, :class:`vgct_ext.PlantedFaultNotCaught`; "a gate failure" in the lines),
also wrapped: a cause, a context, an exception group's member.  Not seen: a gate still running when the
session ends (an executor shut down without waiting: it fails at interpreter exit, unreported),
``_thread.start_new_thread`` (its failures go to ``sys.unraisablehook``), ``multiprocessing`` pools'
results, event loops not derived from asyncio's ``BaseEventLoop`` (uvloop), a future or task still
referenced at the session's end by what outlives it (a module global: asyncio reports it at interpreter
exit), a gathered gate failure raised again only by a later test (it counts as lost at the end of the test
or teardown during which gather returned it), and the other children of an ``asyncio.gather`` without ``return_exceptions`` (gather marks their
exceptions retrieved)."""

from __future__ import annotations

import builtins
import collections
import functools
import gc
import importlib
import itertools
import sys
import threading
import weakref
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from . import _context

_LOCK = threading.Lock()
_CAUGHT: List[Tuple[int, str]] = []  # (depth, line): threads', loops', done-callbacks' (under _LOCK)
_FUTURES: Dict[int, Tuple[Any, str, int]] = {}  # key -> (weakref to a future holding one, line, depth), unread
_RETURNED: List[Tuple[int, int, BaseException, Any, str]] = []  # (depth, the gather's key, exception, its traceback,
#                                                                 line): returned as
#                                                            values by asyncio.gather, not yet looked at (take)
_DEAD: Deque[int] = collections.deque()  # keys of such futures destroyed (appended by their weakref callbacks,
#                                          which the garbage collector may run while _LOCK is held: no lock)
_KEYS = itertools.count(1)
_PATCHED: Dict[str, Tuple[Any, str, Any]] = {}  # "Owner.attr" -> (owner, attribute, the original)
_DEPTH = 0  # install() calls not yet undone (in-process pytester sessions nest)
_COLLECTED = 0  # the newest future key a garbage collection has run for (take)
_GROUP = getattr(builtins, "BaseExceptionGroup", ())  # (Python 3.11+; isinstance(x, ()) is False)


def gate_error_in(exc: Any) -> Optional[BaseException]:
    """The first of the method's verdicts in an exception, its causes and contexts, and an exception group's
    members (wrapped by a harness, or raised in a TaskGroup), or None (also when neither gates nor probes were
    ever imported: then none can have failed).  The verdicts: a gate's failure (GateFailure, EvidenceMissing),
    a feature-active probe's (FeatureInactive), a planted-fault check's (PlantedFaultNotCaught).  Follows only
    exception objects, and never raises."""
    gates, probes = sys.modules.get(__package__ + ".gates"), sys.modules.get(__package__ + ".probes")
    if gates is None and probes is None:
        return None
    kinds = tuple(k for k in (getattr(gates, "_GateError", None), getattr(probes, "FeatureInactive", None),
                              getattr(probes, "PlantedFaultNotCaught", None)) if k is not None)
    try:
        return next((e for e in exceptions_in(exc) if isinstance(e, kinds)), None)
    except Exception:  # (a hostile exception: a hook must never fail the code it watches)
        return None


def exceptions_in(exc: Any) -> List[BaseException]:
    """``exc`` and every exception it carries, breadth first: its cause and context, an exception group's
    members, a soft block's collected ``failures``.  Follows only exception objects, and never raises (an
    attribute that fails to read is not followed)."""
    out: List[BaseException] = []
    todo, seen = collections.deque([exc]), set()
    while todo:
        e = todo.popleft()
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        out.append(e)
        for attr in ("__cause__", "__context__", "exceptions", "failures"):
            try:
                more = () if attr == "exceptions" and not isinstance(e, _GROUP) else getattr(e, attr, ())
                todo.extend(more if isinstance(more, (list, tuple)) else [more])
            except Exception:  # (a hostile exception: a hook must never fail the code it watches)
                pass
    return out


def _first_line(e: BaseException) -> str:
    try:
        return (str(e).splitlines() or [type(e).__name__])[0]
    except Exception:
        return type(e).__name__


def _catch(line: str) -> None:
    with _LOCK:
        _CAUGHT.append((_DEPTH, line))


# -- threads --------------------------------------------------------------------------------------------------

def _thread_hook(args: Any, /, *, prev: Any) -> None:
    try:
        found = gate_error_in(args.exc_value)
        if found is not None:
            name = "<unknown>" if args.thread is None else args.thread.name
            _catch(f"a gate failure raised in thread {name!r} and not handled there: {_first_line(found)}")
    finally:
        prev(args)


def install_thread_hook() -> Callable[[], None]:
    """Wrap ``threading.excepthook`` (call it after every plugin's pytest_configure: pytest's own hook, set
    there, does not call the one it replaces, so one installed before it would never run).  Returns the undo."""
    prev = threading.excepthook
    threading.excepthook = mine = functools.partial(_thread_hook, prev=prev)

    def undo() -> None:
        if threading.excepthook is mine:  # (before pytest's own cleanup restores the hook it replaced)
            threading.excepthook = prev
    return undo


# -- concurrent.futures -----------------------------------------------------------------------------------------

def _setter(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def set_exception(self: Any, exception: Any) -> None:
        found = gate_error_in(exception)
        if found is None or self.done():  # (done: orig raises InvalidStateError; the first exception stays)
            return orig(self, exception)
        # registered before the future is done: a reader woken by set_exception must find it to mark it read
        key = next(_KEYS)
        try:  # (nothing here may keep the future from completing: its reader would wait for ever)
            test = _context.current_test()  # (named: found unread only in another test, or after all)
            line = (f"a gate failure stored in a concurrent.futures Future that nobody read (neither its result() "
                    f"nor its exception() was called): {_first_line(found)}" +
                    ("" if test is None else f" (stored during {test.nodeid})"))
        except Exception as e:
            line = (f"a gate failure stored in a concurrent.futures Future that nobody read: {_first_line(found)} "
                    f"(the plugin's hook could not name the test: {type(e).__name__})")
        with _LOCK:  # (a list: two threads may race to set it; the one whose exception is stored stays)
            self._vgct_keys = getattr(self, "_vgct_keys", []) + [key]
            _FUTURES[key] = (weakref.ref(self, lambda _, k=key: _DEAD.append(k)), line, _DEPTH)
        try:
            return orig(self, exception)
        except BaseException:  # (another thread set it first: that exception, not this one, is stored)
            with _LOCK:
                _FUTURES.pop(key, None)
                self._vgct_keys = [k for k in self._vgct_keys if k != key]
            raise
    return set_exception


def _mark_read(fut: Any) -> None:
    with _LOCK:
        for key in getattr(fut, "_vgct_keys", ()):
            _FUTURES.pop(key, None)


def _reader(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def read(self: Any, timeout: Optional[float] = None) -> Any:
        try:
            out = orig(self, timeout)
        except BaseException as e:  # read only when the stored exception is what came out (not a timeout)
            if e is getattr(self, "_exception", None):
                _mark_read(self)
            raise
        _mark_read(self)
        return out
    return read


def _callbacks(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def add_done_callback(self: Any, fn: Callable[[Any], Any]) -> Any:
        @functools.wraps(fn)
        def guarded(fut: Any) -> Any:
            try:
                return fn(fut)
            except BaseException as e:  # (concurrent.futures only logs it)
                found = gate_error_in(e)
                if found is not None:
                    _catch(f"a gate failure raised in a concurrent.futures Future's done-callback "
                           f"{getattr(fn, '__qualname__', fn)!r}: {_first_line(found)}")
                raise
        return orig(self, guarded)
    return add_done_callback


# -- asyncio -----------------------------------------------------------------------------------------------------

def _handler(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def call_exception_handler(self: Any, context: Dict[str, Any]) -> Any:
        # (a handler the code set itself takes the exception: it is then that code's to report)
        if isinstance(context, dict) and getattr(self, "_exception_handler", None) is None:
            found = gate_error_in(context.get("exception"))
            if found is not None:
                _catch(f"a gate failure handed to an asyncio event loop's exception handler "
                       f"({str(context.get('message') or 'unhandled')[:80]}): {_first_line(found)}")
        return orig(self, context)
    return call_exception_handler


def _gathered(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def set_result(self: Any, result: Any) -> Any:
        # (gather marked each child's exception retrieved; with return_exceptions they are values of the list)
        key = next(_KEYS)  # (one for the whole result: raising one of its failures again reads them all)
        for value in result if isinstance(result, list) else ():
            found = gate_error_in(value)
            if found is not None:
                line = (f"a gate failure returned as a value by asyncio.gather (return_exceptions=True) and never "
                        f"raised again (raise it, or another of that gather's, under pytest.raises or "
                        f"expect_gate_failure; an ExceptionGroup of them or `raise ... from` it does not count): "
                        f"{_first_line(found)}")
                with _LOCK:
                    _RETURNED.append((_DEPTH, key, value, value.__traceback__, line))
        return orig(self, result)
    return set_result


def _patch(owner: Any, attr: str, wrap: Callable[[Any], Any]) -> None:
    orig = getattr(owner, attr)
    _PATCHED[f"{owner.__qualname__}.{attr}"] = (owner, attr, orig)
    setattr(owner, attr, wrap(orig))


def install_loop_hook() -> None:
    """Wrap asyncio's ``BaseEventLoop.call_exception_handler`` and the result of ``asyncio.gather``'s future if
    the hooks are installed and not yet those (asyncio re-imported: pytester restores ``sys.modules`` after an
    in-process run)."""
    if _DEPTH and "BaseEventLoop.call_exception_handler" not in _PATCHED:
        base_events = sys.modules.get("asyncio.base_events")
        if base_events is not None:
            _patch(base_events.BaseEventLoop, "call_exception_handler", _handler)
    if _DEPTH and "_GatheringFuture.set_result" not in _PATCHED:
        tasks = sys.modules.get("asyncio.tasks")
        if tasks is not None and hasattr(tasks, "_GatheringFuture"):
            _patch(tasks._GatheringFuture, "set_result", _gathered)


def install() -> None:
    """Wrap ``concurrent.futures.Future`` (set_exception, result, exception, add_done_callback), the asyncio
    event loops' exception handler and ``asyncio.gather``'s result (asyncio imported here: a test that imports
    it in its body would otherwise find it unwrapped).  Nested calls only count (one set of wrappers a process)."""
    global _DEPTH
    _DEPTH += 1
    if _DEPTH == 1:
        import concurrent.futures as cf

        importlib.import_module("asyncio.base_events")  # (for install_loop_hook)
        importlib.import_module("asyncio.tasks")

        _patch(cf.Future, "set_exception", _setter)
        _patch(cf.Future, "result", _reader)
        _patch(cf.Future, "exception", _reader)
        _patch(cf.Future, "add_done_callback", _callbacks)
    install_loop_hook()


def uninstall() -> None:
    """Undo :func:`install`: what the innermost session caught and did not take passes to the one around it;
    the last call restores the originals and forgets everything."""
    global _DEPTH
    if _DEPTH == 0:
        return
    with _LOCK:
        _DEPTH -= 1
        _CAUGHT[:] = [(min(d, _DEPTH), line) for d, line in _CAUGHT] if _DEPTH else []
        _RETURNED[:] = [(min(d, _DEPTH), *rest) for d, *rest in _RETURNED] if _DEPTH else []
        for key, (ref, line, d) in list(_FUTURES.items()):
            if _DEPTH:
                _FUTURES[key] = (ref, line, min(d, _DEPTH))
            else:
                del _FUTURES[key]
        if not _DEPTH:
            _DEAD.clear()
    if _DEPTH == 0:
        for owner, attr, orig in _PATCHED.values():
            setattr(owner, attr, orig)
        _PATCHED.clear()


def take(session_end: bool = False) -> List[str]:
    """What the hooks caught since the last look while the current session was the innermost, as lines, then
    forgotten: threads', event loops' and done-callbacks' gate failures, those asyncio.gather returned as values
    and nobody raised again since, and the futures holding one that were destroyed unread (first a garbage collection when such a future is newly alive: one in a reference
    cycle).  ``session_end`` (the plugin's last look): first a garbage collection (an asyncio task in a
    reference cycle is destroyed there), and every future still holding an unread gate failure counts too."""
    global _COLLECTED
    with _LOCK:  # (a future held only by a reference cycle -- its exception's traceback holds a frame that
        #          holds the future -- is destroyed by a collection: one for each such future newly pending,
        #          not one a test while a fixture keeps it for a later test to read)
        newest = max((k for k, (ref, _, d) in _FUTURES.items() if d == _DEPTH and ref() is not None), default=0)
    if _DEPTH and (session_end or newest > _COLLECTED):
        _COLLECTED = max(_COLLECTED, newest)
        gc.collect()
    with _LOCK:
        out = [line for d, line in _CAUGHT if d == _DEPTH]
        _CAUGHT[:] = [(d, line) for d, line in _CAUGHT if d != _DEPTH]
        # read: one of the same gather's raised again since it returned them (pytest.raises, expect_gate_failure),
        # which gives it a new traceback; a value only looked at (isinstance) cannot be told from one ignored
        read = {k for d, k, exc, tb, _ in _RETURNED if d == _DEPTH and exc.__traceback__ is not tb}
        out.extend(line for d, k, exc, tb, line in _RETURNED if d == _DEPTH and k not in read)
        _RETURNED[:] = [x for x in _RETURNED if x[0] != _DEPTH]
        dead = set()
        while _DEAD:
            dead.add(_DEAD.popleft())
        for key in sorted(_FUTURES):
            ref, line, d = _FUTURES[key]
            if d != _DEPTH or not (key in dead or session_end):
                continue
            del _FUTURES[key]
            out.append(line if key in dead or ref() is None
                       else line + " (the future is still referenced, unread, at the session's end)")
        _DEAD.extend(k for k in dead if k in _FUTURES)  # (an outer session's, destroyed meanwhile)
    return out
