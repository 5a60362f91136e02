"""L2: FluxTransformer2DModel over a short FlowMatchEuler denoising loop with TaylorSeer caching (diffusers
``TaylorSeerCacheConfig``, default identifiers: every ``transformer_blocks.*.attn`` / ``single_transformer_blocks
.*.attn``) against the same loop without it.

Both sides: the same seeded weights (fingerprint-checked), the same packed noise latent, text embeddings, pooled
projection and RoPE ids (made once), a fresh FlowMatchEulerDiscreteScheduler each (shift 3), 12 steps under
``cache_context("cond")`` as FluxPipeline runs them. Emitted tensor: the final packed latent (1, 16, 16).

Feature-active proof: forward calls of the first block's attention ``to_q`` are counted; steps whose attention
output was predicted from the Taylor expansion instead of computed must be >= 1; plus a nonzero delta.
T2 (prediction is an approximation), calibrated evidence in ``test_flux_cache.vgct-evidence.json`` (noise, text
and pooled projection drawn from ``vgct.seed``: calibration runs seeds 0..4). The seeded
timestep MLP is made smooth in t, as in a trained DiT (see ``_components.smooth_timestep_mlp``).
"""

from __future__ import annotations

import pytest
import torch

import _components as C
from vgct_ext.probes import CallCounter, FeatureInactive, count_calls
from vgct_ext.skips import requires_gpu

STEPS = 12

GPU = [pytest.mark.gpu, requires_gpu()]
CASES = [
    pytest.param("cpu", torch.float32, id="cpu-fp32"),
    pytest.param("cuda", torch.bfloat16, id="cuda-bf16", marks=GPU),
]


def denoise(transformer, noise, text, pooled, dev):
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline

    sched = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)
    sched.set_timesteps(STEPS, device=dev)
    b, c, h, w = noise.shape
    latents = FluxPipeline._pack_latents(noise.clone(), b, c, h, w)
    txt, img = C.flux_ids(dev)
    for t in sched.timesteps:
        with transformer.cache_context("cond"):
            v = transformer(hidden_states=latents, timestep=(t / 1000).expand(b).to(latents.dtype),
                            encoder_hidden_states=text, pooled_projections=pooled, txt_ids=txt, img_ids=img,
                            return_dict=False)[0]
        latents = sched.step(v, t, latents, return_dict=False)[0]
    return latents


def run_cache(device, dtype, *, seed=0, fault=None, monkeypatch=None):
    """(final latent on, final latent off, predicted-step counter); inputs from ``seed`` (``vgct.seed``)."""
    from diffusers import TaylorSeerCacheConfig

    dev = C.device_for(device)
    ref, feat = C.load_pair(C.flux_transformer, seed=0, component="flux.transformer", device=dev, dtype=dtype,
                            tweak=C.flux_smooth_t)
    s = 1000 * seed
    noise = C.randn(C.FLUX_LATENT, seed=s + 1, device=dev, dtype=dtype)
    text = C.randn((1, C.FLUX_TEXT_TOKENS, C.FLUX_CONFIG["joint_attention_dim"]), seed=s + 2, device=dev,
                   dtype=dtype)
    pooled = C.randn((1, C.FLUX_CONFIG["pooled_projection_dim"]), seed=s + 3, device=dev, dtype=dtype)
    feat.enable_cache(TaylorSeerCacheConfig(cache_interval=2, disable_cache_before_step=2))
    if fault == "never_hits":
        from diffusers.hooks.taylorseer_cache import TaylorSeerCacheHook

        original = TaylorSeerCacheHook._measure_should_compute

        def always_compute(self):
            _, state = original(self)
            return True, state

        monkeypatch.setattr(TaylorSeerCacheHook, "_measure_should_compute", always_compute)
    with torch.no_grad():
        with count_calls(ref, "transformer_blocks.0.attn.to_q") as off_calls:
            off = denoise(ref, noise, text, pooled, dev)
        with count_calls(feat, "transformer_blocks.0.attn.to_q") as on_calls:
            on = denoise(feat, noise, text, pooled, dev)
    hits = CallCounter(f"TaylorSeer predicted steps (attention not computed; computed {on_calls.count} of "
                       f"{off_calls.count})")
    hits.count = off_calls.count - on_calls.count
    assert off_calls.count == STEPS
    return on, off, hits


@pytest.mark.t2
@pytest.mark.component("flux.transformer")
@pytest.mark.feature("TaylorSeerCache")
@pytest.mark.parametrize("device,dtype", CASES)
def test_flux_taylorseer_cache_denoising_loop(vgct, device, dtype):
    """L2. Boundary: 12 FlowMatchEuler steps of FluxTransformer2DModel (2 double + 2 single blocks) -> final
    packed latent (1, 16, 16). Feature: TaylorSeer cache (library defaults: order 1, bf16 Taylor factors;
    cache_interval 2, full computation for the first 2 steps): on non-refresh steps every attention module's
    output is a first-order Taylor prediction. Reference: the same loop without caching, same process, weights,
    noise, text, pooled projection, ids and scheduler config. T2, calibrated evidence; per-channel mean shift
    over the 16 packed channels (dim 2)."""
    on, off, hits = run_cache(device, dtype, seed=vgct.seed)
    vgct.assert_feature_active(calls=hits, min_calls=1, on=on, off=off)
    vgct.assert_t2(on, off, dim=2)


@pytest.mark.component("flux.transformer")
@pytest.mark.feature("TaylorSeerCache")
def test_planted_fault_cache_that_never_hits_is_caught(vgct, monkeypatch):
    """Planted fault: a TaylorSeer cache whose schedule never predicts (every step computes). The feature-active
    probe must fail, naming the component and the statistics that show the no-op (0 predicted steps, outputs
    bitwise equal)."""
    on, off, hits = run_cache("cpu", torch.float32, fault="never_hits", monkeypatch=monkeypatch)
    with pytest.raises(FeatureInactive) as e:
        vgct.assert_feature_active(calls=hits, min_calls=1, on=on, off=off)
    failed = C.assert_fault_caught(e, "flux.transformer")
    assert set(failed) == {"call count", "feature delta"}, failed
