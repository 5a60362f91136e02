"""CPU engine benchmark: prints a ratio table (not a test).

For each input (dtype, n, layout) it times, best of --repeat runs:
  vgct      vgct_ext.compare(a, e, quantiles=())            one pass, no quantiles
  vgct+p99  vgct_ext.compare(a, e, quantiles=(0.99,))       + exact radix selection
  numpy     the equivalent NumPy float64 composite: astype(float64), diff, the
            three norms and the dot product, max/argmax of |d| and |d|/|e|,
            isfinite counts, an allclose-style mismatch count, mean(d)
  numpy+p99 the same + np.quantile(|d|[finite], 0.99)
  2 sums    a.sum() + e.sum() (NumPy's own dtype accumulation)
and prints numpy/vgct (goal >= 3) and vgct/(2 sums) (goal <= 2).

A second table (--table shapes) times the exact p99 on the data shapes of issue [H] --
a bf16 cast of (fp32 + 1e-3 noise) against its fp32 original and against its bf16
rounding (many ties), fp32 noise, a constant offset (few distinct differences), an
identical pair, heavy tails (Cauchy noise), a few outliers, a caching feature's sparse
differences, an error confined to one run of 4% of the outputs (what an evenly spaced sample can
miss) -- each with quantiles=() and with the default quantiles=(0.99,): the CPU cost
of the default p99 (goal of [H]: within 2x of the compare without quantiles), beside
np.quantile(|a-e|, 0.99) alone (on a float64 |a-e| made beforehand, not timed).

A third table (--table small) times small calls end to end: vgct_ext.compare, the
_C.compare call alone (so the difference is the Python layer: argument checks, the DLPack
shim, PairedStats), and torch.testing.assert_close on the same pair (tolerances it passes).
Each cell is the minimum over --rounds interleaved rounds of the mean of a batch of calls.

    python bench/bench_cpu.py [--sizes 22,24] [--repeat 5] [--markdown]
                              [--table layouts|shapes|small|both|all] [--shape-sizes 20,24]
                              [--rounds 60] [--before path/to/other/_C.so]

--before SO: the shapes table times this build's and another build's _C.compare (the same
engine entry, no Python layer) in interleaved rounds: the before/after of an engine change.

bfloat16 inputs need torch (skipped without it); float16 and float32 use NumPy.
VGCT_NUM_THREADS sets the engine's threads (default: all CPUs); OPENBLAS_NUM_THREADS
defaults to 1 here (see below).
"""

import os

# OpenBLAS's worker threads busy-wait after each BLAS call (the composite's norms and dot)
# and would steal the cores vgct's threads run on; one BLAS thread keeps the timings
# independent of the order of the measurements (set before numpy is imported).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import vgct_ext  # noqa: E402


def numpy_composite(a, e, p99):
    a64 = a.astype(np.float64).ravel()
    e64 = e.astype(np.float64).ravel()
    fin = np.isfinite(a64) & np.isfinite(e64)
    n_fin = int(fin.sum())
    if n_fin != a64.size:
        a64, e64 = a64[fin], e64[fin]
    d = a64 - e64
    ad = np.abs(d)
    ae = np.abs(e64)
    nd, ne, na = np.linalg.norm(d), np.linalg.norm(e64), np.linalg.norm(a64)
    rel = nd / ne if ne else None
    cos = np.dot(a64, e64) / (na * ne) if na and ne else None
    i = int(np.argmax(ad))
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(e64 != 0, ad / ae, -1.0)
    j = int(np.argmax(r))
    mism = int(np.count_nonzero(ad > 1e-3 + 1e-3 * ae))
    out = (rel, cos, float(ad[i]), i, float(r[j]), j, mism, float(d.mean()), n_fin,
           int(np.count_nonzero(a64 != e64)))
    if p99:
        out += (float(np.quantile(ad, 0.99)),)
    return out


def best(f, repeat):
    f()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return min(ts)


