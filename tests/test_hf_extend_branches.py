"""extend_context with the branch position maps and dynamic_yarn on Hugging Face families (issue 26, item 3).

Tiny random models (2-4 layers, hidden 64, 4 heads, vocab 128), every parameter drawn with std
0.2 so that a wrong position moves the logits; float32; no downloads. Tolerance: the model's own
float32 noise, max(1e-5, 4 x |eager - sdpa|) of the plain model on the same tokens.

(a) a map whose window covers the whole input equals the plain model's logits;
(b) each map equals an independent float64 reference: the plain model in float64 with an
    attention function that takes transformers' own rotated q and k (the family's
    apply_rotary_pos_emb and rotary tables) and turns each logit to the map's relative distance
    by rotating k_j once more at (i - j) - rel[i, j], rel from the map's golden-tested
    ``relative_positions``; the maps' log-n query scale and STRING's factor written out here;
(c) prefill then token-by-token decoding with transformers' DynamicCache gives the full pass's
    logits, and generate() with the cache the same tokens as without;
(d) save_pretrained, then a plain transformers from_pretrained runs the unextended model
    (config field ignored) and posenc's from_pretrained the extended one.
"""

from __future__ import annotations

import functools
import inspect
import math
import sys

import pytest
import torch
from conftest import slow_unless

transformers = pytest.importorskip("transformers")

from posenc.attention.branches import (
    Branch,
    branch_attention,
    dca,
    leaky_rerope,
    lm_infinite,
    rerope,
    self_extend,
    streaming_llm,
    string,
)
from posenc.errors import InvalidArgument, MissingKey
from posenc.integrations import branch_attention as hf_branches
from posenc.integrations.transformers import extend_context, from_pretrained

T = transformers
V = 128
COMMON = {"vocab_size": V, "hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 64, "pad_token_id": 0,
              "bos_token_id": 1, "eos_token_id": 2}
SMALL = dict(COMMON, intermediate_size=96, num_key_value_heads=2)
GEMMA3_TYPES = ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]

#: family -> (config class, model class, config kwargs, attention implementation)
FAMILIES = {
    "llama": (T.LlamaConfig, T.LlamaForCausalLM, dict(SMALL, num_hidden_layers=2), "sdpa"),
    "mistral": (T.MistralConfig, T.MistralForCausalLM,
                dict(SMALL, num_hidden_layers=2, sliding_window=None,
                     rope_parameters={"rope_type": "default", "rope_theta": 1e6}), "sdpa"),
    "qwen2": (T.Qwen2Config, T.Qwen2ForCausalLM,
              dict(SMALL, num_hidden_layers=2, rope_parameters={"rope_type": "default", "rope_theta": 1e6}), "sdpa"),
    "qwen3": (T.Qwen3Config, T.Qwen3ForCausalLM,
              dict(SMALL, num_hidden_layers=2, head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
              "sdpa"),
    "gemma": (T.GemmaConfig, T.GemmaForCausalLM, dict(SMALL, num_hidden_layers=2, num_key_value_heads=1, head_dim=16),
              "sdpa"),
    # layer 0 sliding (window 8), layer 1 global; logit soft-capping 50 on both
    "gemma2": (T.Gemma2Config, T.Gemma2ForCausalLM,
               dict(SMALL, num_hidden_layers=2, head_dim=16, sliding_window=8, query_pre_attn_scalar=16), "eager"),
    "gemma3_text": (T.Gemma3TextConfig, T.Gemma3ForCausalLM,
                    dict(SMALL, num_hidden_layers=4, head_dim=16, sliding_window=8, query_pre_attn_scalar=16,
                         layer_types=GEMMA3_TYPES,
                         rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                          "full_attention": {"rope_type": "default", "rope_theta": 1e6}}), "sdpa"),
    "phi3": (T.Phi3Config, T.Phi3ForCausalLM,
             dict(SMALL, num_hidden_layers=2, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                                "partial_rotary_factor": 0.5}), "sdpa"),
    "cohere": (T.CohereConfig, T.CohereForCausalLM,
               dict(SMALL, num_hidden_layers=2, rope_parameters={"rope_type": "default", "rope_theta": 8e6}), "sdpa"),
    "gpt_neox": (T.GPTNeoXConfig, T.GPTNeoXForCausalLM,
                 dict(COMMON, intermediate_size=96, num_hidden_layers=2,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}),
                 "sdpa"),
    # more families the same code serves: NoPE layers (SmolLM3), QK-norm (OLMo 2), GPT-J's
    # interleaved (sin, cos), gpt-oss's sinks next to sliding layers and a YaRN-scaled RoPE
    "smollm3": (T.SmolLM3Config, T.SmolLM3ForCausalLM,
                dict(SMALL, num_hidden_layers=4, no_rope_layers=[1, 1, 1, 0],
                     rope_parameters={"rope_type": "default", "rope_theta": 2e6}), "sdpa"),
    "olmo2": (T.Olmo2Config, T.Olmo2ForCausalLM,
              dict(SMALL, num_hidden_layers=2, rope_parameters={"rope_type": "default", "rope_theta": 500000.0}), "sdpa"),
    "gptj": (T.GPTJConfig, T.GPTJForCausalLM,
             {"vocab_size": V, "n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 64, "rotary_dim": 8, "pad_token_id": 0,
                  "bos_token_id": 1, "eos_token_id": 2}, "sdpa"),
    "gpt_oss": (T.GptOssConfig, T.GptOssForCausalLM,
                dict(COMMON, intermediate_size=64, num_hidden_layers=2, num_key_value_heads=2, head_dim=16,
                     num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                     layer_types=["sliding_attention", "full_attention"],
                     rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                      "rope_theta": 150000.0, "original_max_position_embeddings": 16, "truncate": False}),
                "eager"),
}
MAIN = ["llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3", "cohere", "gpt_neox"]

