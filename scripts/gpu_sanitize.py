"""A small program exercising every CUDA kernel of vgct_ext once, for compute-sanitizer.

    compute-sanitizer --tool memcheck  python3 scripts/gpu_sanitize.py
    compute-sanitizer --tool racecheck python3 scripts/gpu_sanitize.py

Covers: k_reduce_bulk (aligned contiguous typed pairs: the shared-memory ring; a transposed
matrix of rows of whole warp steps and the row-mode slices: its row path), k_reduce_flat
(misaligned scalar path, generic dtypes), k_reduce_gen
(transposed, stride 0, per-slice row mode), k_reduce_col (per-slice column mode),
k_reduce_lean (small inputs: every call below runs twice, once with the lean kernel and once
with the fast-path kernels, switched through the reduce's test hook vgct_cuda_test_lean_max; and
once more with the result record copied back from the device instead of written into the mapped
pinned buffer, vgct_cuda_test_mapped),
k_sel_data + k_sel_fin (in-place keys for small n, the one-block finish: ties and the selection;
at most 16384 pairs too, through the finish's hook vgct_cuda_test_fin = 2), k_sel_tiny (calls of
at most 12288 pairs by default, 16384 with k_sel_coop off: the selection chained behind the
reduction, reading the record's copy in the workspace; 64 quantiles with the record's answers
on), k_sel_coop (calls past 12288 pairs: the selection chained behind the reduction as one
cooperative grid, each block's keys in its shared memory -- most calls above in their default
modes; 64 quantiles, three blocks, one value, 2^20 pairs, nothing left to select, and from one
pair on),
k_sel_buf (the levels: a bucket too big for the finish, and every call once more with the finish
off through its hook vgct_cuda_test_fin; level-0 histogram + compaction above the candidate
buffer, forced through select.cu's plan hook), k_sel_sample + k_sel_window + the direct finish
(the window plan, above the candidate buffer), k_reduce_bulk<..., WIN = 0, 1, 2> +
k_win_count (the fused key window of one quantile: the sample's early verdict for the record,
the levels run again after it, the sparse way, every pair classified), the ranks the reduction's record answers (no selection, or
the selection of the rest), k_fingerprint.  Prints one line per call and
"sanitize script: done" at the end; exits non-zero on any exception.
"""

import ctypes
import sys

import torch

import vgct_ext


