"""Query blocks, each with its own bias tile (posenc.attention.tiling): memory O(T) instead of
the (H, Tq, Tk) bias, keys wholly in a block's future skipped.

Without a gradient to compute, each block is one SDPA call. With one (training), the call is
:class:`BlockedAttention`, an autograd function that keeps only q, k, v, the output and the
log-sum-exp of each query row, O(B H T), and recomputes each block's tile, scores and
probabilities in the backward, as FlashAttention does (Dao et al. 2022, "FlashAttention",
Algorithm 4; Dao 2023, "FlashAttention-2", Algorithm 2): training memory O(T) as well.

Soft-capping and sinks (:mod:`posenc.attention.softcap_sinks`) enter each block's scores and
log-sum-exp: the scores (bias tile added) are capped before the softmax, and a row's output is
scaled by sigmoid(L - s_h) with L + log(1 + exp(s_h - L)) kept as its log-sum-exp, so that the
backward's exp(S - L) and rowsum(dO * O) are the sinked ones. With either, no block is an SDPA
call (SDPA cannot cap, and gives no log-sum-exp for the sink).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc.attention.masks import as_4d, causal_mask
from posenc.attention.softcap_sinks import sink_factor, softcap_logits
from posenc.attention.tiling import BLOCKED_TILE_ELEMENTS, Block, query_blocks
from posenc.encodings.base import Hook, PositionalEncoding


def unsupported(encoding: PositionalEncoding | None, *, mask: Tensor | None, dropout_p: float = 0.0,
                softcap: float | None = None, sinks: Tensor | None = None) -> str | None:
    """Content terms need the whole score matrix (and Shaw's the probabilities). Soft-capping
    and sinks are served."""
    if encoding is not None and Hook.CONTENT in encoding.hooks:
        return "backend='blocked' has no content terms; use backend='eager' or 'auto'"
    return None


class _Call(NamedTuple):
    """What every block of one call is made from (none of it differentiated but through the
    encoding's parameters and the gate state)."""

    encoding: PositionalEncoding | None  # with the score_bias hook, else None
    gated: PositionalEncoding | None
    gate_state: object
    q_positions: Tensor
    k_positions: Tensor
    causal: bool
    mask: Tensor | None
    scale: float
    softcap: float | None = None


def run(q: Tensor, k: Tensor, v: Tensor, *, encoding: PositionalEncoding | None, q_positions: Tensor,
        k_positions: Tensor, causal: bool, mask: Tensor | None, scale: float, dropout_p: float = 0.0,
        gate_state: object = None, softcap: float | None = None, sinks: Tensor | None = None) -> Tensor:
    biased = encoding if encoding is not None and Hook.SCORE_BIAS in encoding.hooks else None
    call = _Call(biased, encoding, gate_state, q_positions, k_positions, causal, mask, scale, softcap)
    # Dropout would need each block's random mask again in the backward, and torch.compile
    # traces the SDPA blocks as they are: both keep autograd's O(H T^2) saved probabilities.
    if softcap is None and sinks is None:
        fused = _fused(call, q, k, v, dropout_p)
        if fused is not None:
            return fused
    if torch.is_grad_enabled() and not dropout_p and not torch.compiler.is_compiling():
        bias_inputs = _bias_inputs(call)
        if bias_inputs or any(t is not None and t.requires_grad for t in (q, k, v, sinks)):
            return BlockedAttention.apply(q, k, v, sinks, call, *bias_inputs)
    if softcap is not None or sinks is not None:
        return _explicit(call, q, k, v, sinks, dropout_p)
    out = torch.empty_like(q)
    for block in _blocks(call, q, grad=torch.is_grad_enabled()):
        rows = q[:, :, block.start:block.stop]
        keys, values = k[:, :, :block.key_end], v[:, :, :block.key_end]
        block_out = F.scaled_dot_product_attention(rows.flip(2) if block.descending else rows, keys, values,
                                                   attn_mask=block.mask, scale=scale, dropout_p=dropout_p,
                                                   enable_gqa=k.shape[1] != q.shape[1])
        out[:, :, block.start:block.stop] = block_out.flip(2) if block.descending else block_out
        del block, block_out  # before the next block's tile is made: one tile alive at a time
    return out


def _explicit(call: _Call, q: Tensor, k: Tensor, v: Tensor, sinks: Tensor | None, dropout_p: float) -> Tensor:
    """The blocks with soft-capping or sinks outside :class:`BlockedAttention` (no gradient, or
    dropout, or inside torch.compile): each block's probabilities out of place (autograd, where
    it records, saves them), capped, scaled by the sink factor, dropped out, times the values."""
    wide = torch.promote_types(q.dtype, torch.float32)
    batch, heads = q.shape[0], q.shape[1]
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype, device=q.device)
    for block in _blocks(call, q, grad=torch.is_grad_enabled()):
        keys, values = k[:, :, :block.key_end], v[:, :, :block.key_end]
        probs, lse = _differentiable_block(_rows(q, block), keys, block.mask, call.scale, wide, softcap=call.softcap)
        if sinks is not None:
            probs = probs * sink_factor(lse.squeeze(-1), sinks)
        if dropout_p:
            probs = F.dropout(probs, p=dropout_p)
        block_out = torch.matmul(_grouped(probs, k.shape[1]), values.to(wide)).view(batch, heads, -1, v.shape[-1])
        out[:, :, block.start:block.stop] = (block_out.flip(2) if block.descending else block_out).to(q.dtype)
        del block, probs, block_out
    return out


def _fused(call: _Call, q: Tensor, k: Tensor, v: Tensor, dropout_p: float) -> Tensor | None:
    """The whole attention from the encoding's own fused attention (``fused_attention``, an
    optional capability: a CPU kernel computes the bias inside the attention, no tile written;
    with autograd where the encoding's kernel has a backward: T5, ALiBi, Kerple, FoX), or None
    where the encoding has none or declines the call: then the blocks run."""
    fused = getattr(call.gated, "fused_attention", None)
    if fused is None or dropout_p or torch.compiler.is_compiling():
        return None
    return fused(q, k, v, q_positions=call.q_positions, k_positions=call.k_positions, causal=call.causal,
                 mask=call.mask, scale=call.scale, gate_state=call.gate_state)


def _bias_inputs(call: _Call) -> tuple[Tensor, ...]:
    """The tensors a tile is differentiated in: the encoding's parameters that require grad
    (a score bias's, or a gate encoding's), and the gate state's tensors that do (FoX's
    cumulative log forget gates, computed from the model's hidden state)."""
    found: dict[int, Tensor] = {}
    if torch.is_grad_enabled():
        for owner in (call.encoding, call.gated if call.gate_state is not None else None):
            if owner is not None:
                found.update((id(p), p) for p in owner.parameters() if p.requires_grad)
        state = call.gate_state
        for t in (state if isinstance(state, (tuple, list)) else (state,)):
            if isinstance(t, Tensor) and t.requires_grad:
                found[id(t)] = t
    return tuple(found.values())


def _detached_state(call: _Call, bias_inputs: tuple[Tensor, ...]) -> tuple[_Call, list[Tensor]]:
    """The call with its gate state's tensors cut from the graph that made them (as new leaves
    requiring grad), and the tensors to differentiate the tiles in, in ``bias_inputs``' order.

    Why: a gate state's tensors are made from one another (FoX's lo from hi); differentiating
    a tile in the state's tensors themselves would run those links too (freeing the model's
    graph, and counting a gradient twice once autograd runs them again from ours)."""
    leaves = {id(t): t.detach().requires_grad_() for t in bias_inputs if t.grad_fn is not None}
    state = call.gate_state
    if isinstance(state, (tuple, list)):
        state = type(state)(leaves.get(id(t), t) if isinstance(t, Tensor) else t for t in state)
    elif isinstance(state, Tensor):
        state = leaves.get(id(state), state)
    return call._replace(gate_state=state), [leaves.get(id(t), t) for t in bias_inputs]


def _blocks(call: _Call, q: Tensor, *, grad: bool):
    """The call's query blocks (:func:`~posenc.attention.tiling.query_blocks`), each tile made
    with autograd on or off (``grad``) and the caller's mode left alone between blocks."""
    blocks = query_blocks(call.encoding, call.q_positions, call.k_positions, num_heads=q.shape[1],
                          batch=q.shape[0], causal=call.causal, mask=call.mask, dtype=q.dtype, gated=call.gated,
                          gate_state=call.gate_state)
    while True:
        with torch.set_grad_enabled(grad):
            block = next(blocks, None)
        if block is None:
            return
        yield block
        del block


def _rows(x: Tensor, block: Block) -> Tensor:
    """x's rows of the block (dim 2), in the order of the block's mask rows."""
    rows = x[:, :, block.start:block.stop]
    return rows.flip(2) if block.descending else rows


def _scores(rows: Tensor, keys: Tensor, mask: Tensor | None, scale: float, wide: torch.dtype) -> Tensor:
    """scale q.k^T + mask (a boolean mask as -inf, a float tile added) of one block, in ``wide``:
    rows (B, H, n, D), keys (B, H_kv, Tk', D), the H / H_kv query heads of a key-value head
    one product. A new tensor, written in place."""
    batch, heads, n, _ = rows.shape
    grouped = _grouped(rows.to(wide) * scale, keys.shape[1])
    scores = torch.matmul(grouped, keys.to(wide).transpose(-2, -1)).view(batch, heads, n, keys.shape[2])
    if mask is not None and mask.dtype == torch.bool:
        scores.masked_fill_(~mask, float("-inf"))
    elif mask is not None:
        scores.add_(mask.detach())
    return scores


def _probabilities(rows: Tensor, keys: Tensor, mask: Tensor | None, scale: float, wide: torch.dtype,
                   softcap: float | None = None) -> tuple[Tensor, Tensor]:
    """softmax(cap(scale q.k^T + mask)) of one block and its log-sum-exp (B, H, n, 1), in
    ``wide`` (:func:`_scores`; cap: :func:`~posenc.attention.softcap_sinks.softcap_logits`, the
    identity without ``softcap``)."""
    scores = _scores(rows, keys, mask, scale, wide)
    if softcap is not None:
        scores = softcap_logits(scores, softcap)
    # softmax as torch computes it (max subtracted, exp, sum, divide), one exp pass: the log-sum-exp
    # is max + log(sum); a row that sees no key (only under a bias of -inf) gets zero weights, not NaN
    top = scores.amax(dim=-1, keepdim=True)
    top = top.masked_fill(top == float("-inf"), 0.0)
    probs = _exp(scores.sub_(top))
    total = probs.sum(dim=-1, keepdim=True)
    probs.div_(total.clamp(min=torch.finfo(total.dtype).tiny))
    lse = top + total.log()
    return probs, lse.masked_fill(lse == float("-inf"), 0.0)


def _capped_scores(rows: Tensor, keys: Tensor, mask: Tensor | None, scale: float, wide: torch.dtype,
                   softcap: float | None) -> tuple[Tensor, Tensor | None]:
    """The backward's scores S of one block (:func:`_scores`, capped when ``softcap`` is given)
    and the cap's slope dS/dR = 1 - tanh^2(R / c) (0 at masked entries), or None without a cap."""
    raw = _scores(rows, keys, mask, scale, wide)
    if softcap is None:
        return raw, None
    tanh = torch.tanh(raw / softcap)
    return softcap_logits(raw, softcap), 1 - tanh.square()


def _exp(x: Tensor) -> Tensor:
    """exp(x) in place, the entries whose exp is below the dtype's smallest normal number
    (x < log(tiny): -87.3 in float32) flushed to 0: torch's vectorized exp is about ten times
    slower on such inputs (far keys under a decaying bias: FoX, ALiBi) than on -inf or others,
    and they would only give subnormal probabilities."""
    return F.threshold_(x, math.log(torch.finfo(x.dtype).tiny), float("-inf")).exp_()


def _grouped(x: Tensor, kv_heads: int) -> Tensor:
    """(B, H, n, X) -> (B, H_kv, (H / H_kv) n, X): query head h = kv (H / H_kv) + g."""
    batch, heads, n, width = x.shape
    return x.reshape(batch, kv_heads, (heads // kv_heads) * n, width)


class BlockedAttention(torch.autograd.Function):
    """softmax(cap(scale q.k^T + bias + mask)) v over query blocks (beside the sinks, when
    given) with a recomputing backward.

    Saved for the backward: q, k, v, the output and the log-sum-exp L of each query row
    (B, H, Tq): O(B H T (D + 1)), never a (Tq, Tk) tensor. The backward walks the query blocks
    again; per block it remakes the bias tile (with autograd on when a parameter or gate needs
    a gradient), the scores, P = exp(S - L), then (FlashAttention's backward)
    dV += P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dO * O)), dQ = scale dS K,
    dK += scale dS^T Q, and hands dS (summed to the tile's shape) to the tile's own autograd
    for the parameters' gradients (``torch.autograd.grad``): one tile alive at a time.

    Soft-capping: S is the capped score c tanh(R / c) of the raw one R (bias included), and
    dR = dS (1 - tanh^2(R / c)) replaces dS above. Sinks: the sink is one more key with logit
    s_h and value 0, so with L and O the sinked ones (L = log(exp(L_keys) + exp(s_h)), O the
    output beside the sink) the formulas hold as they are, and ds_h = -sum over rows of
    exp(s_h - L) rowsum(dO * O).

    Inputs: q (B, H, Tq, D), k and v (B, H_kv, Tk, D), sinks (H,) or None, the call, then the
    tensors the tiles are differentiated in. Arithmetic in float32 (float64 for float64
    inputs); output in q's dtype.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, sinks: Tensor | None, call: _Call,
                *bias_inputs: Tensor) -> Tensor:
        wide = torch.promote_types(q.dtype, torch.float32)
        batch, heads, num_queries, _ = q.shape
        out = q.new_empty(batch, heads, num_queries, v.shape[-1])
        lse = torch.empty(batch, heads, num_queries, 1, dtype=wide, device=q.device)
        # the tiles as the backward remakes them (autograd on when it differentiates them), so
        # that the gradient is the derivative of the very values used here
        for block in _blocks(call, q, grad=bool(bias_inputs)):
            keys, values = k[:, :, :block.key_end], v[:, :, :block.key_end]
            probs, block_lse = _probabilities(_rows(q, block), keys, block.mask, call.scale, wide, softcap=call.softcap)
            block_out = torch.matmul(_grouped(probs, k.shape[1]), values.to(wide)).view(batch, heads, -1, v.shape[-1])
            if sinks is not None:
                block_out = block_out * sink_factor(block_lse.squeeze(-1), sinks.detach())
                block_lse = torch.logaddexp(block_lse, sinks.detach().to(wide).view(1, -1, 1, 1))
            if block.descending:
                block_out, block_lse = block_out.flip(2), block_lse.flip(2)
            out[:, :, block.start:block.stop] = block_out
            lse[:, :, block.start:block.stop] = block_lse
            del block, probs, block_out
        ctx.save_for_backward(q, k, v, out, lse, sinks)
        ctx.call, ctx.bias_inputs = call, bias_inputs
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable  # no double backward: a clear error, not a wrong one
    def backward(ctx, grad_out: Tensor):
        q, k, v, out, lse, sinks = ctx.saved_tensors
        call, bias_inputs = ctx.call, ctx.bias_inputs
        tracked = [i for i, t in enumerate(bias_inputs) if ctx.needs_input_grad[5 + i]]
        wide = lse.dtype
        batch, heads, _, head_dim = q.shape
        kv_heads = k.shape[1]
        grad_out = grad_out.to(wide)
        delta = (grad_out * out.to(wide)).sum(-1, keepdim=True)  # rowsum(dO * O): (B, H, Tq, 1)
        dq = torch.zeros(q.shape, dtype=wide, device=q.device)
        dk = torch.zeros(k.shape, dtype=wide, device=q.device)
        dv = torch.zeros(v.shape, dtype=wide, device=q.device)
        bias_grads: list[Tensor | None] = [None] * len(bias_inputs)
        call, leaves = _detached_state(call, bias_inputs)
        for block in _blocks(call, q, grad=bool(tracked)):
            end = block.key_end
            keys, values = k[:, :, :end].to(wide), v[:, :, :end].to(wide)
            rows, d_out = _rows(q, block).to(wide), _grouped(_rows(grad_out, block), kv_heads)
            scores, cap_slope = _capped_scores(rows, keys, block.mask, call.scale, wide, call.softcap)
            probs = _exp(scores.sub_(_rows(lse, block)))  # P = exp(S - L)
            n = rows.shape[2]
            dv[:, :, :end] += torch.matmul(_grouped(probs, kv_heads).transpose(-2, -1), d_out)
            d_scores = torch.matmul(d_out, values.transpose(-2, -1)).view(batch, heads, n, end)
            d_scores = d_scores.sub_(_rows(delta, block)).mul_(probs)  # dS = P * (dP - rowsum(dO * O))
            if cap_slope is not None:  # through the cap: dR = dS (1 - tanh^2(R / c))
                d_scores.mul_(cap_slope)
            del probs, scores, cap_slope
            grouped_ds = _grouped(d_scores, kv_heads)
            dk[:, :, :end] += torch.matmul(grouped_ds.transpose(-2, -1), _grouped(rows, kv_heads)).mul_(call.scale)
            block_dq = torch.matmul(grouped_ds, keys).mul_(call.scale).view(batch, heads, n, head_dim)
            dq[:, :, block.start:block.stop] = block_dq.flip(2) if block.descending else block_dq
            tile = block.mask
            if tracked and tile is not None and tile.requires_grad:
                inputs = [leaves[i] for i in tracked]
                grads = torch.autograd.grad(tile, inputs, grad_outputs=d_scores.sum_to_size(tile.shape).to(tile.dtype),
                                            allow_unused=True)
                for i, grad in zip(tracked, grads):
                    if grad is not None:
                        bias_grads[i] = grad if bias_grads[i] is None else bias_grads[i] + grad
            del block, tile, d_scores, grouped_ds, block_dq
        d_sinks = None
        if sinks is not None and ctx.needs_input_grad[3]:
            # the sink's probability exp(s_h - L) times (its value 0 - rowsum(dO * O)), summed over rows
            d_sinks = -(torch.exp(sinks.to(wide).view(1, -1, 1, 1) - lse) * delta).sum(dim=(0, 2, 3)).to(sinks.dtype)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), d_sinks, None, *bias_grads


def run_with_lse(q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None, scale: float,
                 causal: bool = False, softcap: float | None = None) -> tuple[Tensor, Tensor]:
    """Plain attention and its log-sum-exp (a branch of branch-merge attention) over query
    blocks, as :func:`posenc.attention.eager.run_with_lse` (same arguments and returns): blocks
    sized so that one block's scores hold at most
    :data:`~posenc.attention.tiling.BLOCKED_TILE_ELEMENTS` entries, each block's softmax and
    log-sum-exp computed from its scores alone (a row's whole key range is in its block); with
    ``causal`` the keys wholly after a block are skipped (the mask must then hold the causal
    mask). Without a gradient to take, :func:`_probabilities` (in place, one exp pass); with
    one, the same out of place, and autograd saves every block's probabilities (no
    recomputing backward here). ``softcap``: each block's scores capped first."""
    batch, heads, num_queries, num_keys = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    if mask is None and causal:
        mask = causal_mask(num_queries, num_keys, q.device)
    mask = None if mask is None else as_4d(mask)
    wide = torch.promote_types(q.dtype, torch.float32)
    differentiable = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    rows = max(1, BLOCKED_TILE_ELEMENTS // max(1, batch * heads * num_keys))
    outputs, lses = [], []
    for start in range(0, num_queries, rows):  # a few blocks per call, as query_blocks cuts them
        stop = min(num_queries, start + rows)
        key_end = min(num_keys, stop + num_keys - num_queries) if causal else num_keys
        block_mask = None
        if mask is not None:
            block_mask = mask[..., start:stop, :key_end] if mask.shape[-2] > 1 else mask[..., :key_end]
        block = _differentiable_block if differentiable else _probabilities
        probs, lse = block(q[:, :, start:stop], k[:, :, :key_end], block_mask, scale, wide, softcap=softcap)
        out = torch.matmul(_grouped(probs, k.shape[1]), v[:, :, :key_end].to(wide)).view(batch, heads, stop - start, -1)
        lse = lse.squeeze(-1)
        if block_mask is not None:
            lse = lse.masked_fill(~block_mask.any(dim=-1), float("-inf"))
        outputs.append(out)
        lses.append(lse.expand(batch, heads, stop - start))
    return torch.cat(outputs, dim=2), torch.cat(lses, dim=2)


def _differentiable_block(rows: Tensor, keys: Tensor, mask: Tensor | None, scale: float,
                          wide: torch.dtype, softcap: float | None = None) -> tuple[Tensor, Tensor]:
    """:func:`_probabilities` out of place (autograd through it): probabilities (B, H, n, Tk')
    and log-sum-exp (B, H, n, 1), a row without keys giving zeros; a float ``mask`` (a bias
    tile) is added, differentiably."""
    batch, heads, n, _ = rows.shape
    grouped = _grouped(rows.to(wide) * scale, keys.shape[1])
    scores = torch.matmul(grouped, keys.to(wide).transpose(-2, -1)).view(batch, heads, n, keys.shape[2])
    if mask is not None and mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))
    elif mask is not None:
        scores = scores + mask
    scores = softcap_logits(scores, softcap)
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    probs = torch.exp(scores - torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse)))
    return probs, lse
