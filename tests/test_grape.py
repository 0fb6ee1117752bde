"""Commuting multiplicative GRAPE (encodings/rope/grape.py) against a float64 re-implementation of
the official code (model-architectures/GRAPE ``model/llama-mha-grape-m-nonctx.py`` @135ee30:
``MSGRAPECommuting.get_cos_sin`` and ``apply_rotary_emb``), RoPE mirrored at its start, relative,
and its spectrum trained."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc.encodings import GRAPE
from posenc.errors import InvalidArgument


def reference(x, log_freq, positions):
    """x (B, H, T, D), log_freq (H or 1, D/2): the official forward in float64 (its (B, T, H, D)
    layout transposed)."""
    angles = positions.double()[:, None, None] * log_freq.double().exp()[None]  # (T, H, D/2)
    cos, sin = angles.cos().unsqueeze(0), angles.sin().unsqueeze(0)  # (1, T, H, D/2)
    x = x.transpose(1, 2)  # (B, T, H, D)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    y = torch.cat([x1 * cos + x2 * sin, -x1 * sin + x2 * cos], dim=-1)
    return y.transpose(1, 2)


@pytest.mark.parametrize("kv_heads", [1, 4])
def test_equals_the_official_forward_with_trained_frequencies(kv_heads):
    enc = GRAPE(16, kv_heads).double()
    with torch.no_grad():
        enc.log_freq.add_(torch.randn_like(enc.log_freq) * 0.3)  # a trained spectrum, per head or shared
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 9, 16, generator=g, dtype=torch.float64)
    positions = torch.arange(9) + 500
    got, _ = enc.rotate(q, q, positions, positions)
    spectrum = enc.log_freq.detach().expand(4, -1) if kv_heads == 1 else enc.log_freq.detach()
    torch.testing.assert_close(got, reference(q, spectrum, positions), rtol=0, atol=1e-12)


def test_at_its_start_it_is_rope_at_mirrored_positions():
    """Turned by -t omega: its scores at (i, j) are RoPE's at (c - i, c - j)."""
    enc = GRAPE(16).double()
    rope = posenc.create("rope", head_dim=16).double()
    g = torch.Generator().manual_seed(1)
    q, k = (torch.randn(1, 2, 7, 16, generator=g, dtype=torch.float64) for _ in range(2))
    qp, kp = torch.arange(7) + 3, torch.arange(7) * 2
    a, b = enc.rotate(q, k, qp, kp)
    c, d = rope.rotate(q, k, 100 - qp, 100 - kp)
    # GRAPE's spectrum starts in float32 (the reference's), RoPE's is float64: 2^-24 relative,
    # up to 6e-6 rad at these positions, on scores of |q| |k| ~ 16
    torch.testing.assert_close(a @ b.transpose(-1, -2), c @ d.transpose(-1, -2), rtol=0, atol=1e-4)
    same_q, same_k = rope.rotate(q, k, qp, kp)
    assert ((a @ b.transpose(-1, -2)) - same_q @ same_k.transpose(-1, -2)).abs().max() > 1e-2


def test_relative_and_its_spectrum_trains():
    enc = GRAPE(8, 2).double()
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 4, 6, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 6, 8, generator=g, dtype=torch.float64, requires_grad=True)
    positions = torch.arange(6)

    def scores(shift):
        a, b = enc.rotate(q, k, positions + shift, positions + shift)
        return a @ b.repeat_interleave(2, 1).transpose(-1, -2)

    torch.testing.assert_close(scores(1000), scores(0), rtol=0, atol=1e-9)
    scores(0).square().sum().backward()
    assert enc.log_freq.grad is not None and enc.log_freq.grad.abs().max() > 0
    assert torch.autograd.gradcheck(lambda q, k: enc.rotate(q, k, positions, positions)[0].sum(-1)
                                    + enc.rotate(q, k, positions, positions)[1].sum(), (q, k))


def test_bad_inputs_and_frozen():
    assert not list(GRAPE(8, learnable=False).parameters())
    with pytest.raises(InvalidArgument, match="3 heads is not a multiple of grape's 2 spectra"):
        GRAPE(8, 2).rotate(torch.randn(1, 3, 2, 8), torch.randn(1, 2, 2, 8), torch.arange(2), torch.arange(2))
    with pytest.raises(InvalidArgument, match="head_dim must be"):
        GRAPE(7)
