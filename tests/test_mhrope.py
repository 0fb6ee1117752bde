"""MHRoPE (encodings/rope/mhrope.py) against a float64 re-implementation of its reference
(JJJYmmm/Multimodal-RoPEs ``freq_allocation/mhrope.py`` @8cd6d41, ``apply_transformation``, and
``test.py``'s ``apply_multihead_rotary_pos_emb`` @64f8a14), RoPE on text, relative per axis."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc.encodings import MHRoPE
from posenc.errors import InvalidArgument


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def reference(q, k, position_ids, section, kv_heads, base=10000.0):
    dim = q.shape[-1]
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    freqs = position_ids[..., None].double() * inv_freq  # (3, B, T, D/2)
    batch, length, half = freqs.shape[1:]
    freqs = torch.cat([freqs[m, :, None, :, :].repeat(1, num, 1, 1) for m, num in enumerate(section)], dim=1)
    if sum(section) < kv_heads:  # the unused heads' angles padded with zeros
        freqs = torch.cat([freqs, torch.zeros(batch, kv_heads - sum(section), length, half, dtype=freqs.dtype)], dim=1)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    repeat = q.shape[1] // cos.shape[1]
    q_embed = q * cos.repeat_interleave(repeat, dim=1) + rotate_half(q) * sin.repeat_interleave(repeat, dim=1)
    return q_embed, k * cos + rotate_half(k) * sin


def inputs(heads, kv_heads, length=11, dim=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, heads, length, dim, generator=g, dtype=torch.float64),
            torch.randn(2, kv_heads, length, dim, generator=g, dtype=torch.float64))


@pytest.mark.parametrize("section,kv_heads,heads", [([2, 3, 3], 8, 16), ([1, 1, 1], 4, 4), ([0, 2, 1], 3, 6)])
def test_equals_the_reference(section, kv_heads, heads):
    q, k = inputs(heads, kv_heads, length=17)
    positions = posenc.mrope_position_ids([2, (2, 4, 6), 3])  # (3, 17)
    positions = torch.stack([positions, positions.flip(-1)], dim=1)  # (3, 2, T): rows differ
    enc = MHRoPE(16, kv_heads, mrope_section=section)
    got_q, got_k = enc.rotate(q, k, positions, positions)
    want_q, want_k = reference(q, k, positions, section, kv_heads)
    torch.testing.assert_close(got_q, want_q, rtol=0, atol=1e-12)
    torch.testing.assert_close(got_k, want_k, rtol=0, atol=1e-12)
    # query heads grouped the other way round (h % H_kv) would be another rotation
    if heads > kv_heads:
        order = torch.arange(heads).view(kv_heads, -1).T.reshape(-1)
        wrong, _ = enc.rotate(q[:, order], k, positions, positions)
        assert (wrong[:, order.argsort()] - want_q).abs().max() > 1e-2


def test_on_text_rotated_heads_are_rope_the_rest_untouched():
    q, k = inputs(4, 4, seed=1)
    enc = MHRoPE(16, 4, mrope_section=[1, 1, 1])
    text = torch.arange(11)
    got_q, _ = enc.rotate(q, k, text, text)
    rope_q, _ = posenc.create("rope", head_dim=16).rotate(q, k, text, text)
    torch.testing.assert_close(got_q[:, :3], rope_q[:, :3], rtol=0, atol=1e-12)
    torch.testing.assert_close(got_q[:, 3], q[:, 3], rtol=0, atol=0)


def test_scores_are_relative_per_axis():
    q, k = inputs(8, 8, seed=2)
    enc = MHRoPE(16, 8)
    positions = posenc.mrope_position_ids([2, (1, 6, 6), 0]).unsqueeze(1)
    shift = torch.tensor([5, 9, 2]).view(3, 1, 1)

    def scores(p):
        a, b = enc.rotate(q, k, p, p)
        return a @ b.transpose(-1, -2)

    torch.testing.assert_close(scores(positions + shift), scores(positions), rtol=0, atol=1e-10)


def test_bad_inputs():
    with pytest.raises(InvalidArgument, match="summing to at most num_key_value_heads=4"):
        MHRoPE(16, 4, mrope_section=[2, 2, 2])
    enc = MHRoPE(16, 4)
    with pytest.raises(InvalidArgument, match="k must have that many heads and q a multiple, got 2 and 4"):
        enc.rotate(torch.randn(1, 4, 3, 16), torch.randn(1, 2, 3, 16), torch.arange(3), torch.arange(3))
    with pytest.raises(InvalidArgument, match="one table per key/value head"):
        enc.cos_sin(torch.arange(3))
