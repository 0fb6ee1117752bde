"""Reading the results of ``posenc lengthgen``: how far each row generalizes, which tasks tell
the rows apart, the ranking over those, and what the papers claimed against what we measured.

Every function here reads a results dict (:func:`posenc.lab.experiments.lengthgen.run_lengthgen`'s
``results``, ``ranking`` and ``config``) and computes nothing else; accuracies are fractions of
instances in [0, 1] (means over seeds), sizes are in each task's unit.

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
- **Against the papers** (:func:`paper_comparison`): one row per reproduced paper (Kazemnejad
  et al. 2023, Ruoss et al. 2023, Cho et al. 2024, McLeish et al. 2024): its claim
  (/work/shared/REFERENCE.md; docs/results.md) and what this run measured, as a markdown table
  (:func:`comparison_markdown`) that docs/results.md can hold.

What the command shows is here too: summary.md (:func:`summary_markdown`) and the console
tables it prints (:func:`console_tables`, :func:`lengthgen_task_table` for ``--list``).
"""

from __future__ import annotations

import statistics

from rich.table import Table

from posenc.lab.experiments.frame import diverged_label

#: The accuracy from which a size counts as solved (the issue's bar, as ``LEARNED_ACCURACY``).
GENERALIZATION_ACCURACY = 0.9


def _accuracies(result: dict) -> dict[int, float]:
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
    scores = _accuracies(result)
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
    scored = [_accuracies(result) for result in rows.values() if result.get("eval")]
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
            mine, base = _accuracies(res), _accuracies(rows.get(base_row, {}))
            at = {f"{f:g}": mine.get(int(f * n + 0.5)) for f in EXTENSION_FACTORS}
            vs = {f"{f:g}": None if at[f"{f:g}"] is None or base.get(int(f * n + 0.5)) is None
                  else at[f"{f:g}"] - base[int(f * n + 0.5)] for f in EXTENSION_FACTORS if f > 1}
            out.setdefault(task, {})[row] = {"base": base_row, "accuracy": at, "vs_base": vs}
    return out


def extension_markdown(extensions: dict) -> list[str]:
    """:func:`extension_reading` as summary.md lines (a section; none without such rows)."""
    if not extensions:
        return []
    lines = ["", "## Context extensions of a trained model (no training of their own)", "",
             "| task | row | accuracy at N | at 2N | at 4N | 2N vs its base | 4N vs its base |",
             "|---|---|---|---|---|---|---|"]

    def text(value, signed=False):
        return "n/a" if value is None else f"{value:+.2f}" if signed else f"{value:.2f}"

    for task, rows in extensions.items():
        for row, entry in rows.items():
            at, vs = entry["accuracy"], entry["vs_base"]
            lines.append(f"| {task} | {_cell(row)} | {text(at['1'])} | {text(at['2'])} | {text(at['4'])} | "
                         f"{text(vs['2'], True)} | {text(vs['4'], True)} |")
    return lines


def generalization_text(entry: dict) -> str:
    """A generalization length for a table cell: ``"16 (2N)"``, or ``"not learned"`` /
    ``"N not evaluated"`` / ``"diverged"``."""
    if entry["size"] is not None:
        return f"{entry['size']} ({entry['factor']:g}N)"
    why = entry.get("why", "")
    return "not learned" if why.startswith("not learned") else "diverged" if "diverged" in why else why


# --- against the papers ---------------------------------------------------------------------

#: The published claims each comparison row sets beside this run (/work/shared/REFERENCE.md).
PAPER_CLAIMS = {
    "nope": ("Kazemnejad et al. 2023 (NoPE)",
             "MRR over 10 tasks, ~107M-parameter decoders: NoPE 0.69 > T5 0.55 > ALiBi 0.50 > Rotary 0.33 > APE 0.22"),
    "rand": ("Ruoss et al. 2023 (randomized positions)",
             "randomized positions raise accuracy past N by 12.0% on average (15 tasks, 6,000 models)"),
    "coupled": ("Cho et al. 2024 (position coupling)", "addition trained on 1-30 digits, solved at up to 200 (6.7N)"),
    "abacus": ("McLeish et al. 2024 (Abacus)", "addition trained on 20 digits, 99% at 100 (5N)"),
}

