"""posenc inside Hugging Face decoders: tiny random models built from configs (no downloads).

References are transformers' own models: the same weights with their own RoPE and attention.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import posenc  # noqa: E402
from posenc.integrations.transformers import extend_context, use_encoding  # noqa: E402
from posenc.rope import from_hf_config  # noqa: E402

SIZES = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=8,
             num_key_value_heads=2, max_position_embeddings=32)

ROPE_PARAMETERS = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0},
    "yarn": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32},
    "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
    "longrope": {"rope_type": "longrope", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32,
                 "short_factor": [1.0 + 0.05 * i for i in range(4)], "long_factor": [1.5 + 0.5 * i for i in range(4)]},
}


def build(family: str = "llama", rope_parameters: dict | None = None, **overrides):
    config_class = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
                    "mistral": transformers.MistralConfig}[family]
    model_class = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM,
                   "mistral": transformers.MistralForCausalLM}[family]
    sizes = {**SIZES, **overrides}
    if rope_parameters is not None:
        sizes["rope_parameters"] = dict(rope_parameters)
    config = config_class(**sizes, attn_implementation="sdpa")
    torch.manual_seed(0)
    return model_class(config).eval()


def tokens(batch: int = 2, length: int = 24, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, SIZES["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(seed))


def copy_of(model):
    clone = type(model)(model.config.__class__.from_dict(model.config.to_dict()))
    clone.load_state_dict(model.state_dict())
    clone.config._attn_implementation = model.config._attn_implementation
    return clone.eval()


class AttendedRoPE(posenc.RoPE):
    """RoPE whose rotate is its own method: it takes posenc's attention route, not the rotary one."""

    def rotate(self, q, k, q_positions, k_positions):
        return super().rotate(q, k, q_positions, k_positions)


@pytest.mark.parametrize("rope_type", list(ROPE_PARAMETERS))
def test_model_with_posenc_rope_matches_its_own_rope(rope_type):
    reference = build(rope_parameters=ROPE_PARAMETERS[rope_type])
    model = use_encoding(copy_of(reference), from_hf_config(reference.config.to_dict()))
    x = tokens(length=48 if rope_type in ("dynamic", "longrope") else 24)  # past L0: the long regime
    with torch.no_grad():
        expected, got = reference(x).logits, model(x).logits
    assert (got - expected).abs().max() < 1e-5
    generated = model.generate(x[:, :8], max_new_tokens=6, do_sample=False)
    assert torch.equal(generated, reference.generate(x[:, :8], max_new_tokens=6, do_sample=False))


@pytest.mark.parametrize("family", ["qwen2", "mistral"])
def test_other_families_with_posenc_rope(family):
    reference = build(family)
    model = use_encoding(copy_of(reference), from_hf_config(reference.config.to_dict()))
    x = tokens()
    with torch.no_grad():
        assert (model(x).logits - reference(x).logits).abs().max() < 1e-5


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
def test_posenc_attention_route_matches_the_model(family):
    """The AttentionInterface route (GQA without repeat, the model's scaling, masks, key positions)
    with RoPE applied by posenc.attention equals the model's own RoPE + SDPA."""
    reference = build(family)
    rope = from_hf_config(reference.config.to_dict())
    model = use_encoding(copy_of(reference), AttendedRoPE(rope.head_dim, base=rope.base))
    assert model.config._attn_implementation == "posenc"
    x = tokens()
    with torch.no_grad():
        assert (model(x).logits - reference(x).logits).abs().max() < 1e-5
    assert torch.equal(model.generate(x[:, :8], max_new_tokens=6, do_sample=False),
                       reference.generate(x[:, :8], max_new_tokens=6, do_sample=False))


@pytest.mark.parametrize("route", ["rotary", "attention"])
def test_left_padded_rows_equal_their_unpadded_logits(route):
    reference = build()
    rope = from_hf_config(reference.config.to_dict())
    encoding = rope if route == "rotary" else AttendedRoPE(rope.head_dim, base=rope.base)
    model = use_encoding(copy_of(reference), encoding)
    x = tokens(batch=2, length=12)
    pad = 5
    padded = torch.cat((torch.zeros(1, pad, dtype=torch.long), x[1:, : 12 - pad]), dim=1)
    batch = torch.cat((x[:1], padded))
    mask = torch.ones_like(batch)
    mask[1, :pad] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(batch, attention_mask=mask, position_ids=positions).logits
        alone = model(x[1:, : 12 - pad]).logits
    assert (logits[1, pad:] - alone[0]).abs().max() < 1e-5
    out = model.generate(batch, attention_mask=mask, max_new_tokens=5, do_sample=False)
    out_alone = model.generate(x[1:, : 12 - pad], max_new_tokens=5, do_sample=False)
    assert torch.equal(out[1, 12:], out_alone[0, 12 - pad:])


