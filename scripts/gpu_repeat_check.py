"""Repeated calls of ``vgct_ext.compare`` on one pair must give the same result, bit for bit.

Results are deterministic by design (docs/metrics.md: each engine folds and merges in a fixed
order), so any call that differs from the first of its process -- or a process whose first
result differs from the other processes' -- read its input wrongly or raced: the detector of the
ring kernel's intermittent misread (docs/performance.md, 2026-12-03 15:40 UTC and 16:40 UTC),
faster than rerunning the test suite.  PROCS processes (one CUDA context each: time-sliced on one
GPU, the load under which the misread showed) each build the same pair, call ``compare`` CALLS
times, and compare every result with their first, field by field (floats by their bits, arrays
by their bytes).  With ``--fresh R`` each of the PROCS slots starts R such processes one after
another, and every process's first result is also compared with the one most processes gave:
each misread inspected was a process's first call, made while other processes were starting.
The load that caught it was eight processes at a time, each started fresh, four calls each,
with the p99: the load of ``--procs 8 --calls 4 --fresh 20 --p99`` (run then as single
workers from shell loops; this form not yet on a GPU).

    python scripts/gpu_repeat_check.py [--procs 4] [--calls 200] [--fresh 1] [--log2n 25]
                                       [--dtype bf16] [--shape ties|noise] [--p99] [--device cuda]

The pair (seeded, the same in every process): ``e32 ~ N(0, 1)``; ties: ``a = dtype(e32 + 1e-3
N(0, 1))``, ``e = dtype(e32)`` (the failing test's data); noise: ``a = dtype(e32 + 1e-2 N(0,
1))``.  Without --p99 the call takes no quantiles (the ring without a window); with it the
default p99 (from 2^25 pairs: the fused window).  Prints a line per process (the last lines of
each that failed) and a summary.  Exit status: 0 when every call matched, 1 when one did not, 2
on a usage error, 130 on Ctrl-C (no new process started, the running ones killed, the finished
ones reported; 1 instead if one of them failed).  Test hook (not an API): VGCT_REPEAT_PLANT=K
changes the K-th call's fingerprint (K = 0: the first), =every every call's alike, in the first
process only (the checker's own planted faults: tests/.../test_gpu_stress.py).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections import Counter


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
    hook = (os.environ.get("VGCT_REPEAT_PLANT") or "-1") if k == 0 else "-1"
    every = hook == "every"  # every call's fingerprint changed alike: unlike the other processes
    plant = -1 if every else int(hook)

    def call(i):
        fp = fingerprint(vgct_ext.compare(a, e, quantiles=q))
        if i == plant or every:
            fp["n_unequal"] = fp["n_unequal"] + " (planted)"
        return fp

    first = call(0)
    digest = hashlib.sha256(json.dumps(first, sort_keys=True).encode()).hexdigest()
    bad = 0
    for i in range(1, args.calls):
        d = diff(first, call(i))
        if d:
            bad += 1
            if bad <= 3:
                print(f"p{k} call {i}: differs from call 0 in {len(d)} fields: " + "; ".join(d[:6]),
                      flush=True)
    print(f"p{k}: {args.calls} calls, {bad} differ from the first", flush=True)
    print(f"p{k} first result {digest}", flush=True)
    return 1 if bad else 0


def run_slot(args, base, slot, out, live, lock, stop):
    """Slot `slot`'s --fresh worker processes, one after another, until done or `stop` is set;
    (worker, status, output) of each into out, the running one (worker, process) in live[slot].
    A worker is started and recorded under `lock`, which the interrupt handler holds while it
    sets `stop` and kills the running ones: none starts after, none escapes the kill."""
    for r in range(args.fresh):
        k = slot * args.fresh + r
        with lock:
            if stop.is_set():
                return
            p = subprocess.Popen([sys.executable, os.path.abspath(__file__), *base, "--worker",
                                  str(k)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True)
            live[slot] = (k, p)
        text = p.communicate()[0]
        out.append((k, p.returncode, text))


def report(out, args, note=""):
    """Print a line per process (the last lines of each that failed) and the summary; returns the
    number that failed.  A process fails by its status (a call unlike its first, or a crash),
    or when its first result is not the one more than half of the processes gave (none given,
    or no result shared by more than half: then every process is flagged)."""
    firsts = {}
    for k, rc, text in out:
        m = re.search(r"^p\d+ first result ([0-9a-f]{64})$", text, re.M)
        firsts[k] = m.group(1) if m else None
    top = Counter(d for d in firsts.values() if d).most_common(1)
    common = top[0][0] if top and 2 * top[0][1] > len(out) else None
    failed = 0
    for k, rc, text in sorted(out):
        if firsts[k] is None:
            odd = "no first result"
        elif common is None:
            odd = "no first result shared by more than half of the processes"
        else:
            odd = "its first result unlike most processes'" if firsts[k] != common else ""
        if rc != 0 or odd:
            failed += 1
            print(f"--- process p{k} (status {rc}{'; ' + odd if odd else ''}):")
            print("\n".join(text.rstrip().splitlines()[-8:]), flush=True)
        else:
            print(next((ln for ln in text.splitlines() if ln.startswith(f"p{k}: ")), f"p{k}: ?"))
    print(f"gpu_repeat_check: {len(out)} processes{note} ({args.procs} at a time) x {args.calls} "
          f"calls, {failed} saw a result differ (from their first or from most processes') or "
          f"failed", flush=True)
    return failed


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--fresh", type=int, default=1)
    ap.add_argument("--log2n", type=int, default=25)
    ap.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    ap.add_argument("--shape", choices=("ties", "noise"), default="ties")
    ap.add_argument("--p99", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--worker", type=int, default=-1, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.procs < 1 or args.calls < 2 or args.fresh < 1 or not 1 <= args.log2n <= 31:
        ap.error("need --procs >= 1, --calls >= 2, --fresh >= 1, 1 <= --log2n <= 31")
    if args.worker >= 0:
        return worker(args, args.worker)
    base = list(argv if argv is not None else sys.argv[1:])
    out, live, lock, stop = [], [None] * args.procs, threading.Lock(), threading.Event()
    slots = [threading.Thread(target=run_slot, args=(args, base, j, out, live, lock, stop),
                              daemon=True) for j in range(args.procs)]
    try:
        for t in slots:
            t.start()
        for t in slots:
            t.join()
    except KeyboardInterrupt:  # no new worker; the running ones killed; what finished reported
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # (a second Ctrl-C while stopping)
        with lock:
            stop.set()
            killed = [(k, p) for k, p in filter(None, live) if p.poll() is None]
            for _, p in killed:
                p.kill()
        for t in slots:
            t.join(timeout=10)
        gone = {k for k, _ in killed}
        done = [r for r in list(out) if r[0] not in gone]
        print(f"gpu_repeat_check: interrupted after {len(done)} processes", file=sys.stderr)
        failed = report(done, args, note=" before the interrupt") if done else 0
        return 1 if failed else 130
    return 1 if report(out, args) else 0


if __name__ == "__main__":
    sys.exit(main())
