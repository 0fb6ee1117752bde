"""Position plans of Falcon, BLOOM, MPT, GPT-2, OPT and T5 (posenc.hf_config.families_other),
checked against transformers' own models: tiny random models (std 0.2) built from configs
shaped like the released config.json files, their position terms compared with what posenc's
encodings of the plan compute at the same positions.

ALiBi biases are compared per head and position up to a constant per query row (the softmax
ignores it; transformers adds m * j, posenc -m (i - j)): the model's row minus its value at
the query's own position.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

from posenc.errors import InvalidArgument, MissingKey  # noqa: E402
from posenc.hf_config.families import FAMILIES  # noqa: E402
from posenc.hf_config.families_other import (  # noqa: E402
    plan_biogpt,
    plan_falcon,
    plan_gpt2,
    plan_mpt,
    plan_switch_transformers,
    plan_t5,
    plan_umt5,
)
from transformers.models.bloom.modeling_bloom import _get_alibi_slopes  # noqa: E402
from transformers.models.falcon.modeling_falcon import apply_rotary_pos_emb  # noqa: E402
from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor  # noqa: E402

#: model_type -> reader, from the family records that name one.
FAMILY_READERS = {model_type: family.reader for model_type, family in FAMILIES.items() if family.reader is not None}

# Released configs (falcon-rw-1b, falcon-7b, bloom-560m, mpt-7b, gpt2, opt-125m, t5-small), shrunk.
CONFIGS = {
    "falcon_alibi": {"model_type": "falcon", "alibi": True, "hidden_size": 96, "num_attention_heads": 6,
                     "num_hidden_layers": 2, "multi_query": False, "new_decoder_architecture": False,
                     "parallel_attn": False, "bias": True, "vocab_size": 128, "bos_token_id": 1, "eos_token_id": 2},
    "falcon_rope": {"model_type": "falcon", "alibi": False, "hidden_size": 64, "num_attention_heads": 4,
                    "num_hidden_layers": 2, "multi_query": True, "new_decoder_architecture": False,
                    "parallel_attn": True, "bias": False, "vocab_size": 128, "bos_token_id": 1, "eos_token_id": 2},
    "bloom": {"model_type": "bloom", "hidden_size": 96, "n_head": 12, "n_layer": 2, "vocab_size": 128,
              "apply_residual_connection_post_layernorm": False, "bos_token_id": 1, "eos_token_id": 2,
              "pad_token_id": 3},
    "mpt": {"model_type": "mpt", "d_model": 96, "n_heads": 6, "n_layers": 2, "max_seq_len": 64, "vocab_size": 128,
            "expansion_ratio": 2, "learned_pos_emb": True, "no_bias": True,
            "attn_config": {"alibi": True, "alibi_bias_max": 8, "attn_type": "multihead_attention",
                            "clip_qkv": None, "qk_ln": False, "softmax_scale": None}},
    "gpt2": {"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 64, "n_ctx": 64,
             "vocab_size": 128, "activation_function": "gelu_new"},
    "opt": {"model_type": "opt", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
            "ffn_dim": 128, "max_position_embeddings": 64, "word_embed_proj_dim": 64, "do_layer_norm_before": True,
            "vocab_size": 128, "pad_token_id": 1, "bos_token_id": 2, "eos_token_id": 2},
    "t5": {"model_type": "t5", "d_model": 64, "d_kv": 16, "d_ff": 128, "num_heads": 4, "num_layers": 2,
           "num_decoder_layers": 3, "relative_attention_num_buckets": 32, "vocab_size": 128,
           "feed_forward_proj": "relu", "is_encoder_decoder": True, "decoder_start_token_id": 0},
    # bigcode/starcoderbase-1b's shape, shrunk: multi-query attention
    "gpt_bigcode": {"model_type": "gpt_bigcode", "n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 64,
                    "multi_query": True, "vocab_size": 128, "activation_function": "gelu_pytorch_tanh"},
    # microsoft/biogpt's shape, shrunk
    "biogpt": {"model_type": "biogpt", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
               "intermediate_size": 128, "max_position_embeddings": 64, "scale_embedding": True, "vocab_size": 128,
               "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2},
    # google/switch-base-8's shape, shrunk: every other layer sparse (2 experts)
    "switch_transformers": {"model_type": "switch_transformers", "d_model": 64, "d_kv": 16, "d_ff": 128, "num_heads": 4,
                            "num_layers": 2, "num_decoder_layers": 2, "num_sparse_encoder_layers": 1,
                            "num_sparse_decoder_layers": 1, "num_experts": 2, "expert_capacity": 64,
                            "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128,
                            "vocab_size": 128, "is_encoder_decoder": True, "decoder_start_token_id": 0},
    # google/umt5-small's shape, shrunk: a bucket table in every self-attention layer
    "umt5": {"model_type": "umt5", "d_model": 64, "d_kv": 16, "d_ff": 128, "num_heads": 4, "num_layers": 2,
             "num_decoder_layers": 3, "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128,
             "vocab_size": 128, "feed_forward_proj": "gated-gelu", "is_encoder_decoder": True,
             "decoder_start_token_id": 0},
}
#: The families of T5's reader and adapter (encoder-decoders, built as sequence-to-sequence models).
T5_KIN = ("t5", "switch_transformers", "umt5")


def config_of(name: str, **overrides):
    spec = {**CONFIGS[name], **overrides}
    return transformers.AutoConfig.for_model(spec.pop("model_type"), **spec)


def model_of(name: str, **overrides):
    config = config_of(name, **overrides)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    if config.model_type in T5_KIN:
        model = transformers.AutoModelForSeq2SeqLM.from_config(config)
    else:
        model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for parameter in model.parameters():
            torch.nn.init.normal_(parameter, std=0.2)
    return model.eval()


def left_padded_mask(lengths: list[int], total: int) -> torch.Tensor:
    return torch.stack([torch.cat([torch.zeros(total - n), torch.ones(n)]) for n in lengths]).long()


def mask_positions(mask: torch.Tensor) -> torch.Tensor:
    """Falcon's and BLOOM's ALiBi positions: cumsum(mask) - 1 on real tokens, 0 on padding."""
    return (mask.cumsum(-1) - 1) * mask


def row_normalized(model_bias: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """A model's key-only bias (B, H, Tk) as (B, H, Tq=Tk, Tk) minus each query's own value."""
    own = model_bias.gather(-1, torch.arange(positions.shape[-1]).expand(model_bias.shape)).unsqueeze(-1)
    return model_bias.unsqueeze(-2) - own


def compare_alibi(posenc_bias, model_bias, mask):
    """Max difference over the (query, key) pairs the model attends (real keys up to the
    query), in units of the largest bias there (at least 1): the row normalization itself
    rounds m * j - m * i in float32, a few ulps of the largest value."""
    mask = mask.bool()
    t = mask.shape[-1]
    seen = (torch.ones(t, t, dtype=torch.bool).tril() & mask[:, None, None, :] & mask[:, None, :, None]).expand_as(posenc_bias)
    scale = max(1.0, model_bias.masked_select(seen).abs().max().item())
    return (posenc_bias - model_bias).abs().masked_select(seen).max().item() / scale


def test_every_reader_is_in_the_table_and_reads_the_released_shapes():
    assert set(FAMILY_READERS) >= {"falcon", "bloom", "mpt", "gpt2", "opt", "t5"}
    for name, spec in CONFIGS.items():
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the released shapes need no warning
            raw = FAMILY_READERS[spec["model_type"]](spec)
        config = config_of(name)
        via_object = FAMILY_READERS[spec["model_type"]](config.to_dict())
        assert raw.describe() == via_object.describe()
        assert len(raw) == (config.num_decoder_layers if name in T5_KIN else config.num_hidden_layers)


def test_position_plan_reads_these_families_through_their_readers():
    """The public reader (posenc.integrations.transformers.position_plan) dispatches to them."""
    from posenc.integrations.transformers import position_plan

    for name, spec in CONFIGS.items():
        plan = position_plan(config_of(name))
        assert plan.describe() == FAMILY_READERS[spec["model_type"]](spec).describe(), name
        assert plan.model_type == spec["model_type"]


# --------------------------------------------------------------------------------------------- ALiBi slopes


@pytest.mark.parametrize("num_heads", range(1, 129))
def test_slope_formulas_are_transformers_to_the_bit(num_heads):
    from posenc import ALiBi

    assert torch.equal(ALiBi(num_heads, slopes="bloom").slopes, _get_alibi_slopes(num_heads, "cpu"))
    assert torch.equal(ALiBi(num_heads, slopes="mpt").slopes, -build_mpt_alibi_tensor(num_heads, 2)[:, 0, 0])
    # the same mathematical slopes: Press's rule within a few float32 ulps
    torch.testing.assert_close(ALiBi(num_heads).slopes, _get_alibi_slopes(num_heads, "cpu"), rtol=1e-6, atol=0)


# --------------------------------------------------------------------------------------------- Falcon


def test_falcon_alibi_bias_is_build_alibi_tensor_in_bfloat16_over_sqrt_head_dim():
    model = model_of("falcon_alibi")
    config = model.config
    plan = plan_falcon(config.to_dict())
    encoding = plan[0].encoding
    assert all(layer.encoding is encoding for layer in plan)
    head_dim = config.hidden_size // config.num_attention_heads
    # lengths past 256, where bfloat16 rounds the products and the key positions themselves
    mask = left_padded_mask([300, 271], 300)
    positions = mask_positions(mask)
    model_alibi = transformers.models.falcon.modeling_falcon.build_alibi_tensor(mask, config.num_attention_heads,
                                                                                 torch.float32)
    # FalconModel adds alibi / sqrt(head_dim) to the mask (sdpa) or scales logits + alibi (eager)
    model_bias = row_normalized(model_alibi.view(2, config.num_attention_heads, -1) / math.sqrt(head_dim), positions)
    ours = encoding.score_bias(positions, positions)
    assert compare_alibi(ours, model_bias, mask) < 1e-6
    # bfloat16 rounding matters: float32 slopes miss by far more than the model's noise
    from posenc import ALiBi

    plain = ALiBi(config.num_attention_heads, slopes="bloom", scale=head_dim ** -0.5).score_bias(positions, positions)
    assert compare_alibi(plain, model_bias, mask) > 1e-3


def test_falcon_alibi_bias_reaches_the_models_attention_mask():
    """What FalconModel adds to the logits, read from its forward: the 4-d mask passed to the
    layers holds alibi / sqrt(head_dim) on the attended entries."""
    model = model_of("falcon_alibi")
    plan = plan_falcon(model.config.to_dict())
    seen = {}
    layer = model.transformer.h[0]
    layer.register_forward_pre_hook(lambda module, args, kwargs: seen.update(kwargs), with_kwargs=True)
    mask = left_padded_mask([20, 13], 20)
    model(torch.randint(0, 128, (2, 20)), attention_mask=mask)
    model_mask = seen["attention_mask"]  # (B, H, Tq, Tk)
    positions = mask_positions(mask)
    attended = model_mask > torch.finfo(torch.float32).min / 2
    model_bias = model_mask - model_mask.diagonal(dim1=-2, dim2=-1).unsqueeze(-1)
    ours = plan[0].encoding.score_bias(positions, positions)
    assert (ours - model_bias).abs()[attended & mask.bool()[:, None, :, None]].max() < 1e-5


def test_falcon_rotary_rotates_as_the_model():
    model = model_of("falcon_rope")
    plan = plan_falcon(dict(CONFIGS["falcon_rope"]))
    head_dim = 16
    q, k = torch.randn(2, 4, 40, head_dim), torch.randn(2, 1, 40, head_dim)
    positions = torch.arange(40).expand(2, -1) + torch.tensor([[0], [7]])
    cos, sin = model.transformer.rotary_emb(q, position_ids=positions)
    model_q, model_k = apply_rotary_pos_emb(q, k, cos, sin)
    ours_q, ours_k = plan[0].encoding.rotate(q, k, positions, positions)
    assert (ours_q - model_q).abs().max() < 1e-5 and (ours_k - model_k).abs().max() < 1e-5
    assert (q - model_q).abs().max() > 5e-2  # the positions do move the queries


def test_falcon_refuses_what_falconconfig_does_not_read():
    with pytest.raises(MissingKey, match="n_head"):
        plan_falcon({"model_type": "falcon", "n_head": 4, "hidden_size": 64})
    with pytest.raises(InvalidArgument, match="head_dim"):
        plan_falcon({"model_type": "falcon", "num_attention_heads": 4, "hidden_size": 64, "head_dim": 32})
    with pytest.raises(InvalidArgument, match="model_type"):
        plan_falcon({"model_type": "llama"})
    with pytest.warns(UserWarning, match="partial_rotary_factor"):
        plan = plan_falcon({"model_type": "falcon", "num_attention_heads": 4, "hidden_size": 64,
                            "partial_rotary_factor": 0.5})
    assert plan[0].encoding.rotary_dim == 16


def test_falcon_n_embed_wins_as_in_falconconfig():
    spec = {"model_type": "falcon", "num_attention_heads": 4, "hidden_size": 64, "n_embed": 32, "alibi": True}
    with pytest.warns(UserWarning, match="n_embed"):
        plan = plan_falcon(spec)
    config = transformers.FalconConfig(**{k: v for k, v in spec.items() if k != "model_type"})
    assert plan[0].encoding.scale == config.head_dim ** -0.5


# --------------------------------------------------------------------------------------------- BLOOM


def test_bloom_bias_is_build_alibi_tensor():
    model = model_of("bloom")
    config = model.config
    plan = FAMILY_READERS["bloom"](dict(CONFIGS["bloom"]))
    heads = config.num_attention_heads
    mask = left_padded_mask([200, 150, 31], 200)
    positions = mask_positions(mask)
    model_alibi = model.transformer.build_alibi_tensor(mask, heads, torch.float32).view(3, heads, -1)
    ours = plan[0].encoding.score_bias(positions, positions)
    assert compare_alibi(ours, row_normalized(model_alibi, positions), mask) < 1e-6
    assert ours.shape == (3, heads, 200, 200)


# --------------------------------------------------------------------------------------------- MPT


def test_mpt_bias_is_build_mpt_alibi_tensor_on_the_last_keys():
    model = model_of("mpt")
    config = model.config
    plan = plan_mpt(dict(CONFIGS["mpt"]))
    heads = config.n_heads
    table = model.transformer.build_mpt_alibi_tensor(heads, config.max_seq_len)  # (H, 1, max_seq_len)
    for keys in (1, 17, config.max_seq_len):
        model_bias = table[:, :, config.max_seq_len - keys:]  # MptAttention's slice: (H, 1, keys)
        positions = torch.arange(keys)
        ours = plan[0].encoding.score_bias(positions, positions)  # (H, keys, keys)
        # the model's row for every query, minus its value at the query's own position
        normalized = model_bias.expand(heads, keys, keys) - model_bias.squeeze(1).unsqueeze(-1)
        seen = torch.ones(keys, keys, dtype=torch.bool).tril()
        assert (ours - normalized).abs()[:, seen].max() < 1e-5


def test_mpt_follows_transformers_where_the_config_says_otherwise():
    spec = {**CONFIGS["mpt"], "attn_config": {**CONFIGS["mpt"]["attn_config"], "alibi_bias_max": 16, "alibi": False}}
    with pytest.warns(UserWarning) as caught:
        plan = plan_mpt(spec)
    assert any("alibi_bias_max" in str(w.message) for w in caught)
    assert any("alibi=false" in str(w.message) for w in caught)
    config = transformers.MptConfig(**{k: v for k, v in spec.items() if k != "model_type"})
    torch.manual_seed(0)
    model = transformers.MptForCausalLM(config)
    captured = {}
    model.transformer.blocks[0].attn.register_forward_pre_hook(
        lambda module, args, kwargs: captured.update(kwargs), with_kwargs=True)
    model(torch.randint(0, 128, (1, 8)))
    model_bias = captured["position_bias"][:, :, -8:]
    ours = plan[0].encoding.score_bias(torch.arange(8), torch.arange(8))[:, -1:, :]  # the last query's row
    assert (ours - model_bias).abs().max() < 1e-6


# --------------------------------------------------------------------------------------------- GPT-2, OPT


#: The GPT-2-shaped families: a learned table wpe, read by GPT-2's reader and applied by its adapter.
WPE = ("gpt2", "gpt_bigcode")


@pytest.mark.parametrize("name", WPE)
def test_gpt2_table_is_wpe_at_the_same_positions(name):
    model = model_of(name)
    plan = FAMILY_READERS[name](dict(CONFIGS[name]))
    table = plan.embedding
    assert all(layer.encoding is None for layer in plan)
    assert tuple(table.weight.shape) == tuple(model.transformer.wpe.weight.shape)
    with torch.no_grad():
        table.weight.copy_(model.transformer.wpe.weight)
    positions = torch.arange(10).expand(2, -1) + torch.tensor([[0], [54]])  # a cache offset, up to the table's end
    x = torch.randn(2, 10, 64)
    assert torch.equal(table.embed(x, positions), x + model.transformer.wpe(positions))
    with pytest.raises(InvalidArgument, match="0..63"):
        table.embed(x, positions + 1)


@pytest.mark.parametrize("name", WPE)
def test_gpt2_spellings_follow_gpt2config(name):
    spec = {**CONFIGS[name], "max_position_embeddings": 32}
    with pytest.warns(UserWarning, match="n_positions"):
        plan = FAMILY_READERS[name](spec)
    config = transformers.AutoConfig.for_model(**spec)
    assert plan.embedding.max_positions == transformers.AutoModel.from_config(config).wpe.num_embeddings == 32


def test_opt_table_has_the_offset_and_reads_positions_from_the_mask():
    model = model_of("opt")
    plan = FAMILY_READERS["opt"](dict(CONFIGS["opt"]))
    table = plan.embedding
    model_table = model.model.decoder.embed_positions
    assert tuple(table.weight.shape) == tuple(model_table.weight.shape) == (64 + 2, 64)
    assert table.max_positions == 64 and table.offset == 2
    with torch.no_grad():
        table.weight.copy_(model_table.weight)
    mask = left_padded_mask([64, 40, 5], 64)
    positions = mask.cumsum(-1) * mask - 1  # OPT's rule: padding at -1, row 1
    x = torch.zeros(3, 64, 64)
    assert torch.equal(table.embed(x, positions), model_table(mask))
    # with a cache: the last 4 positions of the same rows
    assert torch.equal(table.embed(x[:, :4], positions[:, -4:]), model_table(mask, cache_length=60))
    # what the model adds to its input embeddings, read from its forward
    seen = {}
    model.model.decoder.layers[0].register_forward_pre_hook(
        lambda module, args, kwargs: seen.update(hidden=args[0] if args else kwargs["hidden_states"]), with_kwargs=True)
    ids = torch.randint(0, 128, (3, 64))
    model(ids, attention_mask=mask)
    expected = table.embed(model.model.decoder.embed_tokens(ids), positions)
    assert (seen["hidden"] - expected).abs().max() < 1e-6
    with pytest.raises(InvalidArgument, match="-2"):
        table.embed(x, positions - 2)


# --------------------------------------------------------------------------------------------- T5


def test_t5_bias_is_compute_bias_of_each_stacks_first_layer():
    model = model_of("t5")
    plan = plan_t5(dict(CONFIGS["t5"]))
    encoder_plan = plan.encoder
    assert len(encoder_plan) == 2 and len(plan) == 3
    assert all(layer.encoding is encoder_plan[0].encoding for layer in encoder_plan)
    assert all(layer.encoding is plan[0].encoding for layer in plan)
    assert encoder_plan[0].encoding.bidirectional and not plan[0].encoding.bidirectional
    for stack, stack_plan in ((model.encoder, encoder_plan), (model.decoder, plan)):
        first = stack.block[0].layer[0].SelfAttention
        assert all(not block.layer[0].SelfAttention.has_relative_attention_bias for block in stack.block[1:])
        assert_bias_is_compute_bias(stack_plan[0].encoding, first)


def assert_bias_is_compute_bias(encoding, attention, t=300):
    """The encoding, given the attention layer's table, gives its ``compute_bias``: at T = t past
    max_distance (128, where the logarithmic buckets saturate) and at a decoding step with a cache
    of t - 1 keys."""
    with torch.no_grad():
        encoding.relative_attention_bias.weight.copy_(attention.relative_attention_bias.weight)
    positions = torch.arange(t)
    assert torch.equal(encoding.score_bias(positions, positions), attention.compute_bias(t, t)[0])
    step = encoding.score_bias(torch.tensor([t - 1]), positions)
    assert torch.equal(step, attention.compute_bias(1, t, past_seen_tokens=t - 1)[0])


def test_t5_layer_counts_follow_t5config():
    spec = {k: v for k, v in CONFIGS["t5"].items() if k not in ("num_layers", "num_decoder_layers")}
    spec["num_hidden_layers"] = 2
    with pytest.warns(UserWarning, match="num_decoder_layers"):
        plan = plan_t5(spec)
    config = transformers.T5Config.from_dict({k: v for k, v in spec.items() if k != "model_type"})
    assert (len(plan.encoder), len(plan)) == (config.num_layers, config.num_decoder_layers) == (2, 6)


def test_switch_transformers_bias_is_compute_bias_of_each_stacks_first_layer():
    """SwitchTransformersAttention's own compute_bias (transformers' copy of T5's): one table per
    stack in its first layer, bidirectional buckets in the encoder, causal in the decoder; the
    plan's buckets give the same bias past max_distance and at a cached decoding step."""
    model = model_of("switch_transformers")
    plan = plan_switch_transformers(dict(CONFIGS["switch_transformers"]))
    assert (len(plan.encoder), len(plan)) == (2, 2)
    assert plan.encoder[0].encoding.bidirectional and not plan[0].encoding.bidirectional
    for stack, stack_plan in ((model.encoder, plan.encoder), (model.decoder, plan)):
        first = stack.block[0].layer[0].SelfAttention
        assert type(first).__name__ == "SwitchTransformersAttention" and first.has_relative_attention_bias
        assert all(not block.layer[0].SelfAttention.has_relative_attention_bias for block in stack.block[1:])
        encoding = stack_plan[0].encoding
        assert all(layer.encoding is encoding for layer in stack_plan)
        assert_bias_is_compute_bias(encoding, first)


