"""xPos (Sun et al. 2022, "A Length-Extrapolatable Transformer"): RoPE with a per-pair
exponential decay of q and k whose product depends on m - n only.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from posenc._validation import check_even, check_number
from posenc.encodings.rope.rotary import RoPE, full_width
from posenc.kernels.rotary_torch import rotate_heads
from posenc.errors import InvalidArgument


def xpos_zeta(rotary_dim: int, gamma: float = 0.4) -> Tensor:
    """xPos per-pair decay rates, float64 (rotary_dim // 2,).

    zeta_i = (2i / r + gamma) / (1 + gamma), i = 0 .. r/2 - 1 (Sun et al. 2022, section 3.2;
    torchscale's ``(arange(0, r, 2) + 0.4 r) / (1.4 r)``): from gamma / (1 + gamma) ~ 0.286 for
    the fastest-rotating pair up to ~0.986 for the slowest one, which therefore decays least.
    """
    check_even(rotary_dim, "rotary_dim")
    return (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim + gamma) / (1.0 + gamma)


#: Headroom (as a natural log) kept below the dtype's range for the size of q and k themselves:
#: a scale factor of at most finfo.max / 256 (and at least finfo.tiny * 256) is accepted.
_XPOS_HEADROOM = math.log(256.0)

#: The named centres of :class:`XPos` (an int is a fixed centre).
XPOS_CENTERS = ("query", "call")


class XPos(RoPE):
    """Extrapolatable position embedding, xPos (Sun et al. 2022, "A Length-Extrapolatable
    Transformer", section 3.2, eq. for f_q / f_k).

    RoPE with a per-pair exponential decay: with zeta_i = (2i/r + gamma)/(1 + gamma)
    (:func:`xpos_zeta`), query n and key m get

        q'_n = R(n theta) q_n * zeta^((n - c)/B),    k'_m = R(m theta) k_m * zeta^(-(m - c)/B),

    so q'_n . k'_m = sum_i zeta_i^((n - m)/B) [rotation by (n - m) theta_i]: a function of n - m
    only, decaying with distance for n >= m (causal use, as in the paper).

    The centre c cancels in q'.k' as long as the queries and keys of a score were scaled with
    the *same* c, so c is a choice about floating-point range, not about the math. The paper
    writes c = 0, which overflows past ~33,000 positions in float32/bfloat16 (zeta_0^(-n/B)
    with zeta_0 ~ 0.286 grows by e^1.25 every B = 512 positions); torchscale centres each call
    at len // 2. posenc's default, ``center="query"``, centres each call at the midpoint of its
    *query* positions (per batch row for (B, T) positions): every key before the query block is
    then only ever *decayed*, zeta^((c - m)/B) <= 1, and a factor that underflows to 0 is the
    correct limit of a vanishing weight; only the query block's own half-span (and keys inside
    it) can grow a factor, by at most zeta_0^(-span/(2B)). So a decoding step at position
    1,048,576 over a cache of a million keys is finite in float32, bfloat16 and float16, and a
    block of queries may span about 68,000 positions in float32/bfloat16 and about 4,500 in
    float16 (positions of its keys unrestricted). Past that, ``rotate`` raises ValueError
    naming the argument, never inf or NaN (docs/precision.md). Because c follows the queries,
    keys must be re-scaled with each call's queries: a KV cache holds *unrotated* keys and
    passes them all to :func:`posenc.attention`, which rotates every key it is given.

    Other centres: an int is a **fixed** centre (``center=0`` is the paper's): keys rotated
    once into a cache stay exact for later queries, but
    |position - center| must stay under ~33,000 (float32/bfloat16) or ~2,200 (float16) for the
    growing side. ``center="call"`` is torchscale's: the midpoint of all the call's query and
    key positions, exact only within one call.

    Args:
        head_dim: D (positive, even).
        scale_base: B, 512 in the paper.
        gamma: 0.4 in the paper.
        center: "query" (default: the midpoint of each call's query positions), an int (a
            fixed centre) or "call" (the midpoint of the call's query and key positions).
        **rope_kwargs: rotary_dim, partial_rotary_factor, base, interleaved, scaling, as
            :class:`RoPE`; zeta uses r = rotary_dim and the tail past r is neither rotated nor scaled.
            Default layout half-split (x-transformers); torchscale pairs (2i, 2i+1)
            (``interleaved=True``). The layouts are the same map up to a permutation.

    Hook: ``rotate``. Shapes as :class:`RoPE`; the scale is computed in float64 and the
    product in float32 (or wider), cast back to x's dtype.

    Raises:
        ValueError: scale_base <= 0, gamma <= 0, a bad center (at construction); positions so
            far on the growing side of the centre that a scale factor would leave x's dtype's
            range (at call). A decaying factor is never an error: it may underflow to 0. The
            range check reads the positions' values, so it is skipped under
            ``torch.compile`` (the compiled graph would break on it): check positions with
            an uncompiled call.
    """

    name = "xpos"

    def __init__(
        self,
        head_dim: int,
        *,
        scale_base: float = 512.0,
        gamma: float = 0.4,
        center: int | str = "query",
        **rope_kwargs: Any,
    ) -> None:
        super().__init__(head_dim, **rope_kwargs)
        check_number(scale_base, "scale_base", gt=0)
        check_number(gamma, "gamma", gt=0)
        if not (center in XPOS_CENTERS or (isinstance(center, int) and not isinstance(center, bool))):
            raise InvalidArgument(f"center must be an int (a fixed centre) or one of {XPOS_CENTERS}, got {center!r}")
        self.scale_base, self.gamma, self.center = float(scale_base), float(gamma), center
        self._log_zeta = xpos_zeta(self.rotary_dim, self.gamma).log()  # float64, kept off the module's .to()

    def _centre(self, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """The centre c as an int64 tensor: 0-d, or (B, 1) per row for "query" with (B, T) positions."""
        if self.center == "query":
            if q_positions.numel() == 0:
                return torch.zeros((), dtype=torch.long, device=q_positions.device)
            lo = q_positions.min(dim=-1, keepdim=True).values if q_positions.dim() == 2 else q_positions.min()
            hi = q_positions.max(dim=-1, keepdim=True).values if q_positions.dim() == 2 else q_positions.max()
            return (lo + hi).div(2, rounding_mode="floor")
        if self.center == "call":
            lo = torch.minimum(q_positions.min(), k_positions.min()).to(torch.long)
            hi = torch.maximum(q_positions.max(), k_positions.max()).to(torch.long)
            return (lo + hi).div(2, rounding_mode="floor")
        return torch.tensor(self.center, device=q_positions.device)

    def _check_range(self, growth: Tensor, dtype: torch.dtype, argname: str, centre: Tensor) -> None:
        """Raise if a growing factor zeta_0^(-growth/B) (growth = positions on the growing side
        of the centre) would leave ``dtype``'s range; decaying factors may underflow to 0.

        Skipped under ``torch.compile``: it needs a value (``int(growth.max())``), which
        would break the graph; run a compiled model once uncompiled to check its positions."""
        if not growth.numel() or torch.compiler.is_compiling():
            return
        farthest = int(growth.max())
        limit = math.log(torch.finfo(dtype).max) - _XPOS_HEADROOM
        if farthest / self.scale_base * float(-self._log_zeta[0]) > limit:
            max_offset = int(limit / float(-self._log_zeta[0]) * self.scale_base)
            raise InvalidArgument(
                f"{argname}: xPos scale zeta^((n - center)/{self.scale_base:g}) leaves the {dtype} range: a position "
                f"{farthest} away on the growing side of the center ({self.center!r}: "
                f"{centre.flatten()[:4].tolist()}; at most {max_offset} is safe); "
                "use center='query' with shorter query blocks, or a float32 dtype"
            )

    def xpos_scale(self, positions: Tensor, centre: Tensor | int, sign: float, dtype: torch.dtype) -> Tensor:
        """zeta^(sign (n - centre) / B) at positions (T,) or (B, T) -> (T, r) or (B, T, r) of dtype,
        full width in this encoding's layout; sign +1 for queries, -1 for keys. ``centre`` is an
        int or an integer tensor broadcastable to positions ((B, 1) per row). The offset is taken
        in int64 and the power in float64, so a factor is exact to float64 rounding before the cast."""
        offset = positions - centre  # int64: exact at any position
        exponent = offset.to(torch.float64) * (sign / self.scale_base)
        log_scale = exponent.unsqueeze(-1) * self._log_zeta.to(positions.device)
        return full_width(log_scale.exp(), self.interleaved).to(dtype)

    def _rotate_scaled(self, x: Tensor, positions: Tensor, centre: Tensor, sign: float, seq_len: int | None) -> Tensor:
        dtype = torch.promote_types(x.dtype, torch.float32)
        # the query / key split matters for a length-dependent attention factor only (dynamic_yarn, frozen)
        role = {"role": "query" if sign > 0 else "key"} if self._query_carries_scale else {}
        cos, sin = self.cos_sin(positions, dtype, seq_len, **role)
        scale = self.xpos_scale(positions, centre, sign, dtype)
        return rotate_heads(x, cos * scale, sin * scale, interleaved=self.interleaved)

    def rotate(self, q, k, q_positions, k_positions):
        if q.shape[-1] != self.head_dim or k.shape[-1] != self.head_dim:
            raise InvalidArgument(f"q and k must have head_dim={self.head_dim}, got {q.shape[-1]} and {k.shape[-1]}")
        centre = self._centre(q_positions, k_positions)
        # zeta < 1: a query grows when it is before the centre, a key when it is after it.
        self._check_range(centre - q_positions, q.dtype, "q_positions", centre)
        self._check_range(k_positions - centre, k.dtype, "k_positions", centre)
        seq_len = self._seq_len(q_positions, k_positions)
        return (
            self._rotate_scaled(q, q_positions, centre, 1.0, seq_len),
            self._rotate_scaled(k, k_positions, centre, -1.0, seq_len),
        )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, scale_base={self.scale_base}, gamma={self.gamma}, center={self.center!r}"
