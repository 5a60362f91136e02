"""How many blocks a SM the large reductions should aim at: the device time of
``vgct_ext.compare`` at 2^28 pairs (issue [H]'s throughput rows and the exact p99's data
shapes) with the grid of the fast kernels at B blocks a SM, switched in one process through
the reduce's bench hook ``vgct_cuda_test_bpsm`` (cuda/reduce.cu; 0 = the default, 2: one
resident wave) and alternated rep by rep, so every setting sees the same clocks.

Why: with one wave every block has a fixed share; a block whose warps meet the data's slow
branches (ties, the exact mismatch count, the maxima's fallbacks) holds its SM's slot while
the others idle at the end (docs/performance.md, 2026-12-02 02:35 UTC: 9% of the warps'
samples at the block barrier on bf16 ties).  More, smaller blocks are handed out by the
hardware to whichever SM is free; they cost more partial records, block merges and gate
warm-ups.

Also checks that each setting's record has the same exact fields (maxima with their indices,
counts, the p99) as the default's, bit for bit, and sums within 1e-12 relative (their
grouping follows the grid).  Prints a ratio table (time / the default's).

    python bench/bench_grid.py [--log2n 28] [--reps 15] [--bpsm 2,4,8,16] [--json out.json]
"""
from __future__ import annotations

import argparse
import ctypes
import json
import math
import statistics
import sys

import torch

import vgct_ext
from vgct_ext import _C

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import bench_gpu  # noqa: E402  (the issue's data shapes)

EXACT = ("n_finite", "max_abs_err", "max_abs_err_index", "max_rel_err", "max_rel_err_index",
         "max_abs_expected", "mismatches", "worst_mismatch_index", "worst_mismatch_excess",
         "n_unequal", "quantiles")
SUMS = ("norm_actual", "norm_expected", "norm_diff", "mean_diff", "cosine")


def cases(n):
    a, e = bench_gpu.make_pair(n, torch.bfloat16)
    yield "bf16 bench pair", a, e, {}
    m = 1 << (int(math.log2(n)) // 2)
    yield "bf16 transposed", a.view(m, -1).t(), e.view(m, -1).t(), {}
    if n == 1 << 28:
        shape = (2, 16, 256, 128, 256)
        yield "latent (2, 16, 256, 128, 256) bf16, dim=1", a.view(shape), e.view(shape), {"dim": 1}
    del a, e
    for name, x, y in bench_gpu.p99_shapes(n):
        yield name, x, y, {}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--log2n", type=int, default=28)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--bpsm", default="2,4,8,16")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_grid.py: no CUDA device", file=sys.stderr)
        return 2
    hook = ctypes.c_longlong.in_dll(ctypes.CDLL(_C.__file__), "vgct_cuda_test_bpsm")
    settings = [int(x) for x in args.bpsm.split(",")]
    base = settings[0]
    n = 1 << args.log2n
    rows, bad = [], []
    try:
        for name, a, e, kw in cases(n):
            for qs in ((None, (0.99,)) if not kw else (None,)):
                ref = None
                t = {b: [] for b in settings}
                for b in settings:  # warm-up and the record check
                    hook.value = b
                    for _ in range(2):
                        r = vgct_ext.compare(a, e, quantiles=qs, **kw)
                    if ref is None:
                        ref = r
                        continue
                    for f in EXACT:
                        if getattr(r, f) != getattr(ref, f) and not (
                                isinstance(getattr(r, f), float) and math.isnan(getattr(r, f))
                                and math.isnan(getattr(ref, f))):
                            bad.append(f"{name} q={qs} bpsm={b}: {f} {getattr(r, f)!r} "
                                       f"!= {getattr(ref, f)!r}")
                    for f in SUMS:
                        x, y = getattr(r, f), getattr(ref, f)
                        if x is not None and y is not None and abs(x - y) > 1e-12 * max(abs(y), 1e-300):
                            bad.append(f"{name} q={qs} bpsm={b}: {f} {x!r} vs {y!r}")
                for _ in range(args.reps):
                    for b in settings:
                        hook.value = b
                        s, f = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        s.record()
                        vgct_ext.compare(a, e, quantiles=qs, **kw)
                        f.record()
                        f.synchronize()
                        t[b].append(s.elapsed_time(f))
                med = {b: statistics.median(t[b]) for b in settings}
                rows.append({"case": name, "quantiles": "p99" if qs else "none",
                             **{f"bpsm{b}_ms": med[b] for b in settings}})
                print(f"  {name:52s} {rows[-1]['quantiles']:4s} " +
                      " ".join(f"{b}:{med[b]:.3f}" for b in settings), flush=True)
            del a, e
            torch.cuda.empty_cache()
    finally:
        hook.value = 0
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"rows": rows, "mismatched_records": bad}, fh, indent=1)
    print(f"\n2^{args.log2n} pairs, device ms (median of {args.reps}, settings alternated); "
          f"ratio = time / time at {base} blocks a SM")
    hdr = f"{'case':52s} {'q':4s} " + " ".join(f"{f'B={b} ms':>9s}" for b in settings) + " " + \
        " ".join(f"{f'x{b}':>6s}" for b in settings[1:])
    print(hdr)
    for r in rows:
        ms = [r[f"bpsm{b}_ms"] for b in settings]
        print(f"{r['case']:52s} {r['quantiles']:4s} " + " ".join(f"{x:9.3f}" for x in ms) + " " +
              " ".join(f"{x / ms[0]:6.3f}" for x in ms[1:]))
    print(f"records: {'every exact field equal to the default, sums within 1e-12' if not bad else ''}")
    for line in bad:
        print("  MISMATCH", line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
