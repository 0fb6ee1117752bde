"""Contextual position encoding: CoPE (Golovneva, Wang, Weston and Sukhbaatar 2024,
"Contextual Position Encoding: Learning to Count What's Important", arXiv 2405.18719).

Positions are counted by the model instead of by the tokenizer: query i gates every key k with
g_ik = sigmoid(q_i . k_k / sqrt(D)), and key j sits at the fractional position
p_ij = sum_{k = j .. i} g_ik (the number of "counted" tokens between them, the query's own
included). Its logit gains q_i . e[p_ij], e interpolated between the learned vectors of
floor(p_ij) and ceil(p_ij).

It uses the ``content`` hook (scores only). Shapes: B batch, H heads, Tq queries, Tk keys,
D head_dim. CoPE reads no positions: what it counts is the keys between j and i in the order
they are given, those the query may attend (the ``mask`` the attention passes), so a KV cache
(keys in token order, the causal mask), packed rows (a document mask hides the other
documents) and left padding (the pads precede every real key) give the same p_ij as each
sequence alone.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from posenc.encodings.base import Hook, PositionalEncoding, layer_of_copies
from posenc._validation import check_positive_int
from posenc.errors import InvalidArgument


class CoPE(PositionalEncoding):
    """CoPE (Golovneva et al. 2024, section 3, eqs. (3)-(5); reference code: the paper's
    listing and facebookresearch's ``ContextPosSelfAttn``)::

        g_ij = sigmoid(q_i . k_j / sqrt(D))                     (gates; 0 for masked keys)
        p_ij = sum_{k >= j, k visible to i} g_ik                 (= sum_{k=j..i} g_ik, causal)
        p_ij <- min(p_ij, npos_max - 1)
        z_ij = q_i . e[ceil p] * (p - floor p) + q_i . e[floor p] * (1 - (p - floor p))
        a_ij = softmax_j((q_i . k_j + z_ij) / sqrt(D))

    Conventions, where the listing and the reference code differ: the gate's logit is scaled by
    1/sqrt(D) before the sigmoid (both do); z_ij is added to q.k *before* the 1/sqrt(D) scale,
    as the reference code's default (the listing adds it after; the reference's ``--cope-nodiv``),
    which is exactly the ``content`` hook's convention, so :meth:`content_scores` returns z_ij
    unscaled. The gate uses 1/sqrt(D) whatever the attention's ``scale=``. Keys the query may
    not attend get gate 0 (the reference multiplies the gates by the mask): without a mask and
    without the causal one (bidirectional use) p_ij counts every key from j to the end.

    One table e (npos_max, D) per layer, shared by the heads of that layer (the reference keeps
    one per attention layer; heads are folded into its batch). Initialised to zeros as the
    reference, so a fresh model starts as NoPE. Only the first min(npos_max, Tk + 1) rows can be
    reached in a call (p_ij <= Tk), so only those are multiplied by q.

    Args:
        head_dim: D.
        num_layers: the number of attention layers, each with its own table (:meth:`for_layer`);
            1 (default): one table, which every layer of a model then shares (the reference's
            ``--cope-shared``).
        npos_max: the number of position vectors (the listing's ``npos_max``; positions are
            clamped to npos_max - 1). :meth:`for_model` defaults it to ``max_positions + 1``,
            the reference code's default (block size + 1: position 0 is possible).

    Hook: ``content`` (scores only, ``content_on_values = False``).
    Cost per layer: the gates' q.k^T again, a reverse cumulative sum and two gathers over
    (B, H, Tq, Tk), plus a (B, H, Tq, min(npos_max, Tk + 1)) product: about twice the attention
    scores' work and several (B, H, Tq, Tk) temporaries (no tiled form: the counts run over
    every key of a row).

    Raises:
        ValueError: head_dim, num_layers or npos_max not an integer >= 1 (construction); q or k
            whose last dimension is not head_dim, a layer outside 0..num_layers-1.
    """

    name = "cope"
    hooks = frozenset({Hook.CONTENT})
    model_sizes = ("head_dim", "num_layers")
    content_on_values = False

    def __init__(self, head_dim: int, num_layers: int = 1, *, npos_max: int) -> None:
        super().__init__()
        check_positive_int(head_dim, "head_dim")
        check_positive_int(num_layers, "num_layers")
        check_positive_int(npos_max, "npos_max")
        self.head_dim, self.num_layers, self.npos_max = head_dim, num_layers, npos_max
        self.pos_emb = nn.Parameter(torch.zeros(npos_max, head_dim))  # row p is e[p]
        self.deeper_layers = nn.ModuleList(CoPE(head_dim, npos_max=npos_max) for _ in range(num_layers - 1))

    @classmethod
    def model_defaults(cls, sizes):
        """``npos_max = max_positions + 1``, the reference code's default (block size + 1)."""
        return {"npos_max": sizes["max_positions"] + 1}

    def for_layer(self, layer: int) -> PositionalEncoding:
        """Layer 0 is this instance; layer l > 0 the l-th of ``deeper_layers``. With
        num_layers = 1 every layer shares this table."""
        return layer_of_copies(self, self.deeper_layers, layer)

    def _check_dim(self, x: Tensor, argname: str) -> None:
        if x.shape[-1] != self.head_dim:
            raise InvalidArgument(f"{argname} must have head_dim={self.head_dim}, got {x.shape[-1]}")

    def _wide(self, x: Tensor) -> torch.dtype:
        return torch.promote_types(torch.promote_types(x.dtype, self.pos_emb.dtype), torch.float32)

    def contextual_positions(self, q: Tensor, k: Tensor, mask: Tensor | None = None) -> Tensor:
        """p_ij = sum_{k >= j, k visible} sigmoid(q_i . k_k / sqrt(D)), unclamped: q (B, H, Tq, D),
        k (B, H, Tk, D), ``mask`` boolean broadcastable to (B, H, Tq, Tk) (True = visible) or
        None -> (B, H, Tq, Tk), float32 (float64 for float64 q or parameters)."""
        self._check_dim(q, "q")
        self._check_dim(k, "k")
        wide = self._wide(q)
        gates = torch.sigmoid((q.to(wide) @ k.to(wide).transpose(-2, -1)) / math.sqrt(self.head_dim))
        if mask is not None:
            gates = gates.masked_fill(~mask, 0.0)
        # the reverse cumulative sum: every key j gets the gates of the keys j, j+1, ... (Tk - 1)
        return gates.flip(-1).cumsum(-1).flip(-1)

    def content_scores(self, q, k, q_positions, k_positions, *, mask=None, gate_state=None):
        """z_ij: (B, H, Tq, Tk) before the 1/sqrt(D) scale, float32 (float64 when q or the
        parameters are float64). Positions are not read (see the module docstring)."""
        positions = self.contextual_positions(q, k, mask)
        # p_ij <= Tk (a sum of at most Tk gates <= 1, exact in float below 2^24): rows past
        # Tk + 1 are never gathered, so only those are multiplied by q.
        rows = torch.sym_min(self.npos_max, k.shape[-2] + 1)
        positions = positions.clamp(max=rows - 1)
        floor = positions.floor()
        weight = positions - floor  # differentiable, as in the reference; floor and ceil are not
        wide = positions.dtype
        per_position = q.to(wide) @ self.pos_emb[:rows].to(wide).t()  # (B, H, Tq, rows): q . e[p]
        upper = per_position.gather(-1, positions.ceil().long())
        lower = per_position.gather(-1, floor.long())
        return upper * weight + lower * (1 - weight)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, num_layers={self.num_layers}, npos_max={self.npos_max}"
