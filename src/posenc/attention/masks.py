"""Masks shared by the backends: the causal mask, user masks, encodings' positional masks,
and SDPA's float masks.

Masking convention: a causal query i sees key j iff j <= i + (Tk - Tq), i.e. the queries are
the last Tq of the Tk keys (bottom-right alignment, as with a KV cache). A user mask is
boolean, True = may attend, combined with the causal one by logical and; so is the mask an
encoding states from positions (its ``mask`` hook, e.g. Llama 4's chunked attention).
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc.encodings.base import Hook
from posenc.errors import InvalidArgument, InvalidType
from posenc.mask_rules import causal_mask  # noqa: F401 (the backends' import path; the rule is written there)


def encoding_mask(encoding, q_positions: Tensor, k_positions: Tensor) -> Tensor | None:
    """The encoding's ``mask`` hook on the grid of the call's positions: boolean 4-D
    (1, 1, Tq, Tk), or (B, 1, Tq, Tk) when either side is (B, T); None without the hook."""
    if encoding is None or Hook.MASK not in encoding.hooks:
        return None
    allowed = encoding.attention_mask(q_positions.unsqueeze(-1), k_positions.unsqueeze(-2))
    if allowed is None:
        return None
    return allowed[None, None] if allowed.dim() == 2 else allowed[:, None]


def check_mask(mask: Tensor, batch: int, heads: int, num_queries: int, num_keys: int) -> Tensor:
    """Validate a user mask and bring it to 4-D (B or 1, H or 1, Tq or 1, Tk).

    Raises:
        TypeError: not a boolean tensor. ValueError: a shape that does not broadcast.
    """
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        kind = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise InvalidType(f"mask must be a boolean tensor (True = may attend) or a mask_mod(b, h, q_idx, kv_idx) (posenc.masks), got {kind}")
    allowed = f"(Tq, Tk), (B, Tq, Tk) or (B, H, Tq, Tk) with B={batch}, H={heads}, Tq={num_queries}, Tk={num_keys} (or 1 to broadcast)"
    if mask.dim() not in (2, 3, 4):
        raise InvalidArgument(f"mask must have shape {allowed}, got {tuple(mask.shape)}")
    full = mask[None, None] if mask.dim() == 2 else mask[:, None] if mask.dim() == 3 else mask
    if full.shape[-1] != num_keys or full.shape[-2] not in (1, num_queries) \
            or full.shape[0] not in (1, batch) or full.shape[1] not in (1, heads):
        raise InvalidArgument(f"mask must have shape {allowed}, got {tuple(mask.shape)}")
    return full


def is_mask_mod(mask) -> bool:
    """Whether a ``mask=`` argument is a FlexAttention mask_mod (a callable) rather than a tensor."""
    return callable(mask) and not isinstance(mask, Tensor)


def mask_from_mod(mask_mod, batch: int, heads: int, num_queries: int, num_keys: int,
                  device: torch.device | None = None) -> Tensor:
    """A mask_mod ``(b, h, q_idx, kv_idx) -> bool`` evaluated on broadcast index grids
    (b (B, 1, 1, 1), h (1, H, 1, 1), q_idx (1, 1, Tq, 1), kv_idx (1, 1, 1, Tk), int64): the 4-D
    boolean mask the other backends take, only as large as the arguments it reads make it
    (a mask that ignores b and h is (1, 1, Tq, Tk)), as Hugging Face's ``sdpa_mask`` evaluates
    its mask functions.

    Raises:
        TypeError: the mask_mod does not return a boolean tensor. ValueError: its result does
            not broadcast to (B, H, Tq, Tk).
    """
    grids = [torch.arange(n, device=device).view([-1 if i == axis else 1 for i in range(4)])
             for axis, n in enumerate((batch, heads, num_queries, num_keys))]
    out = mask_mod(*grids)
    if not isinstance(out, Tensor) or out.dtype != torch.bool:
        got = out.dtype if isinstance(out, Tensor) else type(out).__name__
        raise InvalidType(f"mask: a mask_mod must return a boolean tensor (True = may attend), got {got}")
    while out.dim() < 4:
        out = out.unsqueeze(0)
    if out.shape[-1] == 1 and num_keys != 1:  # a mask that ignores the keys
        out = out.expand(*out.shape[:-1], num_keys)
    return check_mask(out, batch, heads, num_queries, num_keys)


def combine_masks(causal: Tensor | None, mask: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
    """The mask the backends get, and which query rows have no key at all.

    Returns ``(combined, has_key)``: ``combined`` = causal and mask, 4-D when a user mask is
    given; ``has_key`` (..., Tq, 1) is None when every query sees at least one key (decided
    only outside torch.compile: under it, always given, so that no value decides the graph).
    Rows without a key are opened to every key so that no backend computes a softmax over
    nothing (NaN); :func:`posenc.attention` then sets their output to zero.
    """
    if mask is None:
        return causal, None
    combined = mask if causal is None else mask & causal
    has_key = combined.any(dim=-1, keepdim=True)
    if not torch.compiler.is_compiling() and bool(has_key.all()):
        return combined, None
    return combined | ~has_key, has_key


def finite_in(bias: Tensor, dtype: torch.dtype) -> Tensor:
    """The float mask must be in q's dtype: a bias past its range (ALiBi at a distance of a
    million in float16) is clamped to the largest finite value, a zero weight either way, so
    that only masked entries are -inf (docs/precision.md). Returns ``bias`` itself when the
    cast cannot overflow, else a new tensor."""
    limit = torch.finfo(dtype).max
    if not bias.is_floating_point() or limit >= torch.finfo(bias.dtype).max:
        return bias
    return torch.where(bias == float("-inf"), bias, bias.clamp(-limit, limit))  # a folded-in mask stays -inf


def as_4d(mask: Tensor) -> Tensor:
    """(Tq, Tk) or (H, Tq, Tk) -> 4-D: torch 2.13 on CPU sends a 3-D float mask to the slow
    math kernel of SDPA (materializing the scores) and a 4-D one to its flash kernel."""
    while mask.dim() < 4:
        mask = mask.unsqueeze(0)
    return mask
