"""Device time of ``vgct_ext.compare`` at 2^28 pairs by layout: the layouts the ring kernel
reads (cuda/reduce.cu ``ring_layout``) beside the flat run and a layout it leaves to the
general kernel, for an A/B of two builds.

Cases (bf16 and fp32, ``e ~ N(0, 1)``, ``a = e + 1e-2 N(0, 1)``, both rounded; no quantiles
unless said): contiguous (the flat ring), a transposed 2^14 x 2^14 matrix (two inner axes,
one memory run), a latent ``(2, 16, 256, 128, 256)`` with ``dim=1`` (row mode: 16 slices of
two rows), the channels of an NCHW tensor read as NHWC with ``dim=3`` (row mode, two inner
axes a slice), and the same NHWC view without ``dim`` (three inner axes: the general kernel);
bf16 also with the exact p99. Times: medians of 15 CUDA-event intervals around the call.

One build per process (the extension is imported once), so an A/B runs the script once per
build, alternately, and compares the files:

    PYTHONPATH=<base tree> python bench/bench_ring_layouts.py --json base1.json
    PYTHONPATH=<new tree>  python bench/bench_ring_layouts.py --json new1.json
    ... (two or three rounds)
    python bench/bench_ring_layouts.py --compare base1.json,base2.json new1.json,new2.json

``--compare`` prints each case's times per round and the ratio of the medians (new / base).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys


def measure(log2n, reps):
    import torch

    import vgct_ext
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    import bench_gpu  # noqa: E402  (make_pair, cuda_time: the project's timer)

    def t(fn):  # median device ms of CUDA events around fn(), after two warm-up calls
        return bench_gpu.cuda_time(fn, reps)[0]

    n = 1 << log2n
    side = 1 << (log2n // 2)
    latent = (2, 16, 1 << (log2n - 20), 128, 256)
    nchw = (16, 64, 1 << ((log2n - 10) // 2), 1 << (log2n - 10 - (log2n - 10) // 2))
    rows = {}

    def one_dtype(dt):  # (its tensors freed on return)
        a, e = bench_gpu.make_pair(n, dt)
        cases = [("contiguous", a, e, None),
                 ("transposed", a.view(side, -1).t(), e.view(side, -1).t(), None),
                 ("latent, dim=1", a.view(latent), e.view(latent), 1),
                 ("NHWC view, dim=3", a.view(nchw).permute(0, 2, 3, 1), e.view(nchw).permute(0, 2, 3, 1), 3),
                 ("NHWC view (3 axes)", a.view(nchw).permute(0, 2, 3, 1), e.view(nchw).permute(0, 2, 3, 1),
                  None)]
        for name, x, y, dim in cases:
            for q in (None, (0.99,)):
                if q and (dt == torch.float32 or dim is not None):
                    continue
                key = f"{str(dt)[6:]} {name}{', p99' if q else ''}"
                rows[key] = t(lambda: vgct_ext.compare(x, y, quantiles=q, dim=dim))
                print(f"  {key:36s} {rows[key]:8.3f} ms", flush=True)

    for dt in (torch.bfloat16, torch.float32):
        one_dtype(dt)
        torch.cuda.empty_cache()
    return rows


def compare(base_files, new_files):
    def load(files):
        return [json.load(open(f))["rows"] for f in files]
    base, new = load(base_files), load(new_files)
    print(f"2^{json.load(open(base_files[0]))['log2n']} pairs, device ms per round; "
          f"ratio = median(new) / median(base)")
    print(f"{'case':36s} {'base':>24s} {'new':>24s} {'ratio':>6s}")
    for key in base[0]:
        b = [r[key] for r in base if key in r]
        m = [r[key] for r in new if key in r]
        if not b or not m:
            continue
        print(f"{key:36s} {' / '.join(f'{x:.3f}' for x in b):>24s} "
              f"{' / '.join(f'{x:.3f}' for x in m):>24s} {statistics.median(m) / statistics.median(b):6.3f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--log2n", type=int, default=28)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--json", default=None)
    ap.add_argument("--compare", nargs=2, metavar=("BASE,..", "NEW,.."), default=None)
    args = ap.parse_args()
    if args.log2n < 20 or args.log2n % 2:
        ap.error("--log2n: an even number >= 20 (the latent and square shapes)")
    if args.compare:
        compare(args.compare[0].split(","), args.compare[1].split(","))
        return 0
    import torch
    if not torch.cuda.is_available():
        print("bench_ring_layouts.py: no CUDA device", file=sys.stderr)
        return 2
    rows = measure(args.log2n, args.reps)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"log2n": args.log2n, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
