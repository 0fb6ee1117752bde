"""Attention with a positional encoding, through the encoding's hooks only.

``attention(q, k, v, encoding)`` checks its arguments, fills in default positions, applies the
encoding's ``rotate`` hook to q and k once, and runs one backend; it never looks at the
encoding's name. An encoding that states branch-merge attention (``encoding.branched``:
:class:`~posenc.encodings.BranchedRoPE`, the training-free context extensions) is rotated per
branch instead (``encoding.attention_branches``), one attention per branch on the backend's
``run_with_lse``, merged by log-sum-exp (:func:`posenc.attention.branches.run_branches`). Shapes: B batch, H heads, Tq queries, Tk keys, D head_dim.

Backends (one module each, in :data:`_BACKENDS`), all with the same two functions:

- ``unsupported(encoding, *, mask, dropout_p) -> str | None``: None when the backend can run a
  call with this encoding, this user mask (checked, 4-D boolean, or None) and this dropout,
  else the ValueError message that :func:`attention` raises;
- ``run(q, k, v, *, encoding, q_positions, k_positions, causal, mask, scale, dropout_p,
  gate_state=None) -> (B, H, Tq, D)`` with q and k already rotated (k and v with H_kv heads
  dividing H), positions filled in, ``mask`` None or the user mask and the encoding's
  positional mask (its ``mask`` hook) with the causal one already in it (``causal`` says
  whether to add the causal mask when ``mask`` is None); ``gate_state`` the encoding's
  :meth:`~posenc.PositionalEncoding.prepare_gates` of the ``gates=`` (``gate`` hook) or None.
  How a backend evaluates the score bias and the gate bias (materialized, per
  tile, per score) is its own affair: :mod:`posenc.attention.tiling`. Only "flex" is handed
  a mask_mod (the user's and the encoding's mask and-ed, without the causal one); the others
  get a user mask_mod evaluated into a tensor.

Which backend "auto" picks (:func:`_resolve_backend`) is one table, docs/fast_attention.md
"The `auto` rule" (tests/test_attention_auto_rule.py checks the resolver against it).

Masking convention: a causal query i sees key j iff j <= i + (Tk - Tq), i.e. the queries
are the last Tq of the Tk keys (bottom-right alignment, as with a KV cache). An optional
boolean ``mask`` (True = may attend: document masks of packed rows, key padding) is combined
with it by logical and, and so is the mask an encoding states from positions (the ``mask``
hook: Llama 4's chunked attention). A query left with no key to attend (a left-padding
query) gets an output of zeros, never NaN: see :func:`combine_masks`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from posenc._validation import check_number, check_sequence_positions
from posenc.attention import blocked, eager, flash_attention_2, flex, fused_triton, sdpa
from posenc.attention.branches import BRANCH_BACKENDS, run_branches
from posenc.attention.masks import (
    causal_mask,
    check_mask,
    combine_masks,
    encoding_mask,
    is_mask_mod,
    mask_from_mod,
)
from posenc.attention.softcap_sinks import check_sinks, check_softcap
from posenc.encodings.base import Hook, PositionalEncoding
from posenc.errors import InvalidArgument, InvalidType

__all__ = ["BACKENDS", "attention", "causal_mask", "combine_masks"]

BACKENDS = ("auto", "eager", "sdpa", "blocked", "flex", "flash_attention_2", "triton")

_BACKENDS = {"eager": eager, "sdpa": sdpa, "blocked": blocked, "flex": flex, "flash_attention_2": flash_attention_2,
             "triton": fused_triton}

#: backend="auto" picks "blocked" for a score bias whose materialized form, B_bias * H * Tq * Tk
#: float32 entries, would hold at least this many (16 MiB).
AUTO_BLOCKED_MIN_BIAS_ELEMENTS = 1 << 22


def _resolve_backend(
    backend: str, encoding: PositionalEncoding | None, bias_elements: int = 0, device: torch.device | None = None,
    gates: Tensor | None = None, *, causal: bool = True, dtype: torch.dtype | None = None, mask=None,
    dropout_p: float = 0.0, default_positions: bool = False, softcap: float | None = None, sinks: Tensor | None = None,
) -> str:
    """The backend a call runs on; ``bias_elements`` = B_bias * H * Tq * Tk.

    For "auto": the first matching row of the table in docs/fast_attention.md, "The `auto`
    rule": its rows 1-5 are the returns below, in order, rows 6-12 those of :func:`_auto_on_cuda`.
    tests/test_attention_auto_rule.py reads the table and checks this function against it.

    Raises:
        ValueError: an unknown backend name.
    """
    if backend not in BACKENDS:
        raise InvalidArgument(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend != "auto":
        return backend
    if encoding is not None and Hook.CONTENT in encoding.hooks:
        return "eager"
    if device is not None and torch.device(device).type == "cuda":
        return _auto_on_cuda(encoding, bias_elements, causal=causal, dtype=dtype, mask=mask,
                             dropout_p=dropout_p, default_positions=default_positions,
                             learning=_learns_bias(encoding, gates), softcap=softcap, sinks=sinks)
    if encoding is not None and encoding.hooks & {Hook.SCORE_BIAS, Hook.GATE}:
        if bias_elements >= AUTO_BLOCKED_MIN_BIAS_ELEMENTS:
            return "blocked"
        if _learns_bias_on_cpu(encoding, device, gates):
            return "eager"
    if softcap is not None:  # row 4: SDPA cannot cap
        return "blocked"
    return "sdpa"


def _auto_on_cuda(encoding: PositionalEncoding | None, bias_elements: int, *, causal: bool, dtype, mask,
                  dropout_p: float, default_positions: bool, learning: bool, softcap: float | None = None,
                  sinks: Tensor | None = None) -> str:
    """Rows 6-12 of the `auto` table (docs/fast_attention.md), the CUDA rows after row 1, in order:
    flash_attention_2 (row 6: flash-attn installed and no gate is ``unsupported`` returning
    None; no soft-cap and no sinks), flex (rows 7, 8 and 9; not while a bias learns:
    FlexAttention sums a score_mod's parameter gradients by atomic adds into a few addresses,
    586x (T5) and 693x (Kerple) the time of bias-free SDPA on an H100, docs/results.md "On a
    GPU"), blocked (rows 10 and 11: a large bias, or a soft-cap SDPA cannot apply) or sdpa (row 12)."""
    hooks = encoding.hooks if encoding is not None else frozenset()
    mask_mod = is_mask_mod(mask) or Hook.MASK in hooks
    if Hook.SCORE_BIAS in hooks and default_positions and mask is None and dtype in (torch.float16, torch.bfloat16) \
            and not torch.compiler.is_compiling() and encoding.linear_bias_slopes(causal) is not None \
            and softcap is None and sinks is None and flash_attention_2.unsupported(encoding, dropout_p=dropout_p) is None:
        return "flash_attention_2"
    large = bool(hooks & {Hook.SCORE_BIAS, Hook.GATE}) and bias_elements >= AUTO_BLOCKED_MIN_BIAS_ELEMENTS
    flex_can = not dropout_p and Hook.GATE not in hooks and not learning
    if (mask_mod or large or softcap is not None) and flex_can:
        return "flex"
    return "blocked" if large or softcap is not None else "sdpa"


def _learns_bias(encoding: PositionalEncoding | None, gates: Tensor | None = None) -> bool:
    """Condition ``learning``: grad is enabled and a parameter of the encoding (T5's table,
    Kerple's and FIRE's parameters) or ``gates`` requires grad."""
    learned = (encoding is not None and any(p.requires_grad for p in encoding.parameters())) \
        or (gates is not None and gates.requires_grad)
    return torch.is_grad_enabled() and learned


def _learns_bias_on_cpu(encoding: PositionalEncoding, device: torch.device | None, gates: Tensor | None = None) -> bool:
    """Row 3 (a learned bias in training on the CPU): torch's CPU SDPA kernels give no gradient
    for a float mask, so SDPA runs its math path, and the eager backend is the same computation
    with fewer passes (measured: docs/results.md, "Measurements behind the code")."""
    on_cpu = device is None or torch.device(device).type == "cpu"
    return on_cpu and _learns_bias(encoding, gates)


def _default_positions(positions: Tensor | None, length: int, offset: int, device, argname: str, batch: int,
                       encoding: PositionalEncoding | None) -> Tensor:
    """arange(offset, offset + length) when not given; else the encoding's own check (shape
    (T,) or (B, T) by default; a multi-axis encoding's forms, returned axis-first (A, B, T)).
    Values (>= 0) are read in eager calls only: under compile that is a graph break and a sync."""
    if positions is None:
        return torch.arange(offset, offset + length, device=device)
    if encoding is None:
        return check_sequence_positions(positions, length=length, batch=batch, argname=argname).to(device)
    return encoding.check_positions(positions, length=length, batch=batch, argname=argname).to(device)


def _check_qkv(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> None:
    for argname, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor):
            raise InvalidType(f"{argname} must be a floating-point torch.Tensor (B, H, T, D), got {type(x).__name__}")
        if x.dim() != 4:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise InvalidArgument(f"{argname} must be a 4-D tensor (B, H, T, D), got {shape}")
        if not x.is_floating_point():
            raise InvalidType(f"{argname} must be a floating-point tensor, got {x.dtype}")
    heads, kv_heads = q.shape[1], k.shape[1]
    if q.shape[0] != k.shape[0] or k.shape[:3] != v.shape[:3] or kv_heads < 1 or heads % kv_heads:
        raise InvalidArgument(
            f"q (B, H, Tq, D), k and v (B, H_kv, Tk, D) disagree: got {tuple(q.shape)}, {tuple(k.shape)}, "
            f"{tuple(v.shape)}; k and v share B and Tk, and their heads H_kv must divide q's H "
            "(H_kv = H: multi-head; 1 <= H_kv < H: grouped-query, query head h reading key-value head h // (H / H_kv))"
        )
    if q.shape[-1] != k.shape[-1]:
        raise InvalidArgument(f"q and k must share head_dim, got {q.shape[-1]} and {k.shape[-1]}")
    if not (q.dtype == k.dtype == v.dtype) or not (q.device == k.device == v.device):
        raise InvalidArgument("q, k and v must share one dtype and one device")
    if causal and q.shape[2] > k.shape[2]:
        raise InvalidArgument(f"causal attention needs Tq <= Tk (queries are the last keys), got Tq={q.shape[2]}, Tk={k.shape[2]}")


def _check_gates(gates: Tensor | None, encoding: PositionalEncoding | None, q: Tensor, num_keys: int,
                 causal: bool) -> None:
    """``gates=`` is given exactly when the encoding has the ``gate`` hook, as (B, H, Tk) floats
    ((B, H, Tk, F) for an encoding with ``gate_features`` F)."""
    wants = encoding is not None and Hook.GATE in encoding.hooks
    batch, heads, num_queries = q.shape[0], q.shape[1], q.shape[2]
    features = encoding.gate_features if wants else None
    shape = (batch, heads, num_keys) if features is None else (batch, heads, num_keys, features)

    def expected() -> str:  # formatted only to raise: formatting a traced size would specialize it
        if features is None:
            return f"(B, H, Tk) = ({batch}, {heads}, {num_keys})"
        return f"(B, H, Tk, F) = ({batch}, {heads}, {num_keys}, {features})"

    if gates is None:
        if wants:
            raise InvalidArgument(
                f"gates: {type(encoding).__name__} has the gate hook, which reads the hidden state: pass "
                f"gates=encoding.gate(x) for every key, shape {expected()} (a KV cache keeps them with the keys)"
            )
        return
    if not wants:
        raise InvalidArgument("gates: only an encoding with the gate hook takes gates=, "
                         f"and {type(encoding).__name__ if encoding is not None else 'None'} has none")
    if not isinstance(gates, Tensor) or not gates.is_floating_point():
        kind = gates.dtype if isinstance(gates, Tensor) else type(gates).__name__
        raise InvalidType(f"gates must be a floating-point torch.Tensor {expected()}, got {kind}")
    if gates.dim() != len(shape) or any(size != want for size, want in zip(gates.shape, shape)):
        raise InvalidArgument(f"gates must have shape {expected()}, {type(encoding).__name__}.gate(x) of every key "
                              f"per query head, got {tuple(gates.shape)}")
    if gates.device != q.device:
        raise InvalidArgument(f"gates must be on q's device {q.device}, got {gates.device}")
    if not causal and num_queries > num_keys:
        raise InvalidArgument(f"gates: the queries must be the last keys (Tq <= Tk), got Tq={num_queries}, Tk={num_keys}")


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    encoding: PositionalEncoding | None = None,
    *,
    causal: bool = True,
    q_positions: Tensor | None = None,
    k_positions: Tensor | None = None,
    backend: str = "auto",
    mask: Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    gates: Tensor | None = None,
    softcap: float | None = None,
    sinks: Tensor | None = None,
) -> Tensor:
    """Scaled dot-product attention with a positional encoding.

    softmax(cap(scale * (rotate(q) . rotate(k)^T + content) + bias + gate bias) + mask) @ v
    (+ content on v), the encoding contributing through its hooks (``rotate``, ``score_bias``,
    ``content``, ``gate``, and ``mask``: its positional mask, and'ed with the causal and user
    masks on every backend); ``cap`` the optional soft-cap, and the softmax optionally beside
    per-head sink logits (``softcap=``, ``sinks=``). An encoding with ``rotates_values``
    (``vo_rope``, DeepSeek-V4's) also rotates v at the keys' positions before any backend
    runs and the output back at the queries' after it: out_i = R(-i) sum_j p_ij R(j) v_j.

    Args:
        q: (B, H, Tq, D). k, v: (B, H_kv, Tk, D) with H_kv dividing H: multi-head (H_kv = H),
            grouped-query (Llama, Mistral, Qwen: query head h reads key-value head
            h // (H / H_kv), the order of transformers' ``repeat_kv``) or multi-query
            (H_kv = 1). k and v are never repeated: SDPA, blocked and flex run with
            ``enable_gqa``, eager groups the query heads of a key-value head into one product
            (content encodings excepted: their per-head terms need k per query head). Score
            biases stay per query head. One floating dtype and device.
        encoding: a :class:`~posenc.PositionalEncoding` (``posenc.create(...)``) or None.
        causal: mask keys after each query, queries aligned to the end of the keys.
        q_positions: integer positions (Tq,) or (B, Tq); default ``arange(Tk - Tq, Tk)``. A
            multi-axis encoding (``encoding.position_axes`` > 1: M-RoPE, axial RoPE) also takes
            its own forms, e.g. (3, B, Tq) for M-RoPE: ``encoding.check_positions`` decides.
        k_positions: integer positions (Tk,) or (B, Tk); default ``arange(Tk)``; as q_positions.
        backend: "eager" (explicit float32 reference; every hook), "sdpa" (torch's
            scaled_dot_product_attention, the bias materialized as a float mask, ``is_causal``
            when there is nothing to add; no content term on the values), "blocked" (query
            blocks, each with its own bias tile; memory O(T), future key blocks skipped; no
            content terms), "flex" (torch FlexAttention with the encoding's ``score_mod`` and a
            block mask of the causal mask and ``mask``, compiled once per process for every
            length; no content terms, no dropout, no q/k/v backward on the CPU),
            "flash_attention_2" (flash-attn's kernel with its native ALiBi; CUDA, fp16/bf16,
            ALiBi or no bias, no ``mask``; needs ``pip install flash-attn``), "triton"
            (posenc's fused kernel with the bias computed inside it, forward and backward:
            no bias, ALiBi, Kerple, T5, FIRE, FoX; CUDA, fp32/bf16/fp16, ``mask`` only a
            document mask_mod; needs Triton) or "auto", which
            picks by device, encoding hooks, bias size, dtype, mask and dropout: the table in
            docs/fast_attention.md, "The `auto` rule" (the one statement of the rule).
            A branched encoding (``encoding.branched``) runs on "eager", "sdpa", "blocked"
            and "flex" (docs/fast_attention.md, "Branch-merge attention"), without dropout.
        mask: optional boolean tensor, True where query i may attend key j, of shape
            (Tq, Tk), (B, Tq, Tk) or (B, H, Tq, Tk), any of B, H, Tq may be 1 to broadcast
            (a key-padding mask is (B, 1, Tk)); or a FlexAttention mask_mod
            ``(b, h, q_idx, kv_idx) -> bool`` (:mod:`posenc.masks`: document, key padding,
            sliding window, chunked), which "flex" turns into its block mask without a (Tq,
            Tk) tensor and the other backends evaluate on index grids (a mask_mod is evaluated
            per batch row and must not depend on h under "flex"). Combined with the causal
            mask by logical and. Used for document masks of packed rows and for padding
            (:func:`posenc.lab.model.document_mask`, :func:`posenc.lab.model.key_padding_mask`).
            A query that may attend no key at all (e.g. a left-padding query) gets an output
            of zeros, Shaw's value term included: no NaN. Every backend but
            "flash_attention_2" takes it.
        scale: the softmax scale on q.k (and the content scores); default 1/sqrt(D), as SDPA.
            Score biases are added after it, unscaled (ALiBi, T5).
        dropout_p: dropout on the attention probabilities, as SDPA's (use it for training
            only: it applies whenever it is > 0). Every backend but "flex" takes it.
        gates: for an encoding with the ``gate`` hook (FoX) only, and then required: the
            hook's values of every key, (B, H, Tk) floats, H the query heads, in key order,
            ``encoding.gate(x)`` of the keys' hidden states x (B, Tk, d_model) (with a KV
            cache: the cached keys' gates followed by the new ones', as the LM keeps them).
            The queries' own tokens are the last Tq keys. The encoding turns them into a
            bias added after the scale (FoX: D_ij = sum of log f over the keys after j up to
            the query). Served by "eager", "sdpa" and "blocked" (tile by tile, O(T) memory).
        softcap: logit soft-capping (Gemma 2, Team Gemma 2024; Grok-1), a finite float > 0 or
            None: each logit s, after ``scale`` and after the encoding's score bias, content
            terms and gate bias, before the masks, becomes ``softcap * tanh(s / softcap)``
            (transformers ``models/gemma2/modeling_gemma2.py``, ``eager_attention_forward``;
            Gemma 2 uses 50.0). Masked logits stay masked (a -inf bias too). Served by
            "eager", "blocked" (per tile, forward and recomputing backward), "flex" (a
            score_mod composed after the encoding's), "flash_attention_2" without a score
            bias (flash-attn's ``softcap=``), and every branch backend but "sdpa"; refused by
            "sdpa" (no function of the scores goes through SDPA); "auto" picks a backend
            that caps.
        sinks: per-head sink logits (gpt-oss, OpenAI 2025), a floating tensor (H,) on q's
            device, H the query heads (with grouped-query heads: per query head), or None: each
            row's softmax runs over its scores and s_h, and the sink's share is dropped,
            ``p = softmax([scores_row, s_h])[:-1]`` (transformers
            ``models/gpt_oss/modeling_gpt_oss.py``, ``eager_attention_forward``), i.e. the
            output times sigmoid(L - s_h) for the row's log-sum-exp L. Gradients flow to
            ``sinks`` (a learned parameter in gpt-oss) and to q, k, v. A row with no visible
            key still gives zeros. Served by "eager", "sdpa" (CPU inference: a merged
            log-sum-exp from torch's CPU flash kernel; else the sink as one more key, zero k
            and v, logit s_h in the float mask), "blocked" (in its log-sum-exp, forward and
            backward), "flex" (from its returned log-sum-exp) and branch-merge attention (once,
            on the merged log-sum-exp); refused by "flash_attention_2".
            docs/fast_attention.md, "Soft-capping and sinks".

    Returns:
        (B, H, Tq, D) in q's dtype.

    Raises:
        ValueError: wrong ranks or mismatched shapes, dtypes or devices; causal with Tq > Tk;
            causal=False for an encoding defined for causal attention only (``causal_only``: PaTH);
            a score-bias encoding (one bias per head) built for another head count than q's
            (the message names both);
            ``gates`` missing for a ``gate`` encoding, given to another, or mis-shaped;
            negative or mis-shaped positions; a mis-shaped mask; an unknown backend; a
            backend that cannot serve the encoding or the mask (the message names the
            backends that can). TypeError: q/k/v not floating-point tensors, float positions,
            a mask that is not boolean, causal not a bool, scale not a finite number > 0,
            dropout_p not in [0, 1), an encoding that is not a
            PositionalEncoding, gates that are not a floating-point tensor. ValueError
            (InvalidArgument) naming ``softcap`` (not a finite number > 0) or ``sinks`` (not
            (H,), or on another device; TypeError when not a floating-point tensor), and a
            backend that cannot serve them (the message names the argument and the backend). Under torch.compile (``torch.compiler.is_compiling()``) the
            checks that read values (positions >= 0) and those of scale and dropout_p are
            skipped, so that the call traces as one graph; shapes and types are still checked.

    NaN and inf in q, k, v are not checked (that would synchronize the device); one rule holds
    on every backend: a query row with a non-finite entry gives a NaN row; a key whose k or v
    has one makes NaN exactly the rows that see it; a key a row cannot see (causal, ``mask=``)
    never affects that row. Second derivatives (double backward) work on "eager", and on "sdpa"
    under ``torch.nn.attention.sdpa_kernel(SDPBackend.MATH)``: torch's fused SDPA kernels have a
    backward without a derivative. Empty B, Tq or Tk: an empty output (or
    zeros for queries without keys).
    """
    _check_qkv(q, k, v, causal)
    if not isinstance(causal, bool):
        raise InvalidType(f"causal must be a bool, got {causal!r}")
    if torch.compiler.is_compiling():
        # dynamo cannot trace math.isfinite on a specialized float: numbers are checked in eager calls
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    else:
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else check_number(scale, "scale", gt=0)
        dropout_p = check_number(dropout_p, "dropout_p", ge=0)
    if dropout_p >= 1:
        raise InvalidArgument(f"dropout_p must be in [0, 1), got {dropout_p!r}")
    if encoding is not None and not isinstance(encoding, PositionalEncoding):
        raise InvalidType(
            f"encoding must be a posenc.PositionalEncoding (posenc.create(name, ...)) or None, got {type(encoding).__name__}"
        )
    batch, num_heads, num_queries, _ = q.shape
    num_keys = k.shape[2]
    encoding_heads = getattr(encoding, "num_heads", None) if encoding is not None and Hook.SCORE_BIAS in encoding.hooks else None
    if isinstance(encoding_heads, int) and encoding_heads != num_heads:  # a bias per head: ALiBi, T5, Kerple, FIRE
        raise InvalidArgument(
            f"encoding: {type(encoding).__name__} was built for num_heads={encoding_heads}, but the query has "
            f"{num_heads} heads (q is (B, H, Tq, D)); build the encoding for {num_heads} heads"
        )
    default_positions = q_positions is None and k_positions is None
    q_positions = _default_positions(q_positions, num_queries, num_keys - num_queries, q.device, "q_positions", batch,
                                     encoding)
    k_positions = _default_positions(k_positions, num_keys, 0, q.device, "k_positions", batch, encoding)
    _check_gates(gates, encoding, q, num_keys, causal)
    if not causal and encoding is not None and encoding.causal_only:
        raise InvalidArgument(f"causal: {type(encoding).__name__} is defined for causal attention only; "
                              "got causal=False")
    softcap = check_softcap(softcap) if not torch.compiler.is_compiling() else softcap
    sinks = check_sinks(sinks, num_heads, q.device)
    # (B, T) or, from a multi-axis encoding, (A, B, T): per-row positions (the sequence axis is last)
    bias_rows = batch if q_positions.dim() >= 2 or k_positions.dim() >= 2 or gates is not None else 1
    backend_module = _BACKENDS[_resolve_backend(backend, encoding, bias_rows * num_heads * num_queries * num_keys,
                                                q.device, gates, causal=causal, dtype=q.dtype, mask=mask,
                                                dropout_p=dropout_p, default_positions=default_positions,
                                                softcap=softcap, sinks=sinks)]
    if is_mask_mod(mask) and backend_module is not flex and not (backend_module is fused_triton
                                                                and fused_triton.takes_mask_mod(mask)):
        mask = mask_from_mod(mask, batch, num_heads, num_queries, num_keys, q.device)  # the backends without mask_mods
    if mask is not None and not is_mask_mod(mask):
        mask = check_mask(mask, batch, num_heads, num_queries, num_keys).to(q.device)
    reason = None
    if encoding is not None and encoding.branched:
        reason = _branched_unsupported(encoding, backend_module, dropout_p)
    reason = reason or backend_module.unsupported(encoding, mask=mask, dropout_p=dropout_p, softcap=softcap, sinks=sinks)
    if reason is not None:
        raise InvalidArgument(reason)
    if batch == 0 or num_queries == 0 or num_keys == 0:
        # Nothing to attend (or no one asking): zeros, still in q's and v's graph; a NaN query
        # row stays NaN (the rule below), as every backend would give with keys.
        return (q.sum(-1, keepdim=True) * 0 + v.sum() * 0).expand(batch, num_heads, num_queries, v.shape[-1])
    hooks = encoding.hooks if encoding is not None else frozenset()
    # The encoding's positional mask (its mask hook) joins the user's: on flex as a mask_mod (no
    # (Tq, Tk) tensor), elsewhere as one boolean mask on the grid of positions; the
    # rows-without-keys rule and the NaN rule cover it on every backend.
    if backend_module is flex:
        mask = flex.with_encoding_mask(mask, encoding, q_positions, k_positions, batch=batch, heads=num_heads)
    else:
        positional = encoding_mask(encoding, q_positions, k_positions)
        if positional is not None:
            mask = positional if mask is None else mask & positional
    has_key = None
    if mask is not None and not is_mask_mod(mask):
        mask, has_key = combine_masks(causal_mask(num_queries, num_keys, q.device) if causal else None, mask)
    if encoding is not None and encoding.branched:
        q, k, v, poisoned = _quarantine(q, k, v, causal=causal, mask=mask, has_key=has_key)
        out = run_branches(backend_module, encoding, q, k, v, q_positions=q_positions, k_positions=k_positions,
                           causal=causal, mask=mask, scale=scale, softcap=softcap, sinks=sinks)
        if has_key is not None:
            out = out.masked_fill(~has_key, 0.0)
        return out if poisoned is None else out.masked_fill(poisoned.unsqueeze(-1), float("nan"))
    rotates_values = Hook.ROTATE in hooks and encoding.rotates_values
    if Hook.ROTATE in hooks:
        q, k = encoding.rotate(q, k, q_positions, k_positions)
    if rotates_values:
        v = encoding.rotate_values(v, k_positions)
    if Hook.SCORE_BIAS in hooks:
        encoding.prepare_bias()
    gate_state = encoding.prepare_gates(gates) if Hook.GATE in hooks else None
    q, k, v, poisoned = _quarantine(q, k, v, causal=causal, mask=mask, has_key=has_key)
    out = backend_module.run(q, k, v, encoding=encoding, q_positions=q_positions, k_positions=k_positions,
                             causal=causal, mask=mask, scale=scale, dropout_p=dropout_p, gate_state=gate_state,
                             softcap=softcap, sinks=sinks)
    if rotates_values:
        out = encoding.rotate_output(out, q_positions)
    if has_key is not None:
        out = out.masked_fill(~has_key, 0.0)
    return out if poisoned is None else out.masked_fill(poisoned.unsqueeze(-1), float("nan"))


