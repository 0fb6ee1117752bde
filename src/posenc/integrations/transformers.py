"""posenc encodings inside Hugging Face transformers decoders (Llama, Qwen2, Mistral, ...).

>>> from transformers import LlamaConfig, LlamaForCausalLM                      # doctest: +SKIP
>>> from posenc.integrations.transformers import use_encoding, extend_context   # doctest: +SKIP
>>> model = use_encoding(LlamaForCausalLM(config), "alibi")                     # doctest: +SKIP
>>> model = extend_context(LlamaForCausalLM.from_pretrained(path), "yarn", 4.0)  # doctest: +SKIP

The route an encoding takes follows from what it does, never from its name:

- **Rotary** (:class:`posenc.RoPE` with any rope_type, half-split layout: a rotation by cos and
  sin, the same for queries and keys): it replaces the model's rotary embedding module
  (``model.model.rotary_emb``). The model keeps its own attention implementation (sdpa, flash,
  flex) and its cache of rotated keys; posenc supplies the cos/sin tables, with angles in
  float64 (docs/precision.md).
- **Everything else** (score biases, content terms, xPos, interleaved RoPE, NoPE): the model's
  rotary embedding becomes the identity (cos 1, sin 0) and attention runs through
  :func:`posenc.attention`, registered with transformers' ``AttentionInterface`` as
  ``"posenc"`` and selected with ``model.set_attn_implementation("posenc")``. The cache then
  holds unrotated keys and posenc rotates every key at its position on each call (exact for
  xPos and the length-dependent scalings). Grouped-query layouts, the softmax ``scaling`` and
  the attention dropout transformers passes are honoured; k and v are not repeated.
- An ``embed`` hook (sinusoidal, learned absolute) adds to the hidden states entering the
  first decoder layer, at that call's ``position_ids``.

Positions: the queries' are the ``position_ids`` transformers hands every attention layer
(left padding: cumsum(attention_mask) - 1, as ``generate()`` computes them; packed rows:
positions restarting per document, with the block-diagonal mask transformers builds from
them). The keys': the queries' own without a cache; with a cache (transformers' default
``DynamicCache``), the Tk keys are the Tk consecutive slots ending at the queries, so key j of
row b is at position j - (Tk - Tq) + q_positions[b, 0], clamped at 0 (left-padding slots, which
the mask hides). A ``StaticCache`` (keys in slots past the queries) is not supported.

The mask is transformers' boolean SDPA mask (True = may attend; padding, sliding window and
packed documents folded in), or None when plain causal attention is meant.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from posenc.attention import attention
from posenc.encodings import Hook, PositionalEncoding, RoPE, create_for_model
from posenc.errors import InvalidArgument, InvalidType
from posenc.hf_config import extension_config, from_hf_config, head_dim_of
from posenc.hf_config import position_plan

__all__ = ["ATTN_IMPLEMENTATION", "position_plan", "use_encoding", "extend_context", "RotaryEmbedding", "IdentityRotaryEmbedding"]

#: The name posenc's attention function is registered under with transformers.
ATTN_IMPLEMENTATION = "posenc"

#: Where the encoding is kept on the attention modules (a plain attribute, not a submodule:
#: the encoding is registered once, on the decoder, so its parameters are saved once).
_ENCODING_ATTR = "_posenc_encoding"


class RotaryEmbedding(nn.Module):
    """A drop-in for a transformers rotary embedding module, backed by a posenc :class:`RoPE`.

    ``forward(x, position_ids) -> (cos, sin)``, each (B, T, rotary_dim) in x's dtype, the
    half-split layout transformers' ``apply_rotary_pos_emb`` expects, attention factor included
    (as transformers multiplies it in). Angles are computed in float64 and rounded once.
    The length-dependent scalings (dynamic, longrope) take the call's length as
    max(position_ids) + 1, as transformers' ``dynamic_rope_update`` does.
    """

    def __init__(self, rope: RoPE) -> None:
        super().__init__()
        self.rope = rope

    def forward(self, x: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        cos, sin = self.rope.cos_sin(position_ids, torch.promote_types(x.dtype, torch.float32))
        return cos.to(x.dtype), sin.to(x.dtype)


class IdentityRotaryEmbedding(nn.Module):
    """The rotary embedding that rotates nothing: cos = 1, sin = 0, (B, T, rotary_dim) in x's
    dtype. Used when posenc's attention applies the encoding itself."""

    def __init__(self, rotary_dim: int) -> None:
        super().__init__()
        self.rotary_dim = rotary_dim

    def forward(self, x: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        shape = (*position_ids.shape[-2:], self.rotary_dim)
        return x.new_ones(shape), x.new_zeros(shape)


def use_encoding(model: nn.Module, encoding: PositionalEncoding | str, **kwargs: Any) -> nn.Module:
    """Make a transformers decoder attend with a posenc encoding, in place.

    Args:
        model: a transformers decoder whose base model has ``layers`` (each with a
            ``self_attn``) and a ``rotary_emb`` module: LlamaForCausalLM, Qwen2ForCausalLM,
            MistralForCausalLM and the models written like them, or their base models.
        encoding: a :class:`~posenc.PositionalEncoding` (``posenc.create(...)``,
            ``posenc.rope.from_hf_config(model.config.to_dict())`` for the model's own RoPE), or
            a registered name, built with :func:`posenc.create_for_model` for the model's sizes
            (hidden_size, num_attention_heads, head_dim, max_position_embeddings) and ``kwargs``.
            A name builds a *new* encoding: ``"rope"`` is RoPE with base 10000, not the model's.

    Returns:
        ``model``, changed in place: the encoding is a submodule of the base model (its
        parameters train and are saved with ``save_pretrained``), and the model trains in a
        plain PyTorch loop and generates with ``model.generate()`` and its cache.

    Raises:
        ValueError: the model is not of that shape, the encoding's head_dim differs from
            the model's, or the encoding has the ``gate`` hook (FoX: it reads each layer's hidden
            state, which transformers' attention function does not receive). TypeError: encoding is neither an encoding nor a name. ImportError:
            transformers is not installed.
    """
    base = _base_model(model)
    config = model.config
    head_dim = int(head_dim_of(config.to_dict()))
    if isinstance(encoding, str):
        encoding = create_for_model(
            encoding, d_model=config.hidden_size, num_heads=config.num_attention_heads, head_dim=head_dim,
            max_positions=config.max_position_embeddings, causal=True, **kwargs,
        )
    elif kwargs:
        raise InvalidType(f"keyword arguments {sorted(kwargs)} are for building an encoding from a name; got an encoding")
    if not isinstance(encoding, PositionalEncoding):
        raise InvalidType(f"encoding must be a posenc.PositionalEncoding or a registered name, got {type(encoding).__name__}")
    if getattr(encoding, "head_dim", head_dim) != head_dim:
        raise InvalidArgument(f"encoding: head_dim={encoding.head_dim} differs from the model's head_dim={head_dim}")
    if Hook.GATE in encoding.hooks:
        raise InvalidArgument(
            f"encoding: {type(encoding).__name__} has the gate hook (values of each layer's hidden state, kept per "
            "key), which transformers' attention interface and cache cannot carry; use posenc.lab.model.TransformerLM"
        )
    parameter = next(model.parameters(), None)
    if parameter is not None:
        encoding.to(parameter.device)

    _restore(model, base)
    original_rotary = base.rotary_emb
    base.__dict__["_posenc_original_rotary"] = original_rotary
    base.__dict__["_posenc_original_attn"] = config._attn_implementation
    if _is_plain_rotary(encoding):
        base.rotary_emb = RotaryEmbedding(encoding)
        return model
    base.rotary_emb = IdentityRotaryEmbedding(_rotary_dim(original_rotary, head_dim))
    base.posenc_encoding = encoding
    for index, layer in enumerate(base.layers):  # a layer schedule (iRoPE) differs per layer
        layer.self_attn.__dict__[_ENCODING_ATTR] = encoding.for_layer(index)
    if Hook.EMBED in encoding.hooks:
        handle = base.layers[0].register_forward_pre_hook(_embed_hook(encoding), with_kwargs=True)
        base.__dict__["_posenc_embed_hook"] = handle
    _register_with_transformers()
    model.set_attn_implementation(ATTN_IMPLEMENTATION)
    return model


def extend_context(model: nn.Module, rope_type: str, factor: float, **params: Any) -> nn.Module:
    """Apply a context-extension scaling to a loaded RoPE model, and write it into its config.

    The config gets the fields of :func:`posenc.hf_config.extension_config` (the scaling
    :func:`posenc.rope.extension_scaling` ``(rope_type, factor, L0)`` with ``params`` on top,
    e.g. ``beta_fast=16`` for yarn, L0 the config's ``max_position_embeddings`` or
    ``original_max_position_embeddings=`` in ``params``, in Hugging Face's ``rope_parameters``
    spelling, ``max_position_embeddings`` extended where transformers does not read L0 from
    it), so that ``save_pretrained`` then a plain ``from_pretrained`` (no posenc) computes the
    same logits. The model's rotary embedding then becomes posenc's RoPE of the new config.

    Args:
        model: a transformers decoder with the default rope_type (see :func:`use_encoding`).
        rope_type: one of :data:`posenc.rope.EXTENSION_METHODS`.
        factor: s >= 1.

    Returns:
        ``model``, changed in place (its config too; left as it was when an error is raised).

    Raises:
        ValueError: the model's RoPE is already scaled, an unknown rope_type, s < 1, or a bad
            parameter (named, as :func:`posenc.rope_frequencies` raises).
    """
    config = model.config
    for key, value in extension_config(config.to_dict(), rope_type, factor, **params).items():
        setattr(config, key, value)
    return use_encoding(model, from_hf_config(config.to_dict()))


# -- the attention function ----------------------------------------------------------------

def posenc_attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """transformers' attention-function signature over :func:`posenc.attention`.

    query (B, H, Tq, D), key and value (B, H_kv, Tk, D) -> (output (B, Tq, H, D), None).
    """
    if kwargs.get("softcap") is not None:
        raise InvalidArgument("posenc attention does not apply logit soft-capping (softcap); use the model's own attention")
    encoding = module.__dict__.get(_ENCODING_ATTR)
    q_positions = _query_positions(kwargs.get("position_ids"), query)
    k_positions = _key_positions(q_positions, key.shape[2])
    out = attention(
        query, key, value, encoding, causal=bool(getattr(module, "is_causal", True)),
        q_positions=q_positions, k_positions=k_positions, mask=_boolean_mask(attention_mask),
        scale=scaling, dropout_p=dropout,
    )
    return out.transpose(1, 2).contiguous(), None


def _query_positions(position_ids: Tensor | None, query: Tensor) -> Tensor:
    batch, num_queries = query.shape[0], query.shape[2]
    if position_ids is None:
        return torch.arange(num_queries, device=query.device)
    if position_ids.dim() == 1:
        return position_ids
    return position_ids.expand(batch, num_queries)


def _key_positions(q_positions: Tensor, num_keys: int) -> Tensor:
    num_queries = q_positions.shape[-1]
    if num_keys == num_queries:
        return q_positions
    start = q_positions[..., :1] - (num_keys - num_queries)
    return (start + torch.arange(num_keys, device=q_positions.device)).clamp(min=0)


def _boolean_mask(attention_mask: Tensor | None) -> Tensor | None:
    """transformers' mask as posenc's (True = may attend): boolean as is; an additive float
    mask (0 where allowed, a large negative number where not) compared against half its
    dtype's minimum."""
    if attention_mask is None or attention_mask.dtype == torch.bool:
        return attention_mask
    return attention_mask > torch.finfo(attention_mask.dtype).min / 2


# -- plumbing ---------------------------------------------------------------------------------

def _register_with_transformers() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTN_IMPLEMENTATION, posenc_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)


