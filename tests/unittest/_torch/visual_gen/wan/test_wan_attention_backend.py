"""L2: WanTransformerBlock under an attention-backend swap (diffusers ``attention_backend``), against ``native``.

One block, one feature: the same module instance and the same input tensors run once under the default
``native`` backend (the reference) and once under the alternate backend. The alternate backend's calls are
counted in diffusers' backend registry (feature-active proof: the swap was not a silent fallback).

T1, relaxed for the named cause "backend or kernel swap": its band follows the dtypes (docs/method.md, "Relaxation
scope"). Float32 (CPU): measured relative L2 3.6e-7, max abs error 2.6e-6 against the float32 swap band (relative L2
1.5e-5, rtol = atol = 6.1e-5): ~40x headroom, and a 10% softmax-scale error (relative L2 3.6e-2) fails it. In
bfloat16 the math kernel rounds the attention's intermediates differently from the fused kernel ``native`` picks
(1 bf16 ulp = 2^-8 relative; measured relative L2 4.2e-3, max abs error 3.1e-2 on CPU and sm_90), which only the
bf16 band (the outer band) holds. The GPU fused backends (flash, memory-efficient, cuDNN) measured bitwise equal to
``native`` in bf16 and keep the default bars.
"""

from __future__ import annotations

import pytest
import torch

import _components as C
from vgct_ext.gates import Relax
from vgct_ext.probes import attention_backend_calls, expect_gate_failure
from vgct_ext.skips import requires_gpu

pytestmark = [pytest.mark.t1, pytest.mark.component("wan.transformer_block"),
              pytest.mark.feature("attention backend swap")]

GPU = [pytest.mark.gpu, requires_gpu()]
CASES = [
    pytest.param("cpu", torch.float32, "_native_math", Relax.BACKEND_SWAP, id="cpu-fp32-_native_math"),
    pytest.param("cpu", torch.bfloat16, "_native_math", Relax.BACKEND_SWAP, id="cpu-bf16-_native_math"),
    pytest.param("cuda", torch.float32, "_native_math", Relax.BACKEND_SWAP, id="cuda-fp32-_native_math", marks=GPU),
    pytest.param("cuda", torch.float32, "_native_efficient", Relax.BACKEND_SWAP, id="cuda-fp32-_native_efficient",
                 marks=GPU),
    pytest.param("cuda", torch.bfloat16, "_native_math", Relax.BACKEND_SWAP, id="cuda-bf16-_native_math", marks=GPU),
    # measured on 2 x H200 (sm_90, torch 2.11): the fused kernels are bitwise equal to `native` (which picks one
    # of them) at this size, so no relaxation is demanded for them
    pytest.param("cuda", torch.bfloat16, "_native_flash", None, id="cuda-bf16-_native_flash", marks=GPU),
    pytest.param("cuda", torch.bfloat16, "_native_efficient", None, id="cuda-bf16-_native_efficient", marks=GPU),
    pytest.param("cuda", torch.bfloat16, "_native_cudnn", None, id="cuda-bf16-_native_cudnn", marks=GPU),
]


def run_swap(device, dtype, backend, *, fault=None):
    """(feature-on output, reference output, call counters) for one Wan block.

    ``fault`` plants a bug in the feature-on path only (after the reference ran): "skip_qk_norm" replaces the
    self-attention's norm_q/norm_k with Identity; "softmax_scale" runs the alternate backend with a 10% too large
    softmax scale.
    """
    import contextlib

    from diffusers.models.attention_dispatch import attention_backend

    dev = C.device_for(device)
    block = C.load_one(C.wan_block, seed=0, device=dev, dtype=dtype, keep_in_fp32=C.WAN_KEEP_FP32)
    inputs = C.wan_block_inputs(seed=10, device=dev, dtype=dtype)
    with torch.no_grad():
        with attention_backend_calls("native") as ref_calls, attention_backend("native"):
            expected = block(**C.clone_inputs(inputs))
        if fault == "skip_qk_norm":
            block.attn1.norm_q = torch.nn.Identity()
            block.attn1.norm_k = torch.nn.Identity()
        planted = (C.planted_softmax_scale(backend, lambda s: 1.1 * s) if fault == "softmax_scale"
                   else contextlib.nullcontext())
        with attention_backend_calls(backend) as alt_calls, attention_backend(backend), planted:
            actual = block(**C.clone_inputs(inputs))
    return actual, expected, ref_calls, alt_calls


@pytest.mark.parametrize("device,dtype,backend,relax", CASES)
def test_wan_block_attention_backend_swap(vgct, device, dtype, backend, relax):
    """L2. Boundary: WanTransformerBlock.forward -> hidden_states (1, 48, 48) (self-attention with 3-axis RoPE
    and QK RMSNorm, cross-attention to 12 text tokens, FFN, adaLN modulation). Feature: the diffusers attention
    backend ``backend`` (``_native_math`` forces the SDPA math kernel; on GPU also flash / memory-efficient /
    cuDNN). Reference: the same block and inputs under the default ``native`` backend in the same process. T1
    (relaxed for "backend or kernel swap" at the dtypes' band, see module docstring)."""
    actual, expected, ref_calls, alt_calls = run_swap(device, dtype, backend)
    # both self- and cross-attention of the block went through the alternate backend, the reference through native
    vgct.assert_feature_active(calls=alt_calls, min_calls=2)
    assert ref_calls.count == 2, f"reference did not run on the native backend: {ref_calls}"
    vgct.assert_t1(actual, expected, relax=relax, dim=1)


def test_planted_fault_skipped_qk_norm_in_alternate_backend_path_is_caught(vgct):
    """Planted fault: the feature-on path runs without its QK RMSNorm (a skipped norm). The backend-swap T1 gate
    must fail and name the component and the moved statistics."""
    actual, expected, _, alt_calls = run_swap("cpu", torch.float32, "_native_math", fault="skip_qk_norm")
    vgct.assert_feature_active(calls=alt_calls, min_calls=2)
    with expect_gate_failure(statistics=("rel_l2", "cosine", "mismatches"), component="wan.transformer_block"):
        vgct.assert_t1(actual, expected, relax=Relax.BACKEND_SWAP, dim=1)


def test_planted_fault_skipped_qk_norm_is_caught_also_in_bf16(vgct):
    """The same planted fault must also fail the relaxed (outer band) bf16 gate: the relaxation for the kernel
    swap must not hide a real bug."""
    actual, expected, _, _ = run_swap("cpu", torch.bfloat16, "_native_math", fault="skip_qk_norm")
    with expect_gate_failure(statistics=("rel_l2", "cosine", "mismatches"), component="wan.transformer_block"):
        vgct.assert_t1(actual, expected, relax=Relax.BACKEND_SWAP, dim=1)


def test_planted_fault_softmax_scale_in_fp32_backend_swap_is_caught(vgct):
    """Planted fault: the alternate backend runs with a 10% too large softmax scale (measured: relative L2 3.6e-2,
    max abs error 0.33). A float32 backend swap relaxes at most to its float32 band (relative L2 1.5e-5), so the
    relaxed gate must fail on relative L2, cosine and the elementwise check -- the outer band (5e-2) would have
    passed its relative L2."""
    actual, expected, _, alt_calls = run_swap("cpu", torch.float32, "_native_math", fault="softmax_scale")
    vgct.assert_feature_active(calls=alt_calls, min_calls=2)
    with expect_gate_failure(statistics=("rel_l2", "cosine", "mismatches"), component="wan.transformer_block"):
        vgct.assert_t1(actual, expected, relax=Relax.BACKEND_SWAP, dim=1)
