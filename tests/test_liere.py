"""LieRE and ComRoPE (encodings/rope/liere.py, comrope.py) against float64 re-implementations of
their reference code, and the properties their papers claim: relative in one axis (both), in
every axis with commuting generators (ComRoPE; LieRE's 2-D is not), b = 2 as RoPE with learned
frequencies, rotations that keep norms, gradients through the generators.

References: StanfordMIMI/LieRE ``models/rope_vit.py`` @657fc51 (``LierePositionEncoder.forward``
with ``phase_type="learned"``, ``FlexibleAttention.apply_transforms``); Longin-Yu/ComRoPE
``model.py`` @d6e0fbe (``ComRoPELDAttention``, ``ComRoPEAPAttention``,
``RoPESelfAttentionBase.get_rotation_matrix`` and ``forward``).
"""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc.encodings import ComRoPE, LieRE
from posenc.errors import InvalidArgument

B, H, T = 2, 4, 9


def taylor_matrix_exp(a: torch.Tensor, order: int = 30) -> torch.Tensor:
    """exp(a) by scaling and squaring a Taylor series (ComRoPE's ``naive_matrix_exp`` with the
    scaling that keeps it accurate for large norms): independent of torch.linalg.matrix_exp."""
    norm = float(a.abs().sum(-1).amax()) if a.numel() else 0.0
    squarings = max(0, math.ceil(math.log2(max(norm, 1e-300))) + 1)
    scaled = a / 2**squarings
    term = torch.eye(a.shape[-1], dtype=a.dtype).expand_as(a).clone()
    total = term.clone()
    for k in range(1, order + 1):
        term = term @ scaled / k
        total = total + term
    for _ in range(squarings):
        total = total @ total
    return total


