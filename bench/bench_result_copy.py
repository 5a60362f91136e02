"""The reduction's result record written into the mapped pinned buffer against the record copied back
from the device workspace (cudaMemcpyAsync), on small calls: host wall per ``vgct_ext.compare`` of bf16
``e + 1e-3`` noise against ``e`` at 2^10..2^22 pairs, with and without the default p99.

The two ways are switched through the test hook ``vgct_cuda_test_mapped`` of cuda/reduce.cu (ctypes;
1 = copied, 0 = mapped, the default) and alternated in rounds, so both see the same machine state; each
cell is the best of three rounds of a median of 200 calls.  Not a test; a table for docs/performance.md.

    python bench/bench_result_copy.py [--rounds 3] [--reps 200]
"""
import argparse
import ctypes

import torch

import vgct_ext
from gpu_diag import wall_us  # bench/ is sys.path[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=200)
    args = ap.parse_args()
    hook = ctypes.c_longlong.in_dll(ctypes.CDLL(vgct_ext._C.__file__), "vgct_cuda_test_mapped")
    x = torch.randn(1024, device="cuda")
    print(f"# {torch.cuda.get_device_name()}; torch x.sum().item(): "
          f"{wall_us(lambda: x.sum().item(), args.reps):.1f} us")
    print("| n | quantiles | copied us | mapped us | copied / mapped |")
    print("|---|---|---:|---:|---:|")
    try:
        for lg in (10, 16, 20, 22):
            e32 = torch.randn(1 << lg, device="cuda")
            a = (e32 + 1e-3 * torch.randn_like(e32)).to(torch.bfloat16)
            e = e32.to(torch.bfloat16)
            for q in (None, (0.99,)):
                res = {0: [], 1: []}
                for _ in range(args.rounds):
                    for mode in (1, 0):
                        hook.value = mode
                        res[mode].append(wall_us(lambda: vgct_ext.compare(a, e, quantiles=q), args.reps))
                copied, mapped = min(res[1]), min(res[0])
                print(f"| 2^{lg} | {q or 'none'} | {copied:.1f} | {mapped:.1f} | {copied / mapped:.2f} |",
                      flush=True)
    finally:
        hook.value = 0


if __name__ == "__main__":
    main()
