"""The results of ``posenc lengthgen`` from its run records: per task and row the means over
seeds of each size's accuracies (:func:`aggregate`), the rows ranked per task with their mean
reciprocal rank (:func:`rankings`), and results.csv (:func:`write_csv`). Pure functions of the
records and the config: no model, no file read.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path

from posenc.lab.experiments.frame import (
    cells_over_seeds,
    evals_by_seed,
    merged_not_applicable,
    spread,
)
from posenc.lab.experiments.frame import (
    write_csv as write_csv_rows,
)
from posenc.lab.experiments.lengthgen_config import LengthgenConfig
from posenc.lab.experiments.runs import is_diverged
from posenc.lab.experiments.tasks import get_task


def aggregate(config: LengthgenConfig, records: Sequence[dict]) -> dict:
    """results.json's ``results``: per task and row, the mean over seeds of each size's
    accuracies, their spread, and each seed's cells (schema in the module docstring)."""
    results: dict[str, dict] = {}
    for task in config.tasks:
        n = config.task_train_size(task)
        results[task] = {}
        for row in config.rows_of(task):
            every = [r for r in records if r["task"] == task and r["encoding"] == row]
            runs = [r for r in every if not is_diverged(r)]
            diverged = {str(r["seed"]): r["diverged"] for r in every if is_diverged(r)}
            if not runs:  # every seed diverged: no scores, the row says so
                results[task][row] = {"train_size": n, "size_unit": get_task(task).size_unit, "parameters": None,
                                      "eval": {}, "not_applicable": {}, "runs": {}, "diverged": diverged}
                continue
            evals = {}
            for size, cells in cells_over_seeds([r["eval"] for r in runs], config.eval_sizes(task)):
                accuracies = [c["accuracy"] for c in cells]
                cell = {
                    "factor": int(size) / n, "accuracy": statistics.fmean(accuracies), "accuracy_std": spread(accuracies),
                    "token_accuracy": statistics.fmean(c["token_accuracy"] for c in cells),
                    "instances": cells[0]["instances"], "seeds": len(cells),
                }
                if "by_depth" in cells[0]:
                    cell["by_depth"] = {d: statistics.fmean(c["by_depth"][d] for c in cells) for d in cells[0]["by_depth"]}
                evals[size] = cell
            results[task][row] = {
                "train_size": n, "size_unit": get_task(task).size_unit, "parameters": runs[0]["parameters"],
                "eval": evals, "not_applicable": merged_not_applicable(runs), "runs": evals_by_seed(runs),
            }
            if "positions" in runs[0]:
                results[task][row]["positions"] = runs[0]["positions"]
            if "extension" in runs[0]:
                results[task][row]["extension"] = runs[0]["extension"]
            if diverged:
                results[task][row]["diverged"] = diverged
    return results


#: The sizes, as multiples of N, that :func:`rankings` ranks the rows at.
RANK_FACTORS = (2.0, 4.0)
#: Accuracy at N from which a row counts as having learned a task (the issue's bar).
LEARNED_ACCURACY = 0.9


def fractional_ranks(scores: Sequence[float]) -> list[float]:
    """1-based ranks of ``scores``, highest first; tied scores share the mean of their ranks
    (two rows tied for first both rank 1.5)."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    ranks = [0.0] * len(scores)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and scores[order[end + 1]] == scores[order[start]]:
            end += 1
        for k in range(start, end + 1):
            ranks[order[k]] = (start + end) / 2 + 1
        start = end + 1
    return ranks


def _accuracy_at(result: dict, factor: float) -> float | None:
    """A row's accuracy at size factor * N; 0 where the size was not applicable (the
    encoding cannot represent it); None where no evaluation size has this factor."""
    for cell in result["eval"].values():
        if math.isclose(cell["factor"], factor):
            return cell["accuracy"]
    if any(math.isclose(int(size) / result["train_size"], factor) for size in result["not_applicable"]):
        return 0.0
    return None


def rankings(results: dict, factors: Sequence[float] = RANK_FACTORS) -> dict:
    """The rows ranked per task by accuracy at factor * N, and each row's mean reciprocal rank
    over the tasks (the NoPE paper's summary statistic, Kazemnejad et al. 2023, section 4).

    Returns ``{"learned_at_n": {task: [rows with accuracy >= LEARNED_ACCURACY at N]},
    "<factor>": {"per_task": {task: [{"row", "accuracy", "rank"}, ...] best first},
    "mean_reciprocal_rank": {row: float}}}`` (factor formatted ``%g``); ties share their mean
    rank (:func:`fractional_ranks`). Rows that did not learn a task are ranked too, as the
    paper does; ``learned_at_n`` says which ones did.
    """
    ranked: dict = {"learned_at_n": {
        task: [row for row, res in rows.items() if (_accuracy_at(res, 1.0) or 0.0) >= LEARNED_ACCURACY]
        for task, rows in results.items()
    }}
    for factor in factors:
        per_task, reciprocal = {}, {}
        for task, rows in results.items():
            scored = [(row, _accuracy_at(res, factor)) for row, res in rows.items()]
            scored = [(row, acc) for row, acc in scored if acc is not None]
            if not scored:
                continue
            ranks = fractional_ranks([acc for _, acc in scored])
            entries = sorted(({"row": row, "accuracy": acc, "rank": rank} for (row, acc), rank in zip(scored, ranks)),
                             key=lambda e: e["rank"])
            per_task[task] = entries
            for entry in entries:
                reciprocal.setdefault(entry["row"], []).append(1 / entry["rank"])
        ranked[f"{factor:g}"] = {
            "per_task": per_task,
            "mean_reciprocal_rank": {row: statistics.fmean(r) for row, r in reciprocal.items()},
        }
    return ranked


#: The columns of results.csv, one row per (task, row, size).
CSV_COLUMNS = ("task", "encoding", "train_size", "size", "factor", "accuracy", "accuracy_std", "token_accuracy",
               "instances", "seeds")


def write_csv(path: Path, summary: dict) -> None:
    """results.csv: one row per (task, encoding row, evaluation size); accuracies in [0, 1]
    (empty where the size is not applicable)."""
    write_csv_rows(path, CSV_COLUMNS, (
        _csv_row(task, row, res, size)
        for task, rows in summary["results"].items() for row, res in rows.items()
        for size in summary["config"]["task_settings"][task]["eval_sizes"]
    ))


def _csv_row(task: str, row: str, res: dict, size: int) -> list:
    cell, n = res["eval"].get(str(size)), res["train_size"]
    if cell is None:
        return [task, row, n, size, f"{size / n:g}", "", "", "", "", 0]
    return [task, row, n, size, f"{size / n:g}", f"{cell['accuracy']:.4f}", f"{cell['accuracy_std']:.4f}",
            f"{cell['token_accuracy']:.4f}", cell["instances"], cell["seeds"]]


__all__ = ["CSV_COLUMNS", "LEARNED_ACCURACY", "RANK_FACTORS", "aggregate", "fractional_ranks", "rankings", "write_csv"]