#: method -> parameters of a map that covers the whole input (every distance plain, T <= 40)
INSIDE = {
    "streaming_llm": {"start_size": 4, "recent_size": 64},
    "self_extend": {"group_size": 4, "neighbor_window": 64},
    "rerope": {"window": 64, "training_length": 64},
    "leaky_rerope": {"window": 64, "scaling_factor": 4, "training_length": 64},
    "lm_infinite": {"local_branch": 64, "global_branch": 4},
    "dca": {"chunk_size": 64, "local_size": 8},
    "string": {"shifted_offset": 48, "local_value": 4, "attention_factor": 1.0},
    "windowed_yarn": {"factor": 4.0, "window": 64, "training_length": 16},
}
#: method -> parameters that move most distances of a 40-token input (log-n scale on past 16)
OUTSIDE = {
    "streaming_llm": {"start_size": 2, "recent_size": 8},
    "self_extend": {"group_size": 3, "neighbor_window": 8},  # the window not a multiple of the group
    "rerope": {"window": 8, "training_length": 16},
    "leaky_rerope": {"window": 8, "scaling_factor": 4, "training_length": 16},
    "lm_infinite": {"local_branch": 8, "global_branch": 3},
    "dca": {"chunk_size": 12, "local_size": 2},
    "string": {"shifted_offset": 10, "local_value": 3},  # with STRING's attention factor 0.1 ln 2 + 1
}
MAPS = {"streaming_llm": streaming_llm, "self_extend": self_extend, "rerope": rerope, "leaky_rerope": leaky_rerope,
        "lm_infinite": lm_infinite, "dca": dca}
#: families whose RoPE is already scaled: leaky_rerope and windowed_yarn (a scaling of plain RoPE) refuse them
SCALED = {"gpt_oss"}
ON_PLAIN_ROPE = ("leaky_rerope", "windowed_yarn")


def build(family, attn=None, dtype=torch.float32, **overrides):
    config_class, model_class, kwargs, default_attn = FAMILIES[family]
    config = config_class(**{**kwargs, **overrides})
    config._attn_implementation = attn or default_attn
    torch.manual_seed(0)
    model = model_class(config)
    with torch.no_grad():
        for parameter in model.parameters():
            torch.nn.init.normal_(parameter, std=0.2)
    return model.to(dtype).eval()


def tokens(batch=2, length=40, seed=1):
    return torch.randint(3, V, (batch, length), generator=torch.Generator().manual_seed(seed))


def logits(model, x, **kwargs):
    with torch.no_grad():
        return model(x, **kwargs).logits


@functools.cache
def _noise(family):
    x = tokens()
    return (logits(build(family, "eager"), x) - logits(build(family, "sdpa"), x)).abs().max().item()


def tolerance(family, x=None):
    """max(1e-5, 4 x the plain model's |eager - sdpa|) on the (2, 40) tokens (eager-only families: 1e-5)."""
    if FAMILIES[family][3] == "eager":
        return 1e-5
    return max(1e-5, 4 * _noise(family))


