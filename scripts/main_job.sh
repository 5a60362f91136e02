#!/usr/bin/env bash
# The main job: build vgct_ext and run it on its embedded default.
#   bash scripts/main_job.sh
# Until the example component suite lands, the default is a paired comparison of a built-in
# bfloat16 tensor against its float32 reference, printed as an evidence table.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_env.sh

vgct_build

if [ -f vgct_ext/__main__.py ] && grep -q '"demo"' vgct_ext/__main__.py; then
  exec "$PY" -m vgct_ext demo "$@"
fi

exec "$PY" - "$@" <<'PYEOF'
"""Built-in pair: y = x @ W computed in float32 (reference) and rounded to bfloat16 (actual)."""
import sys

import numpy as np

import vgct_ext
from vgct_ext import _C
from vgct_ext._stats import PairedStats

rng = np.random.default_rng(20240601)
x = rng.standard_normal((16, 256), dtype=np.float32)
w = rng.standard_normal((256, 64), dtype=np.float32) / 16
ref = x @ w                                   # float32 reference, shape (16 tokens, 64 channels)

# bfloat16 = the upper 16 bits of float32, rounded to nearest even (no torch needed)
u = ref.view(np.uint32).astype(np.uint64)
bf16_bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)

try:  # a real torch.bfloat16 tensor when torch is installed, else the same bits via _C
    import torch

    actual = torch.from_numpy(bf16_bits.view(np.int16)).view(torch.bfloat16)
    stats = vgct_ext.compare(actual, ref, quantiles=(0.5, 0.99, 1.0), dim=1)
    producer = f"torch {torch.__version__}"
except ImportError:
    stats = PairedStats._from_c(_C.compare(bf16_bits.view(np.int16), ref, 1e-3, 1e-3, (0.5, 0.99, 1.0), 1, None,
                                           "bfloat16", None))
    producer = "numpy (int16 bits read as bfloat16)"

bi = vgct_ext.build_info()
print("vgct_ext main job: built-in pair, y = x @ W, bfloat16 vs float32 reference")
print(f"  build: vgct_ext {bi['version']}, CUDA compiled: {bi['cuda_compiled']}, "
      f"GPUs: {bi['cuda_device_count']}, producer: {producer}")
print()
rows = [
    ("statistic", "value", "definition (docs/metrics.md)"),
    ("n / n_finite", f"{stats.n} / {stats.n_finite}", "pairs / pairs with both values finite"),
    ("rel_l2", f"{stats.rel_l2:.6e}", "||a-e||_2 / ||e||_2"),
    ("cosine", f"{stats.cosine:.9f}", "<a,e> / (||a|| ||e||)"),
    ("max_abs_err", f"{stats.max_abs_err:.6e} at {stats.max_abs_err_index}", "max |a-e| (lowest index on ties)"),
    ("p50 |a-e|", f"{stats.quantile(0.5):.6e}", "exact, numpy.quantile linear"),
    ("p99 |a-e|", f"{stats.p99:.6e}", "exact, numpy.quantile linear"),
    ("mean(a-e)", f"{stats.mean_diff:.6e}", "mean difference over finite pairs"),
    ("mismatches", f"{stats.mismatches} ({stats.mismatch_fraction:.2%})",
     f"|a-e| > atol + rtol|e|, rtol={stats.rtol:g} atol={stats.atol:g}"),
    ("n_unequal", f"{stats.n_unequal}", "pairs whose values differ"),
    ("non-finite", f"{stats.n - stats.n_finite}", "pairs with a NaN or Inf"),
]
w = stats.slices.worst()
rows.append(("worst channel", f"{w}: rel_l2 {stats.slices.rel_l2[w]:.3e}, mean shift {stats.slices.mean_shift[w]:.3e}",
             "per-channel statistics along dim=1"))
widths = [max(len(r[i]) for r in rows) for i in range(3)]
for k, r in enumerate(rows):
    print("  " + "  ".join(c.ljust(widths[i]) for i, c in enumerate(r)))
    if k == 0:
        print("  " + "  ".join("-" * widths[i] for i in range(3)))
print()
print("summary:", stats.summary())
# bfloat16 keeps 8 significant bits: relative rounding error <= 2^-9 per element
ok = stats.rel_l2 is not None and stats.rel_l2 <= 2.0 ** -9 and stats.n_finite == stats.n
print("verdict:", "PASS (rel_l2 <= 2^-9, the bfloat16 rounding bound)" if ok else "FAIL")
sys.exit(0 if ok else 1)
PYEOF
