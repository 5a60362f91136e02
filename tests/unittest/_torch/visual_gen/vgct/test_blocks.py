"""vgct_ext/method/_blocks.py: gate_block runs contextlib.contextmanager's protocol (in frames pytest hides).
The oracle is contextlib itself: every generator shape against every way a block can end gives the same
outcome -- the value bound by ``as``, suppression, the exception's type, message and identity, and the
generator's state afterwards."""

from __future__ import annotations

import contextlib
import itertools

import pytest

from vgct_ext.method._blocks import gate_block


class Planted(Exception):
    pass


def _gens():
    """Generator functions of every shape a context manager can have (name -> function of a log list)."""
    def plain(log):
        log.append("enter")
        yield "v"
        log.append("exit")

    def suppress(log):
        try:
            yield "v"
        except Exception as exc:
            log.append(f"caught {type(exc).__name__}")

    def reraise(log):
        try:
            yield "v"
        except BaseException:
            log.append("reraise")
            raise

    def replace(log):
        try:
            yield "v"
        except Exception as exc:
            raise Planted("replaced") from exc

    def raise_on_exit(log):
        yield "v"
        raise Planted("on exit")

    def finally_(log):
        try:
            yield "v"
        finally:
            log.append("finally")

    def no_yield(log):
        if False:
            yield
        log.append("no yield")

    def yields_twice(log):
        yield "v"
        yield "w"

    def stop_inside(log):
        yield "v"
        raise StopIteration("inner")  # PEP 479: a RuntimeError

    def keeps_yielding_after_throw(log):
        try:
            yield "v"
        except Exception:
            yield "again"

    return {f.__name__: f for f in (plain, suppress, reraise, replace, raise_on_exit, finally_, no_yield,
                                    yields_twice, stop_inside, keeps_yielding_after_throw)}


def _raises(exc_type, *args):
    def body():
        raise exc_type(*args)
    return body


BODIES = {
    "ok": lambda: None,
    "value_error": _raises(ValueError, "body"),
    "stop_iteration": _raises(StopIteration, "body"),
    "runtime_error": _raises(RuntimeError, "body"),
    "keyboard_interrupt": _raises(KeyboardInterrupt),
    "generator_exit": _raises(GeneratorExit),
}


def _run(factory, gen_fn, body):
    """What happens when ``body`` runs in ``with factory(gen_fn)(log) as v``: a comparable record."""
    log = []
    raised_in_body = []

    def wrapped_body():
        try:
            body()
        except BaseException as exc:
            raised_in_body.append(exc)
            raise

    cm = factory(gen_fn)(log)
    try:
        with cm as v:
            log.append(f"as {v!r}")
            wrapped_body()
    except BaseException as exc:
        same = bool(raised_in_body) and exc is raised_in_body[0]
        cause = type(exc.__cause__).__name__ if exc.__cause__ is not None else None
        return ("raised", type(exc).__name__, str(exc), same, cause, log)
    return ("completed", log)


@pytest.mark.parametrize("gen_name,body_name", list(itertools.product(_gens(), BODIES)))
def test_gate_block_equals_contextlib(gen_name, body_name):
    gen_fn, body = _gens()[gen_name], BODIES[body_name]
    assert _run(gate_block, gen_fn, body) == _run(contextlib.contextmanager, gen_fn, body)


def test_gate_block_as_a_decorator_recreates_the_block_per_call():
    calls = []

    @gate_block
    def block():
        calls.append("enter")
        yield
        calls.append("exit")

    @block()
    def f(x):
        calls.append(x)
        return x * 2

    assert f(1) == 2 and f(3) == 6
    assert calls == ["enter", 1, "exit", "enter", 3, "exit"]


def test_gate_block_object_is_used_once_as_contextlibs():
    def gen():
        yield

    def second_use(factory):
        cm = factory(gen)()
        with cm:
            pass
        try:
            with cm:
                pass
        except BaseException as exc:  # contextlib: the object's arguments are gone after the first use
            return type(exc)
        return None

    assert second_use(gate_block) is second_use(contextlib.contextmanager) is not None
