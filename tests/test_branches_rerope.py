"""ReRoPE and Leaky ReRoPE maps (posenc.attention.branches): golden matrices worked by hand,
the reference code's maps (bojone/rerope rerope_patch.py, leaky_rerope_patch.py) re-implemented,
the log-n query scale against its formula, and plain RoPE inside the window."""

from __future__ import annotations

import math

import pytest
import torch

from posenc.attention.branches import branch_attention, leaky_rerope, rerope
from posenc.encodings.rope import RoPE
from posenc.errors import InvalidArgument, InvalidType
from test_branches import plain_rope_attention

_ = None


def as_rows(rel, covered):
    return [[r if c else _ for r, c in zip(rr, cc)] for rr, cc in zip(rel.tolist(), covered.tolist())]


def test_rerope_golden_map_worked_by_hand():
    """window 3: i - j below 3, else 3."""
    rel, covered = rerope(window=3).relative_positions(6, 6)
    assert as_rows(rel, covered) == [
        [0, _, _, _, _, _],
        [1, 0, _, _, _, _],
        [2, 1, 0, _, _, _],
        [3, 2, 1, 0, _, _],
        [3, 3, 2, 1, 0, _],
        [3, 3, 3, 2, 1, 0],
    ]


def test_leaky_rerope_golden_map_worked_by_hand():
    """window 2, scaling_factor 2: i - j below 2, else 2 + (i - j - 2) / 2."""
    rel, covered = leaky_rerope(window=2, scaling_factor=2).relative_positions(6, 6)
    assert rel.dtype == torch.float64
    assert as_rows(rel, covered) == [
        [0, _, _, _, _, _],
        [1, 0, _, _, _, _],
        [2, 1, 0, _, _, _],
        [2.5, 2, 1, 0, _, _],
        [3, 2.5, 2, 1, 0, _],
        [3.5, 3, 2.5, 2, 1, 0],
    ]


def reference_rerope_prefill(t, window):
    """rerope_patch.py prefill: attn_weights1 (q at i, k at j) where |i - j| < window, else
    attn_weights2 (q at window, k unrotated); the causal mask of the model on top."""
    pos = torch.arange(t)
    near = (pos[:, None] - pos[None, :]).abs() < window
    rel = torch.where(near, pos[:, None] - pos[None, :], torch.full((t, t), window) - 0)
    return rel, torch.tril(torch.ones(t, t)).bool()


def reference_rerope_decode(t, window):
    """rerope_patch.py decode (q_len == 1): keys rotated by -clip(i - j, max=window)."""
    pos = torch.arange(t)
    return (pos[-1] - pos).clip(max=window)


def reference_leaky_prefill(t, window, s):
    """leaky_rerope_patch.py prefill: the far branch rotates q at i + window (s - 1) and k at
    j by the linear-scaled table (positions / s); the near one at i, j by the plain table."""
    pos = torch.arange(t, dtype=torch.float64)
    offset = window * (s - 1)
    near = (pos[:, None] - pos[None, :]).abs() < window
    far = (pos[:, None] + offset) / s - pos[None, :] / s
    return torch.where(near, pos[:, None] - pos[None, :], far), torch.tril(torch.ones(t, t)).bool()


def reference_leaky_decode(t, window, s):
    """leaky_rerope_patch.py decode: key table = plain[:window] ++ scaled[window + offset:],
    indexed by d = i - j: d below window -> d, else (d + offset) / s."""
    offset = window * (s - 1)
    d = torch.arange(t - 1, -1, -1, dtype=torch.float64)
    table = torch.cat([torch.arange(window, dtype=torch.float64),
                       torch.arange(window + offset, t + offset + window, dtype=torch.float64) / s])
    return table[d.long()]


@pytest.mark.parametrize("window", [1, 2, 3, 5])
@pytest.mark.parametrize("t", [1, 4, 9])
def test_rerope_matches_the_reference(window, t):
    rel, covered = rerope(window=window).relative_positions(t, t)
    ref_rel, ref_covered = reference_rerope_prefill(t, window)
    assert torch.equal(covered, ref_covered)
    assert torch.equal(rel, ref_rel.masked_fill(~ref_covered, 0))
    for n in range(1, t + 1):
        last, _c = rerope(window=window).relative_positions(1, n)
        assert torch.equal(last[0], reference_rerope_decode(n, window))


@pytest.mark.parametrize("window,s", [(1, 2), (2, 2), (3, 4), (4, 3), (2, 1)])
@pytest.mark.parametrize("t", [1, 5, 11])
def test_leaky_rerope_matches_the_reference(window, s, t):
    rel, covered = leaky_rerope(window=window, scaling_factor=s).relative_positions(t, t)
    ref_rel, ref_covered = reference_leaky_prefill(t, window, s)
    assert torch.equal(covered, ref_covered)
    torch.testing.assert_close(rel, ref_rel.masked_fill(~ref_covered, 0), atol=1e-12, rtol=0)
    for n in range(1, t + 1):
        last, _c = leaky_rerope(window=window, scaling_factor=s).relative_positions(1, n)
        torch.testing.assert_close(last[0], reference_leaky_decode(n, window, s), atol=1e-12, rtol=0)


def test_leaky_rerope_with_factor_one_is_plain_rope_distance():
    rel, covered = leaky_rerope(window=2, scaling_factor=1).relative_positions(7, 7)
    pos = torch.arange(7)
    assert torch.equal(rel, (pos[:, None] - pos).double().masked_fill(~covered, 0))


