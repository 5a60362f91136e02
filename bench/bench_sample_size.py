"""The window plan's sample size (cuda/select.cu WIN_SMAX, 2^20 keys) against smaller samples, for
the exact p99 at 2^28 pairs, on one GPU.

A sample of K keys costs its own read, its level-0 histogram and, on data without ties, a
selection in its p99 bucket by ONE block (k_sel_fin: 16-23 us a call at K = 2^20 on an H200
since the radix selection replaced the sort, 37-69 us before); the window it predicts is
~sqrt(2) wider in keys each time K halves, which the reduction counts and the window's region
finish selects in.  Which wins is measured, not argued: for each shape of
``bench_gpu.p99_shapes`` it times ``compare(a, e, quantiles=(0.99,))`` with the sample forced to
K keys through the test hook ``vgct_cuda_test_sel[1]`` (0: the default, min(n / 256, WIN_SMAX)),
the sizes in alternating rounds (this card's run-to-run spread is up to ~15%: docs/performance.md),
and prints each round's median of CUDA-event timings in ms and as a multiple of the read floor,
then one row per shape of ratios to the default.  The p99 values of every size must be equal (it
exits with status 1 when they are not).  Not a test; a table for docs/performance.md.

    python bench/bench_sample_size.py [--log2n K] [--reps N] [--rounds R] [--sizes 0,19,18]
"""
import argparse
import ctypes
import statistics
import sys

import torch

import vgct_ext
from bench_gpu import copy_bandwidth, cuda_time, p99_shapes  # bench/ is sys.path[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--log2n", type=int, default=28)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--sizes", default="0,19,18",
                    help="log2 of the forced sample keys; 0 = the default plan")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    lib = ctypes.CDLL(vgct_ext._C.__file__)
    sel = (ctypes.c_longlong * 4).in_dll(lib, "vgct_cuda_test_sel")
    bw = copy_bandwidth(31)
    props = torch.cuda.get_device_properties(0)
    print(f"device: {props.name}; copy bandwidth {bw / 1e12:.2f} TB/s; 2^{args.log2n} pairs; "
          f"medians of {args.reps}, {args.rounds} alternating rounds")
    cols = ["default" if s == 0 else f"K=2^{s}" for s in sizes]
    print(f"{'data':50s} {'floor ms':>8s} " + " ".join(f"{c:>15s}" for c in cols))
    bad = 0
    summary = []
    for name, a, e in p99_shapes(1 << args.log2n):
        floor = (a.numel() * a.element_size() + e.numel() * e.element_size()) / bw * 1e3
        ms = {s: [] for s in sizes}
        val = {}
        try:
            for _ in range(args.rounds):
                for s in sizes:
                    sel[1] = 0 if s == 0 else 1 << s
                    ms[s].append(cuda_time(lambda: vgct_ext.compare(a, e, quantiles=(0.99,)),
                                           args.reps)[0])
                    val[s] = vgct_ext.compare(a, e, quantiles=(0.99,)).p99
        finally:
            sel[1] = 0
        for r in range(args.rounds):
            print(f"{name if r == 0 else '':50s} {floor:8.3f} " +
                  " ".join(f"{ms[s][r]:7.3f} ({ms[s][r] / floor:4.2f}x)" for s in sizes), flush=True)
        same = len(set(val.values())) == 1
        bad += not same
        if not same:
            print(f"  p99 DIFFERS {val!r}")
        base = statistics.mean(ms[sizes[0]])
        summary.append((name, [statistics.mean(ms[s]) / base for s in sizes]))
        torch.cuda.empty_cache()
    print(f"\nmean over rounds, ratio to {cols[0]}")
    for name, rs in summary:
        print(f"{name:50s} " + " ".join(f"{r:15.3f}" for r in rs))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
