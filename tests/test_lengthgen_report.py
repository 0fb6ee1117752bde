"""Reading `posenc lengthgen`'s results (lengthgen_report): the generalization length, the
all-tie rule and the mean reciprocal rank over the separating tasks on hand-made result tables
(expected values worked by hand in the comments), the comparison with the papers, the depth x
length heatmap of the needle tasks, the presets' contents, and the paper preset refused on a CPU
with its estimate."""

import json

import pytest

from posenc.errors import InvalidArgument
from posenc.lab.cli import main
from posenc.lab.experiments.frame import CORE_ENCODINGS
from posenc.lab.experiments.lengthgen import (
    DEFAULT_TASKS, PAPER_TASKS, LengthgenConfig, check_gpu_preset, gpu_hours, preset_config, rankings, run_flops,
)
from posenc.lab.experiments.lengthgen_report import (
    comparison_markdown, generalization_length, generalization_text, is_all_tie, paper_comparison, reading,
    summary_markdown,
)
from posenc.lab.experiments.tasks import TASKS
from posenc.lab.model import LMConfig
from posenc.lab.train import TrainConfig


def _res(n, accuracies, not_applicable=(), runs=None):
    """A row's results: ``accuracies`` {size: accuracy}, sizes in ``not_applicable`` refused."""
    res = {"train_size": n, "not_applicable": {str(s): "too long" for s in not_applicable},
           "eval": {str(s): {"factor": s / n, "accuracy": a} for s, a in accuracies.items()}}
    if runs is not None:
        res["runs"] = {seed: {str(s): {"accuracy": a} for s, a in cells.items()} for seed, cells in runs.items()}
    return res


# --- generalization length ------------------------------------------------------------------

def test_generalization_length_is_the_largest_size_at_or_past_n_with_090():
    # N = 8: 0.95 at N, a dip to 0.85 at 12, 0.92 at 16, then below: the largest size >= 0.9 is 16 (2N)
    reading_ = generalization_length(_res(8, {4: 1.0, 8: 0.95, 12: 0.85, 16: 0.92, 24: 0.10, 32: 0.0}))
    assert reading_ == {"size": 16, "factor": 2.0, "learned_at_n": True}
    # exactly 0.9 at N and below it past N: N itself
    assert generalization_length(_res(8, {8: 0.9, 16: 0.5}))["size"] == 8
    # a size the encoding cannot represent counts as 0: 16 is not reached
    assert generalization_length(_res(8, {8: 1.0}, not_applicable=(16,)))["size"] == 8
    assert generalization_length(_res(8, {8: 1.0, 16: 0.95}, not_applicable=(24,)))["size"] == 16


def test_a_row_below_090_at_n_has_no_generalization_length():
    # 0.89 at N: not learned, even with 0.95 at 1.5N and 1.0 at N/2
    reading_ = generalization_length(_res(8, {4: 1.0, 8: 0.89, 12: 0.95}))
    assert reading_["size"] is None and reading_["factor"] is None and reading_["learned_at_n"] is False
    assert reading_["why"] == "not learned at N (0.89 < 0.9)"
    assert generalization_text(reading_) == "not learned"
    assert generalization_length(_res(8, {4: 1.0, 16: 1.0}))["why"] == "N not evaluated"
    assert generalization_length(_res(8, {}))["why"] == "no scores (diverged)"
    assert generalization_text(generalization_length(_res(4, {4: 1.0, 8: 0.9}))) == "8 (2N)"


def test_generalization_length_per_seed():
    # seed 0: 1.0 at N and 2N -> 16; seed 1: 0.5 at N -> none; the mean (0.75 at N) -> none
    res = _res(8, {8: 0.75, 16: 1.0}, runs={"0": {8: 1.0, 16: 1.0}, "1": {8: 0.5, 16: 1.0}})
    reading_ = generalization_length(res)
    assert reading_["size"] is None and reading_["per_seed"] == {"0": 16, "1": None}


# --- the all-tie rule and the ranking over the separating tasks -----------------------------

