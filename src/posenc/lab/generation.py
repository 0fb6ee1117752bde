"""Decoding: the KV cache, the generation loop and next-token sampling.

The KV cache (:class:`KVCache`) stores, per layer, the keys *before* the encoding's rotate
(just after the projection) and the values, plus every cached key's position. Each step
calls :func:`posenc.attention` on the new queries and *all* keys with their explicit
positions, so the encoding sees every position as in a full pass: xPos re-centres each
call at its query block (its default ``center="query"``), FIRE normalizes by the absolute
query position, Shaw / Transformer-XL index their relative tables by the true distances, and
dynamic-NTK RoPE in its default ``dynamic_cache="rerotate"`` mode re-rotates old keys with
the frequencies of the current length; no special case anywhere. (That last one is exact in
the first layer only: deeper layers cache hidden states computed at a shorter length; see
:class:`KVCache` and ``PositionalEncoding.call_invariant``.) The price: every step re-applies
``rotate`` to all Tk cached keys, O(Tk D) per layer and head, the same order as the step's
q.k^T itself (caching rotated keys, as Hugging Face does, saves that rotation but is exact
only for encodings whose key transform never changes, i.e. not for dynamic NTK "rerotate"
nor xPos "query" / "call").

:func:`generate` is the loop behind :meth:`posenc.lab.model.TransformerLM.generate`; it knows the
model only as ``model(tokens, positions, mask=, cache=) -> logits`` plus its ``config``,
``encoding`` and ``max_positions``, so this module does not import the model.

Shapes: B batch, T tokens, Tk cached + new tokens, H heads, D head dim, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc._validation import check_positive_int
from posenc.sequences import check_padding_mask, key_padding_mask, positions_from_padding_mask
from posenc.errors import InvalidArgument, InvalidType


class KVCache:
    """Keys and values of the tokens seen so far, for decoding token by token.

    Per layer, the keys *before* the encoding's rotate (just after the projection) and the
    values, (B, H, Tk, D) each, then whatever else the layer keeps per key (the ``gate``
    hook's values, (B, H, Tk), for FoX; every per-key tensor has its token axis at dim 2), and
    the positions of the cached tokens, (Tk,) or (B, Tk).
    :meth:`~posenc.lab.model.TransformerLM.forward` with ``cache=`` reads it and, once the whole
    call has succeeded, appends the call's tokens (a failed call leaves it as it was). Why the
    keys are kept unrotated, and what it costs: see the module docstring.

    Exact (cached decoding = a full pass) when ``encoding.call_invariant`` is True, which holds
    for every registered encoding with its defaults. When it is False (dynamic NTK or longrope
    RoPE in ``dynamic_cache="rerotate"`` mode) the first layer is still exact, since its keys
    are re-rotated, but deeper layers' cached keys and values were computed from hidden states
    at a shorter length; :func:`generate` then decodes without a cache, and
    ``dynamic_cache="frozen"`` is the cache-exact choice.

    Raises:
        ValueError: num_layers not an integer >= 1.
    """

    def __init__(self, num_layers: int) -> None:
        check_positive_int(num_layers, "num_layers")
        self.layers: list[tuple[Tensor, ...] | None] = [None] * num_layers
        self.positions: Tensor | None = None

    @property
    def keys(self) -> list[Tensor | None]:
        """Each layer's cached keys (B, H_kv, Tk, D), unrotated, or None when empty."""
        return [None if entry is None else entry[0] for entry in self.layers]

    @property
    def values(self) -> list[Tensor | None]:
        """Each layer's cached values (B, H_kv, Tk, D), or None when empty."""
        return [None if entry is None else entry[1] for entry in self.layers]

    def __len__(self) -> int:
        """Number of cached tokens, Tk."""
        return 0 if self.positions is None else self.positions.shape[-1]

    def past(self, layer: int) -> tuple[Tensor, ...] | None:
        """(keys, values, ...) of ``layer``, as the layer returned them, or None when empty."""
        return self.layers[layer]

    def next_positions(self, length: int, device: torch.device | None = None) -> Tensor:
        """Default positions of ``length`` new tokens: after the last cached one (arange when
        empty). Pass positions explicitly when the last cached slot is not the row's last
        position (right padding)."""
        if self.positions is None:
            return torch.arange(length, device=device)
        return self.positions[..., -1:] + 1 + torch.arange(length, device=self.positions.device)

    def key_positions(self, positions: Tensor, batch: int) -> Tensor:
        """Positions of every key of a call: the cached ones, then the call's ``positions``;
        (Tk,) if both are 1-D, else (B, Tk)."""
        if self.positions is None:
            return positions
        if self.positions.dim() == 1 and positions.dim() == 1:
            return torch.cat((self.positions, positions))
        return torch.cat((self.positions.expand(batch, -1), positions.expand(batch, -1)), dim=-1)

    def update(self, presents: list[tuple[Tensor, ...]], positions: Tensor) -> None:
        """Replace the contents with every layer's per-key tensors ((keys, values, ...)) and
        all key positions.

        Raises:
            ValueError: not one (keys, values, ...) tuple per layer.
        """
        if len(presents) != len(self.layers) or any(len(present) < 2 for present in presents):
            raise InvalidArgument(f"presents: expected one (keys, values, ...) tuple for each of {len(self.layers)} layers")
        self.layers = [tuple(present) for present in presents]
        self.positions = positions


@torch.no_grad()
def generate(
    model,
    tokens: Tensor,
    max_new_tokens: int,
    *,
    temperature: float | None = None,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    padding_mask: Tensor | None = None,
) -> Tensor:
    """Continue ``tokens`` with ``model``; see :meth:`posenc.lab.model.TransformerLM.generate`,
    which calls this, for the arguments, the result and the errors."""
    if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.shape[1] < 1:
        got = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
        raise InvalidArgument(f"tokens must be a (B, T) tensor with T >= 1, got {got}")
    if tokens.is_floating_point() or tokens.dtype == torch.bool:
        raise InvalidType(f"tokens must be an integer tensor, got {tokens.dtype}")
    check_positive_int(max_new_tokens, "max_new_tokens")
    if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
                                    or not 0 < temperature < float("inf")):
        raise InvalidArgument(f"temperature must be a finite number > 0 (or None for greedy decoding), got {temperature!r}")
    if top_k is not None:
        check_positive_int(top_k, "top_k")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise InvalidType(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    batch, length = tokens.shape
    device = tokens.device
    if padding_mask is None:
        real = torch.ones(batch, length, dtype=torch.bool, device=device)
    else:
        real = check_padding_mask(padding_mask).to(device)
        if real.shape != tokens.shape:
            raise InvalidArgument(f"padding_mask must have the shape of tokens {tuple(tokens.shape)}, got {tuple(real.shape)}")
        if not bool(real[:, -1].all()) or bool((real[:, 1:] < real[:, :-1]).any()):
            raise InvalidArgument("padding_mask: pad on the left only (zeros then ones), with at least one token per row")
    positions = positions_from_padding_mask(real)
    next_position = real.sum(-1, keepdim=True)  # (B, 1): each row's own length
    last = int(next_position.max()) + max_new_tokens - 2  # the furthest position fed to the model
    if model.max_positions is not None and last >= model.max_positions:
        raise InvalidArgument(
            f"max_new_tokens: prompt ({int(next_position.max())} tokens) + max_new_tokens ({max_new_tokens}) "
            f"needs positions up to {last}, the encoding holds 0..{model.max_positions - 1}"
        )

    # An encoding that reads the whole call (encoding.call_invariant False, e.g. dynamic NTK
    # in "rerotate" mode) makes cached hidden states stale as the text grows: recompute the
    # whole sequence each step instead, so every step equals a full pass over its prefix.
    cache = KVCache(model.config.num_layers) if model.call_invariant else None
    logits = model(tokens, positions, mask=key_padding_mask(real), cache=cache)[:, -1]
    for step in range(max_new_tokens):
        new = next_token(logits, temperature, top_k, generator)  # (B, 1)
        tokens = torch.cat((tokens, new), dim=1)
        real = torch.cat((real, torch.ones_like(new, dtype=torch.bool)), dim=1)
        if step + 1 == max_new_tokens:
            break
        if cache is not None:
            logits = model(new, next_position, mask=key_padding_mask(real), cache=cache)[:, -1]
            next_position = next_position + 1
        else:
            logits = model(tokens, positions_from_padding_mask(real), mask=key_padding_mask(real))[:, -1]
    return tokens


def next_token(
    logits: Tensor, temperature: float | None, top_k: int | None, generator: torch.Generator | None
) -> Tensor:
    """logits (B, V) -> the chosen token (B, 1) int64.

    Greedy (argmax, the first maximum on ties) when ``temperature`` and ``top_k`` are both
    None; otherwise a draw with ``generator`` from softmax(logits / temperature) (temperature
    1.0 if only top_k is given) over the ``top_k`` most likely tokens, ties with the k-th kept
    as Hugging Face's ``TopKLogitsWarper`` does. Arguments are not checked (:func:`generate`
    does).
    """
    if temperature is None and top_k is None:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.float() / (1.0 if temperature is None else float(temperature))
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)


__all__ = ["KVCache", "generate", "next_token"]