def full_layers(config):
    """The layers the maps take: RoPE and a full span, read from the config here."""
    n = config.num_hidden_layers
    types = getattr(config, "layer_types", None) or ["full_attention"] * n
    nope = [flag == 0 for flag in getattr(config, "no_rope_layers", None) or [1] * n]
    return [i for i in range(n) if types[i] == "full_attention" and not nope[i]]


def cases(families, methods):
    return [(f, m) for f in families for m in methods if not (m in ON_PLAIN_ROPE and f in SCALED)]


# -- (a) inside the window: the plain model ------------------------------------------------------

@pytest.mark.parametrize("family,method", cases(FAMILIES, INSIDE))
def test_a_map_inside_its_window_is_the_plain_model(family, method):
    plain = build(family)
    x = tokens()
    model = extend_context(build(family), method, **INSIDE[method])
    assert model.config.posenc_context_extension["layers"] == full_layers(model.config)
    difference = (logits(model, x) - logits(plain, x)).abs().max().item()
    assert difference <= tolerance(family, x), f"{family} {method}: {difference}"


# -- (b) against a float64 reference built on transformers' own rotation -------------------------

_REFERENCE = "posenc_test_branch_reference"


def _layer_rotary(model, module):
    """(rotary module's call at float positions -> cos, sin without the attention factor, the
    family's apply_rotary_pos_emb), from transformers' modeling file of the module."""
    base = model.base_model
    rotary = base.rotary_emb
    layer_type = None
    if "layer_type" in inspect.signature(rotary.forward).parameters:
        layer_type = model.config.layer_types[module.layer_idx]
    factor = getattr(rotary, "attention_scaling", 1.0)
    if isinstance(factor, dict):
        factor = factor[layer_type]

    def tables(x, positions):
        args = (x, positions) if layer_type is None else (x, positions, layer_type)
        cos, sin = rotary(*args)
        return cos / factor, sin / factor

    return tables, sys.modules[type(module).__module__].apply_rotary_pos_emb


