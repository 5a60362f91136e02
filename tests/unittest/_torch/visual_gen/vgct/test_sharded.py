"""compare_sharded (vgct_ext/core/sharded.py): the PairedStats of compare() on the gathered tensors.

Every case of _sharded_cases.py runs on 2 and on 4 gloo CPU ranks (one launch of
vgct_ext.testing.distributed.run_ranks per world size, all cases inside it, to keep CI short);
each rank's result must equal ``vgct_ext.compare`` of the gathered tensors: counts, maxima,
indices, the values there and quantiles exactly, sums (norms, rel_l2, cosine, mean_diff, slice
sums) within 1e-12 relative; and every rank must return the same result, bit for bit. Then the
failure paths (no hang, the right exception on every rank), a subgroup, the test helpers, and
2-GPU NCCL runs (marked gpu; skipped with the reason when fewer than 2 GPUs).
"""

from __future__ import annotations

import math
import os
from typing import Any, Dict, Optional

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import _sharded_cases as cases  # noqa: E402  (tests/.../vgct is on sys.path: conftest.py)
from oracle import record_answered  # noqa: E402

import vgct_ext  # noqa: E402
from vgct_ext import _C  # noqa: E402
from vgct_ext.testing import distributed as vd  # noqa: E402

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with gloo is not available")

