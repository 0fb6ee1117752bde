"""The encoding protocol: the four hooks through which position enters attention.

Every positional encoding in posenc is a ``torch.nn.Module`` subclass of
:class:`PositionalEncoding` and overrides one or more of four hooks (DESIGN.md):

========== ============================================== ===============================
hook       contract                                       used by
========== ============================================== ===============================
embed      x (B, T, d_model), positions -> x'             sinusoidal, learned
rotate     q (B, H, Tq, D), k (B, H, Tk, D) -> q', k'     rope, xpos
score_bias -> bias broadcastable to (B, H, Tq, Tk), fp32  alibi, t5, kerple, fire
content    query-dependent terms on scores and values     shaw, transformer_xl
========== ============================================== ===============================

The class attribute :attr:`PositionalEncoding.hooks` names the hooks an encoding uses, so
the attention and the model consume any encoding without knowing its name.

Positions are always explicit integer tensors, shape (T,) shared by the batch or (B, T) per
row: query positions and key positions are separate, which gives KV-cache offsets, left
padding and packed sequences to every encoding without a special case.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn


def run_step(positions: Tensor) -> int | None:
    """+1 for a 1-D run p0, p0 + 1, ..., -1 for p0, p0 - 1, ..., else None (padding, packing,
    gaps, per-batch positions, no position). A single position counts as ascending."""
    if positions.dim() != 1 or positions.numel() == 0:
        return None
    if positions.numel() == 1:
        return 1
    step = positions.diff()
    first = int(step[0])
    return first if first in (1, -1) and bool((step == first).all()) else None


class PositionalEncoding(nn.Module):
    """Base class: every hook is the identity, so an encoding overrides only what it uses.

    Subclasses set :attr:`name` (the registry name) and :attr:`hooks`, and override the
    matching methods. :attr:`max_positions` is the number of positions an encoding can
    represent (``None``: unbounded); the evaluation reports longer lengths as not
    applicable instead of calling it.
    """

    name: ClassVar[str] = ""
    hooks: ClassVar[frozenset[str]] = frozenset()
    #: For a ``content`` encoding: whether :meth:`content_values` adds to the output (Shaw) or
    #: only :meth:`content_scores` is used (Transformer-XL), which backends without access to
    #: the probabilities (sdpa) can still serve.
    content_on_values: ClassVar[bool] = True

    @property
    def max_positions(self) -> int | None:
        return None

    @property
    def call_invariant(self) -> bool:
        """True when the hooks' terms for a (query position, key position) pair do not depend
        on the other positions of the call. A token's hidden states then never change once
        computed, so a KV cache of them is exact (:class:`posenc.model.KVCache`). False for an
        encoding that reads the whole call, e.g. dynamic NTK RoPE in "rerotate" mode (every
        token rotated with the frequencies of the call's length)."""
        return True

    @classmethod
    def for_model(
        cls,
        *,
        d_model: int,
        num_heads: int,
        head_dim: int,
        max_positions: int,
        causal: bool = True,
        **kwargs,
    ) -> PositionalEncoding:
        """Build the encoding for a transformer of the given size.

        The model calls this for whatever encoding it is given, so each subclass picks the
        sizes it needs (``head_dim`` for RoPE, ``num_heads`` for ALiBi, ...); ``kwargs`` are
        the user's own options and pass through to the constructor.
        """
        return cls(**kwargs)

    # -- hooks -----------------------------------------------------------------------------
    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        """x (B, T, d_model), positions (T,) or (B, T) -> x with position added."""
        return x

    def rotate(
        self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor
    ) -> tuple[Tensor, Tensor]:
        """q (B, H, Tq, D), k (B, H, Tk, D) -> (q', k'), same shapes and dtypes."""
        return q, k

    def score_bias(self, q_positions: Tensor, k_positions: Tensor, *, causal: bool = False) -> Tensor | None:
        """Additive logit bias b(h, i, j), float32, shape (H, Tq, Tk) or (B, H, Tq, Tk).

        Added after the 1/sqrt(D) scaling of q.k (ALiBi and T5 are not scaled). With
        ``causal=True`` the causal mask is folded in: -inf where the key position is after
        the query position (the blocked backend asks for it so when that is its mask). The
        result may be a strided view that overlaps itself; callers write only into a result
        that ``is_contiguous()``.
        """
        return None

    def content_scores(
        self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor
    ) -> Tensor | None:
        """Query-dependent extra logits (B, H, Tq, Tk), added to q.k *before* the 1/sqrt(D) scale."""
        return None

    def content_values(self, probs: Tensor, q_positions: Tensor, k_positions: Tensor) -> Tensor | None:
        """Extra attention output (B, H, Tq, D) from the attention probabilities (B, H, Tq, Tk)."""
        return None

    def extra_repr(self) -> str:
        return f"name={self.name!r}"


class NoPE(PositionalEncoding):
    """No positional encoding (Kazemnejad et al., NeurIPS 2023, "The Impact of Positional
    Encoding on Length Generalization in Transformers").

    Uses no hook. Order reaches the model only through the causal mask; a bidirectional
    encoder without positions is permutation-equivariant.
    """

    name = "nope"
    hooks = frozenset()
