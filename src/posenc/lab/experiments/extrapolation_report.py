"""What ``posenc extrapolate`` shows of its results, from the dict
:func:`~posenc.lab.experiments.extrapolation.run_extrapolation` returns (results.json): the
console tables the command prints (:func:`console_tables`) and the figures
(:func:`plot_extrapolation`; :func:`plot_extension` for a context-extension comparison, whose
summary.md is :mod:`posenc.lab.experiments.extension_report`). matplotlib is imported when a
figure is drawn.
"""

from __future__ import annotations

import math
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from posenc.hf_config.rope_figure import pyplot, save_figure
from posenc.lab.experiments.frame import diverged_label

__all__ = ["console_tables", "passkey_table", "plot_extension", "plot_extrapolation", "results_table"]


def console_tables(summary: dict, *, eval_stride: int | None = None, passkey: bool = False) -> list[Table]:
    """The tables ``posenc extrapolate`` prints, in order: bits per byte over each whole window,
    over its last L tokens, with sliding windows of stride ``eval_stride`` (when evaluated), and
    the passkey map (``passkey``: when it ran)."""
    train_len = summary["config"]["train_len"]
    tables = [results_table(summary),
              results_table(summary, "bits_per_byte_last", f"last {train_len} tokens of each window, bits per byte")]
    if eval_stride is not None:
        tables.append(results_table(summary, title=f"sliding windows (stride {eval_stride}), bits per byte",
                                    eval_key="eval_sliding"))
    if passkey:
        tables.append(passkey_table(summary))
    return tables


def results_table(summary: dict, key: str = "bits_per_byte", title: str | None = None, eval_key: str = "eval") -> Table:
    """Rows: encodings; columns: evaluation lengths; cells: mean bits per byte (± seed spread),
    from each result's ``eval_key`` (``eval``, or ``eval_sliding``: rows without it are left out)."""
    config = summary["config"]
    train_len = config["train_len"]
    lengths = config["eval_lengths"]
    table = Table(title=title or f"validation loss, bits per byte (train L={train_len})")
    table.add_column("encoding", style="bold", no_wrap=True)
    for n in lengths:
        table.add_column(f"{n} ({_times_l(n, train_len)})", justify="right")
    table.add_column(f"{_times_l(lengths[-1], train_len)} / {_times_l(lengths[0], train_len)}", justify="right")
    for encoding, res in summary["results"].items():
        if eval_key not in res:
            continue
        if not res[eval_key] and res.get("diverged"):  # every seed diverged
            table.add_row(diverged_label(encoding, res), *["[red]diverged[/]"] * (len(lengths) + 1))
            continue
        row = []
        for n in lengths:
            cell = res[eval_key].get(str(n))
            if cell is None:
                row.append("[dim]n/a[/]")
                continue
            spread = f" ±{cell['loss_std'] / 0.6931471805599453:.2f}" if cell.get("seeds", 1) > 1 else ""
            row.append(f"{cell[key]:.3f}{spread}")
        first, last = res[eval_key].get(str(lengths[0])), res[eval_key].get(str(lengths[-1]))
        row.append(f"{last[key] / first[key]:.2f}x" if first and last else "[dim]n/a[/]")
        table.add_row(diverged_label(encoding, res), *row)
    return table


def _times_l(length: int, train_len: int) -> str:
    """``length`` as a multiple of L: "4L", or "L/2" below L."""
    return f"{length // train_len}L" if length >= train_len else f"L/{train_len // length}"


def passkey_table(summary: dict) -> Table:
    """Rows: each row with a passkey map; columns: the evaluation lengths; cells: the accuracy
    at each depth (0, 0.25, ... 1: the key at the start .. at the end), means over seeds."""
    train_len = summary["config"]["train_len"]
    lengths = summary["config"]["eval_lengths"]
    table = Table(title="zero-shot passkey: fraction of keys copied, by depth 0 .. 1 (means over seeds)")
    table.add_column("encoding", style="bold", no_wrap=True)
    for n in lengths:
        table.add_column(f"{n} ({_times_l(n, train_len)})", justify="right")
    for encoding, res in summary["results"].items():
        if "passkey" in res:
            table.add_row(escape(encoding), *(" ".join(f"{a:.2f}" for a in res["passkey"].get(str(n), {}).values()) or "n/a"
                                      for n in lengths))
    return table


# --- the figures -------------------------------------------------------------------------------


def _line_style(result: dict) -> str:
    """Solid for a trained encoding; dashed for a RoPE scaling at inference; dotted after a fine-tune."""
    extension = result.get("extension")
    if extension is None:
        return "-"
    return ":" if extension.get("finetune") else "--"


