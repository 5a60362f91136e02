"""Shared builders for the visual_gen component tests (Wan, Flux, VAE, scheduler and text-encoder families).

Every component here is a real Hugging Face diffusers / transformers class built from a small inline config
(no checkpoint, no hub access). Weights come from a fixed seed through :func:`seeded_state_dict`, and both
sides of an experiment load that same state dict (:func:`load_pair` checks it with the weights fingerprint).
Inputs are made once (:func:`randn`) and the same tensors are handed to both sides.

The configs are the smallest that still take the production path: a 5-D video latent with several frames and
a (1, 2, 2) patch for Wan, joint text + image tokens with 3-axis RoPE ids for Flux, a multi-level VAE decoder
whose latent is large enough to be tiled, a causal 3-D Wan VAE with temporal compression.
"""

from __future__ import annotations

import contextlib
import re
from typing import Callable, Dict, Iterator, Tuple

import pytest
import torch

diffusers = pytest.importorskip(
    "diffusers", reason="the component tests need Hugging Face diffusers (pip install -e .[diffusers])")

from vgct_ext.probes import assert_same_weights  # noqa: E402

#: The diffusers release these tests were written and calibrated against (see the calibration evidence).
DIFFUSERS_PIN = "0.42.1"

# ----------------------------------------------------------------------------------------------------------
# devices and determinism
# ----------------------------------------------------------------------------------------------------------


def device_for(kind: str) -> torch.device:
    """'cpu' or 'cuda' -> a torch.device (the GPU variants are marked ``gpu`` and gated by requires_gpu)."""
    return torch.device("cuda", 0) if kind == "cuda" else torch.device("cpu")


def randn(shape, *, seed: int, dtype=torch.float32, device="cpu", scale: float = 1.0) -> torch.Tensor:
    """A deterministic normal tensor made on the CPU (same values on every device), then moved once."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    t = torch.randn(tuple(shape), generator=g, dtype=torch.float64) * scale
    return t.to(dtype=dtype).to(device)


QK_NORM_RE = re.compile(r"norm_(added_)?[qk]\.")
QK_NORM_GAIN = 2.0


def seeded_state_dict(module: torch.nn.Module, seed: int) -> Dict[str, torch.Tensor]:
    """A fixed-seed fp32 state dict for ``module``: fan-in scaled weights, norm gains near 1, small biases.

    Generated on the CPU in a fixed (sorted-name) order, so the same seed gives the same weights on every
    device and every run. Norm gains are deliberately not all ones, so a skipped norm changes the output.
    """
    g = torch.Generator(device="cpu").manual_seed(seed)
    out = {}
    for name, t in sorted(module.state_dict().items()):
        if not torch.is_floating_point(t):
            out[name] = t.clone()
            continue
        shape = tuple(t.shape)
        r = torch.randn(shape, generator=g, dtype=torch.float64)
        leaf = name.rsplit(".", 1)[-1]
        if t.dim() >= 2:
            fan_in = max(1, t[0].numel())
            v = r / fan_in**0.5
        elif leaf == "weight" and QK_NORM_RE.search(name):
            # trained DiTs have peaky attention: QK-norm gains well above 1 give logits with std ~4
            v = QK_NORM_GAIN + 0.1 * QK_NORM_GAIN * r
        elif leaf == "weight" and ("norm" in name or "ln" in name):
            v = 1.0 + 0.1 * r
        else:
            v = 0.05 * r
        if "scale_shift_table" in name:
            v = r / shape[-1] ** 0.5
        out[name] = v.to(torch.float32)
    return out


def cast_like_from_pretrained(module: torch.nn.Module, dtype, keep_in_fp32=()) -> torch.nn.Module:
    """Cast ``module`` to ``dtype`` the way ``from_pretrained(torch_dtype=dtype)`` does: parameters and buffers of
    submodules named in ``keep_in_fp32`` (the model class's ``_keep_in_fp32_modules``) stay float32."""
    keep = set(keep_in_fp32 or ())
    for name, p in list(module.named_parameters()) + list(module.named_buffers()):
        if not torch.is_floating_point(p):
            continue
        want = torch.float32 if keep & set(name.split(".")) else dtype
        p.data = p.data.to(want)
    return module


def _place(m, device, dtype, keep_in_fp32):
    m.to(device=device)
    if dtype != torch.float32:
        cast_like_from_pretrained(m, dtype, keep_in_fp32)
    return m


def load_pair(factory: Callable[[], torch.nn.Module], *, seed: int, component: str, device="cpu",
              dtype=torch.float32, keep_in_fp32=(), tweak: Callable[[Dict[str, torch.Tensor]], None] | None = None
              ) -> Tuple[torch.nn.Module, torch.nn.Module]:
    """Two instances of ``factory()`` (feature-off, feature-on) loaded from one seeded state dict.

    ``tweak`` may edit the seeded state dict in place before loading (model-specific realistic statistics).
    Asserts (with the weights fingerprint) that both sides hold the same weights in the same layout and dtype
    before any feature is enabled.
    """
    ref = factory().eval()
    sd = seeded_state_dict(ref, seed)
    if tweak is not None:
        tweak(sd)
    ref.load_state_dict(sd, strict=True)
    feat = factory().eval()
    feat.load_state_dict(sd, strict=True)
    _place(ref, device, dtype, keep_in_fp32)
    _place(feat, device, dtype, keep_in_fp32)
    assert_same_weights(ref, feat, component=component)
    return ref, feat


def load_one(factory: Callable[[], torch.nn.Module], *, seed: int, device="cpu", dtype=torch.float32,
             keep_in_fp32=(), tweak=None):
    m = factory().eval()
    sd = seeded_state_dict(m, seed)
    if tweak is not None:
        tweak(sd)
    m.load_state_dict(sd, strict=True)
    return _place(m, device, dtype, keep_in_fp32)


def smooth_timestep_mlp(sd: Dict[str, torch.Tensor], key: str, num_channels: int, tau: float = 100.0) -> None:
    """Make a seeded timestep-embedding MLP smooth in t, as trained DiTs are.

    diffusers' ``Timesteps`` feeds ``[cos(f_k t), sin(f_k t)]`` with ``f_k = 10000^(-k/half)`` into
    ``linear_1``; random weights on the fast channels (f_k ~ 1 rad per timestep unit) make the conditioning
    jump between adjacent denoising steps, which no trained model does and which would make every caching
    decision a miss. Each column pair is scaled by ``exp(-(f_k * tau)^2)`` (a low-pass over ~tau timesteps),
    factors below 1e-6 set to 0 (no subnormal weights: they are 100x slower on x86 CPUs).
    """
    import math

    half = num_channels // 2
    f = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float64) / half)
    w = torch.exp(-(f * tau) ** 2)
    w = torch.where(w < 1e-6, torch.zeros_like(w), w).to(torch.float32)  # no subnormals (slow on x86)
    W = sd[key]
    W[:, :half] *= w
    W[:, half:2 * half] *= w


