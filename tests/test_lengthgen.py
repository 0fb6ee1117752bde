"""`posenc lengthgen` end to end on a tiny model (every output exists and is well formed;
reruns resume), its batches (loss on answer tokens only), its scorer, and, behind `-m slow`,
that the default run learns every task at its training size."""

import csv
import json
import math
import os

import pytest
import torch

from posenc.lab.cli import main
from posenc.lab.experiments.lengthgen import (
    DEFAULT_TASKS, LengthgenConfig, encode_training_batch, fractional_ranks, preset_config, rankings, run_lengthgen,
    score, task_batches,
)
from posenc.lab.experiments.tasks import END, Example, get_task
from posenc.lab.model import LMConfig, TransformerLM
from posenc.lab.train import IGNORE_INDEX, TrainConfig, lr_at

TINY = ["--steps", "3", "--batch-size", "4", "--d-model", "16", "--layers", "1", "--heads", "2",
        "--eval-instances", "5", "--train-size", "4", "--threads", "1"]


def run_cli(args, capsys):
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# 8 runs, 20 s: behind slow (the default suite's time budget; pytest -m slow). By default the CLI
# runs end to end in test_tasks_recall and test_task_positions, and the rankings are tested below
@pytest.mark.slow
def test_lengthgen_end_to_end(tmp_path, capsys):
    out = tmp_path / "out"
    args = ["lengthgen", "--tasks", "copy,passkey", "--encodings", "nope,learned", "--seeds", "0,1", "--out", str(out), *TINY]
    code, stdout, err = run_cli(args, capsys)
    assert code == 0, err
    assert "exact-match accuracy" in stdout and "time per task" in stdout and "mean reciprocal rank" in stdout
    summary = json.loads((out / "results.json").read_text())
    config = summary["config"]
    assert config["tasks"] == ["copy", "passkey"] and config["encodings"] == ["nope", "learned"]
    assert config["task_settings"]["copy"] == {"train_size": 4, "steps": 3, "eval_sizes": [2, 4, 6, 8, 12, 16],
                                               "size_unit": "letters"}
    assert config["model"]["num_layers"] == 1 and config["train"]["stable_frac"] == 0.6
    assert set(summary["results"]) == {"copy", "passkey"}
    for task, rows in summary["results"].items():
        assert set(rows) == {"nope", "learned"}
        for res in rows.values():
            assert res["train_size"] == 4 and res["not_applicable"] == {} and res["parameters"] > 0
            assert list(res["eval"]) == [str(s) for s in config["task_settings"][task]["eval_sizes"]]
            assert set(res["runs"]) == {"0", "1"}
            for size, cell in res["eval"].items():
                assert cell["factor"] == int(size) / 4 and cell["seeds"] == 2 and cell["instances"] == 5
                assert 0 <= cell["accuracy"] <= 1 and 0 <= cell["token_accuracy"] <= 1 and cell["accuracy_std"] >= 0
                runs = [res["runs"][seed][size]["accuracy"] for seed in ("0", "1")]
                assert cell["accuracy"] == pytest.approx(sum(runs) / 2)
                if task == "passkey":
                    assert set(cell["by_depth"]) == {"0", "0.25", "0.5", "0.75", "1"}
    ranking = summary["ranking"]
    assert set(ranking) == {"learned_at_n", "2", "4"} and set(ranking["learned_at_n"]) == {"copy", "passkey"}
    for factor in ("2", "4"):
        for task, entries in ranking[factor]["per_task"].items():
            size = str(int(factor) * 4)
            assert {e["row"]: e["accuracy"] for e in entries} == {
                row: res["eval"][size]["accuracy"] for row, res in summary["results"][task].items()}
        assert set(ranking[factor]["mean_reciprocal_rank"]) == {"nope", "learned"}
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == 2 * 2 * 6
    assert {(r["task"], r["encoding"]) for r in rows} == {(t, e) for t in ("copy", "passkey") for e in ("nope", "learned")}
    assert all(0 <= float(r["accuracy"]) <= 1 and r["seeds"] == "2" for r in rows)
    for name in ("accuracy.png", "heatmap.png", "passkey_depth.png"):
        png = (out / name).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    records = sorted(p.name for p in (out / "runs").glob("*.json"))
    assert records == sorted(f"{t}-{e}-seed{s}.json" for t in ("copy", "passkey") for e in ("nope", "learned") for s in (0, 1))
    record = json.loads((out / "runs" / "passkey-learned-seed0.json").read_text())
    assert record["train_seconds"] > 0 and record["eval_seconds"] > 0
    example = record["eval"]["16"]["example"]
    assert example["prompt"].endswith(" key? ") and example["target"].endswith(END)

    # the same arguments again: every run reused, the same results
    code, stdout, _ = run_cli(args, capsys)
    assert code == 0 and stdout.count("already done") == 8
    assert json.loads((out / "results.json").read_text())["results"] == summary["results"]
    # other arguments on the same folder: refused in one line
    code, _, err = run_cli([*args[:-2], "--steps", "4", "--threads", "1"], capsys)
    assert code == 2 and "other arguments" in err and err.count("\n") == 1


