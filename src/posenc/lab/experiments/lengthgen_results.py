"""The results of ``posenc lengthgen`` from its run records: per task and row the means over
seeds of each size's accuracies (:func:`aggregate`), the rows ranked per task with their mean
reciprocal rank (:func:`rankings`), and results.csv (:func:`write_csv`). Pure functions of the
records and the config: no model, no file read; and the reading of those results
(:func:`reading`, results.json's ``reading``), whose definitions follow. Accuracies are
fractions of instances in [0, 1] (means over seeds), sizes are in each task's unit.

- **Generalization length** (:func:`generalization_length`): the largest evaluated size whose
  accuracy is >= :data:`GENERALIZATION_ACCURACY` (0.9), among the sizes >= N, provided the
  accuracy at N itself is >= 0.9. A row below 0.9 at N did not learn the task: it has no
  generalization length (None, shown ``not learned``), whatever it scores at smaller or larger
  sizes; a row whose N was not evaluated has none either. A size the encoding cannot represent
  (``not_applicable``) counts as accuracy 0. The largest such size is taken literally: a row at
  0.95 at N, 0.85 at 2N and 0.92 at 3N generalizes to 3N (the curve is read, not smoothed).
- **All-tie task** (:func:`is_all_tie`): at every evaluated size past N (size > N), every row's
  accuracy is exactly equal (as stored: a mean over seeds of hit counts), e.g. all 0.00. Such a
  task gives every row the same rank, so it cannot separate them: it is reported, and left out
  of the mean reciprocal rank (:func:`separating_mrr`). Rows whose every seed diverged (no
  scores) take no part in the comparison; a task with fewer than two scored rows, or no size
  past N, is all-tie (nothing separates). One instance in 200 right is a difference: 0.005
  against 0.000 separates.
- **Mean reciprocal rank over the separating tasks** (:func:`separating_mrr`): per ranked size
  factor (2N, 4N), the mean of 1/rank over the tasks that are not all-tie and, of those, not
  tied at that very size (:func:`tied_at`: every row's accuracy equal at factor x N, e.g. a
  task whose rows differ only at 1.5N); each row's ranks are taken from
  ``ranking[factor]["per_task"]`` (ties share their mean rank). A row ranked on fewer tasks (a
  task row such as ``rope+coupled`` on addition) states how many (``tasks``).
- **Context extensions** (:func:`extension_reading`): for the rows that run another row's
  trained model with a context extension (their results carry ``extension``, e.g. ``rope+yarn``
  on the ``rope`` model: :mod:`posenc.lab.experiments.lengthgen_extension`), the accuracy at N,
  2N and 4N and its difference from the model they extend at 2N and 4N: what the extension
  adds, the trained model held fixed. Read only when such rows ran.
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
    accuracies, their spread, and each seed's cells (schema: :mod:`posenc.lab.experiments.lengthgen`)."""
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


# --- reading the results -------------------------------------------------------------------

#: The accuracy from which a size counts as solved (the issue's bar, as ``LEARNED_ACCURACY``).
GENERALIZATION_ACCURACY = 0.9


def accuracies_by_size(result: dict) -> dict[int, float]:
    """A row's accuracy at every size it was evaluated or refused at (not applicable: 0)."""
    scores = {int(size): 0.0 for size in result.get("not_applicable", {})}
    scores.update({int(size): cell["accuracy"] for size, cell in result.get("eval", {}).items()})
    return scores


def generalization_length(result: dict, threshold: float = GENERALIZATION_ACCURACY) -> dict:
    """How far one row of one task generalizes (the module's definition).

    Args:
        result: a row's results (``train_size`` N, ``eval`` {size: {"accuracy", ...}},
            ``not_applicable`` {size: why}); ``runs`` (each seed's ``eval``) gives ``per_seed``.
        threshold: the accuracy a size needs (default 0.9).

    Returns:
        ``{"size": int | None, "factor": size / N | None, "learned_at_n": bool, "why": str}``
        (``why`` only when ``size`` is None: ``"not learned at N (0.46 < 0.9)"``, ``"N not
        evaluated"``, ``"no scores (diverged)"``), and ``"per_seed"`` {seed: size or None} when
        the result has ``runs``.
    """
    n = result["train_size"]
    scores = accuracies_by_size(result)
    reading: dict
    if not scores:
        reading = {"size": None, "factor": None, "learned_at_n": False, "why": "no scores (diverged)"}
    elif n not in scores:
        reading = {"size": None, "factor": None, "learned_at_n": False, "why": "N not evaluated"}
    elif scores[n] < threshold:
        reading = {"size": None, "factor": None, "learned_at_n": False,
                   "why": f"not learned at N ({scores[n]:.2f} < {threshold:g})"}
    else:
        size = max(s for s, accuracy in scores.items() if s >= n and accuracy >= threshold)
        reading = {"size": size, "factor": size / n, "learned_at_n": True}
    if "runs" in result:
        reading["per_seed"] = {seed: generalization_length(
            {"train_size": n, "eval": cells, "not_applicable": result.get("not_applicable", {})}, threshold)["size"]
            for seed, cells in result["runs"].items()}
    return reading


