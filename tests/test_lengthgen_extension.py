"""`posenc lengthgen`'s context-extension rows rope+<method>: the trained rope model of a task run
at every size with a RoPE scaling or a branch-merge map, no training (lengthgen_extension.py).
A toy CLI run of the rows (records, fingerprints, resume, the reading), the rows equal to the
rope row inside the training length, the factor per size, the refusals and the preset."""

import csv
import json

import pytest

from posenc.lab.cli import main
from posenc.lab.experiments.extension_methods import BRANCH_METHODS
from posenc.lab.experiments.lengthgen import (
    EXTENSION_ROWS,
    EXTENSION_TASKS,
    LengthgenConfig,
    load_base_model,
    preset_config,
    row_name,
    run_lengthgen,
    score,
)
from posenc.lab.experiments.lengthgen_extension import METHODS, extension_method
from posenc.lab.experiments.lengthgen_report import (
    extension_markdown,
    extension_reading,
)
from posenc.lab.experiments.runs import RunStore
from posenc.lab.experiments.tasks import eval_examples, get_task
from posenc.lab.model import LMConfig
from posenc.lab.train import TrainConfig
from posenc.rope import EXTENSION_METHODS, RoPE, extension_scaling

TINY = ["--steps", "3", "--batch-size", "4", "--d-model", "16", "--layers", "1", "--heads", "2",
        "--eval-instances", "5", "--train-size", "4", "--threads", "1", "--workers", "1"]


def run_cli(args, capsys):
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.slow  # an end-to-end CLI run with resume (the suite's time budget; pytest -m slow)
def test_cli_runs_the_extension_rows_and_resumes(tmp_path, capsys):
    out = tmp_path / "out"
    args = ["lengthgen", "--tasks", "copy,passkey", "--encodings", "rope,nope,rope+yarn,rope+lm_infinite",
            "--task-rows", "passkey=rope+dca", "--seeds", "0,1", "--out", str(out), *TINY]
    code, stdout, err = run_cli(args, capsys)
    assert code == 0, err
    summary = json.loads((out / "results.json").read_text())
    assert list(summary["results"]["copy"]) == ["rope", "nope", "rope+yarn", "rope+lm_infinite"]
    assert list(summary["results"]["passkey"]) == ["rope", "nope", "rope+yarn", "rope+lm_infinite", "rope+dca"]
    sizes = summary["config"]["task_settings"]["copy"]["eval_sizes"]
    yarn = summary["results"]["copy"]["rope+yarn"]
    assert list(yarn["eval"]) == [str(s) for s in sizes] and set(yarn["runs"]) == {"0", "1"}
    # copy at N = 4: 4 letters, '=', 4 letters, END = 10 tokens, the L0 of the scaling
    assert yarn["extension"] == {"base": "rope", "method": "yarn", "original_max_position_embeddings": 10,
                                 "factor": "max(1, sequence_length / original_max_position_embeddings)"}
    # DCA's windows scaled to passkey's L0 = 4 filler bytes + 24 (needle, question, key, END) = 28 tokens:
    # chunk 3072 x 28 / 4096 = 21, local 256 x 28 / 4096 = 1.75 -> 2
    dca = summary["results"]["passkey"]["rope+dca"]["extension"]
    assert dca["original_max_position_embeddings"] == 28 and dca["parameters"] == {"chunk_size": 21, "local_size": 2}
    # each record: the rope run's fingerprint (the model it runs), its own row and settings; no checkpoint of its own
    rope_record = json.loads((out / "runs" / "copy-rope-seed1.json").read_text())
    record = json.loads((out / "runs" / "copy-rope+yarn-seed1.json").read_text())
    assert record["fingerprint"] == {**rope_record["fingerprint"], "row": "rope+yarn", "extension": yarn["extension"]}
    assert record["train_seconds"] == 0.0 and record["final_train_loss"] == rope_record["final_train_loss"]
    assert sorted(p.name for p in (out / "checkpoints").glob("*.pt")) == sorted(
        f"{t}-{r}-seed{s}.pt" for t in ("copy", "passkey") for r in ("rope", "nope") for s in (0, 1))
    # the reading and the ranking take the rows as any row
    reading = summary["reading"]
    assert set(reading["generalization"]["passkey"]) == {"rope", "nope", "rope+yarn", "rope+lm_infinite", "rope+dca"}
    for factor in ("2", "4"):
        ranked = {e["row"] for e in summary["ranking"][factor]["per_task"]["passkey"]}
        assert ranked == set(summary["results"]["passkey"])
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert {r["encoding"] for r in rows if r["task"] == "passkey"} == set(summary["results"]["passkey"])
    assert set(reading["extension"]["passkey"]) == {"rope+yarn", "rope+lm_infinite", "rope+dca"}
    assert reading["extension"]["copy"]["rope+yarn"]["accuracy"]["2"] == yarn["eval"]["8"]["accuracy"]
    assert "| passkey | rope+dca |" in (out / "summary.md").read_text()
    assert "(18 runs, 1 at a time; 10 of them extension rows" in " ".join(stdout.split())  # rich wraps lines

    # the same arguments again: every record reused (8 trained, 10 extension), the same results
    code, stdout, _ = run_cli(args, capsys)
    assert code == 0 and stdout.count("already done") == 18
    assert json.loads((out / "results.json").read_text())["results"] == summary["results"]
    # in two worker processes (each loading the rope checkpoint itself): the same results
    two = tmp_path / "two"
    code, _, err = run_cli([*args[:args.index("--out")], "--out", str(two), *TINY[:-1], "2"], capsys)
    assert code == 0, err
    assert json.loads((two / "results.json").read_text())["results"] == summary["results"]


