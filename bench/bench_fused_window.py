"""The exact p99 with its key window counted by the reduction (fused) against the window plan's
own pass over the inputs, on the data shapes of issue #13, on one GPU.

For bench_gpu.py's own pair (``make_pair``, its "exact p99" row) and each shape of
``bench_gpu.p99_shapes`` (2^28 pairs unless ``--log2n``) it prints the median
of CUDA-event timings of four calls in one process:

* ``compare(a, e, quantiles=None)`` -- the reduction alone;
* ``compare(a, e, quantiles=(0.99,))`` as it runs by default ("auto": the window counted by the
  reduction the sparse way -- keying only the pairs that may be at or above it -- or, when the
  sample shows many such keys, k_win_count -- with every pair classified in the fold; the
  column "path" says which: sparse / every / pass; "record" when the
  reduction's record answered every rank -- csrc/vgct_stats.h vgct_rank_known: an identical pair --
  and no window was counted at all);
* the same with the window always counted the sparse way ("sparse": hook value 3) and
  with every pair classified ("every": hook value 4);
* the same with the fusion off ("pass": hook value 1, the window plan reads the inputs again,
  k_sel_window) -- the hook is ``vgct_cuda_test_fuse`` of cuda/reduce.cu, reached through ctypes;

each as milliseconds and as a multiple of the read floor (both inputs' bytes over the device
copy bandwidth, as ``bench_gpu.py``), and the p99 values of the four ways, which must be equal
(it exits with status 1 when they are not; with ``--auto-only`` there is one way and nothing
to compare).  Not a test; a table for docs/performance.md.

    python bench/bench_fused_window.py [--log2n K] [--reps N] [--auto-only] [--no-pass]

``--auto-only`` times the reduction and the default call alone (an A/B of two builds: run it
from each build in turn, alternating, e.g. ``PYTHONPATH=/tmp/base python bench/...``).
``--auto-hook 5`` runs the "auto" column with the automatic choice forced below WIN_FUSE_MIN
(the hook's value 5), to see what lowering the threshold would give.
"""
import argparse
import ctypes
import sys

import torch

import vgct_ext
from bench_gpu import copy_bandwidth, cuda_time, make_pair, p99_shapes  # bench/ is sys.path[0]


def shapes(n):
    """bench_gpu.py's "2^28 bf16, exact p99" pair (make_pair: bf16 e + 1e-2 noise against bf16 e,
    ~80% of the pairs mismatching at the default tolerances), then the p99 shapes."""
    a, e = make_pair((n,), torch.bfloat16)
    yield "bench pair: bf16 e+1e-2 noise vs bf16 e", a, e
    del a, e
    yield from p99_shapes(n)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--log2n", type=int, default=28)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--auto-only", action="store_true",
                    help="only the reduction and the default p99 call (no forced ways)")
    ap.add_argument("--no-pass", action="store_true",
                    help="leave out the window pass's column (hook 1): the fused ways only")
    ap.add_argument("--auto-hook", type=int, default=0, choices=(0, 5),
                    help="the hook value of the 'auto' column: 5 = the automatic choice also "
                         "below WIN_FUSE_MIN (2^25 pairs): what lowering it would give")
    args = ap.parse_args()
    modes = (0,) if args.auto_only else (0, 3, 4) if args.no_pass else (0, 3, 4, 1)
    lib = ctypes.CDLL(vgct_ext._C.__file__)
    off = ctypes.c_longlong.in_dll(lib, "vgct_cuda_test_fuse")
    last = ctypes.c_longlong.in_dll(lib, "vgct_cuda_test_fuse_last")
    known = (ctypes.c_longlong * 2).in_dll(lib, "vgct_cuda_test_known_last")
    bw = copy_bandwidth(31)
    props = torch.cuda.get_device_properties(0)
    print(f"device: {props.name}; copy bandwidth {bw / 1e12:.2f} TB/s; 2^{args.log2n} pairs; "
          f"medians of {args.reps}" + (f"; auto column with hook {args.auto_hook}" if args.auto_hook else ""))
    way = {1: "pass", 3: "sparse", 4: "every"}
    head = (f"{'data':42s} {'floor ms':>8s} {'no q ms':>8s} {'p99 auto':>9s} {'x floor':>7s} {'path':>6s}"
            + "".join(f" {way[k]:>7s} {'x floor':>7s}" for k in modes[1:]))
    print(head)
    bad = 0
    for name, a, e in shapes(1 << args.log2n):
        floor = (a.numel() * a.element_size() + e.numel() * e.element_size()) / bw * 1e3
        noq = cuda_time(lambda: vgct_ext.compare(a, e, quantiles=None), args.reps)[0]
        ms, val, path = {}, {}, "?"
        try:
            for mode in modes:
                off.value = args.auto_hook if mode == 0 else mode
                ms[mode] = cuda_time(lambda: vgct_ext.compare(a, e, quantiles=(0.99,)), args.reps)[0]
                val[mode] = vgct_ext.compare(a, e, quantiles=(0.99,)).p99
                if mode == 0:
                    path = {1: "sparse", 3: "every", 2: "pass"}.get(last.value, "none")
                    if known[1] == 0:  # no rank left to the selection: no window pass ran
                        path = "record"
        finally:
            off.value = 0
        same = len(set(val.values())) == 1
        bad += not same
        rest = "".join(f" {ms[k]:7.3f} {ms[k] / floor:7.2f}" for k in modes[1:])
        print(f"{name:42s} {floor:8.3f} {noq:8.3f} {ms[0]:9.3f} {ms[0] / floor:7.2f} {path:>6s}"
              f"{rest}{'' if same else f'  p99 DIFFERS {val!r}'}", flush=True)
        torch.cuda.empty_cache()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