def test_all_tie_means_every_row_equal_at_every_size_past_n():
    zeros = {8: 0.0, 16: 0.0}
    # different at N/2 and N, all 0.00 past N: all-tie
    assert is_all_tie({"a": _res(4, {2: 1.0, 4: 1.0, **zeros}), "b": _res(4, {2: 0.5, 4: 0.1, **zeros})})
    # one instance in 200 right at 4N separates
    assert not is_all_tie({"a": _res(4, {4: 1.0, 8: 0.0, 16: 0.005}), "b": _res(4, {4: 1.0, **zeros})})
    # equal but not zero: still a tie
    assert is_all_tie({"a": _res(4, {8: 0.5, 16: 0.25}), "b": _res(4, {8: 0.5, 16: 0.25})})
    # not applicable reads 0: a row refused at 16 ties a row scoring 0.0 there
    assert is_all_tie({"a": _res(4, {8: 0.0}, not_applicable=(16,)), "b": _res(4, zeros)})
    # a row with no scores (every seed diverged) takes no part; one scored row cannot be separated
    assert is_all_tie({"a": _res(4, zeros), "b": _res(4, {})})
    assert not is_all_tie({"a": _res(4, {8: 0.3, 16: 0.0}), "b": _res(4, zeros), "c": _res(4, {})})


def _three_tasks():
    """copy: all 0 past N (all-tie); flipflop and passkey separate (passkey only at 2N); the
    row d runs on passkey only (a task row)."""
    return {
        "copy": {"a": _res(4, {4: 1.0, 8: 0.0, 16: 0.0}), "b": _res(4, {4: 0.5, 8: 0.0, 16: 0.0}),
                 "c": _res(4, {4: 0.9, 8: 0.0, 16: 0.0})},
        "flipflop": {"a": _res(8, {8: 1.0, 16: 0.9, 32: 0.8}), "b": _res(8, {8: 1.0, 16: 0.5, 32: 0.6}),
                     "c": _res(8, {8: 1.0, 16: 0.5, 32: 0.4})},
        "passkey": {"a": _res(8, {8: 1.0, 16: 0.0, 32: 0.0}), "b": _res(8, {8: 1.0, 16: 1.0, 32: 0.0}),
                    "c": _res(8, {8: 1.0, 16: 0.5, 32: 0.0}), "d": _res(8, {8: 1.0, 16: 0.25, 32: 0.0})},
    }


def test_mrr_is_over_the_separating_tasks_only():
    results = _three_tasks()
    read = reading(results, rankings(results))
    assert read["all_tie"] == ["copy"] and read["separating"] == ["flipflop", "passkey"]
    mrr = read["mean_reciprocal_rank"]
    # 2N: flipflop a 1, b and c tied for 2-3 (2.5); passkey b 1, c 2, d 3, a 4
    assert {row: v["mrr"] for row, v in mrr["2"].items()} == pytest.approx(
        {"a": (1 + 1 / 4) / 2, "b": (1 / 2.5 + 1) / 2, "c": (1 / 2.5 + 1 / 2) / 2, "d": 1 / 3})
    assert {row: v["tasks"] for row, v in mrr["2"].items()} == {"a": 2, "b": 2, "c": 2, "d": 1}
    # 4N: passkey ties every row at 0.0 there: left out at 4N (not all-tie: it separates at 2N);
    # flipflop a 0.8 first, b 0.6 second, c 0.4 third; d runs on passkey only: not ranked at 4N
    assert read["tied_at"] == {"2": ["copy"], "4": ["copy", "passkey"]}
    assert {row: v["mrr"] for row, v in mrr["4"].items()} == pytest.approx({"a": 1, "b": 1 / 2, "c": 1 / 3})
    assert list(mrr["2"]) == ["b", "a", "c", "d"]  # best first
    # the ranking over every task (results.json's "ranking") still counts copy: a tie of three (rank 2)
    assert rankings(results)["2"]["mean_reciprocal_rank"]["a"] == pytest.approx((1 / 2 + 1 + 1 / 4) / 3)
    assert read["generalization"]["flipflop"]["a"]["size"] == 16 and read["generalization"]["copy"]["b"]["size"] is None


def test_no_separating_task_means_no_ranking():
    results = {"copy": _three_tasks()["copy"]}
    read = reading(results, rankings(results))
    assert read["separating"] == [] and read["mean_reciprocal_rank"] == {"2": {}, "4": {}}
    text = summary_markdown({"results": results, "reading": read})
    assert "No task separates the rows: no ranking." in text and "left out of the ranking: copy" in text


# --- against the papers ---------------------------------------------------------------------