#: The NoPE paper's rows, in its order, and ours that stand for them (APE: sinusoidal, learned).
NOPE_PAPER_ROWS = {"nope": "NoPE", "t5": "T5", "alibi": "ALiBi", "rope": "Rotary", "sinusoidal": "APE", "learned": "APE"}


def _mrr_order(summary: dict, factor: str = "2") -> str:
    reading_ = summary["reading"]
    table = reading_["mean_reciprocal_rank"].get(factor, {})
    rows = [(row, v["mrr"]) for row, v in table.items() if row in NOPE_PAPER_ROWS]
    if not rows:
        return "not run (no separating task ranks nope, t5, alibi, rope, sinusoidal or learned)"
    order = " > ".join(f"{row} {mrr:.2f}" for row, mrr in rows)
    first = "NoPE first" if rows[0][0] == "nope" else f"NoPE not first ({rows[0][0]} is)"
    tied = reading_.get("tied_at", {}).get(factor, [])
    tasks = ", ".join(task for task in reading_["separating"] if task not in tied)
    left = ", ".join(dict.fromkeys([*reading_["all_tie"], *tied])) or "none"
    return f"MRR at {factor}N over the tasks that separate the rows there ({tasks}; tied, left out: {left}): {order}; {first}"


def _past_n(result: dict) -> list[float]:
    n = result["train_size"]
    return [accuracy for size, accuracy in sorted(_accuracies(result).items()) if size > n]


def _randomized_gain(summary: dict) -> str:
    parts = []
    for base in dict.fromkeys(row[: -len("+rand")] for rows in summary["results"].values() for row in rows
                              if row.endswith("+rand")):
        gains, better, tasks = [], 0, 0
        for rows in summary["results"].values():
            if f"{base}+rand" in rows and base in rows:
                with_rand, without = _past_n(rows[f"{base}+rand"]), _past_n(rows[base])
                if with_rand and len(with_rand) == len(without):
                    tasks += 1
                    gain = statistics.fmean(with_rand) - statistics.fmean(without)
                    gains.append(gain)
                    better += gain > 0
        if tasks:
            parts.append(f"{base}+rand - {base}: {100 * statistics.fmean(gains):+.1f} points mean accuracy past N over "
                         f"{tasks} task(s), higher on {better}/{tasks}")
    return "; ".join(parts) or "not run (no +rand row beside its encoding)"


def _addition_rows(summary: dict, suffix: str) -> str:
    rows = summary["results"].get("addition", {})
    named = [row for row in rows if row.endswith(f"+{suffix}")]
    if not named:
        return f"not run (add the row addition=rope+{suffix})"
    readings = summary["reading"]["generalization"]["addition"]
    parts = []
    for row in named:
        n = rows[row]["train_size"]
        at_2n = _accuracies(rows[row]).get(2 * n)
        at = "" if at_2n is None else f", {at_2n:.2f} at 2N"
        reach = readings[row]
        text = f"generalizes to {generalization_text(reach)}" if reach["size"] is not None else reach["why"]
        parts.append(f"{row}: N = {n}, {text}{at}")
    return "; ".join(parts)


def paper_comparison(summary: dict) -> list[dict]:
    """One entry per reproduced paper: ``{"paper", "claim", "ours"}`` (``ours``: what this run
    measured, or ``"not run (...)"`` naming the row it needs). ``summary`` needs ``reading``."""
    ours = {"nope": _mrr_order(summary), "rand": _randomized_gain(summary),
            "coupled": _addition_rows(summary, "coupled"), "abacus": _addition_rows(summary, "abacus")}
    return [{"paper": paper, "claim": claim, "ours": ours[key]} for key, (paper, claim) in PAPER_CLAIMS.items()]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def comparison_markdown(summary: dict) -> str:
    """:func:`paper_comparison` as a markdown table (paper | claim | ours)."""
    lines = ["| paper | claim | ours |", "|---|---|---|"]
    lines += [f"| {_cell(e['paper'])} | {_cell(e['claim'])} | {_cell(e['ours'])} |" for e in paper_comparison(summary)]
    return "\n".join(lines) + "\n"


