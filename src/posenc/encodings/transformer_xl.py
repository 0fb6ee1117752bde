"""Transformer-XL's relative encoding (Dai et al. 2019, section 3.3).

Uses the ``content`` hook: :meth:`TransformerXL.content_scores` returns extra logits
(B, H, Tq, Tk) that the attention adds to q.k *before* the 1/sqrt(D) scale. The queries are
projected onto the sinusoidal table of relative distances, then shifted or indexed by
distance: no (B, H, Tq, Tk, D) tensor is made.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posenc._validation import check_number, check_positive_int
from posenc.encodings.base import (
    Hook,
    PositionalEncoding,
    arange_start,
    per_batch_index,
)
from posenc.encodings.sinusoidal import sinusoidal_encode
from posenc.errors import InvalidArgument
from posenc.kernels import relpos_cpu


def _is_arange(positions: Tensor) -> bool:
    """True for a 1-D run of consecutive integers p0, p0 + 1, ... (the layout a shift needs)."""
    if positions.dim() != 1:
        return False
    return positions.numel() < 2 or bool((positions.diff() == 1).all())


def relative_shift(x: Tensor, num_keys: int) -> Tensor:
    """The relative-shift ("skewing") trick: out[..., i, j] = x[..., i, Tq - 1 - i + j].

    x (..., Tq, N) holds, in column c, the term for distance d_hi - c (distances in
    descending order, as Transformer-XL's ``pos_seq = arange(klen - 1, -1, -1)``), with
    N >= Tq + Tk - 1; for consecutive query and key positions, column Tq - 1 - i + j of row i
    is then distance q_i - k_j. As Transformer-XL's ``_rel_shift`` (pad a zero column, view the
    buffer with rows of length N, drop the first row), it only re-strides memory; with the
    table covering every distance (N = Tq + Tk - 1) it is exact for every (i, j), including
    keys after the query and any Tq <= Tk or Tq > Tk.

    Returns (..., Tq, Tk).
    """
    num_queries, width = x.shape[-2], x.shape[-1]
    if width < num_queries + num_keys - 1:
        raise InvalidArgument(f"x: need at least Tq + Tk - 1 = {num_queries + num_keys - 1} columns, got {width}")
    return _skew(x, num_keys)


def _skew(x: Tensor, num_keys: int) -> Tensor:
    """:func:`relative_shift` without its width check: with Tk + 1 <= N < Tq + Tk - 1 columns,
    entries j > i + N - Tq read the next row's first columns (inside the buffer, no overlap:
    for a caller whose mask hides them)."""
    num_queries, width = x.shape[-2], x.shape[-1]
    # Element (i, j) sits at i * width + (Tq - 1 - i + j) = (Tq - 1) + i * (width - 1) + j of each
    # (Tq, width) matrix: one strided view (no padded copy), whose backward is one scatter.
    x = x.contiguous()
    strides = x.stride()[:-2] + (width - 1, 1)
    return x.as_strided(x.shape[:-1] + (num_keys,), strides, x.storage_offset() + num_queries - 1)


def _sees_no_far_future(mask: Tensor | None, num_queries: int, num_keys: int) -> bool:
    """True when ``mask`` (boolean, (..., Tq, Tk)) hides every key j > i + Tk - Tq + 1 from
    query i (the causal mask, bottom-right aligned, and anything stricter)."""
    if mask is None or mask.dtype != torch.bool or mask.dim() < 2 or mask.shape[-2:] != (num_queries, num_keys):
        return False
    return not bool(torch.triu(mask, diagonal=num_keys - num_queries + 2).any())


class TransformerXL(PositionalEncoding):
    """Transformer-XL relative attention (Dai et al., ACL 2019, section 3.3, eq. for A^rel):

        A_ij = q_i.k_j + q_i.W_{k,R} R_{i-j} + u.k_j + v.W_{k,R} R_{i-j}      (a)+(b)+(c)+(d),

    scaled by 1/sqrt(D) as a whole (the reference code scales AC + BD). R_d is the sinusoidal
    vector of the distance d = i - j (query minus key position) in the reference code's
    [sin || cos] layout, inv_freq = 1 / 10000^(arange(0, d_model, 2) / d_model); W_{k,R}
    (``r_net``, Linear(d_model, H D, bias=False)) projects it per head; u = ``r_w_bias`` and
    v = ``r_r_bias``, each (H, D). This hook returns (b) + (c) + (d); the attention adds (a).

    The (b)+(d) terms, (q_i + v) . W R_d, are computed for the Tq + Tk - 1 distances d spanned
    by the call, then moved to (i, j) with :func:`relative_shift` when the query and key
    positions are runs of consecutive integers (a cache or memory before the queries gives
    Tq < Tk, handled exactly), or for the distinct distances that occur, gathered by distance,
    otherwise (packed or padded (B, T) positions, gaps). Keys after the query (bidirectional use) get R of a negative distance,
    sin(-x) = -sin(x), the natural extension; the reference is causal only.

    In the posenc LM one encoding instance serves every layer, so r_net, u and v are shared by
    the layers (Hugging Face's ``untie_r=False`` for u, v; the paper has one r_net per layer).
    No ``clamp_len``.

    Args:
        d_model: width of R (the reference uses the model width).
        num_heads: H. head_dim: D.
        base: 10000.0.
        init_std: std of the normal initialisation of r_net, u and v (Hugging Face: 0.02).

    Hook: ``content`` (scores only, ``content_on_values = False``). Cost: a (Tq+Tk-1, d_model)
    table through r_net, and a (B, H, Tq, Tq+Tk-1) product, about twice q.k^T; Tk + 1 columns
    instead when the mask hides the keys after the query (causal use).

    Raises:
        ValueError: a size not an int >= 1, base <= 1, init_std < 0 (construction); q or k
            with the wrong number of heads or head_dim (call).
    """

    name = "transformer_xl"
    hooks = frozenset({Hook.CONTENT})
    model_sizes = ("d_model", "num_heads", "head_dim")
    content_on_values = False

    def __init__(
        self, d_model: int, num_heads: int, head_dim: int, *, base: float = 10000.0, init_std: float = 0.02
    ) -> None:
        super().__init__()
        for argname, value in (("d_model", d_model), ("num_heads", num_heads), ("head_dim", head_dim)):
            check_positive_int(value, argname)
        if d_model % 2:
            raise InvalidArgument(f"d_model must be even ([sin || cos] halves), got {d_model}")
        check_number(base, "base", gt=1)
        check_number(init_std, "init_std", ge=0)
        self.d_model, self.num_heads, self.head_dim, self.base = d_model, num_heads, head_dim, float(base)
        self.r_net = nn.Linear(d_model, num_heads * head_dim, bias=False)
        self.r_w_bias = nn.Parameter(torch.empty(num_heads, head_dim))
        self.r_r_bias = nn.Parameter(torch.empty(num_heads, head_dim))
        for weight in (self.r_net.weight, self.r_w_bias, self.r_r_bias):
            nn.init.normal_(weight, std=init_std)

    def relative_embeddings(self, distances: Tensor, dtype: torch.dtype | None = None) -> Tensor:
        """W_{k,R} R_d for integer distances (N,) -> (H, N, D), computed and returned in
        ``dtype`` (default: float32, or float64 for a float64 r_net)."""
        dtype = dtype or torch.promote_types(self.r_net.weight.dtype, torch.float32)
        table = sinusoidal_encode(distances, self.d_model, self.base, layout="concat", dtype=dtype)  # (N, d_model)
        projected = table @ self.r_net.weight.to(dtype).t()
        return projected.unflatten(-1, (self.num_heads, self.head_dim)).transpose(0, 1)

    def relative_table(self, max_distance: int) -> tuple[Tensor, Tensor, str]:
        """For figures: distances 0 .. max_distance, their R_d (max_distance + 1, d_model) in
        [sin || cos] layout, and a title."""
        distances = torch.arange(max_distance + 1)
        table = sinusoidal_encode(distances, self.d_model, self.base, layout="concat")
        return distances, table, "sinusoidal R_(i-j), [sin || cos] layout"

    def content_scores(self, q, k, q_positions, k_positions, *, mask=None, gate_state=None):
        """(b) + (c) + (d): (B, H, Tq, Tk) before the 1/sqrt(D) scale, float32 (float64 when q
        or the parameters are float64). Under torch.compile the positions' layout is not
        inspected: every (i, j) pair gets its own R_{i-j} (O(H Tq Tk D) memory)."""
        for argname, x in (("q", q), ("k", k)):
            if x.shape[1] != self.num_heads or x.shape[-1] != self.head_dim:
                raise InvalidArgument(
                    f"{argname} must have num_heads={self.num_heads} and head_dim={self.head_dim}, "
                    f"got shape {tuple(x.shape)}"
                )
        num_queries, num_keys = q.shape[2], k.shape[2]
        wide = torch.promote_types(torch.promote_types(q.dtype, self.r_r_bias.dtype), torch.float32)
        query_plus_v = q.to(wide) + self.r_r_bias.to(wide)[:, None, :]
        if num_queries == 0 or num_keys == 0:
            bd = query_plus_v.new_zeros(q.shape[0], q.shape[1], num_queries, num_keys)
        elif torch.compiler.is_compiling():
            # Which layout fits reads the positions' values (a graph break): under torch.compile
            # every (i, j) gets its own R_{i-j}, O(H Tq Tk D) memory instead of O(H (Tq + Tk) D).
            distances = q_positions.unsqueeze(-1) - k_positions.unsqueeze(-2)  # (Tq, Tk) or (B, Tq, Tk)
            relative = self.relative_embeddings(distances.reshape(-1), wide)  # (H, N, D)
            relative = relative.unflatten(1, distances.shape)  # (H, [B,] Tq, Tk, D)
            if distances.dim() == 3:
                relative = relative.transpose(0, 1)  # (B, H, Tq, Tk, D)
            bd = (query_plus_v.unsqueeze(-2) * relative).sum(-1)
        elif _is_arange(q_positions) and _is_arange(k_positions):
            d_hi = int(q_positions.max()) - int(k_positions.min())
            # Keys more than one place past the query's diagonal masked (causal use): their
            # entries are never read, so the table stops at distance d_hi - Tk (Tk + 1
            # columns instead of Tq + Tk - 1, and the shifted view does not overlap itself).
            width = num_keys + 1 if _sees_no_far_future(mask, num_queries, num_keys) else num_queries + num_keys - 1
            distances = torch.arange(d_hi, d_hi - width, -1, device=q.device)  # descending
            bd = self._shifted_scores(query_plus_v, self.relative_embeddings(distances, wide), num_keys)
        else:
            # Only the distances that occur (at most Tq * Tk, however far apart the positions:
            # packed rows, padding, a key at 0 and a query at a million).
            distances, column = torch.unique(q_positions.unsqueeze(-1) - k_positions.unsqueeze(-2), return_inverse=True)
            bd_full = query_plus_v @ self.relative_embeddings(distances, wide).transpose(-2, -1)  # (B, H, Tq, N)
            column = per_batch_index(column).expand(q.shape[0], q.shape[1], num_queries, num_keys)
            bd = bd_full.gather(-1, column)
        # u.k_j as a product and a sum over D: a (B H)-batched matmul of (Tk, D) x (D, 1) and
        # its backward cost several times more at small D
        uk = (k.to(wide) * self.r_w_bias.to(wide).unsqueeze(-2)).sum(-1).unsqueeze(-2)  # (B, H, 1, Tk)
        return bd + uk

    def content_attention(self, q, k, v, q_positions, k_positions, *, causal, scale):
        """The whole attention, (a) + (b) + (c) + (d) through softmax and the weighted sum, from
        the fused CPU kernel (:mod:`posenc.kernels.relpos_cpu`: one pass per (batch, head),
        and one backward), for float32 and consecutive 1-D positions; None elsewhere (the
        kernel not built or switched off, torch.compile, other dtypes or positions), and the
        attention layer takes the hooks. (B, H, Tq, D), float32; its backward has no derivative
        (switch the kernel off for second derivatives)."""
        heads, dim = self.num_heads, self.head_dim
        if q.shape[1] != heads or k.shape[1] != heads or q.shape[-1] != dim or k.shape[-1] != dim:
            return None  # the hooks' path raises the error
        if not relpos_cpu.serves(q, k, v, self.r_net.weight, self.r_w_bias, self.r_r_bias):
            return None
        q_start, k_start = arange_start(q_positions), arange_start(k_positions)
        if q_start is None or k_start is None:
            return None
        num_queries, num_keys = q.shape[2], k.shape[2]
        # Row c of the table holds distance d_hi - c; pair (i, j) reads row Tq - 1 - i + j (the
        # kernel's offset), at most Tk - 1 when the keys after the query are masked (causal).
        d_hi = q_start + num_queries - 1 - k_start
        width = num_keys + 1 if causal else num_queries + num_keys - 1
        relative = self.relative_embeddings(torch.arange(d_hi, d_hi - width, -1, device=q.device), q.dtype)
        return relpos_cpu.attention(q, k, v, key_table=relative, query_bias=self.r_r_bias, key_bias=self.r_w_bias,
                                    offset=num_queries - 1, causal=causal, scale=scale)

    @staticmethod
    def _shifted_scores(query_plus_v: Tensor, relative: Tensor, num_keys: int) -> Tensor:
        """relative_shift((q + v) @ relative^T) for relative (H, N, D) shared by the batch,
        as one (B Tq, D) x (D, N) product per head (not B H small ones against a copied
        table) whose result is skewed in place by strides: (B, H, Tq, Tk). With N = Tk + 1
        (far future keys masked) entries j > i + Tk - Tq + 1 read the next row's columns:
        values of no use, inside the buffer, the view still free of overlaps."""
        batch, heads, num_queries, head_dim = query_plus_v.shape
        width = relative.shape[1]
        rows = query_plus_v.transpose(0, 1).reshape(heads, batch * num_queries, head_dim)
        scores = torch.bmm(rows, relative.transpose(-2, -1))  # (H, B Tq, N), contiguous
        # as relative_shift: (b, h, i, j) -> scores[h, b Tq + i, Tq - 1 - i + j]
        strides = (num_queries * width, batch * num_queries * width, width - 1, 1)
        return scores.as_strided((batch, heads, num_queries, num_keys), strides, num_queries - 1)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, num_heads={self.num_heads}, head_dim={self.head_dim}, base={self.base}"
