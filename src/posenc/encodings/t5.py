"""T5's relative position buckets (Raffel et al. 2020, section 2.1; the reference is
``_relative_position_bucket`` of Hugging Face's modeling_t5): a learned scalar per head and
bucket of key - query. Conventions: :mod:`posenc.encodings.score_bias`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from posenc._validation import check_bool, check_positive_int
from posenc.encodings.base import bias_kernel_attention
from posenc.encodings.score_bias import ScoreBias, _wide
from posenc.errors import InvalidArgument, InvalidType
from posenc.kernels.fused_bias import FusedBias


def t5_relative_position_bucket(
    relative_position: Tensor, *, bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128
) -> Tensor:
    """T5's bucket of each relative position (Raffel et al., JMLR 2020, section 2.1; the
    ``_relative_position_bucket`` of the T5 and Hugging Face code).

    ``relative_position = key - query``. Bidirectional: half the buckets for keys after the
    query (rel > 0), the sign dropped. Causal: only n = max(-rel, 0) (keys before or at the
    query). Distances below num_buckets/2 (of the half, when bidirectional) get a bucket
    each; larger ones share logarithmically spaced buckets up to ``max_distance``, past
    which all fall in the last bucket. The logarithm runs in float32, as in T5.

    Args:
        relative_position: an integer tensor of any shape.

    Returns:
        LongTensor of the same shape with values in [0, num_buckets).

    Raises:
        TypeError: relative_position not an integer tensor.
        ValueError: num_buckets < 2 (bidirectional: < 4), or max_distance not larger than
            the exact range.
    """
    if not isinstance(relative_position, Tensor) or relative_position.dtype.is_floating_point \
            or relative_position.dtype.is_complex or relative_position.dtype == torch.bool:
        got = relative_position.dtype if isinstance(relative_position, Tensor) else type(relative_position).__name__
        raise InvalidType(f"relative_position must be an integer torch.Tensor (key - query), got {got}")
    check_positive_int(num_buckets, "num_buckets")
    check_positive_int(max_distance, "max_distance")
    buckets = torch.zeros_like(relative_position, dtype=torch.long)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).long() * num_buckets
        n = relative_position.abs()
    else:
        n = (-relative_position).clamp(min=0)
    max_exact = num_buckets // 2
    if max_exact < 1 or max_distance <= max_exact:
        raise InvalidArgument(
            f"num_buckets={num_buckets * (2 if bidirectional else 1)} and max_distance={max_distance} "
            "leave no logarithmic range: need num_buckets >= 2 (4 if bidirectional) and max_distance > num_buckets/2"
        )
    n = n.long()
    is_small = n < max_exact
    # n is clamped below at max_exact only to keep log() finite where is_small discards it.
    large = max_exact + (
        torch.log(n.clamp(min=max_exact).float() / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).long()
    large = large.clamp(max=num_buckets - 1)
    return buckets + torch.where(is_small, n, large)


class T5RelativeBias(ScoreBias):
    """T5 bucketed relative position bias (Raffel et al., JMLR 2020, section 2.1).

    b(h, i, j) = table[bucket(j - i), h], a learned scalar per bucket and head; T5 shares one
    table across layers (so does the posenc model: one encoding instance per model).

    Args:
        num_heads: H.
        num_buckets: 32 in T5.
        max_distance: 128 in T5; larger distances share the last bucket.
        bidirectional: encoder-style buckets for both signs; False (a causal decoder) folds
            future keys into bucket 0.

    Hook: ``score_bias``. Parameters: ``relative_attention_bias``, an embedding (num_buckets, H).
    """

    name = "t5"
    model_sizes = ("num_heads",)
    translation_invariant = True

    def __init__(
        self, num_heads: int, *, num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = True
    ) -> None:
        super().__init__()
        check_positive_int(num_heads, "num_heads")
        self.num_heads, self.num_buckets, self.max_distance = num_heads, num_buckets, max_distance
        self.bidirectional = check_bool(bidirectional, "bidirectional")
        t5_relative_position_bucket(torch.zeros(1, dtype=torch.long), bidirectional=self.bidirectional,
                                    num_buckets=num_buckets, max_distance=max_distance)  # validates now
        self.relative_attention_bias = nn.Embedding(num_buckets, num_heads)
        nn.init.normal_(self.relative_attention_bias.weight, std=0.02)

    @classmethod
    def model_defaults(cls, sizes):
        """A causal model's buckets are one-sided (``bidirectional = not causal``), as T5's decoder."""
        return {"bidirectional": not sizes["causal"]}

    def bias(self, q_positions, k_positions, head):
        bucket = self._bucket(k_positions - q_positions)
        weight = self.relative_attention_bias.weight
        return weight[bucket, head].to(_wide(weight))

    def fused_bias(self, causal: bool = True, gate_state: object = None) -> FusedBias:
        """``buckets``: the table and the bucket of every k_pos - q_pos in [-R, R], R =
        ``max_distance`` (the buckets are constant beyond it, so clamping the distance is exact),
        from :func:`t5_relative_position_bucket` itself."""
        weight = self.relative_attention_bias.weight
        radius = self.max_distance
        bucket_map = self._bucket(torch.arange(-radius, radius + 1, device=weight.device))
        return FusedBias("buckets", {"weight": weight, "bucket_map": bucket_map}, radius=radius)

    #: The fused CPU kernel's whole attention with this bias, with autograd (float32, consecutive
    #: positions, the kernel built (at the first call by default); None elsewhere).
    fused_attention = bias_kernel_attention

    def _bucket(self, relative_position: Tensor) -> Tensor:
        return t5_relative_position_bucket(
            relative_position,
            bidirectional=self.bidirectional,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
        )

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, num_buckets={self.num_buckets}, "
            f"max_distance={self.max_distance}, bidirectional={self.bidirectional}"
        )
