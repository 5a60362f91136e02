"""Host wall of one small GPU call by what precedes it: ``vgct_ext.compare`` of a 2^20 bf16 pair
(bf16(e + 1e-2 N(0, 1)) against bf16(e), e ~ N(0, 1)), without quantiles and with the default p99, timed
alone (``time.perf_counter`` around the call; it returns after its own wait) when it follows the
previous call directly ("b2b"), a ``torch.cuda.synchronize()`` ("sync"), or 1 ms of host sleep with the
device idle ("idle": a test doing host work between compares).  Medians of 300 calls after 20 warm-up
calls, two rounds, in us (docs/performance.md, 2026-12-05: idle costs ~16 us more than b2b).

    python bench/bench_small_idle.py        # on a machine with a CUDA GPU
"""
import statistics, time, torch, vgct_ext
g = torch.Generator(device="cuda").manual_seed(2)
e = torch.randn(1 << 20, device="cuda", generator=g)
a = (e + 1e-2 * torch.randn(1 << 20, device="cuda", generator=g)).bfloat16(); e = e.bfloat16()
def run(mode, q, reps=300):
    f = lambda: vgct_ext.compare(a, e, quantiles=q)
    for _ in range(20): f()
    w = []
    for _ in range(reps):
        if mode == "sync": torch.cuda.synchronize()
        elif mode == "idle": time.sleep(0.001)   # the device idle 1 ms, as between a test's steps
        t = time.perf_counter(); f(); w.append((time.perf_counter() - t) * 1e6)
    return statistics.median(w)
for r in range(2):
    for q in (None, (0.99,)):
        print(f"round {r} q={q}: " + "  ".join(f"{m} {run(m, q):.1f}" for m in ("b2b", "sync", "idle")), flush=True)
