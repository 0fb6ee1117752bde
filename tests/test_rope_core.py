"""RoPE core: apply_rotary against rotation matrices in float64, layouts, partial rotary,
and the defining property that q.k depends only on m - n."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc


def rotate_reference(x: torch.Tensor, position: int, base: float, interleaved: bool, rotary_dim: int) -> torch.Tensor:
    """RoFormer eq. 34 one pair at a time: (a, b) -> (a cos - b sin, a sin + b cos)."""
    out = x.clone().double()
    r = rotary_dim
    for i in range(r // 2):
        theta = position * base ** (-2 * i / r)
        a_idx, b_idx = (2 * i, 2 * i + 1) if interleaved else (i, i + r // 2)
        a, b = x[..., a_idx].double(), x[..., b_idx].double()
        out[..., a_idx] = a * math.cos(theta) - b * math.sin(theta)
        out[..., b_idx] = a * math.sin(theta) + b * math.cos(theta)
    return out


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("head_dim, rotary_dim", [(8, 8), (16, 16), (16, 8), (12, 4)])
def test_rotate_matches_rotation_matrices(interleaved, head_dim, rotary_dim):
    enc = posenc.create("rope", head_dim=head_dim, rotary_dim=rotary_dim, interleaved=interleaved)
    q = torch.randn(2, 3, 7, head_dim, dtype=torch.float64)
    k = torch.randn(2, 3, 7, head_dim, dtype=torch.float64)
    positions = torch.tensor([0, 1, 2, 5, 100, 4096, 70000])
    q_rot, k_rot = enc.rotate(q, k, positions, positions)
    for t, p in enumerate(positions.tolist()):
        torch.testing.assert_close(q_rot[:, :, t], rotate_reference(q[:, :, t], p, 10000.0, interleaved, rotary_dim), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(k_rot[:, :, t], rotate_reference(k[:, :, t], p, 10000.0, interleaved, rotary_dim), rtol=1e-6, atol=1e-6)


def test_apply_rotary_conformance_layouts():
    """apply_rotary with the documented full-width cos/sin layouts."""
    d = 6
    x = torch.randn(4, d, dtype=torch.float64)
    theta = torch.tensor([0.3, -1.2, 2.0], dtype=torch.float64)
    half = (torch.cat([theta.cos(), theta.cos()]), torch.cat([theta.sin(), theta.sin()]))
    inter = (theta.cos().repeat_interleave(2), theta.sin().repeat_interleave(2))
    out_half = posenc.apply_rotary(x, *half)
    out_inter = posenc.apply_rotary(x, *inter, interleaved=True)
    for i in range(3):
        c, s = math.cos(theta[i]), math.sin(theta[i])
        a, b = x[:, i], x[:, i + 3]
        torch.testing.assert_close(out_half[:, i], a * c - b * s)
        torch.testing.assert_close(out_half[:, i + 3], a * s + b * c)
        a, b = x[:, 2 * i], x[:, 2 * i + 1]
        torch.testing.assert_close(out_inter[:, 2 * i], a * c - b * s)
        torch.testing.assert_close(out_inter[:, 2 * i + 1], a * s + b * c)
    assert out_half.dtype == x.dtype
    bf = posenc.apply_rotary(x.bfloat16(), *half)
    assert bf.dtype == torch.bfloat16


def test_interleaved_equals_half_split_after_the_hf_permutation():
    """Converting layouts is a permutation of q/k dimensions (HF's permute trick)."""
    d = 8
    q, k = torch.randn(1, 2, 5, d, dtype=torch.float64), torch.randn(1, 2, 5, d, dtype=torch.float64)
    perm = torch.tensor([0, 2, 4, 6, 1, 3, 5, 7])  # interleaved pair (2i, 2i+1) -> (i, i + d/2)
    pos = torch.arange(5)
    qi, ki = posenc.create("rope", head_dim=d, interleaved=True).rotate(q, k, pos, pos)
    qh, kh = posenc.create("rope", head_dim=d).rotate(q[..., perm], k[..., perm], pos, pos)
    torch.testing.assert_close(qi[..., perm], qh)
    torch.testing.assert_close(qi @ ki.transpose(-1, -2), qh @ kh.transpose(-1, -2))


def test_golden_inv_freq():
    inv_freq, factor = posenc.rope_frequencies(128)
    torch.testing.assert_close(inv_freq[:3], torch.tensor([1.0, 0.86596, 0.74989]), rtol=0, atol=1e-5)
    assert inv_freq.shape == (64,) and inv_freq.dtype == torch.float32 and factor == 1.0
    torch.testing.assert_close(inv_freq[-1].double(), torch.tensor(10000 ** (-126 / 128), dtype=torch.float64))


@given(m=st.integers(0, 5000), n=st.integers(0, 5000), shift=st.integers(0, 100000), interleaved=st.booleans())
@settings(max_examples=50, deadline=None)
def test_rope_score_depends_only_on_relative_position(m, n, shift, interleaved):
    enc = posenc.create("rope", head_dim=16, interleaved=interleaved)
    g = torch.Generator().manual_seed(m * 7 + n)
    q, k = torch.randn(1, 1, 1, 16, generator=g, dtype=torch.float64), torch.randn(1, 1, 1, 16, generator=g, dtype=torch.float64)
    qa, ka = enc.rotate(q, k, torch.tensor([m]), torch.tensor([n]))
    qb, kb = enc.rotate(q, k, torch.tensor([m + shift]), torch.tensor([n + shift]))
    torch.testing.assert_close((qa * ka).sum(), (qb * kb).sum(), rtol=1e-9, atol=1e-9)


def test_partial_rotary_factor_semantics():
    enc = posenc.create("rope", head_dim=64, partial_rotary_factor=0.25)
    assert enc.rotary_dim == 16
    torch.testing.assert_close(enc.inv_freq, posenc.rope_frequencies(16)[0])
    q = torch.randn(1, 1, 3, 64)
    q_rot, _ = enc.rotate(q, q, torch.arange(3), torch.arange(3))
    torch.testing.assert_close(q_rot[..., 16:], q[..., 16:])  # the tail passes through


def test_positions_per_row():
    enc = posenc.create("rope", head_dim=8)
    q = torch.randn(2, 2, 3, 8)
    pos = torch.tensor([[0, 1, 2], [10, 11, 12]])
    q_rot, _ = enc.rotate(q, q, pos, pos)
    row1, _ = enc.rotate(q[1:], q[1:], pos[1], pos[1])
    torch.testing.assert_close(q_rot[1:], row1)


@pytest.mark.parametrize("kwargs, match", [
    (dict(head_dim=7), "head_dim must be a positive even integer"),
    (dict(head_dim=0), "head_dim"),
    (dict(head_dim=8, rotary_dim=3), "rotary_dim must be a positive even integer"),
    (dict(head_dim=8, rotary_dim=16), "rotary_dim must be <= head_dim"),
    (dict(head_dim=8, partial_rotary_factor=1.5), "partial_rotary_factor"),
    (dict(head_dim=8, base=1.0), "base"),
])
def test_rope_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        posenc.create("rope", **kwargs)


def test_apply_rotary_bad_arguments():
    with pytest.raises(ValueError, match="even"):
        posenc.apply_rotary(torch.randn(2, 5), torch.ones(5), torch.ones(5))
    with pytest.raises(ValueError, match="full width"):
        posenc.apply_rotary(torch.randn(2, 6), torch.ones(3), torch.ones(3))