@pytest.fixture(scope="module")
def within_n(tmp_path_factory):
    """copy at N = 4 (L0 = 10 tokens), trained enough (150 steps) that its answers depend on
    the positions (a third of the letters right at size 2), with every RoPE scaling and the two
    maps whose window holds some size <= N."""
    rows = ("rope", *(f"rope+{m}" for m in EXTENSION_METHODS), "rope+lm_infinite", "rope+dca")
    config = LengthgenConfig(
        tasks=("copy",), encodings=rows, train_size=4, steps=150, eval_instances=20, seeds=(0,),
        model=LMConfig(d_model=32, num_layers=1, num_heads=2, mlp_ratio=2), train=TrainConfig(batch_size=16, lr=1e-2),
    )
    out = tmp_path_factory.mktemp("within_n")
    return config, out, run_lengthgen(config, out)


def _records(out, row):
    return json.loads((out / "runs" / f"copy-{row}-seed0.json").read_text())["eval"]


def test_inside_the_training_length_a_row_is_the_rope_row_exactly(within_n):
    # at sizes <= N every scaling's factor is 1 (plain RoPE); LM-Infinite's local branch is L0
    # (every distance inside it up to N), DCA's chunk round(3 x 10 / 4) = 8 tokens holds size 2
    # (6 tokens) only. Their cells (accuracy, token accuracy, the decoded example) are rope's.
    _, out, _ = within_n
    rope = _records(out, "rope")
    plain_up_to = {**{f"rope+{m}": 4 for m in EXTENSION_METHODS}, "rope+lm_infinite": 4, "rope+dca": 2}
    for row, largest in plain_up_to.items():
        cells = _records(out, row)
        for size in ("2", "4"):
            if int(size) <= largest:
                assert cells[size] == rope[size], (row, size)
    # past N the methods act: some row decodes otherwise than rope somewhere (the test can fail)
    past = [s for s in rope if int(s) > 4]
    assert any(_records(out, row)[s]["token_accuracy"] != rope[s]["token_accuracy"] for row in plain_up_to for s in past)


def test_a_scaling_row_runs_at_factor_tokens_over_l0(within_n):
    # copy at 16 letters: 16 + 1 + 16 + 1 = 34 tokens against L0 = 10: YaRN at s = 3.4
    config, out, _ = within_n
    model = load_base_model(config, "copy", 0, RunStore(out), "the test")
    model.encoding = RoPE(model.encoding.head_dim, scaling=extension_scaling("yarn", 3.4, 10))
    result = score(model, eval_examples(get_task("copy"), 16, 20, 0))
    cell = _records(out, "rope+yarn")["16"]
    assert (result["accuracy"], result["token_accuracy"]) == (cell["accuracy"], cell["token_accuracy"])
    assert result["outputs"][0] == cell["example"]["output"]


