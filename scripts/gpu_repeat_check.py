"""Repeated calls of ``vgct_ext.compare`` on one pair must give the same result, bit for bit.

Results are deterministic by design (docs/metrics.md: each engine folds and merges in a fixed
order), so any call that differs from the first of its process read its input wrongly or raced:
the detector for the ring kernel's intermittent misread (docs/performance.md, 2026-12-03 15:40
UTC), faster than rerunning the test suite.  PROCS processes (one CUDA context each: time-sliced
on one GPU, the load under which the misread showed) each build the same pair, call
``compare`` CALLS times, and compare every result with their first, field by field (floats by
their bits, arrays by their bytes).

    python scripts/gpu_repeat_check.py [--procs 4] [--calls 200] [--log2n 25] [--dtype bf16]
                                       [--shape ties|noise] [--p99] [--device cuda]

The pair (seeded, the same in every process): ``e32 ~ N(0, 1)``; ties: ``a = dtype(e32 + 1e-3
N(0, 1))``, ``e = dtype(e32)`` (the failing test's data); noise: ``a = dtype(e32 + 1e-2 N(0,
1))``.  Without --p99 the call takes no quantiles (the ring without a window); with it the
default p99 (from 2^25 pairs: the fused window).  Prints a line per process and a summary; exit
status 0 when every call matched, 1 when one did not, 2 on a usage error.  Test hook (not an
API): VGCT_REPEAT_PLANT=K changes the K-th call's fingerprint in process 0 (the checker's own
planted fault: tests/.../test_gpu_stress.py).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys


def fingerprint(result):
    """The result's fields as exact strings: floats by float.hex, arrays by a digest of their
    bytes, everything else by repr."""
    import numpy as np

    def canon(v):
        if isinstance(v, float):
            return v.hex()
        if isinstance(v, np.ndarray):
            return f"array{v.shape}{v.dtype}:{hashlib.sha256(v.tobytes()).hexdigest()}"
        if isinstance(v, dict):
            return {str(k): canon(x) for k, x in sorted(v.items(), key=lambda kv: str(kv[0]))}
        if isinstance(v, (list, tuple)):
            return [canon(x) for x in v]
        return repr(v)

    return canon(result.as_dict())


def diff(x, y, path=""):
    """Paths where two fingerprints differ."""
    if isinstance(x, dict) and isinstance(y, dict):
        out = []
        for k in sorted(set(x) | set(y)):
            out += diff(x.get(k), y.get(k), f"{path}.{k}" if path else k)
        return out
    return [] if x == y else [f"{path}: {x} != {y}"]


def worker(args, k):
    import torch

    import vgct_ext
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    g = torch.Generator(device=args.device)
    g.manual_seed(20261203)
    n = 1 << args.log2n
    e32 = torch.randn(n, generator=g, device=args.device)
    noise = torch.randn(n, generator=g, device=args.device)
    a = (e32 + (1e-3 if args.shape == "ties" else 1e-2) * noise).to(dt)
    e = e32.to(dt)
    del e32, noise
    q = (0.99,) if args.p99 else None
    plant = int(os.environ.get("VGCT_REPEAT_PLANT", "-1")) if k == 0 else -1
    first = fingerprint(vgct_ext.compare(a, e, quantiles=q))
    bad = 0
    for i in range(1, args.calls):
        fp = fingerprint(vgct_ext.compare(a, e, quantiles=q))
        if i == plant:
            fp["n_unequal"] = fp["n_unequal"] + " (planted)"
        d = diff(first, fp)
        if d:
            bad += 1
            if bad <= 3:
                print(f"p{k} call {i}: differs from call 0 in {len(d)} fields: " + "; ".join(d[:6]),
                      flush=True)
    print(f"p{k}: {args.calls} calls, {bad} differ from the first", flush=True)
    return 1 if bad else 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--log2n", type=int, default=25)
    ap.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    ap.add_argument("--shape", choices=("ties", "noise"), default="ties")
    ap.add_argument("--p99", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--worker", type=int, default=-1, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.procs < 1 or args.calls < 2 or not 1 <= args.log2n <= 31:
        ap.error("need --procs >= 1, --calls >= 2, 1 <= --log2n <= 31")
    if args.worker >= 0:
        return worker(args, args.worker)
    base = list(argv if argv is not None else sys.argv[1:])
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), *base, "--worker", str(k)])
             for k in range(args.procs)]
    rcs = [p.wait() for p in procs]
    failed = sum(1 for r in rcs if r != 0)
    print(f"gpu_repeat_check: {args.procs} processes x {args.calls} calls, "
          f"{failed} process(es) saw a result differ or failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