def plot_extrapolation(summary: dict, out: str | Path) -> Path:
    """Loss (bits per byte) against evaluation length, one line per encoding, log2 length
    axis; left panel all tokens of each window, right panel the last L tokens. Error bars
    show the spread over seeds when there are several. Rows that extend the rope model with
    a scaling are dashed (at inference) or dotted (fine-tuned)."""
    plt = pyplot()
    out = Path(out)
    train_len = summary["config"]["train_len"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
    panels = (("bits_per_byte", "all tokens of each window"), ("bits_per_byte_last", f"last {train_len} tokens of each window"))
    rows = list(summary["results"].items())
    # tab10 repeats after ten rows (the full preset has eleven): more colours, and markers too
    colors = plt.get_cmap("tab10" if len(rows) <= 10 else "tab20")
    markers = "os^Dv<>PXph"
    for ax, (key, title) in zip(axes, panels):
        for index, (encoding, res) in enumerate(rows):
            lengths = sorted(int(n) for n in res["eval"])
            if not lengths:
                continue
            values = [res["eval"][str(n)][key] for n in lengths]
            errors = [res["eval"][str(n)].get("loss_std", 0.0) / math.log(2) for n in lengths]
            style = {"linestyle": _line_style(res), "color": colors(index % colors.N), "marker": markers[index % len(markers)]}
            if any(errors):
                ax.errorbar(lengths, values, yerr=errors, capsize=3, label=encoding, **style)
            else:
                ax.plot(lengths, values, label=encoding, **style)
        ax.axvline(train_len, color="grey", linestyle=":", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("evaluation length (tokens = bytes, log scale)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("validation loss (bits per byte)")
    if axes[1].get_legend_handles_labels()[0]:  # none when every row diverged
        axes[1].legend(loc="best", fontsize="small")
    corpus = summary.get("corpus", {}).get("name", "")
    fig.suptitle(f"Train at L={train_len}, evaluate longer (non-overlapping windows) — {corpus}", fontsize="medium")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


#: The panels of :func:`plot_extension`: (title, which rows) by the row's ``extension`` record.
_EXTENSION_PANELS = (
    ("RoPE scalings at inference", lambda name, ext: ext is not None and not ext.get("finetune")
     and ext.get("method") not in _BRANCH_MAPS and ext.get("base") == "rope"),
    ("training-free branch-merge maps", lambda name, ext: ext is not None and ext.get("method") in _BRANCH_MAPS),
    ("fine-tuned, DroPE, NoPE trained longer", lambda name, ext: ext is not None and bool(ext.get("finetune"))
     or name == "nope+long"),
)
_BRANCH_MAPS = ("self_extend", "rerope", "leaky_rerope", "dca", "string", "lm_infinite", "streaming_llm")


def plot_extension(summary: dict, out: str | Path) -> Path:
    """The context-extension comparison (``posenc extrapolate --preset extension``): bits per
    byte against evaluation length, plain RoPE (black) in each of three panels (the scalings at
    inference, the branch-merge maps, the fine-tunes with DroPE and NoPE trained as long), error
    bars the seeds' spread; a fourth panel the passkey accuracy (mean over depths and seeds) of
    every row that has one. Log2 length axes, L marked."""
    plt = pyplot()
    out = Path(out)
    train_len = summary["config"]["train_len"]
    results = summary["results"]
    fig, axes = plt.subplots(2, 2, figsize=(13, 9.5))
    colors = plt.get_cmap("tab10")

    def draw(ax, name, result, color, key="bits_per_byte"):
        lengths = sorted(int(n) for n in result["eval"])
        values = [result["eval"][str(n)][key] for n in lengths]
        errors = [result["eval"][str(n)].get("loss_std", 0.0) / math.log(2) for n in lengths]
        ax.errorbar(lengths, values, yerr=errors if any(errors) else None, capsize=3, label=name, color=color,
                    marker="o", markersize=3, linestyle=_line_style(result))

    for ax, (title, member) in zip(axes.flat, _EXTENSION_PANELS):
        if "rope" in results and results["rope"]["eval"]:
            draw(ax, "rope", results["rope"], "black")
        for index, (name, result) in enumerate((n, r) for n, r in results.items() if member(n, r.get("extension"))):
            if result["eval"]:
                draw(ax, name, result, colors(index % colors.N))
        ax.set_title(title)
    passkey_axis = axes.flat[3]
    keyed = [(n, r) for n, r in results.items() if r.get("passkey")]
    cmap = plt.get_cmap("tab20")
    for index, (name, result) in enumerate(keyed):
        lengths = sorted(int(n) for n in result["passkey"])
        means = [sum(result["passkey"][str(n)].values()) / len(result["passkey"][str(n)]) for n in lengths]
        passkey_axis.plot(lengths, means, marker="o", markersize=3, label=name, color=cmap(index % cmap.N),
                          linestyle=_line_style(result))
    passkey_axis.set_title("passkey accuracy (mean over depths)")
    passkey_axis.set_ylim(-0.05, 1.05)
    for index, ax in enumerate(axes.flat):
        ax.axvline(train_len, color="grey", linestyle=":", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("evaluation length (bytes, log scale)")
        ax.set_ylabel("accuracy" if index == 3 else "validation loss (bits per byte)")
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="x-small", ncol=2 if index == 3 else 1)
    fig.suptitle(f"Context extension of one RoPE model trained at L={train_len} — "
                 f"{summary.get('corpus', {}).get('name', '')}", fontsize="medium")
    fig.tight_layout()
    return save_figure(fig, out, dpi=120)