@pytest.mark.parametrize("name", ["alibi", "t5", "kerple", "fire", "sinusoidal", "xpos", "shaw", "cope"])
def test_bias_and_other_encodings_train_and_generate_with_the_cache(name):
    model = use_encoding(build(), name)
    model.train()
    assert any(n.startswith("model.posenc_encoding") for n, _ in model.named_parameters()) or name in (
        "alibi", "sinusoidal", "xpos")
    batch = tokens(batch=4, length=16, seed=3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        loss = model(batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    model.eval()
    prompt = batch[:2, :6]
    cached = model.generate(prompt, max_new_tokens=6, do_sample=False, use_cache=True)
    uncached = model.generate(prompt, max_new_tokens=6, do_sample=False, use_cache=False)
    assert torch.equal(cached, uncached)


def test_encoding_parameters_are_saved_and_loaded(tmp_path):
    model = use_encoding(build(), "t5")
    with torch.no_grad():
        model.model.posenc_encoding.relative_attention_bias.weight.normal_()
    x = tokens()
    with torch.no_grad():
        expected = model(x).logits
    model.save_pretrained(tmp_path)
    loaded = use_encoding(transformers.LlamaForCausalLM.from_pretrained(tmp_path), "t5").eval()
    loaded.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert (loaded(x).logits - expected).abs().max() < 1e-6
    state = transformers.LlamaForCausalLM.from_pretrained(tmp_path, output_loading_info=True)[1]
    assert any("posenc_encoding" in key for key in state["unexpected_keys"])


@pytest.mark.parametrize("rope_type", ["linear", "ntk", "dynamic", "yarn", "llama3"])
def test_extend_context_survives_a_plain_save_and_load(rope_type, tmp_path):
    model = extend_context(build(), rope_type, 4.0)
    x = tokens(length=80)  # well past the original 32 positions
    with torch.no_grad():
        extended = model(x).logits
    model.save_pretrained(tmp_path)
    plain = transformers.LlamaForCausalLM.from_pretrained(tmp_path, attn_implementation="sdpa").eval()
    assert not isinstance(plain.model.rotary_emb, torch.nn.Identity)
    with torch.no_grad():
        assert (plain(x).logits - extended).abs().max() < 1e-5
    with torch.no_grad():
        unscaled = build()(x).logits
    assert (unscaled - extended).abs().max() > 1e-3  # the scaling changed something


@pytest.mark.parametrize("rope_type", ["dynamic", "yarn"])
def test_extend_context_of_a_config_whose_head_dim_is_none_loads_plainly(rope_type, tmp_path):
    # Mixtral's config class keeps head_dim None; transformers' dynamic and yarn read
    # getattr(config, "head_dim", ...) without the model's `or` fallback, so the width is written
    config = transformers.MixtralConfig(**SIZES, num_local_experts=2, num_experts_per_tok=1,
                                        attn_implementation="sdpa")
    assert config.head_dim is None
    torch.manual_seed(0)
    model = extend_context(transformers.MixtralForCausalLM(config).eval(), rope_type, 4.0)
    assert model.config.head_dim == SIZES["hidden_size"] // SIZES["num_attention_heads"]
    x = tokens(length=80)
    with torch.no_grad():
        extended = model(x).logits
    model.save_pretrained(tmp_path)
    plain = transformers.MixtralForCausalLM.from_pretrained(tmp_path, attn_implementation="sdpa").eval()
    assert plain.config.rope_parameters["rope_type"] == rope_type
    with torch.no_grad():
        assert (plain(x).logits - extended).abs().max() < 1e-5


def test_bad_models_and_encodings_are_refused():
    with pytest.raises(ValueError, match="rotary_emb"):
        use_encoding(torch.nn.Linear(2, 2), "alibi")
    with pytest.raises(ValueError, match="head_dim"):
        use_encoding(build(), posenc.create("rope", head_dim=16))
    with pytest.raises(ValueError, match="already scaled"):
        extend_context(build(rope_parameters=ROPE_PARAMETERS["linear"]), "yarn", 2.0)
    with pytest.raises(ValueError, match="FoX has the gate hook"):
        use_encoding(build(), "fox")


@pytest.mark.parametrize("name", ["alibi", "t5"])
def test_packed_rows_equal_their_documents_alone(name):
    """Packing (DataCollatorWithFlattening's position_ids, restarting per document, no
    attention_mask): transformers builds the block-diagonal mask, posenc reads the positions."""
    model = use_encoding(build(), name).eval()
    first, second = tokens(batch=1, length=7, seed=4), tokens(batch=1, length=9, seed=5)
    packed = torch.cat((first, second), dim=1)
    positions = torch.cat((torch.arange(7), torch.arange(9))).unsqueeze(0)
    with torch.no_grad():
        logits = model(packed, position_ids=positions, use_cache=False).logits
        alone = [model(first).logits, model(second).logits]
    assert (logits[:, :7] - alone[0]).abs().max() < 1e-5
    assert (logits[:, 7:] - alone[1]).abs().max() < 1e-5


def test_extend_context_leaves_the_config_as_it_was_when_it_refuses():
    model = build()
    before = model.config.to_dict()
    with pytest.raises(ValueError, match="beta_fast"):
        extend_context(model, "yarn", 4.0, beta_fast=-1.0)
    assert model.config.to_dict() == before
