"""use_encoding on the adapter families (GPT-2, OPT, BLOOM, MPT, Falcon rotary and ALiBi, T5) through the
public entry point, and save_pretrained / from_pretrained of a model after use_encoding.

Tiny random models (std 0.2, float32, no downloads) from the configs of
tests/test_position_plan_other.py and tests/test_integration_families.py; the references are
transformers' own models with the same weights.
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

import posenc  # noqa: E402
from posenc.encodings.irope import AttentionTemperature, ChunkedRoPE  # noqa: E402
from posenc.errors import InvalidArgument, InvalidType  # noqa: E402
from posenc.hf_config import position_plan  # noqa: E402
from posenc.hf_config.plan import LayerPlan, PositionPlan  # noqa: E402
from posenc.integrations.transformers import from_pretrained, use_encoding  # noqa: E402
from test_integration_families import FAMILIES, build, tokens  # noqa: E402
from test_position_plan_other import CONFIGS, gpt2_position_ids, left_padded_mask, model_of, noise_floor  # noqa: E402

#: max |logits - model's own| of use_encoding(model, position_plan(model.config)), measured here
#: (CPU, float32); the test asserts the model's own noise floor and that these still hold.
MEASURED = {"gpt2": 0.0, "opt": 0.0, "bloom": 0.0, "mpt": 0.0, "falcon_rope": 3.58e-07, "falcon_alibi": 0.0,
            "t5": 0.0}


def _inputs(name):
    ids = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 24, dtype=torch.long) if name == "mpt" else left_padded_mask([24, 17], 24)
    extra = {"position_ids": gpt2_position_ids(mask)} if name == "gpt2" else {}
    return ids, mask, extra


@pytest.mark.parametrize("name", ["gpt2", "opt", "bloom", "mpt", "falcon_rope", "falcon_alibi"])
def test_use_encoding_applies_the_read_plan_to_adapter_families(name):
    ids, mask, extra = _inputs(name)
    model = model_of(name)
    keys = set(model.state_dict())
    with torch.no_grad():
        reference = model(ids, attention_mask=mask, **extra).logits
        assert use_encoding(model, position_plan(model.config)) is model
        ours = model(ids, attention_mask=mask, **extra).logits
    difference = (ours - reference).abs()[mask.bool()].max().item()
    print(f"{name}: max |logits - own| = {difference:.3g}")
    assert difference <= noise_floor(name, ids, mask), difference
    assert difference <= max(1e-5, 4 * MEASURED[name])
    assert set(model.state_dict()) == keys  # the family's own keys: save_pretrained writes what it reads
    assert model.config.posenc_plan["layers"] and model.config.posenc_plan["encoding"] is None
    # the plan is what computes the positions: a wrong one moves the logits
    plan = position_plan(model.config)
    if plan.embedding is not None:  # the adapter reads the plan's table (shared with the model's)
        use_encoding(model, plan)
        with torch.no_grad():
            plan.embedding.weight.data = plan.embedding.weight.data.roll(1, dims=0)
    else:
        encoding = plan[0].encoding
        wrong = posenc.RoPE(encoding.head_dim, base=10.0) if isinstance(encoding, posenc.RoPE) \
            else posenc.ALiBi(encoding.num_heads, slopes=encoding.config()["slopes"], scale=4.0)
        use_encoding(model, PositionPlan(tuple(LayerPlan(wrong) for _ in plan), model_type=plan.model_type))
    with torch.no_grad():
        assert (model(ids, attention_mask=mask, **extra).logits - reference).abs().max() > 1e-2


def test_use_encoding_applies_the_read_plan_to_t5():
    model = model_of("t5")
    ids = torch.randint(0, 128, (2, 20), generator=torch.Generator().manual_seed(1))
    decoder_ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        reference = model(input_ids=ids, decoder_input_ids=decoder_ids).logits
        use_encoding(model, position_plan(model.config))
        difference = (model(input_ids=ids, decoder_input_ids=decoder_ids).logits - reference).abs().max().item()
    print(f"t5: max |logits - own| = {difference:.3g}")
    assert difference <= max(1e-5, 4 * MEASURED["t5"])
    assert model.encoder.block[0].layer[0].SelfAttention.compute_bias.__name__ == "compute_bias"
    assert model.config.posenc_plan["encoder"]["layers"][0]["encoding"]["name"] == "t5"


@pytest.mark.parametrize("name", ["gpt2", "bloom", "t5"])
def test_adapter_families_refuse_what_their_plan_adapter_cannot_take(name):
    """A PositionPlan goes to the family's plan adapter, every layer at once and of the
    family's own kind; another kind of encoding, or some layers, is given as an encoding or a
    name (issue 21 item 2(b): tests/test_integration_adapter_encodings.py). (Until then these
    families refused every encoding and name.)"""
    model = model_of(name)
    plan = position_plan(model.config)
    other = PositionPlan(tuple(LayerPlan(posenc.NoPE()) for _ in plan), model_type=plan.model_type,
                         encoder=plan.encoder)
    with pytest.raises(InvalidArgument, match="plan"):
        use_encoding(model, other)
    with pytest.raises(InvalidArgument, match="layers"):
        use_encoding(model, plan, layers=[0])
    with pytest.raises(InvalidType, match="keyword arguments"):
        use_encoding(model, plan, base=5.0)
    assert not hasattr(model.config, "posenc_plan")


# --------------------------------------------------------------------------------------------- to_dict / from_dict


def _all_plans():
    for family, (config_class, _, kwargs, _, _) in FAMILIES.items():
        yield family, position_plan(config_class(**kwargs))
    for name in CONFIGS:
        yield name, position_plan(model_of(name).config)


def test_plan_dict_round_trips_every_family_as_plain_json():
    for name, plan in _all_plans():
        data = json.loads(json.dumps(plan.to_dict()))
        back = PositionPlan.from_dict(data)
        assert back.describe() == plan.describe(), name
        assert back.to_dict() == data, name
        for ours, theirs in zip(back, plan):
            assert type(ours.encoding) is type(theirs.encoding)
            assert (ours.span, ours.window, ours.layer_type, ours.sinks) == \
                (theirs.span, theirs.window, theirs.layer_type, theirs.sinks)
            if isinstance(theirs.encoding, posenc.RoPE):
                positions = torch.arange(40)
                for a, b in zip(ours.encoding.cos_sin(positions, torch.float64),
                                theirs.encoding.cos_sin(positions, torch.float64)):
                    assert torch.equal(a, b)


def test_plan_dict_keeps_shared_instances_and_layer_schedule_encodings():
    irope = posenc.create("irope", head_dim=16, attention_chunk_size=8)
    plan = PositionPlan.uniform(irope, 4)
    back = PositionPlan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert [type(layer.encoding) for layer in back] == [type(layer.encoding) for layer in plan]
    assert any(isinstance(layer.encoding, AttentionTemperature) for layer in back)
    assert any(isinstance(layer.encoding, ChunkedRoPE) for layer in back)
    t5 = posenc.create("t5", num_heads=4)
    back = PositionPlan.from_dict(PositionPlan.uniform(t5, 3).to_dict())
    assert back[0].encoding is back[1].encoding is back[2].encoding  # one set of learned weights


def test_plan_dict_refuses_what_it_cannot_record_or_read():
    class Mine(posenc.RoPE):
        name = "mine"

    with pytest.raises(InvalidArgument, match="Mine.*not a registered"):
        PositionPlan.uniform(Mine(16), 2).to_dict()
    data = PositionPlan.uniform(posenc.RoPE(16), 2).to_dict()
    with pytest.raises(InvalidArgument, match="format"):
        PositionPlan.from_dict({**data, "format": 99})
    data["layers"][0]["encoding"]["name"] = "nonesuch"
    with pytest.raises(InvalidArgument, match="layers\\[0\\].encoding: unknown encoding 'nonesuch'"):
        PositionPlan.from_dict(data)


# --------------------------------------------------------------------------------------------- save / load


def _logits(model, x):
    with torch.no_grad():
        return model(x).logits


def test_save_and_load_the_models_own_rope_plan(tmp_path):
    """The table route: the model's own attention with posenc's rotary tables."""
    model = build("gemma3_text")
    x = tokens()
    expected = _logits(model, x)
    use_encoding(model, position_plan(model.config))
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())["posenc_plan"]
    assert [layer["span"] for layer in saved["layers"]] == ["sliding"] * 3 + ["full"]
    loaded = from_pretrained(tmp_path).eval()
    assert loaded.model.posenc_plan.describe() == position_plan(model.config).describe()
    assert (_logits(loaded, x) - expected).abs().max() <= 1e-5
    # plain transformers: the model's own RoPE, the same logits here
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert not hasattr(plain.model, "posenc_plan")
    assert (_logits(plain, x) - expected).abs().max() <= 1e-5


@pytest.mark.parametrize("name", ["alibi", "t5"])
def test_save_and_load_through_posencs_attention(tmp_path, name):
    """posenc's attention route; T5's bias is learned: its weights must come back."""
    model = build("llama")
    x = tokens()
    own = _logits(model, x)
    use_encoding(model, name)
    if name == "t5":
        with torch.no_grad():
            model.model.posenc_encoding.relative_attention_bias.weight.normal_(std=0.5)
    expected = _logits(model, x)
    assert (expected - own).abs().max() > 5e-2
    model.save_pretrained(tmp_path)
    loaded = from_pretrained(tmp_path).eval()
    assert type(loaded.model.posenc_encoding) is type(model.model.posenc_encoding)
    assert (_logits(loaded, x) - expected).abs().max() <= 1e-5
    # plain transformers: the model's own RoPE; posenc's encoding and its weights are dropped
    plain, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert (_logits(plain.eval(), x) - own).abs().max() <= 1e-5
    if name == "t5":
        assert any("posenc_encoding" in key for key in info["unexpected_keys"])


def test_save_and_load_a_plan_with_layers_and_shared_learned_weights(tmp_path):
    model = build("llama")
    x = tokens()
    t5 = posenc.create("t5", num_heads=4)
    with torch.no_grad():
        t5.relative_attention_bias.weight.normal_(std=0.5)
    plan = PositionPlan((LayerPlan(t5), LayerPlan(t5)))
    use_encoding(model, plan, layers=[1])
    expected = _logits(model, x)
    model.save_pretrained(tmp_path)
    loaded = from_pretrained(tmp_path).eval()
    assert loaded.config.posenc_plan["applied_layers"] == [1]
    assert (_logits(loaded, x) - expected).abs().max() <= 1e-5


@pytest.mark.parametrize("name", ["gpt2", "t5"])
def test_save_and_load_adapter_families(tmp_path, name):
    """The learned tables are the model's own parameters under their own keys: both posenc's
    from_pretrained and plain transformers' load them."""
    model = model_of(name)
    if name == "t5":
        x = dict(input_ids=torch.randint(0, 128, (2, 20), generator=torch.Generator().manual_seed(1)),
                 decoder_input_ids=torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(2)))
    else:
        x = dict(input_ids=tokens())
    use_encoding(model, position_plan(model.config))
    with torch.no_grad():
        expected = model(**x).logits
    model.save_pretrained(tmp_path)
    loaded = from_pretrained(tmp_path).eval()
    assert loaded.base_model.posenc_plan.describe() == position_plan(model.config).describe()
    auto = transformers.AutoModelForSeq2SeqLM if name == "t5" else transformers.AutoModelForCausalLM
    plain = auto.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert (loaded(**x).logits - expected).abs().max() <= 1e-5
        assert (plain(**x).logits - expected).abs().max() <= 1e-5


def test_a_folder_without_a_plan_loads_as_transformers_loads_it(tmp_path):
    model = build("llama")
    model.save_pretrained(tmp_path)
    loaded = from_pretrained(tmp_path)
    assert not hasattr(loaded.model, "posenc_plan") and not hasattr(loaded.config, "posenc_plan")


def test_a_plan_of_ministral3s_query_scaled_rope_round_trips():
    from posenc.encodings.rope.query_scaled import QueryScaledRoPE

    rope = QueryScaledRoPE(16, base=1e6, llama_4_scaling_beta=0.1, original_max_position_embeddings=8,
                           scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8})
    back = PositionPlan.from_dict(json.loads(json.dumps(PositionPlan.uniform(rope, 2).to_dict())))
    assert all(type(layer.encoding) is QueryScaledRoPE for layer in back)
    assert back[0].encoding.config() == rope.config()
    q, k = torch.randn(2, 1, 2, 20, 16).unbind(0)
    positions = torch.arange(20)
    for a, b in zip(back[0].encoding.rotate(q, k, positions, positions), rope.rotate(q, k, positions, positions)):
        assert torch.equal(a, b)