# ----------------------------------------------------------------------------------------------------------
# Wan
# ----------------------------------------------------------------------------------------------------------

#: A tiny WanTransformer3DModel: 2 heads of 24 channels (RoPE split t/h/w = 8/8/8), (1, 2, 2) patches,
#: cross-attention norm and QK RMSNorm across heads (the Wan 2.1 layout), 3 blocks (head, middle, tail:
#: what First Block Cache needs).
WAN_CONFIG = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=2,
    attention_head_dim=24,
    in_channels=8,
    out_channels=8,
    text_dim=32,
    freq_dim=32,
    ffn_dim=96,
    num_layers=3,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    eps=1e-6,
    rope_max_seq_len=64,
)
#: latent (B, C, F, H, W): 3 latent frames of 8x8 -> 3 * 4 * 4 = 48 tokens; 12 text tokens.
WAN_LATENT = (1, 8, 3, 8, 8)
WAN_TEXT = (1, 12, 32)
#: WanTransformer3DModel._keep_in_fp32_modules (kept float32 when the model runs in bf16, as from_pretrained does)
WAN_KEEP_FP32 = ("rope", "time_embedder", "scale_shift_table", "norm1", "norm2", "norm3")


def wan_transformer(**overrides):
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel(**{**WAN_CONFIG, **overrides})


def wan_smooth_t(sd):
    """``tweak`` for load_pair/load_one on a WanTransformer3DModel: smooth timestep MLP (see smooth_timestep_mlp)."""
    smooth_timestep_mlp(sd, "condition_embedder.time_embedder.linear_1.weight", WAN_CONFIG["freq_dim"])


