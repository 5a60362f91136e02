"""Paired-experiment helpers: make both sides the same experiment except for the feature.

Source: the method, "Define the paired experiment" and "Make both sides the same experiment": intercept a
component's input and output tensors inside a full pipeline instead of comparing pixels end to end
(:func:`capture`); inject identical noise and latents into both sides -- matching seeds is not enough
(:func:`make_noise`, :func:`guard_inputs`); pass references made in a subprocess through files created for
that run, with what produced them (:func:`save_reference`, :func:`load_reference`); run the paired test
twice to detect nondeterminism (:func:`run_twice`).

torch is imported inside the functions that need it, never at ``import vgct_ext``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import os
import sys
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from . import _context
from ._hardware import versions

__all__ = [
    "CaptureComplete",
    "CapturedCall",
    "Capture",
    "capture",
    "make_noise",
    "guard_inputs",
    "Reference",
    "save_reference",
    "load_reference",
    "RunTwice",
    "run_twice",
    "Nondeterminism",
    "tensor_leaves",
]

REFERENCE_FORMAT = "vgct-reference/1"


class CaptureComplete(Exception):
    """Raised inside the pipeline by :func:`capture` after ``stop_after`` calls; swallowed by ``with capture``."""


class Nondeterminism(AssertionError):
    """Two runs of the same experiment on the same inputs gave different results."""


def _is_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _is_ndarray(x: Any) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(x, np.ndarray)


def tree_map(fn: Callable[[Any], Any], obj: Any) -> Any:
    """Apply ``fn`` to every torch tensor and NumPy array in nested tuples / lists / dicts (incl. namedtuples,
    diffusers ``BaseOutput`` dataclass-dicts); other leaves are returned as they are."""
    if _is_tensor(obj) or _is_ndarray(obj):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(tree_map(fn, x) for x in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(tree_map(fn, x) for x in obj)
    if isinstance(obj, dict):
        mapped = {k: tree_map(fn, v) for k, v in obj.items()}
        if type(obj) is dict:
            return mapped
        try:
            return type(obj)(**mapped)
        except TypeError:
            try:
                return type(obj)(mapped)
            except TypeError:
                return mapped
    return obj


def tensor_leaves(obj: Any, prefix: str = "out") -> List[Tuple[str, Any]]:
    """``[(path, tensor), ...]`` of every torch tensor in a nested output, in a stable order."""
    out: List[Tuple[str, Any]] = []
    if _is_tensor(obj):
        out.append((prefix, obj))
    elif isinstance(obj, (tuple, list)):
        for i, x in enumerate(obj):
            out += tensor_leaves(x, f"{prefix}[{i}]")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out += tensor_leaves(v, f"{prefix}.{k}")
    return out


def _clone(x: Any) -> Any:
    return tree_map(lambda t: t.copy() if _is_ndarray(t) else t.detach().clone(), x)


# the leaves run_twice compares by value (repr: exact for these types, floats included); a NumPy scalar by its bits
_SCALARS = (bool, int, float, complex, str, bytes, type(None))


def _run_leaves(obj: Any, prefix: str = "out") -> List[Tuple[str, Any]]:
    """``[(path, leaf), ...]`` of a run's output for :func:`run_twice`: torch tensors, NumPy arrays and scalars,
    Python scalars (bool, int, float, complex, str, bytes, None, an Enum member), array-likes (a PIL image:
    ``__array_interface__`` / ``__array__``, read as a NumPy array) and any other object (which cannot be
    compared), in nested tuples / lists / dicts (namedtuples and diffusers ``BaseOutput`` included, dict entries
    by key) and dataclasses (by field)."""
    if isinstance(obj, (tuple, list)):
        return [leaf for i, x in enumerate(obj) for leaf in _run_leaves(x, f"{prefix}[{i}]")]
    if isinstance(obj, dict):
        return [leaf for k, v in obj.items() for leaf in _run_leaves(v, f"{prefix}.{k}")]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [leaf for f in dataclasses.fields(obj) for leaf in _run_leaves(getattr(obj, f.name),
                                                                                 f"{prefix}.{f.name}")]
    if not (_is_tensor(obj) or _is_ndarray(obj)) and (hasattr(obj, "__array_interface__") or
                                                       hasattr(obj, "__array__")):
        import numpy as np

        pal = getattr(obj, "getpalette", None)  # (a PIL palette image's array holds indices into its palette)
        pal = pal() if callable(pal) else None
        return [(prefix, np.asarray(obj))] + ([(f"{prefix}.palette", bytes(pal))] if pal is not None else [])
    return [(prefix, obj)]


def _leaf_signature(x: Any) -> Tuple[int, str, bool]:
    """``(64-bit signature, what it is, compared by value)`` of one output leaf: a tensor's or array's
    :func:`vgct_ext.fingerprint` (bits, dtype, shape), a scalar's hash of its type and repr, another object's
    of its type only."""
    import hashlib

    from vgct_ext import fingerprint

    np = sys.modules.get("numpy")
    if _is_tensor(x) or _is_ndarray(x):
        return fingerprint(x), "", True
    if np is not None and isinstance(x, np.generic):
        return fingerprint(np.asarray(x)), repr(x), True
    value = isinstance(x, _SCALARS) or isinstance(x, enum.Enum) or (
        type(x).__module__ in ("torch", "numpy") and type(x).__name__ in ("dtype", "device", "Size")) or (
        np is not None and isinstance(x, np.dtype))  # (values whose repr is exact)
    text = f"{type(x).__module__}.{type(x).__qualname__}" + (f":{x!r}" if value else "")
    shown = repr(x) if value else f"<{type(x).__qualname__}>"
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little"), \
        (shown if len(shown) <= 80 else shown[:77] + "..."), value


# --------------------------------------------------------------------------------------------------------------
# capture / replay


@dataclasses.dataclass
class CapturedCall:
    """One forward call of the captured module: detached clones of its ``args``, ``kwargs`` and ``output``."""

    args: tuple
    kwargs: Dict[str, Any]
    output: Any


class Capture:
    """The calls recorded by :func:`capture` (``.calls``), with a replay onto other modules."""

    def __init__(self, module: Any, stop_after: Optional[int]):
        self.module = module
        self.stop_after = stop_after
        self.calls: List[CapturedCall] = []

    def __len__(self) -> int:
        return len(self.calls)

    def _call(self, call: int) -> CapturedCall:
        if not self.calls:
            raise LookupError(f"capture: {type(self.module).__name__} was never called inside the with block; the "
                              f"pipeline did not reach the component")
        return self.calls[call]

    @property
    def args(self) -> tuple:
        """Positional inputs of the first call."""
        return self._call(0).args

    @property
    def kwargs(self) -> Dict[str, Any]:
        """Keyword inputs of the first call."""
        return self._call(0).kwargs

    @property
    def output(self) -> Any:
        """Output of the first call."""
        return self._call(0).output

    def replay(self, *modules: Any, call: int = 0) -> tuple:
        """Feed the inputs captured at ``call`` to each module (e.g. feature-on, then feature-off) under
        ``torch.no_grad()``; return their outputs in order. Each module gets its own clone of the inputs, so a
        module that writes into its inputs cannot change what the next one sees."""
        import torch

        if not modules:
            raise TypeError("replay needs at least one module")
        c = self._call(call)
        outs = []
        with torch.no_grad():
            for m in modules:
                outs.append(m(*_clone(c.args), **_clone(c.kwargs)))
        return tuple(outs)


@contextlib.contextmanager
def capture(module: Any, *, stop_after: Optional[int] = None) -> Iterator[Capture]:
    """Record the inputs and outputs of ``module`` (a ``torch.nn.Module``) while a pipeline runs inside
    the ``with`` block.

    Forward hooks (``with_kwargs=True``) store detached clones of every call's positional and keyword inputs
    and of its output, on the device where they were (no host copies). With ``stop_after=N`` the N-th call
    raises :class:`CaptureComplete` after being recorded, which stops the rest of the pipeline; the ``with``
    statement swallows it. Hooks are removed on exit. Yields a :class:`Capture`.
    """
    import torch

    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"capture takes a torch.nn.Module, got {type(module)!r}")
    if stop_after is not None and stop_after < 1:
        raise ValueError("stop_after must be >= 1")
    cap = Capture(module, stop_after)
    pending: List[Tuple[tuple, Dict[str, Any]]] = []

    def pre(_m: Any, args: tuple, kwargs: Dict[str, Any]) -> None:
        pending.append((_clone(args), _clone(kwargs)))

    def post(_m: Any, _args: tuple, _kwargs: Dict[str, Any], output: Any) -> None:
        args, kwargs = pending.pop()
        cap.calls.append(CapturedCall(args, kwargs, _clone(output)))
        if stop_after is not None and len(cap.calls) >= stop_after:
            raise CaptureComplete(f"captured {len(cap.calls)} call(s)")

    h1 = module.register_forward_pre_hook(pre, with_kwargs=True)
    h2 = module.register_forward_hook(post, with_kwargs=True)
    try:
        yield cap
    except CaptureComplete:
        pass
    finally:
        h1.remove()
        h2.remove()


# --------------------------------------------------------------------------------------------------------------
# identical stochastic inputs


def make_noise(shape: Sequence[int], *, seed: int, dtype: Any = None, device: Any = "cpu") -> Any:
    """Standard-normal noise made ONCE, to be handed to both sides of the experiment.

    Drawn from a dedicated CPU ``torch.Generator`` seeded with ``seed`` (so the values do not depend on the
    device, its RNG or the global RNG state), in float32, then cast to ``dtype`` (default float32) and moved to
    ``device``. Pass the returned tensor to the feature-on and the feature-off side; do not re-seed each side:
    matching seeds is not enough once the two sides consume the RNG differently.
    """
    import torch

    g = torch.Generator(device="cpu").manual_seed(int(seed))
    x = torch.randn(tuple(int(s) for s in shape), generator=g, dtype=torch.float32)
    return x.to(device=device, dtype=dtype if dtype is not None else torch.float32)


@contextlib.contextmanager
def guard_inputs(*tensors: Any, **named: Any) -> Iterator[None]:
    """Fail if any shared input tensor is modified inside the block (a side that writes into a shared latent
    would hand the other side a different experiment). Compares :func:`vgct_ext.fingerprint` before/after;
    raises ``AssertionError`` naming the changed inputs."""
    from vgct_ext import fingerprint

    items = [(f"input[{i}]", t) for i, t in enumerate(tensors)] + list(named.items())
    before = [(n, fingerprint(t)) for n, t in items]
    yield
    changed = [n for (n, fp), (_, t) in zip(before, items) if fingerprint(t) != fp]
    if changed:
        raise AssertionError(f"shared inputs were modified in place during the experiment: {', '.join(changed)}; "
                             f"both sides must see identical inputs (clone per side, or fix the in-place write)")


# --------------------------------------------------------------------------------------------------------------
# references through safetensors


@dataclasses.dataclass
class Reference:
    """A reference loaded by :func:`load_reference`: ``tensors`` by name, the caller's ``meta``, and ``info``
    (format, per-tensor dtype/shape/fingerprint, weights fingerprint, producer versions)."""

    tensors: Dict[str, Any]
    meta: Dict[str, Any]
    info: Dict[str, Any]

    def __getitem__(self, name: str) -> Any:
        return self.tensors[name]

    def __contains__(self, name: object) -> bool:
        return name in self.tensors

    def keys(self) -> Any:
        return self.tensors.keys()

    @property
    def weights_fingerprint(self) -> Optional[int]:
        v = self.info.get("weights_fingerprint")
        return int(v, 16) if isinstance(v, str) else v

    @property
    def versions(self) -> Dict[str, Any]:
        return dict(self.info.get("versions", {}))


def save_reference(path: Union[str, "os.PathLike[str]"], tensors: Mapping[str, Any],
                   meta: Optional[Mapping[str, Any]] = None, *, weights: Any = None) -> Dict[str, Any]:
    """Write reference tensors to a safetensors file with what produced them.

    Args:
        path: the ``.safetensors`` file (a scratch file of this test run, not a committed golden).
        tensors: ``{name: torch.Tensor}`` (any device, any strides; written contiguous from host memory).
        meta: JSON-serializable facts about the experiment (component, feature, seed, dtype, ...).
        weights: a module or state dict whose :func:`vgct_ext.weights_fingerprint` is recorded, so the
            consumer can prove both sides loaded the same weights.
    The safetensors metadata key ``"vgct"`` holds JSON: format, per-tensor dtype/shape/fingerprint, weights
    fingerprint (hex), producer library versions, and ``meta``. Returns that dict.
    Raises ``TypeError`` for a non-tensor value or non-JSON ``meta``.
    """
    import torch
    from safetensors.torch import save_file

    from vgct_ext import fingerprint

    from .probes import weights_fingerprint

    host: Dict[str, Any] = {}
    table: Dict[str, Any] = {}
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"save_reference: {name!r} is {type(t)!r}, not a torch.Tensor")
        table[name] = {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape),
                       "fingerprint": f"{fingerprint(t):016x}"}
        h = t.detach().to("cpu").contiguous()
        if any(h.untyped_storage().data_ptr() == o.untyped_storage().data_ptr() for o in host.values()):
            h = h.clone()  # safetensors refuses tensors that share memory
        host[name] = h
    info = {"format": REFERENCE_FORMAT, "tensors": table,
            "weights_fingerprint": f"{weights_fingerprint(weights):016x}" if weights is not None else None,
            "versions": versions(), "meta": dict(meta or {})}
    try:
        text = json.dumps(info, sort_keys=True)
    except TypeError as exc:
        raise TypeError(f"save_reference: meta must be JSON-serializable ({exc})") from exc
    save_file(host, os.fspath(path), metadata={"vgct": text})
    return info


def _check_reference_info(p: str, info: Any) -> Dict[str, Any]:
    """Validate the ``"vgct"`` metadata of a reference file; ``ValueError`` naming ``p`` and the field."""

    def bad(field: str, want: str, got: Any) -> ValueError:
        g = repr(got)
        return ValueError(f"{p}: reference metadata field {field}: expected {want}, got "
                          f"{g if len(g) <= 80 else g[:77] + '...'}")

    if not isinstance(info, dict):
        raise bad("(top level)", "a JSON object", info)
    if info.get("format") != REFERENCE_FORMAT:
        raise bad("format", repr(REFERENCE_FORMAT), info.get("format"))
    table = info.get("tensors")
    if not isinstance(table, dict):
        raise bad("tensors", "an object {name: {dtype, shape, fingerprint}}", table)
    for name, rec in table.items():
        w = f"tensors[{name!r}]"
        if not isinstance(rec, dict):
            raise bad(w, "an object {dtype, shape, fingerprint}", rec)
        if not isinstance(rec.get("dtype"), str):
            raise bad(f"{w}.dtype", "a dtype name (string)", rec.get("dtype"))
        shape = rec.get("shape")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                  for d in shape):
            raise bad(f"{w}.shape", "a list of non-negative integers", shape)
        fp = rec.get("fingerprint")
        if not isinstance(fp, str) or len(fp) != 16 or any(c not in "0123456789abcdef" for c in fp):
            raise bad(f"{w}.fingerprint", "16 lowercase hex digits", fp)
    wf = info.get("weights_fingerprint")
    if wf is not None and not (isinstance(wf, str) and len(wf) == 16
                               and all(c in "0123456789abcdef" for c in wf)):
        raise bad("weights_fingerprint", "null or 16 lowercase hex digits", wf)
    for field in ("meta", "versions"):
        if field in info and not isinstance(info[field], dict):
            raise bad(field, "an object", info[field])
    return info


def load_reference(path: Union[str, "os.PathLike[str]"], *, device: Any = "cpu") -> Reference:
    """Read a file written by :func:`save_reference` onto ``device`` and verify every tensor in it.

    Every tensor in the file must be listed in the metadata with its dtype, shape and fingerprint, and match
    them; every listed tensor must be in the file. Raises ``ValueError`` naming the file (and the metadata field
    or tensor) for: a file safetensors cannot read, no ``vgct`` metadata, metadata that is not valid JSON or has
    a missing or mistyped field, a tensor not listed in the metadata (it would be returned unverified), a listed
    tensor that is missing, or a dtype, shape or fingerprint that differs (a truncated or foreign file)."""
    from safetensors import safe_open

    from vgct_ext import fingerprint

    p = os.fspath(path)
    if not os.path.exists(p):
        raise FileNotFoundError(f"{p}: no such reference file")
    try:
        with safe_open(p, framework="pt", device=str(device)) as f:
            raw = (f.metadata() or {}).get("vgct")
            if raw is None:
                raise ValueError(f"{p}: no 'vgct' metadata; not written by vgct_ext.save_reference")
            try:
                info = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{p}: reference metadata 'vgct' is not valid JSON ({exc})") from exc
            info = _check_reference_info(p, info)
            unlisted = sorted(set(f.keys()) - set(info["tensors"]))
            if unlisted:
                raise ValueError(f"{p}: tensor(s) {', '.join(map(repr, unlisted))} are in the file but not in its "
                                 f"metadata, so they cannot be verified; refusing the file")
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except ValueError:
        raise
    except Exception as exc:  # noqa: BLE001 - safetensors' own error types: a corrupt or foreign file
        raise ValueError(f"{p}: not a readable safetensors file ({type(exc).__name__}: {exc})") from exc
    for name, rec in info["tensors"].items():
        if name not in tensors:
            raise ValueError(f"{p}: tensor {name!r} listed in metadata is missing")
        t = tensors[name]
        dtype = str(t.dtype).replace("torch.", "")
        if dtype != rec["dtype"] or list(t.shape) != rec["shape"]:
            raise ValueError(f"{p}: tensor {name!r} is {dtype} {tuple(t.shape)}, metadata records {rec['dtype']} "
                             f"{tuple(rec['shape'])}")
        got = f"{fingerprint(t):016x}"
        if got != rec["fingerprint"]:
            raise ValueError(f"{p}: tensor {name!r} fingerprint {got} != recorded {rec['fingerprint']} (dtype "
                             f"{t.dtype}, shape {tuple(t.shape)}; recorded {rec['dtype']} {tuple(rec['shape'])})")
    return Reference(tensors=tensors, meta=dict(info.get("meta", {})), info=info)


# --------------------------------------------------------------------------------------------------------------
# run twice


@dataclasses.dataclass
class RunTwice:
    """Result of :func:`run_twice`: per output leaf of run 1 (``names``: its path, e.g. ``out[0]``,
    ``out.sample``), the 64-bit signatures of run 1 and run 2 (``fingerprints``: a tensor's or array's
    :func:`vgct_ext.fingerprint`, a scalar's hash of its type and value), ``stats[name]``
    (``vgct_ext.PairedStats`` of run 2 against run 1) for each tensor or array that differs, and
    ``names_run2`` (run 2's paths: the runs differ in structure when it is not the same set)."""

    names: List[str]
    fingerprints: Tuple[List[int], List[int]]
    stats: Dict[str, Any]
    outputs: Tuple[Any, Any]
    inputs_changed: List[str]
    names_run2: Optional[List[str]] = None
    values: Tuple[List[str], List[str]] = ([], [])  # a scalar leaf's repr ("" for an array), per run
    opaque: List[str] = dataclasses.field(default_factory=list)  # leaves that cannot be compared

    def _by_name(self, run: int) -> Dict[str, Tuple[int, str]]:
        names = self.names if run == 0 or self.names_run2 is None else self.names_run2
        return {n: (f, v) for n, f, v in zip(names, self.fingerprints[run], self.values[run] or [""] * len(names))}

    @property
    def identical(self) -> bool:
        """Both runs bitwise equal, inputs untouched, and every leaf compared: an output holding an object that
        cannot be compared (neither tensor, array, array-like, scalar, container nor dataclass) is never called
        identical -- it may hold what differs (review of 2026-12-05: a pipeline's list of PIL images beside a
        bool read identical when objects were compared by type)."""
        return self._by_name(0) == self._by_name(1) and not self.inputs_changed and not self.opaque

    def describe(self) -> str:
        if self.identical:
            return f"both runs bitwise identical ({len(self.names)} output leaf/leaves)"
        lines = []
        if self.opaque:
            lines.append(f"cannot compare {', '.join(self.opaque)} (neither a tensor, an array or array-like, a "
                         f"scalar, a container nor a dataclass): return the tensors, arrays or values to check")
        if self.inputs_changed:
            lines.append(f"the first run modified its inputs in place: {', '.join(self.inputs_changed)}")
        one, two = self._by_name(0), self._by_name(1)
        if set(one) != set(two):
            lines.append(f"the runs' outputs differ in structure: only in run 1 {sorted(set(one) - set(two))}, "
                         f"only in run 2 {sorted(set(two) - set(one))}")
        for name in self.names:
            if name in two and one[name] != two[name]:
                (a, va), (b, vb) = one[name], two[name]
                s = self.stats.get(name)
                lines.append(f"{name}: " + (f"{va} vs {vb}" if va or vb else f"fingerprints {a:016x} vs {b:016x}")
                             + (f"; {s.summary()}" if s is not None else ""))
        return "\n".join(lines)

    def assert_identical(self, *, component: str, feature: str) -> None:
        """Raise :class:`Nondeterminism` naming component, feature and each differing output's statistics."""
        if not self.identical:
            raise Nondeterminism(f"nondeterminism: component {component!r}, feature {feature!r}: two runs on "
                                 f"the same inputs differ\n  " + self.describe().replace("\n", "\n  "))


def run_twice(fn: Callable[..., Any], *inputs: Any, **kwargs: Any) -> RunTwice:
    """Call ``fn(*inputs, **kwargs)`` twice on the same inputs and compare the runs bitwise.

    Outputs may be a tensor, a NumPy array (a pipeline's ``output_type="np"``), a scalar, or nested
    tuples/lists/dicts of them (namedtuples, diffusers ``BaseOutput``); the runs are compared leaf by leaf
    by path (a dict's entries by key): tensors and arrays by :func:`vgct_ext.fingerprint` (bits, dtype,
    shape; array-likes such as PIL images read as arrays), Python and NumPy scalars and Enum members by value,
    dataclasses by field, and the two runs' sets of paths; an output holding any other object is never
    ``identical`` (``describe()`` names it). For each tensor or array that differs, the statistics of run 2
    against run 1 (``vgct_ext.compare``). Also detects a first run that modified its tensor or array inputs in place.
    Returns :class:`RunTwice`; recorded in the pytest report. Does not raise on a difference (see
    :meth:`RunTwice.assert_identical`). Raises ``TypeError`` when run 1's output holds nothing comparable by
    value (None, or objects only): "identical" would then say nothing (hostile review of 2026-12-05: an
    output of NumPy arrays compared 0 tensors and passed).
    """
    from vgct_ext import compare, fingerprint

    in_leaves = [(n, t) for n, t in _run_leaves(list(inputs), "input") + _run_leaves(dict(kwargs), "kwargs")
                 if _is_tensor(t) or _is_ndarray(t)]
    fp_in = [fingerprint(t) for _, t in in_leaves]
    out1 = fn(*inputs, **kwargs)
    out1 = _clone(out1)  # a function reusing its output buffer must not overwrite run 1
    changed = [n for (n, t), fp in zip(in_leaves, fp_in) if fingerprint(t) != fp]
    out2 = fn(*inputs, **kwargs)
    l1, l2 = _run_leaves(out1), _run_leaves(out2)
    g1, g2 = [_leaf_signature(x) for _, x in l1], [_leaf_signature(x) for _, x in l2]
    if not any(g[2] and x is not None for (_, x), g in zip(l1, g1)):
        inner = sorted({type(x).__qualname__ for n, x in l1 if n != "out"})
        raise TypeError(f"run_twice: the output of {getattr(fn, '__qualname__', fn)!r} holds no tensor, array or "
                        f"scalar to compare (got {type(out1).__qualname__}"
                        + (f" of {', '.join(inner)}" if inner else "") + "); return the outputs to check")
    f1, f2 = [g[0] for g in g1], [g[0] for g in g2]
    second = {n: (x, g) for (n, x), g in zip(l2, g2)}
    stats: Dict[str, Any] = {}
    for (n, a), (x, _, _) in zip(l1, g1):
        b, y = second.get(n, (None, (x, "", True)))
        if x != y[0] and (_is_tensor(a) or _is_ndarray(a)) and type(a) is type(b) and \
                tuple(a.shape) == tuple(b.shape) and getattr(a, "device", None) == getattr(b, "device", None):
            stats[n] = compare(b, a)
    res = RunTwice([n for n, _ in l1], (f1, f2), stats, (out1, out2), changed, names_run2=[n for n, _ in l2],
                   values=([g[1] for g in g1], [g[1] for g in g2]),
                   opaque=[n for (n, _), g in zip(l1, g1) if not g[2]])
    _context.record({"kind": "run_twice", "identical": res.identical, "outputs": res.names,
                     "fingerprints": [[f"{v:016x}" for v in f1], [f"{v:016x}" for v in f2]],
                     "inputs_changed": changed, "passed": res.identical,
                     "signature": {n: f"{v:016x}" for n, v in zip(res.names, f1)}})
    return res