def test_paper_comparison_states_each_claim_and_what_was_measured():
    results = {
        "copy": {"nope": _res(4, {4: 1.0, 8: 0.0, 16: 0.0}), "rope": _res(4, {4: 1.0, 8: 0.0, 16: 0.0}),
                 "rope+rand": _res(4, {4: 1.0, 8: 0.2, 16: 0.1})},
        "addition": {"nope": _res(8, {8: 0.5, 16: 0.0, 32: 0.0}), "rope": _res(8, {8: 1.0, 16: 0.0, 32: 0.0}),
                     "rope+rand": _res(8, {8: 0.0, 16: 0.0, 32: 0.0}),
                     "rope+coupled": _res(8, {8: 1.0, 16: 0.95, 32: 0.1})},
    }
    summary = {"results": results, "reading": reading(results, rankings(results))}
    entries = {e["paper"].split(" (")[0]: e for e in paper_comparison(summary)}
    assert set(entries) == {"Kazemnejad et al. 2023", "Ruoss et al. 2023", "Cho et al. 2024", "McLeish et al. 2024"}
    assert "NoPE 0.69" in entries["Kazemnejad et al. 2023"]["claim"]
    # copy at 2N: rope+rand 0.2 first; nope, rope 0.0 tied (2.5); addition at 2N: rope+coupled 0.95 first, rest 0 (3)
    # nope: (1/2.5 + 1/3) / 2 = 0.3667, rope the same
    assert "nope 0.37 > rope 0.37" in entries["Kazemnejad et al. 2023"]["ours"]
    # rope+rand - rope past N: copy (0.2 + 0.1) / 2 - 0 = +0.15; addition 0 - 0 = 0 -> mean +7.5 points, higher on 1/2
    assert entries["Ruoss et al. 2023"]["ours"] == \
        "rope+rand - rope: +7.5 points mean accuracy past N over 2 task(s), higher on 1/2"
    assert entries["Cho et al. 2024"]["ours"] == "rope+coupled: N = 8, generalizes to 16 (2N), 0.95 at 2N"
    assert entries["McLeish et al. 2024"]["ours"].startswith("not run")
    # a row below 0.9 at N says so
    results["addition"]["rope+abacus"] = _res(8, {8: 0.5, 16: 0.0, 32: 0.0})
    summary = {"results": results, "reading": reading(results, rankings(results))}
    abacus = paper_comparison(summary)[3]["ours"]
    assert abacus == "rope+abacus: N = 8, not learned at N (0.50 < 0.9), 0.00 at 2N"
    table = comparison_markdown(summary).splitlines()
    assert table[0] == "| paper | claim | ours |" and len(table) == 2 + 4


# --- the depth x length heatmap ---------------------------------------------------------------

def _needle_summary():
    depths = {"0": 1.0, "0.5": 0.5, "1": 0.0}
    cell = {"factor": 1.0, "accuracy": 0.5, "accuracy_std": 0.0, "by_depth": depths}
    rows = {row: {"train_size": 16, "eval": {"16": cell, "32": {**cell, "factor": 2.0}}, "not_applicable": {}}
            for row in ("rope", "alibi")}
    plain = {"rope": {"train_size": 8, "not_applicable": {},
                      "eval": {"8": {"factor": 1.0, "accuracy": 1.0, "accuracy_std": 0.0}}}}
    settings = {"multikey": {"train_size": 16, "eval_sizes": [16, 32], "size_unit": "filler bytes"},
                "copy": {"train_size": 8, "eval_sizes": [8], "size_unit": "letters"}}
    return {"config": {"task_settings": settings}, "results": {"multikey": rows, "copy": plain}}


