"""Local multi-rank runs of ``torch.distributed`` and shard index bookkeeping, for tests.

:func:`run_ranks` starts ``world_size`` fresh processes on this machine, joins them into one
process group (gloo for CPU tensors; NCCL with one GPU per rank, ``NCCL_NVLS_ENABLE=0``),
calls ``fn(rank, world_size, *args)`` in each and returns the results by rank. The rendezvous
store lives in the calling process on a free port; a launch that fails with "address already
in use" (the store's port, or one of the backend's own sockets, taken by another process in
between) is retried on a new port.

The index helpers translate between a rank's shard and the gathered tensor (shards
concatenated along ``shard_dim`` in rank order, as :func:`vgct_ext.sharded.compare_sharded`
assumes), for messages such as ``describe_index``'s "global (0, 37, 2) = rank 1 local
(0, 5, 2)".

``torch`` is imported only by :func:`run_ranks` (and in its workers).
"""

from __future__ import annotations

import datetime
import math
import multiprocessing as mp
import os
import pickle
import queue as queue_mod
import socket
import sys
import time
import traceback
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

__all__ = [
    "run_ranks", "RankFailure", "free_port", "is_address_in_use", "even_sizes",
    "shard_offsets", "shard_slice", "local_to_global", "global_to_local", "describe_index",
]

_ADDR_IN_USE = ("address already in use", "eaddrinuse", "errno 98", "errno 48",
                "[errno 98]", "address in use")


class RankFailure(RuntimeError):
    """One or more ranks of :func:`run_ranks` raised, died or timed out.

    ``failures`` maps each failed rank to its traceback (or what happened to it), earliest
    failure first; the message shows that one, ``first_rank`` (usually the cause: the other
    ranks then fail inside a collective).
    """

    def __init__(self, failures: Mapping[int, str], world_size: int):
        self.failures = dict(failures)
        first = self.first_rank = next(iter(self.failures))
        more = (f" first (ranks {sorted(self.failures)} of {world_size} failed)"
                if len(self.failures) > 1 else "")
        super().__init__(f"rank {first} of {world_size} failed{more}:\n{self.failures[first]}")


class _AddressInUse(RuntimeError):
    pass


def is_address_in_use(err: Any) -> bool:
    """Whether an exception or traceback text reports EADDRINUSE ("Address already in use")."""
    text = str(err).lower()
    if isinstance(err, OSError) and getattr(err, "errno", None) in (98, 48):  # Linux, macOS
        return True
    return any(s in text for s in _ADDR_IN_USE)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (the OS's pick for port 0).

    Another process may take it before it is used: callers retry on address-in-use.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------------------------
# run_ranks

def _worker(rank: int, world_size: int, host: str, port: int, backend: str, timeout_s: float,
            fn_blob: bytes, args_blob: bytes, env: Dict[str, str], path: List[str],
            q: Any) -> None:
    reported = False
    try:
        os.environ.update(env)
        # the caller's import path now (a forkserver keeps the one it started with)
        sys.path[:0] = [p for p in path if p not in sys.path]
        os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world_size),
                           "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world_size),
                           "MASTER_ADDR": host, "MASTER_PORT": str(port)})
        # the function (and the modules it lives in) are unpickled only now, after env is set
        # (e.g. VGCT_NUM_THREADS is read when vgct_ext._C is first imported)
        fn = pickle.loads(fn_blob)
        args = pickle.loads(args_blob)
        import torch
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=timeout_s)
        device_id = None
        if "nccl" in backend:
            n = torch.cuda.device_count()
            if n == 0:
                raise RuntimeError("backend nccl needs CUDA devices; none is visible")
            torch.cuda.set_device(rank % n)
            device_id = torch.device("cuda", rank % n)
        store = dist.TCPStore(host, port, world_size, False, timeout=timeout)
        kw: Dict[str, Any] = {"store": store, "rank": rank, "world_size": world_size,
                              "timeout": timeout}
        if device_id is not None:
            kw["device_id"] = device_id
        dist.init_process_group(backend, **kw)
        try:
            out = fn(rank, world_size, *args)
            blob = pickle.dumps(out)
        except BaseException:  # noqa: BLE001 - reported before the group goes away
            reported = True
            q.put((rank, False, (time.time(), traceback.format_exc())))
            raise
        finally:
            dist.destroy_process_group()
        q.put((rank, True, blob))
    except BaseException:  # noqa: BLE001 - everything goes back to the parent
        if not reported:
            q.put((rank, False, (time.time(), traceback.format_exc())))


