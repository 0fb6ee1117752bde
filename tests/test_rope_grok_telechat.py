"""Grok's yarn_log and theta_scale, TeleChat3's YaRN (issue 37, "YaRN as shipped"): rope_types of
released models that transformers does not carry. The float64 loops of tests/rope_reference.py
check every value (tests/test_rope_scaling.py); here: the reference's own float32 code, the
properties each formula promises, transformers' yarn for TeleChat3, and the refusals.

References (vLLM): ``vllm/model_executor/layers/rotary_embedding/grok1_scaling_rope.py`` (commit
e443db5afd899bae8a673ccb3ee2bc21c38969d9; SGLang's ``models/grok.py`` carries the same code) and
``telechat3_scaling_rope.py`` (commit d5a17e05172e358f2d4d6f18e67cb13f8d7c6988).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rope_reference import ref_default

import posenc
from posenc.encodings.rope.scaling import (
    ROPE_TYPES,
    compute_rope_parameters,
    telechat3_mscale,
    theta_scale_base,
)
from posenc.errors import InvalidArgument

GROK = {"base": 208533496.0, "factor": 16.0, "context": 8192}


def _vllm_grok_inv_freq_f32(rotary_dim, base, factor, context, method, beta_fast=32, beta_slow=1, extrapolation=1.0):
    """``Grok1ScalingRotaryEmbedding._compute_inv_freq`` as vLLM runs it: float32 tensors, its
    ``yarn_find_correction_range`` (floor / ceil, clamped) and ``yarn_linear_ramp_mask``."""
    pos_freqs = base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim)
    inv_freq_extrapolation = 1.0 / pos_freqs
    inv_freq_interpolation = 1.0 / (factor * pos_freqs)

    def correction_dim(rotations):
        return rotary_dim * math.log(context / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), rotary_dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(rotary_dim // 2, dtype=torch.float) - low) / (high - low), 0, 1)
    inv_freq_mask = (1 - ramp) * extrapolation
    if method == "yarn_log":
        return torch.exp(torch.log(inv_freq_extrapolation) * inv_freq_mask
                         + torch.log(inv_freq_interpolation) * (1.0 - inv_freq_mask))
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float)
    theta_scale_exponent = base ** (math.log(context * factor / (2 * math.pi)) / math.log(context / (2 * math.pi)))
    return (1.0 / (theta_scale_exponent ** (exponents / rotary_dim))).to(torch.float32)


def _frequencies(dim, base, scaling):
    return posenc.rope_frequencies(dim, base=base, scaling=scaling)


@pytest.mark.parametrize("method", ["yarn_log", "theta_scale"])
@pytest.mark.parametrize("rotary_dim", [128, 64])  # 64: Grok's rope_rotate_half_dims on a 128-wide head
def test_grok_against_vllms_float32_code(method, rotary_dim):
    """posenc's float32 table (float64, rounded once) against the reference's float32 arithmetic:
    equal within the reference's own float32 error, a few ulps of its pow / exp / log."""
    scaling = {"rope_type": method, "factor": GROK["factor"], "original_max_position_embeddings": GROK["context"]}
    ours, attention_factor = _frequencies(rotary_dim, GROK["base"], scaling)
    theirs = _vllm_grok_inv_freq_f32(rotary_dim, GROK["base"], GROK["factor"], GROK["context"], method)
    torch.testing.assert_close(ours, theirs, rtol=2e-6, atol=0)
    assert attention_factor == 1.0  # the reference computes an mscale and never multiplies cos / sin by it


def test_yarn_log_with_other_betas_and_extrapolation_against_vllm():
    scaling = {"rope_type": "yarn_log", "factor": 8.0, "original_max_position_embeddings": 4096,
               "beta_fast": 16, "beta_slow": 2, "extrapolation_factor": 0.5}
    ours, _ = _frequencies(128, 10000.0, scaling)
    theirs = _vllm_grok_inv_freq_f32(128, 10000.0, 8.0, 4096, "yarn_log", 16, 2, 0.5)
    torch.testing.assert_close(ours, theirs, rtol=2e-6, atol=0)


@settings(max_examples=40, deadline=None)
@given(half=st.integers(2, 64), log_base=st.floats(math.log(100.0), math.log(1e9)), factor=st.floats(1.0, 64.0),
       log_context=st.floats(math.log(16), math.log(1 << 17)))
def test_yarn_log_is_the_geometric_mean_of_yarns_frequencies(half, log_base, factor, log_context):
    """Per pair, yarn_log = theta^(1 - r) (theta / s)^r and yarn = (1 - r) theta + r theta / s with
    the same ramp r: the geometric mean never exceeds the arithmetic one (AM-GM), they agree where
    r is 0 or 1, and both lie in [theta / s, theta]."""
    dim, base, context = 2 * half, math.exp(log_base), int(math.exp(log_context))
    common = {"factor": factor, "original_max_position_embeddings": context}
    geometric = compute_rope_parameters(dim, base, {"rope_type": "yarn_log", **common}, None, dtype=torch.float64)[0]
    arithmetic = compute_rope_parameters(dim, base, {"rope_type": "yarn", **common}, None, dtype=torch.float64)[0]
    theta = torch.tensor(ref_default(dim, base), dtype=torch.float64)
    assert torch.all(geometric <= arithmetic * (1 + 1e-12))
    assert torch.all(geometric >= theta / factor * (1 - 1e-12)) and torch.all(geometric <= theta * (1 + 1e-12))
    ramp = (theta - arithmetic) / (theta - theta / factor) if factor > 1 else torch.zeros_like(theta)
    ends = (ramp.abs() < 1e-9) | ((ramp - 1).abs() < 1e-9)
    torch.testing.assert_close(geometric[ends], arithmetic[ends], rtol=1e-12, atol=0)


