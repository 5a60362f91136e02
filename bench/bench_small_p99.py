"""Host wall of a small compare() call on CUDA tensors with its default p99, by data shape and size.

For each n in --sizes (log2 of the pairs) and each data shape, the median host wall (us, from the
Python call to the result) of:
  none      compare(a, e, quantiles=None): the reduction alone;
  p99       compare(a, e): the default quantiles=(0.99,) -- the selection chained behind the
            reduction, one host wait (cuda/select.cu: up to TINY_PREFER = 12288 pairs
            k_sel_tiny, one block; past it k_sel_coop, one cooperative grid);
  coop      the same call with k_sel_coop from one pair on (its test hook vgct_cuda_test_coop =
            2): k_sel_coop against k_sel_tiny where both can run (the same as p99 above 2^14);
  finish    the same call through the level-0 histogram and the one-block finish after it (the
            test hook vgct_cuda_test_fin = 2: the plan of these calls before the chained
            selections, a second host round trip and three launches after the record);
  torch     torch.testing.assert_close(a, e) with a tolerance the pair passes (its cheapest way:
            no failure report built), for scale.
The ways alternate in --rounds rounds of --reps calls each (medians of the round medians), so a
drift of the machine touches them alike.  Data shapes (e from randn):
  ties      bf16(e + 1e-3 noise) vs bf16(e): bf16 rounding, most |d| on a few values;
  noise     bf16(e + 1e-2 noise) vs bf16(e);
  fp32      e + 1e-3 noise vs e, float32;
  identical bf16(e) vs a copy: the record answers p99 (every rank below n - n_unequal is 0).
Prints a ratio table last; --json F writes the medians.

    python bench/bench_small_p99.py [--sizes 6,10,13,14,16,18,20] [--reps 300] [--rounds 5] [--json F]
"""
import argparse
import ctypes
import json
import statistics
import sys

import torch

import vgct_ext
from gpu_diag import wall_us  # bench/ is sys.path[0]
from vgct_ext import _C


def shapes(n, gen):
    e32 = torch.randn(n, device="cuda", generator=gen)
    noise = torch.randn(n, device="cuda", generator=gen)
    eb = e32.to(torch.bfloat16)
    yield "ties", (e32 + 1e-3 * noise).to(torch.bfloat16), eb
    yield "noise", (e32 + 1e-2 * noise).to(torch.bfloat16), eb
    yield "fp32", e32 + 1e-3 * noise, e32
    yield "identical", eb.clone(), eb


def record(rows, lg, name, t):
    """Append the medians of the timings ``t`` (column -> list of us) of one size and data shape
    to ``rows`` and print them (the progress line)."""
    med = {k: statistics.median(v) for k, v in t.items()}
    rows.append({"n": 1 << lg, "lg": lg, "data": name, **med})
    print(f"2^{lg} {name}: " + ", ".join(f"{k} {v:.1f}" for k, v in med.items()), flush=True)


def dump_json(path, rows):
    """The rows, with the device's name, as JSON at ``path`` (nothing when path is None)."""
    if path:
        with open(path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "rows": rows}, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="6,10,13,14,16,18,20")
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    lib = ctypes.CDLL(_C.__file__)
    fin = ctypes.c_longlong.in_dll(lib, "vgct_cuda_test_fin")
    coop = (ctypes.c_longlong * 2).in_dll(lib, "vgct_cuda_test_coop")
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    try:
        for lg in (int(x) for x in args.sizes.split(",")):
            for name, a, e in shapes(1 << lg, gen):
                # every way gives the same quantile, bit for bit (the hook changes the plan only)
                fin.value = 0
                q0 = vgct_ext.compare(a, e).quantiles[0.99]
                fin.value = 2
                q2 = vgct_ext.compare(a, e).quantiles[0.99]
                fin.value = 0
                coop[0] = 2
                q3 = vgct_ext.compare(a, e).quantiles[0.99]
                coop[0] = 0
                if not q0 == q2 == q3:
                    raise SystemExit(f"2^{lg} {name}: p99 {q0!r} (default) != {q2!r} (finish) or "
                                     f"{q3!r} (coop)")
                t = {"none": [], "p99": [], "coop": [], "finish": [], "torch": []}
                for _ in range(args.rounds):
                    fin.value = 0
                    t["none"].append(wall_us(lambda: vgct_ext.compare(a, e, quantiles=None), args.reps))
                    t["p99"].append(wall_us(lambda: vgct_ext.compare(a, e), args.reps))
                    coop[0] = 2
                    t["coop"].append(wall_us(lambda: vgct_ext.compare(a, e), args.reps))
                    coop[0] = 0
                    fin.value = 2
                    t["finish"].append(wall_us(lambda: vgct_ext.compare(a, e), args.reps))
                    fin.value = 0
                    t["torch"].append(wall_us(
                        lambda: torch.testing.assert_close(a, e, rtol=0.0, atol=1.0), args.reps // 4))
                record(rows, lg, name, t)
    finally:
        fin.value = 0
        coop[0] = 0
    print("\n| n | data | none us | p99 us | coop us | finish us | p99 / none | p99 / finish | coop / p99 "
          "| torch assert_close us |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| 2^{r['lg']} | {r['data']} | {r['none']:.1f} | {r['p99']:.1f} | {r['coop']:.1f} | "
              f"{r['finish']:.1f} | {r['p99'] / r['none']:.2f} | {r['p99'] / r['finish']:.2f} | "
              f"{r['coop'] / r['p99']:.2f} | {r['torch']:.1f} |")
    dump_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
