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
"""
import argparse
import statistics
import subprocess
import sys

FIELDS = ("entry_last", "flushed_first", "flushed_last", "merged_first", "merged_last",
          "arrived_first", "arrived_last", "folded", "signalled")


def child(sizes, calls):
    import ctypes

    import torch

    import vgct_ext
    if not vgct_ext.build_info()["phase_trace"]:
        sys.exit("this _C is not a VGCT_PHASE_TRACE=1 build (vgct_ext.build_info()['phase_trace'])")
    libc = ctypes.CDLL(None)  # the device's printf lines sit in C's stdout buffer (a pipe)

    def sync():
        torch.cuda.synchronize()
        libc.fflush(None)
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
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.child:
        child(sizes, args.calls)
        return 0
    r = subprocess.run([sys.executable, __file__, "--child", "--sizes", args.sizes,
                        "--calls", str(args.calls)], capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stdout[-2000:] + r.stderr[-4000:])
        return r.returncode
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
