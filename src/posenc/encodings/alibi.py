"""ALiBi (Press, Smith and Lewis, ICLR 2022, "Train Short, Test Long"): a per-head linear
penalty on the query-key distance. Conventions: :mod:`posenc.encodings.score_bias`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from posenc._validation import check_bool, check_number, check_positive_int
from posenc.encodings.base import bias_kernel_attention
from posenc.encodings.score_bias import ScoreBias, _wide
from posenc.errors import InvalidArgument
from posenc.kernels.fused_bias import FusedBias


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


def _bloom_slopes(num_heads: int) -> Tensor:
    """BLOOM's ``_get_alibi_slopes`` (transformers' modeling_bloom; Falcon's
    ``build_alibi_tensor`` computes the same): float32 bases 2^(-8/n0) and 2^(-8/(2 n0))
    raised to integer powers in float32."""
    n0 = 2 ** math.floor(math.log2(num_heads))
    base = torch.full((), 2 ** (-(2 ** -(math.log2(n0) - 3))), dtype=torch.float32)
    slopes = torch.pow(base, torch.arange(1, 1 + n0, dtype=torch.int32))
    if n0 != num_heads:
        extra = torch.full((), 2 ** (-(2 ** -(math.log2(2 * n0) - 3))), dtype=torch.float32)
        powers = torch.arange(1, 1 + 2 * min(n0, num_heads - n0), 2, dtype=torch.int32)
        slopes = torch.cat([slopes, torch.pow(extra, powers)])
    return slopes


def _mpt_slopes(num_heads: int) -> Tensor:
    """MPT's ``build_mpt_alibi_tensor`` (transformers' modeling_mpt, alibi_bias_max 8): with
    n2 = 2^ceil(log2 n), 1 / 2^(8k/n2) in float32 for k = 1..n2, then for n < n2 the even k
    followed by the odd k, cut to n (Press's order)."""
    n2 = 2 ** math.ceil(math.log2(num_heads))
    slopes = 1.0 / torch.pow(2, torch.arange(1, n2 + 1, dtype=torch.int64).float() * (8 / n2))
    if n2 != num_heads:
        slopes = torch.cat([slopes[1::2], slopes[::2]])[:num_heads]
    return slopes


#: How each slope formula computes its float32 slopes (:class:`ALiBi`'s ``slopes``).
SLOPE_FORMULAS = {"press": alibi_slopes, "bloom": _bloom_slopes, "mpt": _mpt_slopes}
#: The dtypes :class:`ALiBi` can round its slope-position products in (``slope_dtype``).
SLOPE_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


class ALiBi(ScoreBias):
    """Attention with Linear Biases (Press et al., ICLR 2022, section 3).

    b(h, i, j) = -m_h * (i - j) for the causal form (valid under a causal mask, where
    j <= i), or -m_h * |i - j| for the symmetric form used by bidirectional encoders;
    i, j are absolute query and key positions (flash-attn's bottom-right alignment follows
    from explicit positions).

    Two options reproduce a model's own arithmetic (both off by default):

    - ``slope_dtype="bfloat16"``: transformers' Falcon (``build_alibi_tensor`` of
      modeling_falcon) rounds the float32 slopes to bfloat16 and multiplies them by the key
      positions in bfloat16: its bias is R(j) = bf16(bf16(m) * j), whose rounding depends on
      j itself, not on i - j. With this option the bias is R(j) - R(i) (the softmax ignores
      the per-query constant R(i)), computed with the same torch operations, so it matches
      Falcon's to the bit; the encoding is then not translation invariant.
    - ``scale``: multiplies the bias. Falcon adds its ALiBi before the 1/sqrt(head_dim) of
      q.k (posenc adds biases after it), so its plan has ``scale = head_dim ** -0.5``.

    Args:
        num_heads: H.
        bidirectional: the symmetric form -m|i - j|; default False (causal form).
        slopes: the slope formula: ``"press"`` (default; :func:`alibi_slopes`: 2^(-8h/n)
            rounded once to float32), ``"bloom"`` (BLOOM's and Falcon's float32 powers of a
            float32 base, which differ from press by up to a few float32 ulps from 11 heads on)
            or ``"mpt"`` (MPT's with alibi_bias_max 8: the same values as press up to 64
            heads, a float32 ulp apart above). Same mathematical slopes, Press's
            non-power-of-two rule included; only the float32 rounding differs.
        slope_dtype: None (default; the bias in float32, float64 after ``.double()``) or
            ``"bfloat16"`` / ``"float16"``: slopes and slope-position products rounded to it,
            as above.
        scale: a float multiplying the bias (default 1.0).

    Hook: ``score_bias``. No parameters.

    Raises:
        InvalidArgument: an unknown slope formula or slope dtype (the message lists the
            known ones), a scale that is not a finite number > 0.
    """

    name = "alibi"
    model_sizes = ("num_heads",)
    translation_invariant = True

    def __init__(self, num_heads: int, *, bidirectional: bool = False, slopes: str = "press",
                 slope_dtype: str | None = None, scale: float = 1.0) -> None:
        super().__init__()
        check_positive_int(num_heads, "num_heads")
        self.num_heads = num_heads
        self.bidirectional = check_bool(bidirectional, "bidirectional")
        if slopes not in SLOPE_FORMULAS:
            raise InvalidArgument(f"slopes must be one of {sorted(SLOPE_FORMULAS)}, got {slopes!r}")
        if slope_dtype is not None and slope_dtype not in SLOPE_DTYPES:
            raise InvalidArgument(f"slope_dtype must be None or one of {sorted(SLOPE_DTYPES)}, got {slope_dtype!r}")
        self.slope_formula, self.slope_dtype = slopes, slope_dtype
        self.scale = check_number(scale, "scale", gt=0)
        # rounding the products of absolute positions breaks the dependence on i - j alone
        self.translation_invariant = slope_dtype is None
        self.register_buffer("slopes", SLOPE_FORMULAS[slopes](num_heads), persistent=False)

    @classmethod
    def model_defaults(cls, sizes):
        """A causal model's ALiBi is one-sided (``bidirectional = not causal``)."""
        return {"bidirectional": not sizes["causal"]}

    def bias(self, q_positions, k_positions, head):
        wide = _wide(self.slopes)
        if self.slope_dtype is None:
            distance = (q_positions - k_positions).to(wide)
            if self.bidirectional:
                distance = distance.abs()
            bias = -self.slopes[head] * distance
        else:
            slope = self.slopes[head].to(SLOPE_DTYPES[self.slope_dtype])
            # as Falcon: a bfloat16 slope times an integer position tensor, a bfloat16 product
            bias = (slope * k_positions).to(wide) - (slope * q_positions).to(wide)
            if self.bidirectional:
                bias = -bias.abs()
        return bias if self.scale == 1.0 else bias * self.scale

    def linear_bias_slopes(self, causal: bool = True) -> Tensor | None:
        """The slopes (times ``scale``): -m (i - j) is -m |i - j| for the keys a causal query
        sees; without the causal mask only the symmetric form is. None with ``slope_dtype``
        (the rounded products are no linear function of the distance)."""
        if self.slope_dtype is not None or not (causal or self.bidirectional):
            return None
        return self.slopes if self.scale == 1.0 else self.slopes * self.scale

    def fused_bias(self, causal: bool = True, gate_state: object = None) -> FusedBias | None:
        """``linear``: -m d (``bidirectional``: -m |d|) with m the slopes times ``scale``; None
        with ``slope_dtype`` (rounded products of absolute positions)."""
        if self.slope_dtype is not None:
            return None
        slopes = self.slopes if self.scale == 1.0 else self.slopes * self.scale
        return FusedBias("linear", {"slopes": slopes}, symmetric=self.bidirectional)

    #: The fused CPU kernel's whole attention with this bias, with autograd (float32, consecutive
    #: positions, the kernel built (at the first call by default); None elsewhere).
    fused_attention = bias_kernel_attention

    def extra_repr(self) -> str:
        text = f"num_heads={self.num_heads}, bidirectional={self.bidirectional}"
        if self.slope_formula != "press":
            text += f", slopes={self.slope_formula!r}"
        if self.slope_dtype is not None:
            text += f", slope_dtype={self.slope_dtype!r}"
        if self.scale != 1.0:
            text += f", scale={self.scale:g}"
        return text
