"""Additive GRAPE, path-integral form (posenc.encodings.grape_additive): against a float64
re-implementation of its official code (model-architectures/GRAPE @135ee30,
``model/llama-mha-grape-a-pi.py``, ``CausalSelfAttention.forward``), its ALiBi special case,
the KV cache, positions, gradients and bad inputs."""

import math

import pytest
import torch
import torch.nn.functional as F

import posenc
from posenc.errors import InvalidArgument

D = 8


def _inputs(batch=2, heads=4, length=11, d_model=32, p_head_dim=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    enc = posenc.GRAPEAdditive(d_model, heads, D, p_head_dim=p_head_dim).double()
    with torch.no_grad():
        enc.c_p.weight.copy_(torch.randn(enc.c_p.weight.shape, generator=gen, dtype=torch.float64) * 0.5)
    x = torch.randn(batch, length, d_model, generator=gen, dtype=torch.float64)
    q, k, v = (torch.randn(batch, heads, length, D, generator=gen, dtype=torch.float64) for _ in range(3))
    return enc, x, q, k, v


def _reference_slopes(n_heads):
    """The reference's ``_get_alibi_slopes``."""
    def power_of_2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        return [start * start ** i for i in range(n)]
    if math.log2(n_heads).is_integer():
        return power_of_2(n_heads)
    closest = 2 ** math.floor(math.log2(n_heads))
    return power_of_2(closest) + _reference_slopes(2 * closest)[0::2][: n_heads - closest]


def _reference(x, weight, q, k, v, heads, p_head_dim):
    """The reference attention in float64, line by line (its cos / sin not rounded to bfloat16;
    its SDPA call written out: the causal mask and the bias on the scaled scores)."""
    batch, length, _ = x.shape
    p = (x @ weight.T).view(batch, length, heads, p_head_dim)
    p_norm = F.rms_norm(p, (p_head_dim,))
    inv_freq = 1.0 / (1.0 ** (torch.arange(0, p_head_dim, 2, dtype=torch.float64) / p_head_dim))  # Rotary(base=1)
    freqs = torch.outer(torch.arange(length, dtype=torch.float64), inv_freq)
    cos, sin = freqs.cos()[None, :, None, :], freqs.sin()[None, :, None, :]
    half = p_head_dim // 2
    x1, x2 = p_norm[..., :half], p_norm[..., half:]
    p_rot = torch.cat([x1 * cos + x2 * sin, x1 * (-sin) + x2 * cos], 3)
    p, p_rot = p.transpose(1, 2), p_rot.transpose(1, 2)
    bias = torch.log(torch.sigmoid(torch.matmul(p, p_rot.transpose(-2, -1)) * (1.0 / p_head_dim)))
    bias = bias * torch.tensor(_reference_slopes(heads), dtype=torch.float64).view(1, heads, 1, 1)
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    bias = bias.masked_fill(~causal, 0.0)
    bias = bias.sum(dim=-1, keepdim=True) - bias.cumsum(dim=-1)
    bias = bias.masked_fill(~causal, float("-inf"))
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + bias
    return torch.softmax(scores, -1) @ v


@pytest.mark.parametrize("heads,p_head_dim", [(4, None), (6, 12)])
def test_the_reference(heads, p_head_dim):
    enc, x, q, k, v = _inputs(heads=heads, p_head_dim=p_head_dim)
    out = posenc.attention(q, k, v, enc, gates=enc.gate(x))
    ref = _reference(x, enc.c_p.weight, q, k, v, heads, p_head_dim or D)
    assert (out - ref).abs().max() < 1e-12
    assert enc.slopes.tolist() == pytest.approx(_reference_slopes(heads), rel=1e-7)  # float32 buffer


def test_a_wrong_rotation_direction_or_scale_is_seen():
    """The checks above see the conventions: RoPE's direction for p, or the bias scaled with q.k."""
    enc, x, q, k, v = _inputs(seed=2)
    gates = enc.gate(x)
    ref = _reference(x, enc.c_p.weight, q, k, v, 4, D)
    turn = enc._rotated
    enc._rotated = lambda p_hat, positions: turn(p_hat, -positions)  # RoPE's direction
    try:
        assert (posenc.attention(q, k, v, enc, gates=gates) - ref).abs().max() > 1e-3
    finally:
        del enc._rotated
    assert (posenc.attention(q, k, v, enc, gates=gates) - ref).abs().max() < 1e-12
    scaled = type(enc).content_scaled
    try:
        type(enc).content_scaled = True
        assert (posenc.attention(q, k, v, enc, gates=gates) - ref).abs().max() > 1e-3
    finally:
        type(enc).content_scaled = scaled


def test_zero_p_is_alibi_with_slopes_times_ln2():
    """p = 0: every step costs slope_h log sigmoid(0) = -slope_h ln 2, so b_ij = -slope_h ln 2 (i - j):
    ALiBi (posenc's, tested against its paper) with every slope times ln 2."""
    enc, x, q, k, v = _inputs()
    with torch.no_grad():
        enc.c_p.weight.zero_()
    out = posenc.attention(q, k, v, enc, gates=enc.gate(x))
    alibi = posenc.ALiBi(4).double()
    with torch.no_grad():
        alibi.slopes.mul_(math.log(2))
    assert (out - posenc.attention(q, k, v, alibi)).abs().max() < 1e-12


def test_the_bias_is_a_decay_along_the_path():
    """b_ii = 0 and each token between adds a negative term: b_ij <= b_i(j+1) <= 0."""
    enc, x, q, *_ = _inputs(length=20)
    bias = enc.content_scores(q, q, torch.arange(20), torch.arange(20), gate_state=enc.gate(x)).detach()
    rows = [bias[..., i, : i + 1] for i in range(20)]
    assert all(float(row[..., -1].abs().max()) == 0.0 for row in rows)
    assert all(bool((row.diff(dim=-1) >= 0).all()) and bool((row <= 0).all()) for row in rows)


def test_decoding_equals_the_full_pass():
    enc, x, q, k, v = _inputs(batch=1, length=10)
    gates = enc.gate(x)
    full = posenc.attention(q, k, v, enc, gates=gates)
    for t in range(10):
        step = posenc.attention(q[:, :, t:t + 1], k[:, :, :t + 1], v[:, :, :t + 1], enc, gates=gates[:, :, :t + 1],
                                q_positions=torch.tensor([t]), k_positions=torch.arange(t + 1))
        assert (step - full[:, :, t:t + 1]).abs().max() < 1e-12


def test_positions_not_indices_turn_p():
    """Left padding: a row's real tokens at positions 0.. behind pads give the bias of the row alone
    (the reference turns p by the token index, which padding would shift)."""
    enc, x, q, k, v = _inputs(batch=1, length=8)
    pad = 3
    xp = torch.cat((torch.randn(1, pad, 32, dtype=torch.float64), x), dim=1)
    qp, kp, vp = (torch.cat((torch.randn(1, 4, pad, D, dtype=torch.float64), t), dim=2) for t in (q, k, v))
    positions = torch.cat((torch.zeros(pad, dtype=torch.long), torch.arange(8)))[None]
    mask = torch.ones(1, 1, 8 + pad, 8 + pad, dtype=torch.bool)
    mask[..., :pad] = False
    padded = posenc.attention(qp, kp, vp, enc, gates=enc.gate(xp), q_positions=positions, k_positions=positions, mask=mask & torch.ones(8 + pad, 8 + pad, dtype=torch.bool).tril())
    alone = posenc.attention(q, k, v, enc, gates=enc.gate(x))
    assert (padded[:, :, pad:] - alone).abs().max() < 1e-12


def test_bad_inputs():
    enc, x, q, k, v = _inputs(length=5)
    with pytest.raises(InvalidArgument, match="causal"):
        posenc.attention(q, k, v, enc, gates=enc.gate(x), causal=False)
    with pytest.raises(InvalidArgument, match=r"\(B, H, Tk, F\) = \(2, 4, 5, 8\)"):
        posenc.attention(q, k, v, enc, gates=enc.gate(x)[..., :4])
    with pytest.raises(InvalidArgument, match="p_head_dim"):
        posenc.GRAPEAdditive(32, 4, D, p_head_dim=5)
    with pytest.raises(InvalidArgument, match="base"):
        posenc.GRAPEAdditive(32, 4, D, base=0.5)
    with pytest.raises(InvalidArgument, match="causal"):
        posenc.create_for_model("grape_additive", d_model=32, num_heads=4, head_dim=8, max_positions=64, causal=False)
    with pytest.raises(InvalidArgument, match="d_model"):
        enc.gate(x[..., :16])
