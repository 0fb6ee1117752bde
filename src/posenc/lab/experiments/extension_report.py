"""Reading a context-extension comparison (``posenc extrapolate --preset extension``, issue 26):
``summary.md`` beside results.json, written when the sweep has extension rows.

Three tables over every row of the sweep that starts from the trained ``rope`` checkpoints (and
the ``nope+long`` control), in the sweep's order: plain RoPE, the RoPE scalings at inference,
the training-free branch-merge maps, the fine-tunes, DroPE and its control:

- bits per byte at each evaluation length (the seeds' mean, and their standard deviation where
  there are several seeds), lengths written as multiples of L;
- the change against plain RoPE at the lengths <= L (where a method should cost nothing: the
  static scalings and STRING's attention factor do cost) and past L;
- the passkey accuracy per length (mean over depths and seeds), the depth x length map being in
  results.json (``passkey``).

Layer: lab (reads the results dict only).
"""

from __future__ import annotations

import math

#: The base row every extension row starts from.
BASE = "rope"


def extension_rows(summary: dict) -> list[str]:
    """The rows of the comparison, in the sweep's order (plain RoPE, the scalings at inference,
    the branch maps, the fine-tunes, DroPE and its control): ``rope`` and every row with an
    ``extension`` record."""
    return [name for name, result in summary["results"].items() if name == BASE or "extension" in result]


def _length_label(length: int, train_len: int) -> str:
    ratio = length / train_len
    return f"{ratio:g}L" if ratio != 1 else "L"


def _bpb(cell: dict | None) -> float | None:
    return None if cell is None else cell["bits_per_byte"]


def _bpb_std(cell: dict) -> float:
    return cell["loss_std"] / math.log(2)


def bits_table(summary: dict) -> str:
    """Markdown: bits per byte per row and length (mean over seeds; +- their standard deviation
    where there are several)."""
    lengths = summary["config"]["eval_lengths"]
    train_len = summary["config"]["train"]["seq_len"]
    header = "| row | " + " | ".join(f"{_length_label(n, train_len)} ({n})" for n in lengths) + " |"
    lines = [header, "|" + "---|" * (len(lengths) + 1)]
    for name in extension_rows(summary):
        cells = []
        for length in lengths:
            cell = summary["results"][name].get("eval", {}).get(str(length))
            if cell is None:
                cells.append("")
            elif cell.get("seeds", 1) > 1:
                cells.append(f"{cell['bits_per_byte']:.3f} ± {_bpb_std(cell):.3f}")
            else:
                cells.append(f"{cell['bits_per_byte']:.3f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def change_table(summary: dict) -> str:
    """Markdown: bits per byte minus plain RoPE's, per row and length (negative: better)."""
    lengths = summary["config"]["eval_lengths"]
    train_len = summary["config"]["train"]["seq_len"]
    base = summary["results"].get(BASE, {}).get("eval", {})
    header = "| row | " + " | ".join(_length_label(n, train_len) for n in lengths) + " |"
    lines = [header, "|" + "---|" * (len(lengths) + 1)]
    for name in extension_rows(summary):
        if name == BASE:
            continue
        cells = []
        for length in lengths:
            ours, theirs = _bpb(summary["results"][name].get("eval", {}).get(str(length))), _bpb(base.get(str(length)))
            cells.append("" if ours is None or theirs is None else f"{round(ours - theirs, 3) + 0.0:+.3f}")  # no -0.000
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def passkey_table(summary: dict) -> str:
    """Markdown: passkey accuracy per row and length, the mean over depths and seeds."""
    rows = [name for name in extension_rows(summary) if summary["results"][name].get("passkey")]
    if not rows:
        return "(no passkey map in this run)"
    train_len = summary["config"]["train"]["seq_len"]
    lengths = sorted({int(n) for name in rows for n in summary["results"][name]["passkey"]})
    header = "| row | " + " | ".join(_length_label(n, train_len) for n in lengths) + " |"
    lines = [header, "|" + "---|" * (len(lengths) + 1)]
    for name in rows:
        passkey = summary["results"][name]["passkey"]
        cells = []
        for length in lengths:
            depths = passkey.get(str(length))
            cells.append("" if not depths else f"{sum(depths.values()) / len(depths):.2f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def best_past_training(summary: dict) -> list[tuple[int, str, float]]:
    """(length, row, bits per byte) of the lowest bits per byte at each length past L."""
    train_len = summary["config"]["train"]["seq_len"]
    best = []
    for length in summary["config"]["eval_lengths"]:
        if length <= train_len:
            continue
        scored = [(cell["bits_per_byte"], name) for name in extension_rows(summary)
                  if (cell := summary["results"][name].get("eval", {}).get(str(length)))]
        if scored:
            value, name = min(scored)
            best.append((length, name, value))
    return best


def has_extension_rows(summary: dict) -> bool:
    return any("extension" in result for result in summary["results"].values())


def summary_markdown(summary: dict) -> str:
    """summary.md of an extension comparison: the three tables and the best row past L."""
    config = summary["config"]
    seeds = config.get("seeds", [])
    train_len = config["train"]["seq_len"]
    lines = [
        "# Context extension on the same trained RoPE checkpoints",
        "",
        f"L = {train_len}; seeds {', '.join(map(str, seeds))}; bits per byte on the validation split "
        f"({config.get('eval_tokens')} bytes per length), lower is better.",
        "",
        "## Bits per byte",
        "",
        bits_table(summary),
        "",
        "## Against plain RoPE (bits per byte, row minus rope; negative is better)",
        "",
        change_table(summary),
        "",
        "## Passkey accuracy (mean over depths and seeds)",
        "",
        passkey_table(summary),
        "",
        "## Best row past L",
        "",
    ]
    lines += [f"- {_length_label(n, train_len)} ({n}): {name}, {value:.3f}" for n, name, value in best_past_training(summary)]
    return "\n".join(lines) + "\n"


__all__ = ["bits_table", "change_table", "extension_rows", "has_extension_rows", "passkey_table", "summary_markdown"]
