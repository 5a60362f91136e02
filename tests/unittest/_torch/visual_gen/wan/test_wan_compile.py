"""L2: ``torch.compile`` (inductor) of a WanTransformerBlock against the same block in eager mode.

Same module weights (the compiled wrapper shares the eager module's parameters), same inputs. Feature-active
proof: ``vgct_ext.CompileProbe`` as the torch.compile backend (inductor inside) counts executions of compiled
graphs, so the compiled path ran. T1 relaxed for the named cause "compile fusion" (fusion re-associates float sums
and drops intermediate roundings) at the dtypes' band (docs/method.md, "Relaxation scope"): float32 measured
relative L2 3.2e-7 (CPU) / 3.6e-7 (sm_90), max abs error 3.1e-6 (CPU), against the float32 band relative L2 1.5e-5,
rtol = atol = 6.1e-5; bf16 measured relative L2 6.6e-3 (CPU) / 6.5e-3 (sm_90), max abs error 6.3e-2 / 7.0e-2,
which only the bf16 band (the outer band) holds.

Planted faults (float32, relaxed for "compile fusion"): the compiled path skips the query RMSNorm (relative L2
0.17), and the compiled path's QK RMSNorm uses eps = 1e-2 instead of 1e-6 (relative L2 3.3e-3, max abs error
4.1e-2: inside the outer band, so a relaxation that widened float32 to it passed this bug).

CPU cost: a cold inductor compile of one block takes ~20-30 s on the 2-core CI machine, so the CPU case is the
only one in the CPU suite (marked ``slow``: the main job deselects it); the planted fault recompiles, also slow.
"""

from __future__ import annotations

import pytest
import torch

import _components as C
from vgct_ext.gates import Relax
from vgct_ext.probes import CompileProbe, expect_gate_failure
from vgct_ext.skips import requires_gpu

pytestmark = [pytest.mark.t1, pytest.mark.component("wan.transformer_block"),
              pytest.mark.feature("torch.compile (inductor)")]

GPU = [pytest.mark.gpu, requires_gpu()]
CASES = [
    pytest.param("cpu", torch.float32, Relax.COMPILE_FUSION, id="cpu-fp32", marks=pytest.mark.slow),
    pytest.param("cuda", torch.float32, Relax.COMPILE_FUSION, id="cuda-fp32", marks=GPU),
    pytest.param("cuda", torch.bfloat16, Relax.COMPILE_FUSION, id="cuda-bf16", marks=GPU),
]


def run_compiled(device, dtype, *, fault=None):
    """(compiled output, eager output, CompileProbe). ``fault`` plants a bug in the compiled path only:
    ``"skip_qk_norm"`` (query RMSNorm replaced by Identity), ``"qk_norm_eps"`` (QK RMSNorm eps 1e-6 -> 1e-2)."""
    torch._dynamo.reset()
    dev = C.device_for(device)
    block = C.load_one(C.wan_block, seed=0, device=dev, dtype=dtype, keep_in_fp32=C.WAN_KEEP_FP32)
    inputs = C.wan_block_inputs(seed=10, device=dev, dtype=dtype)
    with torch.no_grad():
        expected = block(**C.clone_inputs(inputs))
        if fault == "skip_qk_norm":
            block.attn1.norm_q = torch.nn.Identity()
        elif fault == "qk_norm_eps":
            block.attn1.norm_q.eps = block.attn1.norm_k.eps = 1e-2
        probe = CompileProbe("inductor")
        actual = torch.compile(block, backend=probe)(**C.clone_inputs(inputs))
    torch._dynamo.reset()
    return actual, expected, probe


@pytest.mark.parametrize("device,dtype,relax", CASES)
def test_wan_block_torch_compile_vs_eager(vgct, device, dtype, relax):
    """L2. Boundary: WanTransformerBlock.forward -> hidden_states (1, 48, 48). Feature: torch.compile with the
    default inductor backend (fused kernels). Reference: the same module in eager mode, same process and inputs.
    T1 relaxed for "compile fusion" at the dtypes' band."""
    actual, expected, probe = run_compiled(device, dtype)
    assert probe.graphs >= 1, probe
    vgct.assert_feature_active(calls=probe.calls, min_calls=1)
    vgct.assert_t1(actual, expected, relax=relax, dim=1)


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["skip_qk_norm", "qk_norm_eps"])
def test_planted_fault_in_compiled_path_is_caught(vgct, fault):
    """Planted faults in the compiled path only (see the module docstring). The float32 gate relaxed for "compile
    fusion" must fail on relative L2, cosine and the elementwise check, naming the component."""
    actual, expected, probe = run_compiled("cpu", torch.float32, fault=fault)
    vgct.assert_feature_active(calls=probe.calls, min_calls=1)
    with expect_gate_failure(statistics=("rel_l2", "cosine", "mismatches"), component="wan.transformer_block"):
        vgct.assert_t1(actual, expected, relax=Relax.COMPILE_FUSION, dim=1, name=fault)
