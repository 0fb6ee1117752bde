"""The encoding protocol: the four hooks through which position enters attention.

Every positional encoding in posenc is a ``torch.nn.Module`` subclass of
:class:`PositionalEncoding` and overrides one or more of four hooks (DESIGN.md):

========== ============================================== ===============================
hook       contract                                       used by
========== ============================================== ===============================
embed      x (B, T, d_model), positions -> x'             sinusoidal, learned
rotate     q (B, H, Tq, D), k (B, H, Tk, D) -> q', k'     rope, xpos
score_bias b(h, i, j) added to the logits, fp32           alibi, t5, kerple, fire
content    query-dependent terms on scores and values     shaw, transformer_xl
========== ============================================== ===============================

The class attribute :attr:`PositionalEncoding.hooks` names the hooks an encoding uses, so
the attention and the model consume any encoding without knowing its name.

A score bias is stated as math only: :meth:`PositionalEncoding.bias`, an elementwise function
of (query position, key position, head), and :attr:`PositionalEncoding.translation_invariant`.
How it is evaluated (materialized, in tiles, as strided views, inside FlexAttention) is the
attention layer's decision (``posenc.attention.tiling``); :meth:`score_bias` and
:meth:`score_mod` are the two forms a user calls directly.

Positions are always explicit integer tensors, shape (T,) shared by the batch or (B, T) per
row: query positions and key positions are separate, which gives KV-cache offsets, left
padding and packed sequences to every encoding without a special case.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
from torch import Tensor, nn

#: FlexAttention's form of a score bias: ``score_mod(score, b, h, q_idx, kv_idx) -> score``.
ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


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
    #: the probabilities can still serve.
    content_on_values: ClassVar[bool] = True
    #: For a ``score_bias`` encoding: True when b(h, i, j) depends on the distance j - i only
    #: (ALiBi, T5, Kerple; not FIRE, whose normalizer reads the absolute query position).
    #: A statement about the math that the attention layer may rely on: it then evaluates
    #: :meth:`bias` once per distinct distance.
    translation_invariant: ClassVar[bool] = False

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
        num_layers: int = 1,
        **kwargs,
    ) -> PositionalEncoding:
        """Build the encoding for a transformer of the given size.

        The model calls this for whatever encoding it is given, so each subclass picks the
        sizes it needs (``head_dim`` for RoPE, ``num_heads`` for ALiBi, ``num_layers`` for a
        per-layer schedule, ...); ``kwargs`` are the user's own options and pass through to
        the constructor.
        """
        return cls(**kwargs)

    def for_layer(self, layer: int) -> PositionalEncoding:
        """The encoding that attention layer ``layer`` (0-based) uses; default: ``self``, one
        encoding for every layer.

        The one hook of a layer schedule (iRoPE: RoPE layers and NoPE layers; an encoding
        with per-layer parameters such as FoX's forget gates): the model asks each layer's
        encoding here and calls that one's hooks, never branching on names. The ``embed``
        hook is the top-level encoding's (it acts once, before the first layer); so are
        :attr:`max_positions` and :attr:`call_invariant`, which a schedule must state for
        all its layers. Sub-encodings returned here should be submodules of ``self`` so
        that their parameters are the model's.
        """
        return self

    # -- hooks -----------------------------------------------------------------------------
    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        """x (B, T, d_model), positions (T,) or (B, T) -> x with position added."""
        return x

    def rotate(
        self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor
    ) -> tuple[Tensor, Tensor]:
        """q (B, H, Tq, D), k (B, H, Tk, D) -> (q', k'), same shapes and dtypes."""
        return q, k

    def bias(self, q_positions: Tensor, k_positions: Tensor, head: Tensor) -> Tensor | None:
        """The score bias b(h, i, j) as math: elementwise on broadcastable int64 tensors of query
        positions, key positions and head indices -> tensor of their broadcast shape, float32
        (float64 when the encoding's parameters are float64: ``encoding.double()``).

        The one definition of an encoding's bias: every backend derives its form from it (the
        attention layer calls it on position grids, on distinct distances, or per score inside
        FlexAttention, where the arguments are 0-d). It must return a new tensor (never a view
        of a stored one), and must not modify parameters: use :meth:`prepare_bias` for that.

        Returns None for an encoding without a score bias.

        Raises:
            NotImplementedError: the encoding declares the ``score_bias`` hook but no ``bias``.
        """
        if "score_bias" in self.hooks:
            raise NotImplementedError(f"{type(self).__name__} has the score_bias hook but defines no bias()")
        return None

    def prepare_bias(self) -> None:
        """Called before :meth:`bias` is used: once per attention call, and by
        :meth:`score_bias` and :meth:`score_mod`. An encoding whose parameters are projected
        onto an allowed range before every use (Kerple, as its official code does) does it
        here. Default: nothing."""

    def score_bias(self, q_positions: Tensor, k_positions: Tensor) -> Tensor | None:
        """The bias materialized: (Tq,), (Tk,) -> (H, Tq, Tk); with a (B, T) side ->
        (B, H, Tq, Tk); float32, :meth:`bias` on every (head, query, key).

        Added after the 1/sqrt(D) scaling of q.k (ALiBi and T5 are not scaled). Returns a new
        tensor that nothing else references (the caller may keep or modify it), or None for
        an encoding without a score bias.
        """
        return None

    def score_mod(self, q_positions: Tensor | None = None, k_positions: Tensor | None = None) -> ScoreMod | None:
        """The bias as a FlexAttention ``score_mod(score, b, h, q_idx, kv_idx) -> score``, or None
        for an encoding without a score bias.

        Without positions, token indices are the positions (q_idx, kv_idx). With positions of
        shape (T,) or (B, T) they are looked up, e.g. for a KV-cache offset or packed rows.
        Learned biases receive gradients through it.
        """
        if "score_bias" not in self.hooks:
            return None
        self.prepare_bias()

        def lookup(positions: Tensor | None, b: Tensor, idx: Tensor) -> Tensor:
            if positions is None:
                return idx.long()
            return (positions[b, idx] if positions.dim() == 2 else positions[idx]).long()

        def score_mod(score, b, h, q_idx, kv_idx):
            # FlexAttention passes int32 indices; bias() gets int64 like every other caller.
            return score + self.bias(lookup(q_positions, b, q_idx), lookup(k_positions, b, kv_idx), h.long())

        return score_mod

    def linear_bias_slopes(self, causal: bool = True) -> Tensor | None:
        """The slopes m (H,) float32 when the score bias is b(h, i, j) = -m_h * |i - j| on every
        pair a query can see (causal: keys at or before the query; else all keys), i.e. ALiBi's
        form; None for any other bias (default). A statement about the math that lets a kernel
        with a native linear bias serve the encoding (FlashAttention-2's ``alibi_slopes``)."""
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
