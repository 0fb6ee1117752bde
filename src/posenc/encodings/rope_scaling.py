"""RoPE frequencies and their context-extension scalings, as pure functions.

Each ``rope_type`` is one function ``(dim, base, scaling, seq_len) -> (inv_freq,
attention_factor)`` in :data:`ROPE_INIT_FUNCTIONS` (the shape of Hugging Face's
``modeling_rope_utils``, with plain arguments instead of a model config). ``inv_freq`` is
float32 of shape (dim // 2,), computed in float64 and rounded once; ``attention_factor`` is
the factor Hugging Face multiplies cos and sin by.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor


def default_inv_freq_f64(dim: int, base: float) -> Tensor:
    """theta_i = base^(-2i/dim), i = 0 .. dim/2 - 1 (Su et al. 2021, eq. 15), float64."""
    return 1.0 / (float(base) ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))


def _default(dim: int, base: float, scaling: Mapping[str, Any], seq_len: int | None) -> tuple[Tensor, float]:
    return default_inv_freq_f64(dim, base), 1.0


RopeInitFn = Callable[[int, float, Mapping[str, Any], "int | None"], tuple[Tensor, float]]

#: rope_type -> function(dim, base, scaling dict, seq_len) -> (inv_freq float64, attention_factor).
ROPE_INIT_FUNCTIONS: dict[str, RopeInitFn] = {"default": _default}


def compute_rope_parameters(
    dim: int, base: float, scaling: Mapping[str, Any] | None, seq_len: int | None
) -> tuple[Tensor, float]:
    """Dispatch on ``scaling["rope_type"]`` (``"type"`` is read too, as Hugging Face does).

    Returns (inv_freq float32 (dim // 2,), attention_factor float).

    Raises:
        ValueError: an unknown rope_type (the message lists the known ones).
        TypeError: ``scaling`` is not a mapping.
    """
    if scaling is None:
        rope_type = "default"
        scaling = {}
    else:
        if not isinstance(scaling, Mapping):
            raise TypeError(f"scaling must be a dict in the Hugging Face rope_scaling form, got {type(scaling).__name__}")
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"scaling: unknown rope_type {rope_type!r}; known: {sorted(ROPE_INIT_FUNCTIONS)}")
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS[rope_type](dim, base, scaling, seq_len)
    return inv_freq.to(torch.float32), float(attention_factor)
