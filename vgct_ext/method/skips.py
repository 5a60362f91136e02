"""Skip policy: skip only when a required GPU capability, checkpoint or trusted reference is absent.

Source: the method, "Skip only when a required GPU capability, checkpoint, or trusted reference is absent. A
missing reference must not turn a parity test into a smoke test" and "Set LLM_MODELS_ROOT for tests that load
model weights".

Each ``requires_*`` returns a pytest mark (usable as a decorator, on a class, in ``pytestmark`` or in
``pytest.param(..., marks=...)``): ``pytest.mark.vgct_requires(kind, ...)``. The plugin evaluates it before
the test's fixtures run: a missing requirement skips with the reason; in strict mode (``--vgct-strict`` or
``VGCT_STRICT=1``) a missing checkpoint or reference fails instead (hardware still skips). GPU requirements
also add the ``gpu`` marker, so ``-m gpu`` / ``-m "not gpu"`` select them.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any, Optional, Tuple, Union

from ._context import strict_mode

__all__ = [
    "requires_gpu",
    "requires_gpus",
    "requires_checkpoint",
    "requires_reference",
    "checkpoint_path",
    "strict_mode",
]

MARK = "vgct_requires"


def _mark(kind: str, **kwargs: Any) -> Any:
    import pytest

    return getattr(pytest.mark, MARK)(kind, **kwargs)


def _parse_sm(min_sm: Union[int, str, Tuple[int, int], None]) -> Optional[Tuple[int, int]]:
    if min_sm is None:
        return None
    if isinstance(min_sm, tuple):
        return int(min_sm[0]), int(min_sm[1])
    s = str(min_sm).lower().removeprefix("sm_").removeprefix("sm")
    if not s.isdigit() or len(s) < 2:
        raise ValueError(f"min_sm must look like 90, 'sm_90' or (9, 0), got {min_sm!r}")
    return int(s[:-1]), int(s[-1])


def requires_gpu(min_sm: Union[int, str, Tuple[int, int], None] = None) -> Any:
    """A CUDA GPU (``torch.cuda``) whose architecture is at least ``min_sm`` (``90``, ``"sm_90"`` or ``(9, 0)``)
    on every visible device. Always skips when absent, also in strict mode."""
    sm = _parse_sm(min_sm)
    return _mark("gpu", min_sm=sm)


def requires_gpus(n: int, min_sm: Union[int, str, Tuple[int, int], None] = None) -> Any:
    """At least ``n`` CUDA GPUs (optionally of architecture >= ``min_sm``). Always skips when absent."""
    if int(n) < 1:
        raise ValueError("requires_gpus(n) needs n >= 1")
    return _mark("gpus", n=int(n), min_sm=_parse_sm(min_sm))


def requires_checkpoint(name: str) -> Any:
    """A checkpoint directory or file ``$LLM_MODELS_ROOT/<name>``. Skips when absent; fails in strict mode."""
    return _mark("checkpoint", name=str(name))


def requires_reference(module_name: str) -> Any:
    """A trusted reference implementation importable as ``module_name`` (e.g. ``"diffusers"``). Skips when
    absent; fails in strict mode."""
    return _mark("reference", name=str(module_name))


def _gpu_reason(n: int, min_sm: Optional[Tuple[int, int]]) -> Optional[str]:
    try:
        import torch
    except ImportError:
        return "torch is not installed (needs a CUDA GPU)"
    if not torch.cuda.is_available():
        return f"needs {n} CUDA GPU(s); torch.cuda.is_available() is False"
    count = torch.cuda.device_count()
    if count < n:
        return f"needs {n} CUDA GPU(s); {count} visible"
    if min_sm is not None:
        for i in range(n):
            cap = torch.cuda.get_device_capability(i)
            if tuple(cap) < min_sm:
                return (f"needs sm_{min_sm[0]}{min_sm[1]} or newer; cuda:{i} is sm_{cap[0]}{cap[1]} "
                        f"({torch.cuda.get_device_name(i)})")
    return None


def _models_root() -> Optional[Path]:
    root = os.environ.get("LLM_MODELS_ROOT")
    return Path(root) if root else None


def evaluate(kind: str, **kw: Any) -> Tuple[Optional[str], bool]:
    """``(reason, hard)``: ``reason`` is None when the requirement holds; ``hard`` is True when it must fail
    rather than skip (a missing checkpoint or reference in strict mode)."""
    if kind == "gpu":
        return _gpu_reason(1, kw.get("min_sm")), False
    if kind == "gpus":
        return _gpu_reason(kw["n"], kw.get("min_sm")), False
    if kind == "checkpoint":
        root = _models_root()
        if root is None:
            reason = f"checkpoint {kw['name']!r}: LLM_MODELS_ROOT is not set"
        elif not (root / kw["name"]).exists():
            reason = f"checkpoint {kw['name']!r} not found under LLM_MODELS_ROOT={root}"
        else:
            return None, False
        return reason, strict_mode()
    if kind == "reference":
        name = kw["name"]
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if found:
            return None, False
        return f"trusted reference {name!r} is not importable", strict_mode()
    raise ValueError(f"unknown vgct requirement {kind!r}")


def _skip_or_fail(reason: str, hard: bool) -> None:
    __tracebackhide__ = True
    import pytest

    if hard:
        pytest.fail(f"vgct strict mode: {reason} (a missing reference must not turn a parity test into a smoke "
                    f"test)", pytrace=False)
    pytest.skip(reason)


def checkpoint_path(name: str) -> Path:
    """``$LLM_MODELS_ROOT/<name>`` if it exists; otherwise skip the calling test (fail in strict mode)."""
    __tracebackhide__ = True
    reason, hard = evaluate("checkpoint", name=name)
    if reason is not None:
        _skip_or_fail(reason, hard)
    root = _models_root()
    assert root is not None
    return root / name


def unmet_requirement(item: Any) -> Optional[Tuple[str, bool]]:
    """The first unmet ``vgct_requires`` mark of a pytest item (hardware first) as ``(reason, hard)``, or None."""
    marks = list(item.iter_markers(name=MARK))
    marks.sort(key=lambda m: 0 if m.args[0] in ("gpu", "gpus") else 1)
    for m in marks:
        reason, hard = evaluate(m.args[0], **m.kwargs)
        if reason is not None:
            return reason, hard
    return None
