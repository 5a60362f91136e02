"""Latency breakdown of one vgct_ext.compare call on CUDA tensors (where the time goes).

Prints median wall microseconds of: the full Python call, the _C.compare call alone (bridge +
engine), the same on a 1-element CPU tensor (bridge + Python, no engine work), with and without
quantiles, for a few sizes; and a torch launch+sync for scale.  With --ncu-target it instead runs
one compare of 2^26 bf16 pairs (bench_gpu.py's data; --ncu-small: 2^10) (for `ncu --kernel-name regex:k_reduce --launch-count 1`).
With --ncu-shape K [--fuse M] it runs one compare of 2^26 pairs of bench_gpu.p99_shapes' K-th
shape: without quantiles when M is -1 (the default), else with p99 and the fused window's hook
``vgct_cuda_test_fuse`` set to M (3: the sparse way, 4: every pair classified; cuda/reduce.cu).

With --signal-ab it instead prints the host wall of compare with the reduction's end learnt from its
completion word and from a stream synchronisation, alternated in rounds (cuda/reduce.cu
vgct_cuda_test_signal), with torch.testing.assert_close on the same pair beside it.

    python bench/gpu_diag.py [--ncu-target | --ncu-small | --ncu-shape K [--fuse M] | --signal-ab]
"""
import statistics
import sys
import time

import torch

import vgct_ext
from vgct_ext import _C
from vgct_ext.core import _dlpack


def wall_us(fn, reps=200, before=None):
    """Median host wall us of fn() after 20 warm-up calls; before(), when given, runs untimed ahead of each."""
    for _ in range(20):
        fn()
    ts = []
    for _ in range(reps):
        if before is not None:
            before()
        t = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t) * 1e6)
    return statistics.median(ts)


def signal_ab(rounds=7, reps=200):
    """The reduction's end learnt from its completion word (cuda/reduce.cu vgct_cuda_test_signal = 0,
    the default) against a stream synchronisation (= 1): host wall of compare on bf16 pairs (e = a +
    1e-2 noise, rounded), medians of `rounds` alternating rounds, each the median of `reps` calls;
    torch.testing.assert_close on the same pair beside it, with a tolerance the pair passes (atol=1: no
    failure report built). Prints a ratio table."""
    import ctypes
    hook = ctypes.c_longlong.in_dll(ctypes.CDLL(_C.__file__), "vgct_cuda_test_signal")
    print("| bf16 pairs | quantiles | synchronise us | completion word us | word / sync | "
          "torch.testing.assert_close us |\n|---:|---|---:|---:|---:|---:|")
    try:
        for lg in (10, 16, 20, 22):
            e32 = torch.randn(1 << lg, device="cuda")
            a = (e32 + 1e-2 * torch.randn_like(e32)).to(torch.bfloat16)
            e = e32.to(torch.bfloat16)
            for q in (None, (0.99,)):
                t = {0: [], 1: []}
                for _ in range(rounds):
                    for mode in (1, 0):
                        hook.value = mode
                        t[mode].append(wall_us(lambda: vgct_ext.compare(a, e, quantiles=q), reps))
                hook.value = 0
                w, y = statistics.median(t[0]), statistics.median(t[1])
                tc = ""
                if q is None:  # a passing tolerance: torch's cheapest way, no failure report
                    tc = f"{wall_us(lambda: torch.testing.assert_close(a, e, rtol=0.0, atol=1.0), 50):.1f}"
                print(f"| 2^{lg} | {'p99' if q else 'none'} | {y:.1f} | {w:.1f} | {w / y:.3f} | {tc} |",
                      flush=True)
    finally:
        hook.value = 0
    return 0


def main():
    if "--trace" in sys.argv:  # run with VGCT_CUDA_TRACE=1: per-step host times on stderr
        for lg in (20, 24):
            a = torch.randn(1 << lg, device="cuda").to(torch.bfloat16)
            e = (a.float() + 1e-2).to(torch.bfloat16)
            for q in (None, (0.99,)):
                for _ in range(4):
                    vgct_ext.compare(a, e, quantiles=q)
                print(f"-- 2^{lg} quantiles={q}: last 4 calls above", file=sys.stderr, flush=True)
        return 0
    if "--ncu-small" in sys.argv:  # one 2^10 compare with p99: the fixed cost of each kernel
        a = torch.randn(1 << 10, device="cuda").to(torch.bfloat16)
        e = (a.float() + 1e-2).to(torch.bfloat16)
        for _ in range(3):
            vgct_ext.compare(a, e, quantiles=(0.99,))
        torch.cuda.synchronize()
        return 0
    if "--ncu-shape" in sys.argv:
        import ctypes
        from bench_gpu import p99_shapes  # bench/ is sys.path[0]
        k = int(sys.argv[sys.argv.index("--ncu-shape") + 1])
        m = int(sys.argv[sys.argv.index("--fuse") + 1]) if "--fuse" in sys.argv else -1
        name, a, e = next(s for i, s in enumerate(p99_shapes(1 << 26)) if i == k)
        print(f"ncu target: {name}, fuse hook {m}", flush=True)
        if m >= 0:
            ctypes.c_longlong.in_dll(ctypes.CDLL(_C.__file__), "vgct_cuda_test_fuse").value = m
        vgct_ext.compare(a, e, quantiles=None if m < 0 else (0.99,))
        torch.cuda.synchronize()
        return 0
    if "--ncu-target" in sys.argv:
        e32 = torch.randn(1 << 26, device="cuda")
        a = (e32 + 1e-2 * torch.randn_like(e32)).to(torch.bfloat16)  # bench_gpu.py's pairs
        e = e32.to(torch.bfloat16)
        vgct_ext.compare(a, e, quantiles=None)
        torch.cuda.synchronize()
        vgct_ext.compare(a, e, quantiles=(0.99,))
        torch.cuda.synchronize()
        return 0
    if "--signal-ab" in sys.argv:
        return signal_ab()
    x = torch.randn(1, device="cuda")
    print(f"torch x.sum().item() (launch + sync): {wall_us(lambda: x.sum().item()):.1f} us")
    one = torch.ones(1)
    print(f"CPU 1 element, vgct_ext.compare no quantiles: "
          f"{wall_us(lambda: vgct_ext.compare(one, one, quantiles=None)):.1f} us; "
          f"_C.compare: {wall_us(lambda: _C.compare(one, one, 1e-3, 1e-3, (), None, None, None, None)):.1f} us")
    for lg in (10, 16, 20, 24):
        a = torch.randn(1 << lg, device="cuda").to(torch.bfloat16)
        e = (a.float() + 1e-2 * torch.randn(1 << lg, device="cuda")).to(torch.bfloat16)
        st = _dlpack.consumer_stream(a, e)
        full0 = wall_us(lambda: vgct_ext.compare(a, e, quantiles=None))
        c0 = wall_us(lambda: _C.compare(a, e, 1e-3, 1e-3, (), None, st, None, None))
        full1 = wall_us(lambda: vgct_ext.compare(a, e, quantiles=(0.99,)))
        c1 = wall_us(lambda: _C.compare(a, e, 1e-3, 1e-3, (0.99,), None, st, None, None))
        fp = wall_us(lambda: vgct_ext.fingerprint(a))
        print(f"2^{lg} bf16: compare {full0:.1f} us (_C {c0:.1f}); with p99 {full1:.1f} us "
              f"(_C {c1:.1f}); fingerprint {fp:.1f} us", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