def reference_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """The plain model's attention in float64, with the map's distances on the map's layers.

    Without a map: the modeling file's eager attention. With one (``module._reference``):
    q_i . k_j of transformers' rotated q and k is turned into the map's rel[i, j] by rotating
    k_j once more at (i - j) - rel[i, j]; then log-n query scale, STRING's factor on the
    rotary part (squared, q side), soft-cap, the map's coverage as the mask, sinks, softmax.
    """
    modeling = sys.modules[type(module).__module__]
    spec = module.__dict__.get("_reference")
    if spec is None:
        mask = attention_mask
        if mask is None:  # sdpa_mask's "plain causal" (it skips the mask where sdpa's is_causal would do)
            mask = torch.ones(query.shape[2], key.shape[2], dtype=torch.bool).tril(key.shape[2] - query.shape[2])
        if mask.dtype == torch.bool:
            zero = torch.zeros((), dtype=query.dtype)
            mask = torch.where(mask, zero, torch.finfo(query.dtype).min)
        return modeling.eager_attention_forward(module, query, key, value, mask, dropout=dropout, scaling=scaling,
                                                **kwargs)
    the_map, params, tables, apply_rotary = spec
    batch, heads, length, dim = query.shape
    rel, covered = the_map.relative_positions(length, length)
    i = torch.arange(length).unsqueeze(-1)
    turn = ((i - torch.arange(length)) - rel).to(torch.float64)  # (T, T), float positions (Leaky ReRoPE's)
    cos, sin = tables(key, turn.reshape(1, -1))
    pairs = key[:, :, torch.arange(length).repeat(length)]  # k_j for every (i, j), i-major
    _, turned = apply_rotary(pairs, pairs, cos, sin)
    turned = turned.reshape(batch, key.shape[1], length, length, dim).repeat_interleave(heads // key.shape[1], dim=1)
    q = query
    if "training_length" in params:  # ReRoPE's log-n: max(1, log(i + 1) / log(L)) at query i
        scale = torch.clamp(torch.log(torch.arange(1, length + 1, dtype=torch.float64))
                            / math.log(params["training_length"]), min=1.0)
        q = q * scale[:, None].to(q.dtype)
    factor = params.get("attention_factor", 1.0)
    if factor != 1.0:
        width = cos.shape[-1] * (2 if modeling.__name__.endswith("gpt_oss") else 1)
        q = torch.cat((q[..., :width] * factor ** 2, q[..., width:]), dim=-1)
    scores = torch.einsum("bhtd,bhtjd->bhtj", q, turned) * scaling
    softcap = kwargs.get("softcap")
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~covered, float("-inf"))
    sinks = kwargs.get("s_aux")
    if sinks is not None:
        scores = torch.cat((scores, sinks.reshape(1, -1, 1, 1).expand(batch, -1, length, 1).to(scores.dtype)), -1)
    probs = torch.softmax(scores, dim=-1)[..., :length]
    values = value.repeat_interleave(heads // value.shape[1], dim=1)
    return torch.matmul(probs, values).transpose(1, 2).contiguous(), None


def reference_model(family, method, params):
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(_REFERENCE, reference_attention)
    AttentionMaskInterface.register(_REFERENCE, sdpa_mask)
    # gpt-oss's experts run grouped_mm, float32 at most: its reference is float32
    model = build(family, dtype=torch.float32 if family == "gpt_oss" else torch.float64)
    model.set_attn_implementation(_REFERENCE)
    length = hf_branches.training_length(model.config)
    resolved = {**hf_branches.method_defaults(method, model.config), **params}
    if method == "string":
        the_map = string(shifted_offset=resolved["shifted_offset"], local_value=resolved["local_value"])
    else:
        the_map = MAPS[method](**resolved)
    assert length == model.config.max_position_embeddings or family in SCALED
    layers = [layer for layer in model.base_model.layers] if hasattr(model.base_model, "layers") else model.base_model.h
    for index in full_layers(model.config):
        module = getattr(layers[index], "self_attn", None) or getattr(layers[index], "attention", None) or \
            layers[index].attn
        module.__dict__["_reference"] = (the_map, resolved, *_layer_rotary(model, module))
    return model


REFERENCE_FAMILIES = [f for f in FAMILIES if f != "gptj"]  # GPT-J's rotary is per layer, not on the base model


@pytest.mark.parametrize("family,method", cases(REFERENCE_FAMILIES, OUTSIDE))
def test_b_each_map_equals_a_float64_reference_on_transformers_rotation(family, method):
    x = tokens()
    model = extend_context(build(family), method, **OUTSIDE[method])
    expected = logits(reference_model(family, method, OUTSIDE[method]), x)
    got = logits(model, x).to(torch.float64)
    plain = logits(build(family), x).to(torch.float64)
    assert (plain - expected).abs().max() > 1e-3, "the map must move the logits (else the test could not fail)"
    difference = (got - expected).abs().max().item()
    assert difference <= tolerance(family, x), f"{family} {method}: {difference}"


def test_the_attention_function_equals_branch_attention_on_random_heads():
    """posenc's attention function, given a layer's BranchedRoPE, on captured-like q, k, v equals
    posenc.attention.branches' branch_attention (the eager select-then-softmax) of the same map,
    grouped-query heads included."""
    import posenc
    from posenc.integrations.attention_function import (
        ENCODING_ATTR,
        posenc_attention_forward,
    )

    torch.manual_seed(3)
    q, k, v = torch.randn(2, 4, 30, 16), torch.randn(2, 2, 30, 16), torch.randn(2, 2, 30, 16)
    rope = posenc.RoPE(16)
    the_map = self_extend(group_size=3, neighbor_window=7)
    module = torch.nn.Module()
    module.__dict__[ENCODING_ATTR] = hf_branches.branched_layer(
        "self_extend", {"group_size": 3, "neighbor_window": 7}, rope, "layer 0")
    got, _ = posenc_attention_forward(module, q, k, v, None, scaling=0.25)
    expected = branch_attention(q, k, v, rotate=rope.rotate, branches=the_map.branches(30, 30), scale=0.25,
                                merge="select")
    torch.testing.assert_close(got.transpose(1, 2), expected, atol=1e-6, rtol=0)
    assert isinstance(the_map.branches(1, 30)[0], Branch)


# -- (c) the cache --------------------------------------------------------------------------------

def decoded_logits(model, x, prefill):
    """Prefill of ``prefill`` tokens, then one token at a time with a DynamicCache."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        parts = [model(x[:, :prefill], past_key_values=cache, use_cache=True).logits]
        for t in range(prefill, x.shape[1]):
            parts.append(model(x[:, t:t + 1], past_key_values=cache, use_cache=True).logits)
    return torch.cat(parts, dim=1)


#: (c) by default (the default suite's time budget): every map on these families (plain, sliding
#: and soft-capped, per layer type, NoPE layers, sinks with a scaled RoPE), and each other family
#: with one map, in turn; pytest -m slow runs every pair
C_FAMILIES = ("llama", "gemma2", "gemma3_text", "smollm3", "gpt_oss")


def c_cases():
    methods = list(OUTSIDE)
    turn = {family: methods[i % len(methods)] for i, family in enumerate(FAMILIES)}
    return [slow_unless(family in C_FAMILIES or method == turn[family], family, method, id=f"{family}-{method}")
            for family, method in cases(FAMILIES, OUTSIDE)]


@pytest.mark.parametrize("family,method", c_cases())
def test_c_cached_decoding_equals_the_full_pass_and_generate(family, method):
    x = tokens(batch=1)
    model = extend_context(build(family), method, **OUTSIDE[method])
    full = logits(model, x)
    difference = (decoded_logits(model, x, prefill=5) - full).abs().max().item()
    assert difference <= tolerance(family, x), f"{family} {method}: {difference}"
    prompt = x[:, :6]
    cached = model.generate(prompt, max_new_tokens=16, do_sample=False, min_new_tokens=16)
    uncached = model.generate(prompt, max_new_tokens=16, do_sample=False, min_new_tokens=16, use_cache=False)
    assert cached.tolist() == uncached.tolist()


def test_c_the_cache_holds_unrotated_keys():
    """Layer 0's cached keys are k_proj of the normed embeddings, unrotated."""
    from transformers import DynamicCache

    model = extend_context(build("llama"), "self_extend", group_size=2, neighbor_window=4)
    x = tokens(batch=1, length=12)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(x, past_key_values=cache, use_cache=True)
        layer = model.model.layers[0]
        hidden = layer.input_layernorm(model.model.embed_tokens(x))
        keys = layer.self_attn.k_proj(hidden).view(1, 12, -1, 16).transpose(1, 2)
    torch.testing.assert_close(cache.layers[0].keys, keys, atol=1e-6, rtol=0)


# -- (d) saving --------------------------------------------------------------------------------

def test_d_save_then_plain_from_pretrained_runs_the_unextended_model(tmp_path):
    x = tokens()
    model = extend_context(build("llama"), "self_extend", group_size=3, neighbor_window=8)
    extended = logits(model, x)
    model.save_pretrained(tmp_path)
    plain = T.LlamaForCausalLM.from_pretrained(tmp_path, attn_implementation="sdpa").eval()
    assert plain.config.posenc_context_extension == {"format": 1, "method": "self_extend",
                                                     "params": {"group_size": 3, "neighbor_window": 8},
                                                     "layers": [0, 1]}
    torch.testing.assert_close(logits(plain, x), logits(build("llama"), x), atol=1e-5, rtol=0)
    assert (logits(plain, x) - extended).abs().max() > 1e-3
    again = from_pretrained(tmp_path, attn_implementation="sdpa").eval()
    torch.testing.assert_close(logits(again, x), extended, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_d_dynamic_yarn_is_refused_by_plain_transformers_and_loaded_by_posenc(family, tmp_path):
    x = tokens(length=40)
    model = extend_context(build(family, max_position_embeddings=16), "dynamic_yarn", 4.0, dynamic_cache="frozen")
    extended = logits(model, x)
    model.save_pretrained(tmp_path)
    with pytest.raises(KeyError, match="dynamic_yarn"):
        FAMILIES[family][1].from_pretrained(tmp_path)
    again = from_pretrained(tmp_path, attn_implementation="sdpa").eval()
    rope = again.config.rope_parameters
    assert (rope.get("full_attention") or rope)["rope_type"] == "dynamic_yarn"
    torch.testing.assert_close(logits(again, x), extended, atol=1e-5, rtol=0)
    assert (extended - logits(build(family, max_position_embeddings=16), x)).abs().max() > 1e-3


@pytest.mark.parametrize("method", ["theta_scale", "telechat3_yarn"])
def test_d_grok_and_telechat3_scalings_save_as_transformers_types(method, tmp_path):
    """theta_scale is plain RoPE on another base and TeleChat3's YaRN is yarn with its attention
    factor written out: extend_context writes them so (the records' hf_equivalent), and a plain
    transformers from_pretrained runs the extended model."""
    x = tokens(length=40)
    model = extend_context(build("llama", max_position_embeddings=16), method, 4.0)
    extended = logits(model, x)
    model.save_pretrained(tmp_path)
    again = FAMILIES["llama"][1].from_pretrained(tmp_path).eval()
    assert again.config.rope_parameters["rope_type"] == {"theta_scale": "default", "telechat3_yarn": "yarn"}[method]
    assert (logits(again, x) - extended).abs().max().item() <= tolerance("llama", x)
    assert (extended - logits(build("llama", max_position_embeddings=16), x)).abs().max() > 1e-3


def test_d_yarn_log_is_refused_by_plain_transformers_and_loaded_by_posenc(tmp_path):
    """Grok's yarn_log has no transformers spelling: as dynamic_yarn, posenc's from_pretrained
    rebuilds it from the saved config, a plain transformers one refuses it loudly."""
    x = tokens(length=40)
    model = extend_context(build("llama", max_position_embeddings=16), "yarn_log", 4.0)
    extended = logits(model, x)
    model.save_pretrained(tmp_path)
    with pytest.raises(KeyError, match="yarn_log"):
        FAMILIES["llama"][1].from_pretrained(tmp_path)
    again = from_pretrained(tmp_path, attn_implementation="sdpa").eval()
    assert again.config.rope_parameters["rope_type"] == "yarn_log"
    torch.testing.assert_close(logits(again, x), extended, atol=1e-5, rtol=0)
    assert (extended - logits(build("llama", max_position_embeddings=16), x)).abs().max() > 1e-3


def test_dynamic_ntk_frozen_takes_the_tables_and_caches_exactly():
    """dynamic_cache="frozen" for transformers' dynamic NTK: per-position tables (what
    transformers computes decoding token by token), the model's own attention, exact cache."""
    x = tokens(batch=1, length=40)
    model = extend_context(build("llama", max_position_embeddings=16), "dynamic", 2.0, dynamic_cache="frozen")
    assert model.config._attn_implementation == "sdpa"
    assert (decoded_logits(model, x, 5) - logits(model, x)).abs().max().item() <= tolerance("llama")


# -- dynamic_yarn ---------------------------------------------------------------------------------

def yarn_model(family, factor, l0=16, **kwargs):
    """transformers' own static YaRN at ``factor`` on the same weights."""
    _config_class, _, base_kwargs, _ = FAMILIES[family]
    rope = dict(base_kwargs.get("rope_parameters") or {"rope_type": "default", "rope_theta": 10000.0})
    rope.update(rope_type="yarn", factor=factor, original_max_position_embeddings=l0)
    return build(family, rope_parameters=rope, max_position_embeddings=l0, **kwargs)


@pytest.mark.parametrize("family", ["llama", "qwen3", "cohere", "gpt_neox", "gemma2"])
def test_dynamic_yarn_rerotate_prefill_is_transformers_static_yarn_at_t_over_l0(family):
    x = tokens(length=40)
    model = extend_context(build(family, max_position_embeddings=16), "dynamic_yarn", 4.0)
    tol = tolerance(family, x)
    assert (logits(model, x) - logits(yarn_model(family, 40 / 16), x)).abs().max().item() <= tol
    short = x[:, :16]
    assert (logits(model, short) - logits(build(family, max_position_embeddings=16), short)).abs().max().item() <= tol


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "gpt_neox"])
def test_dynamic_yarn_frozen_caches_exactly(family):
    x = tokens(batch=1, length=40)
    model = extend_context(build(family, max_position_embeddings=16), "dynamic_yarn", 4.0, dynamic_cache="frozen")
    full = logits(model, x)
    assert (decoded_logits(model, x, prefill=5) - full).abs().max().item() <= tolerance(family, x)
    prompt = x[:, :6]
    assert model.generate(prompt, max_new_tokens=30, min_new_tokens=30, do_sample=False).tolist() == \
        model.generate(prompt, max_new_tokens=30, min_new_tokens=30, do_sample=False, use_cache=False).tolist()


