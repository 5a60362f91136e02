"""Where the device time of a small vgct_ext.compare goes: every kernel, memset and copy of a few
calls, timed by the CUDA profiler (CUPTI through torch.profiler), per call.

For each case (bf16 pairs of 2^10 / 2^16 / 2^20 / 2^22 elements, e = a + noise rounded to bf16, with and
without the default p99) it prints the mean device duration of each activity name per call, the device
span of one call (first activity start to last activity end) and the host wall time of the call. Not a
test; a diagnostic for issue #13's small-call rows (docs/performance.md).

With --timeline it also prints the last call's activities in order: start offset from the call's first
activity, duration, and the idle gap before each (where the device waited for the host).

With --shapes K it instead profiles the default p99 call on bench_gpu's own pair (its "bf16, exact
p99" row) and each data shape of bench_gpu.p99_shapes (issue #13's large rows) at 2^K pairs (--only
SUBSTRING: the shapes whose name holds it): the device time of each kernel a call, the device span and busy
time, and the host wall time beside the same call without quantiles -- where the exact p99's cost
over the reduction goes (the sample, the reduction with the fused window, the window's finish).

With --fin-table it instead times the p99 call with the selection's one-block finish (cuda/select.cu
k_sel_fin) off, on after the level-0 histogram, and as the code chooses (the default: for at most
16384 pairs, k_sel_tiny chained behind the reduction) -- its test hook vgct_cuda_test_fin 1, 2, 0,
through ctypes -- on three data shapes -- bf16
rounding noise (ties), bf16 with 1e-2 noise (a few dozen values in the p99's bucket), fp32 noise (all
distinct) -- and prints one table: host wall and device busy time per call, and their ratios.

    python bench/gpu_kernels.py [--sizes 10,20] [--reps 5] [--timeline] [--fin-table] [--shapes 28 [--only S]]
"""
import argparse
import collections
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

import vgct_ext


def short(name):
    name = name.split("(")[0]
    for pre in ("void ", "Memset", "Memcpy"):
        if name.startswith(pre):
            return name if pre != "void " else name[5:]
    return name[:60]


def one_case(a, e, q, reps):
    for _ in range(10):
        vgct_ext.compare(a, e, quantiles=q)
    torch.cuda.synchronize()
    walls = []
    sep = torch.zeros(1, device="cuda", dtype=torch.int64)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            sep.bitwise_not_()  # a marker kernel between calls
            torch.cuda.synchronize()
            t = time.perf_counter()
            vgct_ext.compare(a, e, quantiles=q)
            walls.append((time.perf_counter() - t) * 1e6)
        sep.bitwise_not_()
        torch.cuda.synchronize()
    evs = [ev for ev in prof.events() if ev.device_type == torch.autograd.DeviceType.CUDA]
    evs.sort(key=lambda ev: ev.time_range.start)
    per = collections.defaultdict(list)
    spans, cur, last = [], [], []
    for ev in evs:
        if "bitwise_not" in ev.name:
            if cur:
                spans.append(max(x.time_range.end for x in cur) - cur[0].time_range.start)
                last = cur
            cur = []
            continue
        cur.append(ev)
        per[short(ev.name)].append(ev.time_range.end - ev.time_range.start)
    span = statistics.median(spans) if spans else 0.0
    return per, span, statistics.median(walls), last




def _fin_hooks():
    """k_sel_fin's test hooks (cuda/select.cu): the off switch and the last call's counts."""
    import ctypes

    from vgct_ext import _C

    lib = ctypes.CDLL(_C.__file__)
    return (ctypes.c_longlong.in_dll(lib, "vgct_cuda_test_fin"),
            (ctypes.c_longlong * 7).in_dll(lib, "vgct_cuda_test_fin_last"))


def fin_table(sizes, reps):
    """The p99 call with k_sel_fin off (the four histogram levels) and on, per data shape."""
    hook, last = _fin_hooks()
    rows = []
    for lg in sizes:
        n = 1 << lg
        e32 = torch.randn(n, device="cuda")
        noise = torch.randn(n, device="cuda")
        cases = {"bf16 rounding (1e-3)": ((e32 + 1e-3 * noise).to(torch.bfloat16), e32.to(torch.bfloat16)),
                 "bf16 1e-2 noise": ((e32 + 1e-2 * noise).to(torch.bfloat16), e32.to(torch.bfloat16)),
                 "fp32 1e-3 noise": (e32 + 1e-3 * noise, e32)}
        for name, (a, e) in cases.items():
            res = []
            for knob in (1, 2, 0):  # levels; the finish after level 0; the default
                hook.value = knob
                per, span, wall, _ = one_case(a, e, (0.99,), reps)
                res.append((wall, sum(sum(v) for v in per.values()) / reps))
            hook.value = 0
            how = "/".join(str(v) for v in last[1:])
            rows.append((f"2^{lg}", name, res, how))
            for k, v in sorted(per.items(), key=lambda kv: -sum(kv[1])):  # the default
                print(f"   2^{lg} {name}: {sum(v) / reps:8.1f} us  x{len(v) / reps:4.1f}  {k}")
    print("| n | data | wall: levels / finish after level 0 / default | device: levels / finish after "
          "level 0 / default | default vs levels, wall / device | "
          "ties/selected/levels/direct/level-1/k_sel_tiny batches |")
    print("|---|---|---|---|---:|---|")
    for n, name, res, how in rows:
        (w0, d0), (w1, d1), (w2, d2) = res
        print(f"| {n} | {name} | {w0:.1f} / {w1:.1f} / {w2:.1f} us | {d0:.1f} / {d1:.1f} / {d2:.1f} us | "
              f"{w0 / w2:.2f} / {d0 / d2:.2f} | {how} |")