def _stop(procs: Sequence[Any]) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join(5)


def _launch(fn_blob: bytes, args_blob: bytes, world_size: int, backend: str, timeout: float,
            env: Dict[str, str], host: str, start_method: str, grace: float) -> List[Any]:
    import torch.distributed as dist

    port = free_port(host)
    try:
        store = dist.TCPStore(host, port, world_size, True,
                              timeout=datetime.timedelta(seconds=timeout), wait_for_workers=False)
    except Exception as exc:  # noqa: BLE001 - sorted below
        if is_address_in_use(exc):
            raise _AddressInUse(f"store port {port}: {exc}") from exc
        raise
    ctx = mp.get_context(start_method)
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker, name=f"vgct-rank{r}", daemon=True,
                         args=(r, world_size, host, port, backend, timeout, fn_blob, args_blob,
                               env, list(sys.path), q))
             for r in range(world_size)]
    results: Dict[int, Any] = {}
    failures: Dict[int, str] = {}
    stamps: Dict[int, float] = {}  # when each rank failed: the earliest is the cause
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        first_failure: Optional[float] = None
        dead_since: Dict[int, float] = {}
        while len(results) + len(failures) < world_size:
            now = time.monotonic()
            if now >= deadline or (first_failure is not None and now >= first_failure + grace):
                break
            try:
                rank, ok, payload = q.get(timeout=0.2)
            except queue_mod.Empty:
                for r, p in enumerate(procs):  # died without a word (killed, segfault)?
                    if r in results or r in failures or p.is_alive() or p.exitcode == 0:
                        continue
                    dead_since.setdefault(r, now)
                    if now - dead_since[r] > 2.0:  # a message of its would have arrived by now
                        failures[r] = f"process exited with code {p.exitcode} and no result"
                        stamps[r] = time.time()
                        first_failure = first_failure or now
                continue
            if ok:
                results[rank] = pickle.loads(payload)
            else:
                stamps[rank], failures[rank] = payload
                first_failure = first_failure or time.monotonic()
    finally:
        _stop(procs)
        q.close()
        del store
    failures = dict(sorted(failures.items(), key=lambda kv: stamps.get(kv[0], math.inf)))
    for r in range(world_size):
        if r not in results and r not in failures:
            failures[r] = (f"no result after {timeout:.0f} s" if not failures else
                           "stopped after another rank failed (probably waiting in a collective)")
    if failures:
        if any(is_address_in_use(t) for t in failures.values()):
            raise _AddressInUse(next(t for t in failures.values() if is_address_in_use(t)))
        raise RankFailure(failures, world_size)
    return [results[r] for r in range(world_size)]


