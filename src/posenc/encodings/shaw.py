"""Relative position representations (Shaw, Uszkoreit and Vaswani, NAACL 2018).

Uses the ``content`` hook: :meth:`Shaw.content_scores` returns extra logits (B, H, Tq, Tk) that
the attention adds to q.k *before* the 1/sqrt(D) scale, and :meth:`Shaw.content_values`
returns an extra output (B, H, Tq, D) computed from the attention probabilities. The queries
are projected onto a small table of relative vectors, then indexed by distance: no
(B, H, Tq, Tk, D) tensor is made.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posenc._validation import check_positive_int
from posenc.encodings.base import (
    Hook,
    PositionalEncoding,
    arange_start,
    per_batch_index,
)
from posenc.errors import InvalidArgument
from posenc.kernels import relpos_cpu


def _per_pair_fits(x: Tensor, q_positions: Tensor, k_positions: Tensor, width: int | None = None) -> bool:
    """Whether the (Tq, Tk, D) table of each pair's relative vector is worth making for x
    (B, H, Tq, .): 1-D positions (one table for the batch) and D <= B H, so that it is no
    larger than the (B, H, Tq, Tk) scores made anyway."""
    dim = x.shape[-1] if width is None else width
    return (q_positions.dim() == 1 and k_positions.dim() == 1 and x.dim() == 4 and dim <= x.shape[0] * x.shape[1]
            and not torch.compiler.is_compiling())


class _PerRowProduct(torch.autograd.Function):
    """out[b, h, i] = x[b, h, i] @ table[i]: x (B, H, Tq, K), table (Tq, K, N) -> (B, H, Tq, N),
    as one batched matmul over the query rows, (B H, K) x (K, N) each. Every result and
    gradient is returned contiguous in its own layout: the permuted views the plain ops would
    hand on make the softmax's backward and the additions after it several times slower."""

    @staticmethod
    def forward(ctx, x: Tensor, table: Tensor) -> Tensor:
        batch, heads, rows, inner = x.shape
        stacked = x.permute(2, 0, 1, 3).reshape(rows, batch * heads, inner)
        ctx.save_for_backward(stacked, table)
        ctx.shape = x.shape
        out = torch.bmm(stacked, table)  # (Tq, B H, N)
        return out.view(rows, batch, heads, -1).permute(1, 2, 0, 3).contiguous()

    @staticmethod
    def backward(ctx, grad: Tensor):
        stacked, table = ctx.saved_tensors
        batch, heads, rows, inner = ctx.shape
        grad_rows = grad.permute(2, 0, 1, 3).reshape(rows, batch * heads, -1)  # (Tq, B H, N)
        grad_x = grad_table = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.bmm(grad_rows, table.transpose(1, 2))
            grad_x = grad_x.view(rows, batch, heads, inner).permute(1, 2, 0, 3).contiguous()
        if ctx.needs_input_grad[1]:
            grad_table = torch.bmm(stacked.transpose(1, 2), grad_rows)
        return grad_x, grad_table


