"""torch's FlexAttention with the encoding's ``score_mod`` and a block mask: every score bias
without a (Tq, Tk) tensor, compiled once per shape family.

The block mask is the causal mask (bottom-right aligned, as every backend), and-ed with the
user's ``mask``: a mask_mod (``posenc.masks``: documents, key padding, sliding window, chunks;
or any ``mask_mod(b, h, q_idx, kv_idx)``), evaluated by ``create_block_mask`` block by block,
or a boolean tensor, looked up by the mask_mod (the tensor is the caller's; nothing (Tq, Tk) is
made here). Key blocks that no query of a query block may see are skipped.

Compilation (docs/fast_attention.md has the measurements): ``flex_attention`` and
``create_block_mask`` are each compiled once per process with ``dynamic=True``, so a new
sequence length reuses the compiled kernels (torch.compile's recompile counter stays at one
graph per encoding); calls with a side of at most :data:`FLEX_COMPILE_MIN_LENGTH` tokens run
uncompiled. Inside the caller's own ``torch.compile`` nothing is compiled here: FlexAttention
is traced into the caller's graph.

Gradients: on CUDA, FlexAttention has a backward for q, k, v and for the score_mod's learned
parameters (T5's table, Kerple's and FIRE's parameters). torch's CPU FlexAttention has no
backward for q, k and v (a ValueError here says so); learned-bias gradients alone run through
the uncompiled path on the CPU (torch 2.13's compiled CPU kernel fails on them).

Soft-capping is one more score_mod, composed after the encoding's (the cap of the biased
score: :func:`~posenc.attention.softcap_sinks.softcap_logits`); sinks scale the output by
sigmoid(L - s_h) from FlexAttention's own log-sum-exp L (``return_aux``), so the sinks get
their gradient from autograd whatever FlexAttention's lse backward does.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable

import torch
from torch import Tensor

from posenc.attention.masks import is_mask_mod
from posenc.attention.softcap_sinks import sink_factor, softcap_logits
from posenc.encodings.base import Hook, PositionalEncoding
from posenc.errors import InvalidArgument
from posenc.mask_rules import causal_rule

#: Compile FlexAttention only when both the queries and the keys are longer than this (one
#: 128-token block of FlexAttention): with a single block on a side, dynamo specializes the
#: block mask's size-1 dimension and recompiles at the next length (and torch 2.13's CPU
#: kernel then fails to build with dynamic shapes). Shorter calls (a decoding step, a short
#: prompt) run FlexAttention uncompiled, which materializes their small score matrix.
FLEX_COMPILE_MIN_LENGTH = 128

#: Head dim of the visibility pass of :func:`any_visible` (FlexAttention's smallest tile).
_FLAG_DIM = 16

_compiled: dict[str, Callable] = {}
#: The last causal (or tensor-mask) block mask, reused while the call's shapes (and the mask
#: tensor, unmodified) stay the same: every layer of a forward pass asks for the same one.
_last_block_mask: tuple | None = None


def unsupported(encoding: PositionalEncoding | None, *, mask=None, dropout_p: float = 0.0,
                softcap: float | None = None, sinks: Tensor | None = None) -> str | None:
    """No content terms (no hook for them in a score_mod that sees one score), no dropout.
    Every mask is served: a mask_mod natively, a boolean tensor through a lookup; soft-capping
    and sinks too."""
    if encoding is not None and Hook.CONTENT in encoding.hooks:
        return "backend='flex' has no content terms; use backend='eager' or 'auto'"
    if encoding is not None and Hook.GATE in encoding.hooks:
        return "backend='flex' has no gate bias; use backend='blocked', 'sdpa', 'eager' or 'auto'"
    if dropout_p:
        return "backend='flex' has no attention dropout (dropout_p); use backend='blocked', 'sdpa', 'eager' or 'auto'"
    return None


def _flex():
    try:
        from torch.nn.attention.flex_attention import (
            and_masks,
            create_block_mask,
            flex_attention,
        )
    except ImportError as err:  # pragma: no cover - torch < 2.5
        raise InvalidArgument("backend='flex' needs torch.nn.attention.flex_attention (torch >= 2.5)") from err
    return and_masks, create_block_mask, flex_attention


def compiled(name: str) -> Callable:
    """``torch.compile(fn, dynamic=True)`` of FlexAttention's ``flex_attention`` or
    ``create_block_mask``, made once per process: one compiled kernel for every length, with
    Python floats traced as constants (:func:`_floats_as_constants`)."""
    if name not in _compiled:
        _, create_block_mask, flex_attention = _flex()
        fn = {"flex_attention": flex_attention, "create_block_mask": create_block_mask}[name]
        _compiled[name] = _floats_as_constants(torch.compile(fn, dynamic=True))
    return _compiled[name]


def _floats_as_constants(fn: Callable) -> Callable:
    """``fn`` traced with ``torch._dynamo.config.specialize_float``: the call's ``scale`` and the
    floats a score_mod reads (FIRE's ``eps``, ALiBi's ``scale``) become constants of the graph
    (a recompile if one changes: they are fixed per model). Unspecialized (the default since
    torch 2.6) they enter the score_mod's subgraph as SymFloats, which FlexAttention's lowering
    refuses: on torch 2.11 + CUDA every backward through compiled flex failed
    ("all unwrapped values must be FakeTensor"), and FIRE's forward failed on CPU and CUDA
    ("unbacked_bindings"); docs/results.md, "On a GPU"."""
    if not hasattr(torch._dynamo.config, "specialize_float"):  # pragma: no cover - older torch
        return fn

    def call(*args, **kwargs):
        with torch._dynamo.config.patch(specialize_float=True):
            return fn(*args, **kwargs)

    return call


def mask_mod_for(mask, *, causal: bool, batch: int, heads: int, num_queries: int, num_keys: int,
                 device) -> tuple[Callable | None, int | None, int | None]:
    """The call's mask as one mask_mod, and the batch and head sizes its block mask needs (None:
    the same for every row / head). ``mask``: None, a mask_mod (causal added here) or a 4-D
    boolean tensor with the causal mask already in it (:func:`posenc.attention`'s combined mask).
    """
    and_masks = _flex()[0]
    mods, mask_batch, mask_heads = [], None, None
    if causal and not isinstance(mask, Tensor):
        # a 0-d tensor, not a Python int: a compiled kernel would specialize on the int's value
        offset = torch.tensor(num_keys - num_queries, device=device)

        def causal_mod(b, h, q_idx, kv_idx):
            return causal_rule(q_idx, kv_idx, offset)

        mods.append(causal_mod)
    if isinstance(mask, Tensor):
        mods.append(_tensor_mask_mod(mask, batch, heads, num_queries, num_keys))
        mask_batch = batch if mask.shape[0] > 1 else None
        mask_heads = heads if mask.shape[1] > 1 else None
    elif mask is not None:
        mods.append(mask)
        mask_batch = batch  # a mask_mod is evaluated per row and broadcast over heads (h = 0)
    if not mods:
        return None, None, None
    return (mods[0] if len(mods) == 1 else and_masks(*mods)), mask_batch, mask_heads


def _tensor_mask_mod(mask: Tensor, batch: int, heads: int, num_queries: int, num_keys: int) -> Callable:
    """A 4-D boolean mask (B or 1, H or 1, Tq or 1, Tk) read by a mask_mod."""
    # expanded (no copy) so that every (b, h) the kernel asks for is a valid index
    full = mask.expand(batch, heads, num_queries, num_keys)

    def tensor_mod(b, h, q_idx, kv_idx):
        return full[b, h, q_idx, kv_idx]

    return tensor_mod


def with_encoding_mask(mask, encoding: PositionalEncoding | None, q_positions: Tensor, k_positions: Tensor, *,
                       batch: int, heads: int):
    """The user's ``mask`` (None, a mask_mod, or a checked 4-D boolean tensor) and-ed with the
    encoding's ``mask`` hook (its :meth:`~posenc.PositionalEncoding.mask_mod` at the call's
    positions) as one mask_mod, or ``mask`` unchanged for an encoding without the hook."""
    positional = encoding.mask_mod(q_positions, k_positions) if encoding is not None else None
    if positional is None:
        return mask
    if mask is None:
        return positional
    if isinstance(mask, Tensor):
        mask = _tensor_mask_mod(mask, batch, heads, q_positions.shape[-1], k_positions.shape[-1])
    return _flex()[0](mask, positional)


def _block_mask(mask, *, causal, batch, heads, num_queries, num_keys, device, use_compiled: bool):
    global _last_block_mask
    mask_mod, mask_batch, mask_heads = mask_mod_for(mask, causal=causal, batch=batch, heads=heads,
                                                    num_queries=num_queries, num_keys=num_keys, device=device)
    if mask_mod is None:
        return None
    create = compiled("create_block_mask") if use_compiled else _flex()[1]
    if torch.compiler.is_compiling() or is_mask_mod(mask):
        # a mask_mod may read tensors changed in place since: never reused
        return create(mask_mod, mask_batch, mask_heads, num_queries, num_keys, device=device)
    key = (causal, batch, heads, num_queries, num_keys, str(device), use_compiled,
           None if mask is None else mask._version)
    if _last_block_mask is not None and _last_block_mask[0] == key:
        ref = _last_block_mask[1]
        if (mask is None and ref is None) or (ref is not None and ref() is mask):
            return _last_block_mask[2]
    block_mask = create(mask_mod, mask_batch, mask_heads, num_queries, num_keys, device=device)
    _last_block_mask = (key, None if mask is None else weakref.ref(mask), block_mask)
    return block_mask


def _attend(q: Tensor, k: Tensor, v: Tensor, *, score_mod, mask, causal: bool, scale: float,
            learned_bias: bool, return_lse: bool = False):
    """FlexAttention on (B, H, Tq, D), (B, H_kv, Tk, D): compiled, uncompiled or traced; with
    ``return_lse``, (out, lse (B, H, Tq)) as FlexAttention returns them."""
    lse_kw = _lse_request() if return_lse else {}
    flex_attention = _flex()[2]
    batch, heads, num_queries, _ = q.shape
    num_keys = k.shape[2]
    shapes = {"causal": causal, "batch": batch, "heads": heads, "num_queries": num_queries, "num_keys": num_keys,
              "device": q.device}
    gqa = k.shape[1] != heads
    if torch.compiler.is_compiling():
        # inside the caller's torch.compile, flex_attention is traced as one higher-order op
        # and compiled with the caller's graph: no nested compile, no warnings context
        block_mask = _block_mask(mask, use_compiled=False, **shapes)
        return _with_lse(flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=gqa, **lse_kw), lse_kw)
    # torch 2.13's compiled CPU kernel refuses learned-bias gradients and the log-sum-exp
    cpu_uncompiled = q.device.type == "cpu" and (learned_bias or return_lse)
    use_compiled = min(num_queries, num_keys) > FLEX_COMPILE_MIN_LENGTH and not cpu_uncompiled
    if not use_compiled:
        # the uncompiled flex_attention (scores materialized, small here) is exact
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            block_mask = _block_mask(mask, use_compiled=False, **shapes)
            return _with_lse(flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=gqa, **lse_kw), lse_kw)
    block_mask = _block_mask(mask, use_compiled=True, **shapes)
    return _with_lse(compiled("flex_attention")(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=gqa, **lse_kw), lse_kw)


def run(q: Tensor, k: Tensor, v: Tensor, *, encoding: PositionalEncoding | None, q_positions: Tensor,
        k_positions: Tensor, causal: bool, mask=None, scale: float, dropout_p: float = 0.0,
        gate_state: object = None, softcap: float | None = None, sinks: Tensor | None = None) -> Tensor:
    score_mod, learned_bias = None, False
    if encoding is not None and Hook.SCORE_BIAS in encoding.hooks:
        score_mod = encoding.score_mod(q_positions, k_positions)
        if score_mod is None:
            raise InvalidArgument(f"backend='flex' needs the encoding's score_mod(); {type(encoding).__name__} has none")
        learned_bias = torch.is_grad_enabled() and any(p.requires_grad for p in encoding.parameters())
    q, k, v = _cpu_inputs(q, k, v)
    score_mod = capped_score_mod(score_mod, softcap)
    if sinks is None:
        return _attend(q, k, v, score_mod=score_mod, mask=mask, causal=causal, scale=scale, learned_bias=learned_bias)
    out, lse = _attend(q, k, v, score_mod=score_mod, mask=mask, causal=causal, scale=scale, learned_bias=learned_bias,
                       return_lse=True)
    return (out * sink_factor(lse, sinks)).to(q.dtype)


def capped_score_mod(score_mod, softcap: float | None):
    """``score_mod`` (or the identity, when None) followed by the soft-cap c tanh(s / c); the
    score_mod itself without ``softcap``."""
    if softcap is None:
        return score_mod

    def capped(score, b, h, q_idx, kv_idx):
        if score_mod is not None:
            score = score_mod(score, b, h, q_idx, kv_idx)
        return softcap_logits(score, softcap)

    return capped


def _cpu_inputs(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v as torch's CPU FlexAttention takes them: detached under no_grad (it refuses
    inputs that require grad even when none is taken); refused when a q, k, v gradient is
    wanted (it has no such backward on the CPU)."""
    if q.device.type != "cpu":
        return q, k, v
    if not torch.is_grad_enabled():
        return q.detach(), k.detach(), v.detach()
    if q.requires_grad or k.requires_grad or v.requires_grad:
        raise InvalidArgument(
            f"backend='flex' has no backward for q, k, v on the CPU (torch {torch.__version__}'s FlexAttention refuses it); "
            "use backend='blocked', 'eager' or 'auto' to train on the CPU, or call it under torch.no_grad()"
        )
    return q, k, v


