"""FlashAttention-2 (Dao 2023, the ``flash-attn`` package) as a backend: its fused CUDA kernel,
with its native ALiBi for a linear score bias.

FlashAttention-2's bias (``flash_attn_func`` docstring, ``csrc/flash_attn/src/alibi.h``): with
``alibi_slopes`` m, ``-m_h * |i + Tk - Tq - j|`` is added to the scaled score of query row i
and key row j (the slope divided by ``softmax_scale`` inside the kernel, so the bias itself is
not scaled, as ALiBi's). With posenc's positions that is ALiBi's ``m_h * (p_j - p_i)`` (key
minus query) exactly when the positions are the rows' indices up to one shift per batch row and
the queries are the last Tq keys: ``p_i - p_j = i + Tk - Tq - j``. The slopes go in unchanged
(positive, float32 (H,)). FlashAttention-2's layout is (B, T, H, D): q, k and v are transposed
views in, the output a transposed view out. Grouped-query heads are native (query head h reads
key-value head h // (H / H_kv), as posenc). There is no FlashAttention-3 ALiBi.

Serves: encodings without a score bias (their ``rotate`` hook already applied: NoPE, RoPE,
xPos, ...) and encodings whose ``linear_bias_slopes(causal)`` is not None (ALiBi); fp16 or
bf16 CUDA tensors; dropout; ``softcap`` without a bias (flash-attn >= 2.6's ``softcap=``:
c tanh(scale q.k / c), Gemma 2's). Not: content terms, gates, other biases (use "flex"),
``mask=``, ``sinks`` (``flash_attn_func`` gives no differentiable log-sum-exp), ``softcap``
with ALiBi (the kernel adds its ALiBi after the cap, posenc's rule caps the biased score).
"""

from __future__ import annotations

import importlib

import torch
from torch import Tensor

from posenc.encodings.base import Hook, PositionalEncoding
from posenc.errors import InvalidArgument

_INSTALL = "pip install flash-attn (NVIDIA GPUs from Ampere on, CUDA, fp16/bf16)"


def flash_attn_func():
    """flash-attn's ``flash_attn_func``, or None when the package is not importable."""
    try:
        return importlib.import_module("flash_attn").flash_attn_func
    except (ImportError, AttributeError):
        return None


def unsupported(encoding: PositionalEncoding | None, *, mask=None, dropout_p: float = 0.0,
                softcap: float | None = None, sinks=None) -> str | None:
    """flash-attn installed; no content terms; a score bias only if it is ALiBi's linear one; no
    mask; no sinks; softcap only without a bias."""
    if flash_attn_func() is None:
        return f"backend='flash_attention_2' needs the flash-attn package, which is not installed ({_INSTALL}); use backend='flex' or 'auto'"
    hooks = encoding.hooks if encoding is not None else frozenset()
    if Hook.CONTENT in hooks:
        return "backend='flash_attention_2' has no content terms; use backend='eager' or 'auto'"
    if Hook.GATE in hooks:
        return "backend='flash_attention_2' has no gate bias; use backend='blocked', 'sdpa', 'eager' or 'auto'"
    if Hook.SCORE_BIAS in hooks and encoding.linear_bias_slopes(causal=True) is None:
        return (f"backend='flash_attention_2' adds no bias but ALiBi's linear one, not {type(encoding).__name__}'s; "
                "use backend='flex' or 'auto'")
    if mask is not None:
        return "backend='flash_attention_2' does not take mask=; use backend='flex', 'blocked', 'sdpa', 'eager' or 'auto'"
    if sinks is not None:
        return "backend='flash_attention_2' does not take sinks (no log-sum-exp to merge them with); use backend='flex', 'blocked', 'sdpa', 'eager' or 'auto'"
    if softcap is not None and Hook.SCORE_BIAS in hooks:
        return ("backend='flash_attention_2' caps before adding its ALiBi, posenc's softcap caps the biased score: "
                "softcap with a score bias is refused; use backend='flex', 'blocked', 'eager' or 'auto'")
    return None


def flash_attn_arguments(q: Tensor, k: Tensor, v: Tensor, *, slopes: Tensor | None, causal: bool, scale: float,
                         dropout_p: float = 0.0, softcap: float | None = None) -> dict:
    """The keyword arguments of ``flash_attn_func`` for posenc's call: q (B, H, Tq, D), k and v
    (B, H_kv, Tk, D) as (B, T, H, D) views, ``alibi_slopes`` the slopes as float32 (H,) on q's
    device (None: no bias), ``softmax_scale``, ``causal`` (bottom-right aligned in
    FlashAttention-2 >= 2.1, as posenc), ``dropout_p``; ``softcap`` only when given (flash-attn
    >= 2.6 takes it)."""
    capped = {} if softcap is None else {"softcap": float(softcap)}
    return capped | {
        "q": q.transpose(1, 2), "k": k.transpose(1, 2), "v": v.transpose(1, 2),
        "dropout_p": dropout_p, "softmax_scale": scale, "causal": causal,
        "alibi_slopes": None if slopes is None else slopes.to(device=q.device, dtype=torch.float32).contiguous(),
    }


def check_index_aligned(q_positions: Tensor, k_positions: Tensor) -> None:
    """Raise unless p_i - p_j = i + Tk - Tq - j for every query row i and key row j (per batch
    row): FlashAttention-2's ALiBi reads row indices, not positions. Reads the positions (a
    device sync): skipped under torch.compile.

    Raises:
        ValueError: positions with gaps, restarts (packed rows) or queries not at the end of the keys.
    """
    num_queries, num_keys = q_positions.shape[-1], k_positions.shape[-1]
    q_shift = q_positions - torch.arange(num_queries, device=q_positions.device)
    k_shift = k_positions - torch.arange(num_keys, device=k_positions.device)
    aligned = (q_shift == q_shift[..., :1]).all() & (k_shift == k_shift[..., :1]).all() \
        & (q_shift[..., 0] - k_shift[..., 0] == num_keys - num_queries).all()
    if not bool(aligned):
        raise InvalidArgument(
            "backend='flash_attention_2' adds ALiBi by row index: it needs consecutive positions with the queries at the "
            "end of the keys (no gaps, no packed documents); use backend='flex' for other positions"
        )


def run(q: Tensor, k: Tensor, v: Tensor, *, encoding: PositionalEncoding | None, q_positions: Tensor,
        k_positions: Tensor, causal: bool, mask=None, scale: float, dropout_p: float = 0.0,
        gate_state: object = None, softcap: float | None = None, sinks=None) -> Tensor:
    if q.device.type != "cuda" or q.dtype not in (torch.float16, torch.bfloat16):
        raise InvalidArgument(f"backend='flash_attention_2' runs fp16 or bf16 CUDA tensors, got {q.dtype} on {q.device.type}")
    slopes = None
    if encoding is not None and Hook.SCORE_BIAS in encoding.hooks:
        slopes = encoding.linear_bias_slopes(causal=causal)
        if slopes is None:
            raise InvalidArgument(f"backend='flash_attention_2': {type(encoding).__name__}'s bias is -m|i - j| only under a "
                             "causal mask; use causal=True or backend='flex'")
        if not torch.compiler.is_compiling():
            check_index_aligned(q_positions, k_positions)
    out = flash_attn_func()(**flash_attn_arguments(q, k, v, slopes=slopes, causal=causal, scale=scale, dropout_p=dropout_p,
                                                   softcap=softcap))
    return out.transpose(1, 2)
