"""L2: WanTransformer3DModel over a short UniPC denoising loop with First Block Cache (diffusers
``FirstBlockCacheConfig``) against the same loop without it.

Both sides: the same seeded weights (fingerprint-checked), the same initial noise latent and text embeddings
(made once), the same scheduler config (a fresh UniPCMultistepScheduler each, Wan's flow-matching setup), 12
steps under ``cache_context("cond")`` as WanPipeline runs them. The emitted tensor is the final latent.

Feature-active proof: the tail blocks' FFN forward calls are counted on both sides; cache hits = steps the
feature-on side skipped (must be >= 1), plus a nonzero feature delta. T2 (caching reuses a stale residual by
design), gated on calibrated evidence (``test_wan_cache.vgct-evidence.json``).

The timestep MLP of the seeded model is made smooth in t (``_components.smooth_timestep_mlp``): a trained DiT's
first-block residual changes by 5-15 % between adjacent steps; random sinusoid weights would make it change by
30-70 % and the cache would never hit at any sane threshold.
"""

from __future__ import annotations

import pytest
import torch

import _components as C
from vgct_ext.probes import CallCounter, FeatureInactive, count_calls
from vgct_ext.skips import requires_gpu

STEPS = 12
THRESHOLD = 0.1  # FirstBlockCacheConfig threshold: relative first-block residual change below which tails are reused

GPU = [pytest.mark.gpu, requires_gpu()]
CASES = [
    pytest.param("cpu", torch.float32, id="cpu-fp32"),
    pytest.param("cuda", torch.bfloat16, id="cuda-bf16", marks=GPU),
]


def scheduler():
    from diffusers import UniPCMultistepScheduler

    s = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, num_train_timesteps=1000,
                                flow_shift=3.0)
    s.set_timesteps(STEPS)
    return s


def denoise(transformer, noise, text):
    sched = scheduler()
    latents = noise.clone()
    for t in sched.timesteps:
        with transformer.cache_context("cond"):
            v = transformer(hidden_states=latents, timestep=t.expand(latents.shape[0]).to(latents.device),
                            encoder_hidden_states=text, return_dict=False)[0]
        latents = sched.step(v, t, latents, return_dict=False)[0]
    return latents


def run_cache(device, dtype, config, *, seed=0, fault=None, monkeypatch=None):
    """(final latent on, final latent off, tail computations on, tail computations off); noise and text from
    ``seed`` (``vgct.seed``)."""
    dev = C.device_for(device)
    ref, feat = C.load_pair(C.wan_transformer, seed=0, component="wan.transformer", device=dev, dtype=dtype,
                            keep_in_fp32=C.WAN_KEEP_FP32, tweak=C.wan_smooth_t)
    noise = C.randn(C.WAN_LATENT, seed=1000 * seed + 1, device=dev, dtype=dtype)
    text = C.randn(C.WAN_TEXT, seed=1000 * seed + 2, device=dev, dtype=dtype)
    feat.enable_cache(config)
    if fault == "never_hits":
        from diffusers.hooks.first_block_cache import FBCHeadBlockHook

        monkeypatch.setattr(FBCHeadBlockHook, "_should_compute_remaining_blocks", lambda self, residual: True)
    tail = f"blocks.{C.WAN_CONFIG['num_layers'] - 1}.ffn"
    with torch.no_grad():
        with count_calls(ref, tail) as off_calls:
            off = denoise(ref, noise, text)
        with count_calls(feat, tail) as on_calls:
            on = denoise(feat, noise, text)
    return on, off, on_calls.count, off_calls.count


def cache_hits(on_count, off_count, name):
    hits = CallCounter(f"{name} cache hits (steps whose tail blocks were skipped; tail computed {on_count} of "
                       f"{off_count})")
    hits.count = off_count - on_count
    return hits


