"""Hostile config.json shapes (issue 22, item 6): ``posenc.from_hf_config``,
``posenc.hf_config.position_plan`` and ``posenc inspect CONFIG.json`` refuse each one with
posenc's documented errors (the CLI: one line, exit 2), and accept the same configs.

Each row of :data:`HOSTILE` runs three ways: the two library readers on the dict (NaN and
inf as Python floats) and ``posenc inspect`` on the file written by Python's json (which
spells them as the NaN / Infinity tokens it reads back). The bounds are those of
:mod:`posenc.hf_config.values` (docs/errors.md, "Malformed configs").
"""

from __future__ import annotations

import json
import warnings

import pytest

from posenc.errors import InvalidArgument, InvalidType, MissingKey
from posenc.hf_config import load_config_json, position_plan
from posenc.hf_config.values import MAX_HEAD_DIM, MAX_POSITIONS
from posenc.lab import cli
from posenc.rope import from_hf_config, inspect_config

NAN, INF = float("nan"), float("inf")
LLAMA = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4, "num_hidden_layers": 2,
         "rope_theta": 10000.0, "max_position_embeddings": 2048}
DROP = object()


def llama(**changes):
    """The base Llama config (head_dim 64) with ``changes``; DROP removes a key."""
    config = dict(LLAMA)
    for key, value in changes.items():
        if value is DROP:
            config.pop(key, None)
        else:
            config[key] = value
    return config


def scaled(rope_type, factor, **more):
    return llama(rope_scaling={"rope_type": rope_type, "factor": factor, **more})