ENV = {"VGCT_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}  # 2-4 ranks on a small CI machine
NAMES = list(cases.CASES)

EXACT = ("n", "shape", "dtype_actual", "dtype_expected", "n_finite", "zero_reference",
         "max_abs_err", "max_abs_err_index", "max_abs_err_actual", "max_abs_err_expected",
         "max_rel_err", "max_rel_err_index", "max_abs_expected", "quantiles", "rtol", "atol",
         "mismatches", "mismatch_fraction", "worst_mismatch_index", "worst_mismatch_excess",
         "n_unequal", "nan_actual", "posinf_actual", "neginf_actual", "nan_expected",
         "posinf_expected", "neginf_expected", "n_class_mismatch", "first_class_mismatch_index",
         "dim")
SUMS = ("rel_l2", "cosine", "norm_actual", "norm_expected", "norm_diff", "mean_diff")


def _close(x: Optional[float], y: Optional[float], scale: float, what: str) -> None:
    if y is None or x is None:
        assert x is None and y is None, f"{what}: {x!r} vs {y!r}"
        return
    if math.isnan(y):
        assert math.isnan(x), f"{what}: {x!r} vs NaN"
        return
    assert abs(x - y) <= 1e-12 * max(abs(y), scale), f"{what}: {x!r} vs {y!r}"


def assert_same_stats(got: vgct_ext.PairedStats, ref: vgct_ext.PairedStats, where: str,
                      device: str = "cpu") -> None:
    """got (compare_sharded) against ref (compare on the gathered tensors)."""
    for f in EXACT:
        assert getattr(got, f) == getattr(ref, f), \
            f"{where}: {f}: sharded {getattr(got, f)!r}, gathered {getattr(ref, f)!r}"
    assert got.device == device, where
    rms_d = ref.norm_diff / math.sqrt(ref.n_finite) if ref.n_finite else 0.0
    for f in SUMS:
        _close(getattr(got, f), getattr(ref, f), rms_d if f == "mean_diff" else 0.0,
               f"{where}: {f}")
    if ref.slices is None:
        assert got.slices is None, where
        return
    gs, rs = got.slices, ref.slices
    assert gs.dim == rs.dim, where
    np.testing.assert_array_equal(gs.count, rs.count, err_msg=f"{where}: slices.count")
    np.testing.assert_array_equal(gs.max_abs_err, rs.max_abs_err,
                                  err_msg=f"{where}: slices.max_abs_err")
    for f in ("mean_shift", "rel_l2", "ref_rms"):
        g, r = getattr(gs, f), getattr(rs, f)
        np.testing.assert_array_equal(np.isnan(g), np.isnan(r), err_msg=f"{where}: slices.{f}")
        ok = ~np.isnan(r)
        scale = np.abs(r[ok]) if f != "mean_shift" else np.maximum(np.abs(r[ok]),
                                                                   np.nan_to_num(rs.max_abs_err[ok]))
        assert np.all(np.abs(g[ok] - r[ok]) <= 1e-12 * scale), f"{where}: slices.{f}"


def reference(name: str, world: int) -> vgct_ext.PairedStats:
    a, e = cases.global_tensors(torch, name, world)
    return vgct_ext.compare(a, e, **cases.CASES[name][3])


_RUNS: Dict[int, Any] = {}


def run_all(world: int):
    """Every case on `world` gloo ranks, once per test session (results by rank)."""
    if world not in _RUNS:
        _RUNS[world] = vd.run_ranks(cases.rank_job, world, args=(NAMES,), env=ENV, timeout=240)
    return _RUNS[world]


def test_record_cases_are_meaningful():
    """The identical case needs no histogram pass at all; the sparse one answers its p99 from the
    record (0.0) and still selects its p99.9 (not 0)."""
    a, e = cases.global_tensors(torch, "identical", 2)
    s = vgct_ext.compare(a, e, quantiles=(0.5, 0.99, 1.0))
    assert record_answered(s.n_finite, s.n_unequal, (0.5, 0.99, 1.0), distinct=True)[1] == 0
    assert s.quantiles[0.99] == 0.0
    a, e = cases.global_tensors(torch, "sparse", 2)
    s = vgct_ext.compare(a, e, quantiles=(0.5, 0.99, 0.999, 1.0))
    assert s.quantiles[0.99] == 0.0 and s.quantiles[0.999] > 0.0 and s.n_finite == a.numel() - 1
    known, rest = record_answered(s.n_finite, s.n_unequal, (0.5, 0.99, 0.999, 1.0), distinct=True)
    assert known >= 3 and rest >= 1


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("name", NAMES)
def test_equals_compare_on_gathered(world, name):
    results = run_all(world)
    ref = reference(name, world)
    sd, sizes = cases.shard_sizes(torch, name, world)
    first = None
    for rank, out in enumerate(results):
        status, s, info = out[name]
        assert status == "ok", f"rank {rank}: {s}"
        where = f"{name}, rank {rank} of {world} (shard sizes {sizes} along dim {sd})"
        if ref.max_abs_err_index is not None:
            where += f"; max |a-e| at {vd.describe_index(ref.max_abs_err_index, shard_dim=sd, sizes=sizes)}"
        assert_same_stats(s, ref, where)
        # every rank merges the same records in the same order: identical results
        if first is None:
            first = s
        else:
            assert s.as_dict() == first.as_dict(), f"{where}: ranks disagree"
        assert info["world_size"] == world
        qs = cases.CASES[name][3].get("quantiles", (0.99,))
        known, rest = record_answered(ref.n_finite, ref.n_unequal, qs, distinct=True) if qs and ref.n_finite > 0 \
            else (0, 0)
        assert info["ranks_from_record"] == known, where
        assert info["histogram_passes"] == (4 if rest else 0), where  # CPU: 4 digits
        assert info["collectives"] == 1 + info["histogram_passes"], where
        nrow_max = 2 * len(ref.quantiles)
        assert info["histogram_bytes"] <= 4 * (nrow_max * 65536 + 1) * 8, where
        assert info["comm_bytes"] == info["histogram_bytes"] + world * 8 + world * max(
            r[name][2]["record_bytes"] for r in results), where


def test_nonfinite_ties_case_is_meaningful():
    """The planted ties straddle shards, so only a correct global remap finds the winners."""
    world = 2
    ref = reference("nonfinite_ties", world)
    n = 8 * world
    assert ref.max_abs_err_index == (0, n - 1)  # beats (1, 0) held by rank 0
    assert ref.max_rel_err_index == (0, n - 2)
    assert ref.first_class_mismatch_index == (0, n - 4)
    assert vd.global_to_local(ref.max_abs_err_index, shard_dim=1, sizes=[8, 8]) == (1, (0, 7))


@pytest.mark.parametrize("world", [2, 4])
def test_failures_raise_on_every_rank(world):
    results = run_all(world)
    for rank, out in enumerate(results):
        st, err, _ = out["bad_shapes"]
        assert st == "error" and err[0] == "ValueError" and "do not form one tensor" in err[1], err
        st, err, _ = out["bad_args"]
        assert st == "error" and err[0] == "ValueError" and "other arguments" in err[1], err
        st, err, _ = out["local_failure"]
        if rank == 0:
            assert st == "error" and err[0] == "ValueError" and "shape mismatch" in err[1], err
        else:
            assert st == "error" and err[0] == "ShardedCompareError" and "rank 0" in err[1], err
        st, s, _ = out["after_failures"]
        a, e = cases.global_tensors(torch, "f32_even", world)
        assert_same_stats(s, vgct_ext.compare(a, e), f"after failures, rank {rank}")


@pytest.mark.parametrize("world", [2, 4])
def test_cuda_digit_plan_on_cpu(world):
    """The 5-level digit plan compare_sharded uses for CUDA shards, run by the CPU engine."""
    results = run_all(world)
    for name in ("f32_even", "big_bf16", "nonfinite_ties"):
        ref = reference(name, world)
        for rank, out in enumerate(results):
            st, s, info = out["cuda_levels:" + name]
            assert st == "ok", s
            assert info["histogram_passes"] == 5
            assert_same_stats(s, ref, f"cuda digit plan, {name}, rank {rank} of {world}")


def test_subgroup():
    results = run_all(4)
    a, e = cases.global_tensors(torch, "bf16_vs_f32_uneven_dim2", 2)
    ref = vgct_ext.compare(a, e, **cases.CASES["bf16_vs_f32_uneven_dim2"][3])
    for rank in (1, 3):
        st, s, info = results[rank]["subgroup"]
        assert st == "ok"
        assert info["world_size"] == 2
        assert_same_stats(s, ref, f"subgroup [1, 3], rank {rank}")
    assert "subgroup" not in results[0] and "subgroup" not in results[2]


@pytest.mark.parametrize("world", [2, 4])
def test_f64_families_equal_exact_oracle(world):
    """Records whose per-family scales differ from rank to rank (e ~ 1e250 on one rank, ~1 on
    another; a ~ 1e-200 e; tiny d next to huge values), merged with vgct_acc_merge: the sums
    are within 1e-12 of the EXACT oracle (oracle.exact_sums), not only of compare()."""
    from oracle import exact_sums

    a, e = cases.global_tensors(torch, "f64_families", world)
    a64, e64 = a.numpy(), e.numpy()
    ex = exact_sums(a64, e64, 0)
    for rank, out in enumerate(run_all(world)):
        status, s, _ = out["f64_families"]
        assert status == "ok", f"rank {rank}: {s}"
        for f in ("norm_actual", "norm_expected", "norm_diff", "rel_l2"):
            assert getattr(s, f) == pytest.approx(ex[f], rel=1e-12), (rank, f)
        assert s.cosine == pytest.approx(ex["cosine"], rel=1e-12, abs=1e-12), rank
        assert abs(s.mean_diff - ex["mean_diff"]) <= 1e-12 * ex["mean_abs"], rank
        assert 0 < s.norm_actual < 1e100
        for f in ("rel_l2", "ref_rms"):
            np.testing.assert_allclose(getattr(s.slices, f), ex["slices"][f], rtol=1e-12, err_msg=f)
        ms = ex["slices"]["mean_shift"]
        assert np.all(np.abs(s.slices.mean_shift - ms) <= 1e-12 * ex["slices"]["mean_abs"])


def test_raw_merge_of_records_at_different_scales():
    """reduce_raw on parts whose families have far-apart scales, merged (merge_raw,
    merge_slices_raw) in either order: the record's per-family scales are those of the whole,
    and the finalised sums equal the exact oracle."""
    from oracle import exact_sums

    rng = np.random.default_rng(13)
    e = rng.standard_normal((3, 40))
    a = e * (1 + 1e-6 * rng.standard_normal(e.shape))
    e[:, :10] *= 1e-280          # part 0: tiny e and a
    a[:, :10] *= 1e-280
    a[:, 10:20] *= 1e-200        # part 1: tiny a against unit e
    e[:, 30:] *= 1e300           # part 3: huge e and a
    a[:, 30:] *= 1e300
    cuts = [0, 10, 20, 30, 40]
    ex = exact_sums(a, e, 0)
    for order in (lambda x: x, lambda x: x[::-1]):
        recs, sls = [], []
        for lo, hi in order(list(zip(cuts[:-1], cuts[1:]))):
            r = _C.reduce_raw(a[:, lo:hi], e[:, lo:hi], 1e-3, 1e-3, 0)
            recs.append(_C.remap_raw(r["acc"], r["shape"], a.shape, 1, lo))
            sls.append(r["slices"])
        merged = _C.merge_raw(recs)
        fl = _C.acc_fields(merged)
        for fam, x in (("scale_a", a), ("scale_e", e), ("scale_d", a - e)):
            m = float(np.max(np.abs(x)))
            assert fl[fam] == 2.0 ** math.frexp(m)[1], fam  # the whole tensor's scale
        d = _C.finalize_raw(merged, _C.merge_slices_raw(sls, False), a.shape, "float64", "float64",
                            1, 0, 1e-3, 1e-3, (), None, 0)
        got = vgct_ext.PairedStats._from_c(d)
        for f in ("norm_actual", "norm_expected", "norm_diff", "rel_l2", "cosine"):
            assert getattr(got, f) == pytest.approx(ex[f], rel=1e-12), f
        for f in ("rel_l2", "ref_rms"):
            np.testing.assert_allclose(getattr(got.slices, f), ex["slices"][f], rtol=1e-12, err_msg=f)


# ---- C pieces on one process ---------------------------------------------------------------

def test_raw_steps_equal_compare_single_process():
    """reduce_raw -> (split, remap, merge) -> histogram selection -> finalize_raw on one
    process, against compare(): the C steps without torch.distributed."""
    rng = np.random.default_rng(11)
    e = rng.standard_normal((5, 7, 9)).astype(np.float32)
    a = (e + 1e-3 * rng.standard_normal(e.shape)).astype(np.float32)
    a[2, 3, 4] = np.nan
    qs = (0.0, 0.5, 0.99, 1.0)
    ref = _C.compare(a, e, 1e-3, 1e-3, qs, 2)
    sd, cuts = 1, [0, 3, 3, 7]
    recs, sls = [], []
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        r = _C.reduce_raw(a[:, lo:hi], e[:, lo:hi], 1e-3, 1e-3, 2)
        recs.append(_C.remap_raw(r["acc"], r["shape"], a.shape, sd, lo))
        sls.append(r["slices"])
    merged = _C.merge_raw(recs)
    assert _C.acc_fields(merged)["n"] == a.size
    nf = _C.acc_fields(merged)["n_finite"]
    keys = np.sort(np.abs(a.astype(np.float64) - e)[np.isfinite(a)]).view(np.uint64)
    order = [int(keys[k]) for lohi in _C.quantile_ranks(nf, qs) for k in lohi]
    d = _C.finalize_raw(merged, _C.merge_slices_raw(sls, False), a.shape, "float32", "float32",
                        1, 0, 1e-3, 1e-3, qs, order, 2)
    got, want = vgct_ext.PairedStats._from_c(d), vgct_ext.PairedStats._from_c(ref)
    assert_same_stats(got, want, "raw steps")


def test_histogram_digits_match_numpy():
    rng = np.random.default_rng(12)
    a = rng.standard_normal(50000).astype(np.float32)
    e = rng.standard_normal(50000).astype(np.float32)
    a[::97] = np.inf
    k = np.abs(a.astype(np.float64) - e)[np.isfinite(a)].view(np.uint64)

    def digits(sel, shift, width):
        return np.bincount((sel >> np.uint64(shift) & np.uint64((1 << width) - 1)).astype(np.int64),
                           minlength=1 << width)

    np.testing.assert_array_equal(_C.histogram(a, e, [0], 0, 16)[0], digits(k, 48, 16))
    np.testing.assert_array_equal(_C.histogram(a, e, [0], 1, 16)[0], digits(k, 47, 16))
    np.testing.assert_array_equal(_C.histogram(a, e, [0], 1, 15)[0], digits(k, 48, 15))
    pres = sorted({int(x) for x in (k[:3] >> np.uint64(31))})[::-1]  # any order, distinct
    h = _C.histogram(a, e, pres, 33, 16)
    assert h.shape == (len(pres), 65536)
    for row, p in enumerate(pres):
        np.testing.assert_array_equal(h[row], digits(k[(k >> np.uint64(31)) == p], 15, 16))
    p = int(k[0] >> np.uint64(12))
    h = _C.histogram(a, e, [p], 52, 12)
    assert h.shape == (1, 4096)
    np.testing.assert_array_equal(h[0], digits(k[(k >> np.uint64(12)) == p], 0, 12))
    with pytest.raises(ValueError, match="duplicate prefix"):
        _C.histogram(a, e, [1, 1], 17, 16)
    with pytest.raises(ValueError, match="width"):
        _C.histogram(a, e, [0], 49, 16)
    with pytest.raises(ValueError, match="width"):
        _C.histogram(a, e, [0], 0, 17)
    with pytest.raises(ValueError, match="prefix >= 2"):
        _C.histogram(a, e, [2], 1, 16)


def test_raw_record_errors():
    r = _C.reduce_raw(np.ones(3), np.ones(3))
    with pytest.raises(ValueError, match="bytes in this build"):
        _C.merge_raw([r["acc"], r["acc"][:-1]])
    with pytest.raises(ValueError, match="does not fit"):
        _C.remap_raw(r["acc"], (3,), (2,), 0, 0)
    with pytest.raises(ValueError, match="pairs"):
        _C.finalize_raw(r["acc"], None, (4,), "float64", "float64", 1, 0, 0.0, 0.0, (), None, None)
    with pytest.raises(ValueError, match="order keys"):
        _C.finalize_raw(r["acc"], None, (3,), "float64", "float64", 1, 0, 0.0, 0.0, (0.5,), [1],
                        None)
    with pytest.raises(ValueError, match="bytes in this build"):
        _C.rank_key_known(r["acc"][:-1], 0)


def test_rank_key_known_against_the_sorted_keys():
    """_C.rank_key_known on a raw record: the key (bits of |d|) of every rank the record decides --
    below n_finite - n_unequal, and n_finite - 1 -- equals the sorted float64 keys; None elsewhere
    (and outside [0, n_finite))."""
    rng = np.random.default_rng(4)
    e = rng.standard_normal(1000)
    a = e.copy()
    a[rng.choice(1000, 37, replace=False)] += 0.5
    a[5] = np.nan  # an unequal non-finite pair: the zero count's bound drops by one
    r = _C.reduce_raw(a, e)
    fin = np.isfinite(a)
    keys = np.sort(np.abs(a[fin] - e[fin])).view(np.uint64)
    nf = int(fin.sum())
    assert nf == 999
    z = nf - 37 - 1  # n_finite - n_unequal
    for k in range(-2, nf + 2):
        got = _C.rank_key_known(r["acc"], k)
        if 0 <= k < z or k == nf - 1:
            assert got == int(keys[k]), k
        else:
            assert got is None, k
    assert int(keys[z]) == 0 and int(keys[z + 1]) > 0  # z is a bound: one zero more than it says


def test_public_name_and_no_torch_import():
    import subprocess
    import sys

    from vgct_ext import sharded

    assert vgct_ext.compare_sharded is sharded.compare_sharded
    code = ("import sys, vgct_ext, vgct_ext.sharded, vgct_ext.testing.distributed; "
            "vgct_ext.compare_sharded; assert 'torch' not in sys.modules, 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_not_initialised():
    if dist.is_initialized():
        pytest.skip("a default process group exists in this process")
    from vgct_ext.sharded import compare_sharded

    with pytest.raises(RuntimeError, match="init_process_group"):
        compare_sharded(np.ones(3), np.ones(3), shard_dim=0)


# ---- helpers ---------------------------------------------------------------------------------

def test_index_helpers():
    assert vd.even_sizes(10, 4) == [3, 3, 2, 2]
    assert vd.shard_offsets([3, 0, 5]) == [0, 3, 3, 8]
    assert vd.shard_slice(2, [3, 0, 5]) == slice(3, 8)
    assert vd.local_to_global((1, 2, 3), shard_dim=1, offset=10) == (1, 12, 3)
    assert vd.global_to_local((1, 12, 3), shard_dim=1, sizes=[10, 0, 5]) == (2, (1, 2, 3))
    assert vd.describe_index((0, 4), shard_dim=1, sizes=[3, 3]) == "global (0, 4) = rank 1 local (0, 1)"
    with pytest.raises(IndexError):
        vd.global_to_local((0, 6), shard_dim=1, sizes=[3, 3])
    assert vd.is_address_in_use(OSError(98, "Address already in use"))
    assert vd.is_address_in_use("RuntimeError: ... EADDRINUSE ...")
    assert not vd.is_address_in_use(ValueError("shape mismatch"))
    p = vd.free_port()
    assert 0 < p < 65536


def _fail_once_then_sum(rank, world, marker):
    """Raises EADDRINUSE on rank 0 of the first launch (marker file absent), then works."""
    if rank == 0 and not os.path.exists(marker):
        open(marker, "w").close()
        raise OSError(98, "Address already in use (planted)")
    t = torch.tensor([rank + 1])
    dist.all_reduce(t)
    return int(t)


def _raise_on_rank1(rank, world):
    if rank == 1:
        raise ValueError("planted failure on rank 1")
    dist.barrier()  # rank 0 waits here forever: run_ranks must stop it
    return rank


def test_run_ranks_retries_and_reports(tmp_path):
    out = vd.run_ranks(_fail_once_then_sum, 2, args=(str(tmp_path / "m"),), env=ENV, timeout=60)
    assert out == [3, 3]
    with pytest.raises(vd.RankFailure, match="planted failure on rank 1") as ei:
        vd.run_ranks(_raise_on_rank1, 2, env=ENV, timeout=60, grace=1.0)
    assert 1 in ei.value.failures and "ValueError" in ei.value.failures[1]


# ---- 2 GPUs, NCCL ----------------------------------------------------------------------------

def _ngpu() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


GPU_NAMES = ["f32_even", "bf16_vs_f32_uneven_dim2", "slices_on_shard_dim", "strided_shards",
             "nonfinite_ties", "f64_scaled", "big_bf16", "all_nan"]


def _check_gpu_results(results, device_fmt):
    for name in GPU_NAMES:
        ref = reference(name, 2)
        for rank, out in enumerate(results):
            st, s, info = out[name]
            assert st == "ok", f"{name}, rank {rank}: {s}"
            assert_same_stats(s, ref, f"nccl {name}, rank {rank}", device=device_fmt.format(rank))


@pytest.mark.gpu
@pytest.mark.skipif(_ngpu() < 2, reason="needs 2 CUDA devices for NCCL")
def test_nccl_two_gpus_host_shards():
    """NCCL group, shards in host memory: records and histograms travel through NCCL."""
    results = vd.run_ranks(cases.rank_job, 2, args=(GPU_NAMES, "cpu", False), backend="nccl",
                           env={"NCCL_NVLS_ENABLE": "0"}, timeout=300)
    _check_gpu_results(results, "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(_ngpu() < 2, reason="needs 2 CUDA devices for NCCL")
def test_nccl_two_gpus_cuda_shards():
    """NCCL group, each rank's shards on its own GPU: the CUDA engine reduces and histograms."""
    if not vgct_ext.build_info()["cuda_compiled"]:
        pytest.skip("vgct_ext was built without CUDA")
    results = vd.run_ranks(cases.rank_job, 2, args=(GPU_NAMES, "cuda", False), backend="nccl",
                           env={"NCCL_NVLS_ENABLE": "0"}, timeout=300)
    _check_gpu_results(results, "cuda:{}")


def _cuda_histogram_skip() -> Optional[str]:
    if _ngpu() < 1:
        return "needs a CUDA device"
    if not vgct_ext.build_info()["cuda_compiled"]:
        return "vgct_ext was built without CUDA"
    return None  # a CUDA build always has cuda/histogram.cu: a failure to histogram is a failure


@pytest.mark.gpu
def test_cuda_histogram_equals_cpu():
    """vgct_cuda_histogram against vgct_cpu_histogram: dtypes, strides, prefixes, widths."""
    why = _cuda_histogram_skip()
    if why:
        pytest.skip(why)
    g = torch.Generator().manual_seed(3)
    e = torch.randn(300, 257, generator=g)
    a = e + 1e-2 * torch.randn(300, 257, generator=g)
    a[5, 7] = float("nan")
    e[9, 1] = float("inf")
    views = {
        "f32": (a, e),
        "bf16_vs_f32": (a.bfloat16(), e),
        "strided": (a.t()[::2], e.t()[::2]),
        "f16": (a.half(), e.half()),
        "f64": (a.double(), e.double()),
        "int32": ((a * 100).int(), (e * 100).int()),
    }
    stream = int(torch.cuda.current_stream().cuda_stream) or 1
    for name, (ha, he) in views.items():
        da, de = ha.cuda(), he.cuda()
        if not ha.is_contiguous():  # keep the strides on the GPU
            da, de = a.cuda().t()[::2], e.cuda().t()[::2]
        k = np.sort(np.abs(ha.double().numpy() - he.double().numpy())[
            np.isfinite(ha.double().numpy()) & np.isfinite(he.double().numpy())]).view(np.uint64)
        mid = int(k[len(k) // 2])
        for pbits, width in ((0, 16), (1, 15), (1, 16), (16, 12), (28, 12), (52, 12), (49, 15)):
            pres = [0] if pbits == 0 else sorted({mid >> (64 - pbits), int(k[-1]) >> (64 - pbits),
                                                  int(k[0]) >> (64 - pbits)})[::-1]
            hc = _C.histogram(ha, he, pres, pbits, width)
            hg = _C.histogram(da, de, pres, pbits, width, stream)
            np.testing.assert_array_equal(hg, hc, err_msg=f"{name} prefix_bits {pbits} width {width}")
