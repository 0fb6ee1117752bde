"""Additive GRAPE with a path integral (Zhang et al. 2025, "Group Representational Position
Encoding", arXiv 2512.07805, ICLR 2026: the additive, unipotent family, GRAPE-A, in its
contextual "path-integral" form): a bias on the logit of query i and key j summed over the
tokens between them, each term read from the hidden state and the token's position.

Per head h and token t, with p_t = c_p(x_t) (the layer's input projected to P features),
p̂_t = rms_norm(p_t) and R(t) the rotation of every feature pair (a, a + P/2) by -t omega_a:

    e_{i,l}  = slope_h * log sigmoid(p_i . R(t_l) p̂_l / P)          (l <= i, <= 0)
    b_{i,j}  = sum_{l=j+1..i} e_{i,l}                                (b_{i,i} = 0)

added to the scaled logit q_i . k_j / sqrt(D). Each token between the key and the query
subtracts what the query "sees" of it: a FoX-like decay whose gates depend on the query too.
With p = 0 every term is -slope_h ln 2: ALiBi with slopes m_h ln 2 (the family's special case).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc._validation import check_number, check_positive_int
from posenc.encodings.alibi import alibi_slopes
from posenc.encodings.base import (
    Hook,
    PositionalEncoding,
    gate_input,
    layer_of_copies,
    sum_dtype,
)
from posenc.errors import InvalidArgument


class GRAPEAdditive(PositionalEncoding):
    """Additive GRAPE, path-integral form (GRAPE-A-PI; arXiv 2512.07805), as its official code
    computes it (model-architectures/GRAPE ``model/llama-mha-grape-a-pi.py`` @135ee30,
    ``CausalSelfAttention.forward``)::

        p_t   = c_p(x_t)                        (B, T, H, P), Linear(d_model, H * P), no bias
        p̂_t   = rms_norm(p_t)                  over P, no weight (torch's default eps)
        r_t   = R(t) p̂_t                        pair (a, a + P/2) turned by -t omega_a,
                                                omega_a = base^(-2a/P); base 1: omega = 1
        e_il  = slope_h log sigmoid(p_i . r_l / P)
        b_ij  = sum_{l=j+1..i} e_il = (sum_{l<=i} e_il) - (sum_{l<=j} e_il)

    slope_h are ALiBi's slopes (:func:`~posenc.encodings.alibi.alibi_slopes`, a buffer). The
    query side reads its raw p_i, the key side the normalized, rotated p̂_l. The bias is added
    after the 1/sqrt(D) scale (``content_scaled = False``), as the reference adds it to SDPA's
    scaled scores.

    Conventions. The reference rotates by the token index; posenc by the key's **position**
    (``k_positions``), so a KV cache, left padding and packed rows see the positions the
    tokens have. The rotation direction is the reference's (y_a = x_a cos + x_{a+P/2} sin,
    RoPE's by -angle), its angles in float64 (the reference rounds cos / sin to bfloat16). The
    sums along the path run in float64 (float32 on MPS). Causal only (the path runs from the
    key to the query). The reference's options to tie p to q, k or v (``p_tie_mode``) are not
    here: the ``gate`` hook sees the hidden state, not the projected q, k, v.

    Hooks: ``gate`` (p per token and query head, kept with the keys in a KV cache) and
    ``content`` (the bias, from the gates of every key and the key positions), on the backends
    that take content terms. Cost per call: O(B H Tq Tk P) time (one product of
    the queries' p with the keys' r) and O(B H Tq Tk) memory.

    Args:
        d_model: the width of x.
        num_heads: H (one p and one slope per query head).
        head_dim: D, the default P.
        p_head_dim: P, the width of p (even); None (default): D (the reference's default).
        base: the rotation's base (1.0, the reference's ``Rotary(dim, base=1)``: every pair
            turns by t radians); > 1 gives RoPE's spectrum.
        num_layers: the number of attention layers, each with its own c_p (:meth:`for_layer`);
            1 (default): one shared by every layer.
        causal: must be True (the model's size; :meth:`for_model` passes it).

    Raises:
        ValueError: a size not an integer >= 1, P odd, base < 1 or not finite, causal False
            (construction); x without shape (B, T, d_model) (:meth:`gate`); gates without P
            features (:meth:`prepare_gates`).
    """

    name = "grape_additive"
    hooks = frozenset({Hook.GATE, Hook.CONTENT})
    model_sizes = ("d_model", "num_heads", "head_dim", "num_layers", "causal")
    causal_only = True
    content_on_values = False
    content_scaled = False

    def __init__(self, d_model: int, num_heads: int, head_dim: int, p_head_dim: int | None = None,
                 base: float = 1.0, num_layers: int = 1, causal: bool = True) -> None:
        super().__init__()
        for argname, value in (("d_model", d_model), ("num_heads", num_heads), ("head_dim", head_dim),
                               ("num_layers", num_layers)):
            check_positive_int(value, argname)
        width = head_dim if p_head_dim is None else p_head_dim
        check_positive_int(width, "p_head_dim")
        if width % 2:
            raise InvalidArgument(f"p_head_dim must be even (p is rotated in pairs), got {width}")
        check_number(base, "base", ge=1.0)
        if causal is not True:
            raise InvalidArgument(f"causal: additive GRAPE's path runs from the key to the query (causal attention only), got {causal!r}")
        self.d_model, self.num_heads, self.head_dim, self.num_layers = d_model, num_heads, head_dim, num_layers
        self.p_head_dim, self.base = width, float(base)
        self.c_p = nn.Linear(d_model, num_heads * width, bias=False)
        self.register_buffer("slopes", alibi_slopes(num_heads), persistent=False)
        self.deeper_layers = nn.ModuleList(
            GRAPEAdditive(d_model, num_heads, head_dim, p_head_dim, base) for _ in range(num_layers - 1)
        )

    @property
    def gate_features(self) -> int:
        """P: the trailing size of :meth:`gate`'s values (p itself)."""
        return self.p_head_dim

    def for_layer(self, layer: int) -> PositionalEncoding:
        """Layer 0 is this instance; layer l > 0 the l-th of ``deeper_layers``."""
        return layer_of_copies(self, self.deeper_layers, layer)

    def gate(self, x: Tensor) -> Tensor:
        """p of every token: x (B, T, d_model) -> (B, H, T, P), float32 (float64 for float64 x
        and parameters)."""
        x, wide = gate_input(x, self.d_model, self.c_p.weight)
        batch, length, _ = x.shape
        p = self.c_p(x).to(wide).view(batch, length, self.num_heads, self.p_head_dim)
        return p.transpose(1, 2)

    def prepare_gates(self, gates: Tensor) -> Tensor:
        """The gates of every key, checked: (B, H, Tk, P)."""
        if gates.dim() != 4 or gates.shape[-1] != self.p_head_dim:
            raise InvalidArgument(f"gates must have shape (B, H, Tk, {self.p_head_dim}) (GRAPEAdditive.gate(x): p), "
                                  f"got {tuple(gates.shape)}")
        return gates

    def gate_bias(self, state, q_index, k_index, *, causal):
        """None: the bias reads the key positions, so it is a content term (:meth:`content_scores`)."""

    def _rotated(self, p_hat: Tensor, k_positions: Tensor) -> Tensor:
        """R(t_l) p̂_l: every pair (a, a + P/2) turned by -t_l omega_a (the reference's direction)."""
        half = self.p_head_dim // 2
        omega = float(self.base) ** (-torch.arange(0, half, dtype=torch.float64, device=p_hat.device) * 2 / self.p_head_dim)
        positions = k_positions.to(device=p_hat.device, dtype=torch.float64)
        if positions.dim() == 2:  # (B, Tk): per row
            positions = positions[:, None]
        angles = positions.unsqueeze(-1) * omega  # (Tk, P/2) or (B, 1, Tk, P/2)
        cos, sin = angles.cos().to(p_hat.dtype), angles.sin().to(p_hat.dtype)
        first, second = p_hat[..., :half], p_hat[..., half:]
        return torch.cat((first * cos + second * sin, second * cos - first * sin), dim=-1)

    def content_scores(self, q, k, q_positions, k_positions, *, mask=None, gate_state=None):
        """b_ij: (B, H, Tq, Tk), added after the scale (``content_scaled = False``), float32
        (float64 for float64 gates); entries with j > i are zero (the attention masks them).
        The queries are the last Tq keys; q, k and ``mask`` are not read."""
        p = gate_state
        num_queries, num_keys = q.shape[-2], p.shape[-2]
        p_query = p[..., num_keys - num_queries:, :]
        p_key = self._rotated(F.rms_norm(p, (self.p_head_dim,)), k_positions)
        edges = F.logsigmoid(p_query @ p_key.transpose(-2, -1) / self.p_head_dim)
        edges = edges * self.slopes.to(device=p.device, dtype=p.dtype)[:, None, None]
        # the tokens l <= i the query has passed (query row r is key r + Tk - Tq)
        passed = torch.ones(num_queries, num_keys, dtype=torch.bool, device=p.device).tril(num_keys - num_queries)
        edges = edges.masked_fill(~passed, 0.0).to(sum_dtype(p))
        along = edges.cumsum(-1)
        return (along[..., -1:] - along).to(p.dtype)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, p_head_dim={self.p_head_dim}, "
                f"base={self.base:g}, num_layers={self.num_layers}")
