"""posenc.hf_config.extension.plan_extension: a context extension planned from a config dict.

The property checked on every scaling case: the plan the model is to run is the plan the
written config reads (position_plan of the config with the fields written, an independent
reader: transformers' parity of it is tests/test_position_plan.py), layer by layer, while the
layers not scaled keep theirs; the fields are Hugging Face's spelling (extension_config, tested
against transformers in tests/test_hf_config.py). Each refusal is raised from the config alone.
No transformers import (checked in a fresh interpreter).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from posenc.encodings import BranchedRoPE, RoPE
from posenc.errors import InvalidArgument, MissingKey
from posenc.hf_config import ModelFacts, extension_config, plan_extension, position_plan
from posenc.hf_config.extension import CONFIG_KEY

SMALL = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
         "max_position_embeddings": 64, "vocab_size": 128}
LLAMA = dict(SMALL, model_type="llama", rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
GEMMA3 = dict(SMALL, model_type="gemma3_text", num_hidden_layers=4, head_dim=16, sliding_window=8,
              layer_types=["sliding_attention"] * 3 + ["full_attention"],
              rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                               "full_attention": {"rope_type": "default", "rope_theta": 1e6}})
GEMMA2 = dict(SMALL, model_type="gemma2", head_dim=16, sliding_window=8)
QWEN2_VL = {"model_type": "qwen2_vl", "text_config": dict(SMALL, model_type="qwen2_vl_text", rope_parameters={
    "rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]})}
FALCON = dict(SMALL, model_type="falcon", num_kv_heads=4, alibi=False, new_decoder_architecture=False,
              rope_theta=10000.0)
FACTS = ModelFacts(num_layers=2)


def _descriptions(plan):
    return [None if layer.encoding is None else repr(layer.encoding) for layer in plan]


@pytest.mark.parametrize("method,factor", [("yarn", 4.0), ("linear", 2.0), ("llama3", 8.0), ("dynamic", 2.0),
                                           ("ntk", 4.0)])
def test_one_rope_dict_the_plan_is_what_the_written_config_reads(method, factor):
    extension = plan_extension(LLAMA, None, method, factor, facts=FACTS)
    assert extension.fields == extension_config({k: v for k, v in LLAMA.items() if k != "model_type"}, method, factor)
    assert extension.target is None and not extension.position_map
    written = {**LLAMA, **extension.fields}
    assert _descriptions(extension.plan) == _descriptions(position_plan(written))
    assert _descriptions(extension.plan) != _descriptions(position_plan(LLAMA))  # the check can fail


def test_per_layer_type_scales_the_named_types_only():
    own = position_plan(GEMMA3)
    extension = plan_extension(GEMMA3, own, "linear", 8.0, facts=ModelFacts())  # the record: full_attention
    rope = extension.fields["rope_parameters"]
    assert rope["sliding_attention"] == GEMMA3["rope_parameters"]["sliding_attention"]
    assert rope["full_attention"] == {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0}
    written = position_plan({**GEMMA3, **extension.fields})
    assert _descriptions(extension.plan) == _descriptions(written)
    assert _descriptions(extension.plan)[:3] == _descriptions(own)[:3]
    assert _descriptions(extension.plan)[3] != _descriptions(own)[3]
    sliding = plan_extension(GEMMA3, own, "linear", 2.0, facts=ModelFacts(), layer_types=["sliding_attention"])
    assert sliding.fields["rope_parameters"]["full_attention"] == GEMMA3["rope_parameters"]["full_attention"]


def test_nested_text_config_writes_there_and_keeps_mrope_section():
    extension = plan_extension(QWEN2_VL, None, "yarn", 2.0, facts=ModelFacts())
    assert extension.target == "text_config"
    assert extension.fields["rope_parameters"]["mrope_section"] == [2, 3, 3]
    written = {**QWEN2_VL, "text_config": {**QWEN2_VL["text_config"], **extension.fields}}
    assert _descriptions(extension.plan) == _descriptions(position_plan(written))


@pytest.mark.parametrize("config", [dict(LLAMA, model_type="mixtral", head_dim=None),
                                    dict(QWEN2_VL, text_config=dict(QWEN2_VL["text_config"], head_dim=None))])
def test_a_head_dim_of_none_is_written_as_the_width_the_model_computes(config):
    # transformers 5.24's yarn / dynamic / longrope read getattr(config, "head_dim", default): a
    # None there fails a plain from_pretrained (Mixtral); the model itself computes 64 // 4
    extension = plan_extension(config, None, "yarn", 2.0, facts=FACTS)
    assert extension.fields["head_dim"] == SMALL["hidden_size"] // SMALL["num_attention_heads"] == 16
    assert "head_dim" not in plan_extension(LLAMA, None, "yarn", 2.0, facts=FACTS).fields  # absent: not written
    assert "head_dim" not in plan_extension(dict(LLAMA, head_dim=16), None, "yarn", 2.0, facts=FACTS).fields
    with pytest.raises(MissingKey, match="head_dim"):
        plan_extension(dict(LLAMA, head_dim=None, hidden_size=None), None, "yarn", 2.0, facts=FACTS)


def test_adapter_family_with_rope_reads_its_plan_from_the_written_config():
    extension = plan_extension(FALCON, None, "linear", 2.0, facts=ModelFacts())
    assert all(isinstance(layer.encoding, RoPE) and layer.encoding.scaling["factor"] == 2.0 for layer in extension.plan)
    assert _descriptions(extension.plan) == _descriptions(position_plan({**FALCON, **extension.fields}))
    with pytest.raises(InvalidArgument, match="not RoPE on every layer"):
        plan_extension(dict(FALCON, alibi=True), None, "linear", 2.0, facts=ModelFacts())


def test_a_position_map_gives_the_full_rope_layers_a_branched_rope_and_its_record():
    extension = plan_extension(GEMMA2, None, "self_extend", facts=ModelFacts(), group_size=4)
    assert extension.position_map
    assert extension.fields == {CONFIG_KEY: {"format": 1, "method": "self_extend",
                                             "params": {"group_size": 4, "neighbor_window": 1024}, "layers": [1]}}
    own = position_plan(GEMMA2)
    sliding, full = extension.plan
    assert repr(sliding) == repr(own[0])  # the sliding layer keeps its own RoPE
    assert isinstance(full.encoding, BranchedRoPE) and repr(full.encoding.rope) == repr(own[1].encoding)
    assert (full.span, full.layer_type, full.sinks) == (own[1].span, own[1].layer_type, own[1].sinks)
    assert full.encoding.map.group_size == 4


@pytest.mark.parametrize("config,args,kwargs,error,match", [
    (LLAMA, ("self_extend", 2.0), {}, InvalidArgument, "takes no factor"),
    (LLAMA, ("self_extend",), {"layer_types": ["full_attention"]}, InvalidArgument, "applies to every layer"),
    (LLAMA, ("self_extend",), {"window": 4}, InvalidArgument, r"unknown parameter\(s\) \['window'\]"),
    (LLAMA, ("selfextend", 2.0), {}, InvalidArgument, "method must be one of the scalings"),
    (LLAMA, ("yarn",), {}, MissingKey, "factor"),
    (LLAMA, ("yarn", 2.0), {"dynamic_cache": "frozen"}, InvalidArgument, "dynamic_cache: for dynamic"),
    (QWEN2_VL, ("dynamic", 2.0), {"dynamic_cache": "frozen"}, InvalidArgument, "dynamic_cache: not taken"),
    (dict(LLAMA, model_type="gptj"), ("yarn", 2.0), {}, InvalidArgument, "does not read a RoPE scaling"),
    (LLAMA, ("yarn", 2.0), {"layer_types": ["full_attention"]}, InvalidArgument, "one rope dict for every layer"),
    (LLAMA, ("yarn", 0.5), {}, InvalidArgument, "factor"),
    (FALCON, ("self_extend",), {}, InvalidArgument, "adapter"),
    (QWEN2_VL, ("self_extend",), {}, InvalidArgument, "multi-axis"),
    (dict(LLAMA, model_type="deepseek_v3"), ("self_extend",), {}, InvalidArgument, "MLA"),
])
def test_refusals_from_the_config_alone(config, args, kwargs, error, match):
    with pytest.raises(error, match=match):
        plan_extension(config, None, *args, facts=FACTS, **kwargs)


def test_refusals_of_per_layer_type_and_already_scaled_configs():
    own = position_plan(GEMMA3)
    with pytest.raises(InvalidArgument, match="name the ones to scale"):  # a family whose record names none
        plan_extension(dict(GEMMA3, model_type="my_gemma"), own, "yarn", 2.0, facts=ModelFacts())
    with pytest.raises(InvalidArgument, match="not among"):
        plan_extension(GEMMA3, own, "yarn", 2.0, facts=ModelFacts(), layer_types=["global"])
    with pytest.raises(InvalidArgument, match="already scaled"):
        plan_extension(dict(LLAMA, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}), None,
                       "yarn", 2.0, facts=FACTS)
    with pytest.raises(InvalidArgument, match="no layer with RoPE and a full span"):
        plan_extension(dict(SMALL, model_type="mistral", sliding_window=8), None, "self_extend", facts=FACTS)
    with pytest.raises(InvalidArgument, match="runs a plan of use_encoding"):
        plan_extension(LLAMA, position_plan(dict(LLAMA, rope_parameters={"rope_type": "default", "rope_theta": 5.0})),
                       "self_extend", facts=FACTS)


def test_no_transformers_import():
    code = "import sys, posenc.hf_config.extension; sys.exit('transformers' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
