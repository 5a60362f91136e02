"""L2: Ulysses context parallelism (diffusers ``enable_parallelism(ContextParallelConfig(ulysses_degree=2))``) of
WanTransformer3DModel on 2 ranks, against the single-device path computed in the same job.

Two worker processes (``_cp_worker.py``: gloo on the CPU, NCCL on 2 GPUs) each run the reference path and the
context-parallel path on the same seeded weights and the same noise/text tensors, and hand the tensors back through
``vgct_ext.save_reference`` files of this run. Asserted streams, on every rank:

* the gathered model output (sharded through the blocks, gathered at ``proj_out``): T1 against the reference;
* the rank's shard of the last block's output (the sequence-sharded stream the Ulysses all-to-alls feed): T1
  against the matching slice of the reference's last block output;
* run-to-run: the context-parallel output of a second call is bitwise identical.

Feature-active proof: the sharding state (the rank's block output is a strict part of the global sequence) and the
Ulysses all-to-all call count. Planted fault: a dropped shard (rank 1's part of the output gather lost).

CPU note: diffusers 0.42.1's public CP entry point divides by ``torch.accelerator.device_count()`` (0 without an
accelerator); the worker patches only that count for the ``enable_parallelism`` call (see ``_cp_worker.py``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import torch

import _components as C
from vgct_ext.experiment import load_reference
from vgct_ext.gates import GateFailure
from vgct_ext.skips import requires_gpus

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_cp_worker.py")
WORLD = 2
COMPONENT, FEATURE = "wan.transformer", "Ulysses context parallel (2 ranks)"

pytestmark = [pytest.mark.t1, pytest.mark.component(COMPONENT), pytest.mark.feature(FEATURE)]

GPU2 = [pytest.mark.gpu, requires_gpus(2)]
CASES = {
    "cpu-fp32-gloo": ("cpu", "float32", None),
    "cuda-fp32-nccl": ("cuda", "float32", None),
    # measured on 2 x H200 (NCCL): bitwise equal to the single-GPU path in bf16 too, so default bars
    "cuda-bf16-nccl": ("cuda", "bfloat16", None),
}
PARAMS = [pytest.param("cpu-fp32-gloo", id="cpu-fp32-gloo"),
          pytest.param("cuda-fp32-nccl", id="cuda-fp32-nccl", marks=GPU2),
          pytest.param("cuda-bf16-nccl", id="cuda-bf16-nccl", marks=GPU2)]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_RESULTS = {}


def run_job(case, tmp_dir):
    """Run both ranks once per case and session; returns [Reference rank0, Reference rank1]."""
    if case in _RESULTS:
        return _RESULTS[case]
    device, dtype, _ = CASES[case]
    out = os.path.join(tmp_dir, case)
    os.makedirs(out, exist_ok=True)
    port = _free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    procs = [subprocess.Popen([sys.executable, WORKER, "--rank", str(r), "--world", str(WORLD), "--port", str(port),
                               "--device", device, "--dtype", dtype, "--out", out],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
             for r in range(WORLD)]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=240)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"{case}: context-parallel workers timed out after 240 s")
    for r, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"{case}: rank {r} exited {p.returncode}:\n{log[-4000:]}"
    refs = [load_reference(os.path.join(out, f"rank{r}.safetensors")) for r in range(WORLD)]
    _RESULTS[case] = refs
    return refs


@pytest.fixture(scope="module")
def cp_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("ulysses"))


@pytest.mark.parametrize("case", PARAMS)
def test_wan_ulysses_context_parallel(vgct, cp_dir, case):
    """L2. Boundary: WanTransformer3DModel.forward -> velocity latent (1, 8, 3, 8, 8), plus each rank's shard of
    the last block's hidden states (1, 24, 48) of the 48-token sequence. Feature: Ulysses context parallelism over
    2 ranks (sequence split at blocks.0 and the RoPE tables, all-to-all to head-sharded attention and back, gather
    at proj_out). Reference: the single-device path run in the same job on each rank, same seeded weights
    (fingerprints equal across sides and ranks), same noise and text tensors. T1 on every stream, default bars
    (measured bitwise equal: gloo fp32 on the CPU, NCCL fp32 and bf16 on 2 x H200)."""
    _, _, relax = CASES[case]
    refs = run_job(case, cp_dir)
    fps = {r.meta["weights_ref"] for r in refs} | {r.meta["weights_cp"] for r in refs}
    assert len(fps) == 1, f"ranks / sides loaded different weights: {fps}"
    for r, ref in enumerate(refs):
        vgct.assert_feature_active(sharding=(ref["cp_block_shard"], tuple(ref["ref_block"].shape), 1))
        assert ref.meta["all_to_all_calls"] >= 4 * C.WAN_CONFIG["num_layers"], (
            f"rank {r}: {ref.meta['all_to_all_calls']} Ulysses all-to-alls for {C.WAN_CONFIG['num_layers']} blocks "
            f"(expected q, k, v and output per self-attention)")
        vgct.assert_t1(ref["cp_out"], ref["ref_out"], relax=relax, dim=1,
                       feature=f"{FEATURE}: gathered output, rank {r}")
        vgct.assert_t1(ref["cp_block_shard"], ref["ref_block_slice"], relax=relax, dim=1,
                       feature=f"{FEATURE}: rank {r} shard of the last block output")
        assert torch.equal(ref["cp_out"], ref["cp_out_run2"]), f"rank {r}: two CP runs differ (nondeterminism)"
    assert torch.equal(refs[0]["cp_out"], refs[1]["cp_out"]), "the gathered outputs differ between ranks"


def test_planted_fault_dropped_shard_is_caught(vgct, cp_dir):
    """Planted fault: rank 1's shard is dropped from the output gather. The T1 gate on the gathered output must
    fail on every rank, naming the component and the moved statistics."""
    refs = run_job("cpu-fp32-gloo", cp_dir)
    for r, ref in enumerate(refs):
        with pytest.raises(GateFailure) as e:
            vgct.assert_t1(ref["fault_out"], ref["ref_out"], dim=1, feature=f"{FEATURE}: gathered output, rank {r}")
        C.assert_fault_caught(e, COMPONENT, statistics=("rel_l2", "cosine", "mismatches"))
