"""RoPE and its context extensions, with Hugging Face interop: the public face.

>>> import json, posenc.rope
>>> rope = posenc.rope.from_hf_config(json.load(open("config.json")))     # doctest: +SKIP
>>> rope.to_hf_dict()                                   # the same RoPE fields back    # doctest: +SKIP
>>> report = posenc.rope.inspect_config(config)                                       # doctest: +SKIP
>>> posenc.rope.plot_rope_inspection(report, "rope.png")                              # doctest: +SKIP

The scalings themselves (linear / PI, ntk, dynamic, yarn, llama3, longrope) are pure
functions in :mod:`posenc.encodings.rope_scaling`; :func:`rope_frequencies` dispatches on a
Hugging Face ``rope_scaling`` dict. matplotlib is imported only by
:func:`plot_rope_inspection`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .encodings.rope_scaling import (
    HF_ROPE_FIELDS,
    LENGTH_DEPENDENT,
    ROPE_INIT_FUNCTIONS,
    ROPE_TYPES,
    extension_methods,
    read_hf_config,
    rope_type_of,
    yarn_correction_dim,
)
from .encodings.rotary import RoPE, apply_rotary, rope_frequencies

__all__ = [
    "RoPE", "rope_frequencies", "apply_rotary", "ROPE_INIT_FUNCTIONS", "LENGTH_DEPENDENT", "HF_ROPE_FIELDS",
    "from_hf_config", "to_hf_dict", "inspect_config", "RopeInspection", "plot_rope_inspection",
    "EXTENSION_METHODS", "extension_scaling",
]


def from_hf_config(config: Mapping[str, Any], *, layer_type: str | None = None, **kwargs: Any) -> RoPE:
    """The :class:`RoPE` of a Hugging Face model config (a parsed ``config.json``).

    Reads rope_theta, rope_scaling (v4) or rope_parameters (v5), head_dim (or hidden_size //
    num_attention_heads), partial_rotary_factor and max_position_embeddings, filling in what
    Hugging Face takes from the config rather than the rope dict (see
    :func:`~posenc.encodings.rope_scaling.read_hf_config`). Hugging Face's layout: half-split
    pairs (i, i + r/2), cos and sin multiplied by the attention factor.

    Args:
        config: the config dict.
        layer_type: for a v5 per-layer ``rope_parameters`` dict, which layer type to read.
        kwargs: more :class:`RoPE` options (``interleaved``, ``dynamic_cache``).

    Returns:
        A RoPE whose :meth:`RoPE.to_hf_dict` gives back the config's RoPE fields unchanged;
        ``rope.max_position_embeddings`` holds the config's value (or None).

    Raises:
        TypeError, KeyError, ValueError: as :func:`read_hf_config` and :class:`RoPE`.
    """
    rope_kwargs, layout = read_hf_config(config, layer_type=layer_type)
    rope = RoPE(**rope_kwargs, **kwargs)
    rope.hf_layout = layout
    rope.max_position_embeddings = config.get("max_position_embeddings")
    return rope


def to_hf_dict(rope: RoPE) -> dict[str, Any]:
    """The RoPE fields of a Hugging Face config for ``rope`` (same as ``rope.to_hf_dict()``)."""
    if not isinstance(rope, RoPE):
        raise TypeError(f"rope must be a posenc RoPE, got {type(rope).__name__}")
    return rope.to_hf_dict()


#: Context-extension methods that need nothing but a factor and the training context: the
#: rope_types whose record has ``extension`` defaults (longrope needs searched per-pair factors,
#: so it is not among them). Taken from the table at import.
EXTENSION_METHODS = extension_methods()


def extension_scaling(method: str, factor: float, original_max_position_embeddings: int) -> dict[str, Any] | None:
    """The ``rope_scaling`` dict that extends a RoPE trained at context L0 by ``factor`` s.

    Each method with its published defaults (its record's ``extension`` in
    :data:`~posenc.encodings.rope_scaling.ROPE_TYPES`):

    - ``linear``: Position Interpolation (Chen et al. 2023), theta_i / s.
    - ``ntk``: static NTK-aware, base * s^(d/(d-2)).
    - ``dynamic``: dynamic NTK as Hugging Face computes it, with L0 and factor s: at length
      L > L0, base * (s L / L0 - (s - 1))^(d/(d-2)); at L = s L0 that is
      base * (s^2 - s + 1)^(d/(d-2)), a stronger stretch than ``ntk`` at the same s.
    - ``yarn``: Peng et al. 2023 with Hugging Face's defaults (beta_fast 32, beta_slow 1,
      attention_factor 0.1 ln s + 1).
    - ``llama3``: Llama 3.1's low_freq_factor 1 and high_freq_factor 4.

    Args:
        method: one of :data:`EXTENSION_METHODS`.
        factor: s >= 1, the extended context over L0.
        original_max_position_embeddings: L0, the training context (positive int).

    Returns:
        The dict for :class:`RoPE` ``(scaling=...)``, or None when s = 1: every method then
        leaves RoPE exactly as trained.

    Raises:
        ValueError: an unknown method (the message lists them), s < 1 or L0 < 1.
    """
    record = ROPE_TYPES.get(method) if isinstance(method, str) else None
    if record is None or record.extension is None:
        raise ValueError(f"method must be one of {list(extension_methods())}, got {method!r}")
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor >= 1 or math.isinf(factor):
        raise ValueError(f"factor must be a finite number >= 1, got {factor!r}")
    context = original_max_position_embeddings
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise ValueError(f"original_max_position_embeddings must be a positive integer, got {context!r}")
    if factor == 1:
        return None
    scaling: dict[str, Any] = {"rope_type": method, "factor": float(factor)}
    if record.needs_context:
        scaling["original_max_position_embeddings"] = context
    scaling.update(record.extension)
    return scaling


@dataclass(frozen=True)
class RopeInspection:
    """A model's RoPE at a glance (:func:`inspect_config`).

    Per frequency pair i (i = 0 .. rotary_dim/2 - 1): ``wavelength_original[i]`` = 2 pi /
    theta_i and ``wavelength_scaled[i]`` = 2 pi / theta'_i in tokens (theta' evaluated at
    the extended context, so dynamic and longrope show their long-context frequencies);
    ``full_rotation[i]``: the pair completes a full turn within the original context
    (wavelength_original <= original_context). ``critical_dim`` is YaRN's critical
    dimension d * ln(L0 / 2 pi) / (2 ln b) (Peng et al. 2023, eq. 17 with r = 1): the
    fractional pair index where the wavelength equals L0.
    """

    model_type: str | None
    rope_type: str
    head_dim: int
    rotary_dim: int
    rope_theta: float
    original_context: int
    extended_context: int
    attention_factor: float
    wavelength_original: Tensor
    wavelength_scaled: Tensor
    full_rotation: Tensor
    critical_dim: float

    @property
    def num_full_rotation_pairs(self) -> int:
        return int(self.full_rotation.sum())

    @property
    def scale(self) -> Tensor:
        """Per pair, how much the scaling stretched the wavelength (1 = untouched)."""
        return self.wavelength_scaled / self.wavelength_original


def inspect_config(
    config: Mapping[str, Any],
    *,
    layer_type: str | None = None,
    original_context: int | None = None,
    extended_context: int | None = None,
) -> RopeInspection:
    """Per frequency pair, the wavelengths of a config's RoPE against its contexts.

    The original context L0 is the rope dict's ``original_max_position_embeddings`` (as
    :func:`from_hf_config` fills it in), else ``max_position_embeddings``. The extended
    context is max(max_position_embeddings, L0 * factor). Either can be given instead.

    Raises:
        KeyError: no context length can be found (give ``original_context``); and as
        :func:`from_hf_config`.
    """
    rope = from_hf_config(config, layer_type=layer_type)
    scaling = rope.scaling or {}
    max_pos = config.get("max_position_embeddings")
    if original_context is None:
        original_context = scaling.get("original_max_position_embeddings") or max_pos
        if original_context is None:
            raise KeyError("config: needs 'max_position_embeddings' (or pass original_context=)")
    if extended_context is None:
        factor = scaling.get("factor") or 1.0
        extended_context = max(int(max_pos or 0), int(round(original_context * factor)), int(original_context))
    inv_original, _ = rope_frequencies(rope.rotary_dim, base=rope.base)
    inv_scaled, attention_factor = rope_frequencies(
        rope.rotary_dim, base=rope.base, scaling=rope.scaling, seq_len=extended_context
    )
    wavelength_original = 2 * math.pi / inv_original.double()
    return RopeInspection(
        model_type=config.get("model_type"),
        rope_type=rope_type_of(rope.scaling),
        head_dim=rope.head_dim,
        rotary_dim=rope.rotary_dim,
        rope_theta=rope.base,
        original_context=int(original_context),
        extended_context=int(extended_context),
        attention_factor=attention_factor,
        wavelength_original=wavelength_original,
        wavelength_scaled=2 * math.pi / inv_scaled.double(),
        full_rotation=wavelength_original <= original_context,
        critical_dim=yarn_correction_dim(1.0, rope.rotary_dim, rope.base, int(original_context)),
    )


def plot_rope_inspection(report: RopeInspection, out_png: str | Path, *, title: str | None = None) -> Path:
    """Draw wavelength per pair (log scale), original and scaled, against both contexts.

    Writes a PNG (matplotlib, Agg backend, imported here) and returns its path.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
