"""gate_block: :func:`contextlib.contextmanager` for the blocks that raise a failure when they end. Private.

:func:`~vgct_ext.method.gates.soft_gates` raises the gate failures it collected, and
:func:`~vgct_ext.method.probes.expect_gate_failure` raises ``AssertionError`` when the planted fault passed,
both on leaving the ``with`` block. With contextlib's own class the failure's traceback runs through
``contextlib.py`` (its ``__exit__`` resumes the generator), so pytest's one-line location of a failure --
``--tb=line``, and the crash line that ``--tb=short`` and ``-rf`` print -- named ``contextlib.py:144``
instead of the test's ``with`` statement (a new user's trial, 2026-12). pytest leaves out of that location
every frame whose locals hold ``__tracebackhide__ = True``, which a generator can set for its own frame
but not for contextlib's.

:class:`_GateBlock` runs contextlib's protocol (CPython's ``_GeneratorContextManager.__enter__`` and
``__exit__``, the same rules for ``StopIteration`` and ``RuntimeError``) in frames so marked: an exception
that passes through the block keeps its traceback unchanged, one raised by the generator on leaving is
reported at the caller's line. Used as a decorator (``@soft_gates()``) it recreates itself per call, as
contextlib's does (:class:`contextlib.ContextDecorator`).
"""

from __future__ import annotations

import functools
from contextlib import ContextDecorator
from typing import Any, Callable, ContextManager, Iterator, Optional, TypeVar, cast

__all__ = ["gate_block"]

T = TypeVar("T")


class _GateBlock(ContextDecorator):
    """One use of a :func:`gate_block` generator function (see the module docstring)."""

    def __init__(self, func: Callable[..., Iterator[Any]], args: tuple, kwds: dict) -> None:
        self.gen = func(*args, **kwds)
        self.func, self.args, self.kwds = func, args, kwds
        self.__doc__ = getattr(func, "__doc__", None)

    def _recreate_cm(self) -> "_GateBlock":
        return self.__class__(self.func, self.args, self.kwds)

    def __enter__(self) -> Any:
        __tracebackhide__ = True
        del self.args, self.kwds, self.func  # (as contextlib: a decorator use recreates the block first)
        try:
            return next(self.gen)
        except StopIteration:
            raise RuntimeError("generator didn't yield") from None

    def __exit__(self, typ: Optional[type], value: Optional[BaseException], tb: Any) -> bool:
        __tracebackhide__ = True
        if typ is None:
            try:
                next(self.gen)
            except StopIteration:
                return False
            try:
                raise RuntimeError("generator didn't stop")
            finally:
                self.gen.close()
        if value is None:
            value = typ()  # an instance, so that the same exception is recognised when it comes back
        try:
            self.gen.throw(value)
        except StopIteration as exc:
            return exc is not value  # (a StopIteration raised in the block is not swallowed)
        except RuntimeError as exc:
            if exc is value:
                exc.__traceback__ = tb
                return False
            if isinstance(value, StopIteration) and exc.__cause__ is value:  # PEP 479's wrapping
                value.__traceback__ = tb
                return False
            raise
        except BaseException as exc:
            if exc is not value:
                raise  # the generator's own exception: the failure the block reports
            exc.__traceback__ = tb
            return False
        try:
            raise RuntimeError("generator didn't stop after throw()")
        finally:
            self.gen.close()


def gate_block(func: Callable[..., Iterator[T]]) -> Callable[..., ContextManager[T]]:
    """Decorator: like :func:`contextlib.contextmanager`, with pytest locating a failure raised when the block
    ends at the caller's ``with`` line (module docstring)."""

    @functools.wraps(func)
    def helper(*args: Any, **kwds: Any) -> ContextManager[T]:
        return cast(ContextManager[T], _GateBlock(func, args, kwds))

    return helper