def test_dynamic_yarn_rerotate_cache_is_exact_within_l0_and_first_layer_only_past_it():
    """Within L0 every length is plain RoPE: cached = full. Past it, decoding token t re-rotates
    every key at length t + 1: a one-layer model's cached logits at t are those of a full pass
    over the first t + 1 tokens; with more layers the hidden states cached at shorter lengths
    differ from a full pass's (documented, YaRN's dynamic scaling under a cache)."""
    x = tokens(batch=1, length=40)
    tol = tolerance("llama", x)
    model = extend_context(build("llama", max_position_embeddings=16), "dynamic_yarn", 4.0)
    assert (decoded_logits(model, x[:, :16], 4) - logits(model, x[:, :16])).abs().max().item() <= tol

    def prefix_passes(m):
        return torch.cat([logits(m, x[:, :t + 1])[:, -1:] for t in range(4, 40)], dim=1)

    one_layer = extend_context(build("llama", max_position_embeddings=16, num_hidden_layers=1), "dynamic_yarn", 4.0)
    assert (decoded_logits(one_layer, x, 4)[:, 4:] - prefix_passes(one_layer)).abs().max().item() <= tol
    assert (decoded_logits(model, x, 4)[:, 4:] - prefix_passes(model)).abs().max().item() > 1e-3


