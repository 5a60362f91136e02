"""L2: Flux transformer blocks (double-stream FluxTransformerBlock, single-stream FluxSingleTransformerBlock) under
an attention-backend swap, against the default ``native`` backend, asserting both output streams.

The same block instance and the same joint text + image inputs (8 text tokens, 16 packed image tokens, 3-axis
RoPE from the pipeline's ids) run under ``native`` (reference) and the alternate backend, whose calls are counted
in diffusers' backend registry (feature-active proof).

T1, relaxed for the named cause "backend or kernel swap" at the dtypes' band (docs/method.md, "Relaxation scope").
Float32 on the CPU measured relative L2 8e-8 - 2e-7 and max abs error <= 1.7e-6 (band: relative L2 1.5e-5,
rtol = atol = 6.1e-5); bf16 ``_native_math`` measured relative L2 8e-4 - 2.8e-3, max abs error <= 3.1e-2 (the math
kernel rounds bf16 intermediates differently from the fused kernel ``native`` picks; band: the outer band). The GPU
fused backends measured bitwise equal to ``native`` in bf16 on sm_90 and keep the default bars.

Planted faults: a 10% softmax-scale error in the float32 swap (single-stream block: relative L2 8.4e-3, max abs
error 5.1e-2 -- inside the outer band, so a relaxation that widened float32 to it passed this bug), a softmax
scale rounded to bf16 with no cause named (relative L2 9.6e-6, max abs 5.7e-5: inside the design card's 1e-2 /
1e-3, outside the float32 default), and a mis-built RoPE table.
"""

from __future__ import annotations

import pytest
import torch

import _components as C
from vgct_ext.gates import Relax
from vgct_ext.probes import attention_backend_calls, expect_gate_failure
from vgct_ext.skips import requires_gpu

pytestmark = [pytest.mark.t1, pytest.mark.feature("attention backend swap")]

