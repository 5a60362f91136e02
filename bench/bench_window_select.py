"""Host wall of compare() with its default p99 where the window plan runs, with and without k_sel_cbuf.

From 1.5M pairs (SEL_CAP) the exact p99 on CUDA tensors takes the window plan (cuda/select.cu): a
sample of ~n/256 keys, its order statistics at the window's sample ranks, one pass that counts the
window and stores the keys inside it (from 2^25 pairs the reduction's own pass), then a selection
among the stored keys. The sample's order statistics and a region of more than 8192 stored keys are
selected by one cooperative grid (k_sel_cbuf) where the device runs it; the hook
vgct_cuda_test_cbuf = 1 selects them through the histogram levels and the one-block finish, as
before it. For each n in --sizes (log2 of the pairs) and each data shape, the median host wall (us,
from the Python call to the result) of:
  none      compare(a, e, quantiles=None): the reduction alone;
  p99       compare(a, e): the default quantiles=(0.99,), k_sel_cbuf on (the default);
  levels    the same call with the hook at 1.
The ways alternate in --rounds rounds of --reps calls each (medians of the round medians), so a drift
of the machine touches them alike; both p99 ways must give the same quantile, bit for bit. Data
shapes (e from randn):
  ties      bf16(e + 1e-3 noise) vs bf16(e): bf16 rounding, the p99 answered by a window's pivot;
  noise     bf16(e + 1e-2 noise) vs bf16(e): the p99 among ~50K stored keys at 2^22;
  fp32      e + 1e-3 noise vs e, float32.
Prints a ratio table last; --json F writes the medians.

    python bench/bench_window_select.py [--sizes 21,22,24,25,28] [--reps 15] [--rounds 5] [--json F]
"""
import argparse
import ctypes
import struct
import sys

import torch

import vgct_ext
from bench_small_p99 import dump_json, record, shapes  # bench/ is sys.path[0]
from gpu_diag import wall_us
from vgct_ext import _C


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="21,22,24,25,28")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    knob = ctypes.c_longlong.in_dll(ctypes.CDLL(_C.__file__), "vgct_cuda_test_cbuf")
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    try:
        for lg in (int(x) for x in args.sizes.split(",")):
            for name, a, e in shapes(1 << lg, gen):
                if name == "identical":  # the record answers: no window plan
                    continue
                knob.value = 0
                q0 = vgct_ext.compare(a, e).quantiles[0.99]
                knob.value = 1
                q1 = vgct_ext.compare(a, e).quantiles[0.99]
                knob.value = 0
                if struct.pack("<d", q0) != struct.pack("<d", q1):
                    raise SystemExit(f"2^{lg} {name}: p99 {q0!r} (k_sel_cbuf) != {q1!r} (levels)")
                t = {"none": [], "p99": [], "levels": []}
                for _ in range(args.rounds):
                    t["none"].append(wall_us(lambda: vgct_ext.compare(a, e, quantiles=None), args.reps))
                    t["p99"].append(wall_us(lambda: vgct_ext.compare(a, e), args.reps))
                    knob.value = 1
                    t["levels"].append(wall_us(lambda: vgct_ext.compare(a, e), args.reps))
                    knob.value = 0
                record(rows, lg, name, t)
    finally:
        knob.value = 0
    print("\n| n | data | none us | p99 us | levels us | p99 / none | levels / none | p99 / levels |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| 2^{r['lg']} | {r['data']} | {r['none']:.1f} | {r['p99']:.1f} | {r['levels']:.1f} | "
              f"{r['p99'] / r['none']:.2f} | {r['levels'] / r['none']:.2f} | {r['p99'] / r['levels']:.3f} |")
    dump_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