def test_umt5_bias_is_compute_bias_of_every_layer():
    """UMT5Attention: every self-attention layer holds a table and computes its own bias (T5's
    buckets, bidirectional in the encoder, causal in the decoder); the plan gives each layer an
    encoding of its own, whose buckets give that layer's bias past max_distance and at a cached
    decoding step."""
    model = model_of("umt5")
    plan = plan_umt5(dict(CONFIGS["umt5"]))
    assert (len(plan.encoder), len(plan)) == (2, 3)
    for stack, stack_plan in ((model.encoder, plan.encoder), (model.decoder, plan)):
        assert len({id(layer.encoding) for layer in stack_plan}) == len(stack.block) == len(stack_plan)
        for block, layer in zip(stack.block, stack_plan):
            attention, encoding = block.layer[0].SelfAttention, layer.encoding
            assert type(attention).__name__ == "UMT5Attention" and attention.has_relative_attention_bias
            assert encoding.bidirectional == (not attention.is_decoder)
            assert_bias_is_compute_bias(encoding, attention)


def test_umt5_layer_counts_follow_its_config_class():
    for spec in ({"num_layers": 3}, {"num_layers": 3, "num_decoder_layers": 5}, {}):
        plan = plan_umt5({"model_type": "umt5", **spec})
        config = transformers.UMT5Config(**spec)
        assert (len(plan.encoder), len(plan)) == (config.num_layers, config.num_decoder_layers)