def test_depth_heatmap_of_a_needle_task_is_written(tmp_path):
    from posenc.lab.plots import needle_tasks, plot_depth_heatmap, plot_lengthgen

    summary = _needle_summary()
    assert needle_tasks(summary) == ["multikey"]
    path = plot_depth_heatmap(summary, "multikey", tmp_path / "depth.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(InvalidArgument, match="'copy' has no accuracies by depth"):
        plot_depth_heatmap(summary, "copy", tmp_path / "copy.png")
    written = plot_lengthgen(summary, tmp_path / "all")
    assert [p.name for p in written] == ["accuracy.png", "heatmap.png", "multikey_depth.png"]


# --- presets ------------------------------------------------------------------------------------

def test_default_preset_has_the_rows_that_separate_the_encodings():
    config = preset_config("default")
    assert config.tasks == DEFAULT_TASKS
    assert config.encodings == (*CORE_ENCODINGS, "rope+rand", "rope/nope:3")  # randomized, hybrid plan
    assert config.rows_of("addition") == [*config.encodings, "rope+coupled"]  # coupling on addition only
    assert config.rows_of("copy") == list(config.encodings)
    assert len(config.jobs()) == 5 * 8 + 1
    assert config.randomized_positions == config.default_randomized_positions()
    # rows given replace the preset's, task rows included; a plan that names no layer is left out
    assert preset_config("default", encodings=("rope",)).jobs() == [(t, "rope") for t in DEFAULT_TASKS]
    assert "rope/nope:3" not in preset_config("default", num_layers=2).encodings
    with pytest.raises(InvalidArgument, match="nope:3 names no layer of a 2-layer model"):
        preset_config("default", num_layers=2, encodings=("rope/nope:3",))


def test_quick_full_and_paper_presets():
    quick = preset_config("quick")
    assert quick.encodings == ("nope", "rope", "alibi") and quick.tasks == ("copy", "flipflop") and not quick.task_rows
    full = preset_config("full")
    assert full.tasks == tuple(TASKS)
    from posenc.encodings import REGISTRY

    assert set(REGISTRY) <= set(full.encodings)
    paper = preset_config("paper")
    assert paper.tasks == PAPER_TASKS
    assert (paper.model.d_model, paper.model.num_layers, paper.model.num_heads, paper.model.mlp_ratio) == (768, 12, 12, 4)
    assert (paper.task_steps("copy"), paper.train.batch_size, paper.train.lr) == (40000, 64, 3e-5)
    assert paper.task_train_size("copy") == 40 and max(paper.eval_sizes("copy")) == 500
    assert paper.randomized_positions == 2048 and "rope+rand" in paper.encodings
    assert paper.rows_of("addition")[-2:] == ["rope+coupled", "learned+abacus"]


def test_task_rows_are_checked():
    with pytest.raises(InvalidArgument, match="is not TASK=ROW"):
        LengthgenConfig(tasks=("addition",), task_rows=("addition",))
    with pytest.raises(InvalidArgument, match="task"):
        LengthgenConfig(tasks=("addition",), task_rows=("nosuch=rope",))
    with pytest.raises(InvalidArgument, match=r"\+coupled positions have no meaning for the task 'flipflop'"):
        LengthgenConfig(tasks=("flipflop",), task_rows=("flipflop=rope+coupled",))
    # a task row of a task not run is ignored (a preset's survive --tasks)
    assert LengthgenConfig(tasks=("copy",), task_rows=("addition=rope+coupled",)).jobs() == [
        ("copy", row) for row in CORE_ENCODINGS]


# --- the paper preset's estimate, refused on a CPU ----------------------------------------------

def test_run_flops_hand_worked():
    config = LengthgenConfig(tasks=("copy",), train_size=4, steps=10, eval_factors=(1.0,), eval_instances=2,
                             encodings=("rope",), model=LMConfig(d_model=16, num_layers=1, num_heads=2),
                             train=TrainConfig(batch_size=4))
    # copy at 4 letters: "abcd=" + "abcd." = 10 tokens; parameters P = 1000
    # training: (6 P + 6 * 1 layer * 10 * 16) * 10 steps * 4 * 10 tokens = 6960 * 400 = 2,784,000
    # evaluation: 2 P * 2 instances * 10 tokens = 40,000
    assert run_flops(config, "copy", 1000) == 2_784_000 + 40_000


def test_paper_preset_is_refused_on_a_cpu_with_its_estimate(capsys):
    paper = preset_config("paper")
    hours = gpu_hours(paper)
    assert 1 < hours < 100  # one GPU, hours not months
    with pytest.raises(InvalidArgument, match=r"--preset paper trains 72 runs .* days on a CPU .* h on one H100"):
        check_gpu_preset("paper", paper)
    check_gpu_preset("default", preset_config("default"))  # other presets pass
    code = main(["lengthgen", "--preset", "paper"])
    err = capsys.readouterr().err
    assert code == 2 and "--preset paper trains 72 runs" in err and f"{hours:.0f} h on one H100" in err


# --- end to end ---------------------------------------------------------------------------------

def test_cli_prints_and_writes_the_reading(tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["lengthgen", "--tasks", "copy,addition", "--encodings", "nope", "--task-rows", "addition=rope+coupled",
                 "--out", str(out), "--steps", "2", "--batch-size", "4", "--d-model", "16", "--layers", "1",
                 "--heads", "2", "--eval-instances", "3", "--train-size", "3", "--threads", "1", "--workers", "1"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "generalization length" in captured.out and "against the papers" in captured.out
    summary = json.loads((out / "results.json").read_text())
    assert list(summary["results"]["addition"]) == ["nope", "rope+coupled"] and list(summary["results"]["copy"]) == ["nope"]
    assert summary["config"]["task_rows"] == ["addition=rope+coupled"]
    read = summary["reading"]
    assert sorted(read["all_tie"] + read["separating"]) == ["addition", "copy"]
    assert set(read["generalization"]["addition"]) == {"nope", "rope+coupled"}
    text = (out / "summary.md").read_text()
    assert "| addition | 3 | rope+coupled |" in text and "## Against the papers" in text
