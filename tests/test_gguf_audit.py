"""``posenc audit FILE.gguf [--against config.json]``, run in-process (posenc.lab.cli.main).

The tiny files of tests/gguf_files.py (written as convert_hf_to_gguf.py writes each
architecture) beside their source configs: a faithful file audits clean against its config;
each known conversion bug (a mutated file) exits 1 naming the GGUF key; hostile files exit 2
with one line and no traceback. The second comparison, against the config transformers' own GGUF
loader builds, is checked against that config read directly (its rope dict, its bases), and
shown to follow it (a loader that kept the scaling: no finding).
"""

from __future__ import annotations

import json
import struct

import pytest

pytest.importorskip("transformers")
pytest.importorskip("gguf")

from gguf_files import CONFIGS, V, _header, _string, convert, write

from posenc.integrations import gguf_audit
from posenc.integrations.gguf_audit import (
    audit_gguf,
    is_gguf_file,
    transformers_gguf_config,
)
from posenc.lab.cli import main

#: Gemma 3 270M's shape (no rope scaling on the global layers): transformers builds its plan.
GEMMA3_270M = dict(CONFIGS["gemma3"], rope_scaling=None)


def run(capsys, *argv):
    code = main(["audit", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def files(tmp_path, name: str, converted=None, config: dict | None = None):
    """The GGUF file (``converted``, else the faithful conversion) and its source config.json."""
    config = CONFIGS[name] if config is None else config
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return write(folder / "model.gguf", convert(config) if converted is None else converted), folder / "config.json"


def against_config(capsys, tmp_path, name, converted=None, config=None):
    path, config_path = files(tmp_path, name, converted, config)
    code, out, err = run(capsys, path, "--against", config_path)
    section = out.split("against config.json")[1].split("against transformers")[0]
    return code, section, out + err


# -- a faithful file ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_faithful_file_is_its_config(tmp_path, name):
    path, config_path = files(tmp_path, name)
    report = audit_gguf(path, against=config_path)
    assert report.config is not None and report.config.differences == () and report.config.findings == ()


@pytest.mark.parametrize("config", [CONFIGS["qwen3"], GEMMA3_270M], ids=["qwen3", "gemma3-unscaled"])
def test_a_clean_file_and_its_config_exit_0(tmp_path, capsys, config):
    path, config_path = files(tmp_path, config["model_type"], config=config)
    code, out, err = run(capsys, path, "--against", config_path)
    assert code == 0, out + err
    assert out.count(": the same plan") == 2 and "DIFFERENCE" not in out
    assert "plan of the file" in out and "note: GGUF" in out


def test_dispatch_by_magic_and_the_options(tmp_path, capsys):
    path, config_path = files(tmp_path, "qwen3")
    renamed = path.rename(path.with_name("model.bin"))
    assert is_gguf_file(renamed) and is_gguf_file(tmp_path / "absent.GGUF") and not is_gguf_file(config_path)
    assert run(capsys, renamed)[0] == 0
    code, _, err = run(capsys, renamed, "--length", "8")
    assert code == 2 and "--length is for a config.json" in err
    code, _, err = run(capsys, config_path, "--against", config_path)
    assert code == 2 and "--against is for a GGUF file" in err


# -- the known conversion bugs ------------------------------------------------------------------------

def _yarn_factor_in_ext_factor():
    c = convert(CONFIGS["qwen2.5-yarn"]).drop("rope.scaling.factor")
    c.put("rope.scaling.yarn_ext_factor", 4.0, V.FLOAT32)
    return c


def _qwen3moe_without_yarn():
    c = convert(CONFIGS["qwen3moe-yarn"])
    for suffix in ("rope.scaling.type", "rope.scaling.factor", "rope.scaling.original_context_length"):
        c.drop(suffix)
    return c


def _gemma3_pattern_unfilled():
    c = convert(CONFIGS["gemma3"])
    c.put("attention.sliding_window_pattern", [False] * 12, V.ARRAY, V.BOOL)
    return c


def _without_tensors(name):
    c = convert(CONFIGS[name])
    c.tensors.clear()
    return c


GEMMA3_LOCAL_50K = dict(CONFIGS["gemma3"], rope_local_base_freq=50000.0)
GPT_OSS_UNTRUNCATED = dict(CONFIGS["gpt-oss"], rope_scaling=dict(CONFIGS["gpt-oss"]["rope_scaling"], truncate=False))

#: (case, source config, the file, the (field, GGUF key) the audit must name).
BUGS = [
    ("yarn factor in yarn_ext_factor", "qwen2.5-yarn", None, _yarn_factor_in_ext_factor,
     ("factor", "qwen2.rope.scaling.factor")),
    ("qwen3moe without its YaRN keys", "qwen3moe-yarn", None, _qwen3moe_without_yarn,
     ("rope_type", "qwen3moe.rope.scaling.type")),
    ("gemma3 without its sliding window", "gemma3", None,
     lambda: convert(CONFIGS["gemma3"]).drop("attention.sliding_window"), ("span", "gemma3.attention.sliding_window")),
    ("gemma3 layer pattern unfilled", "gemma3", None, _gemma3_pattern_unfilled,
     ("span", "gemma3.attention.sliding_window_pattern")),
    ("gemma3 freq_base_swa unfilled", "gemma3", GEMMA3_LOCAL_50K,
     lambda: convert(GEMMA3_LOCAL_50K).drop("rope.freq_base_swa"), ("base", "gemma3.rope.freq_base_swa")),
    ("phi3 LongRoPE factors dropped", "phi3.5-longrope", None, lambda: _without_tensors("phi3.5-longrope"),
     ("frequencies", "rope_factors_long.weight / rope_factors_short.weight (absent)")),
    ("phi3 attention factor dropped", "phi3.5-longrope", None,
     lambda: convert(CONFIGS["phi3.5-longrope"]).drop("rope.scaling.attn_factor"),
     ("attention_factor", "phi3.rope.scaling.attn_factor")),
    ("llama3.1 rope_freqs dropped", "llama3.1", None, lambda: _without_tensors("llama3.1"),
     ("rope_type", "llama.rope.scaling.type (absent) / rope_freqs.weight (absent)")),
    ("deepseek without its log multiplier", "deepseek-v2-lite", None,
     lambda: convert(CONFIGS["deepseek-v2-lite"]).drop("rope.scaling.yarn_log_multiplier"),
     ("attention_factor", "deepseek2.rope.scaling.factor (0.1 ln s + 1), deepseek2.rope.scaling.attn_factor")),
    ("gpt-oss truncate: false", "gpt-oss", GPT_OSS_UNTRUNCATED, lambda: convert(GPT_OSS_UNTRUNCATED),
     ("truncate", None)),
]


@pytest.mark.parametrize(("name", "config", "make", "named"), [case[1:] for case in BUGS], ids=[case[0] for case in BUGS])
def test_each_conversion_bug_exits_1_naming_the_key(tmp_path, capsys, name, config, make, named):
    code, section, everything = against_config(capsys, tmp_path, name, make(), config)
    assert code == 1, everything
    assert "difference(s)" in section and "Traceback" not in everything
    field, key = named
    rows = [line for line in section.splitlines() if line.startswith("DIFFERENCE") and f": {field}" in line]
    assert rows, section
    if key is not None:
        assert any(f"{field} ({key})" in row for row in rows), rows


def test_the_yarn_ext_factor_note(tmp_path, capsys):
    _, _, everything = against_config(capsys, tmp_path, "qwen2.5-yarn", _yarn_factor_in_ext_factor())
    assert "note: qwen2.rope.scaling.yarn_ext_factor = 4.0 is not read by llama.cpp's qwen2" in everything
    assert "the file says 1.0, the config 4.0" in everything


# -- transformers' GGUF loader ------------------------------------------------------------------------

def _rope_dicts(config) -> list[dict]:
    """The rope dicts of a transformers config, per layer type where it has them."""
    params = config.rope_parameters
    return list(params.values()) if all(isinstance(v, dict) for v in params.values()) else [params]


@pytest.mark.parametrize(("name", "dropped"), [
    ("qwen2.5-yarn", ("qwen2.rope.scaling.type = 'yarn', qwen2.rope.scaling.factor = 4.0, "
                     "qwen2.rope.scaling.original_context_length = 32768")),
    ("qwen3moe-yarn", "qwen3moe.rope.scaling.type = 'yarn'"),
    ("llama3.1", "rope_freqs.weight"),
    ("phi3.5-longrope", "rope_factors_long.weight, rope_factors_short.weight"),
    ("gemma3", "gemma3.rope.scaling.type = 'linear', gemma3.rope.scaling.factor = 8.0"),
])
def test_the_loader_drops_the_scaling(tmp_path, capsys, name, dropped):
    """transformers 5.24's loader rebuilds no rope scaling but gpt-oss's: read its config directly
    (every rope dict 'default'), then the audit names the file's scaling keys and tensors."""
    path, _ = files(tmp_path, name)
    assert {d.get("rope_type") for d in _rope_dicts(transformers_gguf_config(path))} == {"default"}
    code, out, err = run(capsys, path)
    assert code == 1, out + err
    finding = next(line for line in out.splitlines() if line.startswith("DIFFERENCE transformers' GGUF loader drops"))
    assert dropped in finding and "the model it builds is unscaled" in finding


def test_the_loader_replaces_gemma3_local_base(tmp_path, capsys):
    """The loader maps no rope.freq_base_swa: Gemma3TextConfig's default local base, 10000."""
    config = dict(GEMMA3_270M, rope_local_base_freq=50000.0)
    path, _ = files(tmp_path, "gemma3", config=config)
    built = transformers_gguf_config(path)
    assert built.rope_parameters["sliding_attention"]["rope_theta"] == 10000.0
    code, out, _ = run(capsys, path)
    assert code == 1
    assert "DIFFERENCE layers 0-4, 6-10: transformers' GGUF loader builds base 10000.0 where the file says 50000.0 " \
           "(gemma3.rope.freq_base_swa)" in out


def test_a_loader_that_kept_the_scaling_finds_nothing(tmp_path, monkeypatch, capsys):
    """The finding follows what the loader builds: a loader that kept Qwen2.5's YaRN (its source
    config) leaves nothing to report, and the audit exits 0."""
    path, _ = files(tmp_path, "qwen2.5-yarn")
    monkeypatch.setattr(gguf_audit, "transformers_gguf_config", lambda _: dict(CONFIGS["qwen2.5-yarn"]))
    code, out, err = run(capsys, path)
    assert code == 0, out + err
    assert "against transformers" in out and ": the same plan" in out


@pytest.mark.parametrize(("name", "reason"), [
    ("gpt-oss", "TypeError"),  # the loader reads each rope.scaling field's key length (parts[0]) as its value
    ("qwen2vl", "architecture qwen2vl is not supported"),
    ("deepseek-v3", "architecture deepseek2 is not supported"),
])
def test_a_file_the_loader_cannot_build_is_said_and_not_a_difference(tmp_path, capsys, name, reason):
    path, _ = files(tmp_path, name)
    code, out, err = run(capsys, path)
    assert code == 0, out + err
    line = next(line for line in out.splitlines() if "not compared" in line)
    assert "it cannot build a config from this file" in line and reason in line


# -- files it cannot read -----------------------------------------------------------------------------

def _one_line_exit_2(capsys, *argv) -> str:
    code, out, err = run(capsys, *argv)
    assert code == 2, out + err
    assert out == "" and err.count("\n") == 1 and err.startswith("posenc: error: ") and "Traceback" not in err
    return err


def test_hostile_files_exit_2_with_one_line(tmp_path, capsys):
    whole = write(tmp_path / "whole.gguf", convert(CONFIGS["phi3.5-longrope"])).read_bytes()
    cut = tmp_path / "cut.gguf"
    for end in (3, 24, len(whole) // 3, len(whole) - 1):
        cut.write_bytes(whole[:end])
        assert "GGUF file" in _one_line_exit_2(capsys, cut)
    huge = tmp_path / "huge.gguf"
    huge.write_bytes(_header([_string("general.architecture") + struct.pack("<I", 8) + _string("llama"),
                              _string("llama.rope.dimension_sections") + struct.pack("<IIQ", 9, 0, 2**40)]) + b"\0" * 64)
    assert "1099511627776" in _one_line_exit_2(capsys, huge)
    for suffix, value, kind, words in (("rope.freq_base", "500000.0", V.STRING, "is STRING; llama.cpp reads it as FLOAT32"),
                                       ("block_count", 4.0, V.FLOAT32, "is FLOAT32; llama.cpp reads it as UINT32")):
        c = convert(CONFIGS["llama3.1"])
        c.put(suffix, value, kind)
        assert words in _one_line_exit_2(capsys, write(tmp_path / "typed.gguf", c))
    unknown = convert(CONFIGS["qwen3"])
    unknown.kv = {key.replace("qwen3.", "mamba9."): value for key, value in unknown.kv.items()}
    unknown.arch = "mamba9"
    assert "'mamba9'" in _one_line_exit_2(capsys, write(tmp_path / "mamba.gguf", unknown))
    not_gguf = tmp_path / "text.gguf"
    not_gguf.write_bytes(b"GGML" + b"\0" * 40)
    assert "not a GGUF" in _one_line_exit_2(capsys, not_gguf)
    assert "cannot read" in _one_line_exit_2(capsys, tmp_path / "absent.gguf")


def test_an_unreadable_config_exits_2(tmp_path, capsys):
    path, config_path = files(tmp_path, "qwen3")
    config_path.write_text("{not json")
    assert "not a readable JSON file" in _one_line_exit_2(capsys, path, "--against", config_path)
    config_path.write_text(json.dumps({"model_type": "not_a_family", "num_hidden_layers": 2}))
    assert "--against" in _one_line_exit_2(capsys, path, "--against", config_path)
