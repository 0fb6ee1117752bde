"""Shaw's content terms for 1-D positions as one batched matmul per query row (the (Tq, Tk, D)
table of each pair's relative vector): against eqs. 3-5 of Shaw et al. (2018) written out in
float64, and their gradients (q, the probabilities, both relative tables) by gradcheck."""

from __future__ import annotations

import pytest
import torch

import posenc


def make(k: int = 3, head_dim: int = 4):
    torch.manual_seed(0)
    return posenc.create("shaw", head_dim=head_dim, max_relative_position=k)


def reference_scores(enc, q, q_positions, k_positions):
    """q_i . w^K_clip(j - i, k) in float64, with explicit loops over i and j."""
    k = enc.max_relative_position
    table = enc.relative_key.detach().double()
    out = torch.zeros(*q.shape[:2], q_positions.numel(), k_positions.numel(), dtype=torch.float64)
    for i, qi in enumerate(q_positions.tolist()):
        for j, kj in enumerate(k_positions.tolist()):
            out[:, :, i, j] = q.double()[:, :, i] @ table[max(-k, min(k, kj - qi)) + k]
    return out


def reference_values(enc, probs, q_positions, k_positions):
    """sum_j alpha_ij w^V_clip(j - i, k) in float64, with explicit loops."""
    k = enc.max_relative_position
    table = enc.relative_value.detach().double()
    out = torch.zeros(*probs.shape[:3], table.shape[1], dtype=torch.float64)
    for i, qi in enumerate(q_positions.tolist()):
        for j, kj in enumerate(k_positions.tolist()):
            out[:, :, i] += probs.double()[:, :, i, j, None] * table[max(-k, min(k, kj - qi)) + k]
    return out


@pytest.mark.parametrize("q_positions, k_positions", [
    (torch.arange(10), torch.arange(10)),
    (torch.arange(7, 10), torch.arange(10)),  # a cache before the queries
    (torch.tensor([4, 0, 9]), torch.arange(0, 20, 2)),  # any 1-D positions
])
def test_scores_and_values_match_the_float64_formula(q_positions, k_positions):
    enc = make()
    g = torch.Generator().manual_seed(1)
    q = torch.randn(3, 2, q_positions.numel(), 4, generator=g)
    probs = torch.softmax(torch.randn(3, 2, q_positions.numel(), k_positions.numel(), generator=g), dim=-1)
    with torch.no_grad():
        scores = enc.content_scores(q, q, q_positions, k_positions)
        values = enc.content_values(probs, q_positions, k_positions)
    assert scores.is_contiguous() and values.is_contiguous()
    torch.testing.assert_close(scores.double(), reference_scores(enc, q, q_positions, k_positions), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(values.double(), reference_values(enc, probs, q_positions, k_positions),
                               atol=1e-5, rtol=1e-5)


def test_gradients_by_gradcheck():
    """Analytical against numerical gradients in float64: q, the probabilities, and both
    relative tables (swapped in as plain tensors for the check)."""
    enc = make(k=2).double()
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 2, 5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    probs = torch.rand(2, 2, 5, 7, generator=g, dtype=torch.float64, requires_grad=True)
    qp, kp = torch.arange(2, 7), torch.arange(7)
    assert torch.autograd.gradcheck(lambda q: enc.content_scores(q, q, qp, kp), (q,))
    assert torch.autograd.gradcheck(lambda p: enc.content_values(p, qp, kp), (probs,))
    key = enc.relative_key.detach().clone().requires_grad_()
    value = enc.relative_value.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(
        lambda t: _with_table(enc, "relative_key", t, lambda: enc.content_scores(q.detach(), q.detach(), qp, kp)),
        (key,))
    assert torch.autograd.gradcheck(
        lambda t: _with_table(enc, "relative_value", t, lambda: enc.content_values(probs.detach(), qp, kp)),
        (value,))


def _with_table(enc, name, table, call):
    """call() with the parameter ``name`` replaced by the tensor ``table``."""
    saved = getattr(enc, name)
    delattr(enc, name)
    setattr(enc, name, table)
    try:
        return call()
    finally:
        delattr(enc, name)
        setattr(enc, name, saved)