def summary_markdown(summary: dict) -> str:
    """summary.md: the generalization lengths (a row per task and row, with the accuracy at N),
    the all-tie tasks, the mean reciprocal rank over the separating tasks and the comparison
    with the papers."""
    reading_ = summary["reading"]
    lines = [f"## Generalization length (largest size with accuracy >= {reading_['threshold']:g}, N at least that)", "",
             "| task | N | row | accuracy at N | generalization length |", "|---|---|---|---|---|"]
    for task, rows in summary["results"].items():
        for row, res in rows.items():
            n = res["train_size"]
            at_n = _accuracies(res).get(n)
            at_n_text = "n/a" if at_n is None else f"{at_n:.2f}"
            lines.append(f"| {task} | {n} | {_cell(row)} | {at_n_text} | "
                         f"{generalization_text(reading_['generalization'][task][row])} |")
    left = ", ".join(reading_["all_tie"]) or "none"
    tied = "; ".join(f"at {f}N: {', '.join(t)}" for f, t in reading_.get("tied_at", {}).items()
                     if [task for task in t if task not in reading_["all_tie"]])
    note = (f"Separating: {', '.join(reading_['separating']) or 'none'}. All-tie (every row equal at every size "
            f"past N), left out of the ranking: {left}." + (f" Also left out where every row ties at that size ({tied})."
                                                             if tied else ""))
    lines += ["", "## Mean reciprocal rank over the separating tasks", "", note, ""]
    factors = list(reading_["mean_reciprocal_rank"])
    if any(reading_["mean_reciprocal_rank"][f] for f in factors):
        lines += ["| row | " + " | ".join(f"MRR at {f}N (tasks)" for f in factors) + " |",
                  "|---|" + "---|" * len(factors)]
        rows = list(dict.fromkeys(row for f in factors for row in reading_["mean_reciprocal_rank"][f]))
        for row in rows:
            cells = []
            for f in factors:
                entry = reading_["mean_reciprocal_rank"][f].get(row)
                cells.append("n/a" if entry is None else f"{entry['mrr']:.2f} ({entry['tasks']})")
            lines.append(f"| {_cell(row)} | " + " | ".join(cells) + " |")
    else:
        lines.append("No task separates the rows: no ranking.")
    lines += extension_markdown(reading_.get("extension", {}))
    lines += ["", "## Against the papers", "", comparison_markdown(summary)]
    return "\n".join(lines)


# --- the tables ``posenc lengthgen`` prints (rich) --------------------------------------------


def console_tables(summary: dict) -> list[Table]:
    """The tables ``posenc lengthgen`` prints after a sweep, in order: the accuracies with each
    row's generalization length, the mean reciprocal rank over the separating tasks, and the
    comparison with the papers."""
    return [lengthgen_table(summary), lengthgen_ranking_table(summary), lengthgen_comparison_table(summary)]


def lengthgen_table(summary: dict) -> Table:
    """Rows: task and encoding; columns: evaluation sizes as multiples of N (the size in
    each task's unit in the cell's task row), then the generalization length (the largest
    size with accuracy >= 0.9, the row having reached 0.9 at N; ``not learned`` otherwise);
    cells: exact-match accuracy (± seed spread)."""
    config = summary["config"]
    factors = sorted({f for f in config["eval_factors"]})
    table = Table(title="exact-match accuracy (greedy decoding; trained on sizes <= N)",
                  caption="generalization length: the largest size with accuracy >= 0.9, for a row at >= 0.9 at N")
    table.add_column("task", style="bold", no_wrap=True)
    table.add_column("encoding", no_wrap=True)
    for f in factors:
        table.add_column(f"{f:g}N", justify="right")
    table.add_column("generalization length", justify="right")
    generalization = summary["reading"]["generalization"]
    tasks = list(summary["results"].items())
    for index, (task, rows) in enumerate(tasks):
        setting = config["task_settings"][task]
        n = setting["train_size"]
        sizes = {size: size / n for size in setting["eval_sizes"]}
        names = list(rows.items())
        for position, (row, res) in enumerate(names):
            cells = []
            for f in factors:
                if not res["eval"] and res.get("diverged"):
                    cells.append("[red]diverged[/]")
                    continue
                size = max(sizes, key=lambda s: -abs(sizes[s] - f))  # the size this factor gave
                cell = res["eval"].get(str(size))
                if cell is None:
                    cells.append("[dim]n/a[/]")
                    continue
                spread = f" ±{cell['accuracy_std']:.2f}" if cell["seeds"] > 1 else ""
                colour = "green" if cell["accuracy"] >= 0.9 else "red" if cell["accuracy"] < 0.1 else "yellow"
                cells.append(f"[{colour}]{cell['accuracy']:.2f}[/]{spread}")
            label = f"{task} (N={n})" if position == 0 else ""
            cells.append(generalization_text(generalization[task][row]))
            table.add_row(label, diverged_label(row, res), *cells, end_section=position == len(names) - 1 and index < len(tasks) - 1)
    return table


