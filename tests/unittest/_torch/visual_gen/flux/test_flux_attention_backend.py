"""L2: Flux transformer blocks (double-stream FluxTransformerBlock, single-stream FluxSingleTransformerBlock) under
an attention-backend swap, against the default ``native`` backend, asserting both output streams.

The same block instance and the same joint text + image inputs (8 text tokens, 16 packed image tokens, 3-axis
RoPE from the pipeline's ids) run under ``native`` (reference) and the alternate backend, whose calls are counted
in diffusers' backend registry (feature-active proof).

T1. Float32 passes the default bars; bf16 ``_native_math`` relaxes for the named cause "backend or kernel swap"
(the math kernel rounds bf16 intermediates differently from the fused kernel ``native`` picks; measured on the CPU
~100-250 elements beyond rtol = atol = 1e-3). The GPU fused backends measured bitwise equal to ``native`` in bf16
on sm_90 and keep the default bars.
"""

from __future__ import annotations

import pytest
import torch

import _components as C
from vgct_ext.gates import GateFailure, Relax
from vgct_ext.skips import requires_gpu

pytestmark = [pytest.mark.t1, pytest.mark.feature("attention backend swap")]

GPU = [pytest.mark.gpu, requires_gpu()]
CASES = [
    pytest.param("cpu", torch.float32, "_native_math", None, id="cpu-fp32-_native_math"),
    pytest.param("cpu", torch.bfloat16, "_native_math", Relax.BACKEND_SWAP, id="cpu-bf16-_native_math"),
    pytest.param("cuda", torch.float32, "_native_math", None, id="cuda-fp32-_native_math", marks=GPU),
    pytest.param("cuda", torch.bfloat16, "_native_math", Relax.BACKEND_SWAP, id="cuda-bf16-_native_math",
                 marks=GPU),
    # measured on 2 x H200 (sm_90, torch 2.11): bitwise equal to `native` in bf16, no relaxation demanded
    pytest.param("cuda", torch.bfloat16, "_native_flash", None, id="cuda-bf16-_native_flash", marks=GPU),
    pytest.param("cuda", torch.bfloat16, "_native_efficient", None, id="cuda-bf16-_native_efficient", marks=GPU),
    pytest.param("cuda", torch.bfloat16, "_native_cudnn", None, id="cuda-bf16-_native_cudnn", marks=GPU),
]
BLOCKS = {
    "flux.transformer_block": C.flux_double_block,
    "flux.single_transformer_block": C.flux_single_block,
}


def run_swap(kind, device, dtype, backend, *, fault=None):
    """((enc_on, img_on), (enc_ref, img_ref), alt_calls) for one Flux block. ``fault="wrong_rope_theta"`` hands
    the feature-on path RoPE tables built with theta = 1e3 (a mis-built position embedding in that path)."""
    from diffusers.models.attention_dispatch import attention_backend

    dev = C.device_for(device)
    block = C.load_one(BLOCKS[kind], seed=0, device=dev, dtype=dtype)
    inputs = C.flux_block_inputs(seed=10, device=dev, dtype=dtype)
    feat_inputs = inputs
    if fault == "wrong_rope_theta":
        feat_inputs = dict(inputs, image_rotary_emb=C.flux_block_inputs(seed=10, device=dev, dtype=dtype,
                                                                        theta=1000)["image_rotary_emb"])
    with torch.no_grad():
        with C.backend_calls("native") as ref_calls, attention_backend("native"):
            expected = block(**C.clone_inputs(inputs))
        with C.backend_calls(backend) as alt_calls, attention_backend(backend):
            actual = block(**C.clone_inputs(feat_inputs))
    assert ref_calls.count == 1, f"reference did not run on the native backend: {ref_calls}"
    return actual, expected, alt_calls


@pytest.mark.parametrize("kind", [pytest.param(k, marks=pytest.mark.component(k), id=k) for k in BLOCKS])
@pytest.mark.parametrize("device,dtype,backend,relax", CASES)
def test_flux_block_attention_backend_swap(vgct, kind, device, dtype, backend, relax):
    """L2. Boundary: FluxTransformerBlock.forward / FluxSingleTransformerBlock.forward -> (encoder_hidden_states
    (1, 8, 64), hidden_states (1, 16, 64)): joint attention over text + image tokens with per-head QK RMSNorm and
    3-axis RoPE, adaLN-Zero modulation, FFNs. Feature: diffusers attention backend ``backend``. Reference: the
    same block and inputs under ``native`` in the same process. T1 on both streams (fp32 default bars; bf16
    relaxed for "backend or kernel swap")."""
    (enc_on, img_on), (enc_ref, img_ref), alt_calls = run_swap(kind, device, dtype, backend)
    vgct.assert_feature_active(calls=alt_calls, min_calls=1)
    vgct.assert_t1(img_on, img_ref, relax=relax, dim=1, feature="attention backend swap (image stream)")
    vgct.assert_t1(enc_on, enc_ref, relax=relax, dim=1, feature="attention backend swap (text stream)")


@pytest.mark.component("flux.transformer_block")
def test_planted_fault_wrong_rope_theta_in_alternate_path_is_caught(vgct):
    """Planted fault: the feature-on path gets RoPE tables built with theta = 1e3 instead of 1e4. The backend-swap
    T1 gate on the image stream must fail, naming the component and the moved statistics."""
    (_, img_on), (_, img_ref), _ = run_swap("flux.transformer_block", "cpu", torch.float32, "_native_math",
                                            fault="wrong_rope_theta")
    with pytest.raises(GateFailure) as e:
        vgct.assert_t1(img_on, img_ref, dim=1, feature="attention backend swap (image stream)")
    C.assert_fault_caught(e, "flux.transformer_block", statistics=("rel_l2", "cosine", "mismatches"))


@pytest.mark.component("flux.single_transformer_block")
def test_planted_fault_wrong_rope_theta_is_caught_also_in_bf16(vgct):
    """The same fault on the single-stream block must also fail the relaxed bf16 gate (the kernel-swap
    relaxation must not hide it)."""
    (_, img_on), (_, img_ref), _ = run_swap("flux.single_transformer_block", "cpu", torch.bfloat16, "_native_math",
                                            fault="wrong_rope_theta")
    with pytest.raises(GateFailure) as e:
        vgct.assert_t1(img_on, img_ref, relax=Relax.BACKEND_SWAP, dim=1,
                       feature="attention backend swap (image stream)")
    C.assert_fault_caught(e, "flux.single_transformer_block", statistics=("rel_l2", "cosine", "mismatches"))
