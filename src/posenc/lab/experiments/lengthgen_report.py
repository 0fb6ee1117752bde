"""What ``posenc lengthgen`` shows of its results: summary.md (:func:`summary_markdown`), the
console tables the command prints (:func:`console_tables`; :func:`lengthgen_task_table` for
``--list``), the figures (:func:`plot_lengthgen`) and what the papers claimed against what we
measured.

Every function here reads a results dict (:func:`posenc.lab.experiments.lengthgen.run_lengthgen`'s
``results``, ``ranking``, ``reading`` and ``config``) and computes nothing new; the reading
itself (generalization lengths, all-tie tasks, the mean reciprocal rank over the separating
tasks, the extensions against their base) is :mod:`posenc.lab.experiments.lengthgen_results`,
whose names are importable from here too.

- **Against the papers** (:func:`paper_comparison`): one row per reproduced paper (Kazemnejad
  et al. 2023, Ruoss et al. 2023, Cho et al. 2024, McLeish et al. 2024): its claim
  (/work/shared/REFERENCE.md; docs/results.md) and what this run measured, as a markdown table
  (:func:`comparison_markdown`) that docs/results.md can hold.

What the command shows is here too: summary.md (:func:`summary_markdown`) and the console
tables it prints (:func:`console_tables`, :func:`lengthgen_task_table` for ``--list``).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from posenc.errors import InvalidArgument
from posenc.hf_config.rope_figure import pyplot, save_figure
from posenc.lab.experiments.frame import Row, diverged_label
from posenc.lab.experiments.lengthgen_results import (
    EXTENSION_FACTORS,
    GENERALIZATION_ACCURACY,
    accuracies_by_size,
    extension_reading,
    generalization_length,
    is_all_tie,
    reading,
    separating_mrr,
    tied_at,
)


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
    return [accuracy for size, accuracy in sorted(accuracies_by_size(result).items()) if size > n]


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
        at_2n = accuracies_by_size(rows[row]).get(2 * n)
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
            at_n = accuracies_by_size(res).get(n)
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
        table.add_row(escape(row), f"{learned[row]}/{ran[row]}", *cells)
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


# --- the figures -------------------------------------------------------------------------------


def _task_axes(plt, count: int, width: float, height: float):
    """A grid of ``count`` panels, at most three a row, the unused ones hidden; constrained
    layout keeps titles, tick labels and a shared colour bar apart."""
    columns = min(3, count)
    rows = -(-count // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(width * columns, height * rows), squeeze=False, layout="constrained")
    for ax in axes.flat[count:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:count])


def _annotate(ax, grid: list[list[float]], fontsize: float) -> None:
    """Write each accuracy in its cell ("n/a" for NaN), dark on light cells."""
    for i, line in enumerate(grid):
        for j, value in enumerate(line):
            text = "n/a" if math.isnan(value) else f"{value:.2f}"
            ax.text(j, i, text, ha="center", va="center", fontsize=fontsize, color="black" if value >= 0.6 else "white")


def plot_lengthgen(summary: dict, out_dir: str | Path) -> list[Path]:
    """The figures of a ``posenc lengthgen`` results dict, written to ``out_dir``:

    - ``accuracy.png``: exact-match accuracy against instance size, one panel per task, one
      line per row (encoding), the training size N marked (error bars: spread over seeds);
    - ``heatmap.png``: the same numbers as an (encoding x size) grid per task;
    - ``<task>_depth.png`` for each needle-style task that ran (passkey, multikey:
      :func:`plot_depth_heatmap`): accuracy by the needle's depth in the filler against size,
      one panel per row.

    Returns the paths written.
    """
    plt = pyplot()
    out_dir = Path(out_dir)
    tasks = summary["results"]
    settings = summary["config"]["task_settings"]
    paths = []

    fig, axes = _task_axes(plt, len(tasks), 5.0, 3.8)
    for ax, (task, rows) in zip(axes, tasks.items()):
        colors = plt.get_cmap("tab10" if len(rows) <= 10 else "tab20")
        for index, (row, res) in enumerate(rows.items()):
            sizes = sorted(int(n) for n in res["eval"])
            values = [res["eval"][str(n)]["accuracy"] for n in sizes]
            errors = [res["eval"][str(n)]["accuracy_std"] for n in sizes]
            style = {"color": colors(index % colors.N), "marker": "os^Dv<>PXph"[index % 11],
                     "linestyle": "--" if Row.of(row).randomized else "-", "label": row}
            # errorbar for every row, so that the legend keeps the rows' order
            ax.errorbar(sizes, values, yerr=errors if any(errors) else None, capsize=3, **style)
        n = settings[task]["train_size"]
        ax.axvline(n, color="grey", linestyle=":", linewidth=1.2)
        ax.axvspan(0, n, color="grey", alpha=0.08, label="trained sizes (<= N)")
        ax.set_xlim(0, max(settings[task]["eval_sizes"]) * 1.05)
        ax.set_ylim(-0.03, 1.03)
        ax.set_title(f"{task} (N = {n})")
        ax.set_xlabel(f"instance size ({settings[task]['size_unit']})")
        ax.set_ylabel("exact-match accuracy")
        ax.grid(True, alpha=0.3)
    # one legend for every panel, beside them: inside, it hides the curves at small sizes; a row
    # of one task only (a task row such as rope+coupled on addition) is in its panel's handles
    legend: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    fig.legend(list(legend.values()), list(legend), loc="outside right center", fontsize="small")
    fig.suptitle("Train on sizes <= N, test longer: exact match, greedy decoding", fontsize="medium")
    paths.append(save_figure(fig, out_dir / "accuracy.png"))

    fig, axes = _task_axes(plt, len(tasks), 5.2, 0.9 + 0.36 * max(len(rows) for rows in tasks.values()))
    for ax, (task, rows) in zip(axes, tasks.items()):
        sizes = settings[task]["eval_sizes"]
        grid = [[rows[row]["eval"].get(str(n), {}).get("accuracy", float("nan")) for n in sizes] for row in rows]
        image = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
        _annotate(ax, grid, fontsize=7)
        n = settings[task]["train_size"]
        ax.set_xticks(range(len(sizes)), [f"{s}\n{s / n:.2g}N" for s in sizes], fontsize=7)
        ax.set_yticks(range(len(rows)), list(rows), fontsize=8)
        ax.set_title(f"{task} (N = {n} {settings[task]['size_unit']})", fontsize=9)
    fig.colorbar(image, ax=axes, label="exact-match accuracy", shrink=0.8)
    fig.suptitle("Exact-match accuracy, encoding x instance size", fontsize="medium")
    paths.append(save_figure(fig, out_dir / "heatmap.png"))

    for task in needle_tasks(summary):
        paths.append(plot_depth_heatmap(summary, task, out_dir / f"{task}_depth.png"))
    return paths


def needle_tasks(summary: dict) -> list[str]:
    """The needle-style tasks of a ``posenc lengthgen`` results dict: those whose cells hold
    accuracies by the needle's depth (``by_depth``: passkey, multikey)."""
    return [task for task, rows in summary["results"].items()
            if any("by_depth" in cell for res in rows.values() for cell in res["eval"].values())]