def _lse_request() -> dict:
    """The keyword asking FlexAttention for the log-sum-exp: ``return_aux=AuxRequest(lse=True)``
    where torch has it (``return_lse`` is deprecated there), else ``return_lse=True``."""
    try:
        from torch.nn.attention.flex_attention import AuxRequest
    except ImportError:  # pragma: no cover - older torch
        return {"return_lse": True}
    return {"return_aux": AuxRequest(lse=True)}


def _with_lse(result, lse_kw: dict):
    """FlexAttention's result as ``out`` (no lse asked) or ``(out, lse)``."""
    if "return_aux" in lse_kw:
        out, aux = result
        return out, aux.lse
    return result


def run_with_lse(q: Tensor, k: Tensor, v: Tensor, *, mask, scale: float, causal: bool = False,
                 softcap: float | None = None) -> tuple[Tensor, Tensor]:
    """Plain attention and its log-sum-exp (a branch of branch-merge attention) from
    FlexAttention's ``return_lse=True``: out (B, H, Tq, D) in q's dtype, lse (B, H, Tq) (natural
    log; -inf for a row with no key, whose output is 0). ``mask``: None, a mask_mod or a 4-D
    bool tensor; with ``causal`` the causal mask is and-ed in (for a mask_mod or None). No
    (Tq, Tk) tensor is made for a mask_mod on CUDA; on the CPU FlexAttention runs uncompiled
    (torch 2.13's compiled CPU kernel has no log-sum-exp: "return_lse is not supported yet"),
    which materializes the scores. As :func:`run`: no q, k, v backward on the CPU. ``softcap``:
    the scores capped (:func:`capped_score_mod`)."""
    q, k, v = _cpu_inputs(q, k, v)
    return _attend(q, k, v, score_mod=capped_score_mod(None, softcap), mask=mask, causal=causal, scale=scale, learned_bias=False, return_lse=True)


