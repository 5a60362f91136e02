"""Overhead of the method layer: ``assert_t1`` / ``assert_t2`` against ``vgct_ext.compare`` alone, CPU.

Prints a table: shape, dim, median time of compare, of assert_t1 (no pytest session, and inside a session as
the plugin runs it), and the ratio to compare. The target (docs/method.md): a gate costs at most 2x its
comparison. A second table: ``assert_t2`` gating one channel slice of 128 (the per-slice pattern of
docs/method.md), each slice its own entry in one evidence file, against compare on that slice. Not a test:
timings depend on the machine; run by hand:

    python bench/bench_gates.py [--repeat 50]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import vgct_ext
from vgct_ext.method import _context
from vgct_ext.gates import assert_t1, assert_t2
from vgct_ext.method import evidence as ev
from vgct_ext.method._hardware import stratum_of


def _median_s(fn, repeat: int) -> float:
    fn()  # warm-up: py-cpuinfo's first call, imports
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=50)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    for shape, dim in (((4, 4096), None), ((4, 4096), 1), ((64, 4096), 1), ((1, 16, 64, 64), 1)):
        e = rng.standard_normal(shape)
        a = e.copy()  # passes the float64 T1 bars (u-level since the dtype-aware bands); cost is the same
        t_cmp = _median_s(lambda: vgct_ext.compare(a, e, rtol=1e-3, atol=1e-3, quantiles=(0.99,), dim=dim),
                          args.repeat)
        t_bare = _median_s(lambda: assert_t1(a, e, component="c", feature="f", dim=dim), args.repeat)
        s = _context.Session()
        _context.push_session(s)
        try:
            t_sess = _median_s(lambda: assert_t1(a, e, component="c", feature="f", dim=dim), args.repeat)
        finally:
            _context.pop_session(s)
        rows.append(("x".join(map(str, shape)), str(dim), t_cmp, t_bare, t_sess))
    print(f"{'shape':<14}{'dim':<6}{'compare':>12}{'assert_t1':>12}{'ratio':>8}{'in session':>12}{'ratio':>8}")
    for shape, dim, c, b, s in rows:
        print(f"{shape:<14}{dim:<6}{c * 1e3:>10.3f}ms{b * 1e3:>10.3f}ms{b / c:>8.2f}{s * 1e3:>10.3f}ms{s / c:>8.2f}")

    print()
    _per_slice_t2(args.repeat)


def _per_slice_t2(repeat: int, channels: int = 128, tokens: int = 256) -> None:
    rng = np.random.default_rng(0)
    e = rng.standard_normal((tokens, channels)).astype(np.float32)
    a = (e * (1 + 1e-3 * rng.standard_normal(e.shape))).astype(np.float32)
    run = {"rel_l2": 1e-3, "cosine": 0.999999, "p99": 1e-2, "max_abs_err": 1e-2, "test": "t", "seed": 0}
    entry = {"kind": "t2", "dtype_actual": "float32", "dtype_expected": "float32", "shape": [tokens], "dim": None,
             "runs": [dict(run, seed=i) for i in range(5)],
             "bars": {"rel_l2": 1.0, "cosine": 0.9, "p99": 1.0, "max_abs_err": 1.0}, "investigation": "bench"}
    entries = {ev.evidence_key("c", "f", f"channel {c}"): {stratum_of("cpu"): entry} for c in range(channels)}
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "bench.vgct-evidence.json"
        path.write_text(json.dumps({"format": ev.FORMAT, "entries": entries}, indent=2))
        time.sleep(ev._RACY_NS / 1e9 + 0.1)  # a file written just now is parsed at every gate; a committed one is not
        col = np.ascontiguousarray(a[:, 5]), np.ascontiguousarray(e[:, 5])
        t_cmp = _median_s(lambda: vgct_ext.compare(*col, quantiles=(0.99,)), repeat)
        t_gate = _median_s(lambda: assert_t2(*col, component="c", feature="f", case="channel 5", evidence=path),
                           repeat)
        size = path.stat().st_size
    print(f"assert_t2 on one channel slice of {channels} (evidence file {size / 1e3:.0f} KB, {channels} entries)")
    print(f"{'compare':>12}{'assert_t2':>12}{'ratio':>8}")
    print(f"{t_cmp * 1e3:>10.3f}ms{t_gate * 1e3:>10.3f}ms{t_gate / t_cmp:>8.2f}")


if __name__ == "__main__":
    main()
