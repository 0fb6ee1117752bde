"""Contextual GRAPE Type I (posenc.encodings.grape_contextual): against a float64
re-implementation of its official code (model-architectures/GRAPE @73b2231,
``model/llama-mha-grape-m-ctx.py``: ``MSGRAPEContextType1``, ``_cumulative_phase``), its
special case (omega = 1: multiplicative GRAPE at the token positions), relativity in the
phase, the KV cache, gradients and bad inputs."""

import math

import pytest
import torch
import torch.nn.functional as F

import posenc
from posenc.errors import InvalidArgument

D = 8


def _inputs(batch=2, heads=4, length=11, d_model=32, seed=0, **options):
    gen = torch.Generator().manual_seed(seed)
    enc = posenc.ContextualGRAPE(d_model, heads, D, **options).double()
    with torch.no_grad():  # away from the start (omega ~ 1e-3 everywhere) so that the phase matters
        enc.omega_proj.weight.copy_(torch.randn(enc.omega_proj.weight.shape, generator=gen, dtype=torch.float64) * 0.5)
        enc.omega_proj.bias.copy_(torch.randn(enc.omega_proj.bias.shape, generator=gen, dtype=torch.float64))
        enc.log_freq.add_(torch.randn(enc.log_freq.shape, generator=gen, dtype=torch.float64) * 0.1)
    x = torch.randn(batch, length, d_model, generator=gen, dtype=torch.float64)
    q, k, v = (torch.randn(batch, heads, length, D, generator=gen, dtype=torch.float64) for _ in range(3))
    return enc, x, q, k, v


def _reference(enc, x, q, k, v):
    """The reference layer's positional part in float64 (its cos / sin not rounded to bfloat16),
    on q, k, v given per head: omega = softplus(omega_proj(x)), the exclusive cumsum, each plane
    turned by Phi_t theta_j in its direction, then causal SDPA."""
    omega = F.softplus(x @ enc.omega_proj.weight.T + enc.omega_proj.bias)  # (B, T, 1 or H)
    phi = torch.cumsum(omega, dim=1) - omega
    batch, length = x.shape[:2]
    heads = q.shape[1]
    freq = enc.log_freq.exp().expand(heads, D // 2)  # shared: (1, D/2) -> (H, D/2)
    if phi.size(-1) == 1:
        phi = phi.expand(batch, length, heads)
    angles = phi.unsqueeze(-1) * freq  # (B, T, H, D/2)
    cos, sin = angles.cos(), angles.sin()

    def turn(t):  # t (B, H, T, D) -> the reference's (B, T, H, D) layout and back
        t = t.transpose(1, 2)
        t1, t2 = t[..., : D // 2], t[..., D // 2:]
        return torch.cat([t1 * cos + t2 * sin, (-t1) * sin + t2 * cos], dim=-1).transpose(1, 2)

    return F.scaled_dot_product_attention(turn(q), turn(k), v, is_causal=True)


@pytest.mark.parametrize("options", [{}, {"per_head_phase": True}, {"share_across_heads": False},
                                     {"per_head_phase": True, "share_across_heads": False}])
def test_the_reference(options):
    enc, x, q, k, v = _inputs(**options)
    out = posenc.attention(q, k, v, enc, gates=enc.gate(x))
    assert (out - _reference(enc, x, q, k, v)).abs().max() < 1e-12


def test_the_phase_is_the_sum_before_and_starts_where_the_reference_does():
    enc = posenc.ContextualGRAPE(32, 4, D)
    x = torch.randn(2, 5, 32)
    omega = enc.gate(x)
    assert omega.shape == (2, 4, 5) and torch.allclose(omega, torch.full_like(omega, 1e-3), rtol=1e-5)
    phase = enc.prepare_gates(omega.double())
    assert phase[..., 0].abs().max() == 0 and torch.allclose(phase[..., 3], 3e-3 * torch.ones(2, 4, dtype=torch.float64), rtol=1e-5)


def test_omega_one_is_multiplicative_grape_at_the_token_positions():
    """Every omega = 1: Phi_t = t, and the turn is posenc's GRAPE (tested against its own
    reference) with the same spectrum."""
    enc, _x, q, k, v = _inputs(share_across_heads=False)
    grape = posenc.GRAPE(D, num_key_value_heads=4).double()
    with torch.no_grad():
        grape.log_freq.copy_(enc.log_freq)
    ones = torch.ones(2, 4, 11, dtype=torch.float64)
    assert (posenc.attention(q, k, v, enc, gates=ones) - posenc.attention(q, k, v, grape)).abs().max() < 1e-12


def test_scores_depend_on_the_phase_difference_only():
    """The same constant added to every phase (what a prefix of tokens before the first would
    write) leaves the scores alone: they are relative in Phi."""
    enc, x, q, k, _v = _inputs(batch=1, length=12)
    omega = enc.gate(x)
    state = enc.prepare_gates(omega)
    scores = enc.content_scores(q, k, None, None, gate_state=state) + q @ k.transpose(-2, -1)
    shifted = enc.content_scores(q, k, None, None, gate_state=state + 123.456) + q @ k.transpose(-2, -1)
    assert (scores - shifted).abs().max() < 1e-9
    # and the phase does matter: the same scores with omega halved differ
    halved = enc.content_scores(q, k, None, None, gate_state=state / 2) + q @ k.transpose(-2, -1)
    assert (scores - halved).tril(-1).abs().max() > 1e-2


def test_decoding_equals_the_full_pass():
    enc, x, q, k, v = _inputs(batch=1, length=10)
    gates = enc.gate(x)
    full = posenc.attention(q, k, v, enc, gates=gates)
    for t in range(10):
        step = posenc.attention(q[:, :, t:t + 1], k[:, :, :t + 1], v[:, :, :t + 1], enc, gates=gates[:, :, :t + 1])
        assert (step - full[:, :, t:t + 1]).abs().max() < 1e-12


def test_the_spectrum_trains():
    """(gradcheck of q, k, v and the gates: tests/test_gated_content.py)"""
    enc, x, q, k, v = _inputs(batch=1, heads=2, length=6)
    gates = enc.gate(x).detach()
    out = posenc.attention(q, k, v, enc, gates=gates)
    out.square().sum().backward()
    assert enc.log_freq.grad is not None and enc.log_freq.grad.abs().max() > 0


def test_bad_inputs():
    enc, x, q, k, v = _inputs(length=5)
    with pytest.raises(InvalidArgument, match="causal"):
        posenc.attention(q, k, v, enc, gates=enc.gate(x), causal=False)
    with pytest.raises(InvalidArgument, match=r"gates"):
        posenc.attention(q, k, v, enc, gates=enc.gate(x)[..., None])
    with pytest.raises(InvalidArgument, match="head_dim"):
        posenc.ContextualGRAPE(32, 4, 7)
    with pytest.raises(InvalidArgument, match="init_omega"):
        posenc.ContextualGRAPE(32, 4, D, init_omega=0.0)
    with pytest.raises(InvalidArgument, match="base"):
        posenc.ContextualGRAPE(32, 4, D, base=1.0)
    with pytest.raises(InvalidArgument, match="causal"):
        posenc.create_for_model("grape_contextual", d_model=32, num_heads=4, head_dim=8, max_positions=64, causal=False)
    with pytest.raises(TypeError, match="per_head_phase"):
        posenc.ContextualGRAPE(32, 4, D, per_head_phase="yes")
    assert math.isclose(float(F.softplus(posenc.ContextualGRAPE(32, 4, D, init_omega=0.25).omega_proj.bias.detach())), 0.25,
                        rel_tol=1e-6)
