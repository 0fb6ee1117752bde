"""FIRE's tile evaluation outside autograd (psi once per distance for consecutive positions,
the MLP as one product over [1, x, min(x, beta_k)...], written into the attention layer's
buffer) against the paper's formula and the network written out in float64 (numpy-free
torch.float64 arithmetic sharing no code with posenc's FIRE)."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc.attention import tiling
from posenc.encodings.fire import FIRE


def reference(enc: FIRE, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
    """b(h, i, j) = f(psi(i - j) / (psi(max(L, i)) + eps)), psi(x) = ln(|c x| + 1), in float64:
    (Tq,), (Tk,) -> (H, Tq, Tk); (B, Tq), (B, Tk) -> (B, H, Tq, Tk)."""
    c, big_l, eps = float(enc.c.detach()), abs(float(enc.L_multiplier.detach()) * float(enc.init_L)), enc.eps
    i = q_positions.double().unsqueeze(-1)
    j = k_positions.double().unsqueeze(-2)
    x = torch.log((c * (i - j)).abs() + 1) / (torch.log((c * i.clamp(min=big_l)).abs() + 1) + eps)
    w1, b1 = enc.mlp[0].weight.detach().double()[:, 0], enc.mlp[0].bias.detach().double()
    w2, b2 = enc.mlp[2].weight.detach().double(), enc.mlp[2].bias.detach().double()
    hidden = torch.relu(x.unsqueeze(-1) * w1 + b1)  # (..., Tq, Tk, width)
    return (hidden @ w2.t() + b2).movedim(-1, -3)


def many_bends(num_heads: int = 4, seed: int = 0, **kwargs) -> FIRE:
    """A FIRE whose hidden units bend all over [0, 1] (normal weights), so tiles cross many."""
    torch.manual_seed(seed)
    enc = posenc.create("fire", num_heads=num_heads, **kwargs)
    with torch.no_grad():
        for p in enc.mlp.parameters():
            p.normal_()
        enc.mlp[0].bias.uniform_(-1.0, 0.0)  # bends -b1 / w1 spread around [0, 1]
    return enc


def test_many_bends_fixture_crosses_bends_inside_the_tiles():
    enc = many_bends()
    bends, _, _ = enc.piecewise_linear_mlp()
    assert int(((bends > 0) & (bends < 1)).sum()) >= 8


@pytest.mark.parametrize(
    "q_positions, k_positions",
    [
        (torch.arange(0, 40), torch.arange(0, 40)),  # below L
        (torch.arange(590, 640), torch.arange(0, 640)),  # past L, a cache before the queries
        (torch.arange(2000, 2003), torch.arange(1990, 2005)),  # keys after the queries too
        (torch.arange(0, 50, 3), torch.arange(0, 50, 2)),  # gaps: no run, the elementwise path
        (torch.tensor([700, 5, 900]), torch.arange(0, 30)),  # unsorted queries
    ],
)
def test_tiles_match_the_float64_formula(q_positions, k_positions):
    enc = many_bends(init_L=64.0)
    with torch.no_grad():
        got = enc.score_bias(q_positions, k_positions)
    want = reference(enc, q_positions, k_positions)
    assert got.dtype == torch.float32 and got.shape == want.shape
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=2e-5)


def test_per_batch_positions_match_the_float64_formula():
    enc = many_bends(init_L=16.0)
    q_positions = torch.stack((torch.arange(10, 30), torch.arange(100, 120)))
    k_positions = torch.stack((torch.arange(0, 30), torch.arange(90, 120)))
    with torch.no_grad():
        got = enc.score_bias(q_positions, k_positions)
    torch.testing.assert_close(got.double(), reference(enc, q_positions, k_positions), atol=2e-5, rtol=2e-5)


def test_float64_encoding_is_float64_throughout():
    enc = many_bends(init_L=32.0).double()
    q_positions, k_positions = torch.arange(100, 140), torch.arange(0, 140)
    with torch.no_grad():
        got = enc.score_bias(q_positions, k_positions)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, reference(enc, q_positions, k_positions), atol=1e-12, rtol=1e-12)


def test_no_bend_in_range_and_every_bend_in_range():
    """No bend inside the tile's range of x: one line; bends at both ends of the range too."""
    enc = many_bends()
    q_positions, k_positions = torch.arange(600, 620), torch.arange(0, 620)
    with torch.no_grad():
        enc.mlp[0].weight.abs_()
        enc.mlp[0].bias.abs_().add_(0.01)  # every bend -b1 / w1 < 0 <= x: every unit always on
        got = enc.score_bias(q_positions, k_positions)
    torch.testing.assert_close(got.double(), reference(enc, q_positions, k_positions), atol=2e-5, rtol=2e-5)
    x = enc.normalized_distance(q_positions.unsqueeze(-1), k_positions).detach()
    with torch.no_grad():  # two units bending exactly at the smallest and the largest x
        enc.mlp[0].weight[:2, 0] = 1.0
        enc.mlp[0].bias[0], enc.mlp[0].bias[1] = -float(x.min()), -float(x.max())
        got = enc.score_bias(q_positions, k_positions)
    torch.testing.assert_close(got.double(), reference(enc, q_positions, k_positions), atol=2e-5, rtol=2e-5)


