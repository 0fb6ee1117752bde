"""A run whose loss turns NaN or infinite (issue 22, item 3): stopped and stored as diverged, the
other runs kept, the tables and results.json saying so, exit 2 unless --keep-going; a rerun
reports the stored divergence without training; run records of any other shape are corrupt."""

from __future__ import annotations

import json
import re

import pytest

from posenc.lab.checkpoint import CheckpointMismatch
from posenc.lab.cli import main
from posenc.lab.experiments.extrapolation import ExtrapolationConfig, aggregate
from posenc.lab.experiments.runs import RunStore

TINY = ["--seeds", "0", "--d-model", "16", "--layers", "1", "--heads", "2", "--batch-size", "4"]


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text("".join(f"line {i}: x{i % 7} = {i * 5 % 89}\n" for i in range(400)))
    return path


def extrapolate(corpus, out, lr, *extra):
    return main(["extrapolate", "--encodings", "nope,rope", *TINY, "--train-len", "16", "--steps", "30",
                 "--eval-factors", "1,2", "--eval-tokens", "64", "--lr", str(lr), "--corpus", str(corpus),
                 "--out", str(out), *extra])


def test_a_diverged_sweep_is_stored_shown_and_exits_2(corpus, tmp_path, capsys):
    out = tmp_path / "out"
    assert extrapolate(corpus, out, 1e6) == 2
    captured = capsys.readouterr()
    assert "2 run(s) diverged (nope seed 0, rope seed 0)" in captured.err
    assert "diverged" in captured.out  # the table's cells
    for row in ("nope", "rope"):
        record = json.loads((out / "runs" / f"{row}-seed0.json").read_text())
        assert "diverged at step" in record["diverged"] and "eval" not in record
    results = json.loads((out / "results.json").read_text())["results"]
    assert set(results["rope"]["diverged"]) == {"0"} and results["rope"]["eval"] == {}
    # a rerun trains nothing: it reads the stored divergence, and says so
    assert extrapolate(corpus, out, 1e6) == 2
    assert "stored earlier" in capsys.readouterr().out
    assert extrapolate(corpus, out, 1e6, "--keep-going") == 0


def test_lengthgen_in_worker_processes_stores_divergence(tmp_path, capsys):
    out = tmp_path / "out"
    args = ["lengthgen", "--tasks", "copy", "--encodings", "nope,rope", *TINY, "--train-size", "4", "--steps", "30",
            "--eval-instances", "4", "--lr", "1e6", "--workers", "2", "--out", str(out)]
    assert main(args) == 2
    captured = capsys.readouterr()
    assert "diverged" in captured.out and "run(s) diverged" in captured.err
    results = json.loads((out / "results.json").read_text())["results"]["copy"]
    assert all(set(results[row]["diverged"]) == {"0"} for row in ("nope", "rope"))


def test_the_merge_leaves_diverged_seeds_out_of_the_means():
    config = ExtrapolationConfig.from_options(encodings=("rope",), train_len=8, eval_factors=(1,), seeds=(0, 1))
    cell = {"loss": 1.0, "loss_last": 1.5, "ppl": 2.718281828459045, "bits_per_byte": 1.4426950408889634}
    records = [
        {"encoding": "rope", "seed": 0, "parameters": 10, "eval": {"8": dict(cell)}, "not_applicable": {}},
        {"encoding": "rope", "seed": 1, "diverged": "training diverged at step 3 of 30: loss nan (lr 1000000.0)"},
    ]
    result = aggregate(config, records)["rope"]
    assert result["eval"]["8"]["loss"] == 1.0 and result["eval"]["8"]["seeds"] == 1  # seed 0 alone
    assert result["diverged"] == {"1": records[1]["diverged"]}


@pytest.mark.parametrize("text", ["[]", "null", '"a string"', '{"fingerprint": {}}', '{"fingerprint": {}, "eval": []}',
                                  '{"eval": {}}', '{"fingerprint": {}, "diverged": 3}'])
def test_records_of_another_shape_are_corrupt(tmp_path, text):
    store = RunStore(tmp_path, scores="eval")
    store.record_path("rope", 0).parent.mkdir(parents=True, exist_ok=True)
    store.record_path("rope", 0).write_text(text)
    with pytest.raises(CheckpointMismatch, match="corrupt"):
        store.stored("rope", 0, {})


@pytest.mark.parametrize("cell, field", [
    ({"accuracy": "1.0", "token_accuracy": 1.0}, "eval.8.accuracy"),  # a string where the merge averages
    ({"token_accuracy": 1.0}, "eval.8.accuracy"),  # missing
    ({"accuracy": True, "token_accuracy": 1.0}, "eval.8.accuracy"),  # a bool is not a score
    ({"accuracy": 1.0, "token_accuracy": 1.0, "by_depth": {"0.5": float("inf")}}, "eval.8.by_depth.0.5"),
])
def test_records_with_a_score_that_is_not_a_finite_number_are_corrupt(tmp_path, cell, field):
    store = RunStore(tmp_path, scores="eval", numbers=("accuracy", "token_accuracy"))
    store.record_path("rope", 0).parent.mkdir(parents=True, exist_ok=True)
    store.record_path("rope", 0).write_text(json.dumps({"fingerprint": {}, "eval": {"8": cell}}))
    with pytest.raises(CheckpointMismatch, match=f"rope-seed0.json: corrupt run record: {re.escape(field)} is .*(not a number|non-finite)"):
        store.stored("rope", 0, {})
    good = {"fingerprint": {}, "eval": {"8": {"accuracy": 1.0, "token_accuracy": 1}}}
    store.record_path("rope", 0).write_text(json.dumps(good))
    assert store.stored("rope", 0, {}) == good
