"""A lab row with constructor options (``path[forget_gate=true]``: PaTH-FoX): parsed once into
the Row, spelled back the same, checked before any training, and the model built with them in
``posenc extrapolate`` and ``posenc lengthgen``."""

from __future__ import annotations

import json
import pickle

import pytest

from posenc.errors import InvalidArgument
from posenc.lab.cli import main
from posenc.lab.experiments.extrapolation import ExtrapolationConfig
from posenc.lab.experiments.frame import Row, split_rows
from posenc.lab.model import TransformerLM


def test_a_row_reads_and_spells_its_options():
    row = Row.parse("path[forget_gate=true, w_rank=8,w_shortconv=false]+rand")
    assert row.encoding == "path" and row.randomized
    assert row.options == (("forget_gate", True), ("w_rank", 8), ("w_shortconv", False))
    assert row == "path[forget_gate=true,w_rank=8,w_shortconv=false]+rand"
    assert Row.parse(str(row)) == row and pickle.loads(pickle.dumps(row)).options == row.options
    assert Row.parse("grape_additive[base=2.5]").options == (("base", 2.5),)
    assert Row.parse("x[mode=linear,scale=none]").options == (("mode", "linear"), ("scale", None))
    assert Row.parse("rope").options == ()


def test_commas_inside_options_do_not_split_rows():
    assert split_rows("rope, path[forget_gate=true,w_rank=8],fox") == ["rope", "path[forget_gate=true,w_rank=8]", "fox"]


@pytest.mark.parametrize("spelling, match", [
    ("path[forget_gate]", "key=value"), ("path[=1]", "key=value"), ("path[a=1,a=2]", "each key once"),
    ("path[]", "empty options"), ("path[a=1", "NAME\\[key=value"), ("[a=1]", "NAME\\[key=value"),
    ("rope/nope:4[a=1]", "NAME\\[key=value|not in a plan|options"),
])
def test_a_badly_spelled_option_is_refused(spelling, match):
    with pytest.raises(InvalidArgument, match=match):
        Row.parse(spelling)


@pytest.mark.parametrize("row, match", [
    ("path[forget_gates=true]", "forget_gates"),       # misspelt: the constructor's message
    ("path[forget_gate=1]", "forget_gate must be a bool"),
    ("path[num_heads=2]", "model's size"),
])
def test_a_wrong_option_stops_the_config_before_training(row, match):
    with pytest.raises(InvalidArgument, match=match) as info:
        ExtrapolationConfig.from_preset("quick", encodings=(row,))
    assert row in str(info.value)


def test_the_model_is_built_with_the_options():
    config = ExtrapolationConfig.from_preset("quick", encodings=("path[forget_gate=true]", "path"))
    fox_row, plain_row = config.encodings
    with_gate = TransformerLM(config.model, config.encoding(fox_row))
    without = TransformerLM(config.model, config.encoding(plain_row))
    assert with_gate.encoding.forget_gate and not without.encoding.forget_gate
    assert with_gate.encoding_spec()["kwargs"] == {"forget_gate": True}


def test_extrapolate_and_lengthgen_run_a_row_with_options(tmp_path, capsys):
    corpus = tmp_path / "text.txt"
    corpus.write_text("".join(f"line {i}: x{i % 7} = {i * 5 % 89}\n" for i in range(300)))
    row = "path[forget_gate=true,w_shortconv=true]"
    code = main(["extrapolate", "--encodings", f"rope,{row}", "--seeds", "0", "--d-model", "16", "--layers", "1",
                 "--heads", "2", "--batch-size", "4", "--train-len", "16", "--steps", "3", "--eval-factors", "1,2",
                 "--eval-tokens", "64", "--corpus", str(corpus), "--out", str(tmp_path / "x")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert f"runs rope, {row} x seeds" in captured.out and f"{row} seed 0" in captured.out  # not eaten as markup
    assert f"\n{row} " in captured.out or f"│ {row}" in captured.out  # the table's row label
    results = json.loads((tmp_path / "x" / "results.json").read_text())
    assert list(results["results"]) == ["rope", row] and results["results"][row]["eval"]
    code = main(["lengthgen", "--tasks", "copy", "--encodings", row, "--steps", "2", "--batch-size", "4",
                 "--d-model", "16", "--layers", "1", "--heads", "2", "--eval-instances", "3", "--train-size", "4",
                 "--threads", "1", "--workers", "1", "--out", str(tmp_path / "g")])
    assert code == 0, capsys.readouterr().err
    summary = json.loads((tmp_path / "g" / "results.json").read_text())
    assert list(summary["results"]["copy"]) == [row]