@pytest.mark.parametrize("spec, layers", [
    ({"num_layers": 4}, (4, 12)),  # no num_decoder_layers: the field's default 12, not num_layers
    ({"num_layers": 4, "num_decoder_layers": None}, (4, 4)),  # an explicit null: num_layers (__post_init__)
    ({"num_hidden_layers": 3}, (3, 12)),  # the alias sets num_layers only
    ({"num_layers": 3, "num_decoder_layers": 5}, (3, 5)),
])
def test_switch_transformers_layer_counts_follow_its_config_class(spec, layers):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = plan_switch_transformers({"model_type": "switch_transformers", **spec})
    config = transformers.SwitchTransformersConfig(**spec)
    assert (len(plan.encoder), len(plan)) == (config.num_layers, config.num_decoder_layers) == layers


def test_biogpt_table_has_the_offset_and_reads_position_ids():
    """BioGptLearnedPositionalEmbedding: row p + 2 for position p; BioGptModel hands it position_ids
    (arange plus the cached length by default), not the mask's positions: a left-padded row keeps
    its arange positions."""
    model = model_of("biogpt")
    plan = plan_biogpt(dict(CONFIGS["biogpt"]))
    table, model_table = plan.embedding, model.biogpt.embed_positions
    assert all(layer.encoding is None for layer in plan)
    assert tuple(table.weight.shape) == tuple(model_table.weight.shape) == (64 + 2, 64)
    assert table.max_positions == 64 and table.offset == 2
    with torch.no_grad():
        table.weight.copy_(model_table.weight)
    mask = left_padded_mask([64, 40], 64)
    positions = torch.arange(64).expand(2, -1)
    x = torch.zeros(2, 64, 64)
    assert torch.equal(table.embed(x, positions), model_table(mask, 0, position_ids=positions))
    # what BioGptModel itself adds: its hidden state before the first layer, with the token embeddings taken out
    seen = {}
    hook = model.biogpt.layers[0].register_forward_pre_hook(lambda module, args: seen.setdefault("h", args[0]))
    ids = torch.randint(3, 128, (2, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(ids, attention_mask=mask)
        added = seen["h"] - model.biogpt.embed_tokens(ids)
    hook.remove()
    assert (added - table.embed(x, positions)).abs().max() <= 1e-6


# --------------------------------------------------------------------------------------------- adapters


from posenc.integrations.adapters import apply_plan  # noqa: E402

ADAPTED = ["gpt2", "opt", "bloom", "mpt", "falcon_rope", "falcon_alibi", "gpt_bigcode", "biogpt"]


def noise_floor(name: str, ids, mask) -> float:
    """The model's own float32 noise: twice its eager vs sdpa difference on the real tokens (the
    padding rows attend to nothing and differ arbitrarily), at least 1e-5."""
    model = model_of(name)
    if not getattr(type(model), "_supports_sdpa", False):
        return 1e-5  # one attention only (MPT)
    eager = model(ids, attention_mask=mask).logits
    model.config._attn_implementation = "sdpa"
    for module in model.modules():
        if hasattr(module, "config"):
            module.config._attn_implementation = "sdpa"
    sdpa = model(ids, attention_mask=mask).logits
    return max(1e-5, 2 * (eager - sdpa).abs()[mask.bool()].max().item())


def gpt2_position_ids(mask):
    return (mask.cumsum(-1) - 1).clamp(min=0)


@pytest.mark.parametrize("name", ADAPTED)
def test_adapter_reproduces_the_models_logits(name):
    spec = CONFIGS[name]
    ids = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(1))
    # MPT's positions are key indices (no padding support of its own): unpadded there
    mask = torch.ones(2, 24, dtype=torch.long) if name == "mpt" else left_padded_mask([24, 17], 24)
    extra = {"position_ids": gpt2_position_ids(mask)} if name in (*WPE, "biogpt") else {}
    model = model_of(name)
    with torch.no_grad():
        reference = model(ids, attention_mask=mask, **extra).logits
        plan = FAMILY_READERS[spec["model_type"]](dict(spec))
        apply_plan(model, plan)
        ours = model(ids, attention_mask=mask, **extra).logits
        real = mask.bool()
        difference = (ours - reference).abs()[real].max().item()
        assert difference <= noise_floor(name, ids, mask), difference
        # a cached decoding step: the next token's logits with and without the cache
        step_ids = torch.cat([ids, ids[:, :1]], dim=1)
        step_mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], dim=1)
        step_extra = {"position_ids": gpt2_position_ids(step_mask)} if name in (*WPE, "biogpt") else {}
        full = model(step_ids, attention_mask=step_mask, **step_extra).logits[:, -1]
        prefix = model(ids, attention_mask=mask, use_cache=True, **extra)
        last_extra = {"position_ids": step_extra["position_ids"][:, -1:]} if name in (*WPE, "biogpt") else {}
        cached = model(step_ids[:, -1:], attention_mask=step_mask, cache=prefix.past_key_values, use_cache=True,
                       **last_extra).logits[:, -1]
        assert (cached - full).abs().max() < 1e-4
    # the adapter computes the positions: shifting the plan's positions moves the logits
    if name in (*WPE, "opt", "biogpt"):
        with torch.no_grad():
            plan.embedding.weight.data = plan.embedding.weight.data.roll(1, dims=0)
            assert (model(ids, attention_mask=mask, **extra).logits - reference).abs().max() > 5e-2


