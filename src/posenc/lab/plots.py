"""Figures: what each encoding does (:func:`plot_encoding`, drawn from its hooks, never from
its name), the extrapolation results (:func:`plot_extrapolation`), the synthetic-task
accuracies of ``posenc lengthgen`` (:func:`plot_lengthgen`) and a model's RoPE wavelengths
against its contexts (:func:`plot_rope_inspection`, ``posenc inspect``: the library's own
figure, :mod:`posenc.hf_config.rope_figure`, re-exported here with :func:`figure_path`, the
path rule of every figure).

``plot_encoding(name, out)`` builds the encoding at a small model size and draws one panel
(or two) per hook it uses:

- ``embed`` (sinusoidal, learned): the position x dimension table that is added to x;
- ``rotate`` (rope, xpos): q.k against relative distance for q = k = 1 (the long-term decay
  of RoFormer, section 3.4.3, with its relative upper bound), and the wavelength 2 pi / theta_i
  of each rotated pair;
- positions with several axes (``position_axes`` >= 2: M-RoPE, axial RoPE): q.k of the
  centre patch of a grid against every patch (the 2-D decay);
- ``score_bias`` (alibi, t5, kerple, fire): the bias against distance, one line per head, and
  the (i, j) bias of the first head;
- ``content`` (shaw, transformer_xl): the relative table, learned or sinusoidal
  (``relative_table``); for an encoding that counts positions from the context
  (``contextual_positions``, cope): the positions p_ij it assigns when only some tokens
  count, against the token distance, and for random queries and keys;
- ``gate`` (fox): the bias its gates give for random hidden states (one line per head
  against distance, and the (i, j) bias of the first head);
- ``mask`` (irope's chunked attention): which keys each query may attend, with the causal
  mask, over a span that shows the mask's reach (three times how far back a query sees);
- a layer schedule (``for_layer`` differs between layers, irope): the query scale
  |rotate(q)| / |q| against position for each kind of layer (1 for a rotation; Llama 4's
  attention temperature on its NoPE layers);
- no hook (nope): a figure that says there is no positional signal.

matplotlib is imported inside each function (``import posenc`` needs only torch and numpy)
with the non-interactive Agg backend.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import Tensor

from posenc.encodings import create_for_model
from posenc.encodings.base import Hook, PositionalEncoding
from posenc.errors import InvalidArgument
from posenc.hf_config.rope_figure import (
    figure_path,
    plot_rope_inspection,
    pyplot,
    supported_formats,
)
from posenc.lab.experiments.frame import Row

__all__ = [
    "FIGURE_SIZES", "figure_path", "needle_tasks", "plot_depth_heatmap", "plot_encoding", "plot_extension",
    "plot_extrapolation", "plot_lengthgen", "plot_rope_inspection", "supported_formats",
]

#: The model size the figures use unless ``plot_encoding`` is given others.
FIGURE_SIZES = {"d_model": 64, "num_heads": 8, "head_dim": 32, "max_positions": 256}


def _line_style(result: dict) -> str:
    """Solid for a trained encoding; dashed for a RoPE scaling at inference; dotted after a fine-tune."""
    extension = result.get("extension")
    if extension is None:
        return "-"
    return ":" if extension.get("finetune") else "--"


def _embed_panels(enc: PositionalEncoding, d_model: int, num_positions: int):
    positions = torch.arange(num_positions)
    table = enc.embed(torch.zeros(1, num_positions, d_model), positions)[0]

    def draw(ax, fig):
        image = ax.imshow(table.detach().numpy(), aspect="auto", cmap="RdBu_r", interpolation="nearest")
        ax.set_xlabel("embedding dimension (index)")
        ax.set_ylabel("position (tokens)")
        ax.set_title("vector added to each token embedding")
        fig.colorbar(image, ax=ax, label="value")

    return [draw]


def _rotate_panels(enc: PositionalEncoding, head_dim: int, max_distance: int):
    distances = torch.arange(max_distance + 1)
    query_pos = torch.tensor([max_distance])
    ones = torch.ones(1, 1, 1, head_dim)
    q_rot, k_rot = enc.rotate(ones, ones.expand(1, 1, max_distance + 1, head_dim), query_pos, max_distance - distances)
    score = (q_rot @ k_rot.transpose(-2, -1))[0, 0, 0] / head_dim
    inv_freq = getattr(enc, "inv_freq", None)

    def decay(ax, fig):
        ax.plot(distances.numpy(), score.detach().numpy(), lw=1, label="q.k / D, q = k = 1")
        if inv_freq is not None:  # RoFormer eq. (37): (1/(d/2)) sum_j |S_j|, S_j = sum_{k<j} e^{i r theta_k}
            angles = distances.double().unsqueeze(-1) * inv_freq.double()
            partial = torch.complex(angles.cos(), angles.sin()).cumsum(-1)
            bound = partial.abs().mean(-1)
            ax.plot(distances.numpy(), (bound / bound[0]).numpy(), lw=1, ls="--", label="RoFormer relative upper bound")
        ax.set_xlabel("relative distance n - m (tokens)")
        ax.set_ylabel("score (relative to distance 0)")
        ax.set_title("long-term decay of q.k")
        ax.legend(fontsize=8)

    panels = [decay]
    if inv_freq is not None:

        def wavelengths(ax, fig):
            wave = (2 * math.pi / inv_freq.double()).numpy()
            ax.semilogy(range(len(wave)), wave, marker=".", lw=1)
            ax.set_xlabel("frequency pair i")
            ax.set_ylabel("wavelength 2\u03c0/\u03b8_i (tokens)")
            ax.set_title("wavelength of each rotated pair")

        panels.append(wavelengths)
    return panels


def _grid_panels(enc: PositionalEncoding, head_dim: int, radius: int):
    """For a multi-axis encoding (``position_axes`` >= 2): q.k / D of the centre patch of a
    (2R+1) x (2R+1) grid against every patch, q = k = 1, the grid on the last two axes (height,
    width) and the others at 0. For q = k = 1 the score is the mean over rotated pairs of
    cos(angle difference), which is also E[q.k] / D for q = k ~ N(0, I): the 2-D decay."""
    side = 2 * radius + 1
    rows, cols = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    keys = torch.zeros(enc.position_axes, 1, side * side, dtype=torch.long)  # axis-first (A, B, T)
    keys[-2, 0], keys[-1, 0] = rows.flatten(), cols.flatten()
    centre = torch.zeros(enc.position_axes, 1, 1, dtype=torch.long)
    centre[-2:] = radius
    ones = torch.ones(1, 1, 1, head_dim)
    with torch.no_grad():
        q_rot, k_rot = enc.rotate(ones, ones.expand(1, 1, side * side, head_dim), centre, keys)
        score = (q_rot @ k_rot.transpose(-2, -1))[0, 0, 0].reshape(side, side) / head_dim

    def heatmap(ax, fig):
        extent = (-radius - 0.5, radius + 0.5, radius + 0.5, -radius - 0.5)
        image = ax.imshow(score.numpy(), cmap="viridis", interpolation="nearest", extent=extent)
        ax.set_xlabel("width offset from the centre patch (patches)")
        ax.set_ylabel("height offset (patches)")
        ax.set_title("q.k / D against the centre patch, q = k = 1")
        fig.colorbar(image, ax=ax, label="score (1 at the centre)")

    return [heatmap]


def _bias_panels(enc: PositionalEncoding, max_distance: int, grid: int):
    distances = torch.arange(max_distance + 1)
    query_pos = torch.tensor([max_distance])
    with torch.no_grad():
        per_head = enc.score_bias(query_pos, max_distance - distances)[:, 0, :]  # (H, R+1)
        positions = torch.arange(grid)
        square = enc.score_bias(positions, positions)[0].clone()
    square[positions.unsqueeze(-1) < positions] = float("nan")  # future keys: masked in causal use
    return _per_head_and_square(distances, per_head, square, max_distance, "bias against distance, per head",
                                "bias b(i, j), head 0 (j > i masked)", "position ")


def _per_head_and_square(distances: Tensor, per_head: Tensor, square: Tensor, max_distance: int,
                         lines_title: str, square_title: str, axis_word: str = ""):
    """Two panels of a bias: per head against distance from the last query, and its (i, j) picture."""
    def lines(ax, fig):
        for h, row in enumerate(per_head):
            ax.plot(distances.numpy(), row.numpy(), lw=1, label=f"head {h}")
        ax.set_xlabel(f"distance i - j (tokens), query at i = {max_distance}")
        ax.set_ylabel("bias added to the logit (nats)")
        ax.set_title(lines_title)
        ax.legend(fontsize=6, ncol=2)

    def heatmap(ax, fig):
        image = ax.imshow(square.numpy(), cmap="viridis", interpolation="nearest")
        ax.set_xlabel(f"key {axis_word}j (tokens)")
        ax.set_ylabel(f"query {axis_word}i (tokens)")
        ax.set_title(square_title)
        fig.colorbar(image, ax=ax, label="bias (nats)")

    return [lines, heatmap]


def _contextual_panels(enc: PositionalEncoding, head_dim: int, length: int):
    """p_ij of ``contextual_positions`` (query i = T - 1): when every 4th key is a "separator"
    the query counts (gate ~ 1) and the others are skipped (gate ~ 0), against the token
    distance; and p_ij for random q, k."""
    direction = torch.ones(head_dim) / math.sqrt(head_dim)
    sign = torch.where(torch.arange(length) % 4 == 3, 1.0, -1.0)
    strength = 6.0 * head_dim ** 0.25  # q.k / sqrt(D) = +-6: gates 0.998 and 0.002
    q = (strength * direction).expand(1, 1, 1, head_dim)
    k = (strength * sign[:, None] * direction).unsqueeze(0).unsqueeze(0)
    g = torch.Generator().manual_seed(0)
    rq, rk = torch.randn(1, 1, length, head_dim, generator=g), torch.randn(1, 1, length, head_dim, generator=g)
    causal = torch.arange(length) <= torch.arange(length).unsqueeze(-1)
    with torch.no_grad():
        counted = enc.contextual_positions(q, k)[0, 0, 0]  # the query sees every key
        random_p = enc.contextual_positions(rq, rk, causal)[0, 0].masked_fill(~causal, float("nan"))
    distance = torch.arange(length - 1, -1, -1)  # i - j for the query at i = T - 1

    def counting(ax, fig):
        ax.plot(distance.numpy(), (distance + 1).numpy(), lw=1, ls="--", label="token count i - j + 1")
        ax.plot(distance.numpy(), counted.numpy(), lw=1.5, label="p_ij, every 4th token counted")
        ax.set_xlabel(f"distance i - j (tokens), query at i = {length - 1}")
        ax.set_ylabel("position p_ij")
        ax.set_title("contextual positions count only the gated tokens")
        ax.legend(fontsize=8)

    def heatmap(ax, fig):
        image = ax.imshow(random_p.numpy(), cmap="viridis", interpolation="nearest")
        ax.set_xlabel("key j (tokens)")
        ax.set_ylabel("query i (tokens)")
        ax.set_title("p_ij for random q, k (j > i masked)")
        fig.colorbar(image, ax=ax, label="position p_ij")

    return [counting, heatmap]


def _gate_panels(enc: PositionalEncoding, d_model: int, max_distance: int, grid: int):
    """The gate bias of one random sequence of hidden states (unit normal, as after a
    LayerNorm): per head against distance for the last query, and the (i, j) picture."""
    length = max_distance + 1
    x = torch.randn(1, length, d_model, generator=torch.Generator().manual_seed(0))
    index = torch.arange(length)
    with torch.no_grad():
        state = enc.prepare_gates(enc.gate(x))
        per_head = enc.gate_bias(state, index[-1:], index, causal=True)[0, :, 0].flip(-1)  # (H, distance)
        square = enc.gate_bias(state, index[:grid], index[:grid], causal=True)[0, 0].clone()
    square[index[:grid].unsqueeze(-1) < index[:grid]] = float("nan")
    return _per_head_and_square(index, per_head, square, max_distance, "gate bias against distance, random hidden states",
                                "gate bias (i, j), head 0 (j > i masked)")


def _content_panels(enc: PositionalEncoding, max_distance: int, head_dim: int = 8, grid: int = 64):
    panels = []
    if hasattr(enc, "contextual_positions"):
        panels += _contextual_panels(enc, head_dim, min(grid, max_distance + 1))
    table_fn = getattr(enc, "relative_table", None)
    if table_fn is None:
        return panels
    with torch.no_grad():
        distances, table, what = table_fn(max_distance)

    def draw(ax, fig):
        d = distances.numpy()
        image = ax.imshow(table.numpy(), aspect="auto", cmap="RdBu_r", interpolation="nearest",
                          extent=(-0.5, table.shape[1] - 0.5, d[-1] + 0.5, d[0] - 0.5))
        ax.set_xlabel("dimension (index)")
        ax.set_ylabel("relative distance (tokens)")
        ax.set_title(what)
        fig.colorbar(image, ax=ax, label="value")

    return panels + [draw]


def _mask_reach(enc: PositionalEncoding, probe: int = 1 << 20) -> int | None:
    """How far back a query at a large position sees (keys it may attend, itself included),
    or None when the mask hides nothing before it: the scale the mask panel is drawn at."""
    keys = torch.arange(probe)
    allowed = enc.attention_mask(torch.tensor(probe - 1), keys)
    hidden = (~allowed).nonzero()
    return probe - 1 - int(hidden.max()) if hidden.numel() else None


def _mask_panels(enc: PositionalEncoding, cells: int = 192):
    reach = _mask_reach(enc)
    span = 128 if reach is None else 3 * reach
    positions = torch.linspace(0, span - 1, min(cells, span)).round().long().unique()
    query, key = positions.unsqueeze(-1), positions.unsqueeze(0)
    with torch.no_grad():
        allowed = enc.attention_mask(query, key) & (key <= query)

    def draw(ax, fig):
        last = float(positions[-1])
        ax.imshow(allowed.numpy(), cmap="Greys", interpolation="nearest", extent=(0, last, last, 0))
        ax.set_xlabel("key position (tokens)")
        ax.set_ylabel("query position (tokens)")
        reach_text = "everything before it" if reach is None else f"at most {reach} keys back"
        ax.set_title(f"keys a query may attend (black), causal and mask:\na query sees {reach_text}", fontsize=10)

    return [draw]


def _layer_kinds(enc: PositionalEncoding, layers: int = 8) -> list[tuple[list[int], PositionalEncoding]]:
    """The distinct encodings of the first ``layers`` layers, with the layers using each; empty
    unless the encoding is a layer schedule (some layer's encoding is not the encoding itself)."""
    kinds: list[tuple[list[int], PositionalEncoding]] = []
    for layer in range(layers):
        try:
            sub = enc.for_layer(layer)
        except ValueError:  # an explicit schedule shorter than ``layers``
            break
        for indices, known in kinds:
            if known is sub:
                indices.append(layer)
                break
        else:
            kinds.append(([layer], sub))
    return kinds if any(sub is not enc for _, sub in kinds) else []


def _schedule_panels(enc: PositionalEncoding, head_dim: int):
    kinds = _layer_kinds(enc)
    if not kinds:
        return []
    positions = torch.logspace(0, 20, 400, base=2).round().long().unique() - 1
    ones = torch.ones(1, 1, positions.numel(), head_dim)
    lines = []
    for indices, sub in kinds:
        scale = torch.ones(positions.numel())
        if Hook.ROTATE in sub.hooks:
            with torch.no_grad():
                rotated, _ = sub.rotate(ones, ones[:, :, :1], positions, positions[:1])
            scale = rotated[0, 0].norm(dim=-1) / head_dim**0.5
        lines.append((f"layers {', '.join(map(str, indices))}: {sub.name or type(sub).__name__}", scale))

    def draw(ax, fig):
        for label, scale in lines:
            ax.semilogx((positions + 1).numpy(), scale.numpy(), lw=1.2, label=label)
        ax.set_xlabel("query position p + 1 (tokens, log scale)")
        ax.set_ylabel("|rotate(q)| / |q|")
        ax.set_title("query scale by position, per kind of layer (first 8 layers)", fontsize=10)
        ax.legend(fontsize=7)

    return [draw]


def _no_signal_panel(max_distance: int):
    def draw(ax, fig):
        ax.plot([0, max_distance], [0, 0], lw=2)
        ax.set_ylim(-1, 1)
        ax.set_xlabel("relative distance (tokens)")
        ax.set_ylabel("positional term in the logit (nats)")
        ax.set_title("no positional signal")
        ax.text(0.5, 0.7, "order reaches the model only through the causal mask",
                transform=ax.transAxes, ha="center", fontsize=9)

    return [draw]


def plot_encoding(name: str, out: str | Path, **encoding_kwargs) -> Path:
    """Draw what the encoding ``name`` does and save it as a PNG at ``out``.

    Args:
        name: a registered encoding (``posenc.available()``).
        out: the figure's path, its format from the extension (PNG without one); an existing
            folder: ``<name>.png`` in it (:func:`figure_path`); parent folders are created.
        **encoding_kwargs: the model sizes ``d_model``, ``num_heads``, ``head_dim``,
            ``max_positions`` (defaults :data:`FIGURE_SIZES`), ``max_distance`` (the distance
            axis, default 1024 for rotations, 128 otherwise) and the encoding's own options
            (e.g. ``variant="power"`` for kerple).

    Returns:
        The path written.

    Raises:
        ValueError: an unknown name (listing the available ones), a bad option, or an
            extension matplotlib does not write (listing those it does).
    """
    out = figure_path(out, f"{name}.png")
    sizes = {key: encoding_kwargs.pop(key, default) for key, default in FIGURE_SIZES.items()}
    max_distance = encoding_kwargs.pop("max_distance", None)
    torch.manual_seed(0)  # learned tables are drawn at their (seeded) initialisation
    enc = create_for_model(name, **sizes, **encoding_kwargs)
    grid = min(64, sizes["max_positions"])
    panels = []
    if Hook.EMBED in enc.hooks:
        panels += _embed_panels(enc, sizes["d_model"], min(sizes["max_positions"], enc.max_positions or 10**9))
    if Hook.ROTATE in enc.hooks:
        panels += _rotate_panels(enc, sizes["head_dim"], max_distance or 1024)
    if enc.position_axes >= 2:
        panels += _grid_panels(enc, sizes["head_dim"], min(max_distance or 16, 64))
    if Hook.SCORE_BIAS in enc.hooks:
        panels += _bias_panels(enc, max_distance or 128, grid)
    if Hook.CONTENT in enc.hooks:
        panels += _content_panels(enc, max_distance or 64, sizes["head_dim"], grid)
    if Hook.GATE in enc.hooks:
        panels += _gate_panels(enc, sizes["d_model"], max_distance or 128, grid)
    if Hook.MASK in enc.hooks and enc.attention_mask(torch.tensor(0), torch.tensor(0)) is not None:
        panels += _mask_panels(enc)
    panels += _schedule_panels(enc, sizes["head_dim"])
    if not panels:
        panels = _no_signal_panel(max_distance or 128)

    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(max(6.5, 5.2 * len(panels)), 4.4), squeeze=False)
    for draw, ax in zip(panels, axes[0]):
        draw(ax, fig)
    hooks = ", ".join(sorted(enc.hooks)) or "none"
    trained = "\nlearned parameters shown at their initialisation" if any(True for _ in enc.parameters()) else ""
    fig.suptitle(f"{name} ({type(enc).__name__}; hook: {hooks}){trained}", fontsize=11)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


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
            style = dict(linestyle=_line_style(res), color=colors(index % colors.N), marker=markers[index % len(markers)])
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
    return _save(fig, plt, out, dpi=120)


def _task_axes(plt, count: int, width: float, height: float):
    """A grid of ``count`` panels, at most three a row, the unused ones hidden; constrained
    layout keeps titles, tick labels and a shared colour bar apart."""
    columns = min(3, count)
    rows = -(-count // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(width * columns, height * rows), squeeze=False, layout="constrained")
    for ax in axes.flat[count:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:count])


def _save(fig, plt, out: Path, dpi: int = 110) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return out


def _annotate(ax, grid: list[list[float]], fontsize: float) -> None:
    """Write each accuracy in its cell ("n/a" for NaN), dark on light cells."""
    for i, line in enumerate(grid):
        for j, value in enumerate(line):
            text = "n/a" if value != value else f"{value:.2f}"
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
            style = dict(color=colors(index % colors.N), marker="os^Dv<>PXph"[index % 11],
                         linestyle="--" if Row.of(row).randomized else "-", label=row)
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
    paths.append(_save(fig, plt, out_dir / "accuracy.png"))

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
    paths.append(_save(fig, plt, out_dir / "heatmap.png"))

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
    return _save(fig, plt, Path(out))