GPU = [pytest.mark.gpu, requires_gpu()]
CASES = [
    pytest.param("cpu", torch.float32, "_native_math", Relax.BACKEND_SWAP, id="cpu-fp32-_native_math"),
    pytest.param("cpu", torch.bfloat16, "_native_math", Relax.BACKEND_SWAP, id="cpu-bf16-_native_math"),
    pytest.param("cuda", torch.float32, "_native_math", Relax.BACKEND_SWAP, id="cuda-fp32-_native_math", marks=GPU),
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
    the feature-on path RoPE tables built with theta = 1e3 (a mis-built position embedding in that path);
    ``"softmax_scale"`` runs the alternate backend with a 10% too large softmax scale; ``"scale_in_bf16"`` with
    the softmax scale rounded to bfloat16 (1/sqrt(32) = 0.1767767 -> 0.1767578)."""
    import contextlib

    from diffusers.models.attention_dispatch import attention_backend

    dev = C.device_for(device)
    block = C.load_one(BLOCKS[kind], seed=0, device=dev, dtype=dtype)
    inputs = C.flux_block_inputs(seed=10, device=dev, dtype=dtype)
    feat_inputs = inputs
    if fault == "wrong_rope_theta":
        feat_inputs = dict(inputs, image_rotary_emb=C.flux_block_inputs(seed=10, device=dev, dtype=dtype,
                                                                        theta=1000)["image_rotary_emb"])
    planted = contextlib.nullcontext()
    if fault == "softmax_scale":
        planted = C.planted_softmax_scale(backend, lambda s: 1.1 * s)
    elif fault == "scale_in_bf16":
        planted = C.planted_softmax_scale(backend, lambda s: float(torch.tensor(s).to(torch.bfloat16)))
    with torch.no_grad():
        with attention_backend_calls("native") as ref_calls, attention_backend("native"):
            expected = block(**C.clone_inputs(inputs))
        with attention_backend_calls(backend) as alt_calls, attention_backend(backend), planted:
            actual = block(**C.clone_inputs(feat_inputs))
    if backend != "native":
        assert ref_calls.count == 1, f"reference did not run on the native backend: {ref_calls}"
    return actual, expected, alt_calls


@pytest.mark.parametrize("kind", [pytest.param(k, marks=pytest.mark.component(k), id=k) for k in BLOCKS])
@pytest.mark.parametrize("device,dtype,backend,relax", CASES)
def test_flux_block_attention_backend_swap(vgct, kind, device, dtype, backend, relax):
    """L2. Boundary: FluxTransformerBlock.forward / FluxSingleTransformerBlock.forward -> (encoder_hidden_states
    (1, 8, 64), hidden_states (1, 16, 64)): joint attention over text + image tokens with per-head QK RMSNorm and
    3-axis RoPE, adaLN-Zero modulation, FFNs. Feature: diffusers attention backend ``backend``. Reference: the
    same block and inputs under ``native`` in the same process. T1 on both streams, gated as one output (the
    block's (encoder_hidden_states, hidden_states) tuple: leaves ``out[0]`` text stream, ``out[1]`` image
    stream), relaxed for "backend or kernel swap" at the dtypes' band."""
    actual, expected, alt_calls = run_swap(kind, device, dtype, backend)
    vgct.assert_feature_active(calls=alt_calls, min_calls=1)
    with vgct.soft():  # both streams are gated and reported even when the first one fails
        stats = vgct.assert_t1(actual, expected, relax=relax, dim=1)
    assert set(stats) == {"out[0]", "out[1]"}


@pytest.mark.component("flux.transformer_block")
def test_planted_fault_wrong_rope_theta_in_alternate_path_is_caught(vgct):
    """Planted fault: the feature-on path gets RoPE tables built with theta = 1e3 instead of 1e4. The backend-swap
    T1 gate on the image stream must fail, naming the component and the moved statistics."""
    (_, img_on), (_, img_ref), _ = run_swap("flux.transformer_block", "cpu", torch.float32, "_native_math",
                                            fault="wrong_rope_theta")
    with expect_gate_failure(statistics=("rel_l2", "cosine", "mismatches"), component="flux.transformer_block"):
        vgct.assert_t1(img_on, img_ref, relax=Relax.BACKEND_SWAP, dim=1, name="image stream")


@pytest.mark.component("flux.single_transformer_block")
def test_planted_fault_wrong_rope_theta_is_caught_also_in_bf16(vgct):
    """The same fault on the single-stream block must also fail the relaxed bf16 gate (the kernel-swap
    relaxation must not hide it)."""
    (_, img_on), (_, img_ref), _ = run_swap("flux.single_transformer_block", "cpu", torch.bfloat16, "_native_math",
                                            fault="wrong_rope_theta")
    with expect_gate_failure(any_of=("rel_l2", "cosine", "mismatches"), component="flux.single_transformer_block"):
        vgct.assert_t1(img_on, img_ref, relax=Relax.BACKEND_SWAP, dim=1, name="image stream")


@pytest.mark.component("flux.single_transformer_block")
def test_planted_fault_softmax_scale_in_fp32_backend_swap_is_caught(vgct):
    """Planted fault: the alternate backend runs with a 10% too large softmax scale (measured: relative L2
    8.4e-3 / 7.3e-3, max abs error 5.1e-2 / 4.4e-2 on the image / text stream). Inside the outer band (relative
    L2 5e-2, rtol = atol = 5e-2): the float32 swap must relax only to its float32 band (relative L2 1.5e-5,
    rtol = atol = 6.1e-5), and both streams must fail on relative L2, cosine and the elementwise check."""
    actual, expected, alt_calls = run_swap("flux.single_transformer_block", "cpu", torch.float32, "_native_math",
                                           fault="softmax_scale")
    vgct.assert_feature_active(calls=alt_calls, min_calls=1)
    with expect_gate_failure(statistics=("rel_l2", "cosine", "mismatches"),
                             component="flux.single_transformer_block") as caught:
        vgct.assert_t1(actual, expected, relax=Relax.BACKEND_SWAP, dim=1)
    assert [f.name for f in caught.error.failures] == ["out[0]", "out[1]"]


@pytest.mark.component("flux.single_transformer_block")
@pytest.mark.feature("attention processor (same backend)")
def test_planted_fault_scale_rounded_to_bf16_fails_the_fp32_default(vgct):
    """Planted fault for the dtype-aware T1 default: the same backend on both sides (no accumulation cause), the
    feature-on path's softmax scale rounded to bfloat16 (measured: relative L2 9.6e-6, max abs error 5.7e-5 on the
    image stream). Inside the design card's default (1e-2, rtol = atol = 1e-3); the float32 default (relative L2
    9.5e-7, rtol = atol = 3.8e-6) must fail it."""
    (_, img_on), (_, img_ref), _ = run_swap("flux.single_transformer_block", "cpu", torch.float32, "native",
                                            fault="scale_in_bf16")
    with expect_gate_failure(statistics=("rel_l2", "mismatches"), component="flux.single_transformer_block"):
        vgct.assert_t1(img_on, img_ref, dim=1, name="image stream")