def print_timeline(last):
    """One call's activities in order: start offset, duration, idle gap before each (us)."""
    t0, prev = last[0].time_range.start, last[0].time_range.start
    print("   timeline of one call: start, duration, idle before (us)")
    for ev in last:
        r = ev.time_range
        print(f"   {r.start - t0:8.1f} {r.end - r.start:8.1f} {max(0.0, r.start - prev):8.1f}  "
              f"{short(ev.name)}")
        prev = max(prev, r.end)


def _bench_shapes(n):
    """bench_gpu's own pair (its "bf16, exact p99" row: bf16 of e + 1e-2 noise against bf16 e),
    then bench_gpu.p99_shapes."""
    from bench_gpu import make_pair, p99_shapes  # bench/ is sys.path[0]

    a, e = make_pair((n,), torch.bfloat16)
    yield "bench pair: bf16(e+1e-2 noise) vs bf16(e)", a, e
    a = e = None  # (the caller's loop still holds the pair until its next one)
    yield from p99_shapes(n)


def shapes_table(lg, reps, timeline=False, only=None):
    """Per-kernel device time of the default p99 call on bench_gpu's pair and p99_shapes at
    2^lg pairs (only: the shapes whose name holds this substring)."""
    for name, a, e in _bench_shapes(1 << lg):
        if only and only not in name:
            continue
        per, span, wall, last = one_case(a, e, (0.99,), reps)
        _, _, wall0, _ = one_case(a, e, None, reps)
        busy = sum(sum(v) for v in per.values()) / reps
        print(f"== 2^{lg} {name}: p99 host wall {wall:.0f} us (no quantiles {wall0:.0f}), device busy "
              f"{busy:.0f} us, span {span:.0f} us a call")
        for k, v in sorted(per.items(), key=lambda kv: -sum(kv[1])):
            print(f"   {sum(v) / reps:8.1f} us  x{len(v) / reps:4.1f}  {k}")
        if timeline and last:
            print_timeline(last)
        del a, e
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10,16,20,22")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--timeline", action="store_true", help="the last call's activities in order")
    ap.add_argument("--fin-table", action="store_true", help="the p99 call with k_sel_fin off and on")
    ap.add_argument("--shapes", type=int, default=0, metavar="K",
                    help="the p99 call's kernels on bench_gpu's pair and p99_shapes at 2^K pairs")
    ap.add_argument("--only", default=None, help="with --shapes: the shapes whose name holds this")
    args = ap.parse_args()
    print(f"# {torch.cuda.get_device_name()}  torch {torch.__version__}")
    if args.shapes:
        shapes_table(args.shapes, args.reps, args.timeline, args.only)
        return
    if args.fin_table:
        fin_table([int(s) for s in args.sizes.split(",")], args.reps)
        return
    for lg in [int(s) for s in args.sizes.split(",")]:
        e32 = torch.randn(1 << lg, device="cuda")
        a = (e32 + 1e-3 * torch.randn_like(e32)).to(torch.bfloat16)
        e = e32.to(torch.bfloat16)
        for q in (None, (0.99,)):
            per, span, wall, last = one_case(a, e, q, args.reps)
            tot = sum(sum(v) for v in per.values()) / args.reps
            print(f"== 2^{lg} bf16 quantiles={q}: host wall {wall:.1f} us (median), device busy {tot:.1f} "
                  f"us a call, device span of a call {span:.1f} us (first start to last end)")
            for k, v in sorted(per.items(), key=lambda kv: -sum(kv[1])):
                print(f"   {sum(v) / args.reps:8.1f} us  x{len(v) / args.reps:4.1f}  "
                      f"mean {statistics.mean(v):7.1f}  {k}")
            if args.timeline and last:
                print_timeline(last)


if __name__ == "__main__":
    main()