class Shaw(PositionalEncoding):
    """Relative position representations (Shaw, Uszkoreit and Vaswani, NAACL 2018, eqs. 3-5).

        e_ij = q_i . (k_j + a^K_ij) / sqrt(D),      z_i = sum_j alpha_ij (v_j + a^V_ij),
        a^K_ij = w^K_{clip(j - i, k)},  a^V_ij = w^V_{clip(j - i, k)},  clip(x, k) = max(-k, min(k, x)),

    2k + 1 learned vectors of head dimension for keys and for values, shared by all heads
    (section 3.3). j - i is key position minus query position.

    Efficient form (section 3.3 splits e_ij the same way): q_i . w^K_r for the 2k + 1 rows r
    is one (B, H, Tq, 2k+1) product, then indexed by clip(j - i); the value term sums
    alpha_ij by bucket (scatter-add into (B, H, Tq, 2k+1)) and multiplies by w^V. No
    (B, H, Tq, Tk, D) tensor is formed. With 1-D positions and D <= B H (training batches),
    both terms are instead one batched matmul over the query rows against each row's
    (Tk, D) relative vectors, a (Tq, Tk, D) table shared by the batch: no gather over the
    scores or scatter-add over the probabilities, forward or backward.

    Args:
        head_dim: D.
        max_relative_position: k, the clip distance (tensor2tensor's name); default 16 (the
            paper found little change for k >= 2).

    Hook: ``content`` (scores and values: the value term reads the attention probabilities,
    ``content_on_values = True``). Parameters ``relative_key`` and ``relative_value``,
    float32 (2k + 1, D), Glorot-uniform initialised as tensorflow's default in tensor2tensor.
    Cost: O(B H Tq (2k+1) D) extra for the two products plus O(B H Tq Tk) for the indexing.

    Raises:
        ValueError: head_dim or max_relative_position not an int >= 1 (construction), q or
            v whose last dimension is not head_dim (call).
    """

    name = "shaw"
    hooks = frozenset({Hook.CONTENT})
    model_sizes = ("head_dim",)
    content_on_values = True

    def __init__(self, head_dim: int, *, max_relative_position: int = 16) -> None:
        super().__init__()
        check_positive_int(head_dim, "head_dim")
        check_positive_int(max_relative_position, "max_relative_position")
        self.head_dim, self.max_relative_position = head_dim, max_relative_position
        self.relative_key = nn.Parameter(torch.empty(2 * max_relative_position + 1, head_dim))
        self.relative_value = nn.Parameter(torch.empty(2 * max_relative_position + 1, head_dim))
        nn.init.xavier_uniform_(self.relative_key)
        nn.init.xavier_uniform_(self.relative_value)

    def relative_index(self, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """clip(j - i, k) + k in [0, 2k], LongTensor (Tq, Tk) or (B, Tq, Tk)."""
        k = self.max_relative_position
        rel = k_positions.unsqueeze(-2) - q_positions.unsqueeze(-1)
        return rel.clamp(-k, k) + k

    def relative_table(self, max_distance: int) -> tuple[Tensor, Tensor, str]:
        """For figures: key distances j - i in [-m, m], m = min(max_distance, k + 8), the key
        vectors w^K_{clip(j - i, k)} they use (2m + 1, D), and a title."""
        m = min(max_distance, self.max_relative_position + 8)
        distances = torch.arange(-m, m + 1)
        index = distances.clamp(-self.max_relative_position, self.max_relative_position) + self.max_relative_position
        title = f"learned key vectors w^K_clip(j-i, k), k={self.max_relative_position}"
        return distances, self.relative_key.detach()[index], title

    def _check_dim(self, x: Tensor, argname: str) -> None:
        if x.shape[-1] != self.head_dim:
            raise InvalidArgument(f"{argname} must have head_dim={self.head_dim}, got {x.shape[-1]}")

    def content_scores(self, q, k, q_positions, k_positions, *, mask=None, gate_state=None):
        """q_i . w^K_{clip(j - i)}: (B, H, Tq, Tk) before the 1/sqrt(D) scale, float32 (float64
        when q or the parameters are float64)."""
        self._check_dim(q, "q")
        wide = torch.promote_types(torch.promote_types(q.dtype, self.relative_key.dtype), torch.float32)
        if _per_pair_fits(q, q_positions, k_positions):
            # (B H, D) x (D, Tk) per query row against that row's key vectors: no gather over
            # the (B, H, Tq, Tk) scores nor its scatter-add backward
            per_pair = self.relative_key.to(wide)[self.relative_index(q_positions, k_positions)]  # (Tq, Tk, D)
            return _PerRowProduct.apply(q.to(wide), per_pair.transpose(1, 2))
        per_row = q.to(wide) @ self.relative_key.to(wide).t()  # (B, H, Tq, 2k+1)
        index = per_batch_index(self.relative_index(q_positions, k_positions))
        index = index.expand(q.shape[0], q.shape[1], -1, -1)
        return per_row.gather(-1, index)

    def content_values(self, probs, q_positions, k_positions):
        """sum_j alpha_ij w^V_{clip(j - i)}: (B, H, Tq, D), float32 (float64 when the
        probabilities or the parameters are float64)."""
        wide = torch.promote_types(torch.promote_types(probs.dtype, self.relative_value.dtype), torch.float32)
        if _per_pair_fits(probs, q_positions, k_positions, width=self.head_dim):
            # (B H, Tk) x (Tk, D) per query row against that row's value vectors: no
            # scatter-add over the probabilities nor its gather backward
            per_pair = self.relative_value.to(wide)[self.relative_index(q_positions, k_positions)]  # (Tq, Tk, D)
            return _PerRowProduct.apply(probs.to(wide), per_pair)
        index = per_batch_index(self.relative_index(q_positions, k_positions)).expand_as(probs)
        per_bucket = probs.new_zeros(*probs.shape[:-1], self.relative_value.shape[0])
        per_bucket = per_bucket.scatter_add(-1, index, probs)  # (B, H, Tq, 2k+1)
        return per_bucket.to(wide) @ self.relative_value.to(wide)

    def content_attention(self, q, k, v, q_positions, k_positions, *, causal, scale):
        """The whole attention (eqs. 3-5) from the fused CPU kernel
        (:mod:`posenc.kernels.relpos_cpu`: scores, both terms, softmax and the weighted sum in
        one pass per (batch, head), and one backward), for float32 and consecutive 1-D
        positions; None elsewhere (the kernel not built or switched off, torch.compile, other
        dtypes or positions), and the attention layer takes the hooks. (B, H, Tq, D), float32;
        its backward has no derivative (switch the kernel off for second derivatives)."""
        if q.shape[-1] != self.head_dim or v.shape[-1] != self.head_dim or k.shape[1] != q.shape[1]:
            return None  # the hooks' path raises the error
        if not relpos_cpu.serves(q, k, v, self.relative_key, self.relative_value):
            return None
        q_start, k_start = arange_start(q_positions), arange_start(k_positions)
        if q_start is None or k_start is None:
            return None
        # pair (i, j) reads row clip(j - i + offset, 0, 2k) of both tables: clip(k_j - q_i, k) + k
        offset = k_start - q_start + self.max_relative_position
        return relpos_cpu.attention(q, k, v, key_table=self.relative_key, value_table=self.relative_value,
                                    offset=offset, causal=causal, scale=scale)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, max_relative_position={self.max_relative_position}"