def lengthgen_ranking_table(summary: dict) -> Table:
    """One row per encoding row: the tasks it learned at N (of those it ran), and its mean
    reciprocal rank over the tasks that separate the rows at each ranked size, with how many
    tasks it was ranked on (``summary["reading"]``, best first by the first size); the caption
    names the all-tie tasks left out."""
    ranking, reading = summary["ranking"], summary["reading"]
    mrr = reading["mean_reciprocal_rank"]
    factors = list(mrr)
    rows = list(dict.fromkeys(row for rows in summary["results"].values() for row in rows))
    ran = {row: sum(row in rows for rows in summary["results"].values()) for row in rows}
    learned = {row: sum(row in names for names in ranking["learned_at_n"].values()) for row in rows}
    left = ", ".join(reading["all_tie"]) or "none"
    caption = (f"over the separating tasks ({', '.join(reading['separating']) or 'none'}); all-tie tasks (every row equal "
               f"at every size past N) are left out of the ranking: {left}")
    if not reading["separating"]:
        caption = f"no task separates the rows (all-tie: {left}): no ranking"
    table = Table(title="mean reciprocal rank over the tasks that separate the rows (1 = first on every one; "
                  "the NoPE paper's summary)", caption=caption)
    table.add_column("encoding", style="bold", no_wrap=True)
    table.add_column("learned at N", justify="right")
    for factor in factors:
        table.add_column(f"MRR at {factor}N (tasks)", justify="right")
    first = mrr[factors[0]] if factors else {}
    for row in sorted(rows, key=lambda r: -first.get(r, {}).get("mrr", 0.0)):
        cells = [f"{mrr[f][row]['mrr']:.2f} ({mrr[f][row]['tasks']})" if row in mrr[f] else "n/a" for f in factors]
        table.add_row(row, f"{learned[row]}/{ran[row]}", *cells)
    return table


def lengthgen_comparison_table(summary: dict) -> Table:
    """The reproduced papers: claim against this run (summary.md has it as markdown)."""
    table = Table(title="against the papers")
    for column in ("paper", "claim", "ours"):
        table.add_column(column)
    for entry in paper_comparison(summary):
        table.add_row(entry["paper"], entry["claim"], entry["ours"])
    return table


def lengthgen_task_table() -> Table:
    """Every task of ``posenc lengthgen``: its unit of size, default N and steps, prompt and
    answer formats, source, and the position suffixes its rows take."""
    from posenc.lab.experiments.lengthgen_config import task_catalogue

    table = Table(title="posenc lengthgen tasks (train on sizes <= N; * in the default run; every answer closed by '.')")
    for column in ("task", "size unit", "N", "steps", "prompt (size n)", "answer", "source", "row suffixes"):
        table.add_column(column, justify="right" if column in ("N", "steps") else "left")
    for entry in task_catalogue():
        table.add_row(entry["task"] + (" *" if entry["in_default"] else ""), entry["size_unit"], str(entry["train_size"]),
                      str(entry["steps"]), entry["prompt"], entry["answer"], entry["source"], ", ".join(entry["suffixes"]))
    return table


__all__ = [
    "EXTENSION_FACTORS",
    "GENERALIZATION_ACCURACY",
    "PAPER_CLAIMS",
    "comparison_markdown",
    "console_tables",
    "extension_markdown",
    "extension_reading",
    "generalization_length",
    "generalization_text",
    "is_all_tie",
    "lengthgen_comparison_table",
    "lengthgen_ranking_table",
    "lengthgen_table",
    "lengthgen_task_table",
    "paper_comparison",
    "reading",
    "separating_mrr",
    "summary_markdown",
    "tied_at",
]
