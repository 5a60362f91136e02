"""Overhead of the method layer: ``assert_t1`` / ``assert_t2`` against ``vgct_ext.compare`` alone, CPU.

Prints a table: shape, dim, median time of compare, of assert_t1 (no pytest session, and inside a session as
the plugin runs it), and the ratio to compare. The target (docs/method.md): a gate costs at most 2x its
comparison. Not a test: timings depend on the machine; run by hand:

    python bench/bench_gates.py [--repeat 50]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import vgct_ext
from vgct_ext.method import _context
from vgct_ext.gates import assert_t1


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
        a = e * (1 + 1e-5)
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


if __name__ == "__main__":
    main()
