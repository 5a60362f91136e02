"""L2: WanTransformer3DModel with fp8 layerwise weight storage (diffusers ``enable_layerwise_casting``,
storage float8_e4m3fn, compute in the model dtype) against the same model without it.

One denoiser forward at t = 700 on the same noise latent and text embeddings. The feature is lossy by design
(e4m3 keeps 3 mantissa bits of each weight), so the gate is T2 with the per-channel statistics of the latent's
channels (quantization bias shows up as a channel-wise shift, a wrong channel scale as that channel's relative
L2). Evidence: ``test_wan_fp8_layerwise.vgct-evidence
.json`` (CPU stratum: fp32 compute; sm_90: bf16 compute).

Feature-active proof: the stored weight of a cast layer is float8_e4m3fn (a path flag on the storage dtype) and
the output differs from the reference (nonzero delta).
"""

from __future__ import annotations

import pytest
import torch

import _components as C
from vgct_ext.probes import expect_gate_failure
from vgct_ext.skips import requires_gpu

pytestmark = [pytest.mark.component("wan.transformer"), pytest.mark.feature("fp8 layerwise casting (e4m3 storage)")]

GPU = [pytest.mark.gpu, requires_gpu()]
CASES = [
    pytest.param("cpu", torch.float32, id="cpu-fp32"),
    pytest.param("cuda", torch.bfloat16, id="cuda-bf16", marks=GPU),
]
FAULT_CHANNEL = 3


def run_fp8(device, dtype, *, seed=0, fault=None):
    """(output with fp8 storage, reference output, the feature-on model); noise and text from ``seed``
    (``vgct.seed``)."""
    dev = C.device_for(device)
    ref, feat = C.load_pair(C.wan_transformer, seed=0, component="wan.transformer", device=dev, dtype=dtype,
                            keep_in_fp32=C.WAN_KEEP_FP32)
    if fault == "perturbed_channel":
        # after the fingerprint check: one output latent channel's projection rows scaled by 1.25 (a wrong
        # per-channel scale in the quantized path). proj_out's features are ordered (pt, ph, pw, C).
        n_out = C.WAN_CONFIG["out_channels"]
        with torch.no_grad():
            feat.proj_out.weight[FAULT_CHANNEL::n_out] *= 1.25
    feat.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=dtype)
    noise = C.randn(C.WAN_LATENT, seed=1000 * seed + 1, device=dev, dtype=dtype)
    text = C.randn(C.WAN_TEXT, seed=1000 * seed + 2, device=dev, dtype=dtype)
    t = torch.tensor([700.0], device=dev)
    with torch.no_grad():
        expected = ref(hidden_states=noise, timestep=t, encoder_hidden_states=text, return_dict=False)[0]
        actual = feat(hidden_states=noise, timestep=t, encoder_hidden_states=text, return_dict=False)[0]
    return actual, expected, feat


@pytest.mark.t2
@pytest.mark.parametrize("device,dtype", CASES)
def test_wan_fp8_layerwise_casting(vgct, device, dtype):
    """L2. Boundary: WanTransformer3DModel.forward -> velocity latent (1, 8, 3, 8, 8). Feature:
    enable_layerwise_casting(storage_dtype=float8_e4m3fn, compute_dtype=model dtype): every Linear/Conv outside
    the default skip patterns (patch embedding, condition embedder, norms, fp32-kept modules) stores its weights
    in e4m3 and upcasts them per forward. Reference: the same weights without layerwise casting, same process and
    inputs. T2 with the per-channel mean shift and relative L2 over the 8 latent channels (dim 1), calibrated
    evidence."""
    actual, expected, feat = run_fp8(device, dtype, seed=vgct.seed)
    vgct.assert_feature_active(flag=feat.blocks[0].attn1.to_q.weight.dtype == torch.float8_e4m3fn,
                               on=actual, off=expected)
    vgct.assert_t2(actual, expected, dim=1)


def test_planted_fault_weight_perturbed_in_one_channel_is_caught(vgct):
    """Planted fault: in the fp8 path, the projection rows of output channel 3 carry a 25 % scale error. The T2
    gate must fail, naming the component and the moved statistics (the per-channel mean shift and the
    per-channel relative L2, whose rows name channel 3, and the relative L2)."""
    C.skip_while_calibrating(vgct)
    actual, expected, _ = run_fp8("cpu", torch.float32, fault="perturbed_channel")
    # (a planted fault reads the clean test's evidence only in this block)
    with expect_gate_failure(statistics=("rel_l2",), any_of=("channel_mean_shift", "channel_rel_l2"),
                             component="wan.transformer") as caught:
        vgct.assert_t2(actual, expected, dim=1)
    for label in ("per-channel mean shift", "per-channel relative L2"):
        row = next(ln for ln in str(caught.error).splitlines() if ln.strip().startswith(label))
        assert f"channel {FAULT_CHANNEL}" in row, str(caught.error)
