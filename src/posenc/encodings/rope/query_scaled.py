"""RoPE with Llama 4's query scaling, as Ministral 3 (Mistral 3, Mistral Large 3, Devstral 2) ships
it: transformers ``models/ministral3/modeling_ministral3.py`` (``get_llama_4_attn_scale``, called in
``Ministral3Attention.forward`` after ``apply_rotary_pos_emb``), the rope dict's
``llama_4_scaling_beta``. The queries at position p, once rotated, are multiplied by

    tau(p) = 1 + beta * log(1 + floor(p / original_max_position_embeddings))

on every layer (Llama 4 puts its own temperature, log1p(floor((p + 1) / floor_scale)) *
attn_scale + 1, on its NoPE layers only: :class:`posenc.encodings.irope.AttentionTemperature`).
tau is 1 below ``original_max_position_embeddings``; the scores of a query past it are
sharpened by tau, whatever the key (Nakanishi 2025, "Scalable-Softmax Is Superior for
Attention", arXiv 2501.19399).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from posenc._validation import check_number, check_positive_int
from posenc.encodings.rope.rotary import RoPE


def llama_4_attn_scale(positions: Tensor, *, beta: float, original_max_position_embeddings: int) -> Tensor:
    """tau(p) = 1 + beta * log(1 + floor(p / original_max_position_embeddings)) at integer
    ``positions``, float64, same shape (transformers ``get_llama_4_attn_scale``). The floor is an
    integer division, exact for every int64 position; transformers divides in float32, which
    agrees below 2^24 / original_max_position_embeddings times that length (16 million positions
    for 16384)."""
    steps = torch.div(positions.to(torch.long), original_max_position_embeddings, rounding_mode="floor")
    return 1.0 + beta * torch.log1p(steps.to(torch.float64))


def scale_queries(q: Tensor, tau: Tensor) -> Tensor:
    """q (B, H, Tq, D) times tau ((Tq,) or (B, Tq), one factor per query) in float32 (float64
    for float64 q), cast back to q's dtype, as transformers scales its queries."""
    wide = torch.promote_types(q.dtype, torch.float32)
    tau = tau.to(wide)
    tau = tau.unsqueeze(-1) if tau.dim() == 1 else tau[:, None, :, None]  # (Tq, 1) or (B, 1, Tq, 1)
    return (q.to(wide) * tau).to(q.dtype)


class QueryScaledRoPE(RoPE):
    """:class:`RoPE` whose rotated queries are multiplied by :func:`llama_4_attn_scale` at their
    positions (keys as RoPE leaves them): Ministral 3's attention (module docstring).

    Args:
        head_dim: as :class:`RoPE`.
        llama_4_scaling_beta: beta, finite and >= 0 (Ministral 3: 0.1; 0 is plain RoPE).
        original_max_position_embeddings: positions per step of tau (int >= 1; Ministral 3:
            16384, the same key of its YaRN rope dict).
        rope_kwargs: the other :class:`RoPE` options (base, scaling, interleaved, ...).

    Hook: ``rotate`` (q rotated, then scaled in float32, float64 for float64 q, and cast back to
    q's dtype). The whole query is scaled, the unrotated dimensions of a partial rotary too,
    as transformers scales ``query_states``.

    Raises:
        ValueError: llama_4_scaling_beta not a finite number >= 0, original_max_position_embeddings
            not an integer >= 1; RoPE's errors.
    """

    name = "query_scaled_rope"

    def __init__(self, head_dim: int, *, llama_4_scaling_beta: float = 0.1,
                 original_max_position_embeddings: int = 16384, **rope_kwargs: Any) -> None:
        beta = check_number(llama_4_scaling_beta, "llama_4_scaling_beta", ge=0)
        check_positive_int(original_max_position_embeddings, "original_max_position_embeddings")
        super().__init__(head_dim, **rope_kwargs)
        self.llama_4_scaling_beta = beta
        self.original_max_position_embeddings = original_max_position_embeddings

    def rotate(self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`RoPE.rotate`, then q (B, H, Tq, D) times tau(q_positions) ((Tq,) or (B, Tq))."""
        q, k = super().rotate(q, k, q_positions, k_positions)
        tau = llama_4_attn_scale(q_positions, beta=self.llama_4_scaling_beta,
                                 original_max_position_embeddings=self.original_max_position_embeddings)
        return scale_queries(q, tau), k

    def to_hf_dict(self) -> dict[str, Any]:
        """:meth:`RoPE.to_hf_dict` with ``llama_4_scaling_beta`` (and
        ``original_max_position_embeddings`` where the scaling has none) in the rope dict."""
        fields = super().to_hf_dict()
        for key in ("rope_parameters", "rope_scaling"):
            params = fields.get(key)
            if isinstance(params, dict):
                fields[key] = {**params, "llama_4_scaling_beta": self.llama_4_scaling_beta}
                fields[key].setdefault("original_max_position_embeddings", self.original_max_position_embeddings)
                break
        else:  # no scaling (v4 spelling: rope_scaling None): a default rope dict to carry beta
            fields["rope_scaling"] = {"rope_type": "default", "llama_4_scaling_beta": self.llama_4_scaling_beta,
                                      "original_max_position_embeddings": self.original_max_position_embeddings}
        return fields

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, llama_4_scaling_beta={self.llama_4_scaling_beta}, "
                f"original_max_position_embeddings={self.original_max_position_embeddings}")
