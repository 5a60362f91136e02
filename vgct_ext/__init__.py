"""vgct_ext: exact paired statistics between an ``actual`` and an ``expected`` tensor.

The metric engine behind component-level numerical parity tests for diffusion models: a C
extension (CPU, pthreads) and CUDA kernels compute relative L2, cosine, max abs error, exact
quantiles of ``|a-e|``, per-slice mean shift, mismatch and non-finite counts over tensors
received zero-copy through DLPack (PyTorch, NumPy, CuPy, JAX), any dtype, any strides.

``import vgct_ext`` does not import torch.

Public API: :func:`compare` -> :class:`PairedStats` (with :class:`SliceStats`),
:func:`fingerprint`, :func:`build_info`, :func:`compare_sharded` -- the engine's face, in :mod:`vgct_ext.core`.
The method layer (gates, evidence, probes, experiment helpers, skips, the pytest plugin) lives in
:mod:`vgct_ext.method`; its public names are also reachable as ``vgct_ext.<name>`` (loaded on first use), its
modules under the stable paths ``vgct_ext.gates``, ``vgct_ext.probes``, ... (docs/architecture.md).
"""

from .core._api import build_info, compare, fingerprint
from .core._stats import PairedStats, SliceStats

__version__ = "0.1.0"

# Method-layer modules whose __all__ names are forwarded lazily (PEP 562), so that a plain
# `import vgct_ext` stays light and never imports torch.
# (module paths relative to this package; their files are <path with / for .>.py)
_LAZY_MODULES = ("method.gates", "method.probes", "method.experiment", "method.skips", "core.sharded")

__all__ = ["compare", "PairedStats", "SliceStats", "fingerprint", "build_info", "__version__"]


def _lazy_all() -> list:
    """Every lazily forwarded name: the ``__all__`` of each method-layer module, read from its source
    (``ast``, no import), so that ``__all__`` and ``dir(vgct_ext)`` list them without importing torch."""
    import ast
    import os

    names: list = []
    here = os.path.dirname(os.path.abspath(__file__))
    for mod in _LAZY_MODULES:
        try:
            with open(os.path.join(here, *mod.split(".")) + ".py", encoding="utf-8") as f:
                tree = ast.parse(f.read())
        except OSError:
            continue
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
                try:
                    names += [str(x) for x in ast.literal_eval(node.value)]
                except ValueError:
                    pass
    return list(dict.fromkeys(names))


__all__ += [n for n in _lazy_all() if n not in __all__]


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))


def __getattr__(name: str):
    # dunders (__path__, __wrapped__, __file__ probes by copy/inspect/pickle/doctest) are never
    # method-layer names: answer at once, without importing the method layer
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    for mod in _LAZY_MODULES:
        try:
            m = importlib.import_module(f"{__name__}.{mod}")
        except ModuleNotFoundError as exc:
            if exc.name == f"{__name__}.{mod}":
                continue
            raise
        if name in getattr(m, "__all__", ()):
            return getattr(m, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
