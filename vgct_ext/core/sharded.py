"""Sharded comparisons: :func:`compare_sharded` over ``torch.distributed``, without gathering tensors.

A parallel run leaves each rank with one shard of an output; the reference is the single-device
output. Every statistic of :func:`vgct_ext.compare` is *mergeable* (csrc/vgct_stats.h):

* sums (norms, dot product, sum of differences) are kept in float64 relative to power-of-two
  scales (float64 inputs: one per sum family) and merged with ``vgct_acc_merge`` -- equal to the single-tensor sums up to rounding
  (well within 1e-12 relative);
* maxima carry their flat index; with the shard's indices moved to the gathered tensor's index
  space first (``_C.remap_raw``) the lowest-index tie rule gives the same winner in any merge
  order: maxima, their indices and the values there are exact;
* counts are integers: exact;
* per-slice statistics are merged elementwise (slice axis != shard axis) or concatenated (slice
  axis == shard axis);
* quantiles of ``|a-e|`` are not mergeable as summaries, so they are selected exactly by a
  *distributed radix selection* over the float64 bit patterns of ``|a-e|`` (order-preserving
  as unsigned integers): histogram passes over the key's digits (CPU: 16/16/16/15 bits; CUDA:
  15/12/12/12/12 bits), each histogram summed over the ranks with one ``all_reduce``, give the
  exact order statistics that numpy's linear interpolation needs.

So each rank sends one small record (``vgct_acc``: 232 bytes, plus 56 bytes per slice when
``dim`` is given) through one ``all_gather_object``, then four (CPU) or five (CUDA) histogram
``all_reduce`` s of 2^width int64 counters per needed prefix (at most 0.5 MiB each for one
quantile), whatever the tensor size. All merging
and finalisation runs in C (``_C.merge_raw``, ``_C.finalize_raw``), through the same code that
builds :func:`vgct_ext.compare`'s result, so the returned :class:`~vgct_ext.PairedStats` is the
one ``compare()`` gives on the gathered tensors.

``torch`` is imported on the first call, never by ``import vgct_ext``.
"""

from __future__ import annotations

import pickle
import sys
import threading
import time
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from .. import _C
from . import _dlpack
from ._stats import PairedStats

__all__ = ["compare_sharded", "last_call_info", "ShardedCompareError"]

_KDL_CUDA = 2
_MAX_PREFIX_ROWS = _C.HIST_MAX_PREFIXES
# Radix levels: (key bits already known, digit width). The sign bit of |a-e| is always 0, so
# the first level starts from the 1-bit prefix "0". On the CPU four 16/16/16/15-bit digits
# (four passes over the shard; 65536 counters fit a core's L2); on CUDA five 15/12/12/12/12-bit
# digits (a 32768-bin row of 32-bit counters fits a block's shared memory; a pass costs far
# less there, and the histograms to all-reduce are smaller).
_LEVELS_CPU = ((1, 16), (17, 16), (33, 16), (49, 15))
_LEVELS_CUDA = ((1, 15), (16, 12), (28, 12), (40, 12), (52, 12))

_last = threading.local()


class ShardedCompareError(RuntimeError):
    """Raised on every rank when another rank of the group failed inside :func:`compare_sharded`.

    The failing rank raises its own exception (TypeError, ValueError, ...); the others raise
    this, naming the rank and its error, instead of waiting in a collective forever.
    """


def last_call_info() -> Dict[str, Any]:
    """Communication and timing of this thread's last :func:`compare_sharded` call.

    Keys: ``world_size``; ``comm_bytes`` -- bytes this rank received from collectives (the
    ``all_gather_object`` of the records: ``world_size`` x the largest pickled record plus the
    size exchange, and the summed histograms of each ``all_reduce``); ``record_bytes`` (this
    rank's pickled record); ``histogram_bytes``; ``collectives`` (number of collective calls);
    ``histogram_passes`` (0 when the merged record answers every rank); ``ranks_from_record``
    (distinct quantile ranks answered by the merged record -- zeros, the maximum -- without a
    histogram pass); ``seconds`` (wall time of the call); ``local_seconds`` (time in the local C
    reductions and histograms). Empty before the first call.
    """
    return dict(getattr(_last, "info", {}))


def _norm_axis(name: str, ax: Any, ndim: int) -> int:
    if isinstance(ax, bool) or not isinstance(ax, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(ax).__name__}")
    ax = int(ax)
    if not -ndim <= ax < ndim:
        raise ValueError(f"{name} {ax} out of range for a tensor of {ndim} dims")
    return ax % ndim


