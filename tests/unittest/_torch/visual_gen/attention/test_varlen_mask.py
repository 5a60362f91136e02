"""L1: diffusers' attention-mask handling for the variable-length (flash / sage varlen) backends.

``_normalize_attn_mask`` reduces a 1-D to 4-D boolean key mask to (batch, keys); ``_prepare_for_flash_attn_or_sage
_varlen`` turns it into per-sequence key lengths, cumulative offsets and the maximum length that the varlen kernels
index packed tokens with. A wrong offset silently attends across sequences, so both are checked against an index
oracle (explicit loops), exactly (integer bookkeeping).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("diffusers", reason="needs Hugging Face diffusers (pip install -e .[diffusers])")

# (not t1: exact index-oracle checks and a refusal, no gate bars; the component/feature markers keep them paired)
pytestmark = [pytest.mark.component("attention.varlen_mask"),
              pytest.mark.feature("key mask -> varlen seqlens / cu_seqlens vs index oracle")]

# per-sequence number of valid (leading) keys: a padded text batch as a DiT cross-attention would see it
KEEP = [16, 5, 0, 11]
S_Q, S_K = 24, 16


def key_mask():
    m = torch.zeros(len(KEEP), S_K, dtype=torch.bool)
    for b, n in enumerate(KEEP):
        m[b, :n] = True
    return m


def oracle(mask2d):
    seqlens_k = [int(sum(1 for j in range(S_K) if mask2d[b, j])) for b in range(len(KEEP))]
    cu_k = [0]
    for n in seqlens_k:
        cu_k.append(cu_k[-1] + n)
    cu_q = [b * S_Q for b in range(len(KEEP) + 1)]
    return [S_Q] * len(KEEP), seqlens_k, cu_q, cu_k, max(seqlens_k)


@pytest.mark.parametrize("shape", ["2d", "3d", "4d"])
def test_varlen_seqlens_match_index_oracle(shape):
    """L1. Boundary: _normalize_attn_mask(mask, batch, S_k) then _prepare_for_flash_attn_or_sage_varlen(batch,
    S_q, S_k, attn_mask) -> (seqlens_q, seqlens_k), (cu_seqlens_q, cu_seqlens_k), (max_q, max_k) for a batch of 4
    with 16 / 5 / 0 / 11 valid keys, the mask given as (B, S_k), (B, S_q, S_k) or (B, 1, S_q, S_k). Feature: the
    varlen backends' mask bookkeeping. Reference: index oracle. Exact equality."""
    from diffusers.models.attention_dispatch import _normalize_attn_mask, _prepare_for_flash_attn_or_sage_varlen

    m2 = key_mask()
    given = {"2d": m2, "3d": m2[:, None, :].expand(-1, S_Q, -1),
             "4d": m2[:, None, None, :].expand(-1, 1, S_Q, -1)}[shape]
    norm = _normalize_attn_mask(given, len(KEEP), S_K)
    assert norm.dtype == torch.bool and tuple(norm.shape) == (len(KEEP), S_K)
    assert torch.equal(norm, m2), f"normalized {shape} mask differs from the key mask"
    (sq, sk), (cq, ck), (mq, mk) = _prepare_for_flash_attn_or_sage_varlen(len(KEEP), S_Q, S_K, attn_mask=norm)
    e_sq, e_sk, e_cq, e_ck, e_mk = oracle(m2)
    got = {"seqlens_q": sq.tolist(), "seqlens_k": sk.tolist(), "cu_seqlens_q": cq.tolist(),
           "cu_seqlens_k": ck.tolist(), "max_seqlen_q": int(mq), "max_seqlen_k": int(mk)}
    want = {"seqlens_q": e_sq, "seqlens_k": e_sk, "cu_seqlens_q": e_cq, "cu_seqlens_k": e_ck, "max_seqlen_q": S_Q,
            "max_seqlen_k": e_mk}
    assert got == want, f"varlen bookkeeping differs from the oracle:\n got  {got}\n want {want}"


def test_varlen_without_mask_matches_index_oracle():
    """L1. Same bookkeeping without a mask: every sequence keeps all S_k keys."""
    from diffusers.models.attention_dispatch import _prepare_for_flash_attn_or_sage_varlen

    (sq, sk), (cq, ck), (mq, mk) = _prepare_for_flash_attn_or_sage_varlen(3, S_Q, S_K, attn_mask=None)
    assert sq.tolist() == [S_Q] * 3 and sk.tolist() == [S_K] * 3
    assert cq.tolist() == [0, S_Q, 2 * S_Q, 3 * S_Q] and ck.tolist() == [0, S_K, 2 * S_K, 3 * S_K]
    assert (int(mq), int(mk)) == (S_Q, S_K)


def test_non_bool_mask_is_rejected():
    """The varlen path refuses additive float masks rather than misreading them as key counts."""
    from diffusers.models.attention_dispatch import _normalize_attn_mask

    with pytest.raises(ValueError, match="bool"):
        _normalize_attn_mask(key_mask().float(), len(KEEP), S_K)
