"""What ``posenc extrapolate`` prints: its results as console tables (rich), from the dict
:func:`~posenc.lab.experiments.extrapolation.run_extrapolation` returns (results.json). The
command prints what :func:`console_tables` gives; summary.md of an extension comparison is
:mod:`posenc.lab.experiments.extension_report`, the figures :mod:`posenc.lab.plots`.
"""

from __future__ import annotations

from rich.table import Table

from posenc.lab.experiments.frame import diverged_label

__all__ = ["console_tables", "passkey_table", "results_table"]


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
            table.add_row(encoding, *(" ".join(f"{a:.2f}" for a in res["passkey"].get(str(n), {}).values()) or "n/a"
                                      for n in lengths))
    return table
