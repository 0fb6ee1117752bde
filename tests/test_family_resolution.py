"""position_plan reads a model type through its class (issue 34, item 2): an alias
transformers maps, an unknown ``model_type`` whose ``architectures`` names a class of a family
posenc reads, a wrapper around a known ``text_config``; each with a warning naming both types.
The reference: the same config under the family's own ``model_type`` (what transformers
builds for it), read plainly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posenc.errors import InvalidArgument
from posenc.hf_config import position_plan
from posenc.hf_config.families import family_of_class, resolve_family
from posenc.plan import describe_encoding

CONFIGS = Path(__file__).parent / "data" / "configs"

#: Kimi K2's config.json layout, shrunk: DeepSeek-V3's model under its own model_type.
KIMI_K2 = {"model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 256,
           "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 3, "kv_lora_rank": 64,
           "q_lora_rank": 96, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
           "rope_theta": 50000.0, "max_position_embeddings": 131072,
           "rope_scaling": {"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
                            "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}}


def _same(plan, reference):
    assert [(describe_encoding(a.encoding), a.span, a.window) for a in plan] == \
        [(describe_encoding(b.encoding), b.span, b.window) for b in reference]


@pytest.mark.parametrize("name, class_name, family", [
    ("DeepseekV3ForCausalLM", "kimi_k2", "deepseek_v3"),
    ("GPTNeoXRewardModel", "gpt_neox_reward_model", "gpt_neox"),
])
def test_an_unknown_model_type_is_read_through_its_architectures_class(name, class_name, family):
    config = KIMI_K2 if family == "deepseek_v3" else {
        "model_type": class_name, "architectures": [name], "hidden_size": 256, "num_attention_heads": 4,
        "num_hidden_layers": 2, "rotary_pct": 0.25, "rotary_emb_base": 10000, "max_position_embeddings": 2048}
    with pytest.warns(UserWarning, match=f"{class_name!r}.*{family!r}.*{name!r}"):
        plan = position_plan(config)
    _same(plan, position_plan({**config, "model_type": family}))
    assert any(class_name in note and family in note for note in plan.notes)


def test_falcon_s_first_model_types_are_aliases():
    config = json.loads((CONFIGS / "falcon-7b-refinedwebmodel.json").read_text())
    config = {**config, "num_attention_heads": config.pop("n_head"), "num_hidden_layers": config.pop("n_layer")}
    for alias in ("RefinedWeb", "RefinedWebModel"):
        with pytest.warns(UserWarning, match=f"{alias!r} read as 'falcon'"):
            plan = position_plan({**config, "model_type": alias})
        _same(plan, position_plan({**config, "model_type": "falcon"}))


def test_a_wrapper_reads_its_text_model():
    text = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4, "num_hidden_layers": 2,
            "rope_theta": 500000.0, "max_position_embeddings": 4096}
    with pytest.warns(UserWarning, match="'llava'.*'llama'"):
        plan = position_plan({"model_type": "llava", "text_config": text, "vision_config": {"model_type": "clip"}})
    _same(plan, position_plan(text))


def test_what_resolves_nothing_is_still_refused_by_name():
    # a model type and class no record names (XGLM was one until its record refused it by name)
    assert family_of_class("NonesuchForCausalLM") is None and family_of_class(3) is None
    assert family_of_class("LlamaForCausalLM") == "llama" and family_of_class("GPT2LMHeadModel") == "gpt2"
    config = {"model_type": "nonesuch", "architectures": ["NonesuchForCausalLM"], "num_layers": 2}
    assert resolve_family(config) == (config, None)
    with pytest.raises(InvalidArgument, match="'nonesuch'"):
        position_plan(config)
    # a record that refuses its family is found by its class too, and refuses by its reason
    assert family_of_class("XGLMForCausalLM") == "xglm"
    xglm = {"model_type": "xglm", "architectures": ["XGLMForCausalLM"], "num_layers": 2}
    assert resolve_family(xglm) == (xglm, None)
    with pytest.raises(InvalidArgument, match=r"\(xglm\): a fixed sinusoidal table"):
        position_plan(xglm)
    wrapper = {"model_type": "llava", "text_config": {"model_type": "mistral3_text"}}
    with pytest.raises(InvalidArgument, match="'llava'"):
        position_plan(wrapper)


def test_describe_names_the_v4_type_key():
    """Phi-3's longrope and DeepSeek-V3's yarn spelled ``type`` (v4) printed "None x32"."""
    phi = json.loads((CONFIGS / "phi-3.5-mini.json").read_text())
    assert "type" in phi["rope_scaling"] and "rope_type" not in phi["rope_scaling"]
    assert "longrope x32" in position_plan(phi).describe()
    assert "yarn x32" in position_plan({**KIMI_K2, "model_type": "deepseek_v3"}).describe()
    assert "None" not in position_plan(phi).describe()


def test_from_hf_config_of_a_qwen2_vl_config_says_m_rope():
    from posenc.rope import from_hf_config

    config = {"model_type": "qwen2_vl", "hidden_size": 512, "num_attention_heads": 4, "num_hidden_layers": 2,
              "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}
    with pytest.raises(InvalidArgument, match="M-RoPE.*position_plan"):
        from_hf_config(config)