def test_t5_adapter_reproduces_the_models_logits():
    model = model_of("t5")
    ids = torch.randint(0, 128, (2, 20), generator=torch.Generator().manual_seed(1))
    decoder_ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        reference = model(input_ids=ids, decoder_input_ids=decoder_ids).logits
        plan = plan_t5(dict(CONFIGS["t5"]))
        apply_plan(model, plan)
        assert plan.encoder[0].encoding.relative_attention_bias is \
            model.encoder.block[0].layer[0].SelfAttention.relative_attention_bias
        ours = model(input_ids=ids, decoder_input_ids=decoder_ids).logits
        assert (ours - reference).abs().max() <= 1e-5
    # generate() with the cache (transformers 5.24's generate needs as many decoder as encoder
    # layers: its cache is sized by num_layers)
    symmetric = {"num_decoder_layers": 2}
    model, reference_model = model_of("t5", **symmetric), model_of("t5", **symmetric)
    apply_plan(model, plan_t5({**CONFIGS["t5"], **symmetric}))
    with torch.no_grad():
        generated = model.generate(ids, max_new_tokens=12, do_sample=False)
        assert torch.equal(generated, reference_model.generate(ids, max_new_tokens=12, do_sample=False))


def test_switch_transformers_through_t5_s_adapter_reproduces_the_models_logits():
    """The plan read from the config, applied by T5's adapter (the record names it): the model's
    logits and its cached greedy tokens; a plan with other bucket settings moves the logits."""
    from posenc.integrations.transformers import position_plan

    model, reference_model = model_of("switch_transformers"), model_of("switch_transformers")
    ids = torch.randint(0, 128, (2, 20), generator=torch.Generator().manual_seed(1))
    decoder_ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(2))
    plan = position_plan(model.config)
    with torch.no_grad():
        reference = reference_model(input_ids=ids, decoder_input_ids=decoder_ids).logits
        apply_plan(model, plan)
        assert plan.encoder[0].encoding.relative_attention_bias is \
            model.encoder.block[0].layer[0].SelfAttention.relative_attention_bias
        ours = model(input_ids=ids, decoder_input_ids=decoder_ids).logits
        assert (ours - reference).abs().max() <= 1e-5
        generated = model.generate(ids, max_new_tokens=12, do_sample=False)
        assert torch.equal(generated, reference_model.generate(ids, max_new_tokens=12, do_sample=False))
        # the logits are posenc's buckets': other buckets (max_distance 24) move them
        for stack_plan in (plan.encoder, plan):
            stack_plan[0].encoding.max_distance = 24
        assert (model(input_ids=ids, decoder_input_ids=decoder_ids).logits - reference).abs().max() > 100 * 1e-5
    wrong = position_plan(model.config)
    wrong.encoder[0].encoding.bidirectional = False  # the encoder's buckets read as causal: refused
    with pytest.raises(InvalidArgument, match="not the buckets"):
        apply_plan(model, wrong)