#: (case, config, error class, a fragment of the message)
HOSTILE = [
    # numbers spelled as strings
    ("rope_theta '10000.0'", llama(rope_theta="10000.0"), InvalidType, "rope_theta"),
    ("head_dim '64'", llama(head_dim="64"), InvalidType, "head_dim"),
    ("num_attention_heads '4'", llama(num_attention_heads="4"), InvalidType, "num_attention_heads"),
    ("hidden_size '256'", llama(hidden_size="256"), InvalidType, "hidden_size"),
    ("max_position_embeddings '2048'", llama(max_position_embeddings="2048"), InvalidType, "max_position_embeddings"),
    ("partial_rotary_factor '0.5'", llama(partial_rotary_factor="0.5"), InvalidType, "partial_rotary_factor"),
    ("factor '4.0'", scaled("linear", "4.0"), InvalidType, "factor"),
    ("rope_parameters rope_theta '1e4'", llama(rope_parameters={"rope_type": "default", "rope_theta": "1e4"}),
     InvalidType, "rope_theta"),
    # null for a required key
    ("hidden_size null", llama(hidden_size=None), MissingKey, "hidden_size"),
    ("num_attention_heads null", llama(num_attention_heads=None), MissingKey, "num_attention_heads"),
    ("rope_theta null", llama(rope_theta=None), InvalidType, "rope_theta"),
    # zero or negative sizes, an odd head
    ("num_attention_heads 0", llama(num_attention_heads=0), InvalidArgument, "num_attention_heads"),
    ("num_attention_heads -4", llama(num_attention_heads=-4), InvalidArgument, "num_attention_heads"),
    ("hidden_size 0", llama(hidden_size=0), InvalidArgument, "hidden_size"),
    ("hidden_size -256", llama(hidden_size=-256), InvalidArgument, "hidden_size"),
    ("head_dim 0", llama(head_dim=0), InvalidArgument, "head_dim"),
    ("head_dim -64", llama(head_dim=-64), InvalidArgument, "head_dim"),
    ("head_dim 63", llama(head_dim=63), InvalidArgument, "even"),
    # NaN, infinities, absurd magnitudes
    ("rope_theta NaN", llama(rope_theta=NAN), InvalidArgument, "rope_theta"),
    ("rope_theta inf", llama(rope_theta=INF), InvalidArgument, "rope_theta"),
    ("rope_theta -inf", llama(rope_theta=-INF), InvalidArgument, "rope_theta"),
    ("rope_theta 1e308", llama(rope_theta=1e308), InvalidArgument, "rope_theta"),
    ("rope_theta 1", llama(rope_theta=1), InvalidArgument, "rope_theta"),
    ("linear factor NaN", scaled("linear", NAN), InvalidArgument, "factor"),
    ("linear factor inf", scaled("linear", INF), InvalidArgument, "factor"),
    ("linear factor -inf", scaled("linear", -INF), InvalidArgument, "factor"),
    ("linear factor 1e308", scaled("linear", 1e308), InvalidArgument, "factor"),
    ("yarn factor 1e308", scaled("yarn", 1e308), InvalidArgument, "factor"),
    ("dynamic factor inf", scaled("dynamic", INF), InvalidArgument, "factor"),
    ("llama3 factor NaN", scaled("llama3", NAN, low_freq_factor=1.0, high_freq_factor=4.0), InvalidArgument, "factor"),
    ("factor x context past 2^31", scaled("linear", 2.0**21), InvalidArgument, "2^31"),
    ("yarn L0 '4096'", scaled("yarn", 4.0, original_max_position_embeddings="4096"), InvalidType,
     "original_max_position_embeddings"),
    # sizes that would allocate without bound
    ("head_dim 2^40", llama(head_dim=2**40), InvalidArgument, "65536"),
    ("max_position_embeddings 2^40", llama(max_position_embeddings=2**40), InvalidArgument, "max_position_embeddings"),
    # rope dicts of the wrong type
    ("rope_scaling a list", llama(rope_scaling=[1, 2]), InvalidArgument, "rope_scaling"),
    ("rope_scaling a string", llama(rope_scaling="linear"), InvalidArgument, "rope_scaling"),
    # partial rotary factors with no even rotary width in [2, head_dim]
    ("partial_rotary_factor 2.0", llama(partial_rotary_factor=2.0), InvalidArgument, "partial_rotary_factor"),
    ("partial_rotary_factor 0.0", llama(partial_rotary_factor=0.0), InvalidArgument, "partial_rotary_factor"),
    ("partial_rotary_factor -0.5", llama(partial_rotary_factor=-0.5), InvalidArgument, "partial_rotary_factor"),
    ("partial_rotary_factor NaN", llama(partial_rotary_factor=NAN), InvalidArgument, "partial_rotary_factor"),
    ("partial_rotary_factor 0.01 (width 0)", llama(partial_rotary_factor=0.01), InvalidArgument, "rotary_dim"),
    ("partial_rotary_factor 3/64 (width 3)", llama(partial_rotary_factor=3 / 64), InvalidArgument, "rotary_dim"),
    # inside a rope dict
    ("rope_type a list", llama(rope_scaling={"rope_type": [1], "factor": 2.0}), InvalidType, "rope_type"),
    ("yarn beta_fast 1e308", scaled("yarn", 4.0, beta_fast=1e308), InvalidArgument, "beta_fast"),
    ("longrope short_factor holding NaN", llama(max_position_embeddings=1024, rope_scaling={
        "rope_type": "longrope", "short_factor": [1.0] * 31 + [NAN], "long_factor": [2.0] * 32,
        "original_max_position_embeddings": 256}), InvalidArgument, "short_factor"),
    ("qwen2_vl mrope_section null", {"model_type": "qwen2_vl", "hidden_size": 256, "num_attention_heads": 4,
                                     "num_hidden_layers": 2, "rope_scaling": {"type": "mrope", "mrope_section": None}},
     InvalidType, "mrope_section"),
    ("gemma3 rope_scaling -1", {"model_type": "gemma3_text", "hidden_size": 64, "num_attention_heads": 2,
                                "head_dim": 32, "num_hidden_layers": 6, "rope_scaling": -1}, InvalidArgument,
     "rope_scaling"),
    # hidden_size / heads
    ("hidden_size 250 over 4 heads", llama(hidden_size=250), InvalidArgument, "not divisible"),
    # booleans where numbers are expected (True is an int to Python)
    ("num_attention_heads true", llama(num_attention_heads=True), InvalidType, "num_attention_heads"),
    ("head_dim true", llama(head_dim=True), InvalidType, "head_dim"),
    ("rope_theta true", llama(rope_theta=True), InvalidType, "rope_theta"),
    ("max_position_embeddings true", llama(max_position_embeddings=True), InvalidType, "max_position_embeddings"),
    ("partial_rotary_factor true", llama(partial_rotary_factor=True), InvalidType, "partial_rotary_factor"),
    ("head_dim 64.0", llama(head_dim=64.0), InvalidType, "head_dim"),
    ("num_hidden_layers 0", llama(num_hidden_layers=0), InvalidArgument, "num_hidden_layers"),
    ("num_hidden_layers 2^40", llama(num_hidden_layers=2**40), InvalidArgument, "num_hidden_layers"),
    ("num_hidden_layers '2'", llama(num_hidden_layers="2"), InvalidType, "num_hidden_layers"),
    # context lengths
    ("max_position_embeddings 0", llama(max_position_embeddings=0), InvalidArgument, "max_position_embeddings"),
    ("max_position_embeddings -1", llama(max_position_embeddings=-1), InvalidArgument, "max_position_embeddings"),
    # top levels that are not objects
    ("top level a list", [1, 2], InvalidType, "dict"),
    ("top level a string", "config", InvalidType, "dict"),
    ("top level a number", 3, InvalidType, "dict"),
    # families read through their own readers (from_hf_config goes through position_plan)
    ("cohere2 sliding_window '4096'", {"model_type": "cohere2", "hidden_size": 64, "num_attention_heads": 4,
                                       "num_hidden_layers": 4, "sliding_window": "4096"}, InvalidType, "sliding_window"),
    ("gptj rotary_dim '64'", {"model_type": "gptj", "n_embd": 256, "n_head": 4, "n_layer": 2, "rotary_dim": "64"},
     InvalidType, "rotary_dim"),
    ("gptj n_head 0", {"model_type": "gptj", "n_embd": 256, "n_head": 0, "n_layer": 2, "rotary_dim": 64},
     InvalidArgument, "num_attention_heads"),
    ("gemma3 rope_local_base_freq NaN", {"model_type": "gemma3_text", "hidden_size": 64, "num_attention_heads": 2,
                                         "head_dim": 32, "num_hidden_layers": 6, "rope_local_base_freq": NAN},
     InvalidArgument, "rope_theta"),
    ("falcon max_position_embeddings 0", {"model_type": "falcon", "hidden_size": 64, "num_attention_heads": 4,
                                          "num_hidden_layers": 2, "max_position_embeddings": 0},
     InvalidArgument, "max_position_embeddings"),
]


