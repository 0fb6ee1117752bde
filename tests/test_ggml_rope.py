"""posenc's RoPE against llama.cpp's own arithmetic (issue 35): a float32 port of ggml's CPU rope
(``posenc.hf_config.gguf.ggml_rope_angles``, written from ``ggml/src/ggml-cpu/ops.cpp``,
``ggml/src/ggml.c`` and ``src/llama-context.cpp``, not from posenc's RoPE) gives each pair's
angle at position 1 and the cos / sin multiplier; posenc's RoPE of the same scaling must give
the same within ggml's float32 rounding: theta is multiplied by powf(base, -2 / d) pair after
pair, so pair i carries up to about i + 3 float32 roundings (bound: (d / 2 + 4) 2^-23 relative).
A wrong constant (YaRN's beta_fast, L0, the attention factor, a ramp of the wrong pair) moves
some pair by far more (checked below).

The one convention the two spell differently: posenc's inverse frequencies are ggml's angles at
position 1 (transformers' ``inv_freq``), and posenc's ``attention_factor`` is ggml's ``mscale``
(both multiply cos and sin).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import RoPE
from posenc.hf_config.gguf import ggml_rope_angles

DIMS = st.sampled_from([32, 64, 80, 128, 256])
BASES = st.sampled_from([1e4, 5e5, 1e6, 1e5]) | st.floats(1e3, 1e7)
FACTORS = st.sampled_from([1.5, 2.0, 4.0, 8.0, 32.0]) | st.floats(1.01, 40.0)
L0S = st.sampled_from([2048, 4096, 8192, 32768, 131072])


def _bound(dim: int) -> float:
    return (dim // 2 + 4) * 2.0 ** -23


def _worst(rope: RoPE, angles) -> float:
    ours = rope.inv_freq.double()
    return ((ours / torch.tensor(angles, dtype=torch.float64)) - 1).abs().max().item()


@settings(max_examples=60, deadline=None)
@given(dim=DIMS, base=BASES, factor=FACTORS, l0=L0S)
def test_yarn_is_ggml_rope_yarn(dim, base, factor, l0):
    rope = RoPE(dim, base=base, scaling={"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": l0})
    ggml = ggml_rope_angles(dim, base, 1 / factor, l0, 1.0)
    assert _worst(rope, ggml.angles) <= _bound(dim)
    assert rope.attention_factor == pytest.approx(ggml.mscale, rel=2.0 ** -22)


@settings(max_examples=30, deadline=None)
@given(dim=DIMS, base=BASES, factor=FACTORS)
def test_linear_and_plain_are_ggml_rope(dim, base, factor):
    linear = RoPE(dim, base=base, scaling={"rope_type": "linear", "factor": factor})
    assert _worst(linear, ggml_rope_angles(dim, base, 1 / factor).angles) <= _bound(dim)
    assert _worst(RoPE(dim, base=base), ggml_rope_angles(dim, base).angles) <= _bound(dim)
    assert linear.attention_factor == ggml_rope_angles(dim, base, 1 / factor).mscale == 1.0


def test_freq_factors_are_ggml_rope_freqs():
    """A GGUF's rope_freqs (Llama 3.1's scaled frequencies as convert_hf_to_gguf.py stores them)."""
    factors = [1.0] * 20 + [1 + i / 3 for i in range(24)] + [8.0] * 20
    rope = RoPE(128, base=5e5, scaling={"rope_type": "freq_factors", "freq_factors": factors})
    assert _worst(rope, ggml_rope_angles(128, 5e5, freq_factors=factors).angles) <= _bound(128)


@pytest.mark.parametrize("wrong", [dict(beta_fast=16.0), dict(beta_slow=2.0), dict(n_ctx_orig=4096),
                                   dict(freq_scale=1 / 1.6)])
def test_a_wrong_constant_is_seen(wrong):
    """The bound is tight enough to see each YaRN constant off (L0 8192, s 1.5, d 64, base 1e5)."""
    rope = RoPE(64, base=1e5, scaling={"rope_type": "yarn", "factor": 1.5, "original_max_position_embeddings": 8192})
    args = dict(n_dims=64, base=1e5, freq_scale=1 / 1.5, n_ctx_orig=8192, ext_factor=1.0) | wrong
    ggml = ggml_rope_angles(**args)
    assert _worst(rope, ggml.angles) > 100 * _bound(64) or abs(rope.attention_factor / ggml.mscale - 1) > 1e-3


def test_corr_dims_are_ggmls_floor_and_ceil():
    """ggml_rope_yarn_corr_dims at d 128, base 1e4, L0 4096: corr(32) = 20.94, corr(1) = 45.03."""
    assert ggml_rope_angles(128, 1e4, 0.25, 4096, 1.0).corr_dims == (20.0, 46.0)


@pytest.mark.parametrize("args,match", [(dict(n_dims=63, base=1e4), "n_dims must be an even int"),
                                        (dict(n_dims=64, base=1.0), "base must be > 1"),
                                        (dict(n_dims=64, base=1e4, freq_factors=[1.0] * 3), "freq_factors must have")])
def test_bad_arguments_are_named(args, match):
    with pytest.raises(ValueError, match=match):
        ggml_rope_angles(**args)