@pytest.mark.parametrize("args, match", [
    (["--tasks", "copy", "--encodings", "nope,rope+yarn"], "row 'rope+yarn' on copy runs the trained rope model"),
    (["--tasks", "copy,passkey", "--encodings", "nope", "--task-rows", "copy=rope,passkey=rope+dca"],
     "rope is not among passkey's rows ['nope', 'rope+dca']"),
    (["--tasks", "copy", "--train-size", "1", "--encodings", "rope,rope+string"],
     "row 'rope+string' cannot run on copy: its training sequences are 4 tokens"),
    (["--tasks", "copy", "--encodings", "rope,rope+yaml"], "method must be one of ['linear'"),
    (["--tasks", "copy", "--encodings", "rope", "--task-rows", "copy=rope+yaml"], "method must be one of ['linear'"),
])
def test_a_row_that_cannot_run_is_refused_in_one_line(args, match, capsys, tmp_path):
    code, _, err = run_cli(["lengthgen", *args, "--out", str(tmp_path / "out")], capsys)
    assert code == 2
    assert err.startswith("posenc: error:") and err.count("\n") == 1 and match in err, err
    assert not (tmp_path / "out").exists()  # refused before any work


def test_extension_rows_are_not_trained_rows():
    assert [extension_method(r) for r in ("rope+yarn", "rope+self_extend", "rope+rand", "rope", "alibi+yarn")] == [
        "yarn", "self_extend", None, None, None]
    config = LengthgenConfig(tasks=("copy",), encodings=("rope", "rope+yarn"), randomized_positions=64)
    assert config.rows == ["rope", "rope+yarn", "rope+rand"]  # no rope+yarn+rand: it trains nothing
    assert config.trained_jobs() == [("copy", "rope"), ("copy", "rope+rand")]
    assert config.extension_jobs() == [("copy", "rope+yarn")]


def test_extension_preset_runs_every_method_on_the_recall_and_order_tasks():
    config = preset_config("extension")
    assert config.tasks == EXTENSION_TASKS == ("passkey", "flipflop", "copy", "reverse")
    assert config.encodings == EXTENSION_ROWS and config.seeds == (0, 1, 2) and config.eval_instances == 100
    assert set(METHODS) == {*EXTENSION_METHODS, *BRANCH_METHODS} and len(METHODS) == 17
    assert {extension_method(r) for r in config.encodings} - {None} == set(METHODS)
    assert {r for r in config.encodings if extension_method(r) is None} == {"rope", "nope", "alibi"}
    assert len(config.trained_jobs()) * 3 == 36 and len(config.extension_jobs()) * 3 == 204
    assert row_name("copy", "rope+yarn") == "copy-rope+yarn"


def _result(n, accuracies, **extra):
    return {"train_size": n, "not_applicable": {}, **extra,
            "eval": {str(size): {"factor": size / n, "accuracy": a} for size, a in accuracies.items()}}


def test_extension_reading_sets_each_row_beside_the_model_it_extends():
    # flip-flop at N = 6: rope holds 1.0 at N, falls to 0.25 at 2N and 0 at 4N; yarn on it keeps
    # 0.75 at 2N (+0.50) and 0.10 at 4N (+0.10); dca's 4N, not applicable, counts 0 (+0.00); nope
    # extends nothing, and copy has no extension row
    yarn = {"base": "rope", "method": "yarn"}
    results = {"flipflop": {
        "rope": _result(6, {3: 1.0, 6: 1.0, 12: 0.25, 24: 0.0}),
        "rope+yarn": _result(6, {3: 1.0, 6: 1.0, 12: 0.75, 24: 0.1}, extension=yarn),
        "rope+dca": {**_result(6, {3: 1.0, 6: 0.95, 12: 0.5}, extension={"base": "rope", "method": "dca"}),
                     "not_applicable": {"24": "too long"}},
        "nope": _result(6, {3: 1.0, 6: 1.0, 12: 1.0, 24: 1.0}),
    }, "copy": {"rope": _result(4, {4: 1.0, 8: 0.0})}}
    reading = extension_reading(results)
    assert set(reading) == {"flipflop"} and list(reading["flipflop"]) == ["rope+yarn", "rope+dca"]
    assert reading["flipflop"]["rope+yarn"]["accuracy"] == {"1": 1.0, "2": 0.75, "4": 0.1}
    assert reading["flipflop"]["rope+yarn"]["vs_base"] == pytest.approx({"2": 0.5, "4": 0.1})
    assert reading["flipflop"]["rope+dca"] == {"base": "rope", "accuracy": {"1": 0.95, "2": 0.5, "4": 0.0},
                                               "vs_base": pytest.approx({"2": 0.25, "4": 0.0})}
    lines = extension_markdown(reading)
    assert "| flipflop | rope+yarn | 1.00 | 0.75 | 0.10 | +0.50 | +0.10 |" in lines
    assert extension_reading({"copy": results["copy"]}) == {} and extension_markdown({}) == []