def _quantile_tuple(quantiles: Union[float, Iterable[float], None]) -> Tuple[float, ...]:
    if quantiles is None:
        return ()
    if isinstance(quantiles, (int, float)):
        return (float(quantiles),)
    return tuple(float(q) for q in quantiles)


def _comm_device(torch: Any, dist: Any, group: Any, device_type: int, device_id: int) -> Any:
    """Where the histogram tensors live: a CUDA device for NCCL, else the CPU (gloo, mpi...)."""
    backend = str(dist.get_backend(group)).lower()
    if "nccl" not in backend:
        return torch.device("cpu")
    if device_type == _KDL_CUDA:
        return torch.device("cuda", device_id)
    if "gloo" in backend:  # "cpu:gloo,cuda:nccl": CPU shards go through gloo
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def compare_sharded(local_actual: Any, local_expected: Any, *, shard_dim: int,
                    group: Any = None, rtol: float = 1e-3, atol: float = 1e-3,
                    quantiles: Union[float, Iterable[float], None] = (0.99,),
                    dim: Optional[int] = None) -> PairedStats:
    """:func:`vgct_ext.compare` of the gathered tensors, computed from each rank's shard.

    Collective: every rank of ``group`` must call it with its own shard and the same keyword
    arguments. The gathered tensors are the shards concatenated along ``shard_dim`` in group
    rank order (``torch.cat([shard of rank 0, shard of rank 1, ...], dim=shard_dim)``); the
    tensors themselves never travel.

    Args:
        local_actual, local_expected: this rank's shards, any DLPack objects ``compare()``
            accepts (torch tensors, numpy arrays, ...): same shape as each other, any strides
            (strided views are read in place), any supported dtypes. Across ranks, every dim
            but ``shard_dim`` must agree, and the dtypes must agree; the length along
            ``shard_dim`` may differ (uneven shards, including 0).
        shard_dim: the axis the shards split (negative counts from the end).
        group: the ``torch.distributed`` process group (default: the world), initialised by
            the caller: gloo for CPU tensors, NCCL for CUDA tensors (each rank's current CUDA
            device set to its shard's device, as ``all_gather_object`` requires); a
            ``"cpu:gloo,cuda:nccl"`` group serves both.
        rtol, atol, quantiles, dim: as in :func:`vgct_ext.compare`; ``dim`` may equal
            ``shard_dim`` (each rank's slices are then a contiguous run of the global ones).

    Returns:
        The :class:`vgct_ext.PairedStats` that ``compare()`` returns on the gathered tensors,
        on every rank: counts, maxima, indices (in the gathered tensor's shape), the values
        there and quantiles exactly; sums and the values derived from them (norms, rel_l2,
        cosine, mean_diff, slice sums) up to float64 rounding (relative differences far below
        1e-12). ``device`` is this rank's device. Communication: :func:`last_call_info`.

    Raises:
        TypeError, ValueError, BufferError, MemoryError, RuntimeError: as ``compare()``, on the
            rank whose shard is at fault; ValueError on every rank when the ranks' shapes,
            dtypes or arguments disagree.
        ShardedCompareError: on the other ranks when one rank failed.
        RuntimeError: torch.distributed is not initialised.
    """
    t_start = time.perf_counter()
    torch = sys.modules.get("torch")
    if torch is None:
        import torch  # noqa: F811 - lazy: import vgct_ext never imports torch
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("compare_sharded needs an initialised torch.distributed process group "
                           "(torch.distributed.init_process_group)")
    world = dist.get_world_size(group)
    me = dist.get_rank(group)
    if me < 0:
        raise ValueError("compare_sharded: this process is not a member of `group` (only the "
                         "group's ranks call it)")
    qs = _quantile_tuple(quantiles)
    info: Dict[str, Any] = {"world_size": world, "comm_bytes": 0, "histogram_bytes": 0,
                            "collectives": 0, "histogram_passes": 0, "ranks_from_record": 0,
                            "local_seconds": 0.0}
    _last.info = info

    # 1. Local reduction (no collective yet: a local failure is reported through the record,
    #    so that every rank raises instead of hanging in the next collective).
    a, da = _dlpack.prepare(local_actual)
    e, de = _dlpack.prepare(local_expected)
    stream = _dlpack.consumer_stream(a, e)
    local_exc: Optional[BaseException] = None
    try:
        t0 = time.perf_counter()
        r = _C.reduce_raw(a, e, rtol, atol, dim, stream, da, de)
        info["local_seconds"] += time.perf_counter() - t0
        ndim = len(r["shape"])
        sd = _norm_axis("shard_dim", shard_dim, ndim)
        rec: Dict[str, Any] = {
            "build": (_C.ACC_VERSION, _C.ACC_SIZE, _C.SLICE_ACC_SIZE),
            "args": (float(rtol), float(atol), qs, r["dim"], sd),
            "shape": tuple(r["shape"]),
            "dtypes": (r["dtype_actual"], r["dtype_expected"]),
            "device": (r["device_type"], r["device_id"]),
            "acc": r["acc"],
            "slices": r["slices"],
        }
    except Exception as exc:  # noqa: BLE001 - re-raised below, after telling the other ranks
        local_exc = exc
        rec = {"error": f"{type(exc).__name__}: {exc}"}
    info["record_bytes"] = len(pickle.dumps(rec))

    # 2. One all-gather of the small records.
    recs: List[Any] = [None] * world
    dist.all_gather_object(recs, rec, group=group)
    info["collectives"] += 1
    info["comm_bytes"] += world * 8 + world * max(len(pickle.dumps(x)) for x in recs)
    failed = [(i, x["error"]) for i, x in enumerate(recs) if "error" in x]
    if local_exc is not None:
        raise local_exc
    if failed:
        raise ShardedCompareError(
            f"compare_sharded: rank {failed[0][0]} of {world} failed: {failed[0][1]}"
            + (f" (and {len(failed) - 1} more ranks)" if len(failed) > 1 else ""))
    _check_consistent(recs, me)

    # 3. Indices into the gathered tensor, then the merge in rank order (C: vgct_acc_merge).
    lengths = [x["shape"][sd] for x in recs]
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).tolist()
    gshape = list(recs[0]["shape"])
    gshape[sd] = int(offsets[-1])
    gshape = tuple(gshape)
    accs = [_C.remap_raw(x["acc"], x["shape"], gshape, sd, int(offsets[i]))
            for i, x in enumerate(recs)]
    merged = _C.merge_raw(accs)
    slices = None
    dim_n = recs[0]["args"][3]
    if dim_n is not None:
        slices = _C.merge_slices_raw([x["slices"] for x in recs], dim_n == sd)

    # 4. Exact quantiles: the ranks the merged record decides (zeros below n_finite - n_unequal,
    #    the maximum: csrc/vgct_stats.h vgct_rank_known, as compare() does), then a distributed
    #    radix selection of the others -- none at all for an identical pair. Every rank holds the
    #    same merged record, so every rank takes the same branch (the collectives stay matched).
    n_finite = _C.acc_fields(merged)["n_finite"]
    keys = None
    if qs and n_finite > 0:
        ranks = _C.quantile_ranks(n_finite, qs)
        wanted = sorted({k for lo_hi in ranks for k in lo_hi})
        found = {k: _C.rank_key_known(merged, k) for k in wanted}
        rest = [k for k in wanted if found[k] is None]
        info["ranks_from_record"] = len(wanted) - len(rest)
        if rest:
            dev = _comm_device(torch, dist, group, *rec["device"])
            levels = _LEVELS_CUDA if rec["device"][0] == _KDL_CUDA else _LEVELS_CPU
            found.update(_radix_select(torch, dist, group, dev, a, e, stream, da, de, rest, n_finite,
                                       levels, info))
        keys = [found[k] for lo_hi in ranks for k in lo_hi]

    # 5. Finalise in C: the dict compare() builds.
    dta, dte = rec["dtypes"]
    d = _C.finalize_raw(merged, slices, gshape, dta, dte, rec["device"][0], rec["device"][1],
                        float(rtol), float(atol), qs, keys, dim_n)
    info["seconds"] = time.perf_counter() - t_start
    return PairedStats._from_c(d)