def quiet(call, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return call(*args, **kwargs)


@pytest.mark.parametrize("case, config, error, fragment", HOSTILE, ids=[row[0] for row in HOSTILE])
def test_the_library_refuses_a_hostile_config(case, config, error, fragment):
    for reader in (from_hf_config, position_plan):
        with pytest.raises(error) as raised:
            quiet(reader, config)
        assert type(raised.value) is error, (reader.__name__, repr(raised.value))  # the documented class, exactly
        assert fragment in str(raised.value), (reader.__name__, str(raised.value))


def run_inspect(capsys, path, tmp_path):
    code = cli.main(["inspect", str(path), "--out", str(tmp_path / "rope.png")])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("case, config, error, fragment", HOSTILE, ids=[row[0] for row in HOSTILE])
def test_inspect_refuses_a_hostile_config_in_one_line(case, config, error, fragment, capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))  # NaN and inf as Python's json tokens NaN, Infinity, -Infinity
    code, _, err = run_inspect(capsys, path, tmp_path)
    assert code == 2, err
    assert err.startswith("posenc: error: ") and err.count("\n") == 1, err
    assert fragment in err or "JSON object" in err, err
    assert not (tmp_path / "rope.png").exists()


def test_a_json_nested_100000_deep_is_refused_naming_the_file(capsys, tmp_path):
    """json.loads raises RecursionError on it: turned into InvalidArgument naming the file."""
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(InvalidArgument, match="nested too deep") as raised:
        load_config_json(path)
    assert str(path) in str(raised.value)
    path.write_text('{"a": ' * 100_000 + "1" + "}" * 100_000)
    code, _, err = run_inspect(capsys, path, tmp_path)
    assert code == 2 and err.count("\n") == 1 and "nested too deep" in err and str(path) in err, err
    code = cli.main(["audit", str(path)])  # posenc audit reads its CONFIG itself
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "nested too deep" in err and str(path) in err, err


