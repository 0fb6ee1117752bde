"""Ministral 3's RoPE with Llama 4's query scale (posenc.encodings.rope.query_scaled) against
transformers' own ``get_llama_4_attn_scale`` and RoPE: the rotated queries times the factor at
their positions, the keys as RoPE leaves them; the errors name the argument."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc.encodings.rope.query_scaled import QueryScaledRoPE, llama_4_attn_scale

get_llama_4_attn_scale = pytest.importorskip("transformers.models.ministral3.modeling_ministral3").get_llama_4_attn_scale


@pytest.mark.parametrize("positions", [torch.arange(40), torch.stack([torch.arange(40), torch.arange(40) + 13])])
@pytest.mark.parametrize("rotary_dim", [16, 8])
def test_rotate_is_ropes_times_transformers_scale(positions, rotary_dim):
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 3, 40, 16, generator=g) for _ in range(2))
    options = {"base": 1e6, "rotary_dim": rotary_dim,
               "scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}}
    scaled = QueryScaledRoPE(16, llama_4_scaling_beta=0.1, original_max_position_embeddings=8, **options)
    q_scaled, k_scaled = scaled.rotate(q, k, positions, positions)
    q_rope, k_rope = posenc.RoPE(16, **options).rotate(q, k, positions, positions)
    rows = positions if positions.dim() == 2 else positions[None]
    tau = get_llama_4_attn_scale(rows, 0.1, 8)  # (B or 1, 1, T, 1), float32
    torch.testing.assert_close(q_scaled, q_rope * tau, rtol=1e-6, atol=1e-6)  # the unrotated dimensions too
    assert torch.equal(k_scaled, k_rope)
    assert float(tau.max()) > 1.1  # positions up to 52, 8 per step: the check can fail


def test_the_scale_is_one_below_the_original_length_and_steps_there():
    tau = llama_4_attn_scale(torch.tensor([0, 16383, 16384, 32767, 32768, 262143]), beta=0.1,
                             original_max_position_embeddings=16384)
    want = torch.tensor([1.0, 1.0, 1.0 + 0.1 * torch.log(torch.tensor(2.0, dtype=torch.float64)),
                         1.0 + 0.1 * torch.log(torch.tensor(2.0, dtype=torch.float64)),
                         1.0 + 0.1 * torch.log(torch.tensor(3.0, dtype=torch.float64)),
                         1.0 + 0.1 * torch.log(torch.tensor(16.0, dtype=torch.float64))], dtype=torch.float64)
    torch.testing.assert_close(tau, want, rtol=0, atol=1e-15)


def test_beta_zero_is_rope():
    g = torch.Generator().manual_seed(1)
    q, k = (torch.randn(1, 2, 30, 16, generator=g) for _ in range(2))
    positions = torch.arange(30) * 1000
    a = QueryScaledRoPE(16, llama_4_scaling_beta=0.0, original_max_position_embeddings=8).rotate(q, k, positions, positions)
    b = posenc.RoPE(16).rotate(q, k, positions, positions)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("kwargs, named", [
    ({"llama_4_scaling_beta": -0.1}, "llama_4_scaling_beta"),
    ({"llama_4_scaling_beta": float("nan")}, "llama_4_scaling_beta"),
    ({"original_max_position_embeddings": 0}, "original_max_position_embeddings"),
    ({"original_max_position_embeddings": 8.5}, "original_max_position_embeddings"),
])
def test_bad_options_are_refused_by_name(kwargs, named):
    with pytest.raises(ValueError, match=named):
        QueryScaledRoPE(16, **kwargs)


def test_to_hf_dict_carries_beta_in_the_rope_dict():
    scaled = QueryScaledRoPE(16, base=1e6, llama_4_scaling_beta=0.1, original_max_position_embeddings=16384,
                             scaling={"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 16384})
    fields = scaled.to_hf_dict()
    params = fields.get("rope_parameters") or fields["rope_scaling"]
    assert params["llama_4_scaling_beta"] == 0.1 and params["original_max_position_embeddings"] == 16384
    plain = QueryScaledRoPE(16, llama_4_scaling_beta=0.2, original_max_position_embeddings=64).to_hf_dict()
    assert plain["rope_scaling"] == {"rope_type": "default", "llama_4_scaling_beta": 0.2,
                                     "original_max_position_embeddings": 64}