def _branched_unsupported(encoding: PositionalEncoding, backend_module, dropout_p: float) -> str | None:
    """Branch-merge attention (``encoding.branched``) needs each branch's log-sum-exp, which
    the backends of :data:`~posenc.attention.branches.BRANCH_BACKENDS` give; no dropout (a
    training-free inference method)."""
    if backend_module not in BRANCH_BACKENDS.values():
        return (f"{type(encoding).__name__} is branch-merge attention, which needs each branch's log-sum-exp: "
                f"use backend={', '.join(repr(b) for b in BRANCH_BACKENDS)} or 'auto'")
    if dropout_p:
        return f"{type(encoding).__name__} is branch-merge attention, which has no attention dropout (dropout_p)"
    return None


def _all_finite(*tensors: Tensor) -> bool:
    """Whether every entry is finite: one min/max pass per tensor, in its own dtype (no copy,
    no overflow: the extremes of finite numbers are finite; NaN propagates through both)."""
    return all(bool(torch.isfinite(torch.stack(torch.aminmax(t))).all()) for t in tensors if t.numel())


def _quarantine(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, mask: Tensor | None,
                has_key: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """The NaN rule, the same on every backend: (q, k, v) with every non-finite query, key or
    value row replaced by zeros, and ``poisoned`` (B, H, Tq), True for the query rows that
    hold a non-finite entry or see a key whose k or v does; the caller sets those rows to NaN.

    Why not let NaN flow: a hidden key's NaN logit or value reaches every row through the
    arithmetic (NaN + -inf is NaN; a zero probability times a NaN value is NaN; SDPA's CPU
    kernels turn a NaN query row into zeros), so what a row gets would depend on the backend
    and on which keys the mask hides. Replacing the rows by zeros with ``where`` (elementwise:
    no device sync, gradients unchanged for finite entries) keeps every backend's arithmetic
    finite, and ``poisoned`` is decided from visibility alone: O(B H Tk) for a causal or no
    mask, O(B H Tq Tk) booleans for a user mask.

    On the CPU outside compile, where reading a value costs no device sync, one min/max pass
    per tensor first decides whether anything is non-finite; when nothing is (the common case) the inputs go
    through untouched and ``poisoned`` is None: the rule costs one pass over q, k, v.
    """
    if q.device.type == "cpu" and not torch.compiler.is_compiling() and _all_finite(q, k, v):
        return q, k, v, None
    bad_q = ~torch.isfinite(q).all(-1)  # (B, H, Tq)
    bad_k = ~(torch.isfinite(k).all(-1) & torch.isfinite(v).all(-1))  # (B, H_kv, Tk)
    zero = torch.zeros((), dtype=q.dtype, device=q.device)
    q = torch.where(bad_q.unsqueeze(-1), zero, q)
    k = torch.where(bad_k.unsqueeze(-1), zero, k)
    v = torch.where(bad_k.unsqueeze(-1), zero, v)
    num_queries, num_keys = q.shape[2], k.shape[2]
    if is_mask_mod(mask):
        # no (Tq, Tk) mask to read: FlexAttention tells which rows see a flagged key
        return q, k, v, bad_q | flex.any_visible(bad_k, mask=mask, causal=causal, num_heads=q.shape[1],
                                                 num_queries=num_queries)
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        bad_k = bad_k.repeat_interleave(groups, dim=1)  # query head h reads key-value head h // G
    if mask is not None:
        visible = mask if has_key is None else mask & has_key  # rows without a key were opened: see nothing
        seen = (visible & bad_k.unsqueeze(-2)).any(-1)
    elif causal:
        # query i sees keys 0 .. i + Tk - Tq: a running "any" over the keys, read at the queries
        seen = bad_k.cumsum(-1, dtype=torch.int32)[..., num_keys - num_queries:] > 0
    else:
        seen = bad_k.any(-1, keepdim=True)
    return q, k, v, bad_q | seen
