"""Cases of test_sharded.py: global tensors, their shards, and the per-rank job.

Imported both by the test (to build the gathered tensors and run ``vgct_ext.compare`` on them)
and by each rank that ``vgct_ext.testing.distributed.run_ranks`` starts (to build its shard and
run ``compare_sharded``). Tensors are built from fixed seeds with NumPy, so every process
builds the same ones; shards are views (``narrow``) of the global tensors, so strided global
tensors give strided shards.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Sequence, Tuple

import numpy as np

from vgct_ext.testing.distributed import even_sizes, shard_offsets


def uneven_sizes(total: int, world: int) -> List[int]:
    """Uneven shard lengths summing to total, one of them 0 when world >= 3."""
    w = [5, 1, 0, 3, 2, 7, 4, 6][:world]
    if sum(w) == 0:
        w = [1] * world
    sizes = [total * x // sum(w) for x in w]
    sizes[-1 if w[-1] else 0] += total - sum(sizes)
    return sizes


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


# Each builder: (torch, device) -> (global actual, global expected), views of tensors built on
# `device` (so strides survive the move to a GPU).

def _f32_noise(torch, device, shape, seed, scale=1e-3):
    r = _rng(seed)
    e = r.standard_normal(shape).astype(np.float32)
    a = (e + scale * r.standard_normal(shape)).astype(np.float32)
    return torch.from_numpy(a).to(device), torch.from_numpy(e).to(device)


def b_f32(torch, device, world):
    return _f32_noise(torch, device, (6 * world + 1, 37), 1)


def b_bf16_vs_f32(torch, device, world):
    a, e = _f32_noise(torch, device, (3, 101, 8), 2, scale=1e-2)
    return a.to(torch.bfloat16), e


def b_slices_shard_dim(torch, device, world):
    a, e = _f32_noise(torch, device, (4, 50, 6), 3, scale=1e-2)
    e[:, 7, :] = 0.0  # a zero-reference slice
    a[:, 7, :] = 0.0
    e[:, 9, :] = 0.0  # zero reference, non-zero error
    return a, e


def b_strided(torch, device, world):
    # actual: every other column of a transposed buffer; expected: a column broadcast with
    # stride 0 along dim 0 plus a transpose -- both non-contiguous, different strides
    r = _rng(4)
    base_a = torch.from_numpy(r.standard_normal((2 * 40, 9)).astype(np.float32)).to(device)
    a = base_a.t()[:, ::2]                                   # (9, 40), strides (1, 18)
    base_e = torch.from_numpy(r.standard_normal((40, 1)).astype(np.float32)).to(device)
    e = base_e.t().expand(9, 40)                             # (9, 40), strides (0, 1)
    return a, e


def b_nonfinite_ties(torch, device, world):
    n = 8 * world
    a, e = _f32_noise(torch, device, (2, n), 5)
    a[:, :] = e  # exact pairs, then planted differences
    # max |a-e| tie: (1, 0) in rank 0's shard and (0, n-1) in the last rank's shard; the
    # lowest flat index is (0, n-1) although rank 0 comes first in the merge
    e[1, 0], a[1, 0] = 1.0, 5.0
    e[0, n - 1], a[0, n - 1] = 1.0, 5.0
    # max |a-e|/|e| = 4 at four places: the lowest is (0, n-2), in the last shard
    e[1, 1], a[1, 1] = 0.5, 2.5
    e[0, n - 2], a[0, n - 2] = 0.5, 2.5
    # non-finite values, several class mismatches; the first one is in the last shard
    a[1, 2] = float("nan")
    e[1, 3] = float("inf")
    a[1, 4], e[1, 4] = float("-inf"), float("-inf")     # same class: no mismatch
    a[0, n - 3], e[0, n - 3] = float("nan"), float("nan")  # equal (NaN vs NaN)
    a[0, n - 4] = float("inf")                          # class mismatch, lowest index
    e[1, n - 1] = float("-inf")
    return a, e


def b_f64_scaled(torch, device, world):
    r = _rng(6)
    e = r.standard_normal((5, 12 * world))
    a = e * (1 + 1e-6 * r.standard_normal(e.shape))
    k = e.shape[1]
    e[:, : k // 3] *= 1e300
    a[:, : k // 3] *= 1e300
    e[:, k // 3: 2 * k // 3] *= 1e-300
    a[:, k // 3: 2 * k // 3] *= 1e-300
    return torch.from_numpy(a).to(device), torch.from_numpy(e).to(device)


def b_f64_families(torch, device, world):
    """float64 shards whose sum families sit at far-apart scales, different on every rank:
    e ~ 1e250 in the first columns and ~1 after, a ~ 1e-200 * e (||a|| used to underflow
    against the shared scale of e), d with tiny entries next to larger ones; records of
    different scales are merged."""
    r = _rng(10)
    k = 12 * world
    e = r.standard_normal((4, k))
    a = 1e-200 * e * (1 + 1e-3 * r.standard_normal(e.shape))
    e[:, : k // 4] *= 1e250
    a[:, : k // 4] *= 1e250
    e[3] = 1e-290 * r.standard_normal(k)      # row 3: a = e + tiny differences, one huge pair
    a[3] = e[3] + 1e-300 * r.standard_normal(k)
    e[3, k - 1] = a[3, k - 1] = 1e-20
    return torch.from_numpy(a).to(device), torch.from_numpy(e).to(device)


def b_big_bf16(torch, device, world):
    r = _rng(7)
    e = torch.from_numpy(r.standard_normal((96, 3001)).astype(np.float32)).to(device)
    a = (e + torch.from_numpy((1e-2 * r.standard_normal((96, 3001))).astype(np.float32)).to(device))
    return a.to(torch.bfloat16), e.to(torch.bfloat16)


def b_int32(torch, device, world):
    r = _rng(8)
    e = r.integers(-1000, 1000, size=(7, 9 * world + 2)).astype(np.int32)
    a = e + r.integers(-2, 3, size=e.shape).astype(np.int32)
    return torch.from_numpy(a).to(device), torch.from_numpy(e).to(device)


def b_all_nan(torch, device, world):
    a = torch.full((3, 4 * world), float("nan"), device=device)
    e = torch.zeros((3, 4 * world), device=device)
    return a, e


def b_zero_ref(torch, device, world):
    a, _ = _f32_noise(torch, device, (4 * world, 5), 9)
    return a, torch.zeros_like(a)


def b_empty(torch, device, world):
    return torch.zeros((0, 3), device=device), torch.zeros((0, 3), device=device)


def b_identical(torch, device, world):
    """A bit-identical pair: every quantile rank is answered by the merged record (no histogram pass)."""
    e, _ = _f32_noise(torch, device, (6, 40 * world + 3), 11)
    return e.clone(), e


def b_sparse(torch, device, world):
    """0.5% of the pairs differ (every shard holds some), one NaN pair: the p99's ranks are zeros (the
    merged record answers them), the p99.9 and the median of the rest are not."""
    r = _rng(12)
    e = r.standard_normal((8, 100 * world)).astype(np.float32)
    a = e.copy()
    idx = r.choice(a.size, size=a.size // 200, replace=False)
    a.reshape(-1)[idx] += np.float32(0.5)
    a[0, 1] = np.nan
    return torch.from_numpy(a).to(device), torch.from_numpy(e).to(device)


# name -> (builder, shard_dim, sizes(total, world), compare kwargs)
CASES: Dict[str, Tuple[Callable, int, Callable, Dict[str, Any]]] = {
    "f32_even": (b_f32, 0, even_sizes, dict(quantiles=(0.0, 0.25, 0.5, 0.9, 0.99, 1.0))),
    "bf16_vs_f32_uneven_dim2": (b_bf16_vs_f32, 1, uneven_sizes,
                                dict(quantiles=(0.5, 0.99), dim=2, rtol=1e-2, atol=1e-3)),
    "slices_on_shard_dim": (b_slices_shard_dim, -2, uneven_sizes, dict(dim=1)),
    "strided_shards": (b_strided, 1, uneven_sizes, dict(quantiles=(0.1, 0.99), dim=0)),
    "nonfinite_ties": (b_nonfinite_ties, 1, even_sizes,
                       dict(quantiles=(0.5, 0.99, 1.0), rtol=0.0, atol=0.5)),
    "f64_scaled": (b_f64_scaled, 1, uneven_sizes, dict(dim=0, quantiles=(0.3, 0.999))),
    "f64_families": (b_f64_families, 1, uneven_sizes, dict(dim=0, quantiles=(0.5,))),
    "big_bf16": (b_big_bf16, 1, uneven_sizes, dict(quantiles=(0.5, 0.9, 0.99, 0.999))),
    "int32": (b_int32, 1, even_sizes, dict(quantiles=(0.5,), dim=1)),
    "all_nan": (b_all_nan, 1, even_sizes, dict(quantiles=(0.5, 0.99))),
    "zero_reference": (b_zero_ref, 0, uneven_sizes, dict(dim=0, quantiles=None)),
    "empty": (b_empty, 0, even_sizes, dict(dim=1)),
    "identical": (b_identical, 1, uneven_sizes, dict(quantiles=(0.5, 0.99, 1.0))),
    "sparse": (b_sparse, 1, uneven_sizes, dict(quantiles=(0.5, 0.99, 0.999, 1.0))),
}


def global_tensors(torch, name: str, world: int, device: str = "cpu"):
    builder = CASES[name][0]
    return builder(torch, device, world)


def shard_sizes(torch, name: str, world: int) -> Tuple[int, List[int]]:
    _, sd, sizes_fn, _ = CASES[name]
    a, _ = global_tensors(torch, name, world)
    sd = sd % a.dim()
    return sd, sizes_fn(a.shape[sd], world)


def local_shards(torch, name: str, rank: int, world: int, device: str = "cpu"):
    """This rank's views of the global tensors (narrow: strided when the global ones are)."""
    a, e = global_tensors(torch, name, world, device)
    _, sd, sizes_fn, _ = CASES[name]
    sd = sd % a.dim()
    sizes = sizes_fn(a.shape[sd], world)
    off = shard_offsets(sizes)
    return a.narrow(sd, off[rank], sizes[rank]), e.narrow(sd, off[rank], sizes[rank])


