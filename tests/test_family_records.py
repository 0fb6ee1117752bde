"""The family table: one :class:`~posenc.hf_config.families.Family` record per model type, read
by the config reader, the integrations (where a model's modules live) and the adapters."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from posenc.errors import InvalidArgument
from posenc.hf_config.families import FAMILIES, TABLE_FORMATS, Family
from posenc.integrations.adapters import ADAPTERS, adapter_of
from posenc.integrations.families import (
    COMPLEX_PAIRS,
    COS_SIN,
    DEINTERLEAVED_COS_SIN,
    PAIR_SIN_COS,
    family_of,
)


def model_of(model_type: str, **config) -> SimpleNamespace:
    return SimpleNamespace(config=SimpleNamespace(model_type=model_type, **config))


def test_every_record_names_what_exists():
    for model_type, family in FAMILIES.items():
        assert family.model_type == model_type
        assert family.text_config is None or family.text_config in FAMILIES, model_type
        assert family.adapter is None or family.adapter in ADAPTERS, model_type
        assert family.tables in TABLE_FORMATS and family.interleaved_tables in (None, *TABLE_FORMATS), model_type
    assert {name for name, family in FAMILIES.items() if family.adapter} == {
        "falcon", "bloom", "mpt", "gpt2", "opt", "t5", "mt5", "switch_transformers", "gpt_bigcode", "biogpt", "umt5"}


@pytest.mark.parametrize("field, value", [("tables", "cos"), ("interleaved_tables", "complex"), ("layout", "split")])
def test_a_record_with_an_unknown_name_is_refused(field, value):
    with pytest.raises(InvalidArgument, match=field):
        Family("x", **{field: value})


def test_family_of_reads_the_record():
    gptj = family_of(model_of("gptj"))
    assert (gptj.tables, gptj.interleaved, gptj.layers, gptj.attention) == (PAIR_SIN_COS, True, "h", "attn")
    llama4 = family_of(model_of("llama4_text"))
    assert (llama4.tables, llama4.base, llama4.interleaved) == (COMPLEX_PAIRS, "model", True)
    assert family_of(model_of("gpt_oss")).sinks == "sinks"
    assert family_of(model_of("qwen2_vl")).text_config == "text_config"
    unknown = family_of(model_of("nonesuch"))  # Llama-shaped
    assert (unknown.layers, unknown.attention, unknown.tables, unknown.interleaved) == ("layers", "self_attn", COS_SIN, False)


def test_the_config_chooses_the_layout_where_the_record_names_its_key():
    assert family_of(model_of("deepseek_v3", rope_interleave=True)).tables is DEINTERLEAVED_COS_SIN
    plain = family_of(model_of("deepseek_v3", rope_interleave=False))
    assert (plain.tables, plain.interleaved) == (COS_SIN, False)


def test_adapter_of_follows_the_record():
    assert adapter_of(model_of("mt5")) is ADAPTERS["t5"]
    assert adapter_of(model_of("gpt2")) is ADAPTERS["gpt2"]
    assert adapter_of(model_of("llama")) is None and adapter_of(model_of("nonesuch")) is None


def test_a_refused_family_s_model_is_refused_with_its_reason():
    """use_encoding and extend_context on a model of a family its record refuses (RoBERTa: no
    decoder layers where a Llama-shaped model has them) say why posenc does not read it, naming
    the positional feature, rather than which attribute is missing."""
    transformers = pytest.importorskip("transformers")
    from posenc.integrations.transformers import extend_context, use_encoding

    config = transformers.RobertaConfig(hidden_size=32, num_attention_heads=2, num_hidden_layers=1,
                                        intermediate_size=32, vocab_size=64, is_decoder=True)
    model = transformers.RobertaForCausalLM(config)
    for call in (lambda: use_encoding(model, "alibi"), lambda: extend_context(model, "yarn", 2.0)):
        with pytest.raises(InvalidArgument, match=r"model \(roberta\): position ids derived from the input ids' padding"):
            call()
    assert "posenc_encoding" not in dict(model.named_modules())