def test_umt5_through_t5_s_adapter_reproduces_the_models_logits():
    """UMT5's plan read from the config, applied by T5's adapter with a table per layer: the
    model's logits and its cached greedy tokens; one layer's buckets changed move the logits; a
    T5-shaped plan (one table per stack) is refused, naming the per-layer tables."""
    from posenc.integrations.transformers import position_plan

    symmetric = {"num_decoder_layers": 2}  # generate() sizes the cache by num_layers
    model, reference_model = model_of("umt5", **symmetric), model_of("umt5", **symmetric)
    ids = torch.randint(0, 128, (2, 20), generator=torch.Generator().manual_seed(1))
    decoder_ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(2))
    plan = position_plan(model.config)
    with torch.no_grad():
        reference = reference_model(input_ids=ids, decoder_input_ids=decoder_ids).logits
        apply_plan(model, plan)
        assert plan[1].encoding.relative_attention_bias is \
            model.decoder.block[1].layer[0].SelfAttention.relative_attention_bias
        assert (model(input_ids=ids, decoder_input_ids=decoder_ids).logits - reference).abs().max() <= 1e-5
        generated = model.generate(ids, max_new_tokens=12, do_sample=False)
        assert torch.equal(generated, reference_model.generate(ids, max_new_tokens=12, do_sample=False))
        plan.encoder[1].encoding.max_distance = 24  # the encoder's second layer only (20 tokens: past the exact buckets)
        assert (model(input_ids=ids, decoder_input_ids=decoder_ids).logits - reference).abs().max() > 100 * 1e-5
    shared = plan_t5({**CONFIGS["t5"], **symmetric, "num_layers": 2})
    with pytest.raises(InvalidArgument, match="bucket table in each of its 2 layers"):
        apply_plan(model, shared)


