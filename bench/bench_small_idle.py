"""Host wall of one small GPU call by what precedes it: ``vgct_ext.compare`` of a 2^20 bf16 pair
(bf16(e + 1e-2 N(0, 1)) against bf16(e), e ~ N(0, 1)), without quantiles and with the default p99, timed
alone (``time.perf_counter`` around the call; it returns after its own wait) when it follows the
previous call directly ("b2b"), a ``torch.cuda.synchronize()`` ("sync"), or 1 ms of host sleep with the
device idle ("idle": a test doing host work between compares).  Medians of 300 calls after 20 warm-up
calls, two rounds, in us (docs/performance.md, 2026-12-05: idle costs ~16 us more than b2b).

    python bench/bench_small_idle.py        # on a machine with a CUDA GPU
"""
import time

import torch

from bench_gpu import make_pair  # bench/ is sys.path[0]: the issue table's small-call pair (seed 2)
from gpu_diag import wall_us
import vgct_ext

a, e = make_pair((1 << 20,), torch.bfloat16, seed=2)
BEFORE = {"b2b": None, "sync": torch.cuda.synchronize,
          "idle": lambda: time.sleep(0.001)}  # idle: the device idle 1 ms, as between a test's steps
for r in range(2):
    for q in (None, (0.99,)):
        print(f"round {r} q={q}: " + "  ".join(
            f"{m} {wall_us(lambda: vgct_ext.compare(a, e, quantiles=q), 300, b):.1f}" for m, b in BEFORE.items()),
            flush=True)