def test_dynamic_yarn_refuses_what_transformers_cannot_load_and_dynamic_cache_elsewhere():
    # (Gemma 2's soft-capped layers take it: posenc's attention soft-caps; tested above)
    with pytest.raises(InvalidArgument, match="longrope"):  # transformers' Phi3Config takes longrope only
        extend_context(build("phi3", max_position_embeddings=16), "dynamic_yarn", 4.0)
    with pytest.raises(InvalidArgument, match="dynamic_cache"):
        extend_context(build("llama"), "yarn", 4.0, dynamic_cache="frozen")
    with pytest.raises(InvalidArgument, match="dynamic_cache"):
        extend_context(build("llama"), "dynamic_yarn", 4.0, dynamic_cache="sometimes")


# -- refusals -------------------------------------------------------------------------------------

@pytest.mark.parametrize("family,method", [("llama", "rerope"), ("llama", "streaming_llm"), ("gemma2", "string"),
                                           ("gpt_oss", "dca"), ("qwen3", "self_extend")])
def test_left_padding_gives_each_row_the_result_of_that_row_alone(family, method):
    """A left-padded row at its own positions (position_ids from the mask, as generate() makes
    them) gets the logits and the generated tokens of that row run alone: the maps read the
    layer's positions, the padding is masked."""
    model = extend_context(build(family), method, **OUTSIDE[method])
    x, pad = tokens(), 5
    mask = torch.ones_like(x)
    mask[1, :pad] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    alone = logits(model, x[1:, pad:])
    padded = logits(model, torch.where(mask.bool(), x, 0), attention_mask=mask, position_ids=positions)
    difference = (padded[1:, pad:] - alone).abs().max().item()
    assert difference <= tolerance(family), f"{family} {method}: {difference}"
    # the check can fail: the padding not masked
    unmasked = logits(model, torch.where(mask.bool(), x, 0), position_ids=positions)
    assert (unmasked[1:, pad:] - alone).abs().max().item() > 1e-3
    options = {"max_new_tokens": 8, "min_new_tokens": 8, "do_sample": False}
    prompt, prompt_mask = torch.where(mask.bool(), x, 0)[:, :16], mask[:, :16]
    batched = model.generate(prompt, attention_mask=prompt_mask, **options)
    assert batched[1, 16:].tolist() == model.generate(x[1:, pad:16], **options)[0, 16 - pad:].tolist()


