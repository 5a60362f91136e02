"""Where the small-input reduce kernel's device time goes, phase by phase (a diagnostic build).

Needs a build made with ``VGCT_PHASE_TRACE=1`` (setup.py: nvcc -DVGCT_PHASE_TRACE). In that build
every ``k_reduce_lean`` launch of several blocks prints one line from its last block
(cuda/reduce.cu ``vg_pt_report``): ``%globaltimer`` stamps (ns), relative to the first block's
entry, of each block's entry, its thread 0's last flush, the block's merge and its arrival at the
grid's counter (the earliest and the latest over the blocks), then the last block's fold of the
partials and its completion word. This script runs ``compare`` without quantiles on bf16 pairs
(``e = a + 1e-2 noise``, rounded) in a child process, reads those lines from the child's stdout
(the device's printf writes to the C stdout), and prints the medians per size in us.

    VGCT_PHASE_TRACE=1 python setup.py build_ext --inplace
    python bench/phase_trace.py [--sizes 12,16,20] [--calls 200]

The stamps cost a few instructions and a global store each: the phases' sizes, not the kernel's
total, are what this measures (bench/gpu_kernels.py times the release build).

With --ring it instead times the large-input ring kernel (``k_reduce_bulk``) warp by warp: in the
same build every warp stamps its entry and the end of its pair loop, with its SM and the steps in
which one of its lanes fell back, and the grid's last block prints them (``VGPW`` lines). For bf16
pairs of ``e + 1e-3 noise`` (rounding ties), ``e + 1e-2 noise`` and ``e`` itself (--sizes, e.g.
26,28) it prints, per call, the spread of the warps' loop times and of the SMs' last loop ends --
where a few slow warps or an uneven SM hold the kernel's end. ``--layouts`` adds the ring over
rows (RL 1) on the noise pair read as bench_gpu.py's rows: ``transposed`` (a square matrix through
``.t()``: rows back to back) and ``latent`` ((2, 16, 2^(lg-13), 16, 16), ``dim=1``: the slices of row
mode, each channel two rows of 2^(lg-5) elements apart in memory -- the iteration of bench_gpu.py's
(2, 16, 256, 128, 256)).

    python bench/phase_trace.py --ring [--sizes 26,28] [--calls 3] [--layouts flat,transposed,latent]
"""
import argparse
import statistics
import subprocess
import sys

FIELDS = ("entry_last", "flushed_first", "flushed_last", "merged_first", "merged_last",
          "arrived_first", "arrived_last", "folded", "signalled")


def _traced():
    """(torch, vgct_ext, sync) in the child: the trace build checked; sync() waits for the device
    and flushes C's stdout, where the device's printf lines sit (a pipe: fully buffered)."""
    import ctypes

    import torch

    import vgct_ext
    if not vgct_ext.build_info()["phase_trace"]:
        sys.exit("this _C is not a VGCT_PHASE_TRACE=1 build (vgct_ext.build_info()['phase_trace'])")
    libc = ctypes.CDLL(None)

    def sync():
        torch.cuda.synchronize()
        libc.fflush(None)
    return torch, vgct_ext, sync


def child(sizes, calls):
    torch, vgct_ext, sync = _traced()
    for lg in sizes:
        g = torch.Generator(device="cuda").manual_seed(lg)
        e32 = torch.randn(1 << lg, device="cuda", generator=g)
        a = (e32 + 1e-2 * torch.randn(1 << lg, device="cuda", generator=g)).to(torch.bfloat16)
        e = e32.to(torch.bfloat16)
        for _ in range(20):
            vgct_ext.compare(a, e, quantiles=None)
        sync()
        print(f"SIZE {lg}", flush=True)
        for _ in range(calls):
            vgct_ext.compare(a, e, quantiles=None)
        sync()
    print("END", flush=True)