def _check_consistent(recs: Sequence[Dict[str, Any]], me: int) -> None:
    """ValueError (on every rank alike) when the ranks' records cannot describe one tensor."""
    r0 = recs[0]
    sd = r0["args"][4]
    problems = []
    for i, x in enumerate(recs):
        if x["build"] != r0["build"]:
            problems.append(f"rank {i} runs another vgct_ext build (record layout {x['build']} "
                            f"vs {r0['build']} on rank 0)")
        if x["args"] != r0["args"]:
            problems.append(f"rank {i} passed other arguments (rtol, atol, quantiles, dim, "
                            f"shard_dim) = {x['args']} than rank 0 {r0['args']}")
        if x["dtypes"] != r0["dtypes"]:
            problems.append(f"rank {i} has dtypes {x['dtypes']}, rank 0 {r0['dtypes']}")
        if x["device"][0] != r0["device"][0]:
            problems.append(f"rank {i} has its shard on device type {x['device'][0]}, rank 0 on "
                            f"{r0['device'][0]}")
        s, s0 = x["shape"], r0["shape"]
        if len(s) != len(s0) or any(k != sd and s[k] != s0[k] for k in range(len(s0))):
            problems.append(f"rank {i} has a shard of shape {tuple(s)}, rank 0 {tuple(s0)}: only "
                            f"dim {sd} (shard_dim) may differ")
    if problems:
        raise ValueError(f"compare_sharded (rank {me} of {len(recs)}): the shards do not form "
                         "one tensor: " + "; ".join(problems))