def test_static_cache_is_refused_at_the_forward():
    model = extend_context(build("llama"), "rerope", window=8, training_length=16)
    with pytest.raises(InvalidArgument, match="StaticCache"):
        model.generate(tokens()[:1, :5], max_new_tokens=3, cache_implementation="static")


@pytest.mark.parametrize("family,match", [
    ("mistral_sliding", "no layer with RoPE and a full span"),
    ("cohere2", "no layer with RoPE and a full span"),
    ("llama4_text", "no layer with RoPE and a full span"),
    ("deepseek_v3", "MLA"),
    ("qwen2_vl", "multi-axis"),
    ("gpt2", "adapter"),
])
def test_families_the_maps_cannot_serve_are_refused_unchanged(family, match):
    from test_integration_families import FAMILIES as ALL
    from test_integration_families import build as build_any

    model = build("mistral", sliding_window=8) if family == "mistral_sliding" else None
    if model is None and family == "gpt2":
        model = T.GPT2LMHeadModel(T.GPT2Config(n_embd=64, n_head=4, n_layer=2, vocab_size=V)).eval()
    if model is None:
        assert family in ALL
        model = build_any(family)
    before = model.config.to_dict()
    with pytest.raises(InvalidArgument, match=match):
        extend_context(model, "self_extend", group_size=2, neighbor_window=4)
    assert model.config.to_dict() == before


