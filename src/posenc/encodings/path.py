"""PaTH attention: position encoding by accumulated Householder-like transformations (Yang,
Shen, Wen, Tan, Mishra, Ren, Panda and Kim, NeurIPS 2025, "PaTH Attention: Position Encoding
via Accumulating Householder Transformations", arXiv 2505.16381).

Each token t writes, from the layer's input x_t, a unit vector w_t and a strength
beta_t in (0, 2) per key/value head; the logit of query i on key j is

    s_ij = q_i^T H_i H_{i-1} ... H_{j+1} k_j,     H_t = I - beta_t w_t w_t^T,

so what lies between the two tokens (not how many tokens) turns the key: a data-dependent
RoPE, with eigenvalues 1 - beta in (-1, 1) along w (a reflection at beta = 2, a projection
at beta = 1). With W (Tk, D) the rows w_t, the products have the compact UT form (the paper's
section 3.2; fla-org/flash-linear-attention ``fla/ops/path_attn/naive.py``):

    S = Q K^T - tril(Q W^T) (I + L)^{-1} tril_{-1}(diag(beta) W K^T),
    L = tril_{-1}(diag(beta) W W^T),

where tril keeps s <= i (the w's a query has passed) and tril_{-1} keeps t > j (the w's after
the key); (I + L)^{-1} restricted to the tokens j+1..i is the inverse of that block, which is
why one inverse over all keys serves every pair. posenc evaluates it with one triangular solve
(``torch.linalg.solve_triangular``): no loop over the sequence, exact in float64.

Shapes: B batch, H query heads, H_kv key/value heads, T tokens, Tk keys, D head_dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc._validation import check_positive_int
from posenc.encodings.base import Hook, PositionalEncoding, gate_input, layer_of_copies
from posenc.encodings.fox import cumulative_log_gates, log_gate_difference
from posenc.errors import InvalidArgument

#: fla's ``l2_norm``: w / sqrt(|w|^2 + eps), so a zero projection stays finite.
L2_NORM_EPS = 1e-6


def _l2_norm(w: Tensor) -> Tensor:
    """fla's ``l2_norm`` over the last axis."""
    return w * torch.rsqrt(w.square().sum(-1, keepdim=True) + L2_NORM_EPS)


