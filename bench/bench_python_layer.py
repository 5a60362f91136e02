"""The Python layer's cost per ``vgct_ext.compare`` call (``compare`` minus ``_C.compare`` called the
way ``compare`` calls it), old against new, in one process: the three modules of vgct_ext/core
(``_api``, ``_dlpack``, ``_stats``) of a git revision (``--base``, default HEAD) and of the working
tree are each loaded as a separate copy (their relative imports pointed at each other), against the
one ``_C`` both call, and timed alternately in rounds, so both see the same machine state.

Inputs: torch tensors (CPU, or CUDA with ``--device cuda``) of shapes (1,), (1024,) and (2, 4, 8, 16)
(``--shapes``; the result's indices unravelled over four axes), bf16 against
fp32 and fp32 against fp32, ``quantiles=()`` and the default quantiles.  Each cell: the median over
``--rounds`` rounds of the mean of ``--calls`` calls.  Not a test; a table for docs/performance.md.

    VGCT_CUDA=0 python bench/bench_python_layer.py [--base HEAD] [--rounds 7] [--calls 20000]
"""
import argparse
import importlib.util
import os
import re
import statistics
import subprocess
import sys
import time

import torch

import vgct_ext
from vgct_ext import _C

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORE = os.path.join(ROOT, "vgct_ext", "core")
MODULES = ("_dlpack", "_stats", "_api")  # in dependency order


def _source(rev, mod):
    if rev is None or os.path.isdir(rev):  # the working tree, or a directory of the old modules
        with open(os.path.join(CORE if rev is None else rev, mod + ".py"), encoding="utf-8") as f:
            return f.read()
    return subprocess.run(["git", "show", f"{rev}:vgct_ext/core/{mod}.py"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout


def load(rev, tag):
    """``compare`` of the modules at ``rev`` (None: the working tree), as vgct_ext.core._ab_<tag>_*."""
    mods = {}
    for mod in MODULES:
        src = _source(rev, mod)
        for m in MODULES:  # the siblings' copies of the same tree
            src = re.sub(rf"from \. import {m}\b", f"from . import _ab_{tag}{m} as {m}", src)
            src = re.sub(rf"from \.{m} import", f"from ._ab_{tag}{m} import", src)
        name = f"vgct_ext.core._ab_{tag}{mod}"
        spec = importlib.util.spec_from_loader(name, loader=None, origin=os.path.join(CORE, mod + ".py"))
        module = importlib.util.module_from_spec(spec)
        module.__file__ = os.path.join(CORE, mod + ".py")  # _dlpack's _PACKAGE_DIR: the package's own
        module.__package__ = "vgct_ext.core"
        sys.modules[name] = module
        exec(compile(src, module.__file__, "exec"), module.__dict__)
        mods[mod] = module
    return mods["_api"].compare


def per_call_us(fn, calls):
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - t0) / calls / 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="HEAD",
                    help="git revision of the old modules, or a directory holding _api.py, _dlpack.py, _stats.py")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--shapes", default="1,1024,2x4x8x16", help="comma-separated, axes joined by x")
    args = ap.parse_args()
    trees = {"old": load(args.base, "old"), "new": load(None, "new")}
    ps = _C.PRODUCER_STREAM if "__dlpack_c_exchange_api__" in type.__dict__["__dict__"].__get__(torch.Tensor) else None
    print(f"# torch {torch.__version__}, Python {sys.version.split()[0]}, {args.device}, base {args.base}; "
          f"_C called with stream {'PRODUCER_STREAM' if ps is not None else 'None'}")
    print("| shape | dtypes | quantiles | _C.compare us | old compare us | new compare us | old overhead us "
          "| new overhead us | saved us |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|")
    for shape in [tuple(int(k) for k in s.split("x")) for s in args.shapes.split(",")]:
        for da in (torch.bfloat16, torch.float32):
            e = torch.randn(shape, device=args.device)
            a = (e + 1e-3 * torch.randn_like(e)).to(da)
            for qs in ((), (0.99,)):
                ad, ed = a.detach(), e.detach()
                fns = {"C": lambda: _C.compare(ad, ed, 1e-3, 1e-3, qs, None, ps, None, None)}
                for tag, compare in trees.items():
                    fns[tag] = (lambda c: lambda: c(a, e, quantiles=qs))(compare)
                    assert compare(a, e, quantiles=qs).as_dict() == vgct_ext.compare(a, e, quantiles=qs).as_dict()
                res = {k: [] for k in fns}
                for _ in range(args.rounds):
                    for k, fn in fns.items():
                        res[k].append(per_call_us(fn, args.calls))
                m = {k: statistics.median(v) for k, v in res.items()}
                print(f"| {'x'.join(map(str, shape))} | {str(da)[6:]}/{str(e.dtype)[6:]} | {qs} | {m['C']:.2f} | {m['old']:.2f} | "
                      f"{m['new']:.2f} | {m['old'] - m['C']:.2f} | {m['new'] - m['C']:.2f} | "
                      f"{m['old'] - m['new']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
