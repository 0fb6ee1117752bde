"""Proportional RoPE (p-RoPE, Barbero et al. 2024; Gemma 4's rope_type "proportional") against
its formula, against GPT-NeoX partial rotary (a different map), and against transformers."""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc.rope import from_hf_config


def test_frequencies_are_the_whole_heads_with_the_tail_zeroed():
    d, base, share, factor = 16, 10000.0, 0.25, 4.0
    inv_freq, attention_factor = posenc.rope_frequencies(
        d, base=base, scaling={"rope_type": "proportional", "partial_rotary_factor": share, "factor": factor})
    kept = int(share * d // 2)  # 2 of the 8 pairs
    expected = [base ** (-2 * i / d) / factor if i < kept else 0.0 for i in range(d // 2)]
    torch.testing.assert_close(inv_freq.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-7, atol=0)
    assert attention_factor == 1.0


def test_unrotated_pairs_pass_through_and_scores_stay_relative():
    d = 16
    rope = posenc.create("rope", head_dim=d, scaling={"rope_type": "proportional", "partial_rotary_factor": 0.25})
    assert rope.rotary_dim == d  # the rotation spans the head; the zeroed pairs are the identity
    q, k = torch.randn(1, 1, 5, d, dtype=torch.float64), torch.randn(1, 1, 5, d, dtype=torch.float64)
    positions = torch.arange(5) + 1000
    q2, k2 = rope.rotate(q, k, positions, positions)
    still = [i for i in range(d) if i % (d // 2) >= 2]  # half-split pairs (i, i + d/2) with i >= kept
    torch.testing.assert_close(q2[..., still], q[..., still])
    shifted_q, shifted_k = rope.rotate(q, k, positions + 77, positions + 77)
    torch.testing.assert_close(q2 @ k2.transpose(-1, -2), shifted_q @ shifted_k.transpose(-1, -2))


def test_differs_from_neox_partial_rotary_as_documented():
    """The docs/encodings.md example: head_dim 8, share 0.5, base 10000."""
    proportional, _ = posenc.rope_frequencies(8, scaling={"rope_type": "proportional", "partial_rotary_factor": 0.5})
    neox = posenc.create("rope", head_dim=8, partial_rotary_factor=0.5)
    torch.testing.assert_close(proportional, torch.tensor([1.0, 0.1, 0.0, 0.0]))  # 10000^(-2i/8), 2 of 4 kept
    assert neox.rotary_dim == 4
    torch.testing.assert_close(neox.inv_freq, torch.tensor([1.0, 0.01]))  # 10000^(-2i/4) over the 4 rotated dims


@pytest.mark.parametrize("config", [
    {"head_dim": 64, "hidden_size": 256, "num_attention_heads": 4, "max_position_embeddings": 4096,
     "rope_parameters": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}},
    {"head_dim": 64, "hidden_size": 256, "num_attention_heads": 4, "partial_rotary_factor": 0.5,
     "rope_parameters": {"rope_type": "proportional", "factor": 8.0, "rope_theta": 10000.0}},
])
def test_hugging_face_dict_round_trip_and_parity(config):
    rope = from_hf_config(config)
    assert rope.rotary_dim == config["head_dim"]
    assert rope.to_hf_dict() == {k: v for k, v in config.items() if k in rope.to_hf_dict()}
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import _compute_proportional_rope_parameters

    inv_freq, attention_factor = _compute_proportional_rope_parameters(transformers.LlamaConfig(**config))
    torch.testing.assert_close(rope.inv_freq, inv_freq.float(), rtol=1e-6, atol=0)
    assert math.isclose(rope.attention_factor, attention_factor)


@pytest.mark.parametrize("bad, match", [
    ({"partial_rotary_factor": 1.5}, r"partial_rotary_factor'\] must be in \[0, 1\]"),
    ({"factor": 0.0}, r"factor'\] must be a finite number > 0"),
])
def test_bad_values_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        posenc.create("rope", head_dim=8, scaling={"rope_type": "proportional", **bad})


def test_p_rope_is_gemma4s_global_rope_trainable_from_scratch():
    """The registered ``p_rope`` equals the RoPE of Gemma 4's full-attention config (p = 0.25),
    frequencies by the paper's formula; its pairs past the kept share pass through."""
    d = 64
    p_rope = posenc.create("p_rope", head_dim=d, base=1_000_000.0)
    gemma4 = from_hf_config({"head_dim": d, "hidden_size": 256, "num_attention_heads": 4,
                             "rope_parameters": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                 "rope_theta": 1_000_000.0}})
    expected = [1e6 ** (-2 * i / d) if i < 8 else 0.0 for i in range(d // 2)]
    torch.testing.assert_close(p_rope.inv_freq.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-6, atol=0)
    assert torch.equal(p_rope.inv_freq, gemma4.inv_freq) and p_rope.to_hf_dict()["rope_scaling"] == {
        "rope_type": "proportional", "partial_rotary_factor": 0.25}


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), "0.5", True])
def test_p_rope_refuses_a_share_outside_0_1(bad):
    with pytest.raises(ValueError, match=r"partial_rotary_factor must be a number in \[0, 1\]"):
        posenc.create("p_rope", head_dim=8, partial_rotary_factor=bad)