class PaTH(PositionalEncoding):
    """PaTH attention's position encoding (Yang et al. 2025, eq. (2) and section 3.2;
    reference: fla-org/flash-linear-attention ``fla/layers/path_attn.py`` (``PaTHAttention``)
    and ``fla/ops/path_attn/naive.py`` (``naive_path_attn``))::

        w_t    = l2_norm(w_proj(x_t))                 per key/value head, (D,)
        beta_t = 2 sigmoid(bt_proj(x_t))              per key/value head, in (0, 2)
        H_t    = I - beta_t w_t w_t^T
        s_ij   = q_i^T H_i H_{i-1} ... H_{j+1} k_j    (j <= i; s_ii = q_i . k_i)

    ``w_proj`` is low-rank as the reference's default (``use_low_rank_w=True``):
    ``Linear(d_model, w_rank)`` then ``Linear(w_rank, H_kv * D)``, both without bias
    (``w_rank=None``: one ``Linear(d_model, H_kv * D)``); ``bt_proj`` is
    ``Linear(d_model, H_kv)`` with a bias. The product order is the reference's: its decoding
    step turns every cached key by the new token's H (``past_k - beta (past_k . w) w``), so key
    j meets H_{j+1} first and H_i last; the query's own token's H is not applied to its own
    key. No RoPE and no other position signal (the paper's PaTH is a NoPE transformer with
    these transforms).

    Conventions. The transform is the ``content`` hook's term, ``s_ij - q_i . k_j``, computed
    from q, k and the ``gate`` hook's values of every key (w and beta, kept with the keys in
    a KV cache like FoX's forget gates), so it runs on the backends that take content terms
    (docs/encodings.md). Positions are not read: a KV cache, packed rows
    (a document mask: every token between i and j is then in their document) and left padding
    (the pads precede every real token) give the same logits as the rows alone. Causal only
    (the products run from the key to the query): ``causal=False`` is refused. Grouped-query
    heads: w and beta are per key/value head (``num_kv_heads``) and shared by the query heads
    that read it (query head h reads key/value head h // (H / H_kv), as the reference's
    ``expand``); :meth:`gate` returns them per query head, the form ``gates=`` takes.

    PaTH-FoX (``forget_gate=True``, the reference's ``use_forget_gate``): a forget gate per
    query head, log f_t = logsigmoid(g_proj(x_t)) with ``g_proj`` = ``Linear(d_model, H)`` and
    a bias, adds c_i - c_j = sum_{l=j+1..i} log f_l to s_ij **before** the 1/sqrt(D) scale, as
    the reference (its kernel adds the gate cumsums to q.k and then multiplies by the scale;
    :class:`~posenc.encodings.FoX` adds its D_ij after the scale, as FoX's reference does).

    The reference layer's causal short convolution on w before the norm (``w_shortconv=True``,
    its ``use_w_shortconv``, on by default there, off by default here for the checkpoints made
    before it): a depthwise ``Conv1d(H_kv D, H_kv D, 3, groups=H_kv D, bias=False)`` over the
    tokens, then SiLU (fla's ``ShortConvolution``), w_t = l2_norm(silu(sum_s c_s w_raw_{t-2+s}))
    with zeros before the first token. :meth:`gate` then keeps the raw projection of each token
    and :meth:`prepare_gates` convolves every key's, so a KV cache needs no convolution state
    (the reference keeps the last inputs): exact while the cache holds every key. The two
    tokens after a left padding read the pads' projections (the reference unpads first): give
    the pads zero gates.

    Args:
        d_model: the width of x.
        num_heads: H, the query heads.
        head_dim: D.
        num_kv_heads: H_kv, the heads w and beta are written for; None (default): H. Must
            divide H.
        w_rank: the inner width of the low-rank ``w_proj`` (32, the reference's); None: a
            full-rank projection.
        forget_gate: PaTH-FoX: also a forget gate per query head (default False).
        w_shortconv: the reference's short convolution on w (default False; the reference's
            default is True).
        num_layers: the number of attention layers, each with its own projections
            (:meth:`for_layer`); 1 (default): one shared by every layer.
        causal: must be True (the model's size; :meth:`for_model` passes it).

    Hooks: ``gate`` and ``content``. Cost per call: O(B H (Tk^2 D + Tq Tk D + Tq Tk^2)) time
    (the Gram matrices and one triangular solve of Tq right-hand sides) and O(B H Tk^2) memory;
    a decoding step O(B H Tk^2 D) (the reference kernel turns the cached keys instead: O(Tk D)
    a step, which needs a transformed-key cache posenc's KV cache does not keep).

    Raises:
        ValueError: a size not an integer >= 1, num_kv_heads not dividing num_heads, w_rank
            not None or >= 1, forget_gate or w_shortconv not a bool, causal False (construction); x without
            shape (B, T, d_model) (:meth:`gate`); gates without :attr:`gate_features` features
            (:meth:`prepare_gates`).
    """

    name = "path"
    hooks = frozenset({Hook.GATE, Hook.CONTENT})
    model_sizes = ("d_model", "num_heads", "head_dim", "num_layers", "causal")
    causal_only = True
    content_on_values = False

    def __init__(self, d_model: int, num_heads: int, head_dim: int, num_kv_heads: int | None = None,
                 w_rank: int | None = 32, forget_gate: bool = False, num_layers: int = 1,
                 causal: bool = True, w_shortconv: bool = False) -> None:
        super().__init__()
        for argname, value in (("d_model", d_model), ("num_heads", num_heads), ("head_dim", head_dim),
                               ("num_layers", num_layers)):
            check_positive_int(value, argname)
        kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        check_positive_int(kv_heads, "num_kv_heads")
        if num_heads % kv_heads:
            raise InvalidArgument(f"num_kv_heads must divide num_heads={num_heads}, got {kv_heads}")
        if w_rank is not None:
            check_positive_int(w_rank, "w_rank")
        for argname, flag in (("forget_gate", forget_gate), ("w_shortconv", w_shortconv)):
            if not isinstance(flag, bool):
                raise InvalidArgument(f"{argname} must be a bool, got {flag!r}")
        if causal is not True:
            raise InvalidArgument(f"causal: PaTH's transforms run from the key to the query (causal attention only), got {causal!r}")
        self.d_model, self.num_heads, self.head_dim, self.num_layers = d_model, num_heads, head_dim, num_layers
        self.num_kv_heads, self.w_rank, self.forget_gate = kv_heads, w_rank, forget_gate
        width = kv_heads * head_dim
        if w_rank is None:
            self.w_proj = nn.Linear(d_model, width, bias=False)
        else:
            self.w_proj = nn.Sequential(nn.Linear(d_model, w_rank, bias=False), nn.Linear(w_rank, width, bias=False))
        self.bt_proj = nn.Linear(d_model, kv_heads, bias=True)
        self.g_proj = nn.Linear(d_model, num_heads, bias=True) if forget_gate else None
        self.w_shortconv = w_shortconv
        self.w_conv1d = nn.Conv1d(width, width, 3, groups=width, padding=2, bias=False) if w_shortconv else None
        self.deeper_layers = nn.ModuleList(
            PaTH(d_model, num_heads, head_dim, num_kv_heads, w_rank, forget_gate, w_shortconv=w_shortconv)
            for _ in range(num_layers - 1)
        )

    @property
    def gate_features(self) -> int:
        """The trailing size of :meth:`gate`'s values: w (D), beta (1), then log f (1) with
        ``forget_gate``."""
        return self.head_dim + 1 + self.forget_gate

    def for_layer(self, layer: int) -> PositionalEncoding:
        """Layer 0 is this instance; layer l > 0 the l-th of ``deeper_layers``."""
        return layer_of_copies(self, self.deeper_layers, layer)

    def gate(self, x: Tensor) -> Tensor:
        """w and beta of every token: x (B, T, d_model) -> (B, H, T, F), w in [..., :D]
        (unit norm; with ``w_shortconv`` the raw projection, which :meth:`prepare_gates`
        convolves and normalizes), beta in [..., D] and, with ``forget_gate``, log f in [..., D + 1] (F =
        :attr:`gate_features`), float32 (float64 for float64 x and parameters), as the
        reference (``l2_norm(w, output_dtype=float32)``, ``bt_proj(x).float().sigmoid() * 2``,
        ``logsigmoid(g_proj(x).float())``); per query head (each key/value head's w and beta
        repeated for the query heads reading it)."""
        x, wide = gate_input(x, self.d_model, self.bt_proj.weight)
        batch, length, _ = x.shape
        w = self.w_proj(x).to(wide).view(batch, length, self.num_kv_heads, self.head_dim)
        if self.w_conv1d is None:  # with the convolution, prepare_gates normalizes after it
            w = _l2_norm(w)
        beta = 2 * torch.sigmoid(self.bt_proj(x).to(wide))  # (B, T, H_kv)
        values = torch.cat((w, beta.unsqueeze(-1)), dim=-1).transpose(1, 2)  # (B, H_kv, T, D + 1)
        groups = self.num_heads // self.num_kv_heads
        values = values.repeat_interleave(groups, dim=1) if groups > 1 else values
        if self.forget_gate:
            log_f = F.logsigmoid(self.g_proj(x).to(wide)).transpose(1, 2)  # (B, H, T)
            values = torch.cat((values, log_f.unsqueeze(-1)), dim=-1)
        return values

    def prepare_gates(self, gates: Tensor) -> tuple[Tensor, Tensor, tuple | None]:
        """(w (B, H, Tk, D), beta (B, H, Tk), the forget gates' cumulative sums or None) from
        the gates of every key."""
        if gates.dim() != 4 or gates.shape[-1] != self.gate_features:
            raise InvalidArgument(f"gates must have shape (B, H, Tk, {self.gate_features}) (PaTH.gate(x): w, beta"
                                  f"{', log f' if self.forget_gate else ''}), got {tuple(gates.shape)}")
        dim = self.head_dim
        forget = cumulative_log_gates(gates[..., dim + 1]) if self.forget_gate else None
        w = gates[..., :dim] if self.w_conv1d is None else _l2_norm(self._short_convolution(gates[..., :dim]))
        return w, gates[..., dim], forget

    def _short_convolution(self, w_raw: Tensor) -> Tensor:
        """silu of the causal depthwise convolution of every key's raw w: (B, H, Tk, D), the
        taps of the query heads' key/value head, zeros before the first key."""
        groups = self.num_heads // self.num_kv_heads
        taps = self.w_conv1d.weight.to(w_raw.dtype).view(self.num_kv_heads, self.head_dim, 3)
        taps = taps.repeat_interleave(groups, dim=0)[:, None]  # (H, 1, D, 3): per query head
        padded = F.pad(w_raw, (0, 0, 2, 0))  # two zero tokens before the first
        length = w_raw.shape[-2]
        mixed = sum(padded[..., s:s + length, :] * taps[..., s] for s in range(3))
        return F.silu(mixed)

    def gate_bias(self, state, q_index, k_index, *, causal):
        """None: PaTH's term depends on q and k, so it is a content term (:meth:`content_scores`)."""

    def content_scores(self, q, k, q_positions, k_positions, *, mask=None, gate_state=None):
        """s_ij - q_i . k_j: (B, H, Tq, Tk) before the 1/sqrt(D) scale, float32 (float64 when q
        or the gates are float64); entries with j > i are zero (the attention masks them).
        q (B, H, Tq, D) are the last Tq of the keys k (B, H, Tk, D); ``gate_state`` is
        :meth:`prepare_gates`'s (w, beta, forget); with ``forget_gate`` the term includes
        c_i - c_j. Positions and ``mask`` are not read."""
        w, beta, forget = gate_state
        wide = torch.promote_types(torch.promote_types(q.dtype, w.dtype), torch.float32)
        q, k, w, beta = q.to(wide), k.to(wide), w.to(wide), beta.to(wide)
        num_queries, num_keys = q.shape[-2], k.shape[-2]
        w_beta = w * beta.unsqueeze(-1)
        # q_i . w_s for the s <= i the query has passed (query row r is key r + Tk - Tq)
        passed = torch.ones(num_queries, num_keys, dtype=torch.bool, device=q.device).tril(num_keys - num_queries)
        query_w = (q @ w.transpose(-2, -1)).masked_fill(~passed, 0.0)
        # (I + L) with L_ts = beta_t w_t . w_s (t > s): the diagonal is implied (unitriangular)
        gram = (w_beta @ w.transpose(-2, -1)).tril(-1)
        transported = torch.linalg.solve_triangular(gram, query_w, upper=False, left=False, unitriangular=True)
        # beta_t w_t . k_j for the t > j after the key
        after_key = (w_beta @ k.transpose(-2, -1)).tril(-1)
        scores = -(transported @ after_key)
        if forget is not None:
            own = torch.arange(num_keys - num_queries, num_keys, device=q.device)
            scores = scores + log_gate_difference(forget, own, torch.arange(num_keys, device=q.device)).to(wide)
        return scores

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
                f"num_kv_heads={self.num_kv_heads}, w_rank={self.w_rank}, forget_gate={self.forget_gate}, "
                f"w_shortconv={self.w_shortconv}, "
                f"num_layers={self.num_layers}")
