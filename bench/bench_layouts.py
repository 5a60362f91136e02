"""Device time of ``vgct_ext.compare`` (no quantiles) by memory layout, on one GPU.

For float32 and bfloat16 pairs of 2^27 elements (``e ~ N(0, 1)``, ``a = e + 1e-3 N(0, 1)``, both
rounded to the dtype) it prints the median of 30 CUDA-event timings of three calls:

* per-channel statistics of a latent ``(2, 16, 128, 128, 256)`` with ``dim=1`` (row mode);
* mixed layouts: ``a`` column-major, ``e`` row-major, as 2-D ``(2^15, 2^12)`` views of the same
  values (the general kernel's strided element reads);
* both contiguous (the bulk-copy ring kernel).

Not a test; a layout table for issue #13 (docs/performance.md). To compare two builds, run it
on each (e.g. before and after a change to cuda/) on the same machine.

    python bench/bench_layouts.py [label]
"""
import sys

import torch

import vgct_ext
from bench_gpu import cuda_time  # bench/ is sys.path[0] when this script runs


def median_ms(fn, reps=30):
    """Median device ms of ``fn`` over ``reps`` CUDA-event timings (bench_gpu.py's timer)."""
    return cuda_time(fn, reps, warmup=3)[0]


def main():
    label = sys.argv[1] if len(sys.argv) > 1 else ""
    g = torch.Generator(device="cuda")
    g.manual_seed(1)
    print(f"{'label':8s} {'dtype':15s} {'latent dim=1 ms':>16s} {'mixed layouts ms':>17s} {'contiguous ms':>14s}")
    for dt in (torch.float32, torch.bfloat16):
        e = torch.randn(2, 16, 128, 128, 256, generator=g, device="cuda")
        a = (e + 1e-3 * torch.randn(e.shape, generator=g, device="cuda")).to(dt)
        e = e.to(dt)
        latent = median_ms(lambda: vgct_ext.compare(a, e, quantiles=None, dim=1))
        e2 = e.reshape(-1, 1 << 12)
        a2 = a.reshape(-1, 1 << 12).t().contiguous().t()  # same values, column-major
        mixed = median_ms(lambda: vgct_ext.compare(a2, e2, quantiles=None))
        contiguous = median_ms(lambda: vgct_ext.compare(a, e, quantiles=None))
        print(f"{label:8s} {str(dt):15s} {latent:16.3f} {mixed:17.3f} {contiguous:14.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
