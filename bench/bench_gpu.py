"""GPU benchmark of vgct_ext.compare against torch's composite, with a ratio table last.

For each case of issue [B]'s speed goals: the same tensors go through
``vgct_ext.compare`` (one fused pass; exact quantiles by radix selection) and
through the torch composite that computes the same statistics (float64
elementwise ops, masked reductions, ``kthvalue`` for the exact p99, since
``torch.quantile`` refuses more than 2^24 elements).  Times are medians of
CUDA-event intervals around the call (``compare`` returns only once its result
record is on the host, so the interval holds all its device work) and of the
host wall clock.  The read floor of a case is the bytes of both inputs over the
device copy bandwidth measured here (a large device-to-device copy, bytes read
plus written, as in METHOD.md): no implementation reading both inputs once can
beat it.

    python bench/bench_gpu.py [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

import vgct_ext


def cuda_time(fn, reps, warmup=2):
    """Median ms over reps of CUDA events around fn(), and median host wall ms."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ev, wall = [], []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        s.record()
        fn()
        e.record()
        e.synchronize()
        wall.append((time.perf_counter() - t0) * 1e3)
        ev.append(s.elapsed_time(e))
    return statistics.median(ev), statistics.median(wall)


def copy_bandwidth():
    """Device copy bandwidth in bytes/s (read + write), 4 GiB buffers."""
    n = 1 << 31
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    ms, _ = cuda_time(lambda: dst.copy_(src), reps=10)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n / (ms * 1e-3)


def torch_composite(a, e, rtol=1e-3, atol=1e-3, dim=None):
    """What the same statistics cost in plain torch (float64, without quantiles)."""
    a64, e64 = a.double(), e.double()
    fin = torch.isfinite(a64) & torch.isfinite(e64)
    af, ef = torch.where(fin, a64, 0.0), torch.where(fin, e64, 0.0)
    d = af - ef
    ad, ae = d.abs(), ef.abs()
    out = [torch.linalg.vector_norm(d), torch.linalg.vector_norm(ef), torch.linalg.vector_norm(af),
           (af * ef).sum(), d.sum(), fin.sum()]
    mx = torch.where(fin, ad, -1.0).flatten()
    out.append(mx.max())
    out.append(mx.argmax())
    rel = torch.where(fin & (ef != 0), ad / ae, -1.0).flatten()
    out += [rel.max(), rel.argmax(), ae.max()]
    tol = atol + rtol * ae
    mm = fin & (ad > tol)
    out += [mm.sum(), torch.where(mm, ad - tol, -1.0).flatten().argmax()]
    out.append(((a64 != e64) & ~(torch.isnan(a64) & torch.isnan(e64))).sum())
    for x in (a64, e64):
        out += [torch.isnan(x).sum(), torch.isposinf(x).sum(), torch.isneginf(x).sum()]
    if dim is not None:
        r = [k for k in range(a.dim()) if k != dim]
        out += [d.sum(dim=r), (d * d).sum(dim=r), (ef * ef).sum(dim=r), ad.amax(dim=r),
                fin.sum(dim=r)]
    return out


def torch_p99(a, e):
    d = (a.double() - e.double()).abs().flatten()
    k = max(1, int(round(0.99 * (d.numel() - 1))) + 1)
    return torch.kthvalue(d, k).values