@pytest.mark.parametrize("text, kind", [("[1, 2]", "list"), ('"config"', "str"), ("3", "int"), ("null", "NoneType")])
def test_a_file_whose_top_level_is_not_an_object_is_refused(text, kind, capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(InvalidArgument, match=f"must hold a JSON object .* got {kind}"):
        load_config_json(path)
    code, _, err = run_inspect(capsys, path, tmp_path)
    assert code == 2 and err.count("\n") == 1 and "must hold a JSON object" in err, err


def test_head_dim_2_pow_40_is_refused_before_any_allocation():
    """2^39 float64 frequencies would be 4 TB: the bound stops it first (a RuntimeError from
    torch's allocator, or the process killed, would fail this test)."""
    with pytest.raises(InvalidArgument, match=f"must be an integer in \\[1, {MAX_HEAD_DIM}\\]"):
        from_hf_config(llama(head_dim=2**40))


# -- what is accepted: the same on every path, at the edges of each rule -------------------------

#: (case, config, rotary_dim worked out by hand: int(head_dim x partial_rotary_factor))
ACCEPTED = [
    ("partial_rotary_factor 1.0", llama(partial_rotary_factor=1.0), 64),
    ("partial_rotary_factor 0.5", llama(partial_rotary_factor=0.5), 32),
    ("partial_rotary_factor 1/32 (width 2)", llama(partial_rotary_factor=1 / 32), 2),
    ("partial_rotary_factor 0.6 (int(38.4) = 38)", llama(partial_rotary_factor=0.6), 38),
    ("partial_rotary_factor null", llama(partial_rotary_factor=None), 64),
    ("max_position_embeddings null", llama(max_position_embeddings=None), 64),
    ("rope_theta 1e30", llama(rope_theta=1e30), 64),
    ("rope_theta an int", llama(rope_theta=500000), 64),
    ("factor x context = 2^31", scaled("linear", float(MAX_POSITIONS // 2048)), 64),
    ("head_dim given, hidden_size not divisible", llama(hidden_size=250, head_dim=64), 64),
]


@pytest.mark.parametrize("case, config, rotary_dim", ACCEPTED, ids=[row[0] for row in ACCEPTED])
def test_the_readers_accept_the_same_configs(case, config, rotary_dim):
    rope = quiet(from_hf_config, config)
    assert rope.rotary_dim == rotary_dim
    plan = quiet(position_plan, config)
    assert {layer.encoding.rotary_dim for layer in plan} == {rotary_dim}
    report = inspect_config(config, original_context=2048)
    assert report.rotary_dim == rotary_dim and report.head_dim == 64


def test_inspect_accepts_what_from_hf_config_accepts(capsys, tmp_path):
    """The edge rows on the CLI: exit 0 and the rotary width of from_hf_config in the title."""
    pytest.importorskip("matplotlib")
    for case, config, rotary_dim in ACCEPTED[:4]:
        path = tmp_path / "config.json"
        path.write_text(json.dumps(config))
        code, out, err = run_inspect(capsys, path, tmp_path)
        assert code == 0, (case, err)
        assert f"head_dim 64, rotary_dim {rotary_dim}," in " ".join(out.split()), case


def test_the_bounds_are_the_documented_ones():
    assert MAX_HEAD_DIM == 65536 and MAX_POSITIONS == 2**31
    assert from_hf_config(llama(head_dim=MAX_HEAD_DIM)).rotary_dim == MAX_HEAD_DIM
    with pytest.raises(InvalidArgument, match="65536"):
        from_hf_config(llama(head_dim=MAX_HEAD_DIM + 2))
    with pytest.raises(InvalidArgument, match="2147483648"):
        from_hf_config(llama(max_position_embeddings=MAX_POSITIONS + 1))
    assert from_hf_config(llama(max_position_embeddings=MAX_POSITIONS)).max_position_embeddings == MAX_POSITIONS
