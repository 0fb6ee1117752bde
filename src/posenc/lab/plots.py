"""Figures: what each encoding does (:func:`plot_encoding`, drawn from its hooks, never from
its name, ``posenc plot``). The other figures live with what they draw and are importable from
here too: the extrapolation results (:func:`plot_extrapolation`, :func:`plot_extension`:
:mod:`posenc.lab.experiments.extrapolation_report`), the synthetic-task accuracies of
``posenc lengthgen`` (:func:`plot_lengthgen`, :func:`plot_depth_heatmap`:
:mod:`posenc.lab.experiments.lengthgen_report`) and a model's RoPE wavelengths against its
contexts (:func:`plot_rope_inspection`, ``posenc inspect``: the library's own figure,
:mod:`posenc.hf_config.rope_figure`, with :func:`figure_path`, the path rule of every figure).

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
  against distance, and the (i, j) bias of the first head); gates that carry vectors
  (``gate_features``, path): what is left of q.k for q = k after the transforms of the tokens
  between, for random hidden states;
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
from posenc.hf_config.rope_figure import (
    figure_path,
    plot_rope_inspection,
    pyplot,
    supported_formats,
)
from posenc.lab.experiments.extrapolation_report import (
    plot_extension,
    plot_extrapolation,
)
from posenc.lab.experiments.lengthgen_report import (
    needle_tasks,
    plot_depth_heatmap,
    plot_lengthgen,
)

__all__ = [
    "FIGURE_SIZES", "figure_path", "needle_tasks", "plot_depth_heatmap", "plot_encoding", "plot_extension",
    "plot_extrapolation", "plot_lengthgen", "plot_rope_inspection", "supported_formats",
]

#: The model size the figures use unless ``plot_encoding`` is given others.
FIGURE_SIZES = {"d_model": 64, "num_heads": 8, "head_dim": 32, "max_positions": 256}


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
    # an encoding with tables per key/value head (FoPE) is drawn for its head 0
    heads = getattr(enc, "num_key_value_heads", 1)
    ones = torch.ones(1, heads, 1, head_dim)
    q_rot, k_rot = enc.rotate(ones, ones.expand(1, heads, max_distance + 1, head_dim), query_pos,
                              max_distance - distances)
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
    # an encoding whose axes are per key/value head (MHRoPE) is drawn as the mean over its heads
    heads = getattr(enc, "num_key_value_heads", 1)
    ones = torch.ones(1, heads, 1, head_dim)
    with torch.no_grad():
        q_rot, k_rot = enc.rotate(ones, ones.expand(1, heads, side * side, head_dim), centre, keys)
        score = (q_rot @ k_rot.transpose(-2, -1))[0, :, 0].mean(0).reshape(side, side) / head_dim

    def heatmap(ax, fig):
        extent = (-radius - 0.5, radius + 0.5, radius + 0.5, -radius - 0.5)
        image = ax.imshow(score.numpy(), cmap="viridis", interpolation="nearest", extent=extent)
        ax.set_xlabel("width offset from the centre patch (patches)")
        ax.set_ylabel("height offset (patches)")
        ax.set_title("q.k / D against the centre patch, q = k = 1" + (" (mean over heads)" if heads > 1 else ""))
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
                         lines_title: str, square_title: str, axis_word: str = "",
                         value: str = "bias added to the logit (nats)", value_short: str = "bias (nats)"):
    """Two panels of a bias (or of another ``value``): per head against distance from the last
    query, and its (i, j) picture."""
    def lines(ax, fig):
        for h, row in enumerate(per_head):
            ax.plot(distances.numpy(), row.numpy(), lw=1, label=f"head {h}")
        ax.set_xlabel(f"distance i - j (tokens), query at i = {max_distance}")
        ax.set_ylabel(value)
        ax.set_title(lines_title)
        ax.legend(fontsize=6, ncol=2)

    def heatmap(ax, fig):
        image = ax.imshow(square.numpy(), cmap="viridis", interpolation="nearest")
        ax.set_xlabel(f"key {axis_word}j (tokens)")
        ax.set_ylabel(f"query {axis_word}i (tokens)")
        ax.set_title(square_title)
        fig.colorbar(image, ax=ax, label=value_short)

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


def _transport_panels(enc: PositionalEncoding, d_model: int, head_dim: int, max_distance: int, grid: int):
    """For gates that act through a content term on q.k (PaTH: a transform of the key by every
    token between it and the query; contextual GRAPE: a turn by the phase the tokens between
    wrote): with q = k = one fixed vector u for every
    token, (q . k + content) / (u . u) is how much of the key's alignment with the query is left
    after the tokens between (1 at distance 0), for one random sequence of hidden states."""
    length = max_distance + 1
    x = torch.randn(1, length, d_model, generator=torch.Generator().manual_seed(0))
    u = torch.randn(head_dim, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        gates = enc.gate(x)
        u = (u / u.norm()).expand(1, gates.shape[1], length, head_dim)
        state = enc.prepare_gates(gates)
        index = torch.arange(length)
        left = 1 + enc.content_scores(u, u, index, index, gate_state=state)[0]  # (H, T, T)
    per_head = left[:, -1].flip(-1)  # (H, distance), query at the last token
    square = left[0, :grid, :grid].clone()
    square[index[:grid].unsqueeze(-1) < index[:grid]] = float("nan")
    return _per_head_and_square(index, per_head, square, max_distance,
                                "q.k left after the tokens between, random hidden states",
                                "(q.k + content) / q.k, head 0 (j > i masked)",
                                value="(q.k + content) / q.k  (q = k)", value_short="fraction of q.k left")


def _gated_bias_panels(enc: PositionalEncoding, d_model: int, head_dim: int, max_distance: int, grid: int):
    """For gates whose content term is a bias after the scale (``content_scaled = False``:
    additive GRAPE's path integral): that bias for one random sequence of hidden states (unit
    normal, as after a LayerNorm) at positions 0.., per head for the last query and its (i, j)
    picture."""
    length = max_distance + 1
    x = torch.randn(1, length, d_model, generator=torch.Generator().manual_seed(0))
    index = torch.arange(length)
    with torch.no_grad():
        gates = enc.gate(x)
        q = torch.zeros(1, gates.shape[1], length, head_dim)  # not read by a bias of the gates and positions
        bias = enc.content_scores(q, q, index, index, gate_state=enc.prepare_gates(gates))[0]  # (H, T, T)
    per_head = bias[:, -1].flip(-1)
    square = bias[0, :grid, :grid].clone()
    square[index[:grid].unsqueeze(-1) < index[:grid]] = float("nan")
    return _per_head_and_square(index, per_head, square, max_distance, "bias against distance, random hidden states",
                                "bias (i, j), head 0 (j > i masked)")


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
    if Hook.GATE in enc.hooks and Hook.CONTENT not in enc.hooks:
        panels += _gate_panels(enc, sizes["d_model"], max_distance or 128, grid)
    elif Hook.GATE in enc.hooks and not enc.content_scaled:
        panels += _gated_bias_panels(enc, sizes["d_model"], sizes["head_dim"], max_distance or 128, grid)
    elif Hook.GATE in enc.hooks:
        panels += _transport_panels(enc, sizes["d_model"], sizes["head_dim"], max_distance or 128, grid)
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