@pytest.mark.t2
@pytest.mark.component("wan.transformer")
@pytest.mark.feature("FirstBlockCache")
@pytest.mark.parametrize("device,dtype", CASES)
def test_wan_first_block_cache_denoising_loop(vgct, device, dtype):
    """L2. Boundary: 12 UniPC steps of WanTransformer3DModel (3 blocks) -> final latent (1, 8, 3, 8, 8).
    Feature: First Block Cache (threshold 0.1): when the first block's residual changed by less than the
    threshold since the last full step, the remaining blocks are skipped and their cached residual reused.
    Reference: the same loop without caching, same process, same weights, noise, text and scheduler config. T2
    (lossy by design), bars from the calibration evidence of this stratum; per-channel mean shift on dim 1."""
    from diffusers import FirstBlockCacheConfig

    on, off, on_n, off_n = run_cache(device, dtype, FirstBlockCacheConfig(threshold=THRESHOLD), seed=vgct.seed)
    assert off_n == STEPS, f"reference computed the tail {off_n} times in {STEPS} steps"
    vgct.assert_feature_active(calls=cache_hits(on_n, off_n, "FirstBlockCache"), min_calls=1, on=on, off=off)
    vgct.assert_t2(on, off, dim=1)


@pytest.mark.component("wan.transformer")
@pytest.mark.feature("FirstBlockCache")
def test_planted_fault_cache_that_never_hits_is_caught(vgct, monkeypatch):
    """Planted fault: First Block Cache whose hit decision never fires (every step recomputes all blocks: the
    feature is silently a no-op). The feature-active probe must fail, naming the component and the statistics
    that show it (0 cache hits, feature-on output bitwise equal to feature-off)."""
    from diffusers import FirstBlockCacheConfig

    on, off, on_n, off_n = run_cache("cpu", torch.float32, FirstBlockCacheConfig(threshold=THRESHOLD),
                                     fault="never_hits", monkeypatch=monkeypatch)
    with pytest.raises(FeatureInactive) as e:
        vgct.assert_feature_active(calls=cache_hits(on_n, off_n, "FirstBlockCache"), min_calls=1, on=on, off=off)
    failed = C.assert_fault_caught(e, "wan.transformer")
    assert set(failed) == {"call count", "feature delta"}, failed
    assert "cache hits" in str(e.value) and "called 0 time(s)" in str(e.value), str(e.value)


@pytest.mark.component("wan.transformer")
@pytest.mark.feature("TaylorSeerCache (default identifiers)")
@pytest.mark.xfail(strict=True, raises=FeatureInactive,
                   reason="finding (diffusers 0.42.1): TaylorSeerCacheConfig's default identifiers "
                          "('^blocks.*attn', ...) are matched with re.fullmatch and do not match Wan's "
                          "'blocks.N.attn1' / 'blocks.N.attn2', so TaylorSeer is silently a no-op on "
                          "WanTransformer3DModel unless cache_identifiers are given")
def test_finding_taylorseer_default_config_is_a_noop_on_wan(vgct):
    """Feature-active probe of TaylorSeer with its default identifiers on Wan (cache_interval 2, caching from
    step 2). Expected to fail (strict xfail): this records the finding; if diffusers fixes the patterns the test
    XPASSes, fails, and should become a T2 test like the Flux one."""
    from diffusers import TaylorSeerCacheConfig

    cfg = TaylorSeerCacheConfig(cache_interval=2, disable_cache_before_step=2)
    dev = C.device_for("cpu")
    ref, feat = C.load_pair(C.wan_transformer, seed=0, component="wan.transformer", tweak=C.wan_smooth_t)
    noise, text = C.randn(C.WAN_LATENT, seed=1), C.randn(C.WAN_TEXT, seed=2)
    feat.enable_cache(cfg)
    with torch.no_grad():
        off = denoise(ref, noise, text)
        with count_calls(feat, "blocks.0.attn1.to_q") as on_calls:
            on = denoise(feat, noise, text)
    del dev
    vgct.assert_feature_active(calls=cache_hits(on_calls.count, STEPS, "TaylorSeer"), min_calls=1, on=on, off=off)