def test_theta_scale_stretches_the_pair_of_wavelength_L0_to_s_L0():
    """theta_scale's one promise: the (fractional) pair whose wavelength is L0 under b has
    wavelength s L0 under b'. Wavelengths are geometric in the pair index, so the float64 table's
    log wavelength is linear in i: evaluate it at that pair's index."""
    dim, base, factor, context = 128, 10000.0, 16.0, 4096
    inv = compute_rope_parameters(dim, base, {"rope_type": "theta_scale", "factor": factor,
                                                          "original_max_position_embeddings": context}, None, dtype=torch.float64)[0]
    log_wavelength = torch.log(2 * math.pi / inv)
    pair = dim * math.log(context / (2 * math.pi)) / (2 * math.log(base))  # 2 pi b^(2 i / d) = L0
    slope = float(log_wavelength[1] - log_wavelength[0])
    at_pair = float(log_wavelength[0]) + slope * pair
    assert math.exp(at_pair) == pytest.approx(factor * context, rel=1e-10)
    assert theta_scale_base(base, 1.0, context) == pytest.approx(base, rel=1e-15)  # s = 1: the model as trained


def test_theta_scale_refuses_a_context_at_most_two_pi():
    with pytest.raises(InvalidArgument, match="original_max_position_embeddings.*2 pi"):
        _frequencies(8, 10000.0, {"rope_type": "theta_scale", "factor": 2.0, "original_max_position_embeddings": 6})


@pytest.mark.parametrize("factor", [1.0, 4.0, 40.0])
def test_telechat3_is_transformers_yarn_with_its_mscale(factor):
    """TeleChat3's YaRN = transformers' yarn (its _compute_yarn_parameters, the real function) with
    attention_factor 0.07 ln s + 1: the frequencies bit for bit, the factor to float64 rounding;
    and the record's Hugging Face spelling builds the same table in transformers."""
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = {"rope_type": "telechat3_yarn", "factor": factor, "original_max_position_embeddings": 4096}
    ours, attention_factor = _frequencies(128, 1e6, scaling)
    assert attention_factor == pytest.approx(1.0 if factor == 1 else 0.07 * math.log(factor) + 1.0, rel=1e-15)
    assert attention_factor == telechat3_mscale(factor)
    theta, hf_dict = ROPE_TYPES["telechat3_yarn"].hf_equivalent(scaling, 1e6, 128)
    config = LlamaConfig(hidden_size=256, num_attention_heads=2, head_dim=128, max_position_embeddings=int(4096 * factor),
                         rope_parameters={**hf_dict, "rope_theta": theta})
    hf_inv, hf_attention = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    # transformers computes its table in float32 (posenc in float64, rounded once): a few ulps apart
    torch.testing.assert_close(ours, hf_inv, rtol=4e-7, atol=0)
    assert hf_attention == pytest.approx(attention_factor, rel=1e-12)
    if factor > 1:  # YaRN's own mscale differs: the test sees a swapped formula
        assert abs(attention_factor - (0.1 * math.log(factor) + 1.0)) > 1e-2


@pytest.mark.parametrize("config, match", [
    ({"rope_type": "yarn_log", "scaling_factor": 16.0, "original_max_position_embeddings": 8192},
     r"rope_type.*'yarn_log'.*Grok.*scaling=\{'rope_type': 'yarn_log', 'factor': 16.0"),
    ({"rope_type": "theta_scale", "scaling_factor": 4.0, "original_max_position_embeddings": 8192},
     r"'theta_scale'.*scaling=\{'rope_type': 'theta_scale'"),
    ({"rope_type": "yarn", "scaling_factor": 4.0, "original_max_position_embeddings": 8192}, r"attention factor 1"),
    ({"rope_rotate_half_dims": True}, r"rope_rotate_half_dims.*rotary_dim=head_dim // 2"),
])
def test_a_grok_config_is_refused_not_read_as_plain_rope(config, match):
    """Grok spells its scaling at the top level, where a Hugging Face reader looks for nothing:
    read as plain RoPE it would be silently wrong, so the reader refuses it by name."""
    base = {"hidden_size": 512, "num_attention_heads": 4, "rope_theta": 208533496.0, "max_position_embeddings": 131072}
    with pytest.raises(InvalidArgument, match=match):
        posenc.rope.from_hf_config({**base, **config})
    # Grok's "original" is plain RoPE, and a config without the spelling reads as before
    assert posenc.rope.from_hf_config({**base, "rope_type": "original"}).scaling is None
