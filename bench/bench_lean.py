"""Where the small-input reduce (VG_MODE_LEAN, ``k_reduce_lean``) stops paying: the
device time of ``vgct_ext.compare(a, e, quantiles=None)`` on CUDA bf16 / fp32 pairs of
2^10..2^26 elements, contiguous and transposed, with every input reduced by the lean kernel
and with none (the fast-path kernels), switched in one process through the reduce's hook
``vgct_cuda_test_lean_max`` (cuda/reduce.cu) and alternated rep by rep, so both modes see
the same clocks.  Prints a ratio table; the default threshold (``VG_LEAN_MAX``) is the
crossover it shows.  Time: medians of CUDA-event intervals around the call (compare returns
after its own synchronisation), and of the host wall clock.

    python bench/bench_lean.py [--json out.json]      # on a machine with a CUDA GPU
"""
import ctypes
import json
import statistics
import sys
import time

import torch

import vgct_ext
from vgct_ext import _C


def main():
    hook = ctypes.c_longlong.in_dll(ctypes.CDLL(_C.__file__), "vgct_cuda_test_lean_max")
    modes = {"lean": 1 << 62, "fast": 0}
    rows = []
    try:
        for dt in (torch.bfloat16, torch.float32):
            for lg in range(10, 27, 2):
                n = 1 << lg
                g = torch.Generator(device="cuda").manual_seed(lg)
                e32 = torch.randn(n, device="cuda", generator=g)
                a = (e32 + 1e-2 * torch.randn(n, device="cuda", generator=g)).to(dt)
                e = e32.to(dt)
                for lay in ("contiguous", "transposed"):
                    x, y = (a, e) if lay == "contiguous" else (
                        a.view(1 << (lg // 2), -1).t(), e.view(1 << (lg // 2), -1).t())
                    reps = 60 if lg <= 20 else 15
                    dev = {m: [] for m in modes}
                    wall = {m: [] for m in modes}
                    for m, v in modes.items():  # warm-up, each mode
                        hook.value = v
                        for _ in range(3):
                            vgct_ext.compare(x, y, quantiles=None)
                    for _ in range(reps):
                        for m, v in modes.items():
                            hook.value = v
                            t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                            w = time.perf_counter()
                            t0.record()
                            vgct_ext.compare(x, y, quantiles=None)
                            t1.record()
                            t1.synchronize()
                            wall[m].append((time.perf_counter() - w) * 1e6)
                            dev[m].append(t0.elapsed_time(t1) * 1e3)
                    rows.append({"case": f"{str(dt)[6:]} 2^{lg} {lay}",
                                 **{f"{m}_us": statistics.median(dev[m]) for m in modes},
                                 **{f"{m}_wall_us": statistics.median(wall[m]) for m in modes}})
    finally:
        hook.value = -1
    print(f"{'case':30s} {'lean us':>8s} {'fast us':>8s} {'fast/lean':>9s} {'lean wall':>9s} {'fast wall':>9s}")
    for r in rows:
        print(f"{r['case']:30s} {r['lean_us']:8.1f} {r['fast_us']:8.1f} {r['fast_us'] / r['lean_us']:9.2f} "
              f"{r['lean_wall_us']:9.1f} {r['fast_wall_us']:9.1f}")
    if "--json" in sys.argv:
        with open(sys.argv[sys.argv.index("--json") + 1], "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
