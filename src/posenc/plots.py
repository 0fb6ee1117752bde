"""Figures. matplotlib is imported inside each function (``import posenc`` needs only torch
and numpy) with the non-interactive Agg backend."""

from __future__ import annotations

import math
from pathlib import Path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


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
    plt = _pyplot()
    out = Path(out)
    train_len = summary["config"]["train_len"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
    panels = (("bits_per_byte", "all tokens of each window"), ("bits_per_byte_last", f"last {train_len} tokens of each window"))
    for ax, (key, title) in zip(axes, panels):
        for encoding, res in summary["results"].items():
            lengths = sorted(int(n) for n in res["eval"])
            if not lengths:
                continue
            values = [res["eval"][str(n)][key] for n in lengths]
            errors = [res["eval"][str(n)].get("loss_std", 0.0) / math.log(2) for n in lengths]
            style = _line_style(res)
            if any(errors):
                ax.errorbar(lengths, values, yerr=errors, marker="o", capsize=3, linestyle=style, label=encoding)
            else:
                ax.plot(lengths, values, marker="o", linestyle=style, label=encoding)
        ax.axvline(train_len, color="grey", linestyle=":", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("evaluation length (tokens = bytes, log scale)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("validation loss (bits per byte)")
    axes[1].legend(loc="best", fontsize="small")
    corpus = summary.get("corpus", {}).get("name", "")
    fig.suptitle(f"Train at L={train_len}, evaluate longer (non-overlapping windows) — {corpus}", fontsize="medium")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
