"""ComRoPE (Yu et al. 2025, "ComRoPE: Scalable and Robust Rotary Position Embedding
Parameterized by Trainable Commuting Angle Matrices", arXiv 2506.03737): LieRE's learned
block rotations with the generators of the axes constrained to commute, so that
R(p)^T R(p') = R(p' - p) for positions of any number of axes and the score is exactly
relative in every axis (LieRE's is not once there are two).
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc._validation import check_number
from posenc.encodings.rope.liere import LieRE
from posenc.errors import InvalidArgument

#: ``ComRoPE(variant=...)``: the paper's two commuting families.
COMROPE_VARIANTS = ("ld", "ap")


class ComRoPE(LieRE):
    """ComRoPE (arXiv 2506.03737; the definitions of its README), as its reference code computes it (Longin-Yu/ComRoPE
    ``model.py`` @d6e0fbe, ``ComRoPELDAttention`` and ``ComRoPEAPAttention``); the rotation, its
    layout and the positions are :class:`~posenc.encodings.LieRE`'s (blocks of b x b, R acting
    on column vectors, queries and keys alike), only the generators A_a differ. With trainable
    F (H_gen, N, b, b) and S = F - F^T:

    - ``"ld"`` (linearly dependent): A_a = theta_{a,n} S_n, a trainable scale per axis and
      block (theta (A, N), init N(0, 1)): multiples of one matrix commute;
    - ``"ap"`` (axis-partitioned): A_a = S_n on the blocks n = a (mod A), 0 elsewhere: each
      block turns with one axis only.

    With one axis both are LieRE with another parametrization: exp(p theta S) and exp(p S).
    F starts N(0, ``init_std``^2) (the reference's ``init_std``, default 1.0). The reference
    rotates every dimension (head_dim a multiple of b); here as in LieRE the last
    head_dim - N b pass through.

    Args:
        head_dim, num_key_value_heads, num_axes, position_scale, learnable: as
            :class:`~posenc.encodings.LieRE`.
        block_size: b (default min(8, head_dim); the reference's config default is 2, where
            ComRoPE is RoPE with learned angles).
        variant: ``"ld"`` (default) or ``"ap"``.
        init_std: the standard deviation of F's start.

    Raises:
        ValueError: as LieRE; variant not one of ``COMROPE_VARIANTS``; init_std not positive
            and finite.
    """

    name = "comrope"

    def __init__(self, head_dim: int, num_key_value_heads: int = 1, *, block_size: int | None = None,
                 num_axes: int = 1, variant: str = "ld", position_scale: float = 1.0, init_std: float = 1.0,
                 learnable: bool = True) -> None:
        super(LieRE, self).__init__()
        if variant not in COMROPE_VARIANTS:
            raise InvalidArgument(f"variant must be one of {COMROPE_VARIANTS}, got {variant!r}")
        if block_size is None and isinstance(head_dim, int):
            block_size = min(8, head_dim)
        self._init_layout(head_dim, num_key_value_heads, block_size, num_axes, position_scale, learnable)
        std = check_number(init_std, "init_std", gt=0.0)
        self.variant = variant
        shape = (num_key_value_heads, self.num_blocks, self.block_size, self.block_size)
        self._store("angle_params", torch.randn(shape) * std, learnable)
        if variant == "ld":
            self._store("axis_scales", torch.randn(num_axes, self.num_blocks), learnable)
        else:
            mask = torch.zeros(num_axes, self.num_blocks, dtype=torch.float64)
            for axis in range(num_axes):
                mask[axis, axis::num_axes] = 1.0
            self._axis_mask = mask  # float64, off the module's .to()

    def generators(self) -> Tensor:
        """A_a, float64 (A, H_gen, N, b, b), as the class docstring says."""
        params = self.angle_params.to(torch.float64)
        skew = params - params.transpose(-1, -2)
        if self.variant == "ld":
            scales = self.axis_scales.to(torch.float64)
        else:
            scales = self._axis_mask.to(skew.device)
        return skew.unsqueeze(0) * scales[:, None, :, None, None]

    def extra_repr(self) -> str:
        return f"variant={self.variant!r}, " + super().extra_repr()