def test_adapters_refuse_what_does_not_fit():
    with pytest.raises(InvalidArgument, match="heads"):
        apply_plan(model_of("bloom"), FAMILY_READERS["bloom"]({**CONFIGS["bloom"], "n_head": 4}))
    with pytest.raises(InvalidArgument, match="learned table"):
        apply_plan(model_of("gpt2"), plan_gpt2({**CONFIGS["gpt2"], "n_positions": 32}))
    with pytest.raises(InvalidArgument, match="heads"):
        apply_plan(model_of("falcon_alibi"), plan_falcon({**CONFIGS["falcon_alibi"], "num_attention_heads": 4}))
    with pytest.raises(InvalidArgument, match="one ALiBi"):
        apply_plan(model_of("falcon_alibi"), plan_falcon(dict(CONFIGS["falcon_rope"])))


def _falcon_alibi_plan(encoding):
    from posenc.hf_config.plan import LayerPlan, PositionPlan

    return PositionPlan(tuple(LayerPlan(encoding) for _ in range(CONFIGS["falcon_alibi"]["num_hidden_layers"])),
                        model_type="falcon")


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_falcon_alibi_adapter_reproduces_the_models_logits_past_bfloat16_positions(attention):
    """Falcon with alibi through the adapter, in both attentions, at lengths past 256 where
    build_alibi_tensor's bfloat16 rounds the key positions: the plan read from the config gives
    the model's logits (measured 0.0 on CPU float32), and a cached step the full forward's; a
    plan with float32 products or another scale moves them. (Transformers' own eager attention
    adds the ALiBi twice, the ``alibi`` keyword and the mask, sdpa once: the model's eager vs
    sdpa noise floor is large here, so the test also holds the measured 1e-5.)"""
    from posenc import ALiBi

    ids = torch.randint(0, 128, (2, 300), generator=torch.Generator().manual_seed(1))
    mask = left_padded_mask([300, 271], 300)
    real = mask.bool()

    def model_with(plan=None):
        model = model_of("falcon_alibi")
        model.config._attn_implementation = attention
        return model if plan is None else apply_plan(model, plan)

    with torch.no_grad():
        reference = model_with()(ids, attention_mask=mask).logits
        model = model_with(plan_falcon(dict(CONFIGS["falcon_alibi"])))
        difference = (model(ids, attention_mask=mask).logits - reference).abs()[real].max().item()
        assert difference <= max(1e-5, noise_floor("falcon_alibi", ids, mask)), difference
        assert difference <= 1e-5, difference
        # a cached decoding step equals the full forward (and the model's own)
        step_ids, step_mask = torch.cat([ids, ids[:, :1]], 1), torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], 1)
        full = model(step_ids, attention_mask=step_mask).logits[:, -1]
        assert (full - model_with()(step_ids, attention_mask=step_mask).logits[:, -1]).abs().max() <= 1e-5
        prefix = model(ids, attention_mask=mask, use_cache=True)
        cached = model(step_ids[:, -1:], attention_mask=step_mask, cache=prefix.past_key_values,
                       use_cache=True).logits[:, -1]
        assert (cached - full).abs().max() < 1e-4
        # wrong plans move the logits: float32 slope-position products, another scale
        for wrong in (ALiBi(6, slopes="bloom", scale=16 ** -0.5),
                      ALiBi(6, slopes="bloom", slope_dtype="bfloat16", scale=0.5)):
            moved = (model_with(_falcon_alibi_plan(wrong))(ids, attention_mask=mask).logits - reference).abs()
            assert moved[real].max() > 1e-3, wrong
        # generate() with left padding and the DynamicCache: the model's own tokens
        prompt, prompt_mask = ids[:, :12], left_padded_mask([12, 8], 12)
        settings = {"max_new_tokens": 10, "do_sample": False, "pad_token_id": 0}
        assert torch.equal(model.generate(prompt, attention_mask=prompt_mask, **settings),
                           model_with().generate(prompt, attention_mask=prompt_mask, **settings))
        # applied again, the last plan wins (the earlier hooks are removed)
        apply_plan(model, _falcon_alibi_plan(ALiBi(6, slopes="bloom", slope_dtype="bfloat16", scale=0.5)))
        apply_plan(model, plan_falcon(dict(CONFIGS["falcon_alibi"])))
        assert (model(ids, attention_mask=mask).logits - reference).abs()[real].max() <= 1e-5


@pytest.mark.parametrize("name", ["gpt2", "opt", "bloom", "mpt", "falcon_rope", "t5", "switch_transformers",
                                  "gpt_bigcode", "biogpt", "umt5"])
def test_the_records_name_each_layers_self_attention(name):
    """The layer paths of the adapter families' records (where the adapters and posenc audit
    find each layer's self-attention): transformers' own self-attention module of the family,
    one per layer of each stack."""
    from posenc.integrations.families import layer_stacks

    model = model_of(name)
    stacks = layer_stacks(model)
    expected = [("encoder", model.config.num_layers), ("decoder", model.config.num_decoder_layers)] \
        if name in T5_KIN else [("decoder", model.config.num_hidden_layers)]
    assert [(stack.name, len(stack.attentions)) for stack in stacks] == expected
    for stack in stacks:
        for attention in stack.attentions:
            kind = type(attention).__name__  # GPT2Attention, OPTAttention, ..., T5Attention
            assert kind.endswith("Attention") and "Layer" not in kind and "Cross" not in kind, kind
            assert not getattr(attention, "is_cross_attention", False)
