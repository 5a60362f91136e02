"""L1 tests of Wan operations: RoPE (table and application), QK RMSNorm, latent patchify / unpatchify layout.

Each test compares one operation of the real diffusers Wan 2.1 code against an independent float64 formula or an
index oracle written from the definition (no reshape shared with the code under test). The planted faults at
the bottom (a wrong RoPE theta, a skipped norm) must make the same gates fail, naming the component and the
statistic that moved.
"""

from __future__ import annotations

import math

import pytest
import torch

import _components as C
from vgct_ext import compare
from vgct_ext.gates import GateFailure
from vgct_ext.experiment import capture

# t1 on each test that calls a T1 gate; the index-oracle tests check exactly (no bars): not t1, their
# component/feature markers keep them paired

THETA = 10000.0  # WanRotaryPosEmbed's default, what WanTransformer3DModel builds


# ------------------------------------------------------------------------------------------------------------
# float64 oracles


def rope_angles_f64(head_dim: int, grid, theta: float = THETA) -> torch.Tensor:
    """Angles (N, head_dim // 2) of Wan 3-axis RoPE, straight from the definition.

    The head dim splits into t / h / w parts (h = w = 2 * (head_dim // 6), t = the rest); axis part of size d
    rotates pair k by ``pos * theta ** (-2k / d)``; tokens run frame-major, then row, then column.
    """
    f_n, h_n, w_n = grid
    hw = 2 * (head_dim // 6)
    parts = [head_dim - 2 * hw, hw, hw]
    rows = []
    for f in range(f_n):
        for h in range(h_n):
            for w in range(w_n):
                ang = []
                for pos, d in zip((f, h, w), parts):
                    for k in range(d // 2):
                        ang.append(pos * theta ** (-(2.0 * k) / d))
                rows.append(ang)
    return torch.tensor(rows, dtype=torch.float64)


def rotate_pairs_f64(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs (x[2k], x[2k+1]) of x (B, N, H, D) by angles (N, D/2), as complex numbers."""
    x = x.double()
    z = torch.complex(x[..., 0::2], x[..., 1::2])
    z = z * torch.polar(torch.ones_like(angles), angles)[None, :, None, :]
    out = torch.empty_like(x)
    out[..., 0::2] = z.real
    out[..., 1::2] = z.imag
    return out


def rms_norm_f64(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * weight.double()


def _grid():
    _, _, f, h, w = C.WAN_LATENT
    pt, ph, pw = C.WAN_CONFIG["patch_size"]
    return f // pt, h // ph, w // pw


# ------------------------------------------------------------------------------------------------------------
# RoPE


def _rope_module(theta=THETA):
    from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed

    return WanRotaryPosEmbed(C.WAN_CONFIG["attention_head_dim"], C.WAN_CONFIG["patch_size"],
                             C.WAN_CONFIG["rope_max_seq_len"], theta=theta)


#: a larger latent than the block tests use, for the table alone: 9 x 16 x 16 token grid, positions up to 15
TABLE_LATENT = (1, 8, 9, 32, 32)


def _check_rope_table(rope, vgct):
    cos, sin = rope(torch.empty(TABLE_LATENT))
    _, _, f, h, w = TABLE_LATENT
    ang = rope_angles_f64(C.WAN_CONFIG["attention_head_dim"], (f, h // 2, w // 2))
    # the table repeats each pair's angle twice (interleaved real layout)
    exp_cos = torch.cos(ang).repeat_interleave(2, dim=1)[None, :, None, :]
    exp_sin = torch.sin(ang).repeat_interleave(2, dim=1)[None, :, None, :]
    assert cos.shape == exp_cos.shape, (cos.shape, exp_cos.shape)
    vgct.assert_t1(cos, exp_cos, feature="RoPE cos table vs float64 formula", dim=1)
    vgct.assert_t1(sin, exp_sin, feature="RoPE sin table vs float64 formula", dim=1)


@pytest.mark.t1
@pytest.mark.component("wan.rope")
@pytest.mark.feature("RoPE table vs float64 formula")
def test_wan_rope_table_matches_float64_formula(vgct):
    """L1. Boundary: WanRotaryPosEmbed.forward -> (cos, sin) tables (1, F*H*W, 1, head_dim) for a 9 x 16 x 16
    token grid (a (1, 8, 9, 32, 32) latent with (1, 2, 2) patches). Feature: Wan's 3-axis (frame, row, column)
    rotary embedding. Reference: float64 formula
    pos * theta^(-2k/d) per axis part, tokens frame-major. T1 (default bars: the tables are float32 roundings of
    float64 values)."""
    _check_rope_table(_rope_module(), vgct)


class _DispatchRecorder:
    """Records the query/key that WanAttnProcessor hands to dispatch_attention_fn (after QK-norm and RoPE)."""

    def __init__(self):
        self.calls = []

    def __enter__(self):
        import diffusers.models.transformers.transformer_wan as tw

        self._mod, self._orig = tw, tw.dispatch_attention_fn

        def rec(query, key, value, *a, **kw):
            self.calls.append((query.detach().clone(), key.detach().clone()))
            return self._orig(query, key, value, *a, **kw)

        tw.dispatch_attention_fn = rec
        return self

    def __exit__(self, *exc):
        self._mod.dispatch_attention_fn = self._orig


def _check_rope_applied(block, inputs, vgct, feature):
    x = inputs["hidden_states"]
    with _DispatchRecorder() as rec, torch.no_grad():
        block(**C.clone_inputs(inputs))
    q_got, k_got = rec.calls[0]  # attn1: self-attention, the only call that carries RoPE
    attn = block.attn1
    # oracle: the self-attention input (norm1 + modulation, recomputed in float64), projections, QK-norm across
    # heads, then the complex rotation with angles from the definition
    temb = inputs["temb"].double()
    shift, scale = (block.scale_shift_table.double() + temb).chunk(6, dim=1)[:2]
    xn = torch.nn.functional.layer_norm(x.double(), (x.shape[-1],), eps=C.WAN_CONFIG["eps"])
    h = xn * (1 + scale) + shift
    heads, hd = C.WAN_CONFIG["num_attention_heads"], C.WAN_CONFIG["attention_head_dim"]
    ang = rope_angles_f64(hd, _grid())
    out = {}
    for name, lin, norm in (("query", attn.to_q, attn.norm_q), ("key", attn.to_k, attn.norm_k)):
        y = h @ lin.weight.double().T + lin.bias.double()
        y = rms_norm_f64(y, norm.weight, norm.eps)
        out[name] = rotate_pairs_f64(y.unflatten(-1, (heads, hd)), ang)
    vgct.assert_t1(q_got, out["query"], feature=feature + " (query)", dim=1)
    vgct.assert_t1(k_got, out["key"], feature=feature + " (key)", dim=1)


@pytest.mark.t1
@pytest.mark.component("wan.attn1")
@pytest.mark.feature("RoPE applied to query/key vs float64 rotation")
def test_wan_rope_applied_matches_float64_rotation(vgct):
    """L1. Boundary: the query and key WanAttnProcessor passes to dispatch_attention_fn in the self-attention of
    a WanTransformerBlock (B, N, heads, head_dim), i.e. after projection, QK RMSNorm across heads and the
    interleaved-pair rotation. Feature: RoPE application with the positions of the 3 x 4 x 4 token grid.
    Reference: the same math recomputed in float64 from the block's weights (complex rotation by the formula's
    angles). T1 (default bars)."""
    block = C.load_one(C.wan_block, seed=0)
    _check_rope_applied(block, C.wan_block_inputs(seed=10), vgct, "RoPE applied")


# ------------------------------------------------------------------------------------------------------------
# QK RMSNorm


def _check_qk_norm(norm_q, x, weight, eps, vgct):
    with torch.no_grad():
        got = norm_q(x)
    vgct.assert_t1(got, rms_norm_f64(x, weight, eps), dim=-1)


@pytest.mark.t1
@pytest.mark.component("wan.attn.norm_q")
@pytest.mark.feature("QK RMSNorm across heads vs float64")
def test_wan_qk_rmsnorm_matches_float64(vgct):
    """L1. Boundary: WanAttention.norm_q output (B, N, heads * head_dim). Feature: Wan's QK RMSNorm
    ("rms_norm_across_heads": one RMS over all heads together, not per head). Reference: float64
    x / sqrt(mean(x^2) + eps) * weight over the full inner dim. T1 (default bars). Input rows have RMS ~8, so a
    skipped norm cannot pass."""
    block = C.load_one(C.wan_block, seed=0)
    x = C.randn((1, 48, 48), seed=20, scale=8.0)
    _check_qk_norm(block.attn1.norm_q, x, block.attn1.norm_q.weight.detach(), block.attn1.norm_q.eps, vgct)


# ------------------------------------------------------------------------------------------------------------
# patchify / unpatchify layout


def _patch_oracle(x: torch.Tensor) -> torch.Tensor:
    """(B, C, F, H, W) -> (B, tokens, C * pt * ph * pw) by explicit index loops: token (f, h, w) frame-major,
    channel ((c * pt + i) * ph + j) * pw + k (the Conv3d weight order)."""
    pt, ph, pw = C.WAN_CONFIG["patch_size"]
    b_n, c_n, f_n, h_n, w_n = x.shape
    fp, hp, wp = f_n // pt, h_n // ph, w_n // pw
    out = torch.empty(b_n, fp * hp * wp, c_n * pt * ph * pw, dtype=x.dtype)
    for b in range(b_n):
        for f in range(fp):
            for h in range(hp):
                for w in range(wp):
                    t = (f * hp + h) * wp + w
                    for c in range(c_n):
                        for i in range(pt):
                            for j in range(ph):
                                for k in range(pw):
                                    out[b, t, ((c * pt + i) * ph + j) * pw + k] = x[b, c, f * pt + i, h * ph + j,
                                                                                    w * pw + k]
    return out


def _unpatch_oracle(tokens: torch.Tensor, shape) -> torch.Tensor:
    """(B, tokens, pt * ph * pw * C) -> (B, C, F, H, W) by explicit index loops: proj_out's feature order is
    (i, j, k, c) (patch position major, channel minor)."""
    pt, ph, pw = C.WAN_CONFIG["patch_size"]
    b_n, c_n, f_n, h_n, w_n = shape
    fp, hp, wp = f_n // pt, h_n // ph, w_n // pw
    out = torch.empty(shape, dtype=tokens.dtype)
    for b in range(b_n):
        for f in range(fp):
            for h in range(hp):
                for w in range(wp):
                    t = (f * hp + h) * wp + w
                    for i in range(pt):
                        for j in range(ph):
                            for k in range(pw):
                                for c in range(c_n):
                                    out[b, c, f * pt + i, h * ph + j, w * pw + k] = tokens[
                                        b, t, ((i * ph + j) * pw + k) * c_n + c]
    return out


def _assert_exact(actual, expected, what):
    s = compare(actual, expected)
    assert s.n_unequal == 0 and s.n_class_mismatch == 0, (
        f"{what}: layout differs from the index oracle in {s.n_unequal} of {s.n} elements; first worst at "
        f"{s.max_abs_err_index}: actual {s.max_abs_err_actual}, expected {s.max_abs_err_expected}")


@pytest.mark.component("wan.transformer.patchify")
@pytest.mark.feature("latent patchify layout vs index oracle")
def test_wan_patchify_matches_index_oracle():
    """L1. Boundary: the token tensor WanTransformer3DModel hands its first block (B, F*H*W/4, inner_dim),
    captured inside the real forward. Feature: Conv3d (1, 2, 2) patch embedding + flatten/transpose token
    layout. Reference: an index oracle (explicit loops) over the 5-D latent; the patch embedding is loaded with
    one-hot weights so each output channel copies one latent element. T1 at its strictest: bitwise equality
    (a copy through one-hot weights is exact)."""
    model = C.load_one(C.wan_transformer, seed=0)
    pt, ph, pw = C.WAN_CONFIG["patch_size"]
    c_in = C.WAN_CONFIG["in_channels"]
    with torch.no_grad():
        w = torch.zeros_like(model.patch_embedding.weight)
        for c in range(c_in):
            for i in range(pt):
                for j in range(ph):
                    for k in range(pw):
                        w[((c * pt + i) * ph + j) * pw + k, c, i, j, k] = 1.0
        model.patch_embedding.weight.copy_(w)
        model.patch_embedding.bias.zero_()
    x = C.randn(C.WAN_LATENT, seed=3)
    with capture(model.blocks[0], stop_after=1) as cap, torch.no_grad():
        model(hidden_states=x, timestep=torch.tensor([500.0]), encoder_hidden_states=C.randn(C.WAN_TEXT, seed=4))
    tokens = cap.args[0] if cap.args else cap.kwargs["hidden_states"]
    n_used = c_in * pt * ph * pw
    _assert_exact(tokens[..., :n_used], _patch_oracle(x), "wan patchify")
    assert torch.count_nonzero(tokens[..., n_used:]) == 0, "channels beyond the one-hot copies must be zero"


@pytest.mark.component("wan.transformer.unpatchify")
@pytest.mark.feature("latent unpatchify layout vs index oracle, round trip")
def test_wan_unpatchify_matches_index_oracle_and_round_trips():
    """L1. Boundary: WanTransformer3DModel's output latent (B, C, F, H, W), against the proj_out tokens captured
    in the same forward. Feature: the unpatchify reshape/permute at the end of forward. Reference: an index
    oracle over the tokens, and the exact round trip tokens -> latent -> tokens through the oracle's inverse.
    T1 at its strictest: bitwise equality (pure data movement)."""
    model = C.load_one(C.wan_transformer, seed=0)
    x = C.randn(C.WAN_LATENT, seed=3)
    with capture(model.proj_out) as cap, torch.no_grad():
        out = model(hidden_states=x, timestep=torch.tensor([500.0]), encoder_hidden_states=C.randn(C.WAN_TEXT, seed=4),
                    return_dict=False)[0]
    tokens = cap.output
    _assert_exact(out, _unpatch_oracle(tokens, C.WAN_LATENT), "wan unpatchify")
    # round trip: the oracle's inverse (token t, feature ((i*ph + j)*pw + k)*C + c) must give the tokens back
    pt, ph, pw = C.WAN_CONFIG["patch_size"]
    back = _patch_oracle(out)  # (c, i, j, k) feature order
    c_n = C.WAN_LATENT[1]
    perm = [((c * pt + i) * ph + j) * pw + k for i in range(pt) for j in range(ph) for k in range(pw)
            for c in range(c_n)]
    _assert_exact(back[..., perm], tokens, "wan unpatchify round trip")


# ------------------------------------------------------------------------------------------------------------
# planted faults: the same gates must fail, naming the component and the statistic that moved


@pytest.mark.t1
@pytest.mark.component("wan.rope")
@pytest.mark.feature("RoPE table vs float64 formula")
def test_planted_fault_wrong_rope_theta_is_caught(vgct):
    """Planted fault: WanRotaryPosEmbed built with theta = 5e5 instead of 1e4. The float64-formula gate must fail
    and its message must name the component and the moved statistic."""
    with pytest.raises(GateFailure) as e:
        _check_rope_table(_rope_module(theta=5.0e5), vgct)
    C.assert_fault_caught(e, "wan.rope", statistics=("rel_l2", "cosine", "mismatches"))


@pytest.mark.t1
@pytest.mark.component("wan.attn.norm_q")
@pytest.mark.feature("QK RMSNorm across heads vs float64")
def test_planted_fault_skipped_qk_norm_is_caught(vgct):
    """Planted fault: norm_q replaced by Identity (a skipped norm). The float64 RMSNorm gate must fail naming the
    component and the moved statistics."""
    block = C.load_one(C.wan_block, seed=0)
    x = C.randn((1, 48, 48), seed=20, scale=8.0)
    with pytest.raises(GateFailure) as e:
        _check_qk_norm(torch.nn.Identity(), x, block.attn1.norm_q.weight.detach(), block.attn1.norm_q.eps, vgct)
    failed = C.assert_fault_caught(e, "wan.attn.norm_q", statistics=("rel_l2", "cosine"))
    assert {"rel_l2", "cosine"} <= set(failed), failed


@pytest.mark.t1
@pytest.mark.component("wan.attn1")
@pytest.mark.feature("RoPE applied to query/key vs float64 rotation")
def test_planted_fault_rope_applied_with_wrong_theta_is_caught(vgct):
    """Planted fault: the block is fed RoPE tables built with theta = 5e5; the applied-rotation gate (oracle at
    theta = 1e4) must fail naming the component."""
    block = C.load_one(C.wan_block, seed=0)
    inputs = C.wan_block_inputs(seed=10)
    inputs["rotary_emb"] = _rope_module(theta=5.0e5)(torch.empty(C.WAN_LATENT))
    with pytest.raises(GateFailure) as e:
        _check_rope_applied(block, inputs, vgct, "RoPE applied")
    C.assert_fault_caught(e, "wan.attn1", statistics=("rel_l2", "cosine"))


def test_oracle_self_check_angles():
    """The RoPE oracle itself: angle of pair 0 is the position, the last pair of an axis part of size d turns
    by theta^(-(d-2)/d) per position (guards the oracle against an off-by-one of its own)."""
    ang = rope_angles_f64(24, (3, 4, 4))
    # token (f=2, h=3, w=1): t part pair 0 = 2, h part pair 0 = 3, w part pair 0 = 1
    t = (2 * 4 + 3) * 4 + 1
    assert ang[t, 0] == 2 and ang[t, 4] == 3 and ang[t, 8] == 1
    assert math.isclose(ang[t, 3], 2 * THETA ** (-6 / 8), rel_tol=1e-15)
