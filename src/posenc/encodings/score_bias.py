"""Score-bias encodings: a per-head scalar b(h, i, j) added to the attention logits.

Each encoding writes its math once, as :meth:`ScoreBias.bias`, an elementwise function of
(query position, key position, head) on broadcastable tensors, and says whether it depends on
the distance only (:attr:`~posenc.PositionalEncoding.translation_invariant`). Every other form
is derived from that one function: :meth:`ScoreBias.score_bias` materializes it,
:meth:`~posenc.PositionalEncoding.score_mod` is the FlexAttention form, and the attention
layer evaluates it in tiles of its own choosing.

Conventions: relative position = key - query (T5); the bias is added *after* the 1/sqrt(D)
scaling of q.k and is not itself scaled (ALiBi, Press et al. 2022, section 3).
"""

from __future__ import annotations


import torch
from torch import Tensor

from posenc._validation import broadcast_shape
from posenc.encodings.base import Hook, PositionalEncoding


def _wide(parameter: Tensor) -> torch.dtype:
    """The dtype a bias is computed in: float32, or float64 for an encoding converted to
    float64 (``.double()``), so that float64 inputs get float64 arithmetic throughout."""
    return torch.promote_types(parameter.dtype, torch.float32)


class ScoreBias(PositionalEncoding):
    """Base for encodings that only add b(h, i, j) to the logits. Subclasses define
    :attr:`num_heads`, :meth:`bias` and, when true, ``translation_invariant = True``."""

    hooks = frozenset({Hook.SCORE_BIAS})
    num_heads: int

    def score_bias(self, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """The bias: (Tq,), (Tk,) -> (H, Tq, Tk); (B, Tq), (B, Tk) -> (B, H, Tq, Tk), float32
        (float64 for an encoding converted with ``.double()``), :meth:`bias` on every (head,
        query, key): a new tensor nothing else references."""
        self.prepare_bias()
        q = q_positions.unsqueeze(-1).unsqueeze(-3)  # (..., 1, Tq, 1)
        k = k_positions.unsqueeze(-2).unsqueeze(-3)  # (..., 1, 1, Tk)
        head = torch.arange(self.num_heads, device=q_positions.device).view(-1, 1, 1)
        bias = self.bias(q, k, head)
        full = broadcast_shape(q.shape, k.shape, head.shape)
        return bias if bias.shape == full else bias.expand(full).contiguous()