def liere_reference(raw: torch.Tensor, coords: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The reference's LieRE, float64: raw (A, 1, G, g, g) with G = heads * N generators laid out
    head-major (its ``rotary_embedding_per_head``), coords (1, T, A), x (B, heads, T, D)."""
    upper = torch.triu(raw, diagonal=1) - 0.5  # the reference's "sigmoid maps 0 to 0.5" shift
    bases = upper - upper.transpose(-1, -2)
    in_basis = coords.reshape(list(coords.shape) + [1] * 4) * bases
    generator_pos = in_basis.sum(dim=-5)  # (1, T, 1, G, g, g)
    transforms = torch.matrix_exp(generator_pos)
    batch, heads, tokens, _ = x.shape
    g = transforms.shape[-1]
    rotators = transforms.shape[-3] // heads
    rot_dim = g * rotators
    states = x[..., :rot_dim].reshape(batch, heads, tokens, rotators, g, 1)
    transforms = transforms.squeeze(2).view(1, tokens, heads, rotators, g, g).transpose(1, 2)
    turned = torch.matmul(transforms, states)
    return torch.cat([turned.flatten(start_dim=-3), x[..., rot_dim:]], dim=-1)


def comrope_reference(exponent: torch.Tensor, coords: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The reference's rotation and its use, float64: exponent (heads, A, N, b, b) as its
    ``get_exponent_matrix``, coords (1, T, A), x (B, heads, T, D) (every dimension rotated): the
    block-diagonal D x D matrix R = exp(sum_a p_a A_a) applied as ``torch.matmul(R, Q)``."""
    b = exponent.shape[-1]
    blocks = exponent.shape[2]
    dim = b * blocks
    eye = torch.eye(b, dtype=exponent.dtype)
    positions = (coords.unsqueeze(-1).unsqueeze(-1).unsqueeze(-1) * eye).unsqueeze(2)
    ln_r = torch.matmul(exponent, positions).sum(dim=3)  # (1, T, heads, N, b, b)
    r = taylor_matrix_exp(ln_r)
    selector = torch.kron(torch.eye(blocks, dtype=torch.bool), torch.ones(b, b, dtype=torch.bool))
    full = torch.zeros(*r.shape[:3], dim, dim, dtype=r.dtype)
    full[:, :, :, selector] = r.reshape(*r.shape[:3], -1)
    full = full.transpose(1, 2)  # (1, heads, T, D, D)
    return torch.matmul(full, x.unsqueeze(-1)).squeeze(-1)


def qk(dim: int, heads: int = H, kv_heads: int | None = None, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, heads, T, dim, generator=g, dtype=torch.float64)
    k = torch.randn(B, kv_heads or heads, T, dim, generator=g, dtype=torch.float64)
    return q, k


# -- against the references ----------------------------------------------------------------

@pytest.mark.parametrize("head_dim,block_size,axes", [(16, 4, 1), (16, 16, 1), (14, 4, 1), (12, 3, 2)])
def test_liere_equals_the_reference_forward(head_dim, block_size, axes):
    enc = LieRE(head_dim, H, block_size=block_size, num_axes=axes, position_scale=0.37).double()
    q, _ = qk(head_dim)
    coords = torch.stack([torch.arange(T) * (a + 1) % 7 for a in range(axes)])  # (A, T)
    positions = coords.unsqueeze(1) if axes > 1 else coords[0]  # (A, 1, T) or (T,)
    got, _ = enc.rotate(q, q, positions, positions)
    raw = enc.generator_params.detach().reshape(axes, 1, H * enc.num_blocks, block_size, block_size)
    want = liere_reference(raw, coords.T.unsqueeze(0).double() * 0.37, q)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    # a rotation the wrong way round (A_a transposed) is caught by that tolerance
    flipped = liere_reference(raw.transpose(-1, -2), coords.T.unsqueeze(0).double() * 0.37, q)
    assert (flipped - want).abs().max() > 1e-3


@pytest.mark.parametrize("variant", ["ld", "ap"])
@pytest.mark.parametrize("axes", [1, 2, 3])
def test_comrope_equals_the_reference_forward(variant, axes):
    head_dim, block = 12, 2 if axes == 3 else 4
    enc = ComRoPE(head_dim, H, block_size=block, num_axes=axes, variant=variant, position_scale=0.25).double()
    params = enc.angle_params.detach()  # (H, N, b, b): the reference's freqs (H, 1, N, b, b)
    skew = (params - params.transpose(-1, -2)).unsqueeze(1)
    if variant == "ld":
        exponent = skew * enc.axis_scales.detach()[None, :, :, None, None]
    else:
        mask = torch.zeros(axes, enc.num_blocks, dtype=torch.float64)
        for i in range(axes):
            mask[i, i::axes] = 1.0
        exponent = skew.expand(-1, axes, -1, -1, -1) * mask[None, :, :, None, None]
    q, _ = qk(head_dim, seed=1)
    coords = torch.stack([(torch.arange(T) * (a + 2)) % 5 for a in range(axes)])
    positions = coords.unsqueeze(1) if axes > 1 else coords[0]
    got, _ = enc.rotate(q, q, positions, positions)
    want = comrope_reference(exponent, coords.T.unsqueeze(0).double() * 0.25, q)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_grouped_query_heads_read_generator_head_h_over_group():
    enc = LieRE(8, 2, block_size=4).double()
    q, _ = qk(8, heads=4)
    positions = torch.arange(T)
    got, _ = enc.rotate(q, q[:, :2], positions, positions)
    raw = enc.generator_params.detach().repeat_interleave(2, dim=1).reshape(1, 1, 4 * 2, 4, 4)
    torch.testing.assert_close(got, liere_reference(raw, positions.double().reshape(1, T, 1), q), rtol=0, atol=1e-12)


def test_block_size_two_is_rope_with_learned_frequencies():
    """A block [[0, a], [-a, 0]] (the upper entry is P's) turns the pair (x0, x1) by -a p."""
    enc = LieRE(6, 1, block_size=2).double()
    a = enc.generator_params.detach()[0, 0, :, 0, 1]  # (3,)
    q, _ = qk(6, heads=1)
    positions = torch.arange(T)
    got, _ = enc.rotate(q, q, positions, positions)
    angle = -positions.double()[:, None] * a  # (T, 3)
    x0, x1 = q[..., 0::2], q[..., 1::2]
    want = torch.stack((x0 * angle.cos() - x1 * angle.sin(), x0 * angle.sin() + x1 * angle.cos()), dim=-1).flatten(-2)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


# -- properties ------------------------------------------------------------------------------

def scores(enc, q, k, qp, kp):
    q2, k2 = enc.rotate(q, k, qp, kp)
    return q2 @ k2.transpose(-1, -2)


@pytest.mark.parametrize("make", [
    lambda: LieRE(16, H, block_size=8), lambda: LieRE(16, H), lambda: ComRoPE(16, H),
    lambda: ComRoPE(16, H, variant="ap")], ids=["liere-8", "liere-dense", "comrope-ld", "comrope-ap"])
def test_one_axis_scores_depend_on_the_offset_only(make):
    enc = make().double()
    q, k = qk(16)
    qp, kp = torch.arange(T), torch.arange(T)
    base = scores(enc, q, k, qp, kp)
    torch.testing.assert_close(scores(enc, q, k, qp + 1000, kp + 1000), base, rtol=0, atol=1e-9)
    # not a constant: another offset between queries and keys changes them
    assert (scores(enc, q, k, qp + 3, kp) - base).abs().max() > 1e-2


@pytest.mark.parametrize("variant", ["ld", "ap"])
def test_two_axes_comrope_is_relative_and_liere_is_not(variant):
    shift = torch.tensor([5, -2]).reshape(2, 1, 1) + 7
    coords = torch.stack([torch.arange(T) % 3, torch.arange(T) // 3]).unsqueeze(1)  # (2, 1, T)
    q, k = qk(8)
    com = ComRoPE(8, H, block_size=4, num_axes=2, variant=variant, position_scale=0.3).double()
    torch.testing.assert_close(scores(com, q, k, coords + shift, coords + shift), scores(com, q, k, coords, coords),
                               rtol=0, atol=1e-9)
    lie = LieRE(8, H, block_size=4, num_axes=2, position_scale=0.3).double()
    moved = scores(lie, q, k, coords + shift, coords + shift) - scores(lie, q, k, coords, coords)
    assert moved.abs().max() > 1e-3  # non-commuting generators: absolute position leaks


def test_rotations_are_orthogonal_and_keep_norms():
    enc = LieRE(10, 2, block_size=4).double()  # 2 dims pass through
    rotations = enc.rotations(torch.arange(50))
    eye = torch.eye(4, dtype=torch.float64)
    torch.testing.assert_close(rotations.transpose(-1, -2) @ rotations, eye.expand_as(rotations), rtol=0, atol=1e-12)
    q, _ = qk(10, heads=2)
    got, _ = enc.rotate(q, q, torch.arange(T), torch.arange(T))
    torch.testing.assert_close(got.norm(dim=-1), q.norm(dim=-1), rtol=0, atol=1e-12)
    torch.testing.assert_close(got[..., 8:], q[..., 8:], rtol=0, atol=0)


@pytest.mark.parametrize("make", [lambda: LieRE(4, 1, block_size=2), lambda: ComRoPE(4, 1, block_size=2, num_axes=2)])
def test_gradients_through_the_generators_match_finite_differences(make):
    enc = make().double()
    q, k = (torch.randn(1, 1, 3, 4, dtype=torch.float64, requires_grad=True) for _ in range(2))
    params = tuple(enc.parameters())
    assert params and all(p.requires_grad for p in params)

    def g(q, k):
        return scores(enc, q, k, torch.arange(3), torch.arange(3))

    assert torch.autograd.gradcheck(g, (q, k))
    # the generators' gradient against central differences (gradcheck takes inputs, not parameters)
    loss = g(q, k).square().sum()
    grads = torch.autograd.grad(loss, params)
    eps = 1e-6
    for param, grad in zip(params, grads):
        for index in range(0, param.numel(), max(1, param.numel() // 5)):
            with torch.no_grad():
                saved = param.detach().clone()
                param.view(-1)[index] += eps
                up = g(q, k).square().sum()
                param.view(-1)[index] -= 2 * eps
                down = g(q, k).square().sum()
                param.copy_(saved)
            numeric, analytic = float((up - down) / (2 * eps)), float(grad.view(-1)[index])
            assert abs(numeric - analytic) < 1e-5 * (1 + abs(analytic)), (index, numeric, analytic)


def test_frozen_generators_are_buffers_and_options_for_train_len():
    enc = LieRE(8, learnable=False)
    assert not list(enc.parameters()) and "generator_params" in dict(enc.named_buffers())
    assert LieRE.options_for_train_len(64) == {"position_scale": 1 / 64}
    assert ComRoPE.options_for_train_len(64) == {"position_scale": 1 / 64}
    built = posenc.create_for_model("comrope", d_model=32, num_heads=4, head_dim=8, max_positions=64)
    assert built.block_size == 8 and built.variant == "ld"
    assert posenc.create("comrope", head_dim=4).block_size == 4


def test_axis_first_positions_through_attention_and_their_errors():
    enc = ComRoPE(8, 1, num_axes=2).double()
    q, k = qk(8, heads=1)
    coords = torch.stack([torch.arange(T) % 3, torch.arange(T) // 3]).unsqueeze(1)
    out = posenc.attention(q, k, k, enc, q_positions=coords, k_positions=coords, causal=False)
    assert out.shape == q.shape
    with pytest.raises(InvalidArgument, match=r"q_positions must have shape \(9,\) or \(2, 9\).*\(2, 2, 9\)"):
        posenc.attention(q, k, k, enc, q_positions=coords[:1], k_positions=coords, causal=False)
    with pytest.raises(InvalidArgument, match="3 heads is not a multiple of liere's 2 generator heads"):
        LieRE(8, 2).rotate(torch.randn(1, 3, 2, 8), torch.randn(1, 2, 2, 8), torch.arange(2), torch.arange(2))
    with pytest.raises(InvalidArgument, match="last dimension 6 != head_dim 8"):
        LieRE(8).rotate(torch.randn(1, 1, 2, 6), torch.randn(1, 1, 2, 6), torch.arange(2), torch.arange(2))
