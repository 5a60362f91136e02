"""The grid of the selection's buffer passes (k_sel_buf, cuda/select.cu): device time of
``vgct_ext.compare(a, e)`` with the default p99 on CUDA bf16 / fp32 pairs of 2^14..2^22 elements
for several keys-per-thread settings of the buffer passes (the hook ``vgct_cuda_test_sel_kpt``;
fewer blocks: fewer shared histograms to clear and flush into the global one), alternated rep by
rep in one process.  Prints a table of medians of CUDA-event intervals (us) around the call; the
default (SEL_BUF_KPT) should be the fastest column or close to it.  The selection's one-block finish
(k_sel_fin, which answers most p99s without the buffer passes and reads the buffer on the same grid)
is turned off through its hook ``vgct_cuda_test_fin`` so that the passes run; ``--with-finish``
leaves it on (then the table times the finish's grid instead).

    python bench/bench_selbuf.py [--kpt 8,32,128] [--with-finish]     # on a machine with a CUDA GPU
"""
import argparse
import ctypes
import statistics

import torch

import vgct_ext
from vgct_ext import _C


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kpt", default="8,32,128")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--with-finish", action="store_true", help="leave k_sel_fin on")
    args = ap.parse_args()
    kpts = [int(k) for k in args.kpt.split(",")]
    lib = ctypes.CDLL(_C.__file__)
    hook = ctypes.c_longlong.in_dll(lib, "vgct_cuda_test_sel_kpt")
    fin = ctypes.c_longlong.in_dll(lib, "vgct_cuda_test_fin")
    fin.value = 0 if args.with_finish else 1
    print("case | " + " | ".join(f"kpt {k} us" for k in kpts))
    try:
        for dt in (torch.bfloat16, torch.float32):
            for lg in (14, 16, 18, 20):
                g = torch.Generator(device="cuda").manual_seed(lg)
                e32 = torch.randn(1 << lg, device="cuda", generator=g)
                a = (e32 + 1e-3 * torch.randn(1 << lg, device="cuda", generator=g)).to(dt)
                e = e32.to(dt)
                want = None
                dev = {k: [] for k in kpts}
                for k in kpts:
                    hook.value = k
                    for _ in range(3):
                        got = vgct_ext.compare(a, e).quantiles[0.99]
                    want = got if want is None else want
                    assert got == want, (k, got, want)  # every grid: the same exact p99
                for _ in range(args.reps):
                    for k in kpts:
                        hook.value = k
                        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        t0.record()
                        vgct_ext.compare(a, e)
                        t1.record()
                        t1.synchronize()
                        dev[k].append(t0.elapsed_time(t1) * 1e3)
                print(f"{str(dt)[6:]} 2^{lg} p99 | " + " | ".join(f"{statistics.median(dev[k]):.1f}" for k in kpts),
                      flush=True)
    finally:
        hook.value = 0
        fin.value = 0


if __name__ == "__main__":
    main()
