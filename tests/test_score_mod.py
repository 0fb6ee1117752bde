"""encoding.score_mod() in a user's own flex_attention call equals posenc's eager attention."""

from __future__ import annotations

import warnings

import pytest
import torch

import posenc

flex = pytest.importorskip("torch.nn.attention.flex_attention")
H, D = 4, 8
BIAS_ENCODINGS = [name for name, cls in posenc.REGISTRY.items() if "score_bias" in cls.hooks]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """flex_attention traces through dynamo even uncompiled; with the caches of earlier tests,
    torch 2.13 raises KeyError('init_L') while explaining a recompilation. Start clean."""
    torch._dynamo.reset()


@pytest.mark.parametrize("name", BIAS_ENCODINGS)
@pytest.mark.parametrize("with_positions", [False, True])
def test_user_flex_attention_with_score_mod(name, with_positions):
    torch.manual_seed(0)
    enc = posenc.create_for_model(name, d_model=H * D, num_heads=H, head_dim=D, max_positions=512, causal=True)
    with torch.no_grad():
        for p in enc.parameters():
            p.normal_()
    q, k, v = (torch.randn(2, H, 12, D) for _ in range(3))
    positions = torch.tensor([[0] * 12, [30] * 12]) + torch.arange(12) if with_positions else None

    def causal(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx

    block_mask = flex.create_block_mask(causal, None, None, 12, 12, device="cpu")
    score_mod = enc.score_mod(positions, positions) if with_positions else enc.score_mod()
    with warnings.catch_warnings():  # uncompiled flex_attention warns that it is slow
        warnings.simplefilter("ignore", UserWarning)
        out = flex.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask)
    expected = posenc.attention(q, k, v, enc, q_positions=positions, k_positions=positions, backend="eager")
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
