"""Transformer-XL's content scores under a causal mask: the relative table stops at the
distances visible keys use (Tk + 1 columns), so the masked entries are not computed as the
unmasked call computes them; the visible ones must still be the paper's formula, written
out here in float64 (Dai et al. 2019, section 3.3: (q_i + v).W R_{i-j} + u.k_j)."""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc.attention.masks import causal_mask


def reference_bcd(enc, q, k, q_positions, k_positions):
    """(b) + (c) + (d) in float64: R_d = [sin(d w) || cos(d w)], w_m = 10000^(-2m / d_model)."""
    d_model, heads, dim = enc.d_model, enc.num_heads, enc.head_dim
    freqs = torch.tensor([1.0 / enc.base ** (2 * m / d_model) for m in range(d_model // 2)], dtype=torch.float64)
    distance = (q_positions.unsqueeze(-1) - k_positions.unsqueeze(-2)).double()  # (Tq, Tk)
    angles = distance.unsqueeze(-1) * freqs
    table = torch.cat((angles.sin(), angles.cos()), dim=-1)  # (Tq, Tk, d_model)
    projected = (table @ enc.r_net.weight.detach().double().t()).view(*distance.shape, heads, dim)
    u, v = enc.r_w_bias.detach().double(), enc.r_r_bias.detach().double()
    qv = q.double() + v[:, None, :]  # (B, H, Tq, D)
    bd = torch.einsum("bhid,ijhd->bhij", qv, projected)
    uk = torch.einsum("bhjd,hd->bhj", k.double(), u).unsqueeze(-2)
    return bd + uk


@pytest.mark.parametrize("num_queries, num_keys, start", [(9, 9, 0), (4, 11, 30), (1, 6, 5)])
def test_causal_content_scores_match_the_formula_on_visible_keys(num_queries, num_keys, start):
    torch.manual_seed(0)
    enc = posenc.create("transformer_xl", d_model=16, num_heads=2, head_dim=4, init_std=0.5)
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 2, num_queries, 4, generator=g), torch.randn(2, 2, num_keys, 4, generator=g)
    k_positions = torch.arange(start, start + num_keys)
    q_positions = k_positions[num_keys - num_queries:]
    mask = causal_mask(num_queries, num_keys, q.device)
    with torch.no_grad():
        got = enc.content_scores(q, k, q_positions, k_positions, mask=mask)
        full = enc.content_scores(q, k, q_positions, k_positions)
    want = reference_bcd(enc, q, k, q_positions, k_positions)
    assert got.shape == want.shape
    torch.testing.assert_close((got.double() * mask), want * mask, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(full.double(), want, atol=1e-5, rtol=1e-5)  # no mask: every entry


def test_a_mask_showing_a_far_future_key_gets_every_entry():
    torch.manual_seed(0)
    enc = posenc.create("transformer_xl", d_model=16, num_heads=2, head_dim=4, init_std=0.5)
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(1, 2, 7, 4, generator=g), torch.randn(1, 2, 7, 4, generator=g)
    positions = torch.arange(7)
    mask = causal_mask(7, 7, q.device).clone()
    mask[0, 6] = True  # query 0 sees key 6: past the narrowed table
    with torch.no_grad():
        got = enc.content_scores(q, k, positions, positions, mask=mask)
    torch.testing.assert_close(got.double(), reference_bcd(enc, q, k, positions, positions), atol=1e-5, rtol=1e-5)


def test_causal_attention_and_gradients_match_the_unmasked_width():
    """The narrowed table changes which values sit under the mask, never the output or the
    gradients in q, k and v, against float64 attention."""
    torch.manual_seed(0)
    enc = posenc.create("transformer_xl", d_model=16, num_heads=2, head_dim=4, init_std=0.5).double()
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, 12, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out = posenc.attention(q, k, v, enc, causal=True, backend="eager")
    positions = torch.arange(12)
    logits = (q @ k.transpose(-2, -1) + reference_bcd(enc, q, k, positions, positions)) / math.sqrt(4)
    logits = logits.masked_fill(~causal_mask(12, 12, q.device), float("-inf"))
    want = torch.softmax(logits, dim=-1) @ v
    torch.testing.assert_close(out, want, atol=1e-10, rtol=1e-10)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    want_grads = torch.autograd.grad(want.sum(), (q, k, v))
    for got, expected in zip(grads, want_grads):
        torch.testing.assert_close(got, expected, atol=1e-10, rtol=1e-10)