@pytest.mark.parametrize("pmap", [rerope(3, training_length=4), leaky_rerope(3, 2, training_length=4)], ids=repr)
def test_log_n_query_scale_is_the_reference_formula(pmap):
    """max(1, log(i + 1) / log(4)) worked with math.log, prefill and the last decode row."""
    expected = [max(1.0, math.log(i + 1) / math.log(4)) for i in range(9)]
    assert pmap.query_scale(9, 9).tolist() == pytest.approx(expected, abs=1e-15)
    assert pmap.query_scale(9, 9)[:4].tolist() == [1.0] * 4
    assert pmap.query_scale(1, 9).tolist() == pytest.approx(expected[-1:], abs=1e-15)
    q = torch.randn(1, 2, 9, 4, dtype=torch.float64)
    torch.testing.assert_close(pmap.scale_queries(q, 9), q * torch.tensor(expected, dtype=torch.float64)[:, None])


def qkv(t, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, 2, t, 8, generator=g, dtype=dtype) for _i in range(3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("window,t", [(16, 16), (7, 5)])
def test_rerope_inside_the_window_equals_plain_rope_exactly(window, t, dtype):
    rope, pmap = RoPE(8), rerope(window=window, training_length=16)
    q, k, v = qkv(t, dtype)
    for tq in (t, 1):
        qs = pmap.scale_queries(q[:, :, t - tq:], t)
        assert torch.equal(qs, q[:, :, t - tq:])  # scale 1 up to the training length
        got = branch_attention(qs, k, v, rotate=rope.rotate, branches=pmap.branches(tq, t))
        assert torch.equal(got, plain_rope_attention(q[:, :, t - tq:], k, v, rope))


@pytest.mark.parametrize("window,s,t", [(16, 4, 16), (7, 16, 5)])
def test_leaky_rerope_inside_the_window_equals_plain_rope(window, s, t):
    """The near branch at (s i, s j) on frequencies theta/s: plain RoPE to float64 rounding."""
    pmap = leaky_rerope(window=window, scaling_factor=s, training_length=16)
    scaled = RoPE(8, scaling={"rope_type": "linear", "factor": float(s)})
    q, k, v = qkv(t, torch.float64)
    for tq in (t, 1):
        got = branch_attention(q[:, :, t - tq:], k, v, rotate=scaled.rotate, branches=pmap.branches(tq, t))
        torch.testing.assert_close(got, plain_rope_attention(q[:, :, t - tq:], k, v, RoPE(8)), atol=1e-12, rtol=0)


def per_pair_reference(q, k, v, rel, covered):
    """Each logit <R(rel) q_i, k_j> with a float64 rotation at a fractional distance."""
    d = q.shape[-1]
    inv_freq = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = rel.unsqueeze(-1) * inv_freq  # (Tq, Tk, d/2)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    qe = q.unsqueeze(3)  # (B, H, Tq, 1, D)
    rot = torch.cat([-qe[..., d // 2:], qe[..., : d // 2]], -1)
    qr = qe * cos + rot * sin
    logits = (qr * k.unsqueeze(2)).sum(-1) * d ** -0.5
    return torch.softmax(logits.masked_fill(~covered, float("-inf")), -1) @ v


@pytest.mark.parametrize("make,scaled", [(lambda: rerope(3, training_length=4), 1),
                                         (lambda: leaky_rerope(3, 2, training_length=4), 2),
                                         (lambda: leaky_rerope(2, 4, training_length=4), 4)])
def test_past_the_window_equals_the_per_pair_reference(make, scaled):
    """The attention past the window, log-n scale included, against float64 rotations at the
    map's (fractional) distances; and it differs from plain RoPE there."""
    pmap, t = make(), 10
    q, k, v = qkv(t, torch.float64, seed=3)
    rope = RoPE(8) if scaled == 1 else RoPE(8, scaling={"rope_type": "linear", "factor": float(scaled)})
    qs = pmap.scale_queries(q, t)
    got = branch_attention(qs, k, v, rotate=rope.rotate, branches=pmap.branches(t, t))
    rel, covered = pmap.relative_positions(t, t)
    torch.testing.assert_close(got, per_pair_reference(qs, k, v, rel.double(), covered), atol=1e-10, rtol=0)
    assert not torch.allclose(got[:, :, -1], plain_rope_attention(q, k, v, RoPE(8))[:, :, -1])


def test_bad_arguments():
    for bad in (0, -1, 1.5, True, "3"):
        with pytest.raises(InvalidArgument, match="window"):
            rerope(window=bad)
        with pytest.raises(InvalidArgument, match="scaling_factor"):
            leaky_rerope(scaling_factor=bad)
    with pytest.raises(InvalidArgument, match="training_length"):
        rerope(training_length=1)
    with pytest.raises(InvalidArgument, match="training_length"):
        leaky_rerope(training_length=0)
    with pytest.raises(InvalidType, match="q"):
        rerope().scale_queries(torch.ones(1, 1, 2, 2, dtype=torch.int64), 2)
    with pytest.raises(InvalidArgument, match="q"):
        rerope().scale_queries(torch.ones(2, 2), 2)


def test_defaults_are_the_references():
    assert (rerope().window, rerope().training_length) == (512, 4096)
    lk = leaky_rerope()
    assert (lk.window, lk.scaling_factor, lk.training_length) == (512, 16, 4096)
