"""RoPE and its context extensions, with Hugging Face interop: the public face.

>>> import json, posenc.rope
>>> rope = posenc.rope.from_hf_config(json.load(open("config.json")))     # doctest: +SKIP
>>> rope.to_hf_dict()                                   # the same RoPE fields back    # doctest: +SKIP
>>> report = posenc.rope.inspect_config(config)                                       # doctest: +SKIP
>>> posenc.rope.plot_rope_inspection(report, "rope.png")                              # doctest: +SKIP

Where things live: the scalings themselves (linear / PI, ntk, dynamic, yarn, llama3,
longrope), one :class:`~posenc.encodings.rope.scaling.RopeType` record each, in
:mod:`posenc.encodings.rope.scaling`; :func:`rope_frequencies` dispatches on a Hugging Face
``rope_scaling`` dict; config.json interop (:func:`from_hf_config`, :func:`to_hf_dict`,
:func:`inspect_config`, :func:`read_hf_config`, :func:`write_hf_config`) in
:mod:`posenc.encodings.rope_interop`; the figure :func:`plot_rope_inspection` in
:mod:`posenc.lab.plots`, loaded on first use, so ``import posenc.rope`` does not import the
figures (and matplotlib is imported only when one is drawn).
"""

from __future__ import annotations

import math
from typing import Any

from posenc.encodings.rope_interop import HF_ROPE_FIELDS, RopeInspection, inspect_config, read_hf_config, write_hf_config
from posenc.encodings.rope.scaling import (
    LENGTH_DEPENDENT,
    ROPE_INIT_FUNCTIONS,
    ROPE_TYPES,
    extension_methods,
    rope_type_of,  # noqa: F401 (importable from here before the split)
    yarn_correction_dim,  # noqa: F401
)
from posenc.encodings.rope.rotary import RoPE, from_hf_config, rope_frequencies, to_hf_dict
from posenc.kernels.rotary_torch import apply_rotary
from posenc.errors import InvalidArgument

__all__ = [
    "RoPE", "rope_frequencies", "apply_rotary", "ROPE_INIT_FUNCTIONS", "LENGTH_DEPENDENT", "HF_ROPE_FIELDS",
    "from_hf_config", "to_hf_dict", "inspect_config", "RopeInspection", "plot_rope_inspection",
    "EXTENSION_METHODS", "extension_scaling", "ROPE_TYPES", "read_hf_config", "write_hf_config",
]


#: Context-extension methods that need nothing but a factor and the training context: the
#: rope_types whose record has ``extension`` defaults (longrope needs searched per-pair factors,
#: so it is not among them). Taken from the table at import.
EXTENSION_METHODS = extension_methods()


def extension_scaling(method: str, factor: float, original_max_position_embeddings: int) -> dict[str, Any] | None:
    """The ``rope_scaling`` dict that extends a RoPE trained at context L0 by ``factor`` s.

    Each method with its published defaults (its record's ``extension`` in
    :data:`~posenc.encodings.rope.scaling.ROPE_TYPES`):

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
        raise InvalidArgument(f"method must be one of {list(extension_methods())}, got {method!r}")
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor >= 1 or math.isinf(factor):
        raise InvalidArgument(f"factor must be a finite number >= 1, got {factor!r}")
    context = original_max_position_embeddings
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise InvalidArgument(f"original_max_position_embeddings must be a positive integer, got {context!r}")
    if factor == 1:
        return None
    scaling: dict[str, Any] = {"rope_type": method, "factor": float(factor)}
    if record.needs_context:
        scaling["original_max_position_embeddings"] = context
    scaling.update(record.extension)
    return scaling


def __getattr__(name: str) -> Any:
    # the figure lives with the other figures; fetched on first use so that importing this
    # module (and posenc) never imports posenc.lab.plots
    if name == "plot_rope_inspection":
        from posenc.lab.plots import plot_rope_inspection

        return plot_rope_inspection
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