def tensor_mask_mod(mask: Tensor, batch: int, heads: int, num_queries: int, num_keys: int) -> Callable:
    """A 4-D boolean mask (B or 1, H or 1, Tq or 1, Tk) read by a mask_mod."""
    return _tensor_mask_mod(mask, batch, heads, num_queries, num_keys)


def and_mask_mods(*mask_mods: Callable) -> Callable:
    """The mask_mods and-ed into one (FlexAttention's ``and_masks``)."""
    return _flex()[0](*mask_mods)


def any_visible(flags: Tensor, *, mask, causal: bool, num_heads: int, num_queries: int) -> Tensor:
    """(B, H, Tq) bool: whether query row i of head h sees a key whose ``flags`` (B, H_kv, Tk,
    bool) entry is set, under the causal mask and ``mask`` (a mask_mod), without a (Tq, Tk)
    tensor: FlexAttention itself averages the flags over each row's visible keys (zero queries
    and keys: uniform weights, so a set flag gives a positive mean however many keys a row
    sees), with the same block mask. Query head h reads key head h // (H / H_kv).
    Used for the NaN rule (:func:`posenc.attention`) when the mask is a mask_mod."""
    batch, kv_heads, num_keys = flags.shape
    zeros_q = flags.new_zeros((batch, num_heads, num_queries, _FLAG_DIM), dtype=torch.float32)
    zeros_k = flags.new_zeros((batch, kv_heads, num_keys, _FLAG_DIM), dtype=torch.float32)
    values = torch.nn.functional.pad(flags.float().unsqueeze(-1), (0, _FLAG_DIM - 1))
    with torch.no_grad():
        mean = _attend(zeros_q, zeros_k, values, score_mod=None, mask=mask, causal=causal, scale=1.0, learned_bias=False)
    return mean[..., 0] > 0
