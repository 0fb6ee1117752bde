"""The one figure the library draws, a model's RoPE wavelengths against its contexts
(:func:`plot_rope_inspection`, ``posenc inspect``), and the rule every posenc figure's path
follows (:func:`figure_path`; the lab's figures in :mod:`posenc.lab.plots` use it too).

It lives beside :class:`~posenc.hf_config.rope.RopeInspection`, whose numbers it draws, so that
``posenc.rope.plot_rope_inspection`` needs nothing of the lab (the library never imports the
lab). matplotlib is imported inside the functions, with the non-interactive Agg backend:
``import posenc`` needs torch and numpy only.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from posenc.errors import InvalidArgument

if TYPE_CHECKING:
    from posenc.hf_config.rope import RopeInspection

__all__ = ["figure_path", "plot_rope_inspection", "pyplot", "save_figure", "supported_formats"]


def pyplot():
    """``matplotlib.pyplot`` with the non-interactive Agg backend (figures are files here)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, out: Path, dpi: int = 110) -> Path:
    """Write ``fig`` at ``out`` (parent folders created) and close it; returns ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    pyplot().close(fig)
    return out


def supported_formats() -> list[str]:
    """The file extensions matplotlib writes figures in (png, pdf, svg, ...), sorted."""
    from matplotlib.backend_bases import FigureCanvasBase

    return sorted(FigureCanvasBase.get_supported_filetypes())


def figure_path(out: str | Path, default_name: str, argname: str = "out") -> Path:
    """Where a figure asked for at ``out`` is written: ``out / default_name`` when ``out``
    is an existing folder, ``out`` with ``.png`` added when it has no extension (what
    matplotlib writes), else ``out`` itself.

    Raises:
        InvalidArgument: the extension is not one matplotlib writes; the message names
            ``argname`` and lists the supported ones.
    """
    out = Path(out)
    if out.is_dir():
        out = out / default_name
    if not out.suffix:
        out = out.with_name(out.name + ".png")
    formats = supported_formats()
    if out.suffix[1:].lower() not in formats:
        raise InvalidArgument(f"{argname}: {out.name}: unknown figure format {out.suffix!r}; matplotlib writes "
                              f"{', '.join(formats)}")
    return out


def plot_rope_inspection(report: RopeInspection, out_png: str | Path, *, title: str | None = None) -> Path:
    """Draw wavelength per pair (log scale), original and scaled, against both contexts.

    ``report`` comes from :func:`posenc.rope.inspect_config`: per frequency pair i the
    wavelength 2 pi / theta_i in tokens, before and after the scaling, the original context
    L0 and the extended one as horizontal lines, YaRN's critical dimension (Peng et al. 2023,
    eq. 17) as a vertical one, and the pairs that turn fully within L0 shaded. Writes the
    figure (matplotlib, Agg backend, imported here; the format from the extension) and
    returns its path: ``out_png`` as :func:`figure_path` reads it (an existing folder gets
    ``rope.png``); parent folders are created.

    Raises:
        InvalidArgument: an extension matplotlib does not write.
    """
    out = figure_path(out_png, "rope.png")
    plt = pyplot()

    pairs = torch.arange(report.rotary_dim // 2).numpy()
    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=120)
    ax.plot(pairs, report.wavelength_original.numpy(), "o-", ms=3, label="original wavelength")
    if report.rope_type != "default":
        ax.plot(pairs, report.wavelength_scaled.numpy(), "s-", ms=3, label=f"scaled ({report.rope_type})")
    ax.axhline(report.original_context, color="tab:green", ls="--", label=f"original context {report.original_context}")
    if report.extended_context != report.original_context:
        ax.axhline(report.extended_context, color="tab:red", ls=":", label=f"extended context {report.extended_context}")
    if 0 <= report.critical_dim <= pairs[-1]:
        ax.axvline(report.critical_dim, color="gray", lw=1, label=f"critical dim {report.critical_dim:.1f}")
    ax.axvspan(-0.5, report.num_full_rotation_pairs - 0.5, color="tab:green", alpha=0.08,
               label=f"{report.num_full_rotation_pairs} pairs rotate fully within L0")
    ax.set_yscale("log")
    ax.set_xlabel("frequency pair i")
    ax.set_ylabel("wavelength 2π/θ_i (tokens)")
    name = report.model_type or "config"
    ax.set_title(title or f"{name}: RoPE θ={report.rope_theta:g}, {report.rope_type}, attention factor {report.attention_factor:.4g}")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