@pytest.mark.parametrize("args, match", [
    (["lengthgen", "--tasks", "copy,kopy"], "unknown task 'kopy'; available: copy, reverse"),
    (["lengthgen", "--encodings", "rotary"], "unknown encoding 'rotary'"),
    (["lengthgen", "--train-size", "0"], "train_size must be an integer >= 1"),
    (["lengthgen", "--tasks", "flipflop", "--train-size", "1"], "below the smallest flipflop instance"),
    (["lengthgen", "--steps", "-1"], "steps must be an integer >= 1"),
    (["lengthgen", "--preset", "huge"], "preset must be one of"),
    (["lengthgen", "--eval-instances", "0"], "eval_instances must be an integer >= 1"),
    (["lengthgen", "--tasks", "copy", "--randomized-positions", "10"], "must be >= 18, the longest copy training sequence"),
    (["lengthgen", "--workers", "0"], "--workers must be an integer >= 1, got 0"),
])
def test_bad_arguments_print_one_line_and_exit_2(args, match, capsys):
    code, _, err = run_cli(args, capsys)
    assert code == 2
    assert err.startswith("posenc: error:") and err.count("\n") == 1 and match in err, err


def test_training_batch_takes_the_loss_on_answer_tokens_only():
    examples = [Example("ab=", "ab"), Example("abcd=", "abcd")]
    inputs, targets = encode_training_batch(examples)
    assert inputs.shape == targets.shape == (2, 9)  # "abcd=abcd." minus one
    first = "ab=ab."
    assert bytes(inputs[0, :5].tolist()).decode() == first[:-1]
    assert targets[0].tolist() == [IGNORE_INDEX, IGNORE_INDEX, *b"ab.", *[IGNORE_INDEX] * 4]
    assert targets[1].tolist() == [IGNORE_INDEX] * 4 + list(b"abcd.")
    # every instance's sequence is the prompt then the target; padding sits after it
    assert bytes(inputs[1].tolist()).decode() == "abcd=abcd"
    generator = torch.Generator().manual_seed(0)
    batch = task_batches(get_task("reverse"), 6)(16, generator)
    again = task_batches(get_task("reverse"), 6)(16, torch.Generator().manual_seed(0))
    assert all(torch.equal(a, b) for a, b in zip(batch, again))
    assert batch[0].shape[1] <= 2 * 6 + 1


def test_warmup_stable_decay_schedule():
    config = TrainConfig(steps=100, lr=1.0, warmup_frac=0.1, stable_frac=0.5, min_lr_frac=0.2)
    rates = [lr_at(step, config) for step in range(100)]
    assert rates[:10] == pytest.approx([(s + 1) / 10 for s in range(10)])  # linear warm-up
    assert rates[10:60] == [1.0] * 50  # stable
    # then a cosine from lr at step 60 to min_lr_frac * lr at the last step, by the formula
    assert rates[60:] == pytest.approx([0.2 + 0.8 * 0.5 * (1 + math.cos(math.pi * (s - 60) / 40)) for s in range(60, 100)])
    plain = TrainConfig(steps=100, lr=1.0, warmup_frac=0.1, min_lr_frac=0.2)
    assert "stable_frac" not in plain.to_dict() and config.to_dict()["stable_frac"] == 0.5
    assert lr_at(10, plain) == pytest.approx(1.0) and lr_at(55, plain) == pytest.approx(0.2 + 0.8 * 0.5 * (1 + math.cos(math.pi * 0.5)))


class Oracle(TransformerLM):
    """Logits that spell out given continuations, one per row (or a fixed wrong one)."""

    def __init__(self, continuations):
        super().__init__(LMConfig(d_model=8, num_layers=1, num_heads=2, max_positions=64), "nope")
        self.continuations = continuations
        self.done = 0

    def forward(self, tokens, positions=None, *, mask=None, cache=None):
        logits = torch.zeros(tokens.shape[0], tokens.shape[1], 256)
        for row, text in enumerate(self.continuations):
            byte = text.encode()[self.done] if self.done < len(text) else ord("?")
            logits[row, -1, byte] = 1.0
        self.done += 1
        if cache is not None:
            cache.update([(torch.zeros(tokens.shape[0], 2, len(cache) + tokens.shape[1], 4),) * 2],
                         cache.key_positions(positions, tokens.shape[0]))
        return logits


def test_score_counts_only_whole_answers():
    examples = [Example("abc=", "abc"), Example("abc=", "abc"), Example("xyz=", "xyz"), Example("xyz=", "xyz")]
    result = score(Oracle(["abc.", "ab.c", "xyz?", "xyz."]), examples)
    assert result["accuracy"] == 0.5 and result["correct"] == 2 and result["instances"] == 4
    assert result["outputs"] == ["abc.", "ab.c", "xyz?", "xyz."]
    assert result["token_accuracy"] == pytest.approx((4 + 2 + 3 + 4) / 16)


