"""GPU benchmark of vgct_ext.compare against torch, with one ratio table last.

For each case of issues [B] and [H]'s speed goals: the same tensors go through
``vgct_ext.compare`` (one fused pass; exact quantiles by radix selection) and
through what torch offers for the same question: the torch composite that computes
the same statistics (float64 elementwise ops, masked reductions), ``kthvalue`` for
the exact p99 (``torch.quantile`` refuses more than 2^24 elements), and
``torch.testing.assert_close`` on the same pair for the small calls.  Times are
medians of CUDA-event intervals around the call (``compare`` returns only once its
result record is on the host, so the interval holds all its device work) and of the
host wall clock.  The small calls' goal is a wall clock, which events would inflate
(two event objects and two records a call, ~20-50 us on an H200 host): their wall
column is the median of the call alone (``host_wall``: the device idle before each
call, nothing else timed), torch's likewise.  The read floor of a case is the bytes of both inputs over the
device copy bandwidth measured here (a large device-to-device copy, bytes read
plus written, as in METHOD.md): no implementation reading both inputs once can
beat it.

Rows: the throughput cases (bf16, fp32, transposed, latent slices); the exact p99 on
several data shapes, each beside the same pair without quantiles -- a bf16 cast of
(fp32 + 1e-3 noise) against its fp32 original and against its bf16 rounding (many
ties), fp32 noise, a constant offset (few distinct differences), an identical pair,
heavy tails (Cauchy noise), a few outliers;
and the small calls (2^20 end to end, beside the composite and beside
``torch.testing.assert_close``, passing and failing with its report).

Degrades gracefully: a case that raises (out of memory, a missing dtype, a
refusal) prints its error in its row and the run goes on; ``--no-torch`` skips
torch's side; ``--device cpu`` runs every row on the CPU with wall-clock timing
(a dry run of the script where there is no GPU: ``--device cpu --log2n 16``);
without CUDA and without ``--device cpu`` it says so and exits with status 2.

    python bench/bench_gpu.py [--quick | --log2n K] [--reps N] [--no-torch]
                              [--only SUBSTRING] [--device cpu] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

import vgct_ext


_DEVICE = "cuda"


def cuda_time(fn, reps, warmup=2):
    """Median ms over reps of CUDA events around fn(), and median host wall ms (on the CPU,
    ``--device cpu``: the wall clock for both)."""
    for _ in range(warmup):
        fn()
    if _DEVICE != "cuda":
        wall = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            wall.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(wall), statistics.median(wall)
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


def host_wall(fn, reps, warmup=2, sync=False):
    """Median host wall ms of ``fn()`` alone: the device synchronised (idle) before each
    call, outside the timed interval, and no event recorded -- the end-to-end latency of a
    call that returns host values (``compare``; ``assert_close`` decides on the host).
    sync: fn returns device tensors (torch's composite), so the interval ends with a
    synchronisation -- its device work is part of the answer's latency."""
    for _ in range(warmup):
        fn()
    wall = []
    cuda = _DEVICE == "cuda"
    for _ in range(reps):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if sync and cuda:
            torch.cuda.synchronize()
        wall.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(wall)


def copy_bandwidth(log2=31):
    """Device copy bandwidth in bytes/s (read + write), 2^log2-byte buffers."""
    n = 1 << log2
    src = torch.empty(n, dtype=torch.uint8, device=_DEVICE).random_()
    dst = torch.empty_like(src)
    ms, _ = cuda_time(lambda: dst.copy_(src), reps=10)
    src = dst = None  # freed (pyflakes flags a del of names the lambdas above use)
    _empty_cache()
    return 2 * n / (ms * 1e-3)


def _empty_cache():
    if _DEVICE == "cuda":
        torch.cuda.empty_cache()


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
    g = torch.Generator(device=_DEVICE)
    g.manual_seed(seed)
    e = torch.randn(shape, generator=g, device=_DEVICE, dtype=torch.float32)
    a = e + torch.randn(shape, generator=g, device=_DEVICE, dtype=torch.float32) * 1e-2
    return a.to(dtype), e.to(dtype)


def p99_shapes(n, seed=10):
    """The exact p99's data shapes of issue [H]: ``(name, actual, expected)`` each, made
    one at a time (a generator: the previous pair can be freed before the next is made).
    ``e32 ~ N(0, 1)`` float32; noise 1e-3 N(0, 1) unless said otherwise."""
    g = torch.Generator(device=_DEVICE)
    g.manual_seed(seed)
    e32 = torch.randn(n, generator=g, device=_DEVICE)
    noisy = e32 + 1e-3 * torch.randn(n, generator=g, device=_DEVICE)
    a16 = noisy.to(torch.bfloat16)
    yield "bf16(e+1e-3 noise) vs fp32 e", a16, e32
    e16 = e32.to(torch.bfloat16)
    yield "bf16(e+1e-3 noise) vs bf16(e), ties", a16, e16
    del a16
    yield "fp32 e+1e-3 noise vs fp32 e", noisy, e32
    del noisy
    yield "fp32 e+1e-3 constant offset vs fp32 e", e32 + 1e-3, e32  # few distinct |d|: ties
    yield "identical bf16 pair (a == e)", e16, e16.clone()
    cauchy = torch.empty(n, device=_DEVICE).cauchy_(generator=g)
    yield "heavy tails: fp32 e+1e-3 Cauchy", e32 + 1e-3 * cauchy, e32
    del cauchy
    out = (e32 + 1e-3 * torch.randn(n, generator=g, device=_DEVICE))
    idx = torch.randint(0, n, (64,), generator=g, device=_DEVICE)
    out[idx] += 1e3
    yield "64 outliers (+1e3) in bf16 1e-3 noise", out.to(torch.bfloat16), e16
    del out
    cached = e16.clone()  # a caching feature: ~1.1% of the outputs recomputed, the rest reused
    k = torch.rand(n, generator=g, device=_DEVICE) < 0.011
    cached[k] = (e32[k] + 1e-2 * torch.randn(int(k.sum()), generator=g, device=_DEVICE)).to(torch.bfloat16)
    del k
    yield "sparse: 1.1% of bf16 outputs recomputed (caching)", cached, e16


def assert_close_fn(a, e, rtol, atol):
    """``torch.testing.assert_close(a, e)`` as a timed function: returns whether it passed
    (a failing call builds its mismatch report: that is part of what it costs)."""
    def run():
        try:
            torch.testing.assert_close(a, e, rtol=rtol, atol=atol)
            return True
        except AssertionError:
            return False
    return run


def main():
    global _DEVICE
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="2^26 instead of 2^28 elements")
    ap.add_argument("--log2n", type=int, default=None, help="log2 of the large cases' size")
    ap.add_argument("--json", default=None)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--no-torch", action="store_true", help="skip torch's side")
    ap.add_argument("--only", default=None,
                    help="run only the cases whose name contains this (alternatives split by |)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: a dry run on the CPU, wall-clock timing")
    args = ap.parse_args()
    _DEVICE = args.device
    info = vgct_ext.build_info()
    if _DEVICE == "cuda":
        if not torch.cuda.is_available():
            print("bench_gpu: no CUDA device (--device cpu runs the rows on the CPU; "
                  "bench/bench_cpu.py is the CPU benchmark)", file=sys.stderr)
            return 2
        if not info.get("cuda_compiled"):
            print("bench_gpu: vgct_ext built without CUDA", file=sys.stderr)
            return 2
        props = torch.cuda.get_device_properties(0)
        dev_name = props.name
        dev_desc = f"{props.name}, {props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB"
    else:
        dev_name = dev_desc = f"CPU ({os.cpu_count()} CPUs, dry run)"
    bw = copy_bandwidth(31 if _DEVICE == "cuda" else 26)
    print(f"device: {dev_desc}; copy bandwidth {bw / 1e12:.2f} TB/s (read+write); torch "
          f"{torch.__version__}; vgct_ext {info.get('version')}", flush=True)
    lg = args.log2n if args.log2n is not None else (26 if args.quick else 28)
    N = 1 << lg
    rows = []

    def case(name, a, e, goal, goal_kind, quantiles=None, dim=None, torch_fn=None, torch_reps=3,
             torch_what="composite"):
        """Time one row; an error (OOM, a refusal) is printed in the row, the run goes on."""
        if args.only and not any(o in name for o in args.only.split("|")):
            return None
        row = dict(case=name, torch_what=torch_what, error=None, torch_ms=None, torch_wall_ms=None)
        try:
            nbytes = a.numel() * a.element_size() + e.numel() * e.element_size()
            floor_ms = nbytes / bw * 1e3
            ms, wall = cuda_time(lambda: vgct_ext.compare(a, e, quantiles=quantiles, dim=dim),
                                 reps=args.reps)
            if goal_kind == "us":  # the call alone (host_wall: no events)
                wall = host_wall(lambda: vgct_ext.compare(a, e, quantiles=quantiles, dim=dim),
                                 reps=max(args.reps, 50))
        except Exception as exc:  # noqa: BLE001 - report the row, keep going
            row["error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
            rows.append(row)
            print(f"  {name}: ERROR {row['error']}", flush=True)
            _empty_cache()
            return row
        if torch_fn is not None and not args.no_torch:
            try:
                row["torch_ms"], row["torch_wall_ms"] = cuda_time(
                    torch_fn, reps=torch_reps, warmup=0 if torch_reps == 1 else 1)
                if goal_kind == "us":  # the composite returns device tensors: wait for them
                    row["torch_wall_ms"] = host_wall(torch_fn, reps=max(torch_reps, 20),
                                                     sync=not torch_what.startswith("assert_close"))
            except Exception as exc:  # noqa: BLE001 - out of memory, an unsupported op: no torch cell
                row["torch_error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
            _empty_cache()
        frac = floor_ms / ms
        if goal_kind == "frac":
            met, goal_s = frac >= goal, f">= {goal:.0%} of floor"
        elif goal_kind == "xfloor":
            met, goal_s = ms <= goal * floor_ms, f"<= {goal:g}x floor"
        elif goal_kind == "us":  # microseconds, wall clock end to end
            met, goal_s = wall * 1e3 <= goal, f"<= {goal:g} us wall"
        else:
            met, goal_s = None, "(info)"
        # small calls compare wall clocks (host time is the point); the rest device time
        t_ref = row["torch_wall_ms"] if goal_kind == "us" else row["torch_ms"]
        v_ref = wall if goal_kind == "us" else ms
        row.update(n=a.numel(), dtype=str(a.dtype).replace("torch.", ""), bytes=nbytes,
                   floor_ms=floor_ms, vgct_ms=ms, vgct_wall_ms=wall, frac_of_floor=frac,
                   x_torch=None if t_ref is None else t_ref / v_ref, goal=goal_s,
                   met=None if met is None else bool(met))
        rows.append(row)
        tcell = "-" if t_ref is None else f"{t_ref:.3f} ms ({torch_what})"
        print(f"  {name}: vgct {ms:.3f} ms (wall {wall:.3f}), floor {floor_ms:.3f} ms, "
              f"{frac:.0%} of floor, torch {tcell}: "
              f"{'' if met is None else ('MET' if met else 'missed')} ({goal_s})", flush=True)
        return row

    a, e = make_pair((N,), torch.bfloat16)
    case(f"2^{lg} bf16, no quantiles", a, e, 0.90, "frac",
         torch_fn=lambda: torch_composite(a, e))
    case(f"2^{lg} bf16, exact p99", a, e, 3.0, "xfloor", quantiles=(0.99,),
         torch_fn=lambda: (torch_composite(a, e), torch_p99(a, e)), torch_reps=1,
         torch_what="composite+kthvalue")
    same = e.clone()
    case(f"2^{lg} bf16 identical pair (a == e)", same, e, 0.90, "frac")
    same = None  # freed (pyflakes flags a del of names the lambdas above use)
    t = (1 << (lg // 2), 1 << (lg - lg // 2))
    at, et = a.view(t).t(), e.view(t).t()
    case(f"2^{lg} bf16 transposed (.t())", at, et, 0.50, "frac",
         torch_fn=lambda: torch_composite(at, et))
    at = et = None  # freed (pyflakes flags a del of names the lambdas above use)
    if lg >= 20:
        lat = (2, 16, 1 << (lg - 20), 128, 256)
        al, el = a.view(lat), e.view(lat)
        case(f"latent {lat} bf16, dim=1", al, el, 0.70, "frac", dim=1,
             torch_fn=lambda: torch_composite(al, el, dim=1))
        al = el = None  # freed (pyflakes flags a del of names the lambdas above use)
    a = e = None  # freed (pyflakes flags a del of names the lambdas above use)
    _empty_cache()
    a, e = make_pair((N,), torch.float32, seed=1)
    case(f"2^{lg} fp32, no quantiles", a, e, 0.90, "frac", torch_fn=lambda: torch_composite(a, e))
    case(f"2^{lg} bf16 vs fp32 ref, no quantiles", a.to(torch.bfloat16), e, 0.90, "frac")
    a = e = None  # freed (pyflakes flags a del of names the lambdas above use)
    _empty_cache()

    # the exact p99 by data shape: each pair without quantiles, then with the p99
    for shape_name, a, e in p99_shapes(N):
        case(f"2^{lg} {shape_name}, no quantiles", a, e, None, "info",
             torch_fn=lambda: torch_composite(a, e))
        case(f"2^{lg} {shape_name}, exact p99", a, e, 3.0, "xfloor", quantiles=(0.99,),
             torch_fn=lambda: torch_p99(a, e), torch_reps=1, torch_what="kthvalue")
        a = e = None  # freed (pyflakes flags a del of names the lambdas above use)
        _empty_cache()

    # small calls: end to end, beside the composite and beside torch.testing.assert_close
    a, e = make_pair((1 << 20,), torch.bfloat16, seed=2)
    case("2^20 bf16 end to end, p99 (default)", a, e, 30.0, "us", quantiles=(0.99,),
         torch_fn=lambda: (torch_composite(a, e), torch_p99(a, e)), torch_reps=10,
         torch_what="composite+kthvalue")
    case("2^20 bf16 end to end, no quantiles", a, e, 30.0, "us",
         torch_fn=lambda: torch_composite(a, e), torch_reps=10)
    for q, rtol in (((), 0.1), ((), 1e-3), ((0.99,), 1e-3)):
        close = assert_close_fn(a, e, rtol=rtol, atol=rtol)
        what = f"assert_close {rtol:g}, " + ("passes" if close() else "fails+report")
        case(f"2^20 bf16 end to end, {'p99 (default)' if q else 'no quantiles'}", a, e, 30.0, "us",
             quantiles=q, torch_fn=close, torch_reps=20, torch_what=what)
    a = e = None  # freed (pyflakes flags a del of names the lambdas above use)

    print()
    hdr = (f"{'case':56s} {'floor ms':>9s} {'vgct ms':>9s} {'wall ms':>9s} {'%floor':>7s} "
           f"{'torch':>32s} {'torch ms':>9s} {'x torch':>8s}  goal")
    print(hdr)
    for r in rows:
        if r["error"] is not None:
            print(f"{r['case']:56s} ERROR {r['error']}")
            continue
        xt = "" if r["x_torch"] is None else f"{r['x_torch']:.1f}x"
        t_ref = r["torch_wall_ms"] if r["goal"].endswith("us wall") else r["torch_ms"]
        tm = "-" if t_ref is None else f"{t_ref:.3f}"
        tw = "-" if t_ref is None else r["torch_what"]
        verdict = "" if r["met"] is None else (": MET" if r["met"] else ": MISSED")
        print(f"{r['case']:56s} {r['floor_ms']:9.3f} {r['vgct_ms']:9.3f} {r['vgct_wall_ms']:9.3f} "
              f"{r['frac_of_floor']:7.0%} {tw:>32s} {tm:>9s} {xt:>8s}  {r['goal']}{verdict}")
    print("(small calls, goal in us wall: vgct and torch compared by host wall clock; "
          "the other rows by device time)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=dev_name, copy_bw=bw, date=time.strftime("%Y-%m-%d"),
                           torch=torch.__version__, log2n=lg, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
