"""Any posenc encoding by name on the adapter families (GPT-2, OPT, BLOOM, MPT, Falcon with
rotary and with ALiBi, T5 encoder and decoder): issue 21, item 2(b), and use_encoding's
idempotence and atomicity there.

Tiny random models (std 0.2, float32, no downloads) from tests/test_position_plan_other.py's
configs. The references are independent of the code under test: transformers' own attention
(the model as built, or fed a zero bias through its own ALiBi / bucket code), and the loss and
greedy tokens of full forwards without a cache.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import posenc  # noqa: E402
from posenc.errors import InvalidArgument, InvalidType  # noqa: E402
from posenc.hf_config import position_plan  # noqa: E402
from posenc.hf_config.plan import LayerPlan, PositionPlan  # noqa: E402
from posenc.integrations.adapters import ADAPTERS, RotaryEmbedding, ZeroPositions, adapter_of  # noqa: E402
from posenc.integrations.transformers import extend_context, use_encoding  # noqa: E402
from test_integration_families import plain_reload_logits  # noqa: E402
from test_position_plan_other import gpt2_position_ids, left_padded_mask, model_of  # noqa: E402

#: The adapter families as test_position_plan_other builds them (Falcon twice: rotary and ALiBi).
NAMES = ["gpt2", "opt", "bloom", "mpt", "falcon_rope", "falcon_alibi", "t5"]
#: The families issue 34 gave an existing adapter (GPT-2's, T5's).
ADOPTED = ["gpt_bigcode", "switch_transformers", "biogpt", "umt5"]
#: The encoder-decoders of T5's adapter.
T5_KIN = ("t5", "switch_transformers", "umt5")
#: transformers 5.24's generate() sizes T5's cache by num_layers: as many decoder as encoder layers.
T5_GENERATE = {"num_decoder_layers": 2}

#: (encoding, layers): "last" is the last self-attention layer (T5: of the decoder).
B_CASES = [("rope", None), ("alibi", None), ("t5", "last"), ("nope", "last"), ("kerple", None), ("fire", "last"),
           ("alibi", "first"), ("sinusoidal", None), ("learned", None)]


def _model(name, **overrides):
    return model_of(name, **({**T5_GENERATE, **overrides} if name in T5_KIN else overrides))


def _layer_count(model):
    return sum(len(stack.attentions) for stack in adapter_of(model).stacks(model))


def _batch(name, seed=3):
    ids = torch.randint(3, 128, (4, 12), generator=torch.Generator().manual_seed(seed))
    if name in T5_KIN:
        return dict(input_ids=ids, labels=ids.flip(-1)[:, :8].contiguous())
    return dict(input_ids=ids, labels=ids)


def _train(model, batch, steps=4):
    """The losses of ``steps`` AdamW steps on one fixed batch (as test_integration_families')."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(steps):
        loss = model(**batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("name", NAMES + ADOPTED)
@pytest.mark.parametrize("encoding,layers", B_CASES)
def test_encodings_by_name_on_adapter_families_train_and_generate_with_the_cache(name, encoding, layers):
    """Item 2(b) for the adapter families: the encoding replaces the family's positions on every
    layer or the layers named, the model trains (the loss falls over 4 AdamW steps on a fixed
    batch), and generate() with the cache gives the tokens and logits of generate() without it
    (each greedy token the argmax of a full forward)."""
    model = _model(name)
    count = _layer_count(model)
    chosen = {"last": [count - 1], "first": [0], None: None}[layers]
    use_encoding(model, encoding, layers=chosen)
    model.train()
    losses = _train(model, _batch(name))
    assert losses[-1] < losses[0], losses
    model.eval()
    prompt = _batch(name, seed=5)["input_ids"][:2, :6]
    options = dict(max_new_tokens=5, do_sample=False, output_logits=True, return_dict_in_generate=True,
                   pad_token_id=0)
    with torch.no_grad():
        cached = model.generate(prompt, use_cache=True, **options)
        uncached = model.generate(prompt, use_cache=False, **options)
    assert torch.equal(cached.sequences, uncached.sequences)
    assert (torch.stack(cached.logits) - torch.stack(uncached.logits)).abs().max() < 1e-4


@pytest.mark.parametrize("name", ["gpt2", "opt", "bloom", "falcon_rope", "falcon_alibi"])
@pytest.mark.parametrize("encoding", ["alibi", "rope"])
def test_left_padded_generation_with_the_cache_equals_without(name, encoding):
    """Left padding (the families whose positions follow the mask; MPT's do not): generate()
    with the cache gives the tokens of generate() without it, and the padded row's real tokens
    the logits of the same row unpadded."""
    model = use_encoding(model_of(name), encoding)
    ids = torch.randint(3, 128, (2, 10), generator=torch.Generator().manual_seed(1))
    mask = left_padded_mask([10, 6], 10)
    options = dict(max_new_tokens=5, do_sample=False, pad_token_id=0, attention_mask=mask)
    with torch.no_grad():
        assert torch.equal(model.generate(ids, use_cache=True, **options),
                           model.generate(ids, use_cache=False, **options))
        extra = {"position_ids": gpt2_position_ids(mask)} if name == "gpt2" else {}
        padded = model(ids, attention_mask=mask, **extra).logits[1, 4:]
        alone = model(ids[1:, 4:]).logits[0]
    assert (padded - alone).abs().max() <= 1e-5


def _own_encoding(name, model):
    """The family's own positions as one posenc encoding given to use_encoding (the encoding
    route, posenc's attention), with the model's own numbers: GPT-2's and OPT's tables copied."""
    plan = position_plan(model.config)
    if plan.embedding is not None:
        table = posenc.LearnedAbsolute(plan.embedding.weight.shape[0] - plan.embedding.offset,
                                       plan.embedding.weight.shape[1], offset=plan.embedding.offset)
        with torch.no_grad():
            owner, attribute = adapter_of(model).table(model)  # the family's own table, where its adapter finds it
            table.weight.copy_(getattr(owner, attribute).weight)
        return table
    return plan[0].encoding


@pytest.mark.parametrize("name", ["gpt2", "opt", "bloom", "mpt", "falcon_rope", "falcon_alibi", "gpt_bigcode", "biogpt"])
def test_the_encoding_route_with_the_familys_own_encoding_reproduces_the_model(name):
    """The family's own positions given as an encoding (not a plan) run through posenc's
    attention (BLOOM, MPT, Falcon: the replaced attention forward; GPT-2, OPT: transformers'
    AttentionInterface) with left padding: the model's own logits, so the route's q/k/v, scale,
    positions, mask and output projection are the model's; a wrong encoding moves them."""
    model, reference = model_of(name), model_of(name)
    if name == "falcon_alibi":  # transformers' eager Falcon adds its ALiBi twice (keyword and mask), sdpa once
        model.config._attn_implementation = reference.config._attn_implementation = "sdpa"
    ids = torch.randint(3, 128, (2, 20), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 20, dtype=torch.long) if name == "mpt" else left_padded_mask([20, 14], 20)
    extra = {"position_ids": gpt2_position_ids(mask)} if name in ("gpt2", "gpt_bigcode") else {}
    real = mask.bool()
    with torch.no_grad():
        expected = reference(ids, attention_mask=mask, **extra).logits
        use_encoding(model, _own_encoding(name, model))
        difference = (model(ids, attention_mask=mask, **extra).logits - expected).abs()[real].max().item()
        assert difference <= 1e-5, difference
        use_encoding(model, "nope")
        assert (model(ids, attention_mask=mask, **extra).logits - expected).abs()[real].max() > 1e-2


@pytest.mark.parametrize("name", ["bloom", "mpt", "falcon_alibi", "t5", "switch_transformers", "umt5"])
def test_nope_by_name_equals_the_models_own_attention_with_a_zero_bias(name):
    """NoPE by name through posenc's attention equals transformers' own attention given a zero
    position bias (ALiBi slopes 0 through the family's own bias code; T5: its bucket table
    zeroed), an independent reference for the replaced attention."""
    model, reference = model_of(name), model_of(name)
    ids = torch.randint(3, 128, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        if name in T5_KIN:
            for stack in (reference.encoder, reference.decoder):  # every table (UMT5: one per layer)
                for block in stack.block:
                    if block.layer[0].SelfAttention.has_relative_attention_bias:
                        block.layer[0].SelfAttention.relative_attention_bias.weight.zero_()
            x = dict(input_ids=ids, decoder_input_ids=ids[:, :7])
        else:
            own = position_plan(reference.config)[0].encoding
            zero = posenc.ALiBi(own.num_heads, slopes=own.slope_formula, scale=own.scale)
            zero.slopes.zero_()
            use_encoding(reference, PositionPlan(tuple(LayerPlan(zero) for _ in range(2)), model_type=reference.config.model_type))
            x = dict(input_ids=ids)
        expected = reference(**x).logits
        use_encoding(model, "nope")
        assert (model(**x).logits - expected).abs().max() <= 1e-5


def test_t5_layers_count_the_encoder_first_then_the_decoder():
    """T5: ``layers=`` indexes the self-attention layers of the encoder (0 .. E-1), then of the
    decoder (E .. E+D-1); cross-attention has no positions. With E = 2, D = 3, layer 2 is the
    decoder's first: the encoder's output is unchanged, the decoder's logits move."""
    model, reference = model_of("t5"), model_of("t5")
    ids = torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    x = dict(input_ids=ids, decoder_input_ids=ids[:, :6])
    use_encoding(model, "alibi", layers=[2])
    assert "_posenc_encoding" in model.decoder.block[0].layer[0].SelfAttention.__dict__
    assert not any("_posenc_encoding" in block.layer[0].SelfAttention.__dict__ for block in model.encoder.block)
    assert "_posenc_encoding" not in model.decoder.block[1].layer[0].SelfAttention.__dict__
    with torch.no_grad():
        ours, theirs = model(**x), reference(**x)
    assert (ours.encoder_last_hidden_state - theirs.encoder_last_hidden_state).abs().max() <= 1e-6
    assert (ours.logits - theirs.logits).abs().max() > 1e-2
    # the encoder takes a bidirectional encoding, the decoder a causal one, when built by name
    use_encoding(model, "t5")
    encodings = list(model.posenc_encoding)
    assert [e.bidirectional for e in encodings] == [True, False]
    with pytest.raises(InvalidArgument, match=r"layers: 5 is not a layer index in \[0, 5\)"):
        use_encoding(model, "alibi", layers=[5])


def test_gpt2_layers_keep_the_input_table_and_all_layers_replace_it():
    """GPT-2's positions are a table added to the input, not per layer: with ``layers=`` the
    layers named take the encoding and the table stays; without, the table goes (RoPE alone
    then positions the model: its logits no longer depend on wpe)."""
    model = model_of("gpt2")
    ids = torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    wpe = model.transformer.wpe
    use_encoding(model, "rope", layers=[1])
    assert model.transformer.wpe is wpe
    use_encoding(model, "rope")
    assert isinstance(model.transformer.wpe, ZeroPositions)
    with torch.no_grad():
        before = model(ids).logits
        wpe.weight.normal_(std=0.2)  # the model's own table, no longer read
        assert torch.equal(model(ids).logits, before)
        use_encoding(model, position_plan(model.config))  # the family's own again: its table is read
        assert model.transformer.wpe.weight is wpe.weight
        assert (model(ids).logits - before).abs().max() > 1e-2


@pytest.mark.parametrize("name", NAMES)
def test_use_encoding_again_replaces_never_stacks(name):
    """A second use_encoding replaces the first: the family's own plan after another encoding
    gives the model's own logits, and applying it twice leaves the hooks of once."""
    model, reference = model_of(name), model_of(name)
    ids = torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    x = dict(input_ids=ids, decoder_input_ids=ids[:, :6]) if name == "t5" else dict(input_ids=ids)
    with torch.no_grad():
        expected = reference(**x).logits
        use_encoding(model, "rope")
        use_encoding(model, position_plan(model.config))
        hooks = [len(m._forward_pre_hooks) for m in model.modules()]
        once = model(**x).logits
        use_encoding(model, position_plan(model.config))
        assert [len(m._forward_pre_hooks) for m in model.modules()] == hooks
        twice = model(**x).logits
    assert (once - expected).abs().max() <= 1e-5
    assert torch.equal(once, twice)
    assert model.config._attn_implementation == reference.config._attn_implementation


def test_bloom_use_encoding_twice_stacks_no_second_hook():
    model = model_of("bloom")
    base = model.transformer
    use_encoding(model, position_plan(model.config))
    assert len(base._forward_pre_hooks) == 1
    use_encoding(model, position_plan(model.config))
    assert len(base._forward_pre_hooks) == 1
    use_encoding(model, "alibi")
    use_encoding(model, "kerple")
    assert len(base._forward_pre_hooks) == 1  # the positions hook of the last call only


def test_t5_plan_refused_midway_leaves_the_model_unchanged():
    """The T5 adapter checks both stacks before changing either: a decoder plan that does not
    fit (bidirectional buckets) is refused after the encoder's fitted, with the model as it was."""
    model = model_of("t5")
    ids = torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    x = dict(input_ids=ids, decoder_input_ids=ids[:, :6])
    with torch.no_grad():
        before = model(**x).logits
    own = position_plan(model.config)
    wrong_decoder = PositionPlan(tuple(LayerPlan(own.encoder[0].encoding) for _ in own), model_type="t5",
                                 encoder=own.encoder)
    with pytest.raises(InvalidArgument, match="not the buckets of the model's decoder"):
        use_encoding(model, wrong_decoder)
    assert "compute_bias" not in model.encoder.block[0].layer[0].SelfAttention.__dict__
    assert not hasattr(model.config, "posenc_plan") and "_posenc_adapter_undo" not in model.__dict__
    with torch.no_grad():
        assert torch.equal(model(**x).logits, before)


@pytest.mark.parametrize("name", NAMES)
def test_what_cannot_work_is_refused_at_use_encoding_naming_family_and_encoding(name):
    model = model_of(name)
    model_type = model.config.model_type
    ids = torch.randint(3, 128, (2, 8), generator=torch.Generator().manual_seed(1))
    x = dict(input_ids=ids, decoder_input_ids=ids[:, :4]) if name == "t5" else dict(input_ids=ids)
    with torch.no_grad():
        before = model(**x).logits
    heads, head_dim = ADAPTERS[model_type].stacks(model)[0].num_heads, ADAPTERS[model_type].stacks(model)[0].head_dim
    refusals = [
        (dict(plan_or_encoding="fox"), InvalidArgument, f"{model_type} .*: fox has the gate hook"),
        (dict(plan_or_encoding=posenc.create("alibi", num_heads=heads + 1)), InvalidArgument,
         f"{model_type} .*ALiBi was built for num_heads={heads + 1}, the model's attention has {heads} query heads"),
        (dict(plan_or_encoding="sinusoidal", layers=[0]), InvalidArgument, f"sinusoidal is an embedding .*{model_type}"),
        (dict(plan_or_encoding="mrope"), InvalidArgument, f"{model_type} .*: mrope reads 3 position axes"),
        (dict(plan_or_encoding=posenc.RoPE(head_dim + 2)), InvalidArgument,
         f"{model_type} .*: RoPE has head_dim={head_dim + 2}, the model's heads {head_dim}"),
        (dict(plan_or_encoding="no_such_encoding"), InvalidArgument, f"{model_type} .*no_such_encoding"),
        (dict(plan_or_encoding=posenc.RoPE(16), base=5.0), InvalidType, "keyword arguments"),
        (dict(plan_or_encoding=position_plan(model.config), layers=[0]), InvalidArgument, "layers"),
        (dict(plan_or_encoding=3.0), InvalidType, "plan_or_encoding"),
    ]
    for arguments, error, message in refusals:
        arguments = dict(arguments)
        with pytest.raises(error, match=message):
            use_encoding(model, arguments.pop("plan_or_encoding"), **arguments)
        assert not hasattr(model.config, "posenc_plan") and "_posenc_adapter_undo" not in model.__dict__
    with torch.no_grad():
        assert torch.equal(model(**x).logits, before)


def test_an_attention_implementation_that_cannot_serve_the_other_layers_is_refused():
    """GPT-2's and T5's layers that keep their own attention run it through posenc's entry:
    sdpa or eager only (an implementation posenc cannot call with its mask is refused, naming
    family and encoding, the model unchanged)."""
    model = model_of("gpt2")
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(InvalidArgument, match="gpt2: alibi: .*'flash_attention_2' cannot serve"):
        use_encoding(model, "alibi", layers=[0])
    assert model.config._attn_implementation == "flash_attention_2" and not hasattr(model.config, "posenc_plan")


def test_a_plan_of_another_kind_is_refused_by_the_plan_adapter():
    """A PositionPlan still goes to the family's plan adapter (its own kinds only): an encoding
    or a name is the way to give another kind."""
    model = model_of("bloom")
    with pytest.raises(InvalidArgument, match="one ALiBi on every layer"):
        use_encoding(model, PositionPlan(tuple(LayerPlan(posenc.RoPE(8)) for _ in range(2))))


@pytest.mark.parametrize("name", ["gpt2", "bloom", "falcon_rope", "t5"])
def test_static_cache_is_refused_at_the_first_call(name):
    model = use_encoding(_model(name), "rope", layers=[_layer_count(_model(name)) - 1])
    with pytest.raises(InvalidArgument, match="StaticCache"):
        model.generate(torch.randint(3, 128, (1, 6)), max_new_tokens=3, do_sample=False, cache_implementation="static",
                       pad_token_id=0)


def test_encoding_parameters_train_and_are_registered_once():
    """The encodings are submodules of the base model (their parameters train and are saved
    once), not of each attention module."""
    model = use_encoding(model_of("mpt"), "kerple")
    names = [n for n, _ in model.named_parameters() if "posenc_encoding" in n]
    assert names and all(n.startswith("transformer.posenc_encoding.") for n in names)
    assert len({id(p) for p in model.parameters()}) == len(list(model.parameters()))
    model.train()
    batch = _batch("mpt")
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "posenc_encoding" in n}
    _train(model, batch, steps=2)
    assert any((p - before[n]).abs().max() > 0 for n, p in model.named_parameters() if n in before)


@pytest.mark.parametrize("name,encoding,layers", [("gpt2", "alibi", [1]), ("gpt2", "rope", None),
                                                  ("opt", "learned", None), ("bloom", "kerple", None),
                                                  ("mpt", "fire", [0]), ("falcon_rope", "t5", None),
                                                  ("t5", "t5", [0, 3]), ("t5", "alibi", None)])
def test_save_and_load_an_encoding_on_an_adapter_family(name, encoding, layers, tmp_path):
    """save_pretrained after use_encoding(name, layers=), then posenc's from_pretrained: the
    same encoding on the same layers with its saved (here perturbed) parameters, the same
    logits. T5's encodings by name (one per stack) are recorded by name and built again."""
    from posenc.integrations.transformers import from_pretrained

    model = use_encoding(_model(name), encoding, layers=layers)
    with torch.no_grad():
        for parameter in model.base_model.posenc_encoding.parameters():
            parameter.normal_(std=0.3)
    ids = torch.randint(3, 128, (2, 10), generator=torch.Generator().manual_seed(1))
    x = dict(input_ids=ids, decoder_input_ids=ids[:, :5]) if name == "t5" else dict(input_ids=ids)
    assert model.config.posenc_plan["applied_layers"] == layers
    with torch.no_grad():
        expected = model(**x).logits
    model.save_pretrained(tmp_path)
    loaded = from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert (loaded(**x).logits - expected).abs().max() <= 1e-5
    assert loaded.base_model.posenc_plan.describe() == model.base_model.posenc_plan.describe()


# ------------------------------------------------------------------------------------ extend_context (item 3)

@pytest.mark.parametrize("method,factor", [("linear", 2.0), ("yarn", 4.0), ("dynamic", 2.0)])
def test_extend_context_on_falcon_rotary_round_trips_through_plain_from_pretrained(method, factor, tmp_path):
    """Falcon with rotary: the scaling is written to its config (rope_parameters, where
    FalconRotaryEmbedding reads it) and the model runs posenc's RoPE of the new config through
    the plan adapter; a plain transformers from_pretrained of the saved folder gives the same
    logits; the extension moved them (the check can fail). Lengths past the original context
    (64 here) so that yarn and dynamic act."""
    model = model_of("falcon_rope", max_position_embeddings=64)
    ids = torch.randint(3, 128, (2, 96), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(ids).logits
    extend_context(model, method, factor)
    assert model.config.rope_parameters["rope_type"] == method
    with torch.no_grad():
        extended = model(ids).logits
    assert (extended - before).abs().max() > 1e-3
    reloaded = plain_reload_logits(model, transformers.FalconForCausalLM, tmp_path, ids, attn="eager")
    assert (reloaded - extended).abs().max() <= 1e-5
    # applied once: the plan adapter's rotary module, nothing stacked
    assert isinstance(model.transformer.rotary_emb, RotaryEmbedding)


@pytest.mark.parametrize("name", ["falcon_alibi", "bloom", "mpt", "gpt2", "opt", "t5"])
def test_extend_context_refuses_families_without_rope_and_changes_nothing(name):
    model = model_of(name)
    config = model.config.to_dict()
    with pytest.raises(InvalidArgument, match="not RoPE on every layer: extend_context scales a RoPE"):
        extend_context(model, "linear", 2.0)
    assert model.config.to_dict() == config and "_posenc_adapter_undo" not in model.__dict__


def test_extend_context_on_falcon_is_atomic():
    """A refusal after the config's scaling is computed (a bad yarn parameter, an already
    scaled RoPE, an encoding applied by use_encoding) leaves model and config unchanged."""
    model = model_of("falcon_rope")
    ids = torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(ids).logits
    config = model.config.to_dict()
    with pytest.raises(InvalidArgument, match="beta_fast"):
        extend_context(model, "yarn", 4.0, beta_fast=-1.0)
    with pytest.raises(InvalidArgument, match="layer_types"):
        extend_context(model, "linear", 2.0, layer_types=["full_attention"])
    assert model.config.to_dict() == config and "_posenc_adapter_undo" not in model.__dict__
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)
    extend_context(model, "linear", 2.0)
    extended = model.config.to_dict()
    with pytest.raises(InvalidArgument, match="already scaled"):
        extend_context(model, "linear", 2.0)
    assert model.config.to_dict() == extended
    other = use_encoding(model_of("falcon_rope"), "alibi")
    config = other.config.to_dict()
    with pytest.raises(InvalidArgument, match="extend before use_encoding"):
        extend_context(other, "linear", 2.0)
    assert other.config.to_dict() == config


def _vaswani_table(length, dim):
    """Vaswani et al. 2017, section 3.5, in float64: PE[p, 2i] = sin(p / 1e4^(2i/d)), PE[p, 2i+1] = cos(.)."""
    p = torch.arange(length, dtype=torch.float64)[:, None]
    angle = p / 10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    return torch.stack((angle.sin(), angle.cos()), dim=-1).reshape(length, dim).float()


@pytest.mark.parametrize("name", ["bloom", "gpt2"])
def test_sinusoidal_is_added_to_the_first_layers_input(name):
    """An embedding encoding goes where the family's positions enter the residual stream: in
    place of GPT-2's table, or (BLOOM: no table) added to the first block's input, the layers'
    own positions removed. The reference adds Vaswani's table (float64 formula) to the same
    place of the family's own model without positions (BLOOM: zero slopes; GPT-2: wpe zeroed)."""
    model, reference = model_of(name), model_of(name)
    ids = torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    d = model.config.hidden_size
    with torch.no_grad():
        if name == "bloom":
            own = position_plan(reference.config)[0].encoding
            zero = posenc.ALiBi(own.num_heads, slopes=own.slope_formula, scale=own.scale)
            zero.slopes.zero_()
            use_encoding(reference, PositionPlan(tuple(LayerPlan(zero) for _ in range(2)), model_type="bloom"))
            reference.transformer.h[0].register_forward_pre_hook(
                lambda module, args: (args[0] + _vaswani_table(args[0].shape[1], d), *args[1:]))
        else:
            reference.transformer.wpe.weight.copy_(_vaswani_table(reference.config.n_positions, d))
        expected = reference(ids).logits
        use_encoding(model, "sinusoidal")
        assert (model(ids).logits - expected).abs().max() <= 1e-5


def test_an_encoding_on_gpt2_runs_in_bfloat16():
    """The replaced table follows the model's dtype (model.to(bfloat16) after use_encoding)."""
    model = use_encoding(model_of("gpt2"), "sinusoidal").to(torch.bfloat16)
    with torch.no_grad():
        assert model(torch.randint(3, 128, (2, 8))).logits.dtype == torch.bfloat16
    model = use_encoding(model_of("bloom").to(torch.bfloat16), "rope")
    with torch.no_grad():
        assert model(torch.randint(3, 128, (2, 8))).logits.dtype == torch.bfloat16
