"""L1 tests of Flux operations: 3-axis RoPE (FluxPosEmbed table and apply_rotary_emb), per-head QK RMSNorm, latent
packing (FluxPipeline._pack_latents / _unpack_latents) and the latent image ids that must match the packing.

References are float64 formulas and index oracles written from the definitions. Planted faults (wrong RoPE
theta, skipped norm) must fail the same gates, naming the component and the statistic that moved.
"""

from __future__ import annotations

import pytest
import torch

import _components as C
from vgct_ext import compare
from vgct_ext.gates import GateFailure

# t1 on each test that calls a T1 gate; the index-oracle tests check exactly (no bars): not t1, their
# component/feature markers keep them paired

AXES = tuple(C.FLUX_CONFIG["axes_dims_rope"])  # (8, 12, 12): text/index axis, row, column


def flux_angles_f64(ids: torch.Tensor, axes=AXES, theta: float = C.FLUX_THETA) -> torch.Tensor:
    """(S, sum(axes) / 2) rotation angles: axis i of size d rotates pair k by ids[:, i] * theta^(-2k/d)."""
    rows = []
    for r in ids.tolist():
        ang = []
        for pos, d in zip(r, axes):
            for k in range(d // 2):
                ang.append(pos * theta ** (-(2.0 * k) / d))
        rows.append(ang)
    return torch.tensor(rows, dtype=torch.float64)


def big_ids():
    """Text ids (8 zeros) + the pipeline's image ids for a 1024 x 1024 image (64 x 64 packed grid would be large;
    a 24 x 40 grid keeps the table small but positions up to 39)."""
    from diffusers import FluxPipeline

    txt = torch.zeros(C.FLUX_TEXT_TOKENS, 3)
    img = FluxPipeline._prepare_latent_image_ids(1, 24, 40, "cpu", torch.float32)
    return torch.cat([txt, img])


def _check_pos_embed(pos_embed, vgct):
    ids = big_ids()
    cos, sin = pos_embed(ids)
    ang = flux_angles_f64(ids)
    vgct.assert_t1(cos, torch.cos(ang).repeat_interleave(2, dim=1), feature="RoPE cos table vs float64 formula",
                   dim=0)
    vgct.assert_t1(sin, torch.sin(ang).repeat_interleave(2, dim=1), feature="RoPE sin table vs float64 formula",
                   dim=0)


def _pos_embed(theta=C.FLUX_THETA):
    from diffusers.models.transformers.transformer_flux import FluxPosEmbed

    return FluxPosEmbed(theta=theta, axes_dim=list(AXES))


@pytest.mark.t1
@pytest.mark.component("flux.pos_embed")
@pytest.mark.feature("RoPE table vs float64 formula")
def test_flux_rope_table_matches_float64_formula(vgct):
    """L1. Boundary: FluxPosEmbed.forward(ids) -> (cos, sin) of shape (S, head_dim) for 8 text ids + a 24 x 40
    image-id grid from FluxPipeline._prepare_latent_image_ids. Feature: Flux 3-axis RoPE (axes 8/12/12 of a
    32-channel head, theta 1e4). Reference: float64 ids * theta^(-2k/d) per axis. T1 (default bars)."""
    _check_pos_embed(_pos_embed(), vgct)


@pytest.mark.t1
@pytest.mark.component("flux.apply_rotary_emb")
@pytest.mark.feature("RoPE application vs float64 complex rotation")
def test_flux_apply_rotary_emb_matches_float64_rotation(vgct):
    """L1. Boundary: diffusers.models.embeddings.apply_rotary_emb(x, (cos, sin), sequence_dim=1) as
    FluxAttnProcessor calls it, x (B, S, heads, head_dim). Feature: interleaved-pair rotation with Flux's tables.
    Reference: float64 complex multiplication (x[2k] + i x[2k+1]) * exp(i angle). T1 (default bars)."""
    from diffusers.models.embeddings import apply_rotary_emb

    ids = big_ids()
    cos, sin = _pos_embed()(ids)
    x = C.randn((1, ids.shape[0], 2, sum(AXES)), seed=30, scale=3.0)
    got = apply_rotary_emb(x, (cos, sin), sequence_dim=1)
    ang = flux_angles_f64(ids)
    xd = x.double()
    z = torch.complex(xd[..., 0::2], xd[..., 1::2]) * torch.polar(torch.ones_like(ang), ang)[None, :, None, :]
    exp = torch.empty_like(xd)
    exp[..., 0::2], exp[..., 1::2] = z.real, z.imag
    vgct.assert_t1(got, exp, dim=1)


def rms_norm_f64(x, weight, eps):
    x = x.double()
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * weight.double()


def _check_norm(norm, x, ref_norm, vgct):
    with torch.no_grad():
        got = norm(x)
    vgct.assert_t1(got, rms_norm_f64(x, ref_norm.weight.detach(), ref_norm.eps), dim=2)


@pytest.mark.t1
@pytest.mark.component("flux.attn.norm_q")
@pytest.mark.feature("QK RMSNorm per head vs float64")
def test_flux_qk_rmsnorm_per_head_matches_float64(vgct):
    """L1. Boundary: FluxAttention.norm_q / norm_added_q outputs on (B, S, heads, head_dim). Feature: Flux's
    per-head QK RMSNorm (one RMS per head, unlike Wan's across-heads norm). Reference: float64
    x / sqrt(mean_head(x^2) + eps) * weight. T1 (default bars). Heads get RMS 2 and 9, so a norm over the wrong
    axis or a skipped norm cannot pass."""
    block = C.load_one(C.flux_double_block, seed=0)
    x = C.randn((1, 24, 2, 32), seed=31) * torch.tensor([2.0, 9.0])[None, None, :, None]
    _check_norm(block.attn.norm_q, x, block.attn.norm_q, vgct)
    _check_norm(block.attn.norm_added_q, x, block.attn.norm_added_q, vgct)


# ------------------------------------------------------------------------------------------------------------
# packing layout


def _pack_oracle(lat):
    """(B, C, H, W) -> (B, H/2 * W/2, C * 4): token (h, w) row-major, feature (c, i, j) = c * 4 + i * 2 + j."""
    b_n, c_n, h_n, w_n = lat.shape
    out = torch.empty(b_n, (h_n // 2) * (w_n // 2), c_n * 4, dtype=lat.dtype)
    for b in range(b_n):
        for h in range(h_n // 2):
            for w in range(w_n // 2):
                for c in range(c_n):
                    for i in range(2):
                        for j in range(2):
                            out[b, h * (w_n // 2) + w, c * 4 + i * 2 + j] = lat[b, c, 2 * h + i, 2 * w + j]
    return out


def _exact(actual, expected, what):
    s = compare(actual, expected)
    assert tuple(actual.shape) == tuple(expected.shape), (what, actual.shape, expected.shape)
    assert s.n_unequal == 0, (f"{what}: {s.n_unequal} of {s.n} elements differ from the index oracle; worst at "
                              f"{s.max_abs_err_index}: {s.max_abs_err_actual} vs {s.max_abs_err_expected}")


@pytest.mark.component("flux.pipeline.pack_latents")
@pytest.mark.feature("latent packing layout vs index oracle, round trip, image ids")
def test_flux_pack_unpack_matches_index_oracle_and_round_trips():
    """L1. Boundary: FluxPipeline._pack_latents (1, 16, 24, 40) -> (1, 240, 64) tokens and _unpack_latents back
    (a 192 x 320 image with the 8x VAE). Feature: Flux's 2 x 2 latent packing. Reference: an index oracle by
    explicit loops, the exact round trip, and the pipeline's latent image ids, whose row t must be
    (0, h(t), w(t)) of the packed token t (else RoPE positions and tokens disagree). T1 at its strictest: bitwise
    equality (pure data movement)."""
    from diffusers import FluxPipeline

    b, c, h, w = 1, 16, 24, 40
    lat = C.randn((b, c, h, w), seed=32)
    packed = FluxPipeline._pack_latents(lat, b, c, h, w)
    _exact(packed, _pack_oracle(lat), "flux _pack_latents")
    back = FluxPipeline._unpack_latents(packed, h * 8, w * 8, 8)
    _exact(back, lat, "flux _unpack_latents(_pack_latents(x))")
    ids = FluxPipeline._prepare_latent_image_ids(b, h // 2, w // 2, "cpu", torch.float32)
    oracle_ids = torch.tensor([[0.0, t // (w // 2), t % (w // 2)] for t in range((h // 2) * (w // 2))])
    _exact(ids, oracle_ids, "flux latent image ids vs packed token order")


# ------------------------------------------------------------------------------------------------------------
# planted faults


@pytest.mark.t1
@pytest.mark.component("flux.pos_embed")
@pytest.mark.feature("RoPE table vs float64 formula")
def test_planted_fault_wrong_rope_theta_is_caught(vgct):
    """Planted fault: FluxPosEmbed with theta = 1e3 instead of 1e4. The float64-formula gate must fail, naming the
    component and the moved statistics."""
    with pytest.raises(GateFailure) as e:
        _check_pos_embed(_pos_embed(theta=1000), vgct)
    C.assert_fault_caught(e, "flux.pos_embed", statistics=("rel_l2", "cosine", "mismatches"))


@pytest.mark.t1
@pytest.mark.component("flux.attn.norm_q")
@pytest.mark.feature("QK RMSNorm per head vs float64")
def test_planted_fault_skipped_qk_norm_is_caught(vgct):
    """Planted fault: norm_q skipped (Identity). The float64 RMSNorm gate must fail naming component and
    statistics."""
    block = C.load_one(C.flux_double_block, seed=0)
    x = C.randn((1, 24, 2, 32), seed=31) * torch.tensor([2.0, 9.0])[None, None, :, None]
    with pytest.raises(GateFailure) as e:
        _check_norm(torch.nn.Identity(), x, block.attn.norm_q, vgct)
    C.assert_fault_caught(e, "flux.attn.norm_q", statistics=("rel_l2", "cosine"))
