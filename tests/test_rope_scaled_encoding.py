"""The rope encoding with a scaling: attention factor on cos/sin, length-dependent tables,
and the two KV-cache conventions of ``dynamic_cache``.

Reference: the rotation written out pair by pair in float64 loops (half-split layout).
"""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from rope_reference import ref_inv_freq

DYN = {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 16}
LONG = {"rope_type": "longrope", "short_factor": [1.0, 1.5, 2.0, 3.0], "long_factor": [2.0, 4.0, 8.0, 16.0],
        "original_max_position_embeddings": 16, "factor": 8.0}


def ref_rotate(x, positions, inv_freq_at, attention_factor):
    """x (T, D) float64; pair (i, i + D/2) of row t rotated by positions[t] * inv_freq_at(t)[i], times af."""
    T, D = x.shape
    out = torch.empty_like(x, dtype=torch.float64)
    for t in range(T):
        inv = inv_freq_at(t)
        for i in range(D // 2):
            a = positions[t] * inv[i]
            c, s = math.cos(a) * attention_factor, math.sin(a) * attention_factor
            x1, x2 = float(x[t, i]), float(x[t, i + D // 2])
            out[t, i], out[t, i + D // 2] = x1 * c - x2 * s, x2 * c + x1 * s
    return out


def rotate_k(rope, k, positions):
    """Rotate keys alone (q = one dummy row at the first key position)."""
    q = torch.zeros(1, 1, 1, k.shape[-1], dtype=k.dtype)
    return rope.rotate(q, k, positions[:1], positions)[1]


@pytest.mark.parametrize("scaling", [
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    {"rope_type": "longrope", **{k: v for k, v in LONG.items() if k != "rope_type"}},
])
def test_attention_factor_multiplies_cos_and_sin(scaling):
    torch.manual_seed(0)
    rope = posenc.RoPE(8, scaling=scaling)
    assert rope.attention_factor > 1
    x = torch.randn(1, 1, 10, 8, dtype=torch.float64)
    pos = torch.arange(10)
    ref_inv, af = ref_inv_freq(8, 10000.0, scaling, None)
    inv64 = list(ref_inv)  # exact float64 frequencies: angles are formed in float64 (precision policy)
    got, _ = rope.rotate(x, x, pos, pos)
    torch.testing.assert_close(got[0, 0], ref_rotate(x[0, 0], pos.tolist(), lambda t: inv64, af), rtol=1e-12, atol=1e-12)
    # so the logits scale by af^2 against the same frequencies without the factor
    plain = posenc.RoPE(8, scaling={**scaling, "attention_factor": 1.0})
    q1, k1 = rope.rotate(x, x, pos, pos)
    q0, k0 = plain.rotate(x, x, pos, pos)
    torch.testing.assert_close(q1 @ k1.transpose(-1, -2), af**2 * (q0 @ k0.transpose(-1, -2)))


def test_dynamic_rerotate_uses_the_frequencies_of_the_current_length():
    torch.manual_seed(0)
    rope = posenc.RoPE(8, scaling=DYN)
    for length in (10, 16, 17, 40):
        k = torch.randn(1, 1, length, 8, dtype=torch.float64)
        pos = torch.arange(length)
        inv64 = list(ref_inv_freq(8, 10000.0, DYN, length)[0])
        torch.testing.assert_close(rotate_k(rope, k, pos)[0, 0], ref_rotate(k[0, 0], pos.tolist(), lambda t: inv64, 1.0),
                                   rtol=1e-12, atol=1e-12)


def test_dynamic_rerotate_with_kv_cache_matches_the_full_forward():
    """Caching unrotated keys and letting attention() rotate them all gives, for the last
    query, exactly the full forward pass at that length (every key at the current frequencies)."""
    torch.manual_seed(0)
    rope = posenc.RoPE(8, scaling=DYN)
    q, k, v = (torch.randn(1, 2, 40, 8, dtype=torch.float64) for _ in range(3))
    for length in (12, 16, 17, 29, 40):
        full = posenc.attention(q[:, :, :length], k[:, :, :length], v[:, :, :length], rope, backend="eager")
        step = posenc.attention(q[:, :, length - 1:length], k[:, :, :length], v[:, :, :length], rope, backend="eager")
        torch.testing.assert_close(step[:, :, 0], full[:, :, -1])


def test_dynamic_frozen_rotates_each_position_at_its_own_length():
    torch.manual_seed(0)
    rope = posenc.RoPE(8, scaling=DYN, dynamic_cache="frozen")
    k = torch.randn(1, 1, 40, 8, dtype=torch.float64)
    pos = torch.arange(40)
    inv_at = [list(ref_inv_freq(8, 10000.0, DYN, t + 1)[0]) for t in range(40)]
    torch.testing.assert_close(rotate_k(rope, k, pos)[0, 0], ref_rotate(k[0, 0], pos.tolist(), lambda t: inv_at[t], 1.0),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("scaling", [DYN, LONG])
def test_frozen_rotation_is_independent_of_chunking_and_rerotate_is_not(scaling):
    """frozen: rotating keys chunk by chunk (caching rotated keys) equals rotating them at once."""
    torch.manual_seed(0)
    k = torch.randn(1, 2, 40, 8, dtype=torch.float64)
    pos = torch.arange(40)
    for mode, same in (("frozen", True), ("rerotate", False)):
        rope = posenc.RoPE(8, scaling=scaling, dynamic_cache=mode)
        at_once = rotate_k(rope, k, pos)
        chunks = torch.cat([rotate_k(rope, k[:, :, :12], pos[:12]), rotate_k(rope, k[:, :, 12:], pos[12:])], dim=2)
        assert torch.allclose(at_once, chunks, rtol=1e-12, atol=1e-12) is same, mode


def test_longrope_rerotate_switches_factors_with_the_length():
    torch.manual_seed(0)
    rope = posenc.RoPE(8, scaling=LONG)
    for length, use_long in ((16, False), (17, True)):
        k = torch.randn(1, 1, length, 8, dtype=torch.float64)
        pos = torch.arange(length)
        ref_inv, af = ref_inv_freq(8, 10000.0, LONG, length)
        assert ref_inv[1] == pytest.approx(10000 ** -0.25 / (4.0 if use_long else 1.5))
        inv64 = list(ref_inv)
        torch.testing.assert_close(rotate_k(rope, k, pos)[0, 0], ref_rotate(k[0, 0], pos.tolist(), lambda t: inv64, af),
                                   rtol=1e-12, atol=1e-12)


def test_length_is_the_furthest_query_or_key_position():
    """q at position 5 with keys 0..39 (e.g. a left-over query): both use the length 40."""
    torch.manual_seed(0)
    rope = posenc.RoPE(8, scaling=DYN)
    x = torch.randn(1, 1, 1, 8, dtype=torch.float64)
    keys = torch.randn(1, 1, 40, 8, dtype=torch.float64)
    q, _ = rope.rotate(x, keys, torch.tensor([5]), torch.arange(40))
    inv40 = list(ref_inv_freq(8, 10000.0, DYN, 40)[0])
    torch.testing.assert_close(q[0, 0], ref_rotate(x[0, 0], [5], lambda t: inv40, 1.0), rtol=1e-12, atol=1e-12)
    alone, _ = rope.rotate(x, x, torch.tensor([5]), torch.tensor([5]))  # length 6 <= L0: original frequencies
    assert not torch.allclose(alone, q)


def test_static_scalings_ignore_the_length():
    rope = posenc.RoPE(8, scaling={"rope_type": "linear", "factor": 4.0})
    x = torch.randn(1, 1, 50, 8, dtype=torch.float64)
    full = rotate_k(rope, x, torch.arange(50))
    torch.testing.assert_close(rotate_k(rope, x[:, :, :5], torch.arange(5)), full[:, :, :5])


def test_partial_rotary_scales_the_rotary_dimension():
    rope = posenc.RoPE(16, partial_rotary_factor=0.5, scaling={"rope_type": "ntk", "factor": 4.0})
    assert rope.inv_freq.shape == (4,)
    torch.testing.assert_close(rope.inv_freq.double(), torch.tensor(ref_inv_freq(8, 10000.0, {"rope_type": "ntk", "factor": 4.0})[0],
                                                                    dtype=torch.float64), rtol=1.2e-7, atol=0)


def test_bad_dynamic_cache_and_bad_scaling_at_construction():
    with pytest.raises(ValueError, match="dynamic_cache must be one of"):
        posenc.RoPE(8, scaling=DYN, dynamic_cache="sometimes")
    with pytest.raises(ValueError, match="factor"):
        posenc.create("rope", head_dim=8, scaling={"rope_type": "yarn", "factor": 0.5, "original_max_position_embeddings": 16})
    with pytest.raises(KeyError, match="original_max_position_embeddings"):
        posenc.RoPE(8, scaling={"rope_type": "dynamic", "factor": 2.0})