def _err(exc: BaseException) -> Tuple[str, str]:
    return type(exc).__name__, str(exc)


def rank_job(rank: int, world: int, names: Sequence[str], device: str = "cpu",
             extra: bool = True) -> Dict[str, Any]:
    """What each rank runs: every named case, then (extra) error and subgroup cases."""
    import torch
    import torch.distributed as dist

    from vgct_ext.sharded import compare_sharded, last_call_info

    if device == "cuda":
        device = f"cuda:{torch.cuda.current_device()}"
    out: Dict[str, Any] = {}
    for name in names:
        a, e = local_shards(torch, name, rank, world, device)
        _, sd, _, kw = CASES[name]
        try:
            s = compare_sharded(a, e, shard_dim=sd, **kw)
            out[name] = ("ok", s, last_call_info())
        except Exception as exc:  # noqa: BLE001 - reported to the test
            out[name] = ("error", _err(exc), None)
    if not extra:
        return out
    a, e = local_shards(torch, "f32_even", rank, world, device)
    # a rank whose shard has another width: ValueError on every rank
    try:
        aa, ee = (a, e) if rank != world - 1 else (a[:, 1:], e[:, 1:])
        compare_sharded(aa, ee, shard_dim=0)
        out["bad_shapes"] = ("ok", None, None)
    except Exception as exc:  # noqa: BLE001
        out["bad_shapes"] = ("error", _err(exc), None)
    # a rank passing other quantiles: ValueError on every rank (and no hang)
    try:
        compare_sharded(a, e, shard_dim=0, quantiles=(0.5,) if rank == 0 else (0.9,))
        out["bad_args"] = ("ok", None, None)
    except Exception as exc:  # noqa: BLE001
        out["bad_args"] = ("error", _err(exc), None)
    # a local failure on rank 0 (actual and expected differ in shape): ValueError there,
    # ShardedCompareError elsewhere
    try:
        compare_sharded(a[:-1] if rank == 0 else a, e, shard_dim=0)
        out["local_failure"] = ("ok", None, None)
    except Exception as exc:  # noqa: BLE001
        out["local_failure"] = ("error", _err(exc), None)
    # the stats still work after the failures (no rank left inside a collective)
    s = compare_sharded(a, e, shard_dim=0)
    out["after_failures"] = ("ok", s, last_call_info())
    # the CUDA digit plan (15/12/12/12/12 bits), exercised on the CPU engine
    import vgct_ext.sharded as sh

    saved = sh._LEVELS_CPU
    sh._LEVELS_CPU = sh._LEVELS_CUDA
    try:
        for name in ("f32_even", "big_bf16", "nonfinite_ties"):
            aa, ee = local_shards(torch, name, rank, world, device)
            _, sd, _, kw = CASES[name]
            out["cuda_levels:" + name] = ("ok", compare_sharded(aa, ee, shard_dim=sd, **kw),
                                          last_call_info())
    finally:
        sh._LEVELS_CPU = saved
    # a subgroup: the odd ranks compare their own gathered tensor (group rank order)
    if world >= 4:
        odd = [r for r in range(world) if r % 2 == 1]
        grp = dist.new_group(odd)
        if rank in odd:
            gr = odd.index(rank)
            aa, ee = local_shards(torch, "bf16_vs_f32_uneven_dim2", gr, len(odd), device)
            _, sd, _, kw = CASES["bf16_vs_f32_uneven_dim2"]
            s = compare_sharded(aa, ee, shard_dim=sd, group=grp, **kw)
            out["subgroup"] = ("ok", s, last_call_info())
        dist.barrier()
    return out