def _base_model(model: nn.Module) -> nn.Module:
    base = getattr(model, "base_model", model)
    missing = [name for name in ("layers", "rotary_emb") if not hasattr(base, name)]
    if missing or not hasattr(model, "config"):
        raise InvalidArgument(
            f"model: expected a transformers decoder whose base model has 'layers' and 'rotary_emb' "
            f"(LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM, ...); {type(model).__name__} lacks {missing or ['config']}"
        )
    return base


def _rotary_dim(rotary: nn.Module, head_dim: int) -> int:
    inv_freq = getattr(rotary, "inv_freq", None)
    return 2 * inv_freq.numel() if isinstance(inv_freq, Tensor) else head_dim


def _is_plain_rotary(encoding: PositionalEncoding) -> bool:
    """A rotation by cos/sin tables shared by q and k, in transformers' half-split layout."""
    return isinstance(encoding, RoPE) and type(encoding).rotate is RoPE.rotate and not encoding.interleaved


def _restore(model: nn.Module, base: nn.Module) -> None:
    """Undo an earlier :func:`use_encoding` on this model, so that a second call starts clean."""
    original = base.__dict__.pop("_posenc_original_rotary", None)
    if original is None:
        return
    base.rotary_emb = original
    handle = base.__dict__.pop("_posenc_embed_hook", None)
    if handle is not None:
        handle.remove()
    if "posenc_encoding" in base._modules:
        del base._modules["posenc_encoding"]
    for layer in base.layers:
        layer.self_attn.__dict__.pop(_ENCODING_ATTR, None)
    attn_implementation = base.__dict__.pop("_posenc_original_attn", None)
    if attn_implementation is not None and model.config._attn_implementation != attn_implementation:
        model.set_attn_implementation(attn_implementation)


def _embed_hook(encoding: PositionalEncoding):
    def add_position_embedding(module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        positions = kwargs.get("position_ids")
        if positions is None:
            positions = torch.arange(hidden.shape[1], device=hidden.device)
        elif positions.dim() == 2 and positions.shape[0] != hidden.shape[0]:
            positions = positions.expand(hidden.shape[0], -1)
        hidden = encoding.embed(hidden, positions)
        if args:
            return (hidden, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": hidden}

    return add_position_embedding