def test_config_defaults_and_sizes():
    config = LengthgenConfig()
    assert config.tasks == DEFAULT_TASKS == ("copy", "reverse", "addition", "flipflop", "passkey")
    assert config.encodings == ("nope", "sinusoidal", "learned", "rope", "alibi", "t5")
    config = LengthgenConfig(tasks=("copy", "flipflop"), train_size=6)
    assert config.eval_sizes("copy") == [3, 6, 9, 12, 18, 24]
    assert config.eval_sizes("flipflop") == [3, 6, 9, 12, 18, 24]
    # a learned table as long as the longest evaluation sequence: 24 letters, =, 24 letters, END
    assert config.model_config("copy").max_positions == 50
    assert LengthgenConfig(train_size=5, tasks=("copy",)).eval_sizes("copy") == [3, 5, 8, 10, 15, 20]  # half up
    assert LengthgenConfig().eval_sizes("addition") == [2, 3, 5, 6, 9, 12]
    assert preset_config(num_layers=1).model_config("passkey").num_layers == 1
    randomized = LengthgenConfig(tasks=("copy",), randomized_positions=100)
    assert randomized.rows[-1] == "t5+rand" and randomized.model_config("copy").max_positions == 100
    assert randomized.row_run("copy", "rope+rand", 3)[1].randomized_positions == 100
    assert preset_config("quick").encodings == ("nope", "rope", "alibi")


def test_workers_give_the_results_of_one_process(tmp_path, capsys):
    # two runs trained in two spawned processes: the same records and results as one by one
    base = ["lengthgen", "--tasks", "copy", "--encodings", "nope,rope", *TINY]
    assert run_cli([*base, "--out", str(tmp_path / "one"), "--workers", "1"], capsys)[0] == 0
    code, stdout, err = run_cli([*base, "--out", str(tmp_path / "two"), "--workers", "2"], capsys)
    assert code == 0, err
    assert "2 runs, 2 at a time" in stdout
    one, two = (json.loads((tmp_path / d / "results.json").read_text()) for d in ("one", "two"))
    assert two["results"] == one["results"] and two["ranking"] == one["ranking"]
    # a rerun finds both records: nothing is trained again
    code, stdout, _ = run_cli([*base, "--out", str(tmp_path / "two"), "--workers", "2"], capsys)
    assert code == 0 and stdout.count("already done") == 2


def test_fractional_ranks_share_tied_places():
    assert fractional_ranks([0.2, 0.9, 0.5]) == [3, 1, 2]
    assert fractional_ranks([1.0, 1.0, 0.0, 1.0]) == [2, 2, 4, 2]  # three tied for first: (1 + 2 + 3) / 3
    assert fractional_ranks([0.0, 0.0]) == [1.5, 1.5]


def _result(n, accuracies):
    return {"train_size": n, "not_applicable": {},
            "eval": {str(int(f * n)): {"factor": f, "accuracy": a} for f, a in accuracies.items()}}


def test_rankings_rank_each_task_and_average_reciprocal_ranks():
    results = {
        "copy": {"a": _result(4, {1.0: 1.0, 2.0: 0.5, 4.0: 0.0}), "b": _result(4, {1.0: 0.5, 2.0: 0.7, 4.0: 0.0})},
        "flipflop": {"a": _result(8, {1.0: 0.95, 2.0: 0.9, 4.0: 0.3}), "b": _result(8, {1.0: 1.0, 2.0: 0.1, 4.0: 0.2})},
    }
    ranked = rankings(results)
    assert ranked["learned_at_n"] == {"copy": ["a"], "flipflop": ["a", "b"]}
    assert [e["row"] for e in ranked["2"]["per_task"]["copy"]] == ["b", "a"]
    # at 2N: a is second on copy, first on flip-flop; at 4N a ties b on copy (1.5) and leads flip-flop
    assert ranked["2"]["mean_reciprocal_rank"] == pytest.approx({"a": (1 / 2 + 1) / 2, "b": (1 + 1 / 2) / 2})
    assert ranked["4"]["mean_reciprocal_rank"] == pytest.approx({"a": (1 / 1.5 + 1) / 2, "b": (1 / 1.5 + 1 / 2) / 2})


@pytest.mark.slow
def test_default_run_learns_every_task_at_its_training_size(tmp_path):
    # about 10 minutes on a 2-core machine: one worker process per core, as the CLI's default
    summary = run_lengthgen(preset_config("default"), tmp_path, workers=len(os.sched_getaffinity(0)))
    for task, rows in summary["results"].items():
        n = str(summary["config"]["task_settings"][task]["train_size"])
        best = max(res["eval"][n]["accuracy"] for res in rows.values())
        assert best >= 0.9, f"{task}: best accuracy at N is {best}"
        assert not math.isnan(best)