def inputs(sizes, rng):
    try:
        import torch
    except ImportError:
        torch = None
    for lg in sizes:
        n = 1 << lg
        side = 1 << (lg // 2)
        shape = (n // side, side)
        base = rng.standard_normal(shape, dtype=np.float32)
        pert = base + rng.standard_normal(shape, dtype=np.float32) * np.float32(1e-3)
        for dt in ("float32", "float16", "bfloat16"):
            if dt == "bfloat16":
                if torch is None:
                    continue
                a = torch.from_numpy(pert).to(torch.bfloat16)
                e = torch.from_numpy(base).to(torch.bfloat16)
                to_np = lambda t: t.float().numpy()  # noqa: E731  (numpy has no bfloat16)
            else:
                a, e = pert.astype(dt), base.astype(dt)
                to_np = None
            for layout in ("contiguous", "transposed"):
                x, y = (a, e) if layout == "contiguous" else (a.T, e.T)
                yield dt, lg, layout, x, y, to_np


def machine():
    """The CPU (model and instruction set, from py-cpuinfo through vgct_ext) and its logical CPU count."""
    from vgct_ext.method._hardware import cpu_facts

    f = cpu_facts()
    return f"{f['model']} ({f['isa'] or 'ISA unknown'}), {os.cpu_count()} CPUs"


def size_of(s):
    """A --shape-sizes entry: up to 62 the log2 of the pair count, above it the count itself
    (8191: just below the CPU engine's key windows)."""
    return 1 << s if s <= 62 else s


def size_label(s):
    return f"2^{s}" if s <= 62 else str(s)


def p99_shapes(lg, rng, absdiffs=True):
    """``(name, actual, expected, |a-e| as float64 NumPy)`` for each data shape of the p99
    table (bfloat16 ones need torch: skipped without it); ``lg`` as in :func:`size_of`."""
    try:
        import torch
    except ImportError:
        torch = None
    n = size_of(lg)
    e32 = rng.standard_normal(n, dtype=np.float32)
    noisy = e32 + rng.standard_normal(n, dtype=np.float32) * np.float32(1e-3)
    cauchy = e32 + rng.standard_cauchy(n).astype(np.float32) * np.float32(1e-3)
    outl = e32 + rng.standard_normal(n, dtype=np.float32) * np.float32(1e-3)
    outl[rng.integers(0, n, 64)] += np.float32(1e3)

    def absdiff(a, e):
        f = (lambda x: x.double().numpy()) if torch is not None and isinstance(a, torch.Tensor) else \
            (lambda x: x.astype(np.float64))
        return np.abs(f(a) - f(e))

    pairs = [("fp32 e+1e-3 noise vs fp32 e", noisy, e32),
             ("fp32 e+1e-3 constant offset vs fp32 e", e32 + np.float32(1e-3), e32),
             ("heavy tails: fp32 e+1e-3 Cauchy", cauchy, e32)]
    if torch is not None:
        t32 = torch.from_numpy(e32)
        a16, e16 = torch.from_numpy(noisy).to(torch.bfloat16), t32.to(torch.bfloat16)
        pairs = [("bf16(e+1e-3 noise) vs fp32 e", a16, t32),
                 ("bf16(e+1e-3 noise) vs bf16(e), ties", a16, e16)] + pairs + [
                 ("identical bf16 pair (a == e)", e16, e16.clone()),
                 ("64 outliers (+1e3) in bf16 1e-3 noise", torch.from_numpy(outl).to(torch.bfloat16), e16)]
        cached = e16.clone()  # a caching feature: ~1.1% of the outputs recomputed (bench_gpu.p99_shapes)
        k = torch.from_numpy(rng.random(n) < 0.011)
        cached[k] = (t32[k] + torch.from_numpy(rng.standard_normal(int(k.sum()), dtype=np.float32))
                     * 1e-2).to(torch.bfloat16)
        pairs.append(("sparse: 1.1% of bf16 outputs recomputed (caching)", cached, e16))
        # the p99 from one region: 4% of the outputs, contiguous, off by 1e-2 (a tile or a run of
        # tokens that diverged), the rest bf16 rounding -- where the evenly spaced sample of the
        # key windows (csrc/cpu_select.inc) sees few of them or none: the windows' worst case
        clus = noisy.copy()
        lo = n // 64
        clus[lo:lo + n // 25] += rng.standard_normal(n // 25, dtype=np.float32) * np.float32(1e-2)
        pairs.append(("clustered: 4% of bf16 outputs in one run off by 1e-2",
                      torch.from_numpy(clus).to(torch.bfloat16), e16))
    else:
        pairs.append(("identical fp32 pair (a == e)", e32, e32.copy()))
    for name, a, e in pairs:
        yield name, a, e, (absdiff(a, e) if absdiffs else None)


def load_engine(path):
    """The ``_C`` extension module built at ``path`` (another build of vgct_ext's C core, e.g.
    main's), loaded beside this one under the package name ``vgct_before``."""
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.ExtensionFileLoader("vgct_before._C", path)
    spec = importlib.util.spec_from_file_location("vgct_before._C", path, loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def shapes_table(sizes, repeat, markdown, rng, before=None):
    """The p99 cost by data shape.  With ``before`` (a ``_C`` module of another build), both
    engines are timed through ``_C.compare`` (no Python layer), in interleaved rounds
    (before, after, before, after, ...), best of ``repeat`` each."""
    if before is not None:
        from vgct_ext import _C as after
        hdr = ("data", "n", "before us", "before+p99 us", "before cost", "after us", "after+p99 us",
               "after cost")
        lines = []
        for lg in sizes:
            reps = max(1, (1 << 17) // size_of(lg))  # a batch of calls a timing below 2^17 pairs
            for name, a, e, _ad in p99_shapes(lg, rng, absdiffs=False):
                fs = [lambda m=m, q=q: m.compare(a, e, quantiles=q)
                      for m in (before, after) for q in ((), (0.99,))]
                for f in fs:
                    f()  # warm-up
                ts = [[] for _ in fs]
                for _ in range(repeat):
                    for k, f in enumerate(fs):
                        t0 = time.perf_counter()
                        for _ in range(reps):
                            f()
                        ts[k].append((time.perf_counter() - t0) / reps)
                b0, b1, a0, a1 = (min(t) for t in ts)
                lines.append((name, size_label(lg), f"{b0 * 1e6:.1f}", f"{b1 * 1e6:.1f}", f"{b1 / b0:.2f}x",
                              f"{a0 * 1e6:.1f}", f"{a1 * 1e6:.1f}", f"{a1 / a0:.2f}x"))
                print("  " + "  ".join(lines[-1]), flush=True)
        print()
        print("exact p99 by data shape, before/after: _C.compare with quantiles=() and (0.99,); "
              f"interleaved rounds, best of {repeat}; cost = p99 / no quantiles (goal of [H]: <= 2x)")
        _print_table(hdr, lines, markdown)
        return
    hdr = ("data", "n", "vgct ms", "vgct+p99 ms", "p99 cost", "np.quantile ms")
    lines = []
    for lg in sizes:
        for name, a, e, ad in p99_shapes(lg, rng):
            t_v = best(lambda: vgct_ext.compare(a, e, quantiles=()), repeat)
            t_vq = best(lambda: vgct_ext.compare(a, e), repeat)  # the default quantiles=(0.99,)
            t_nq = best(lambda: np.quantile(ad, 0.99), max(1, repeat // 2))
            lines.append((name, size_label(lg), f"{t_v * 1e3:.3f}", f"{t_vq * 1e3:.3f}",
                          f"{t_vq / t_v:.1f}x", f"{t_nq * 1e3:.1f}"))
    print()
    print("exact p99 by data shape: vgct_ext.compare with quantiles=() and with the default "
          "quantiles=(0.99,); p99 cost = vgct+p99 / vgct (goal of [H]: <= 2x)")
    _print_table(hdr, lines, markdown)


def _print_table(hdr, lines, markdown):
    if markdown:
        print("| " + " | ".join(hdr) + " |")
        print("|" + "---|" * len(hdr))
        for ln in lines:
            print("| " + " | ".join(ln) + " |")
    else:
        w = [max(len(h), *(len(ln[i]) for ln in lines)) for i, h in enumerate(hdr)]
        print("  ".join(h.rjust(w[i]) for i, h in enumerate(hdr)))
        for ln in lines:
            print("  ".join(c.rjust(w[i]) for i, c in enumerate(ln)))


def small_table(rounds, markdown):
    """Small calls: compare vs _C.compare (the Python layer is the difference) vs
    torch.testing.assert_close, float32 pairs of 1 and 2^20 elements."""
    from vgct_ext import _C

    try:
        import torch
    except ImportError:
        torch = None

    def batch(f, reps):
        t0 = time.perf_counter()
        for _ in range(reps):
            f()
        return (time.perf_counter() - t0) / reps * 1e6

    rng = np.random.default_rng(1)
    lines = []
    for lg, reps in ((0, 300), (20, 3)):
        e = rng.standard_normal(1 << lg, dtype=np.float32)
        a = e + np.float32(1e-3)
        pairs = [("numpy", a, e)]
        if torch is not None:
            pairs.insert(0, ("torch", torch.from_numpy(a), torch.from_numpy(e)))
        for lib, x, y in pairs:
            for q in ((), (0.99,)):
                fs = {"compare": lambda: vgct_ext.compare(x, y, quantiles=q),
                      "_C": lambda: _C.compare(x, y, 1e-3, 1e-3, q, None, None, None, None)}
                if torch is not None:
                    tx, ty = (x, y) if lib == "torch" else (torch.from_numpy(x), torch.from_numpy(y))
                    fs["assert_close"] = lambda: torch.testing.assert_close(tx, ty, rtol=1e-2, atol=1e-2)
                best = {k: float("inf") for k in fs}
                for f in fs.values():
                    batch(f, reps)
                for _ in range(rounds if lg == 0 else max(3, rounds // 4)):
                    for k, f in fs.items():
                        best[k] = min(best[k], batch(f, reps))
                ac = best.get("assert_close")
                lines.append((lib, f"2^{lg}", "(0.99,)" if q else "()", f"{best['compare']:.1f}",
                              f"{best['_C']:.1f}", f"{best['compare'] - best['_C']:.1f}",
                              "-" if ac is None else f"{ac:.1f}",
                              "-" if ac is None else f"{ac / best['compare']:.2f}x"))
    print()
    print("small calls (float32 pairs, microseconds per call; Python layer = compare - _C.compare; "
          "assert_close: torch.testing.assert_close(rtol=atol=1e-2) on the same pair, passing)")
    _print_table(("input", "n", "quantiles", "compare us", "_C.compare us", "Python layer us",
                  "assert_close us", "assert_close/compare"), lines, markdown)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="22,24", help="log2 of the element counts, e.g. 22,23,24")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    ap.add_argument("--table", default="both", choices=("layouts", "shapes", "small", "both", "all"),
                    help="both = layouts + shapes; all = the three")
    ap.add_argument("--rounds", type=int, default=60, help="interleaved rounds of the small-call table")
    ap.add_argument("--shape-sizes", default="20,24", help="log2 sizes of the p99 data-shape table (an entry above 62: a pair count, e.g. 8191)")
    ap.add_argument("--before", metavar="SO", default=None,
                    help="the _C extension of another build (e.g. main's): the shapes table then "
                         "times both engines' _C.compare, interleaved, before/after")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rng = np.random.default_rng(0)
    print(f"# vgct_ext CPU benchmark  {time.strftime('%Y-%m-%d')}  {machine()}  "
          f"threads={os.environ.get('VGCT_NUM_THREADS', 'all')}  numpy {np.__version__}")
    if args.table in ("layouts", "both", "all"):
        layouts_table(sizes, args.repeat, args.markdown, rng)
    if args.table in ("shapes", "both", "all"):
        shapes_table([int(s) for s in args.shape_sizes.split(",")], args.repeat, args.markdown, rng,
                     load_engine(args.before) if args.before else None)
    if args.table in ("small", "all"):
        small_table(args.rounds, args.markdown)


def layouts_table(sizes, repeat, markdown, rng):
    rows = []
    for dt, lg, layout, a, e, to_np in inputs(sizes, rng):
        an, en = (a, e) if to_np is None else (to_np(a), to_np(e))
        t_v = best(lambda: vgct_ext.compare(a, e, quantiles=()), repeat)
        t_vq = best(lambda: vgct_ext.compare(a, e, quantiles=(0.99,)), repeat)
        # numpy has no bfloat16: its composite starts from float32 copies (not timed)
        t_n = best(lambda: numpy_composite(an, en, False), max(1, repeat // 2))
        t_nq = best(lambda: numpy_composite(an, en, True), max(1, repeat // 2))
        # numpy has no bfloat16: its row shows torch's own bf16 sums (multi-threaded), for
        # information only; the "within 2x of numpy's sums" goal applies to the numpy rows
        t_s = best(lambda: (a.sum(), e.sum()), repeat)
        rows.append((dt, f"2^{lg}", layout, t_v, t_vq, t_n, t_nq, t_s))
    hdr = ("dtype", "n", "layout", "vgct ms", "vgct+p99 ms", "numpy ms", "numpy+p99 ms",
           "2 sums ms", "numpy/vgct", "numpy+p99/vgct+p99", "vgct/2 sums")
    # bfloat16 rows: "2 sums" are torch.sum (numpy has no bfloat16), marked with *
    lines = []
    for dt, n, lay, tv, tvq, tn, tnq, ts in rows:
        star = "*" if dt == "bfloat16" else ""
        lines.append((dt, n, lay, f"{tv * 1e3:.2f}", f"{tvq * 1e3:.2f}", f"{tn * 1e3:.1f}",
                      f"{tnq * 1e3:.1f}", f"{ts * 1e3:.2f}{star}", f"{tn / tv:.1f}x", f"{tnq / tvq:.1f}x",
                      f"{tv / ts:.2f}x{star}"))
    _print_table(hdr, lines, markdown)
    print("goals: numpy/vgct >= 3 (with and without p99); vgct/2 sums <= 2 "
          "(* bfloat16: torch.sum, numpy has no bfloat16; not a goal)")


if __name__ == "__main__":
    main()
