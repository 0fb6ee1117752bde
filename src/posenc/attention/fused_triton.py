"""posenc's own fused attention kernel as a backend ("triton"): FlashAttention-2's tiling with a
learned bias computed inside it, forward and backward, the bias parameters' gradients reduced
per program without atomics (:mod:`posenc.attention.bias_attention_triton`: the attention
layer's own kernel, as blocked.py holds its backward).

Serves: encodings without a bias (their ``rotate`` hook already applied: NoPE, RoPE, ...) and
those whose bias has a fused form (:meth:`~posenc.PositionalEncoding.fused_bias`: ALiBi, with
trainable slopes too; Kerple, both variants; T5's buckets; FIRE's MLP; FoX's gates, causal), causal or not,
grouped-query heads, explicit positions (T,) or (B, T) (a KV cache), the document mask of packed
rows (``mask=posenc.masks.document_mask_mod(ids)``, compared per tile), float32 / bfloat16 /
float16 CUDA tensors (CPU tensors under ``TRITON_INTERPRET=1`` when the tests allow it through
:data:`DEVICES`). Not yet: any other ``mask=``,
content terms, dropout, ``softcap``, ``sinks``; each refused by name.

"auto" does not pick it yet: the kernel has run only under Triton's interpreter so far, and
docs/fast_attention.md says which backend serves a learned bias's training until the GPU script
(benchmarks/gpu.sh) has compiled and timed it on a GPU.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

import torch
from torch import Tensor

from posenc.encodings.base import Hook, PositionalEncoding
from posenc.errors import InvalidArgument

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

#: The device types whose tensors the kernel takes: CUDA in normal use; the tests add "cpu"
#: together with ``TRITON_INTERPRET=1`` (Triton's interpreter runs kernels on CPU tensors).
DEVICES: tuple[str, ...] = ("cuda",)

_module: ModuleType | None = None
_module_failed = False


def kernels() -> ModuleType | None:
    """:mod:`posenc.attention.bias_attention_triton`, or None where Triton does not import;
    imported on first use (``import posenc`` never imports Triton)."""
    global _module, _module_failed
    if _module is None and not _module_failed:
        if importlib.util.find_spec("triton") is None:
            _module_failed = True
        else:
            try:
                _module = importlib.import_module("posenc.attention.bias_attention_triton")
            except ImportError:
                _module_failed = True
    return _module


def unsupported(encoding: PositionalEncoding | None, *, mask=None, dropout_p: float = 0.0,
                softcap: float | None = None, sinks=None) -> str | None:
    """Triton importable; no content terms or positional mask; a bias only with a fused form;
    no mask=, dropout, softcap or sinks."""
    if kernels() is None:
        return "backend='triton' needs Triton (pip install posenc[gpu]); use backend='blocked', 'flex' or 'auto'"
    hooks = encoding.hooks if encoding is not None else frozenset()
    if Hook.CONTENT in hooks:
        return "backend='triton' has no content terms; use backend='eager' or 'auto'"
    if Hook.MASK in hooks:
        return "backend='triton' has no positional mask (mask hook) yet; use backend='flex', 'blocked' or 'auto'"
    if hooks & {Hook.SCORE_BIAS, Hook.GATE} and type(encoding).fused_bias is PositionalEncoding.fused_bias:
        return (f"backend='triton' computes only biases with a fused form (fused_bias), not {type(encoding).__name__}'s; "
                "use backend='blocked', 'flex' or 'auto'")
    if mask is not None and not takes_mask_mod(mask):
        return ("backend='triton' takes no mask= but a document mask_mod (posenc.masks.document_mask_mod); "
                "use backend='flex', 'blocked' or 'auto'")
    if dropout_p:
        return "backend='triton' has no attention dropout; use backend='blocked', 'sdpa' or 'auto'"
    if softcap is not None:
        return "backend='triton' does not apply softcap; use backend='blocked', 'flex' or 'auto'"
    if sinks is not None:
        return "backend='triton' does not take sinks; use backend='blocked', 'flex' or 'auto'"
    return None


def takes_mask_mod(mask) -> bool:
    """Whether ``mask`` is a mask_mod the kernel evaluates itself: a document mask
    (:func:`posenc.masks.document_mask_mod`, which carries its ids), compared per tile."""
    return callable(mask) and not isinstance(mask, Tensor) and hasattr(mask, "document_ids")


def _positions(positions: Tensor, length: int, device) -> Tensor:
    """(T,) or (B, T) positions; a multi-axis encoding's (A, B, T) ones are read only by its
    rotation, already applied, so the kernel gets the row indices (it reads positions for a bias only)."""
    return positions if positions.dim() <= 2 else torch.arange(length, device=device)


def run(q: Tensor, k: Tensor, v: Tensor, *, encoding: PositionalEncoding | None, q_positions: Tensor,
        k_positions: Tensor, causal: bool, mask, scale: float, dropout_p: float = 0.0, gate_state: object = None,
        softcap: float | None = None, sinks: Tensor | None = None) -> Tensor:
    # posenc.attention has asked unsupported() already; what it cannot know is the device and dtype
    if q.device.type not in DEVICES:
        raise InvalidArgument(f"backend='triton' runs on CUDA tensors, got {q.device.type}; use backend='auto'")
    if q.dtype not in _DTYPES:
        raise InvalidArgument(f"backend='triton' takes float32, bfloat16 or float16, got {q.dtype}; use backend='eager' or 'auto'")
    bias = None
    hooks = encoding.hooks if encoding is not None else frozenset()
    if hooks & {Hook.SCORE_BIAS, Hook.GATE}:
        bias = encoding.fused_bias(causal, gate_state)
        if bias is None:
            raise InvalidArgument(f"backend='triton': {type(encoding).__name__}'s bias has no fused form for this call "
                                  f"(causal={causal}); use backend='blocked' or 'auto'")
    return kernels().bias_attention(
        q, k, v, bias, q_positions=_positions(q_positions, q.shape[2], q.device),
        k_positions=_positions(k_positions, k.shape[2], q.device), causal=causal, scale=scale,
        document_ids=mask.document_ids if mask is not None else None)