def wan_block():
    from diffusers.models.transformers.transformer_wan import WanTransformerBlock

    dim = WAN_CONFIG["num_attention_heads"] * WAN_CONFIG["attention_head_dim"]
    return WanTransformerBlock(dim, WAN_CONFIG["ffn_dim"], WAN_CONFIG["num_attention_heads"],
                               WAN_CONFIG["qk_norm"], WAN_CONFIG["cross_attn_norm"], WAN_CONFIG["eps"], None)


def wan_block_inputs(*, seed: int, device="cpu", dtype=torch.float32):
    """Inputs of one WanTransformerBlock as the transformer hands them over: tokens, text context,
    the (B, 6, dim) timestep projection and the (cos, sin) RoPE tables of the 3 x 4 x 4 token grid."""
    from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed

    heads, hd = WAN_CONFIG["num_attention_heads"], WAN_CONFIG["attention_head_dim"]
    dim = heads * hd
    b, c, f, h, w = WAN_LATENT
    n = f * (h // 2) * (w // 2)
    rope = WanRotaryPosEmbed(hd, WAN_CONFIG["patch_size"], WAN_CONFIG["rope_max_seq_len"])
    cos, sin = rope(torch.empty(WAN_LATENT))
    return dict(
        hidden_states=randn((b, n, dim), seed=seed, dtype=dtype, device=device),
        encoder_hidden_states=randn((b, WAN_TEXT[1], dim), seed=seed + 1, dtype=dtype, device=device),
        temb=randn((b, 6, dim), seed=seed + 2, dtype=dtype, device=device, scale=0.5),
        rotary_emb=(cos.to(device), sin.to(device)),
    )


# ----------------------------------------------------------------------------------------------------------
# Flux
# ----------------------------------------------------------------------------------------------------------

#: A tiny FluxTransformer2DModel: 2 heads of 32 channels, RoPE axes (8, 12, 12) over (text/id, row, column),
#: 2 double-stream (joint text + image) blocks and 2 single-stream blocks.
FLUX_CONFIG = dict(
    patch_size=1,
    in_channels=16,
    out_channels=None,
    num_layers=2,
    num_single_layers=2,
    attention_head_dim=32,
    num_attention_heads=2,
    joint_attention_dim=32,
    pooled_projection_dim=32,
    guidance_embeds=False,
    axes_dims_rope=(8, 12, 12),
)
FLUX_THETA = 10000
#: VAE latent (B, 4, 8, 8) packed 2x2 -> 16 image tokens of 16 channels; 8 text tokens.
FLUX_LATENT = (1, 4, 8, 8)
FLUX_TEXT_TOKENS = 8


def flux_smooth_t(sd):
    """``tweak`` for a FluxTransformer2DModel: smooth timestep MLP (Timesteps(256) of t * 1000)."""
    smooth_timestep_mlp(sd, "time_text_embed.timestep_embedder.linear_1.weight", 256)


def flux_transformer(**overrides):
    from diffusers import FluxTransformer2DModel

    return FluxTransformer2DModel(**{**FLUX_CONFIG, **overrides})


def flux_double_block():
    from diffusers.models.transformers.transformer_flux import FluxTransformerBlock

    return FluxTransformerBlock(FLUX_CONFIG["num_attention_heads"] * FLUX_CONFIG["attention_head_dim"],
                                FLUX_CONFIG["num_attention_heads"], FLUX_CONFIG["attention_head_dim"])


def flux_single_block():
    from diffusers.models.transformers.transformer_flux import FluxSingleTransformerBlock

    return FluxSingleTransformerBlock(FLUX_CONFIG["num_attention_heads"] * FLUX_CONFIG["attention_head_dim"],
                                      FLUX_CONFIG["num_attention_heads"], FLUX_CONFIG["attention_head_dim"])


def flux_ids(device="cpu"):
    """Text ids (all zero) and the pipeline's latent image ids for the packed latent grid, concatenated the
    way FluxTransformer2DModel does (text first)."""
    from diffusers import FluxPipeline

    _, _, h, w = FLUX_LATENT
    txt = torch.zeros(FLUX_TEXT_TOKENS, 3)
    img = FluxPipeline._prepare_latent_image_ids(1, h // 2, w // 2, "cpu", torch.float32)
    return txt.to(device), img.to(device)


def flux_block_inputs(*, seed: int, device="cpu", dtype=torch.float32, theta: float = FLUX_THETA):
    from diffusers.models.transformers.transformer_flux import FluxPosEmbed

    dim = FLUX_CONFIG["num_attention_heads"] * FLUX_CONFIG["attention_head_dim"]
    b, _, h, w = FLUX_LATENT
    txt, img = flux_ids()
    cos, sin = FluxPosEmbed(theta=theta, axes_dim=list(FLUX_CONFIG["axes_dims_rope"]))(torch.cat([txt, img]))
    return dict(
        hidden_states=randn((b, (h // 2) * (w // 2), dim), seed=seed, dtype=dtype, device=device),
        encoder_hidden_states=randn((b, FLUX_TEXT_TOKENS, dim), seed=seed + 1, dtype=dtype, device=device),
        temb=randn((b, dim), seed=seed + 2, dtype=dtype, device=device),
        image_rotary_emb=(cos.to(device), sin.to(device)),
    )


# ----------------------------------------------------------------------------------------------------------
# attention backends
# ----------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def planted_softmax_scale(backend: str, transform: Callable[[float], float]) -> Iterator[None]:
    """Planted fault: attention through diffusers backend ``backend`` runs with softmax scale ``transform(scale)``
    (``scale`` defaults to 1/sqrt(head_dim), as SDPA's), e.g. ``lambda s: 1.1 * s`` for a 10% scale error. The
    registry entry is wrapped for the block only; stack it inside ``attention_backend_calls`` to count too."""
    import math

    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    key = AttentionBackendName(backend)
    reg = _AttentionBackendRegistry._backends
    original = reg[key]

    def faulty(**kwargs):
        scale = kwargs.get("scale") or 1.0 / math.sqrt(kwargs["query"].shape[-1])
        kwargs["scale"] = transform(scale)
        return original(**kwargs)

    reg[key] = faulty
    try:
        yield
    finally:
        reg[key] = original


# ----------------------------------------------------------------------------------------------------------
# misc
# ----------------------------------------------------------------------------------------------------------


def clone_inputs(d):
    """A deep-enough copy of a dict of tensors / tuples of tensors (so a side cannot mutate the shared one)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, torch.Tensor):
            out[k] = v.clone()
        elif isinstance(v, tuple):
            out[k] = tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in v)
        else:
            out[k] = v
    return out


# ----------------------------------------------------------------------------------------------------------
# planted faults
# ----------------------------------------------------------------------------------------------------------


def assert_fault_caught(excinfo, component: str, *, statistics=None) -> list:
    """Check that a gate or probe failed *diagnostically* on a planted fault.

    ``excinfo`` is the ``pytest.raises`` result of a vgct gate (GateFailure) or probe (FeatureInactive). The
    message must name ``component``, and at least one statistic (gate) or form (probe) must have failed; when
    ``statistics`` is given, one of the failed ones must be among them and its message row must say FAIL.
    Returns the names of the failed statistics / forms (for the test's own assertions).
    """
    err = excinfo.value
    msg = str(err)
    assert f"'{component}'" in msg, f"the failure does not name component {component!r}:\n{msg}"
    checks = getattr(err, "checks", None)
    if checks:
        failed = [c.statistic for c in checks if c.gating and not c.passed]
        labels = {c.statistic: c.label for c in checks}
    else:  # a feature-active probe
        result = getattr(err, "result", None)
        assert result is not None, f"not a vgct gate/probe failure: {type(err).__name__}: {msg}"
        failed = [form for form, ok, _ in result.forms if not ok]
        labels = {f: f for f in failed}
    assert failed, f"the failure lists no failed statistic:\n{msg}"
    if statistics is not None:
        hit = [s for s in failed if s in statistics]
        assert hit, f"expected one of {statistics} to fail, failed: {failed}\n{msg}"
        for s in hit:
            row = [ln for ln in msg.splitlines() if labels[s] in ln and "FAIL" in ln]
            assert row, f"no FAIL row for {labels[s]!r} in the message:\n{msg}"
    return failed


def skip_while_calibrating(vgct) -> None:
    """Planted-fault tests of T2 gates check the fault against the recorded evidence; under --vgct-calibrate the
    gate records instead of gating, so they are skipped there (and they never add calibration runs)."""
    if vgct.calibrating:
        pytest.skip("planted-fault test of a T2 gate: runs in the gating pass, not under --vgct-calibrate")