def test_bad_arguments_are_refused_naming_them():
    model = build("llama")
    with pytest.raises(InvalidArgument, match="takes no factor"):
        extend_context(model, "self_extend", 2.0)
    with pytest.raises(InvalidArgument, match=r"unknown parameter\(s\) \['window'\]"):
        extend_context(model, "self_extend", window=4)
    with pytest.raises(InvalidArgument, match="local_value"):
        extend_context(model, "string")  # shifted_offset int(0.33 * 64) = 21 <= local_value 128
    with pytest.raises(InvalidArgument, match=r"method must be one of the scalings .*'yarn'.* maps .*'self_extend'"):
        extend_context(model, "selfextend", 2.0)
    with pytest.raises(MissingKey, match="factor"):
        extend_context(model, "yarn")
    with pytest.raises(InvalidArgument, match="leaky_rerope"):
        extend_context(build("gpt_oss"), "leaky_rerope", window=4)
    with pytest.raises(InvalidArgument, match="windowed_yarn rotates its far keys with its own scaling"):
        extend_context(build("gpt_oss"), "windowed_yarn", 2.0)
    assert "posenc_context_extension" not in model.config.to_dict()


def test_published_defaults_scale_with_the_training_length_and_read_qwen_dca():
    config = T.LlamaConfig(max_position_embeddings=4096)
    assert hf_branches.method_defaults("dca", config) == {"chunk_size": 3072, "local_size": 256}
    assert hf_branches.method_defaults("string", config)["shifted_offset"] == 1351
    assert hf_branches.method_defaults("rerope", config) == {"window": 512, "training_length": 4096}
    assert hf_branches.method_defaults("lm_infinite", config) == {"local_branch": 4096, "global_branch": 100}
    qwen = T.Qwen2Config(max_position_embeddings=32768)
    qwen.dual_chunk_attention_config = {"chunk_size": 262144, "local_size": 8192, "original_max_position_embeddings": 32768}
    assert hf_branches.method_defaults("dca", qwen) == {"chunk_size": 262144, "local_size": 8192}


def test_a_second_extension_replaces_the_first_and_use_encoding_undoes_it():
    from posenc.hf_config import position_plan
    from posenc.integrations.transformers import use_encoding

    x = tokens()
    plain = logits(build("llama"), x)
    model = extend_context(build("llama"), "self_extend", group_size=3, neighbor_window=8)
    extend_context(model, "rerope", window=8, training_length=16)
    expected = logits(extend_context(build("llama"), "rerope", window=8, training_length=16), x)
    torch.testing.assert_close(logits(model, x), expected, atol=1e-6, rtol=0)
    use_encoding(model, position_plan(model.config))
    assert "posenc_context_extension" not in model.config.to_dict()
    torch.testing.assert_close(logits(model, x), plain, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["qwen3_next", "stablelm", "persimmon", "mixtral", "qwen3_moe", "phi",
                                    "gemma4_text"])
def test_more_families_inside_the_window_and_with_the_cache(family):
    """The families of test_integration_families not above: inside its window a map is the plain
    model; with the cache, token by token = the full pass within the plain model's own
    cached-vs-full noise (Qwen3-Next's linear-attention layers: 3e-5)."""
    from test_integration_families import build as build_any

    x = tokens(batch=1)
    plain = build_any(family)
    inside = extend_context(build_any(family), "self_extend", **INSIDE["self_extend"])
    assert (logits(inside, x) - logits(plain, x)).abs().max().item() <= 1e-5
    model = extend_context(build_any(family), "rerope", **OUTSIDE["rerope"])
    own_noise = (decoded_logits(plain, x, 5) - logits(plain, x)).abs().max().item()
    assert (decoded_logits(model, x, 5) - logits(model, x)).abs().max().item() <= max(1e-5, 2 * own_noise)
    assert (logits(model, x) - logits(plain, x)).abs().max().item() > 1e-3


def test_dca_reads_qwens_dual_chunk_attention_config():
    """Qwen2.5-1M / Qwen3 configs carry dual_chunk_attention_config: extend_context(model, "dca")
    takes its chunk_size and local_size, and runs the same map as those given by hand."""
    x = tokens()
    config_block = {"chunk_size": 12, "local_size": 2, "original_max_position_embeddings": 64}
    model = extend_context(build("qwen2", dual_chunk_attention_config=config_block), "dca")
    assert model.config.posenc_context_extension["params"] == {"chunk_size": 12, "local_size": 2}
    by_hand = extend_context(build("qwen2"), "dca", chunk_size=12, local_size=2)
    torch.testing.assert_close(logits(model, x), logits(by_hand, x), atol=0, rtol=0)
