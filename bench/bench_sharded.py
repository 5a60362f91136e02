"""Sharded compare vs gather-then-compare: bytes communicated and time, with a ratio table.

Each of W ranks (``vgct_ext.testing.distributed.run_ranks``: local processes, gloo on CPU or
NCCL with one GPU per rank) holds a shard of 2^k / W elements of ``actual`` and ``expected``
(seeded noise: expected ~ N(0, 1), actual = expected + N(0, 1e-2), in --dtype). Per repeat,
after a barrier, every rank times

  sharded  ``vgct_ext.sharded.compare_sharded(a, e, shard_dim=0, quantiles=(0.99,))``: one
           all_gather_object of ~0.5 KB records + four histogram all_reduces;
  gather   ``all_gather`` of both shards (as bytes) into full tensors on every rank, then
           ``vgct_ext.compare(full_a, full_e, quantiles=(0.99,))`` -- what a test does without
           [E];

the time of a repeat is the slowest rank's, the table shows the median over repeats. Bytes are
what one rank receives from the collectives (``last_call_info()["comm_bytes"]`` for sharded; the
full tensors for gather). Both results are checked to agree (exact fields equal).

    python bench/bench_sharded.py                      # CPU, gloo, 2 ranks, 2^24 elements
    python bench/bench_sharded.py --log2n 28           # the issue's size (2 GiB+ of RAM/rank)
    python bench/bench_sharded.py --backend nccl --device cuda --log2n 28   # 2 GPUs
    python bench/bench_sharded.py --markdown           # a docs/performance.md row

VGCT_NUM_THREADS (default here: CPUs / ranks) sets each rank's engine threads on CPU.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _sync(torch, device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def rank_bench(rank, world, log2n, dtype_name, device, repeat, seed):
    import torch
    import torch.distributed as dist

    import vgct_ext
    from vgct_ext.sharded import compare_sharded, last_call_info

    if device == "cuda":
        device = f"cuda:{torch.cuda.current_device()}"
    dtype = getattr(torch, dtype_name)
    n = 1 << log2n
    m = n // world + (1 if rank < n % world else 0)
    g = torch.Generator(device=device).manual_seed(seed + rank)
    e32 = torch.randn(m, generator=g, device=device)
    a = (e32 + 1e-2 * torch.randn(m, generator=g, device=device)).to(dtype)
    e = e32.to(dtype)
    del e32
    sizes = [n // world + (1 if r < n % world else 0) for r in range(world)]

    def sharded():
        return compare_sharded(a, e, shard_dim=0, quantiles=(0.99,))

    def gathered():
        outs = []
        for x in (a, e):
            xb = x.view(torch.uint8)  # bytes: any dtype through any backend
            isz = x.element_size()
            parts = [torch.empty(s * isz, dtype=torch.uint8, device=device) for s in sizes]
            if len(set(sizes)) == 1:
                dist.all_gather(parts, xb)
            else:  # uneven: pad to the largest shard
                big = max(sizes) * isz
                pad = torch.zeros(big, dtype=torch.uint8, device=device)
                pad[: xb.numel()] = xb
                full = [torch.empty(big, dtype=torch.uint8, device=device) for _ in sizes]
                dist.all_gather(full, pad)
                parts = [f[: s * isz] for f, s in zip(full, sizes)]
            outs.append(torch.cat(parts).view(dtype))
            del parts
        return vgct_ext.compare(outs[0], outs[1], quantiles=(0.99,))

    res = {}
    for name, fn in (("sharded", sharded), ("gather", gathered)):
        times = []
        for it in range(repeat + 1):  # the first run warms up (allocations, NCCL setup)
            dist.barrier()
            _sync(torch, device)
            t0 = time.perf_counter()
            s = fn()
            _sync(torch, device)
            dt = time.perf_counter() - t0
            if it:
                times.append(dt)
        res[name] = (times, s)
    compare_sharded(a, e, shard_dim=0, quantiles=(0.99,))
    info = last_call_info()
    esz = a.element_size() + e.element_size()
    return {
        "times": {k: v[0] for k, v in res.items()},
        "stats": {k: v[1] for k, v in res.items()},
        "sharded_bytes": info["comm_bytes"],
        "record_bytes": info["record_bytes"],
        "histogram_bytes": info["histogram_bytes"],
        "local_seconds": info["local_seconds"],
        "gather_bytes": n * esz,
        "device": device,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log2n", type=int, default=24, help="total elements 2^k (default 24; the issue's size: 28)")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--backend", default="gloo", help="gloo (CPU) or nccl (GPUs)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--markdown", action="store_true", help="print only the table row")
    args = ap.parse_args(argv)

    sys.path.insert(0, os.path.dirname(HERE))
    from vgct_ext.testing.distributed import run_ranks

    env = {"NCCL_NVLS_ENABLE": "0"}
    if args.device == "cpu":
        env.setdefault("VGCT_NUM_THREADS", os.environ.get(
            "VGCT_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.world))))
        env["OMP_NUM_THREADS"] = env["VGCT_NUM_THREADS"]
    out = run_ranks(rank_bench, args.world, backend=args.backend, env=env, timeout=1800,
                    args=(args.log2n, args.dtype, args.device, args.repeat, args.seed))

    # the slowest rank's time per repeat, median over repeats
    def med(name):
        per = zip(*[o["times"][name] for o in out])
        return statistics.median(max(t) for t in per)

    ts, tg = med("sharded"), med("gather")
    bs, bg = out[0]["sharded_bytes"], out[0]["gather_bytes"]
    s0, g0 = out[0]["stats"]["sharded"], out[0]["stats"]["gather"]
    same = all(getattr(s0, f) == getattr(g0, f) for f in
               ("n", "n_finite", "max_abs_err", "max_abs_err_index", "quantiles", "mismatches",
                "n_unequal", "max_rel_err_index"))
    same = same and abs(s0.rel_l2 - g0.rel_l2) <= 1e-12 * g0.rel_l2
    dev = "cpu" if args.device == "cpu" else "cuda"
    hw = platform.processor() or platform.machine()
    if args.device == "cuda":
        import torch

        hw = torch.cuda.get_device_name(0)
    threads = env.get("VGCT_NUM_THREADS", "-")
    row = (f"| 2^{args.log2n} {args.dtype} | {args.world} x {dev} ({args.backend}) | {ts * 1e3:.0f} ms | "
           f"{tg * 1e3:.0f} ms | {tg / ts:.2f}x | {bs / 2**20:.2f} MiB | {bg / 2**20:.0f} MiB | "
           f"{bg / bs:.0f}x | {'yes' if same else 'NO'} |")
    if args.markdown:
        print(row)
        return 0 if same else 1
    print(f"# bench_sharded: {args.world} ranks, {args.backend}, {dev} ({hw}), "
          f"{os.cpu_count()} CPUs, VGCT_NUM_THREADS={threads}, repeat {args.repeat}")
    print(f"# sharded per rank: record {out[0]['record_bytes']} B, histograms "
          f"{out[0]['histogram_bytes']} B, local C time {out[0]['local_seconds'] * 1e3:.0f} ms")
    print("| elements | ranks | sharded | gather+compare | time ratio | sharded bytes/rank | "
          "gather bytes/rank | bytes ratio | same result |")
    print("|---|---|---|---|---|---|---|---|---|")
    print(row)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