def main():
    dev = torch.device("cuda", 0)
    g = torch.Generator(device=dev)
    g.manual_seed(1)

    def pair(shape, dt):
        e = torch.randn(shape, generator=g, device=dev)
        a = e + torch.randn(shape, generator=g, device=dev) * 1e-2
        return a.to(dt), e.to(dt)

    calls = []
    a, e = pair((50_003,), torch.bfloat16)
    calls.append(("flat bf16", a, e, None))
    calls.append(("flat misaligned", a[1:], e[1:], None))
    a4, e4 = pair((20_005,), torch.float64)
    calls.append(("flat float64 (scaled ring)", a4, e4, None))
    calls.append(("flat bf16 vs fp32 (48-byte chunks)", a4.to(torch.bfloat16), e4.to(torch.float32), None))
    a6, e6 = pair((40, 1024), torch.bfloat16)  # rows of 1024: whole warp steps (ring_layout)
    calls.append(("ring transposed (two inner axes)", a6.t(), e6.t(), None))
    a2, e2 = pair((96, 130), torch.float32)
    calls.append(("gen transposed", a2.t(), e2.t(), None))
    calls.append(("gen stride0", a2[:1].expand(50, 130), e2[:1].expand(50, 130), None))
    calls.append(("gen mixed layouts (float32: one chunk in flight)", a2, e2.t().contiguous().t(), None))
    a5, e5 = pair((4, 4163), torch.float32)  # rows >= VG_ROW_MIN: row mode, one chunk in flight, a partial chunk
    calls.append(("row slices, mixed layouts (float32: one chunk in flight)", a5, e5.t().contiguous().t(), 0))
    a3, e3 = pair((2, 4, 8, 32, 40), torch.bfloat16)
    calls.append(("row slices", a3, e3, 1))
    calls.append(("col slices", a3, e3, 4))
    calls.append(("generic dtypes", a3.to(torch.float8_e4m3fn), e3.to(torch.int32), 2))
    a9, e9 = pair((128, 128), torch.bfloat16)  # TINY_CAP pairs: k_sel_tiny's most (with k_sel_coop off)
    calls.append(("small call, 16384 pairs (k_sel_coop; k_sel_tiny below)", a9, e9, None))
    a7, e7 = pair((3001,), torch.bfloat16)  # <= TINY_CAP pairs: k_sel_tiny
    a7[::7] = float("nan")  # non-finite pairs' keys above every finite one
    calls.append(("small call, NaN pairs (k_sel_tiny)", a7, e7, None))
    a8, e8 = pair((64, 100), torch.float32)
    calls.append(("small call transposed (k_sel_tiny)", a8.t(), e8.t(), None))
    calls.append(("small call, row slices (k_sel_tiny, the record in the workspace)", a8, e8, 0))
    big_a, big_e = pair((1_700_000,), torch.float16)  # above the select buffer (1.5M keys)
    calls.append(("select windows", big_a, big_e, None))
    calls.append(("select windows float64 (keys made first)", big_a.double(), big_e.double(), None))
    two = torch.full((40_001,), 1.5, dtype=torch.float64, device=dev)
    two[1::2] += 2.0 ** -20  # |d| 0.5 or 0.5 + 2^-20: one bucket of 40001 keys, two values:
    calls.append(("select big two-valued bucket", two, torch.ones_like(two), None))  # the levels
    lib = ctypes.CDLL(vgct_ext._C.__file__)
    lean = ctypes.c_longlong.in_dll(lib, "vgct_cuda_test_lean_max")
    sel = (ctypes.c_longlong * 4).in_dll(lib, "vgct_cuda_test_sel")
    fin = ctypes.c_longlong.in_dll(lib, "vgct_cuda_test_fin")
    fuse = ctypes.c_longlong.in_dll(lib, "vgct_cuda_test_fuse")
    mapped = ctypes.c_longlong.in_dll(lib, "vgct_cuda_test_mapped")
    known = ctypes.c_longlong.in_dll(lib, "vgct_cuda_test_known")
    coop = (ctypes.c_longlong * 2).in_dll(lib, "vgct_cuda_test_coop")
    try:
        # "copied": the result record through the device workspace and a copy back instead of
        # the mapped pinned buffer (cuda/reduce.cu vgct_cuda_test_mapped)
        # "finish": small calls through the level-0 histogram and the finish (fin hook 2)
        for mode, lean_max, fin_off, copied in (("lean", 1 << 62, 0, 0), ("fast", 0, 0, 0),
                                                ("levels", 0, 1, 0), ("copied", 0, 0, 1),
                                                ("finish", 1 << 62, 2, 0)):
            lean.value, fin.value, mapped.value = lean_max, fin_off, copied
            for name, x, y, dim in calls:
                s = vgct_ext.compare(x, y, quantiles=(0.5, 0.99), dim=dim)
                print(f"[{mode}] {name}: n={s.n} rel_l2={s.rel_l2:.3e} p99={s.quantiles[0.99]:.3e}",
                      flush=True)
        lean.value, fin.value, mapped.value = -1, 0, 0
        # the fused key window (k_reduce_bulk<..., WIN = 1>): one window (p99), the ring kernel
        # (lean off), the window plan at any n; a partial last chunk, the identical pair (lo = 0:
        # whole chunks of d == 0), and a 64-key sample whose wide window overflows the warps'
        # stages (keys straight to the region)
        # every rank to the selection (the identical pair's p99 would be answered by the record)
        lean.value, sel[0], fuse.value, known.value = 0, 1, 3, 1  # fuse below WIN_FUSE_MIN, never skip
        ov_a, ov_e = a4.float(), e4.float()  # NaN, Inf, a float32 overflow: chunks keyed pair by pair
        ov_a[::997], ov_a[5::1999], ov_a[7::4001], ov_e[7::4001] = float("nan"), float("inf"), 3e38, -3e38
        fused = [("fused bf16", a, e), ("fused bf16 vs fp32", a4.to(torch.bfloat16), e4.to(torch.float32)),
                 ("fused fp16 (1.7M)", big_a, big_e), ("fused identical", e, e.clone()),
                 ("fused fp32 NaN/Inf/overflow", ov_a, ov_e)]
        for sample in (0, 64):
            sel[1] = sample
            for name, x, y in fused:
                s = vgct_ext.compare(x, y, quantiles=(0.99,))
                print(f"[fused, sample {sample}] {name}: n={s.n} p99={s.quantiles[0.99]:.3e}", flush=True)
        sel[1] = 0
        fuse.value = 2  # the fused plan, the window left to the record by k_sel_sample's last
        # block (win_early: the sample's levels return at once); every rank still goes to the
        # selection (known = 1), so the levels run again and the window pass after the reduction
        s = vgct_ext.compare(a, e, quantiles=(0.99,))
        print(f"[fused, skipped] fused bf16: n={s.n} p99={s.quantiles[0.99]:.3e}", flush=True)
        # the automatic rule (win_early's verdict from the sample's counts) at this small n: the
        # record left to answer (identical; 0.1% unequal), or the window in the reduction (noise)
        fuse.value, known.value = 5, 0
        sparse = e.clone()
        sparse[::1000] += 1.0
        for name, x, y in (("fused identical", e, e.clone()), ("fused sparse 0.1%", sparse, e),
                           ("fused bf16", a, e)):
            s = vgct_ext.compare(x, y, quantiles=(0.99,))
            print(f"[fused, automatic] {name}: n={s.n} p99={s.quantiles[0.99]:.3e}", flush=True)
        known.value = 1
        fuse.value = 4  # every pair classified in the fold (VG_WIN_EVERY)
        for sample in (0, 64):
            sel[1] = sample
            for name, x, y in fused:
                s = vgct_ext.compare(x, y, quantiles=(0.99,))
                print(f"[fused, every pair, sample {sample}] {name}: n={s.n} "
                      f"p99={s.quantiles[0.99]:.3e}", flush=True)
        sel[1] = 0
        fuse.value = 0
        sel[0] = 2  # no window plan: the data histograms and the compaction
        s = vgct_ext.compare(big_a, big_e, quantiles=(0.5, 0.99))
        print(f"select compaction: n={s.n} p99={s.quantiles[0.99]:.3e}", flush=True)
        # the ranks the reduction's record answers (zeros, the maximum): no selection, or the
        # selection of the rest only
        sel[0], known.value = 0, 0
        sparse = e.clone()
        sparse[::1000] += 1.0
        for name, x, y in (("identical", e, e.clone()), ("sparse 0.1%", sparse, e)):
            s = vgct_ext.compare(x, y, quantiles=(0.5, 0.99, 0.9995, 1.0))
            print(f"[record] {name}: n={s.n} p99={s.quantiles[0.99]:.3e} max={s.quantiles[1.0]:.3e}",
                  flush=True)
        # k_sel_tiny with every quantile allowed (128 ranks asked), the record's answers on: none
        # left to it on the identical pair; the ranks above the zeros (about a third) on the other
        qs64 = tuple(j / 63 for j in range(64))
        third = e7.clone()
        third[::3] = a7[::3]  # a third of the pairs unequal (some NaN): the low ranks are zeros
        for name, x, y in (("small identical", e7, e7.clone()), ("small, a third unequal", third, e7)):
            s = vgct_ext.compare(x, y, quantiles=qs64)
            print(f"[record, 64 quantiles] {name}: n={s.n} p99={s.quantiles[qs64[62]]:.3e}", flush=True)
        # k_sel_coop: 64 quantiles (up to 16 batches of ranks) with the record's answers on; a
        # grid of three blocks (the cap hook); every |d| one value (no radix pass: the extra
        # barrier); 2^20 pairs on every SM; an identical pair and all-NaN pairs (nothing left:
        # every block reads the record and leaves, the last one answers); hook 2: from one pair on
        coop[0], coop[1] = 0, 0
        big = pair((1 << 20,), torch.bfloat16)
        third = big[1].clone()
        third[::3] = big[0][::3]
        one = torch.full((60_000,), 0.5, device=dev)
        nan = torch.full((60_000,), float("nan"), device=dev)
        for name, x, y, qs, blocks in (("coop, a third unequal, 64 quantiles", third, big[1], qs64, 0),
                                       ("coop, 2^20 pairs", big[0], big[1], (0.5, 0.99), 0),
                                       ("coop, identical (nothing left)", big[1], big[1].clone(),
                                        (0.5, 0.99), 0),
                                       ("coop, all NaN (nothing left)", nan, nan, (0.99,), 0),
                                       ("coop, three blocks", a, e, (0.5, 0.99), 3),
                                       ("coop, one value", one, torch.zeros_like(one), (0.5, 0.99), 0)):
            coop[1] = blocks
            s = vgct_ext.compare(x, y, quantiles=qs)
            print(f"[coop] {name}: n={s.n} q={s.quantiles[qs[-1]]}", flush=True)
        coop[0] = 1  # k_sel_tiny's most keys (by default k_sel_coop past 12288 pairs)
        s = vgct_ext.compare(a9, e9, quantiles=(0.5, 0.99))
        print(f"[tiny, coop off] 16384 pairs: n={s.n} p99={s.quantiles[0.99]:.3e}", flush=True)
        coop[0], coop[1] = 2, 0
        for name, x, y, _ in calls[:4]:
            s = vgct_ext.compare(x, y, quantiles=(0.5, 0.99))
            print(f"[coop from one pair] {name}: n={s.n} p99={s.quantiles[0.99]:.3e}", flush=True)
        s = vgct_ext.compare(a7[1:2], e7[1:2], quantiles=(0.5, 0.99))
        print(f"[coop from one pair] one pair: n={s.n} p99={s.quantiles[0.99]:.3e}", flush=True)
    finally:
        coop[0] = coop[1] = 0
        lean.value, sel[0], sel[1], fin.value, fuse.value, mapped.value = -1, 0, 0, 0, 0, 0
        known.value = 0
    for name, x, _, _ in calls:
        print(f"fingerprint {name}: {vgct_ext.fingerprint(x):016x}", flush=True)
    torch.cuda.synchronize()
    print("sanitize script: done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