def test_bias_into_writes_what_bias_returns():
    enc = many_bends(init_L=64.0)
    q = torch.arange(500, 564).view(1, -1, 1)
    k = torch.arange(0, 564).view(1, 1, -1)
    head = torch.tensor([3, 0, 2]).view(-1, 1, 1)
    out = torch.full((3, 64, 564), float("nan"))
    with torch.no_grad():
        written = enc.bias_into(q, k, head, out)
        returned = enc.bias(q, k, head)
    assert written is out
    torch.testing.assert_close(out, returned, atol=0, rtol=0)
    torch.testing.assert_close(out.double(), reference(enc, q[0, :, 0], k[0, 0])[[3, 0, 2]], atol=2e-5, rtol=2e-5)
    # under autograd (a parameter requiring grad) it declines: the caller uses bias()
    assert enc.bias_into(q, k, head, out) is None


def test_pieces_follow_parameter_updates():
    """The piecewise form is cached per attention call's worth of tiles: an in-place update
    of the weights (an optimizer step) must be seen by the next tile."""
    enc = many_bends()
    qp, kp = torch.arange(600, 610), torch.arange(0, 610)
    with torch.no_grad():
        before = enc.score_bias(qp, kp)
        enc.mlp[2].weight.mul_(2.0)
        enc.mlp[2].bias.mul_(2.0)
        after = enc.score_bias(qp, kp)
    torch.testing.assert_close(after, 2 * before, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(after.double(), reference(enc, qp, kp), atol=4e-5, rtol=2e-5)


@pytest.mark.parametrize("length", [300, 777])
def test_blocked_attention_matches_the_float64_formula(length, monkeypatch):
    """The whole call, tiles in the blocked backend's buffer with the causal mask folded in
    (small tiles: many query blocks), against attention written out in float64 with the
    reference bias."""
    monkeypatch.setattr(tiling, "BLOCKED_TILE_ELEMENTS", 1 << 15)
    enc = many_bends(num_heads=2, init_L=100.0)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, length, 8, generator=g) for _ in range(3))
    with torch.no_grad():
        got = posenc.attention(q, k, v, enc, causal=True, backend="blocked")
    positions = torch.arange(length)
    logits = q.double() @ k.double().transpose(-2, -1) / 8 ** 0.5 + reference(enc, positions, positions)
    logits = logits.masked_fill(positions.unsqueeze(-1) < positions, float("-inf"))
    want = torch.softmax(logits, dim=-1) @ v.double()
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=2e-5)


def test_gradients_of_the_tile_by_gradcheck():
    """Under autograd the tile is the piecewise product with the network's gradients: against
    numerical ones in float64, in x (through c and L), every MLP weight, for a subset of heads
    and a tile crossing many bends (and a unit with a zero input weight)."""
    enc = many_bends(num_heads=3, init_L=8.0).double()
    with torch.no_grad():
        enc.mlp[0].weight[5, 0] = 0.0
    q = torch.arange(6, 14).view(1, -1, 1)
    k = torch.arange(0, 14).view(1, 1, -1)
    head = torch.tensor([2, 0]).view(-1, 1, 1)
    names = [name for name, _ in enc.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for p in enc.parameters())
    assert torch.autograd.gradcheck(lambda *p: _bias_with(enc, names, p, q, k, head), params)
    # and the values are the float64 formula
    with torch.enable_grad():
        got = enc.bias(q, k, head)
    assert got.requires_grad
    torch.testing.assert_close(got.detach(), reference(enc, q[0, :, 0], k[0, 0])[[2, 0]], atol=1e-10, rtol=1e-10)


def _bias_with(enc, names, params, q, k, head):
    """enc.bias with its parameters replaced by ``params`` (plain tensors)."""
    saved = dict(enc.named_parameters())
    try:
        for name, value in zip(names, params):
            owner = enc
            *path, leaf = name.split(".")
            for part in path:
                owner = getattr(owner, part)
            delattr(owner, leaf)
            setattr(owner, leaf, value)
        return enc.bias(q, k, head)
    finally:
        for name in names:
            owner = enc
            *path, leaf = name.split(".")
            for part in path:
                owner = getattr(owner, part)
            delattr(owner, leaf)
            setattr(owner, leaf, saved[name])
