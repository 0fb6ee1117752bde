"""Forget gates: the Forgetting Transformer (FoX; Lin, Nikishin, He and Courville, ICLR 2025,
"Forgetting Transformer: Softmax Attention with a Forget Gate", arXiv 2503.02130).

Each token t writes a scalar forget gate per head, f_t = sigmoid(w_h . x_t + b_h), from the
layer's input x_t; the logit of query i on key j gains

    D_ij = sum_{l = j+1 .. i} log f_l = c_i - c_j,      c_t = sum_{l <= t} log f_l,

a data-dependent ALiBi: a decay whose slope each token chooses. It uses the ``gate`` hook, the
one that sees the hidden state (docs/design.md): :meth:`FoX.gate` maps x to log f, the model
keeps log f with the keys (the KV cache stores it like k and v), and the attention turns every
key's log f into the bias with :meth:`FoX.prepare_gates` (the cumulative sum, once per call,
O(B H Tk)) and :meth:`FoX.gate_bias` (c_i - c_j on any tile, so a tiled evaluation keeps
memory O(T)).

Shapes: B batch, H query heads, T tokens, Tk keys, d model width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc._validation import check_positive_int
from posenc.encodings.base import (
    Hook,
    PositionalEncoding,
    bias_kernel_attention,
    gate_input,
    layer_of_copies,
    sum_dtype,
)
from posenc.kernels.fused_bias import FusedBias


def cumulative_log_gates(gates: Tensor) -> tuple[Tensor, Tensor | None]:
    """c = cumsum(log f) over the keys (the last axis) of ``gates`` (B, H, Tk), as (hi, lo):
    float32 hi = c rounded, lo = the rest (None for float64 gates, whose c is exact enough
    alone), accumulated in float64 (float32 on MPS). Shared with PaTH-FoX (encodings/path.py)."""
    total = torch.cumsum(gates.to(sum_dtype(gates)), dim=-1)  # (B, H, Tk)
    if gates.dtype == torch.float64 or total.dtype != torch.float64:
        return total.to(gates.dtype), None
    hi = total.float()
    # hi is c rounded to float32; lo holds what the rounding dropped (no gradient flows
    # through lo: d lo / d c = 1 - 1), so hi_i - hi_j + lo_i - lo_j is c_i - c_j to float32
    return hi, (total - hi.double()).float()


def log_gate_difference(state: tuple[Tensor, Tensor | None], q_index: Tensor, k_index: Tensor) -> Tensor:
    """c_i - c_j = sum of log f over the keys j+1..i: (B, H, len(q_index), len(k_index)), from
    :func:`cumulative_log_gates`'s (hi, lo) at key indices ``q_index`` (the queries' own
    tokens) and ``k_index``."""
    hi, lo = state
    difference = hi[..., q_index].unsqueeze(-1) - hi[..., k_index].unsqueeze(-2)
    if lo is not None:
        # in place: no second tile; near the diagonal hi_i - hi_j is exact (Sterbenz), so
        # adding the low parts back recovers the difference the float32 c would lose
        difference = difference.add_(lo[..., q_index].unsqueeze(-1)).sub_(lo[..., k_index].unsqueeze(-2))
    return difference


class FoX(PositionalEncoding):
    """Forgetting Attention's forget gate (Lin et al. 2025, section 2, eqs. (3)-(6); reference
    code: zhixuan-lin/forgetting-transformer, ``ForgettingAttentionLayer`` with
    ``fgate_type="full"`` and ``forgetting_attention``)::

        log f_t = logsigmoid(w_h . x_t + b_h)           per head h, from the layer input x_t
        D_ij    = c_i - c_j,  c_t = sum_{l <= t} log f_l   (= sum_{l=j+1..i} log f_l, j <= i)
        a_ij    = softmax_j(q_i . k_j / sqrt(D) + D_ij)

    ``fgate_proj`` is ``Linear(d_model, num_heads)`` with a bias, as the reference's; x is the
    attention layer's input after its normalization (the posenc LM passes ``ln_attn(x)``, as
    the reference passes the normed hidden state). The reference initialises the weight
    normal(0, 0.02) and the bias to zero (f = 1/2 at the start); so does this class (and the
    posenc LM's own init). No RoPE and no other position signal: FoX is a NoPE transformer
    with forget gates (the paper's "FoX (LLaMA)"); the Pro block's output gate, QK-norm and
    key shifts are architecture, not position, and are not here.

    Conventions. The query's own token is the key at index i + Tk - Tq (queries are the last
    keys, as the causal mask and the reference kernel's ``P_SEQ``). c is accumulated in
    float64 and kept as two float32 parts (c = hi + lo), so that c_i - c_j loses nothing to
    cancellation however long the sequence (the reference accumulates c in float32 over the
    whole sequence: at |c| ~ 1e4, its D_ij near the diagonal is off by ~1e-3). Bidirectional
    use (``causal=False``, not in the paper) gets D_ij = -|c_i - c_j|, the gates between the
    two tokens either way. Positions are not read: a KV cache, packed rows (a document mask)
    and left padding give the same D_ij, since everything before j cancels.

    Args:
        d_model: the width of x.
        num_heads: H, one gate per query head.
        num_layers: the number of attention layers, each with its own gate (:meth:`for_layer`);
            1 (default): one gate shared by every layer of a model.

    Hook: ``gate``. Cost per layer: a (B T d) x (d H) projection and an O(B H T) cumulative
    sum, then the bias c_i - c_j on each tile of the logits the attention asks for: the whole
    (B, H, Tq, Tk) or one (B, H, block, Tk) tile at a time; no per-score (score_mod) form.

    Raises:
        ValueError: a size not an integer >= 1 (construction); x without last dimension d_model
            or not 3-D (:meth:`gate`); a layer outside 0..num_layers-1.
    """

    name = "fox"
    hooks = frozenset({Hook.GATE})
    model_sizes = ("d_model", "num_heads", "num_layers")

    def __init__(self, d_model: int, num_heads: int, num_layers: int = 1) -> None:
        super().__init__()
        for argname, value in (("d_model", d_model), ("num_heads", num_heads), ("num_layers", num_layers)):
            check_positive_int(value, argname)
        self.d_model, self.num_heads, self.num_layers = d_model, num_heads, num_layers
        self.fgate_proj = nn.Linear(d_model, num_heads, bias=True)
        nn.init.normal_(self.fgate_proj.weight, std=0.02)
        nn.init.zeros_(self.fgate_proj.bias)
        self.deeper_layers = nn.ModuleList(FoX(d_model, num_heads) for _ in range(num_layers - 1))

    def for_layer(self, layer: int) -> PositionalEncoding:
        """Layer 0 is this instance; layer l > 0 the l-th of ``deeper_layers``. With
        num_layers = 1 every layer shares this gate."""
        return layer_of_copies(self, self.deeper_layers, layer)

    def gate(self, x: Tensor) -> Tensor:
        """log f_t: x (B, T, d_model) -> (B, H, T), float32 (float64 for float64 x and
        parameters), as the reference (``logsigmoid(fgate_proj(x).float())``). x of a narrower
        dtype than the parameters (bfloat16 activations, float32 weights) is widened to theirs,
        as the other encodings compute in the wider dtype."""
        x, wide = gate_input(x, self.d_model, self.fgate_proj.weight)
        return F.logsigmoid(self.fgate_proj(x).to(wide)).transpose(-2, -1)  # (B, H, T)

    def prepare_gates(self, gates: Tensor) -> tuple[Tensor, Tensor | None]:
        """c = cumsum(log f) over the keys, as (hi, lo): :func:`cumulative_log_gates`."""
        return cumulative_log_gates(gates)

    def gate_bias(self, state, q_index, k_index, *, causal):
        """D_ij = c_i - c_j (-|c_i - c_j| when not causal): (B, H, len(q_index), len(k_index))."""
        bias = log_gate_difference(state, q_index, k_index)
        return bias if causal else -bias.abs()

    def fused_bias(self, causal: bool = True, gate_state: object = None) -> FusedBias | None:
        """``gate``: c_i - c_j from :meth:`prepare_gates`'s (hi, lo); None when not causal (the
        bidirectional -|c_i - c_j| has no fused form)."""
        if not causal or gate_state is None:
            return None
        hi, lo = gate_state
        return FusedBias("gate", {"hi": hi, "lo": lo})

    #: The fused CPU kernel's whole attention with this bias, with autograd (float32, consecutive
    #: positions, the kernel built (at the first call by default); None elsewhere).
    fused_attention = bias_kernel_attention

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, num_heads={self.num_heads}, num_layers={self.num_layers}"