def is_all_tie(rows: dict) -> bool:
    """Whether a task's rows (``{row: result}``) are all tied past N (the module's definition):
    every scored row's accuracy equal at every evaluated size > N."""
    scored = [accuracies_by_size(result) for result in rows.values() if result.get("eval")]
    if len(scored) < 2:
        return True
    n = next(iter(rows.values()))["train_size"]
    past = sorted({size for scores in scored for size in scores if size > n})
    # a size some row lacks (not evaluated for it) cannot be compared: it is left out
    return all(len({scores[size] for scores in scored}) == 1 for size in past
               if all(size in scores for scores in scored))


def tied_at(ranking: dict) -> dict[str, list[str]]:
    """Per ranked factor of ``ranking``, the tasks whose rows all score the same at that size
    (every accuracy equal; one ranked row counts as tied): ``{factor: [tasks]}``."""
    return {factor: [task for task, entries in ranked["per_task"].items()
                     if len({entry["accuracy"] for entry in entries}) == 1]
            for factor, ranked in ranking.items() if factor != "learned_at_n"}


def separating_mrr(ranking: dict, separating: list[str]) -> dict:
    """Per ranked factor of ``ranking`` (:func:`posenc.lab.experiments.lengthgen.rankings`),
    each row's mean reciprocal rank over the ``separating`` tasks it was ranked on, less those
    tied at that size (:func:`tied_at`: a task that gives every row the same rank there adds the
    same term to every row): ``{factor: {row: {"mrr": float, "tasks": int}}}``, best first; a
    factor with no such task maps to {}."""
    out: dict = {}
    tied = tied_at(ranking)
    for factor, ranked in ranking.items():
        if factor == "learned_at_n":
            continue
        reciprocal: dict[str, list[float]] = {}
        for task, entries in ranked["per_task"].items():
            if task in separating and task not in tied[factor]:
                for entry in entries:
                    reciprocal.setdefault(entry["row"], []).append(1 / entry["rank"])
        table = {row: {"mrr": statistics.fmean(values), "tasks": len(values)} for row, values in reciprocal.items()}
        out[factor] = dict(sorted(table.items(), key=lambda item: -item[1]["mrr"]))
    return out


def reading(results: dict, ranking: dict) -> dict:
    """results.json's ``reading``: ``{"threshold": 0.9, "generalization": {task: {row:
    generalization_length}}, "all_tie": [tasks], "separating": [tasks], "tied_at": {factor:
    [tasks]}, "mean_reciprocal_rank": separating_mrr}`` (the module's definitions), and
    ``"extension"``: :func:`extension_reading` when some row is a context extension."""
    all_tie = [task for task, rows in results.items() if is_all_tie(rows)]
    separating = [task for task in results if task not in all_tie]
    read = {
        "threshold": GENERALIZATION_ACCURACY,
        "generalization": {task: {row: generalization_length(res) for row, res in rows.items()}
                           for task, rows in results.items()},
        "all_tie": all_tie,
        "separating": separating,
        "tied_at": tied_at(ranking),
        "mean_reciprocal_rank": separating_mrr(ranking, separating),
    }
    if extensions := extension_reading(results):  # only with extension rows: other results read as before
        read["extension"] = extensions
    return read


#: The sizes, as multiples of N, that :func:`extension_reading` reads.
EXTENSION_FACTORS = (1, 2, 4)


def extension_reading(results: dict) -> dict:
    """Per task with context-extension rows (a result with ``extension``, whose ``base`` names
    the row it extends), per such row: ``{"base": row, "accuracy": {"1": a, "2": ..., "4": ...},
    "vs_base": {"2": a - base's a, "4": ...}}`` at size factor x N (rounded half up, as the
    evaluation sizes; a factor not evaluated is None, and so is a difference with a side
    missing). Accuracies as stored (means over seeds; not applicable: 0). {} without such rows."""
    out: dict = {}
    for task, rows in results.items():
        extended = {row: res for row, res in rows.items() if res.get("extension")}
        for row, res in extended.items():
            base_row = res["extension"]["base"]
            n = res["train_size"]
            mine, base = accuracies_by_size(res), accuracies_by_size(rows.get(base_row, {}))
            at = {f"{f:g}": mine.get(int(f * n + 0.5)) for f in EXTENSION_FACTORS}
            vs = {f"{f:g}": None if at[f"{f:g}"] is None or base.get(int(f * n + 0.5)) is None
                  else at[f"{f:g}"] - base[int(f * n + 0.5)] for f in EXTENSION_FACTORS if f > 1}
            out.setdefault(task, {})[row] = {"base": base_row, "accuracy": at, "vs_base": vs}
    return out


__all__ = [
    "CSV_COLUMNS", "EXTENSION_FACTORS", "GENERALIZATION_ACCURACY", "LEARNED_ACCURACY", "RANK_FACTORS", "accuracies_by_size",
    "aggregate", "extension_reading", "fractional_ranks", "generalization_length", "is_all_tie", "rankings", "reading",
    "separating_mrr", "tied_at", "write_csv",
]