def _radix_select(torch: Any, dist: Any, group: Any, dev: Any, a: Any, e: Any,
                  stream: Optional[int], da: Optional[str], de: Optional[str],
                  wanted: Sequence[int], n_finite: int, levels: Sequence[Tuple[int, int]],
                  info: Dict[str, Any]) -> Dict[int, int]:
    """Selection keys (bits of |a-e|) of the given global 0-based ranks among finite pairs.

    Each level histograms, on every rank, the next digit of the keys that share a known
    prefix with a wanted rank (``_C.histogram``), sums the histograms over the group with one
    ``all_reduce`` and narrows every wanted rank to one bucket; after the last level the prefix
    is the whole key (the levels' digits cover bits 62..0). One extra int64 carries local
    failures, so no rank waits forever.
    """
    # prefix -> [(global rank, rank within the keys of that prefix)]
    groups: Dict[int, List[Tuple[int, int]]] = {0: [(k, k) for k in wanted]}
    for level, (pbits, width) in enumerate(levels):
        prefixes = sorted(groups)
        if len(prefixes) > _MAX_PREFIX_ROWS:  # cannot happen: <= 2 * MAX_QUANTILES ranks
            raise RuntimeError("compare_sharded: too many histogram rows")
        bins = 1 << width
        flat = np.zeros(len(prefixes) * bins + 1, dtype=np.int64)
        local_exc: Optional[BaseException] = None
        try:
            t0 = time.perf_counter()
            h = _C.histogram(a, e, prefixes, pbits, width, stream, da, de)
            info["local_seconds"] += time.perf_counter() - t0
            flat[:-1] = h.reshape(-1)
        except Exception as exc:  # noqa: BLE001 - reported through the collective, re-raised
            local_exc = exc
            flat[:-1] = 0
            flat[-1] = 1
        t = torch.from_numpy(flat).to(dev)
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
        flat = t.cpu().numpy()
        info["collectives"] += 1
        info["histogram_passes"] += 1
        info["histogram_bytes"] += flat.nbytes
        info["comm_bytes"] += flat.nbytes
        if local_exc is not None:
            raise local_exc
        if flat[-1]:
            raise ShardedCompareError(f"compare_sharded: {int(flat[-1])} rank(s) failed in the "
                                      f"histogram pass {level + 1} of {len(levels)}")
        hist = flat[:-1].reshape(len(prefixes), bins)
        new: Dict[int, List[Tuple[int, int]]] = {}
        for row, pre in enumerate(prefixes):
            cum = np.cumsum(hist[row])
            total = int(cum[-1])
            if level == 0 and total != n_finite:
                raise RuntimeError(f"compare_sharded: the histograms count {total} finite pairs, "
                                   f"the reduction {n_finite} (were the shards modified during "
                                   "the call?)")
            for g, rr in groups[pre]:
                if rr >= total:
                    raise RuntimeError(f"compare_sharded: rank {g} is not in its bucket "
                                       "(were the shards modified during the call?)")
                b = int(np.searchsorted(cum, rr, side="right"))
                below = int(cum[b - 1]) if b else 0
                new.setdefault((pre << width) | b, []).append((g, rr - below))
        groups = new
    return {g: pre for pre, lst in groups.items() for g, _ in lst}
