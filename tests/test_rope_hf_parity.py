"""Parity with Hugging Face transformers' own RoPE functions (optional: skipped without it).

Install with ``pip install posenc[interop]``. Compares inv_freq and attention_factor for
every rope_type, and the cos/sin of the model's rotary embedding module (which applies
dynamic-NTK and longrope length switching at run time) for each fixture config.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import AutoConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

import posenc  # noqa: E402
from posenc.rope import from_hf_config  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"
# Hugging Face computes in float32 (base ** (arange / d) in float32); posenc rounds once from float64.
RTOL = 2e-6


def hf_config(head_dim, base, max_pos, rope_parameters, prf=None):
    params = {"rope_theta": base, **rope_parameters}
    if prf is not None:
        params["partial_rotary_factor"] = prf
    return AutoConfig.for_model("llama", hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim,
                                max_position_embeddings=max_pos, rope_parameters=params)


LR = {"rope_type": "longrope", "short_factor": [1.0 + 0.05 * i for i in range(16)],
      "long_factor": [1.5 + 0.5 * i for i in range(16)], "original_max_position_embeddings": 256}
CASES = [  # (rope_parameters, max_position_embeddings, seq_lens)
    ({"rope_type": "linear", "factor": 4.0}, 1024, [None]),
    ({"rope_type": "dynamic", "factor": 4.0}, 256, [None, 100, 256, 257, 1000, 4096]),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}, 1024, [None]),
    ({"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 4096, "beta_fast": 64.0,
      "beta_slow": 2.0, "truncate": False}, 65536, [None]),
    ({"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 1.0,
      "mscale_all_dim": 0.707}, 163840, [None]),
    ({"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096, "attention_factor": 1.3}, 32768, [None]),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192}, 131072, [None]),
    # Llama 4 Scout: no band between the two wavelengths, a step (transformers warns, computes)
    ({"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0,
      "original_max_position_embeddings": 8192}, 10485760, [None]),
    ({**LR, "factor": 8.0}, 2048, [None, 256, 257]),
    ({**LR, "attention_factor": 1.2}, 2048, [None, 300]),
]


@pytest.mark.parametrize("base", [10000.0, 500000.0])
@pytest.mark.parametrize(("params", "max_pos", "seq_lens"), CASES)
def test_inv_freq_and_attention_factor_match_transformers(params, max_pos, seq_lens, base):
    config = hf_config(32, base, max_pos, params)
    ours_scaling = dict(params)
    if params["rope_type"] == "dynamic":
        ours_scaling["original_max_position_embeddings"] = max_pos  # HF reads L0 from max_position_embeddings
    for seq_len in seq_lens:
        hf_inv, hf_af = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, "cpu", seq_len=seq_len)
        inv, af = posenc.rope_frequencies(32, base=base, scaling=ours_scaling, seq_len=seq_len)
        torch.testing.assert_close(inv, hf_inv.float(), rtol=RTOL, atol=0)
        assert af == pytest.approx(float(hf_af), rel=1e-12)


def test_partial_rotary_matches_transformers():
    config = hf_config(64, 10000.0, 1024, {"rope_type": "linear", "factor": 2.0}, prf=0.5)
    hf_inv, _ = ROPE_INIT_FUNCTIONS["linear"](config, "cpu")
    rope = posenc.RoPE(64, partial_rotary_factor=0.5, scaling={"rope_type": "linear", "factor": 2.0})
    torch.testing.assert_close(rope.inv_freq, hf_inv.float(), rtol=RTOL, atol=0)


@pytest.mark.parametrize("factor", [2.0, 4.0, 8.0])
def test_ntk_matches_transformers_dynamic_at_factor_one(factor):
    """Static NTK is not a transformers rope_type; it equals HF dynamic with factor 1 at L = s * L0."""
    config = hf_config(32, 10000.0, 512, {"rope_type": "dynamic", "factor": 1.0})
    hf_inv, _ = ROPE_INIT_FUNCTIONS["dynamic"](config, "cpu", seq_len=int(factor * 512))
    inv, _ = posenc.rope_frequencies(32, scaling={"rope_type": "ntk", "factor": factor})
    torch.testing.assert_close(inv, hf_inv.float(), rtol=RTOL, atol=0)


def _hf_rotary_module(config):
    model_type = config.model_type
    module = __import__(f"transformers.models.{model_type}.modeling_{model_type}", fromlist=["x"])
    cls = next(getattr(module, n) for n in dir(module) if n.endswith("RotaryEmbedding") and not n.startswith("_"))
    return cls(config=config)


@pytest.mark.parametrize("name", ["llama2_7b", "llama3_1_8b", "qwen2_5_7b_instruct_yarn", "phi3_5_mini_instruct_longrope"])
def test_fixture_cos_sin_match_the_transformers_rotary_module(name):
    fields = json.loads((FIXTURES / f"{name}.json").read_text())
    fields.pop("_comment")
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    hf = _hf_rotary_module(config)
    rope = from_hf_config(json.loads((FIXTURES / f"{name}.json").read_text()))
    torch.testing.assert_close(rope.inv_freq, hf.inv_freq.float(), rtol=RTOL, atol=0)
    assert rope.attention_factor == pytest.approx(float(hf.attention_scaling), rel=1e-12)
    original = rope.scaling["original_max_position_embeddings"] if rope.scaling else 4096
    for length in (64, original + 8):  # longrope switches to the long factors past L0
        positions = torch.arange(length)
        x = torch.zeros(1, length, rope.head_dim)
        hf_cos, hf_sin = hf(x, positions.unsqueeze(0))
        cos, sin = rope.cos_sin(positions)
        # angles up to ~L0 rad in float32 on HF's side: compare with an absolute tolerance
        tol = 2e-6 * max(length, 64)
        torch.testing.assert_close(cos, hf_cos[0], rtol=0, atol=tol)
        torch.testing.assert_close(sin, hf_sin[0], rtol=0, atol=tol)


def test_dynamic_module_matches_rerotate_for_a_fresh_forward():
    """HF's dynamic_rope_update recomputes inv_freq for a forward longer than L0: same as rerotate."""
    config = hf_config(32, 10000.0, 128, {"rope_type": "dynamic", "factor": 4.0})
    hf = _hf_rotary_module(config)
    rope = posenc.RoPE(32, scaling={"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 128})
    for length in (100, 300):
        positions = torch.arange(length)
        hf_cos, hf_sin = hf(torch.zeros(1, length, 32), positions.unsqueeze(0))
        cos, sin = rope.cos_sin(positions)
        torch.testing.assert_close(cos, hf_cos[0], rtol=0, atol=1e-4)
        torch.testing.assert_close(sin, hf_sin[0], rtol=0, atol=1e-4)


def test_dynamic_token_by_token_decoding_matches_frozen():
    """HF decoding one token at a time (cache of rotated keys): the token at p gets freq(p + 1)."""
    config = hf_config(32, 10000.0, 16, {"rope_type": "dynamic", "factor": 4.0})
    hf = _hf_rotary_module(config)
    rope = posenc.RoPE(32, scaling={"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 16},
                       dynamic_cache="frozen")
    cos_all, _ = rope.cos_sin(torch.arange(40))
    for p in range(40):
        hf_cos, _ = hf(torch.zeros(1, 1, 32), torch.tensor([[p]]))
        torch.testing.assert_close(cos_all[p], hf_cos[0, 0], rtol=0, atol=1e-5)
    assert math.isfinite(float(cos_all.sum()))