def plot_depth_heatmap(summary: dict, task: str, out: str | Path) -> Path:
    """The depth x length heatmap of a needle-style ``task`` (:func:`needle_tasks`), one
    panel per row: exact-match accuracy (mean over seeds, in [0, 1]) by the needle's depth in
    the filler (0 = its start, 1 = its end; rows of the panel) and the instance size (columns,
    in the task's unit), N marked on the axis; NaN cells (a size not evaluated) read "n/a".
    After the needle-in-a-haystack figures of RULER (Hsieh et al. 2024).

    Raises:
        InvalidArgument: ``task`` not needle-style in ``summary``.
    """
    if task not in needle_tasks(summary):
        raise InvalidArgument(f"task: {task!r} has no accuracies by depth in these results; "
                              f"needle-style tasks here: {needle_tasks(summary)}")
    plt = pyplot()
    rows = summary["results"][task]
    setting = summary["config"]["task_settings"][task]
    sizes, n = setting["eval_sizes"], setting["train_size"]
    fig, axes = _task_axes(plt, len(rows), 3.6, 3.0)
    image = None
    for ax, (row, res) in zip(axes, rows.items()):
        depths = sorted({d for cell in res["eval"].values() for d in cell.get("by_depth", {})}, key=float)
        grid = [[res["eval"].get(str(s), {}).get("by_depth", {}).get(d, float("nan")) for s in sizes] for d in depths]
        image = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto", origin="lower")
        _annotate(ax, grid, fontsize=6)
        ax.set_xticks(range(len(sizes)), [f"{s}\n{s / n:.2g}N" for s in sizes], fontsize=7)
        ax.set_yticks(range(len(depths)), depths, fontsize=7)
        ax.set_xlabel(setting["size_unit"])
        ax.set_ylabel("needle depth")
        ax.set_title(row, fontsize=9)
    if image is not None:
        fig.colorbar(image, ax=axes, label="exact-match accuracy", shrink=0.8)
    fig.suptitle(f"{task}: accuracy by needle depth (0 = start of the filler) and size (N = {n})", fontsize="medium")
    return save_figure(fig, Path(out))


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
    "needle_tasks",
    "paper_comparison",
    "plot_depth_heatmap",
    "plot_lengthgen",
    "reading",
    "separating_mrr",
    "summary_markdown",
    "tied_at",
]