def make_pair(shape, dtype, seed=0):
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    e = torch.randn(shape, generator=g, device="cuda", dtype=torch.float32)
    a = e + torch.randn(shape, generator=g, device="cuda", dtype=torch.float32) * 1e-2
    return a.to(dtype), e.to(dtype)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="2^26 instead of 2^28 elements")
    ap.add_argument("--json", default=None)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--no-torch", action="store_true", help="skip the torch composite")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA device", file=sys.stderr)
        return 2
    info = vgct_ext.build_info()
    if not info.get("cuda_compiled"):
        print("bench_gpu: vgct_ext built without CUDA", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(0)
    bw = copy_bandwidth()
    print(f"device: {props.name}, {props.multi_processor_count} SMs, "
          f"{props.total_memory / 2**30:.0f} GiB; copy bandwidth {bw / 1e12:.2f} TB/s "
          f"(read+write); torch {torch.__version__}; vgct_ext {info.get('version')}", flush=True)
    lg = 26 if args.quick else 28
    N = 1 << lg
    rows = []

    def case(name, a, e, goal, goal_kind, quantiles=None, dim=None, torch_fn=None, torch_reps=3):
        nbytes = a.numel() * a.element_size() + e.numel() * e.element_size()
        floor_ms = nbytes / bw * 1e3
        ms, wall = cuda_time(lambda: vgct_ext.compare(a, e, quantiles=quantiles, dim=dim),
                             reps=args.reps)
        tms = None
        if torch_fn is not None and not args.no_torch:
            try:
                tms, _ = cuda_time(torch_fn, reps=torch_reps, warmup=1)
            except torch.OutOfMemoryError:
                tms = None
            torch.cuda.empty_cache()
        frac = floor_ms / ms
        if goal_kind == "frac":
            met = frac >= goal
            goal_s = f">= {goal:.0%} of floor"
        elif goal_kind == "xfloor":
            met = ms <= goal * floor_ms
            goal_s = f"<= {goal:g}x floor"
        else:  # microseconds, wall clock end to end
            met = wall * 1e3 <= goal
            goal_s = f"<= {goal:g} us wall"
        row = dict(case=name, n=a.numel(), dtype=str(a.dtype).replace("torch.", ""),
                   bytes=nbytes, floor_ms=floor_ms, vgct_ms=ms, vgct_wall_ms=wall,
                   frac_of_floor=frac, torch_ms=tms, goal=goal_s, met=bool(met))
        rows.append(row)
        print(f"  {name}: vgct {ms:.3f} ms (wall {wall:.3f}), floor {floor_ms:.3f} ms, "
              f"{frac:.0%} of floor, torch {'-' if tms is None else f'{tms:.2f} ms'}: "
              f"{'MET' if met else 'missed'} ({goal_s})", flush=True)
        return row

    a, e = make_pair((N,), torch.bfloat16)
    case(f"2^{lg} bf16, no quantiles", a, e, 0.90, "frac",
         torch_fn=lambda: torch_composite(a, e))
    case(f"2^{lg} bf16, exact p99", a, e, 3.0, "xfloor", quantiles=(0.99,),
         torch_fn=lambda: (torch_composite(a, e), torch_p99(a, e)), torch_reps=1)
    same = e.clone()
    case(f"2^{lg} bf16 identical pair (a == e)", same, e, 0.90, "frac")
    del same
    t = (1 << (lg // 2), 1 << (lg - lg // 2))
    at, et = a.view(t).t(), e.view(t).t()
    case(f"2^{lg} bf16 transposed (.t())", at, et, 0.50, "frac",
         torch_fn=lambda: torch_composite(at, et))
    del at, et
    lat = (2, 16, 1 << (lg - 20), 128, 256)
    al, el = a.view(lat), e.view(lat)
    case(f"latent {lat} bf16, dim=1", al, el, 0.70, "frac", dim=1,
         torch_fn=lambda: torch_composite(al, el, dim=1))
    del a, e, al, el
    torch.cuda.empty_cache()
    a, e = make_pair((N,), torch.float32, seed=1)
    case(f"2^{lg} fp32, no quantiles", a, e, 0.90, "frac", torch_fn=lambda: torch_composite(a, e))
    case(f"2^{lg} bf16 vs fp32 ref, no quantiles", a.to(torch.bfloat16), e, 0.90, "frac")
    del a, e
    torch.cuda.empty_cache()
    a, e = make_pair((1 << 20,), torch.bfloat16, seed=2)
    case("2^20 bf16 end to end, p99 (default)", a, e, 30.0, "us", quantiles=(0.99,),
         torch_fn=lambda: (torch_composite(a, e), torch_p99(a, e)), torch_reps=10)
    case("2^20 bf16 end to end, no quantiles", a, e, 30.0, "us",
         torch_fn=lambda: torch_composite(a, e), torch_reps=10)

    print()
    print(f"{'case':44s} {'floor ms':>9s} {'vgct ms':>9s} {'wall ms':>9s} {'%floor':>7s} "
          f"{'torch ms':>9s} {'x torch':>8s}  goal")
    for r in rows:
        xt = "" if r["torch_ms"] is None else f"{r['torch_ms'] / r['vgct_ms']:.1f}x"
        tm = "-" if r["torch_ms"] is None else f"{r['torch_ms']:.3f}"
        print(f"{r['case']:44s} {r['floor_ms']:9.3f} {r['vgct_ms']:9.3f} {r['vgct_wall_ms']:9.3f} "
              f"{r['frac_of_floor']:7.0%} {tm:>9s} {xt:>8s}  {r['goal']}: "
              f"{'MET' if r['met'] else 'MISSED'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=props.name, copy_bw=bw, date=time.strftime("%Y-%m-%d"),
                           torch=torch.__version__, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
