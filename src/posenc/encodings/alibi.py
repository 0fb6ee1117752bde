"""ALiBi (Press, Smith and Lewis, ICLR 2022, "Train Short, Test Long"): a per-head linear
penalty on the query-key distance. Conventions: :mod:`posenc.encodings.score_bias`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from posenc._validation import check_bool, check_positive_int
from posenc.encodings.score_bias import ScoreBias, _wide


def alibi_slopes(num_heads: int) -> Tensor:
    """ALiBi head slopes (Press et al., ICLR 2022, section 3), float32 (num_heads,).

    For n a power of two, m_h = 2^(-8h/n), h = 1..n (a geometric sequence starting at
    2^(-8/n)). Otherwise, with n0 = 2^floor(log2 n): the n0 slopes of the n0-head set,
    followed by every other slope of the 2*n0-head set (the odd h, 2^(-8h/(2 n0))) until
    there are n.

    Raises:
        ValueError: ``num_heads`` is not an integer >= 1.
    """
    check_positive_int(num_heads, "num_heads")
    n0 = 2 ** int(math.floor(math.log2(num_heads)))
    exponents = [-8.0 * h / n0 for h in range(1, n0 + 1)]
    exponents += [-8.0 * h / (2 * n0) for h in range(1, 2 * (num_heads - n0), 2)]
    return torch.tensor([2.0**e for e in exponents], dtype=torch.float64).to(torch.float32)


class ALiBi(ScoreBias):
    """Attention with Linear Biases (Press et al., ICLR 2022, section 3).

    b(h, i, j) = -m_h * (i - j) for the causal form (valid under a causal mask, where
    j <= i), or -m_h * |i - j| for the symmetric form used by bidirectional encoders;
    i, j are absolute query and key positions (flash-attn's bottom-right alignment follows
    from explicit positions).

    Args:
        num_heads: H; slopes from :func:`alibi_slopes`.
        bidirectional: the symmetric form -m|i - j|; default False (causal form).

    Hook: ``score_bias``. No parameters.
    """

    name = "alibi"
    model_sizes = ("num_heads",)
    translation_invariant = True

    def __init__(self, num_heads: int, *, bidirectional: bool = False) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.bidirectional = check_bool(bidirectional, "bidirectional")
        self.register_buffer("slopes", alibi_slopes(num_heads), persistent=False)

    @classmethod
    def model_defaults(cls, sizes):
        """A causal model's ALiBi is one-sided (``bidirectional = not causal``)."""
        return {"bidirectional": not sizes["causal"]}

    def bias(self, q_positions, k_positions, head):
        distance = (q_positions - k_positions).to(_wide(self.slopes))
        if self.bidirectional:
            distance = distance.abs()
        return -self.slopes[head] * distance

    def linear_bias_slopes(self, causal: bool = True) -> Tensor | None:
        """The slopes: -m (i - j) is -m |i - j| for the keys a causal query sees; without the
        causal mask only the symmetric form is."""
        return self.slopes if causal or self.bidirectional else None

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, bidirectional={self.bidirectional}"
