"""CLIP text encoder (transformers ``CLIPTextModel`` from an inline config, as the SD / Flux pipelines use it).

* L1: the attention mask the model builds (causal + padding, ``masking_utils.create_causal_mask``) as it reaches
  the first layer's self-attention, for the eager (additive float) and SDPA (boolean) implementations, against an
  index oracle.
* L2: the attention implementation swap (``eager`` against ``sdpa``), T1 on both emitted embeddings
  (``last_hidden_state`` and the EOS-pooled ``pooler_output``), with a planted skipped final LayerNorm.
"""

from __future__ import annotations

import pytest
import torch

import _components as C
from vgct_ext import compare
from vgct_ext.experiment import capture
from vgct_ext.gates import GateFailure
from vgct_ext.probes import assert_same_weights, count_calls
from vgct_ext.skips import requires_gpu

BOS, EOS, PAD = 998, 999, 0
GPU = [pytest.mark.gpu, requires_gpu()]


def clip_config():
    from transformers import CLIPTextConfig

    return CLIPTextConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, max_position_embeddings=77, eos_token_id=EOS, bos_token_id=BOS,
                          pad_token_id=PAD, projection_dim=32, hidden_act="quick_gelu")


def clip(impl):
    from transformers import CLIPTextModel

    return CLIPTextModel._from_config(clip_config(), attn_implementation=impl)


def prompts(max_len=16):
    """Two tokenized prompts of 12 and 7 tokens (BOS ... EOS), padded to ``max_len``, and their padding mask."""
    g = torch.Generator().manual_seed(7)
    rows = []
    for n in (12, 7):
        body = torch.randint(1, 900, (n - 2,), generator=g).tolist()
        rows.append([BOS] + body + [EOS] + [PAD] * (max_len - n))
    ids = torch.tensor(rows)
    return ids, (ids != PAD).long()


# ------------------------------------------------------------------------------------------------------------
# L1: attention mask construction


def mask_oracle(pad_mask):
    """allowed[b, 0, i, j] = (j <= i) and token j is not padding (explicit loops)."""
    b_n, s = pad_mask.shape
    out = torch.zeros(b_n, 1, s, s, dtype=torch.bool)
    for b in range(b_n):
        for i in range(s):
            for j in range(s):
                out[b, 0, i, j] = j <= i and bool(pad_mask[b, j])
    return out


@pytest.mark.component("text_encoder.clip.attention_mask")  # (not t1: an exact index oracle, no gate bars)
@pytest.mark.feature("causal + padding mask construction vs index oracle")
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_clip_attention_mask_matches_index_oracle(impl):
    """L1. Boundary: the ``attention_mask`` CLIPTextModel passes to encoder.layers[0].self_attn (captured inside
    the real forward), batch of 2 prompts (12 and 7 tokens) padded to 16. Feature: causal + padding mask
    construction (eager: additive float, 0 = attend, finfo.min = masked; sdpa: bool, True = attend). Reference: an
    index oracle (j <= i and token j is real). Exact equality of the allowed sets (mask construction is
    discrete)."""
    model = C.load_one(lambda: clip(impl), seed=0)
    ids, pad = prompts()
    with capture(model.encoder.layers[0].self_attn) as cap, torch.no_grad():
        model(input_ids=ids, attention_mask=pad)
    mask = cap.kwargs["attention_mask"]
    if mask.dtype == torch.bool:
        allowed = mask
    else:
        assert torch.all((mask == 0) | (mask == torch.finfo(mask.dtype).min)), "additive mask not 0 / finfo.min"
        allowed = mask == 0
    expected = mask_oracle(pad).expand_as(allowed)
    s = compare(allowed.to(torch.uint8), expected.to(torch.uint8))
    assert s.n_unequal == 0, (f"CLIP {impl} attention mask differs from the causal+padding oracle at {s.n_unequal} "
                              f"of {s.n} positions, first at {s.max_abs_err_index}")


# ------------------------------------------------------------------------------------------------------------
# L2: attention implementation swap


def run_swap(device, dtype, *, fault=None):
    dev = C.device_for(device)
    ref = C.load_one(lambda: clip("eager"), seed=0, device=dev, dtype=dtype)
    feat = C.load_one(lambda: clip("sdpa"), seed=0, device=dev, dtype=dtype)
    assert_same_weights(ref, feat, component="text_encoder.clip")
    if fault == "skip_final_norm":
        feat.final_layer_norm = torch.nn.Identity()
    ids, _ = prompts(max_len=77)  # the pipelines pad to 77 and pass no attention mask (causal mask only)
    ids = ids.to(dev)
    with torch.no_grad():
        expected = ref(input_ids=ids)
        with count_calls(torch.nn.functional, "scaled_dot_product_attention") as sdpa_calls:
            actual = feat(input_ids=ids)
    return actual, expected, sdpa_calls


@pytest.mark.t1
@pytest.mark.component("text_encoder.clip")
@pytest.mark.feature("attention implementation swap (sdpa vs eager)")
@pytest.mark.parametrize("device,dtype", [pytest.param("cpu", torch.float32, id="cpu-fp32"),
                                          pytest.param("cuda", torch.float32, id="cuda-fp32", marks=GPU)])
def test_clip_text_encoder_sdpa_vs_eager(vgct, device, dtype):
    """L2. Boundary: CLIPTextModel.forward(input_ids) -> last_hidden_state (2, 77, 64) and EOS-pooled
    pooler_output (2, 64), the embeddings the pipelines hand to the DiT. Feature: the SDPA attention
    implementation. Reference: the eager implementation (explicit matmul + softmax) with the same weights
    (fingerprint-checked) and token ids, same process. T1, default bars on both streams."""
    actual, expected, sdpa_calls = run_swap(device, dtype)
    vgct.assert_feature_active(calls=sdpa_calls, min_calls=clip_config().num_hidden_layers)
    vgct.assert_t1(actual.last_hidden_state, expected.last_hidden_state, dim=1,
                   feature="attention implementation swap (sdpa vs eager): last_hidden_state")
    vgct.assert_t1(actual.pooler_output, expected.pooler_output, dim=0,
                   feature="attention implementation swap (sdpa vs eager): pooler_output")


@pytest.mark.component("text_encoder.clip")
@pytest.mark.feature("attention implementation swap (sdpa vs eager)")
def test_planted_fault_skipped_final_layer_norm_is_caught(vgct):
    """Planted fault: the feature-on encoder skips its final LayerNorm. The T1 gate must fail, naming the
    component and the moved statistics."""
    actual, expected, _ = run_swap("cpu", torch.float32, fault="skip_final_norm")
    with pytest.raises(GateFailure) as e:
        vgct.assert_t1(actual.last_hidden_state, expected.last_hidden_state, dim=1,
                       feature="attention implementation swap (sdpa vs eager): last_hidden_state")
    C.assert_fault_caught(e, "text_encoder.clip", statistics=("rel_l2", "cosine", "mismatches"))