def ring_cases(torch, lg, layouts):
    """(name, actual, expected, dim) of the --ring cases at 2^lg bf16 pairs."""
    g = torch.Generator(device="cuda").manual_seed(lg)
    e32 = torch.randn(1 << lg, device="cuda", generator=g)
    z = torch.randn(1 << lg, device="cuda", generator=g)
    e = e32.to(torch.bfloat16)
    noise = (e32 + 1e-2 * z).to(torch.bfloat16)
    if "flat" in layouts:
        yield "ties", (e32 + 1e-3 * z).to(torch.bfloat16), e, None
        yield "noise", noise, e, None
        yield "identical", e.clone(), e, None
    if "transposed" in layouts:  # bench_gpu.py's: a square matrix read through .t()
        side = 1 << (lg // 2)
        yield "noise-transposed", noise.view(side, -1).t(), e.view(side, -1).t(), None
    if "latent" in layouts:  # bench_gpu.py's latent, per-channel statistics
        shape = (2, 16, 1 << (lg - 13), 16, 16)
        yield "noise-latent-dim1", noise.view(shape), e.view(shape), 1


def ring_child(sizes, calls, layouts):
    torch, vgct_ext, sync = _traced()
    for lg in sizes:
        for name, a, e, dim in ring_cases(torch, lg, layouts):
            print("CASE skip", flush=True)  # the warm-up calls' lines are not counted
            for _ in range(3):
                vgct_ext.compare(a, e, quantiles=None, dim=dim)
            sync()
            for r in range(calls):
                print(f"CASE {lg} {name} {r}", flush=True)
                vgct_ext.compare(a, e, quantiles=None, dim=dim)
                sync()
    print("END", flush=True)


def ring_table(text):
    """The --ring table from the child's VGPW lines (block, SM, warp, entry ns, loop end ns, slow
    steps, steps), one row per call."""
    calls, cur = {}, None
    for line in text.splitlines():
        if line.startswith("CASE "):
            cur = None if line.split()[1] == "skip" else tuple(line.split()[1:])
        elif line.startswith("VGPW ") and cur is not None:
            calls.setdefault(cur, []).append(tuple(int(x) for x in line.split()[1:]))
    print("k_reduce_bulk, bf16 pairs, us after the first warp's entry; per call:")
    print("| pairs | data | call | warps | steps | warp loop p10 / p50 / p90 / max | SM last end mean / max "
          "| slow steps a warp mean / max |")
    print("|---:|---|---:|---:|---:|---|---|---|")
    for (lg, name, r), rows in calls.items():
        t0 = min(x[3] for x in rows)
        dur = [(x[4] - x[3]) * 1e-3 for x in rows]
        sm = {}
        for x in rows:
            sm[x[1]] = max(sm.get(x[1], 0.0), (x[4] - t0) * 1e-3)
        slow = [x[5] for x in rows]
        dec = statistics.quantiles(dur, n=10)  # the deciles: p10, ..., p90
        print(f"| 2^{lg} | {name} | {r} | {len(rows)} | {rows[0][6]} | {dec[0]:.1f} / "
              f"{dec[4]:.1f} / {dec[8]:.1f} / {max(dur):.1f} | "
              f"{statistics.mean(sm.values()):.1f} / {max(sm.values()):.1f} | "
              f"{statistics.mean(slow):.2f} / {max(slow)} |")


def parse(text):
    """{size: {field: [us, ...]}} from the child's stdout (device printf lines after each SIZE)."""
    out, cur = {}, None
    for line in text.splitlines():
        if line.startswith("SIZE "):
            cur = out.setdefault(int(line.split()[1]), {f: [] for f in FIELDS})
        elif line.startswith("VGPT ") and cur is not None:
            w = line.split()
            # VGPT grid G entry 0 E flushed F0 F1 merged M0 M1 arrived A0 A1 folded X signalled S
            vals = (float(w[5]), float(w[7]), float(w[8]), float(w[10]), float(w[11]),
                    float(w[13]), float(w[14]), float(w[16]), float(w[18]))
            for f, v in zip(FIELDS, vals):
                cur[f].append(v)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="12,16,20")
    ap.add_argument("--calls", type=int, default=None, help="calls a size (200; --ring: 3)")
    ap.add_argument("--ring", action="store_true", help="the ring kernel, warp by warp")
    ap.add_argument("--layouts", default="flat",
                    help="--ring: flat (ties, noise, identical), transposed, latent (noise)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    layouts = args.layouts.split(",")
    if set(layouts) - {"flat", "transposed", "latent"}:
        ap.error(f"--layouts: {args.layouts!r}; expected names among flat, transposed, latent")
    if args.ring and "transposed" in layouts and any(lg % 2 for lg in sizes):
        ap.error(f"--layouts transposed: a square matrix needs even --sizes, got {args.sizes}")
    if args.ring and "latent" in layouts and min(sizes) < 13:
        ap.error(f"--layouts latent: (2, 16, 2^(lg-13), 16, 16) needs --sizes of 13 or more, got {args.sizes}")
    if args.calls is None:
        args.calls = 3 if args.ring else 200
    if args.child:
        if args.ring:
            ring_child(sizes, args.calls, layouts)
        else:
            child(sizes, args.calls)
        return 0
    r = subprocess.run([sys.executable, __file__, "--child", "--sizes", args.sizes,
                        "--calls", str(args.calls)] +
                       (["--ring", "--layouts", args.layouts] if args.ring else []),
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stdout[-2000:] + r.stderr[-4000:])
        return r.returncode
    if args.ring:
        ring_table(r.stdout)
        return 0
    data = parse(r.stdout)
    if not any(d["folded"] for d in data.values()):
        sys.stderr.write("no VGPT lines: every launch had one block (no fold)\n")
        return 2
    print("medians of the launches' stamps, us after the first block's entry (first / last block):")
    print("| bf16 pairs | launches | last entry | last flush | merged | arrived | folded | signalled |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for lg in sizes:
        d = data.get(lg)
        if not d or not d["folded"]:
            print(f"| 2^{lg} | 0 | (one block: no fold) | | | | | |")
            continue
        m = {f: statistics.median(v) for f, v in d.items()}
        print(f"| 2^{lg} | {len(d['folded'])} | {m['entry_last']:.2f} | {m['flushed_first']:.2f} / "
              f"{m['flushed_last']:.2f} | {m['merged_first']:.2f} / {m['merged_last']:.2f} | "
              f"{m['arrived_first']:.2f} / {m['arrived_last']:.2f} | {m['folded']:.2f} | "
              f"{m['signalled']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