def run_ranks(fn: Callable[..., Any], world_size: int, *, args: Sequence[Any] = (),
              backend: str = "gloo", timeout: float = 120.0, retries: int = 3,
              env: Optional[Mapping[str, str]] = None, host: str = "127.0.0.1",
              start_method: Optional[str] = None, grace: float = 10.0) -> List[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` local ranks; results by rank.

    Each rank is a fresh process (``start_method``: "forkserver" where available, which
    imports torch once for all launches, else "spawn"; never "fork") whose default process
    group is initialised before ``fn`` runs and destroyed after. ``fn`` must be picklable by
    reference (a module-level function) and its result picklable.

    Args:
        fn: the per-rank function.
        world_size: number of ranks (>= 1).
        args: extra positional arguments for ``fn`` (picklable).
        backend: "gloo" (CPU), "nccl" (rank r uses CUDA device r % device_count, set before
            the group is made) or e.g. "cpu:gloo,cuda:nccl".
        timeout: seconds for the whole run and for each collective.
        retries: further launches, each on a new free port, when a launch fails with
            "address already in use".
        env: environment variables set in each rank before ``fn`` and its module are
            unpickled (``VGCT_NUM_THREADS``, ``OMP_NUM_THREADS``...). ``NCCL_NVLS_ENABLE``
            is "0" unless given here (NVLink multicast stays off).
        host: the rendezvous address.
        start_method: "forkserver" or "spawn" (default: forkserver when available).
        grace: seconds the other ranks get once one rank failed (they are usually blocked in
            a collective), before they are stopped.

    Raises:
        RankFailure: a rank raised (its traceback is in the message and ``failures``), died,
            or did not finish within ``timeout``.
        ValueError: world_size < 1.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    method = start_method or ("forkserver" if "forkserver" in mp.get_all_start_methods()
                              else "spawn")
    if method == "fork":
        raise ValueError("start_method 'fork' is not supported (torch and threads); use "
                         "'forkserver' or 'spawn'")
    if method == "forkserver":
        mp.get_context("forkserver").set_forkserver_preload(["torch"])  # no effect once started
    full_env = {"NCCL_NVLS_ENABLE": "0"}
    full_env.update(env or {})
    fn_blob, args_blob = pickle.dumps(fn), pickle.dumps(tuple(args))
    last: Optional[BaseException] = None
    for _ in range(retries + 1):
        try:
            return _launch(fn_blob, args_blob, world_size, backend, timeout, full_env, host,
                           method, grace)
        except _AddressInUse as exc:
            last = exc
    raise RankFailure({0: f"address already in use on {retries + 1} launches: {last}"},
                      world_size)


# ---------------------------------------------------------------------------------------------
# shard index bookkeeping

def even_sizes(total: int, world_size: int) -> List[int]:
    """Shard lengths of ``torch.tensor_split(x, world_size, dim)``: the first ``total %
    world_size`` shards one longer (uneven when world_size does not divide total)."""
    q, r = divmod(int(total), int(world_size))
    return [q + (1 if i < r else 0) for i in range(world_size)]


def shard_offsets(sizes: Sequence[int]) -> List[int]:
    """Start of each shard along the shard axis: ``[0, s0, s0+s1, ...]`` (len(sizes) + 1
    entries; the last is the gathered length)."""
    out = [0]
    for s in sizes:
        out.append(out[-1] + int(s))
    return out


def shard_slice(rank: int, sizes: Sequence[int]) -> slice:
    """The slice of the gathered axis that ``rank``'s shard covers."""
    off = shard_offsets(sizes)
    return slice(off[rank], off[rank + 1])


def local_to_global(index: Sequence[int], *, shard_dim: int, offset: int) -> Tuple[int, ...]:
    """A shard's multi-index -> the gathered tensor's (``offset`` added along ``shard_dim``)."""
    out = [int(i) for i in index]
    out[shard_dim] += int(offset)
    return tuple(out)


def global_to_local(index: Sequence[int], *, shard_dim: int,
                    sizes: Sequence[int]) -> Tuple[int, Tuple[int, ...]]:
    """The gathered tensor's multi-index -> (rank holding it, that rank's multi-index).

    Raises IndexError when the index is outside the gathered axis.
    """
    off = shard_offsets(sizes)
    g = int(index[shard_dim])
    for r in range(len(sizes)):
        if off[r] <= g < off[r + 1]:
            out = [int(i) for i in index]
            out[shard_dim] = g - off[r]
            return r, tuple(out)
    raise IndexError(f"index {g} along dim {shard_dim} is outside the gathered length {off[-1]}")


def describe_index(index: Optional[Sequence[int]], *, shard_dim: int,
                   sizes: Sequence[int]) -> str:
    """``"global (0, 37, 2) = rank 1 local (0, 5, 2)"`` for messages (``"none"`` for None)."""
    if index is None:
        return "none"
    r, loc = global_to_local(index, shard_dim=shard_dim, sizes=sizes)
    return f"global {tuple(int(i) for i in index)} = rank {r} local {loc}"
