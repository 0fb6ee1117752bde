"""posenc encodings and per-layer position plans inside Hugging Face transformers decoders.

>>> from transformers import LlamaConfig, LlamaForCausalLM                      # doctest: +SKIP
>>> from posenc.integrations.transformers import use_encoding, extend_context   # doctest: +SKIP
>>> model = use_encoding(LlamaForCausalLM(config), "alibi")                     # doctest: +SKIP
>>> model = use_encoding(model, "t5", layers=[0, 2])                            # doctest: +SKIP
>>> model = use_encoding(model, plan)        # a posenc.hf_config.PositionPlan   # doctest: +SKIP
>>> model = extend_context(LlamaForCausalLM.from_pretrained(path), "yarn", 4.0)  # doctest: +SKIP
>>> model = extend_context(model, "self_extend", group_size=8, neighbor_window=1024)  # doctest: +SKIP

The position maps of :func:`extend_context` (self_extend, dca, ...) run through their own
attention function, :mod:`posenc.integrations.branch_attention`.

Every layer of the plan takes one of two routes, chosen from what its encoding does, never
from its name:

- **Tables** (a plain :class:`posenc.RoPE`, any rope_type, in the family's own pair layout and
  rotary width; or no encoding at all, NoPE): the layer keeps the model's own attention
  (sdpa, eager, flash, flex; attention sinks, logit soft-capping) and its cache of rotated keys;
  posenc hands it the rotary tables it applies, computed for that layer from posenc's RoPE with
  angles in float64 (docs/precision.md), or the identity tables (cos 1, sin 0) for NoPE. The
  tables replace the ``position_embeddings`` the model passes the decoder layer (a forward
  pre-hook per layer), so Gemma 3's per-layer-type tables, Cohere's interleaved ones, gpt-oss's
  half-width ones, GPT-J's (sin, cos) and Llama 4's complex ones are served alike: the family's
  table format is one entry of :data:`FAMILIES`.
- **posenc's attention** (score biases, content terms, xPos, a RoPE in another layout or width
  than the model's, chunked RoPE, every other encoding): the layer gets the identity tables and
  its attention runs through :func:`posenc.attention`, registered with transformers'
  ``AttentionInterface`` as ``"posenc"`` and selected with ``model.set_attn_implementation``;
  the layers on the table route then run the model's original attention function through the
  same entry. The cache holds unrotated keys and posenc rotates every key at its position on
  each call (exact for xPos and the length-dependent scalings). Grouped-query layouts, the
  softmax ``scaling`` and the attention dropout transformers passes are honoured.
- An ``embed`` hook (sinusoidal, learned absolute; a plan's ``embedding``) adds to the hidden
  states entering the first decoder layer, at that call's ``position_ids``.

Positions: the queries' are the ``position_ids`` transformers hands every decoder layer (left
padding: cumsum(attention_mask) - 1, as ``generate()`` computes them; packed rows: positions
restarting per document). The keys': the queries' own without a cache; with transformers'
``DynamicCache`` the Tk keys are the Tk consecutive slots ending at the queries, so key j of row
b is at position j - (Tk - Tq) + q_positions[b, 0], clamped at 0 (left-padding slots, which the
mask hides). A ``StaticCache`` (keys in fixed slots, unfilled ones past the queries) is refused
on the layers that run posenc's attention, at the first call; table-route layers work with it.

The mask is transformers' boolean SDPA mask (True = may attend; padding, sliding window, chunks
and packed documents folded in), or None when plain causal attention is meant.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from posenc.attention import attention
from posenc.encodings import Hook, PositionalEncoding, RoPE, create_for_model
from posenc.encodings.irope import AttentionTemperature
from posenc.encodings.rope.multiaxis import MultiAxisRoPE
from posenc.errors import InvalidArgument, InvalidType, MissingKey
from posenc.hf_config import EXTENSION_METHODS, extension_config, from_hf_config, position_plan, reads_model_type
from posenc.hf_config.plan import PLAN_FORMAT, LayerPlan, PositionPlan, encoding_from_dict, encoding_to_dict
from posenc.integrations import adapters
from posenc.integrations import branch_attention as branches
from posenc.integrations.adapters import ADAPTERS, RotaryEmbedding

__all__ = [
    "ATTN_IMPLEMENTATION", "FAMILIES", "Family", "position_plan", "use_encoding", "extend_context", "from_pretrained",
    "posenc_attention_forward", "RotaryEmbedding", "IdentityRotaryEmbedding",
]

#: The name posenc's attention function is registered under with transformers.
ATTN_IMPLEMENTATION = "posenc"

#: Where the encoding is kept on the attention modules of posenc-route layers (a plain
#: attribute, not a submodule: the encodings are registered once, on the base model).
_ENCODING_ATTR = "_posenc_encoding"
#: The position_ids of the current call, for attention modules that are not handed them.
_POSITIONS_ATTR = "_posenc_position_ids"
#: The attention implementation the model had, for the table-route layers.
_FALLBACK_ATTR = "_posenc_fallback"


# -- the families: how a model's layers take their rotary tables ---------------------------------

@dataclass(frozen=True)
class TableFormat:
    """How a family's decoder layers take their rotary tables (``position_embeddings``).

    Attributes:
        build: ``(cos, sin, dtype) -> position_embeddings``; cos and sin (..., T, r) full width
            in the family's pair layout, float32 or wider; dtype the hidden states'.
        width: ``position_embeddings -> r``, the rotary width the tables cover.
    """

    build: Callable[[Tensor, Tensor, torch.dtype], Any]
    width: Callable[[Any], int]


#: (cos, sin) full width (Llama and the models written like it; Cohere's interleaved tables too).
COS_SIN = TableFormat(lambda cos, sin, dtype: (cos.to(dtype), sin.to(dtype)), lambda tables: tables[0].shape[-1])
#: (cos, sin) of the first half only (gpt-oss's ``_apply_rotary_emb`` splits x in halves).
HALF_COS_SIN = TableFormat(
    lambda cos, sin, dtype: (cos[..., : cos.shape[-1] // 2].to(dtype), sin[..., : sin.shape[-1] // 2].to(dtype)),
    lambda tables: 2 * tables[0].shape[-1],
)
#: (sin, cos), one value per interleaved pair (GPT-J's ``embed_positions`` split).
PAIR_SIN_COS = TableFormat(lambda cos, sin, dtype: (sin[..., ::2].to(dtype), cos[..., ::2].to(dtype)),
                           lambda tables: 2 * tables[0].shape[-1])
#: (cos, sin) of interleaved pairs laid out half-split, [c0 .. c(r/2-1), c0 .. c(r/2-1)]: DeepSeek-V3's
#: ``apply_rotary_pos_emb_interleave`` moves q's and k's pairs to half-split order, then rotates
#: them with Llama's tables.
DEINTERLEAVED_COS_SIN = TableFormat(
    lambda cos, sin, dtype: (torch.cat((cos[..., ::2], cos[..., ::2]), -1).to(dtype),
                             torch.cat((sin[..., ::2], sin[..., ::2]), -1).to(dtype)),
    lambda tables: tables[0].shape[-1],
)
#: cos + i sin per interleaved pair, complex (Llama 4's ``freqs_cis``, complex64 for float32 and below).
COMPLEX_PAIRS = TableFormat(lambda cos, sin, dtype: torch.complex(cos[..., ::2], sin[..., ::2]),
                            lambda tables: 2 * tables.shape[-1])


@dataclass(frozen=True)
class Family:
    """Where a transformers model family keeps its decoder layers and how they take positions.

    Attributes:
        base: the causal LM's attribute holding the decoder stack where ``model.base_model`` is
            not it (Llama 4's text model; a dotted path, Qwen2-VL's ``"model.language_model"``,
            its text tower), or None. The model's own base model (``Qwen2VLModel``) is
            accepted too: the path's trailing parts are tried from it.
        layers: the base model's attribute holding the decoder layers.
        attention: a decoder layer's attribute holding its attention module.
        rotary: the base model's rotary embedding module (probed once for each layer's width).
        interleaved: the family's rotation pairs dimension 2i with 2i+1 (RoFormer, GPT-J,
            Cohere, Llama 4); False: i with i + r/2 (GPT-NeoX, Llama and most others).
        tables: the :class:`TableFormat` of its ``position_embeddings``.
        sinks: the attention module's attribute holding learned attention sinks (gpt-oss), or None.
        softcap: the attention module's attribute holding the logit soft-cap (Gemma 2), or None.
        scaled_layer_types: the layer types :func:`extend_context` scales by default in a
            config with per-layer-type RoPE (Gemma 3: the global layers, Google's long-context
            recipe); empty: the caller names them.
        temperature: the attention module's attributes (switch, floor_scale, attn_scale) where
            the model scales its queries by Llama 4's attention temperature itself, on the
            layers whose ``use_rope`` is false; None: the family has no such scaling. A plan
            layer with the same :class:`~posenc.encodings.irope.AttentionTemperature` then keeps
            the model's own attention; any other encoding turns the model's own scaling off on
            that layer (posenc's encoding replaces it; restored by the next use_encoding).
        interleaved_key: the config attribute that decides the pair layout where the family
            lets the config choose (DeepSeek-V3's ``rope_interleave``); None: ``interleaved``.
        interleaved_tables: the :class:`TableFormat` when that attribute chooses interleaved
            pairs (``tables`` otherwise).
        head_dim: the attention module's attribute holding the width of its query and key
            heads (DeepSeek-V3's MLA: ``qk_head_dim``, the non-rotary and rotary parts together).
        text_config: the model config's attribute holding the decoder's sizes
            (hidden_size, num_attention_heads, head_dim, ...) where they are not on the model's
            config itself (Qwen2-VL: ``"text_config"``), or None. :func:`extend_context` refuses
            such a model (it writes the top-level config only).
        no_scaling: why transformers' model of the family reads no RoPE scaling from its
            config, so that :func:`extend_context` has nothing to write (GPT-J); None: it reads one.
        rotary_positions: the decoder layers are not handed the positions their tables are
            computed at (Qwen2-VL's text model hands them ``position_ids=None``, or the packed
            text positions, and its rotary embedding the M-RoPE positions (3, B, T)): the
            positions are read from the rotary module's input (a forward pre-hook on it).
    """

    base: str | None = None
    layers: str = "layers"
    attention: str = "self_attn"
    rotary: str = "rotary_emb"
    interleaved: bool = False
    tables: TableFormat = COS_SIN
    sinks: str | None = None
    softcap: str | None = "attn_logit_softcapping"
    scaled_layer_types: tuple[str, ...] = ()
    temperature: tuple[str, str, str] | None = None
    interleaved_key: str | None = None
    interleaved_tables: TableFormat | None = None
    head_dim: str = "head_dim"
    text_config: str | None = None
    no_scaling: str | None = None
    rotary_positions: bool = False


#: The families whose layers differ from Llama's, by ``model_type``; any other model_type is
#: read as Llama-shaped (``layers``, ``self_attn``, half-split (cos, sin)). Adding a family is one entry.
FAMILIES: dict[str, Family] = {
    "gpt_neox": Family(attention="attention"),
    "gptj": Family(layers="h", attention="attn", interleaved=True, tables=PAIR_SIN_COS,
                   no_scaling="transformers' GPT-J builds its rotary table once, with create_sinusoidal_positions "
                              "from rotary_dim and base 10000, and reads no rope_theta, rope_scaling or "
                              "rope_parameters"),
    "cohere": Family(interleaved=True),
    "cohere2": Family(interleaved=True),
    "llama4_text": Family(base="model", interleaved=True, tables=COMPLEX_PAIRS,
                          temperature=("attn_temperature_tuning", "floor_scale", "attn_scale")),
    "gpt_oss": Family(tables=HALF_COS_SIN, sinks="sinks"),
    "gemma3_text": Family(scaled_layer_types=("full_attention",)),
    "deepseek_v3": Family(interleaved=True, interleaved_key="rope_interleave", interleaved_tables=DEINTERLEAVED_COS_SIN,
                          head_dim="qk_head_dim"),
    # the text tower of the VL models; its rotary embedding recomposes the M-RoPE axes by
    # mrope_section into Llama-format (cos, sin) (B, T, D) (transformers 5's Qwen2VLRotaryEmbedding)
    "qwen2_vl": Family(base="model.language_model", text_config="text_config", rotary_positions=True),
    "qwen2_5_vl": Family(base="model.language_model", text_config="text_config", rotary_positions=True),
}
_LLAMA_SHAPED = Family()


def family_of(model: nn.Module) -> Family:
    """The :class:`Family` entry of a model (its config's ``model_type``; Llama-shaped if none),
    its pair layout read from the config where the family lets the config choose."""
    config = getattr(model, "config", None)
    family = FAMILIES.get(getattr(config, "model_type", None), _LLAMA_SHAPED)
    if family.interleaved_key is not None:
        interleaved = bool(getattr(config, family.interleaved_key, family.interleaved))
        tables = family.interleaved_tables if interleaved and family.interleaved_tables is not None else family.tables
        family = dataclasses.replace(family, interleaved=interleaved, tables=tables)
    return family


# -- kept for callers of the earlier API ----------------------------------------------------------

class IdentityRotaryEmbedding(nn.Module):
    """The rotary embedding that rotates nothing: cos = 1, sin = 0, (B, T, rotary_dim) in x's dtype."""

    def __init__(self, rotary_dim: int) -> None:
        super().__init__()
        self.rotary_dim = rotary_dim

    def forward(self, x: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        shape = (*position_ids.shape[-2:], self.rotary_dim)
        return x.new_ones(shape), x.new_zeros(shape)


# -- use_encoding ---------------------------------------------------------------------------------

@dataclass
class _Layer:
    """One decoder layer's decision: its plan, the route, its tables' width."""

    index: int
    plan: LayerPlan
    attention: nn.Module
    width: int
    posenc_route: bool
    native_temperature_off: bool = False


def use_encoding(
    model: nn.Module, plan_or_encoding: PositionPlan | PositionalEncoding | str, *,
    layers: Sequence[int] | None = None, **kwargs: Any,
) -> nn.Module:
    """Make a transformers decoder attend with a posenc encoding or a per-layer position plan, in place.

    Args:
        model: a transformers causal LM or its base model, of a family in :data:`FAMILIES` or
            Llama-shaped (Llama 1-4, Mistral, Mixtral, Qwen2/3, Qwen3-MoE, Qwen3-Next, Gemma 1-3,
            Phi-3, Cohere 1/2, OLMo 2, SmolLM3, gpt-oss, GPT-NeoX, GPT-J, StableLM, Persimmon;
            Qwen2-VL and Qwen2.5-VL, their text tower: an :class:`~posenc.MRoPE` takes the
            model's own tables at its (3, B, T) positions, exact on text and image positions);
            or of a family in :data:`posenc.integrations.adapters.ADAPTERS` (gpt2, opt, bloom,
            mpt, falcon with RoPE or ALiBi, t5, mt5): a PositionPlan of their own kind
            (``position_plan(model.config)``, or one with other numbers: another RoPE base,
            other ALiBi slopes) goes through :func:`~posenc.integrations.adapters.apply_plan`,
            every layer at once; an encoding or a name replaces the family's positions on every
            self-attention layer or those in ``layers`` (T5: the encoder's layers are 0 .. E-1,
            the decoder's E .. E+D-1; a name builds a bidirectional encoding for the encoder, a
            causal one for the decoder), and without ``layers`` the family's absolute table
            (GPT-2, OPT) too, by an embedding encoding's rows or nothing.
        plan_or_encoding: a :class:`~posenc.hf_config.plan.PositionPlan` (one LayerPlan per
            decoder layer; its ``embedding`` added before layer 0); a
            :class:`~posenc.PositionalEncoding` (on every layer, its ``for_layer(i)`` on layer
            i); or a registered name, built with :func:`posenc.create_for_model` for the
            model's sizes (hidden_size, num_attention_heads, head_dim, max_position_embeddings)
            and ``kwargs``. A name builds a *new* encoding: ``"rope"`` is RoPE with base 10000,
            not the model's.
        layers: layer indices; only those layers change (to the plan's entry, or the
            encoding's ``for_layer(i)``), the others keep the family's own positions.

    Returns:
        ``model``, changed in place: the encodings are submodules of the base model
        (``posenc_encoding``: the encoding given, or a ModuleList of a plan's distinct
        encodings; their parameters train and are saved), the plan applied is
        ``model.base_model.posenc_plan``, and the model trains in a plain PyTorch loop and
        generates with ``model.generate()`` and its ``DynamicCache``. The plan is recorded as
        plain JSON in ``model.config.posenc_plan`` (:meth:`PositionPlan.to_dict`, plus the
        single encoding given and ``layers``), so that ``save_pretrained`` writes it into
        config.json and :func:`from_pretrained` restores it.

    Raises:
        InvalidArgument: (a ValueError) the model is not of a known shape; a plan whose length
            is not the number of decoder layers, or that gives positions to a layer without
            attention (an encoding given alone goes to the layers with softmax attention only:
            Qwen3-Next's linear-attention layers keep theirs); ``layers`` out of range or with
            an embedding encoding; an encoding whose head_dim differs from the model's, or
            with per-head values (``num_heads``) for another head count than the model's query
            heads (both named); one with the ``gate`` hook (FoX); a non-rotary encoding on a
            layer with attention sinks (gpt-oss) or logit soft-capping (Gemma 2), which
            posenc's attention does not compute. For an adapter family (the message names the
            family and the encoding): a plan with ``layers`` or one the adapter cannot apply
            (it says what it takes); an encoding with the gate hook (FoX), with several
            position axes (M-RoPE), with another head count or head_dim than the model's, an
            embedding encoding with ``layers``, a name that does not build for the stack's sizes.
        InvalidType: (a TypeError) neither a plan, an encoding nor a name.
        ImportError: transformers is not installed.

    On an error the model is left as it was.
    """
    adapter = ADAPTERS.get(getattr(getattr(model, "config", None), "model_type", None))
    if adapter is not None:  # the families whose positions an adapter hands to posenc
        apply = _prepare_adapter(model, adapter, plan_or_encoding, layers, kwargs)
    else:
        apply = _prepare(model, plan_or_encoding, layers, kwargs)
    apply()
    return model


# -- the adapter families (posenc.integrations.adapters.ADAPTERS) ---------------------------------

def _prepare_adapter(model: nn.Module, adapter: adapters.Adapter, plan_or_encoding: Any, layers: Sequence[int] | None,
                     kwargs: dict) -> Callable[[], None]:
    """Check everything for an adapter family without changing the model; returns the function
    that applies it. A PositionPlan goes to the family's plan adapter (its own kinds of
    encoding, every layer); an encoding or a name replaces the family's positions on the
    self-attention layers named (all: also its absolute position table)."""
    model_type = model.config.model_type
    if isinstance(plan_or_encoding, PositionPlan):
        takes = ("a PositionPlan of the family's own kind (position_plan(model.config): learned tables for gpt2 and "
                 "opt, ALiBi for bloom and mpt, RoPE or ALiBi for falcon (as its config), T5 buckets per stack for t5)")
        if layers is not None:
            raise InvalidArgument(f"layers: the {model_type} adapter applies a plan to every layer at once; it takes "
                                  f"{takes}, or an encoding or a name with layers=")
        if kwargs:
            raise InvalidType(f"keyword arguments {sorted(kwargs)} are for building an encoding from a name; got a "
                              "PositionPlan")
        apply_plan = adapter.plan(model, plan_or_encoding)
        plan, record = plan_or_encoding, _record(None, None, plan_or_encoding)

        def apply() -> None:
            adapters.restore(model)
            apply_plan()
            _keep_plan(model, plan, record)

        return apply
    return _prepare_adapter_encoding(model, adapter, plan_or_encoding, layers, kwargs)


def _stack_encodings(model_type: str, stacks: tuple, given: Any, kwargs: dict) -> list[PositionalEncoding]:
    """One encoding per stack: ``given``, or built from its name for the stack's sizes and
    direction (T5's encoder: bidirectional)."""
    if isinstance(given, PositionalEncoding):
        if kwargs:
            raise InvalidType(f"keyword arguments {sorted(kwargs)} are for building an encoding from a name; got "
                              f"{type(given).__name__}")
        return [given] * len(stacks)
    if not isinstance(given, str):
        raise InvalidType("plan_or_encoding must be a posenc PositionPlan, a posenc.PositionalEncoding or a registered "
                          f"name, got {type(given).__name__}")
    encodings = []
    for stack in stacks:
        try:
            encodings.append(create_for_model(given, d_model=stack.d_model, num_heads=stack.num_heads,
                                              head_dim=stack.head_dim, max_positions=stack.max_positions,
                                              causal=stack.causal, **kwargs))
        except (InvalidArgument, InvalidType) as err:
            raise type(err)(f"{model_type} {stack.name}: encoding {given!r}: {err}") from err
    return encodings


def _prepare_adapter_encoding(model: nn.Module, adapter: adapters.Adapter, given: Any, layers: Sequence[int] | None,
                              kwargs: dict) -> Callable[[], None]:
    """:func:`_prepare_adapter` for an encoding or a name: every check, then the function that
    swaps the table, hooks the stacks and hands the layers named to posenc's attention."""
    model_type = model.config.model_type
    stacks = adapter.stacks(model)
    encodings = _stack_encodings(model_type, stacks, given, kwargs)
    name = given if isinstance(given, str) else type(given).__name__
    embeds = Hook.EMBED in encodings[0].hooks
    for stack, encoding in zip(stacks, encodings):
        _check_adapter_encoding(model_type, stack, encoding, name)
    offsets = [sum(len(s.attentions) for s in stacks[:i]) for i in range(len(stacks))]
    chosen = set(_chosen_layers(layers, sum(len(s.attentions) for s in stacks)))
    if layers is not None and embeds:
        raise InvalidArgument(f"layers: {name} is an embedding encoding (embed hook), added before the first layer of "
                              f"{model_type}, not per layer; use it without layers=")
    # (stack, local index, attention module, the layer's encoding) of every layer that changes
    changed = [(stack, i, module, encoding.for_layer(i))
               for stack, encoding, offset in zip(stacks, encodings, offsets)
               for i, module in enumerate(stack.attentions) if offset + i in chosen]
    plan = _adapter_plan(model, stacks, encodings, changed, replace_table=layers is None)
    distinct = {id(e): e for e in [*encodings, *(c[3] for c in changed)]}
    registered = encodings[0] if len(distinct) == 1 else nn.ModuleList(distinct.values())
    single = encodings[0] if len({id(e) for e in encodings}) == 1 else None
    record = _record(single, layers, plan)
    if single is None:  # a name built once per stack (T5): from_pretrained builds it again by name
        record = _with_name(record, given, kwargs)
    # the implementation the model had before any use_encoding (restored with the rest)
    original = model.__dict__.get(_ORIGINAL_ATTN, model.config._attn_implementation)
    if adapter.attention is None:
        try:  # one that cannot serve the layers keeping the model's attention: refused now
            _transformers_attention_function(original)
        except InvalidArgument as err:
            raise InvalidArgument(f"{model_type}: {name}: {err}") from err

    def apply() -> None:
        adapters.restore(model)
        base = model.base_model
        parameter = next(model.parameters(), None)
        if parameter is not None:
            registered.to(parameter.device)
        adapters.replace_attribute(model, base, "posenc_encoding", registered, submodule=True)
        positions = {stack.name: {} for stack in stacks}
        for stack in stacks:
            adapters.hook(model, stack.base.register_forward_pre_hook(
                _stack_positions_hook(positions[stack.name], [c[2] for c in changed if c[0] is stack]),
                with_kwargs=True))
        if adapter.table is not None and layers is None:
            owner, attribute = adapter.table(model)
            original_table = getattr(owner, attribute)
            table = adapters.EmbeddingPositions(encodings[0], stacks[0].d_model, original_table.weight) if embeds \
                else adapters.ZeroPositions()
            table.__dict__["original"] = original_table  # what the plan adapters check against
            adapters.replace_attribute(model, owner, attribute, table)
        elif embeds:  # no table: added to the first layer's input
            for stack, encoding in zip(stacks, encodings):
                adapters.hook(model, stack.first_block.register_forward_pre_hook(
                    _stack_embed_hook(encoding, positions[stack.name]), with_kwargs=True))
        adapters.on_undo(model, lambda: [c[2].__dict__.pop(_POSITIONS_ATTR, None) for c in changed])
        for stack, _, module, encoding in changed:
            if adapter.attention is not None:
                forward = functools.partial(adapter.attention, module, encoding, positions[stack.name])
                adapters.replace_attribute(model, module, "forward", forward)
            else:
                adapters.replace_attribute(model, module, _ENCODING_ATTR, encoding)
        if adapter.attention is None:
            _register_with_transformers()
            for module in adapter.interface(model):
                adapters.replace_attribute(model, module, _FALLBACK_ATTR, original)
            model.set_attn_implementation(ATTN_IMPLEMENTATION)
            adapters.on_undo(model, lambda: model.set_attn_implementation(original))
            adapters.replace_attribute(model, model, _ORIGINAL_ATTN, original)
        _keep_plan(model, plan, record)

    return apply


#: Where an adapter family keeps the attention implementation it had before use_encoding.
_ORIGINAL_ATTN = "_posenc_original_attn"


#: The record's key for an encoding built by name once per stack (T5's encoder and decoder).
_BUILT_FROM_NAME = "built_from_name"


def _with_name(record: dict, name: str, kwargs: dict) -> dict:
    """The record of a plan built from ``name`` per stack, with the name and its options (plain
    JSON) for :func:`from_pretrained` to build it again; the reason where they are not."""
    import json

    try:
        json.dumps(kwargs)
    except (TypeError, ValueError):
        return {"format": PLAN_FORMAT, "error": f"encoding {name!r}: its options {sorted(kwargs)} are not plain data"}
    return {**record, _BUILT_FROM_NAME: {"name": name, "kwargs": dict(kwargs)}}


def _keep_plan(model: nn.Module, plan: PositionPlan, record: dict) -> None:
    """Record the plan applied (``base_model.posenc_plan``, ``config.posenc_plan``), undone
    with the rest by :func:`posenc.integrations.adapters.restore`."""
    adapters.replace_attribute(model, model.base_model, "posenc_plan", plan)
    adapters.replace_attribute(model, model.config, CONFIG_KEY, record)


def _check_adapter_encoding(model_type: str, stack: adapters.Stack, encoding: PositionalEncoding, name: str) -> None:
    """Refuse, naming the family and the encoding, what posenc's attention cannot run in that stack."""
    where = f"{model_type} {stack.name}"
    if Hook.GATE in encoding.hooks:
        raise InvalidArgument(f"{where}: {name} has the gate hook (values of each layer's hidden state, kept per key), "
                              "which the model's cache cannot carry; use posenc.lab.model.TransformerLM")
    if getattr(encoding, "position_axes", 1) != 1:
        raise InvalidArgument(f"{where}: {name} reads {encoding.position_axes} position axes; {model_type} has one "
                              "position per token")
    heads = getattr(encoding, "num_heads", None)
    if isinstance(heads, int) and heads != stack.num_heads:
        raise InvalidArgument(f"{where}: {name} was built for num_heads={heads}, the model's attention has "
                              f"{stack.num_heads} query heads")
    head_dim = getattr(encoding, "head_dim", None)
    if Hook.EMBED not in encoding.hooks and isinstance(head_dim, int) and head_dim != stack.head_dim:
        raise InvalidArgument(f"{where}: {name} has head_dim={head_dim}, the model's heads {stack.head_dim}")
    d_model = getattr(encoding, "d_model", None)
    if Hook.EMBED in encoding.hooks and isinstance(d_model, int) and d_model != stack.d_model:
        raise InvalidArgument(f"{where}: {name} has d_model={d_model}, the model's hidden size {stack.d_model}")


def _adapter_plan(model: nn.Module, stacks: tuple, encodings: list, changed: list, replace_table: bool) -> PositionPlan:
    """The plan an encoding applied to an adapter family amounts to: the family's own plan
    (``position_plan(config)``) with the changed layers' encodings, the absolute table replaced
    (by the embedding encoding, or nothing) when every layer changed."""
    own = position_plan(model.config)
    by_stack = {"decoder": own, "encoder": own.encoder}
    plans = {}
    for stack, encoding in zip(stacks, encodings):
        stack_plan = by_stack[stack.name]
        new = {i: e for s, i, _, e in changed if s is stack}
        layers = tuple(dataclasses.replace(layer, encoding=new[i] if Hook.EMBED not in new[i].hooks else None)
                       if i in new else layer for i, layer in enumerate(stack_plan))
        embedding = stack_plan.embedding
        if replace_table:
            embedding = encoding if Hook.EMBED in encoding.hooks else None
        plans[stack.name] = PositionPlan(layers, embedding, stack_plan.model_type, None, stack_plan.notes)
    decoder = plans["decoder"]
    return dataclasses.replace(decoder, encoder=plans.get("encoder"))


def _stack_positions_hook(positions: dict, modules: list[nn.Module]):
    """A stack's forward pre-hook: the call's positions, (B|1, Tq) queries and (B|1, Tk) keys:
    the call's ``position_ids`` where given (negative ones, OPT's padding, read at 0; the keys
    the consecutive positions ending at the queries, as for the Llama-shaped families), else
    from its 2-d attention mask over the cached and new tokens (cumsum(mask) - 1, padding at
    0), else 0 .. Tk-1; kept in ``positions`` and on the modules of posenc's
    attention. A StaticCache is refused here, at the first call."""
    def read_positions(module, args, kwargs):
        tokens = args[0] if args else kwargs.get("input_ids")
        if tokens is None:
            tokens = kwargs["inputs_embeds"][..., 0]
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        _refuse_static_layers(cache)
        cache = getattr(cache, "self_attention_cache", cache)
        past = cache.get_seq_length() if cache is not None else 0
        length = past + tokens.shape[1]
        mask = kwargs.get("attention_mask")
        if mask is None and len(args) > 2 and isinstance(args[2], Tensor):
            mask = args[2]
        given = kwargs.get("position_ids")
        if isinstance(given, Tensor) and given.dim() == 2:  # the caller's (GPT-2, OPT, Falcon take them)
            queries = given.clamp(min=0)
            positions["q"], positions["k"] = queries, _key_positions(queries, length)
        else:
            if mask is not None and mask.dim() == 2 and mask.shape[-1] == length:
                keys = (mask.long().cumsum(dim=-1) - 1).clamp(min=0)
            else:
                keys = torch.arange(length, device=tokens.device).unsqueeze(0)
            positions["k"], positions["q"] = keys, keys[:, past:]
        for attention_module in modules:
            attention_module.__dict__[_POSITIONS_ATTR] = positions["q"]

    return read_positions


def _stack_embed_hook(encoding: PositionalEncoding, positions: dict):
    """The first layer's forward pre-hook adding an embedding encoding's rows at the stack's positions."""
    def add_position_embedding(module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        hidden = encoding.embed(hidden, positions["q"].expand(hidden.shape[0], -1))
        if args:
            return (hidden, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": hidden}

    return add_position_embedding


def _refuse_static_layers(cache: Any) -> None:
    if cache is None:
        return
    from transformers.cache_utils import StaticLayer

    for part in (cache, getattr(cache, "self_attention_cache", None)):
        if any(isinstance(layer, StaticLayer) for layer in getattr(part, "layers", None) or []):
            raise InvalidArgument(
                f"cache: a StaticCache ({type(cache).__name__}) keeps keys in fixed slots, which posenc's attention "
                "cannot position; generate with the default DynamicCache (no cache_implementation='static')")


#: The config attribute holding the plan :func:`use_encoding` applied (plain JSON, written to
#: config.json by ``save_pretrained``; :func:`from_pretrained` restores it).
CONFIG_KEY = "posenc_plan"


def _record(encoding: PositionalEncoding | None, layers: Sequence[int] | None, plan: PositionPlan) -> dict:
    """What ``config.posenc_plan`` holds after :func:`use_encoding`: :meth:`PositionPlan.to_dict`
    of the plan applied, with ``"encoding"`` (the single encoding given, as {"name",
    "kwargs"}; None for a plan) and ``"applied_layers"`` (``layers=``; None: every layer). An
    encoding that cannot be recorded (not a registered class, options not plain data) does not
    stop use_encoding: the record is then ``{"format": 1, "error": why}``, and
    :func:`from_pretrained` raises with it."""
    try:
        record = plan.to_dict()
        record["encoding"] = None if encoding is None else encoding_to_dict(encoding)
    except InvalidArgument as err:
        return {"format": PLAN_FORMAT, "error": str(err)}
    record["applied_layers"] = None if layers is None else [int(i) for i in layers]
    return record


def from_pretrained(path: Any, **kwargs: Any) -> nn.Module:
    """Load a model saved after :func:`use_encoding` (or :func:`extend_context` with a position
    map) with the posenc plan it had.

    A config with ``posenc_context_extension`` (a position map of :func:`extend_context`):
    ``AutoModelForCausalLM.from_pretrained``, then ``extend_context(model, method, **params)``
    with the recorded method and resolved parameters. A config with a rope_type transformers
    cannot build (``dynamic_yarn``) and a recorded plan: built with the default rope_type in
    its place, then the plan applied and the config's rope dict put back as saved.

    ``transformers.AutoModelForCausalLM.from_pretrained(path, **kwargs)`` (T5:
    ``AutoModelForSeq2SeqLM``), then :func:`use_encoding` with the plan recorded in config.json
    (``posenc_plan``; the single encoding or ``layers=`` given, where one was), then the
    encoding's learned parameters (``base_model.posenc_encoding.*``) read from the saved weights
    (``model.safetensors`` or its shards). A folder without a recorded plan loads as
    transformers loads it.

    A plain ``from_pretrained`` (without posenc) of such a folder loads the model with its own
    positions: the recorded plan is an unread config attribute and the encoding's weights are
    reported as unexpected keys and dropped (docs/integration.md).

    Raises:
        InvalidArgument: a recorded plan this posenc cannot rebuild (another format, an unknown
            encoding); saved weights lacking an encoding parameter (named). ImportError:
            transformers or safetensors is not installed.
    """
    import transformers

    config = transformers.AutoConfig.from_pretrained(path)
    auto = transformers.AutoModelForSeq2SeqLM if getattr(config, "is_encoder_decoder", False) else \
        transformers.AutoModelForCausalLM
    posenc_only = _posenc_only_rope(config) if "config" not in kwargs and isinstance(
        getattr(config, CONFIG_KEY, None), dict) else None
    if posenc_only:  # transformers cannot build that rotary module: built with the default one, then the plan's
        kwargs = {**kwargs, "config": config}
    model = auto.from_pretrained(path, **kwargs)
    for owner, name, value in posenc_only or ():
        setattr(model.config if owner is config else owner, name, value)
    extension = getattr(model.config, branches.CONFIG_KEY, None)
    if extension is not None:  # a position map of extend_context: applied again
        if not isinstance(extension, dict) or not isinstance(extension.get("params"), dict):
            raise InvalidArgument(f"config.{branches.CONFIG_KEY} must be a dict with 'method' and 'params', got "
                                  f"{extension!r}")
        return extend_context(model, extension.get("method"), **extension["params"])
    record = getattr(model.config, CONFIG_KEY, None)
    if record is None:
        return model
    if not isinstance(record, dict):
        raise InvalidArgument(f"config.{CONFIG_KEY} must be a dict (PositionPlan.to_dict), got {type(record).__name__}")
    if "error" in record:
        raise InvalidArgument(f"{path}: the model was saved with a plan posenc could not record: {record['error']}")
    given, by_name = record.get("encoding"), record.get(_BUILT_FROM_NAME)
    if isinstance(by_name, dict):  # an adapter family's encoding built by name per stack (T5)
        use_encoding(model, by_name.get("name"), layers=record.get("applied_layers"), **(by_name.get("kwargs") or {}))
    else:
        target = encoding_from_dict(given, f"{CONFIG_KEY}.encoding") if given is not None else \
            PositionPlan.from_dict(record)
        use_encoding(model, target, layers=record.get("applied_layers"))
    wanted = [name for name in model.state_dict() if ".posenc_encoding." in f".{name}"]
    if wanted:
        saved = _saved_tensors(path, wanted)
        missing = [name for name in wanted if name not in saved]
        if missing:
            raise InvalidArgument(f"{path}: the saved weights lack the encoding's parameters {missing}")
        parameter = next(model.parameters())
        model.load_state_dict({name: saved[name].to(parameter.device) for name in wanted}, strict=False)
    return model


#: rope_types of posenc's that transformers' rotary modules do not know (its ROPE_INIT_FUNCTIONS).
_POSENC_ONLY_ROPE_TYPES = ("dynamic_yarn",)


def _posenc_only_rope(config: Any) -> list[tuple[Any, str, Any]]:
    """Swap, in ``config``, every rope dict of a type transformers cannot build (dynamic_yarn,
    written by :func:`extend_context`) for the default rope_type with the same theta, so that
    transformers builds the model; returns (owner, attribute, original value) to put back. The
    recorded plan then gives those layers posenc's RoPE of the original dict."""
    swapped = []
    for key in ("rope_parameters", "rope_scaling"):
        value = getattr(config, key, None)
        if not isinstance(value, dict) or not value:
            continue
        per_type = all(isinstance(v, dict) for v in value.values())
        dicts = value if per_type else {None: value}
        if not any(d.get("rope_type") in _POSENC_ONLY_ROPE_TYPES for d in dicts.values()):
            continue
        plain = {name: ({k: v for k, v in d.items() if k in ("rope_theta", "partial_rotary_factor")}
                        | {"rope_type": "default"} if d.get("rope_type") in _POSENC_ONLY_ROPE_TYPES else d)
                 for name, d in dicts.items()}
        swapped.append((config, key, value))
        setattr(config, key, plain if per_type else plain[None])
    return swapped


def _saved_tensors(path: Any, names: list[str]) -> dict[str, Tensor]:
    """The tensors ``names`` from a save_pretrained folder (safetensors, one file or shards)."""
    import json
    from pathlib import Path

    from safetensors import safe_open

    folder = Path(path)
    index = folder / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = {weight_map[name] for name in names if name in weight_map}
    else:
        files = {"model.safetensors"}
    found: dict[str, Tensor] = {}
    for file in files:
        with safe_open(str(folder / file), framework="pt") as handle:
            for name in names:
                if name in handle.keys():
                    found[name] = handle.get_tensor(name)
    return found


def _prepare(model: nn.Module, plan_or_encoding: Any, layers: Sequence[int] | None, kwargs: dict) -> Callable[[], None]:
    """Check everything and decide every layer's route without changing the model; returns the
    function that applies the decision (it raises nothing a user could cause)."""
    family = family_of(model)
    base = _base_model(model, family)
    config = model.config
    sizes = _sizes_config(config, family)  # the decoder's sizes (a VL model's text_config)
    decoder_layers = list(getattr(base, family.layers))
    count = len(decoder_layers)
    head_dim = _head_dim(sizes, decoder_layers, family)
    registered: nn.Module | None = None
    uniform = isinstance(plan_or_encoding, (str, PositionalEncoding))  # every attention layer takes it
    if isinstance(plan_or_encoding, str):
        # one encoding per width of the layers' heads (Gemma 4's global layers are wider)
        widths = [getattr(getattr(layer, family.attention, None), family.head_dim, head_dim) for layer in decoder_layers]
        built = {width: create_for_model(
            plan_or_encoding, d_model=sizes.hidden_size, num_heads=sizes.num_attention_heads, head_dim=width,
            max_positions=sizes.max_position_embeddings, causal=True, **kwargs,
        ) for width in dict.fromkeys(w if isinstance(w, int) else head_dim for w in widths)}
        first = next(iter(built.values()))
        if len(built) == 1 or not {Hook.ROTATE, Hook.CONTENT} & first.hooks:  # only these read the head width
            plan_or_encoding = first
        else:
            plan_or_encoding = PositionPlan(
                tuple(LayerPlan(built[w if isinstance(w, int) else head_dim].for_layer(i)) for i, w in enumerate(widths)),
                model_type=getattr(config, "model_type", None))
    elif kwargs:
        raise InvalidType(f"keyword arguments {sorted(kwargs)} are for building an encoding from a name; got "
                          f"{type(plan_or_encoding).__name__}")
    if isinstance(plan_or_encoding, PositionalEncoding):
        registered = plan_or_encoding
        plan = PositionPlan.uniform(plan_or_encoding, count, model_type=getattr(config, "model_type", None))
    elif isinstance(plan_or_encoding, PositionPlan):
        plan = plan_or_encoding
    else:
        raise InvalidType("plan_or_encoding must be a posenc PositionPlan, a posenc.PositionalEncoding or a registered "
                          f"name, got {type(plan_or_encoding).__name__}")
    if len(plan) != count:
        raise InvalidArgument(f"plan: {len(plan)} layers for a model with {count} decoder layers")
    chosen = _chosen_layers(layers, count)
    if layers is not None and plan.embedding is not None:
        raise InvalidArgument("layers: an embedding encoding (embed hook) is added before the first layer, not per layer")
    if plan.embedding is not None:
        _check_encoding(plan.embedding, sizes, head_dim, "plan.embedding")

    decisions: list[_Layer] = []
    probe = _RotaryProbe(base, family, sizes)
    for index in chosen:
        layer_plan = plan[index]
        module = getattr(decoder_layers[index], family.attention, None)
        encoding = layer_plan.encoding
        where = f"layer {index}"
        if module is None:  # Qwen3-Next's linear-attention layers: no positions to give
            if encoding is not None and not uniform:
                raise InvalidArgument(f"plan: {where} has no '{family.attention}' (no softmax attention), "
                                      f"it cannot take {type(encoding).__name__}")
            continue
        width = probe.width(index)
        native = _native_temperature(module, family)
        if native is not None and _is_temperature(encoding, native):
            # the model scales its queries itself: identity tables, the model's own attention
            decisions.append(_Layer(index, dataclasses.replace(layer_plan, encoding=None), module, width,
                                    posenc_route=False))
            continue
        if encoding is None or not encoding.hooks:  # NoPE: the identity tables, the model's own attention
            decisions.append(_Layer(index, layer_plan, module, width, posenc_route=False,
                                    native_temperature_off=native is not None))
            continue
        tables = _takes_tables(encoding, family, width)
        # the tables cover the rotary width (checked above); posenc's attention sees whole heads
        _check_encoding(encoding, sizes, None if tables else getattr(module, family.head_dim, head_dim), where)
        if not tables:
            for attr, what in ((family.sinks, "attention sinks"), (family.softcap, "logit soft-capping")):
                if attr is not None and getattr(module, attr, None) is not None:
                    raise InvalidArgument(
                        f"{where}: {type(encoding).__name__} needs posenc's attention, which has no {what} "
                        f"('{attr}' of {type(module).__name__}); only a half-split RoPE of the model's own rotary "
                        f"width (or NoPE) keeps the model's attention on this layer"
                    )
        decisions.append(_Layer(index, layer_plan, module, width, posenc_route=not tables,
                                native_temperature_off=native is not None))
    needs_posenc = any(d.posenc_route for d in decisions)
    original_attn = base.__dict__.get("_posenc_original_attn", config._attn_implementation)
    if needs_posenc:
        _transformers_attention_function(original_attn)  # refuse one that cannot serve the other layers, now
    if registered is None:
        distinct = {id(e): e for e in [plan.embedding, *(d.plan.encoding for d in decisions)] if e is not None}
        registered = nn.ModuleList(distinct.values()) if distinct else None

    record = _record(registered if uniform else None, layers, plan)

    def apply() -> None:
        _restore(model, base, family)
        setattr(config, CONFIG_KEY, record)
        parameter = next(model.parameters(), None)
        if registered is not None:
            if parameter is not None:
                registered.to(parameter.device)
            base.posenc_encoding = registered
        base.__dict__["posenc_plan"] = plan
        base.__dict__["_posenc_original_attn"] = config._attn_implementation
        handles = []
        if plan.embedding is not None:
            handles.append(decoder_layers[0].register_forward_pre_hook(_embed_hook(plan.embedding), with_kwargs=True))
        memo: dict[Any, Any] = {}
        if family.rotary_positions:
            handles.append(getattr(base, family.rotary).register_forward_pre_hook(_rotary_positions_hook(memo),
                                                                                  with_kwargs=True))
        switched_off = []
        for decision in decisions:
            if decision.posenc_route:
                decision.attention.__dict__[_ENCODING_ATTR] = decision.plan.encoding
            if decision.native_temperature_off:
                switch = family.temperature[0]
                switched_off.append((decision.attention, switch, getattr(decision.attention, switch)))
                setattr(decision.attention, switch, False)
            hook = _tables_hook(decision, family, memo)
            handles.append(decoder_layers[decision.index].register_forward_pre_hook(hook, with_kwargs=True))
        base.__dict__["_posenc_switched_off"] = switched_off
        base.__dict__["_posenc_hooks"] = handles
        if needs_posenc:
            _register_with_transformers()
            original = config._attn_implementation
            for layer in decoder_layers:
                module = getattr(layer, family.attention, None)
                if module is not None:
                    module.__dict__[_FALLBACK_ATTR] = original
            model.set_attn_implementation(ATTN_IMPLEMENTATION)

    return apply


def _chosen_layers(layers: Sequence[int] | None, count: int) -> list[int]:
    if layers is None:
        return list(range(count))
    if isinstance(layers, (str, bytes)) or not isinstance(layers, Sequence):
        raise InvalidType(f"layers must be a sequence of layer indices, got {type(layers).__name__}")
    chosen = []
    for index in layers:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
            raise InvalidArgument(f"layers: {index!r} is not a layer index in [0, {count})")
        if index not in chosen:
            chosen.append(index)
    return sorted(chosen)


def _sizes_config(config: Any, family: Family) -> Any:
    """The config holding the decoder's sizes: the model's, or its ``family.text_config``."""
    return config if family.text_config is None else getattr(config, family.text_config)


def _head_dim(config: Any, decoder_layers: list[nn.Module], family: Family) -> int:
    for layer in decoder_layers:
        module = getattr(layer, family.attention, None)
        if isinstance(getattr(module, family.head_dim, None), int):
            return getattr(module, family.head_dim)
    if isinstance(getattr(config, "head_dim", None), int):
        return config.head_dim
    return config.hidden_size // config.num_attention_heads


def _check_encoding(encoding: PositionalEncoding, config: Any, head_dim: int | None, where: str) -> None:
    if head_dim is not None and getattr(encoding, "head_dim", head_dim) != head_dim:
        raise InvalidArgument(f"{where}: encoding head_dim={encoding.head_dim} differs from the model's head_dim={head_dim}")
    heads = getattr(encoding, "num_heads", None)
    if isinstance(heads, int) and heads != config.num_attention_heads:
        raise InvalidArgument(
            f"{where}: {type(encoding).__name__} was built for num_heads={heads}, the model's attention has "
            f"{config.num_attention_heads} query heads"
        )
    if Hook.GATE in encoding.hooks:
        raise InvalidArgument(
            f"{where}: {type(encoding).__name__} has the gate hook (values of each layer's hidden state, kept per "
            "key), which transformers' attention interface and cache cannot carry; use posenc.lab.model.TransformerLM"
        )


def _takes_tables(encoding: PositionalEncoding, family: Family, width: int) -> bool:
    """A rotation by cos/sin tables shared by q and k, nothing else, in the family's pair layout
    and rotary width: the model's own attention can apply it."""
    plain_rope = isinstance(encoding, RoPE) and type(encoding).rotate is RoPE.rotate \
        and type(encoding).cos_sin is RoPE.cos_sin
    # a multi-axis RoPE (M-RoPE) on the model's own tables: cos/sin of each pair at its axis' coordinate
    multi_axis = isinstance(encoding, MultiAxisRoPE) and type(encoding).rotate is MultiAxisRoPE.rotate \
        and type(encoding).cos_sin is MultiAxisRoPE.cos_sin
    # an attention factor that follows the length (dynamic_yarn) is no one shared table: "frozen"
    # splits it between q and k, "rerotate" re-rotates the cached keys at the current length
    # (posenc's attention, keys cached unrotated); no transformers type to match here
    length_factor = getattr(encoding, "_attention_of_length", None) is not None
    return ((plain_rope or multi_axis) and not length_factor
            and encoding.hooks == frozenset({Hook.ROTATE}) and encoding.interleaved == family.interleaved
            and encoding.rotary_dim == width)


class _RotaryProbe:
    """Each layer's rotary width, read from the model's own tables (one call of its rotary
    module per layer type, on one position)."""

    def __init__(self, base: nn.Module, family: Family, config: Any) -> None:
        self.rotary, self.family = getattr(base, family.rotary), family
        self.layer_types = getattr(config, "layer_types", None)
        self.takes_layer_type = "layer_type" in inspect.signature(self.rotary.forward).parameters
        self.cache: dict[Any, int] = {}
        parameter = next(base.parameters(), None)
        self.x = torch.zeros(1, 1, 1, device=None if parameter is None else parameter.device,
                             dtype=torch.float32 if parameter is None else parameter.dtype)

    def width(self, index: int) -> int:
        layer_type = self.layer_types[index] if self.takes_layer_type and self.layer_types else None
        if layer_type not in self.cache:
            positions = torch.zeros(1, 1, dtype=torch.long, device=self.x.device)
            with torch.no_grad():
                tables = self.rotary(self.x, positions, layer_type) if self.takes_layer_type else self.rotary(self.x, positions)
            self.cache[layer_type] = self.family.tables.width(tables)
        return self.cache[layer_type]


def _tables_hook(decision: _Layer, family: Family, memo: dict):
    """The decoder layer's forward pre-hook: its position_embeddings from posenc (the layer's
    RoPE, or the identity), the call's position_ids kept for its attention module, and the
    StaticCache refusal on posenc-route layers."""
    rope = decision.plan.encoding if not decision.posenc_route and decision.plan.encoding is not None \
        and decision.plan.encoding.hooks else None
    attention_module, width = decision.attention, decision.width

    def set_tables(module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        given = kwargs.get("position_ids")
        # the tables' positions: the rotary module's input where the layers are not handed them
        # (Qwen2-VL: M-RoPE's (3, B, T)), else the layer's position_ids, else 0 .. T-1
        positions = memo.get(_ROTARY_POSITIONS) if family.rotary_positions else None
        if positions is None:
            positions = given
        if positions is None:
            positions = torch.arange(hidden.shape[-2], device=hidden.device).unsqueeze(0)
        # one coordinate per token for what reads one (posenc's attention, a plain RoPE): the
        # layer's own position_ids (packed text positions) where given, else the first axis
        # (M-RoPE's temporal axis; on text tokens every axis is the text position)
        sequence = given if given is not None else positions[0] if positions.dim() == 3 else positions
        if decision.posenc_route:
            _refuse_static_cache(kwargs.get("cache", kwargs.get("past_key_values")), attention_module, decision.index)
            attention_module.__dict__[_POSITIONS_ATTR] = sequence
        table_dtype = torch.promote_types(hidden.dtype, torch.float32)
        if rope is None:
            shape = (*positions.shape[-2:], width)
            cos = torch.ones(shape, dtype=table_dtype, device=hidden.device)
            tables = family.tables.build(cos, torch.zeros_like(cos), hidden.dtype)
        else:
            if positions.dim() == 3 and rope.position_axes != positions.shape[0]:
                positions = sequence
            key = id(rope)
            cached = memo.get(key)
            if cached is not None and cached[0] is positions and cached[1] == hidden.dtype:
                tables = cached[2]
            else:
                cos, sin = rope.cos_sin(positions, table_dtype)
                tables = family.tables.build(cos, sin, hidden.dtype)
                memo[key] = (positions, hidden.dtype, tables)
        return args, {**kwargs, "position_embeddings": tables}

    return set_tables


#: The memo key of the positions the base model last handed its rotary module (Family.rotary_positions).
_ROTARY_POSITIONS = "rotary_positions"


def _rotary_positions_hook(memo: dict):
    """The rotary module's forward pre-hook keeping the positions it is called at, (x, position_ids)."""
    def keep_positions(module, args, kwargs):
        memo[_ROTARY_POSITIONS] = args[1] if len(args) > 1 else kwargs.get("position_ids")

    return keep_positions


def _refuse_static_cache(cache: Any, module: nn.Module, index: int) -> None:
    if cache is None:
        return
    from transformers.cache_utils import StaticLayer

    cache_layers = getattr(cache, "layers", None) or []
    layer_index = getattr(module, "layer_idx", index)
    layer = cache_layers[layer_index] if isinstance(layer_index, int) and layer_index < len(cache_layers) else None
    if isinstance(layer, StaticLayer) or (layer is None and getattr(cache, "is_compileable", False)):
        raise InvalidArgument(
            f"layer {index}: a StaticCache ({type(cache).__name__}) keeps keys in fixed slots, which posenc's attention "
            "cannot position; generate with the default DynamicCache (no cache_implementation='static'), or use a "
            "rotary encoding that the model's own attention applies"
        )


# -- extend_context ---------------------------------------------------------------------------------

def extend_context(model: nn.Module, method: str, factor: float | None = None, *,
                   layer_types: Sequence[str] | None = None, **params: Any) -> nn.Module:
    """Extend the context of a loaded RoPE model, in place: a RoPE scaling written into its
    config, or a training-free position map run in its attention.

    **Scalings** (``method`` one of :data:`posenc.rope.EXTENSION_METHODS`: linear, ntk,
    dynamic, yarn, dynamic_yarn, llama3; ``factor`` s >= 1). The config gets the fields of
    :func:`posenc.hf_config.extension_config` (the scaling
    :func:`posenc.rope.extension_scaling` ``(method, factor, L0)`` with ``params`` on top,
    e.g. ``beta_fast=16`` for yarn (defaults: Hugging Face's, beta_fast 32, beta_slow 1,
    attention factor 0.1 ln s + 1; llama3: low_freq_factor 1, high_freq_factor 4), L0 the
    config's ``max_position_embeddings`` or ``original_max_position_embeddings=`` in
    ``params``, in Hugging Face's ``rope_parameters`` spelling, ``max_position_embeddings``
    extended where transformers does not read L0 from it), so that ``save_pretrained`` then a
    plain ``from_pretrained`` (no posenc) computes the same logits. A config with one rope dict
    per layer type (Gemma 3) has the layer types ``layer_types`` scaled, by default the
    family's (Gemma 3: ``"full_attention"``, the global layers, as Google's long-context recipe
    scales them); the others keep theirs. The model then runs posenc's RoPE of the new config
    on its RoPE layers (:func:`use_encoding`), its other layers as they were.

    ``dynamic_yarn`` (YaRN sec. 3.3: s = max(1, L / L0) of the current length L, YaRN's ramp
    and attention factor 0.1 ln s + 1; plain RoPE at every L <= L0; ``factor`` is recorded as
    the declared extension and does not enter the frequencies) takes ``dynamic_cache=``
    (:class:`posenc.RoPE`): ``"rerotate"`` (default; a prefill of T tokens is static YaRN at
    factor T / L0; with the cache, old keys are re-rotated at the current length, exact for the
    first layer only) or ``"frozen"`` (the token at p rotated at length p + 1, the logit scaled
    by its query's length only; cached decoding equals the full pass). Its layers run posenc's
    attention (keys cached unrotated), so layers with logit soft-capping (Gemma 2) or attention
    sinks refuse it. transformers has no ``dynamic_yarn``: a plain ``from_pretrained`` of the
    saved config raises ``KeyError('dynamic_yarn')`` building the model; :func:`from_pretrained`
    loads it (docs/integration.md).
    ``dynamic_cache=`` is taken by ``dynamic`` too (``"frozen"``: what transformers computes
    decoding token by token).

    The model's plan is the one :func:`use_encoding` applied last (``base_model.posenc_plan``),
    else ``posenc.hf_config.position_plan(config)`` for a family posenc reads, else one RoPE read
    from the config (:func:`~posenc.hf_config.from_hf_config`, in the family's pair layout) for
    every layer.

    Qwen2-VL / Qwen2.5-VL: the scaling is written to ``config.text_config``'s rope dict (where
    their text model's rotary embedding reads it; ``mrope_section`` kept) and the text tower
    runs posenc's M-RoPE of it. Falcon with rotary: written to its config, the model runs the
    new config's plan through its adapter. Refused, saying why: GPT-J (transformers builds its
    rotary table from ``rotary_dim`` and base 10000 only, reading no scaling), and the
    families without RoPE (ALiBi: BLOOM, MPT, Falcon with ``alibi``; GPT-2's and OPT's learned
    tables; T5's buckets).

    **Position maps** (``method`` one of :data:`posenc.integrations.branch_attention.BRANCH_METHODS`,
    no ``factor``; :mod:`posenc.attention.branches`; parameters as the reference code spells
    them, defaults the published ones, scaled to the training length L0 where the reference
    scales them, :func:`~posenc.integrations.branch_attention.method_defaults`):

    - ``streaming_llm`` (start_size 4, recent_size 512; every key stays in the cache, the
      evicted ones masked);
    - ``self_extend`` (group_size 8, neighbor_window 1024);
    - ``rerope`` (window 512, training_length L0) and ``leaky_rerope`` (window 512,
      scaling_factor 16, training_length L0), with their log-n query scaling;
    - ``lm_infinite`` (local_branch L0, global_branch 100);
    - ``dca`` (the config's ``dual_chunk_attention_config``, else chunk_size 3 L0 / 4,
      local_size L0 / 16);
    - ``string`` (shifted_offset int(0.33 L0), local_value 128, attention_factor 0.1 ln 2 + 1;
      ``attention_factor=1.0`` for plain RoPE inside the window).

    Every layer with a plain RoPE and a full span runs the map
    (:mod:`posenc.integrations.branch_attention`: identity rotary tables, keys cached
    unrotated, the branches rotated by posenc's RoPE of the layer at each call); sliding-window
    and chunked layers (Gemma 2/3's local layers, Cohere 2's, gpt-oss's) and NoPE layers keep
    the model's own. ``generate()`` with its ``DynamicCache`` equals the full forward. The config
    gets ``posenc_context_extension`` = {"format": 1, "method", "params" (resolved), "layers"}:
    :func:`from_pretrained` applies it again; a plain transformers ``from_pretrained`` ignores
    it and runs the **unextended** model (equal to the extended one inside the map's window
    only).

    Args:
        model: a transformers decoder; for a scaling, its RoPE has the default rope_type.
        method: a scaling or a position map, as above.
        factor: s >= 1, for the scalings only.
        layer_types: for a per-layer-type config, the layer types to scale (scalings only).
        params: the scaling's extra fields (and ``dynamic_cache``), or the map's parameters.

    Returns:
        ``model``, changed in place (its config too).

    Raises:
        MissingKey (KeyError): a scaling without ``factor``.
        InvalidArgument (ValueError): the model's RoPE is already scaled (scalings), an unknown
            method (the message lists both kinds), s < 1, a bad or unknown parameter (named),
            a ``factor`` or ``layer_types`` given to a position map, ``dynamic_cache`` for
            another method than dynamic / dynamic_yarn; a model with no RoPE layer (every
            layer NoPE); a per-layer-type config without ``layer_types`` where the family
            names none, or naming a type the config does not have; a family whose transformers
            model reads no scaling from its config (GPT-J) or that has no RoPE; a model running
            another plan of :func:`use_encoding` than its config's (extend first). For the
            position maps: a family with multi-axis positions (Qwen2-VL), an adapter family
            (GPT-2, OPT, BLOOM, MPT, Falcon, T5), a RoPE not in the leading dimensions of the
            head (DeepSeek-V3's MLA), no layer with a plain RoPE and a full span (Mistral with
            a sliding window, Llama 4), leaky_rerope on an already scaled RoPE; at a forward
            call, padding in the attention mask, position_ids other than past + 0 .. T-1, a
            4-d mask or a StaticCache. And as :func:`use_encoding`. On an error at extension
            time, model and config are left unchanged.
    """
    if isinstance(method, str) and method in branches.BRANCH_METHODS:
        if factor is not None:
            raise InvalidArgument(f"factor: {method} is a position map and takes no factor; its parameters are "
                                  f"{list(branches.BRANCH_METHODS[method])}")
        if layer_types is not None:
            raise InvalidArgument(f"layer_types: {method} applies to every layer with RoPE and a full span")
        return _extend_with_branches(model, method, params)
    if not isinstance(method, str) or method not in EXTENSION_METHODS:
        raise InvalidArgument(f"method must be one of the scalings {list(EXTENSION_METHODS)} or the position maps "
                              f"{list(branches.BRANCH_METHODS)}, got {method!r}")
    if factor is None:
        raise MissingKey(f"factor: extend_context(model, {method!r}, factor) needs the scaling factor s")
    dynamic_cache = params.pop("dynamic_cache", None)
    if dynamic_cache is not None and method not in ("dynamic", "dynamic_yarn"):
        raise InvalidArgument(f"dynamic_cache: for dynamic and dynamic_yarn only, not {method!r}")
    adapter = ADAPTERS.get(getattr(getattr(model, "config", None), "model_type", None))
    family = family_of(model) if adapter is None else None
    if dynamic_cache is not None and (adapter is not None or family.text_config is not None):
        raise InvalidArgument(f"dynamic_cache: not taken for {model.config.model_type} (its plan is read from the "
                              "config alone)")
    if adapter is not None:
        return _extend_adapter_family(model, adapter, method, factor, layer_types, params)
    base = _base_model(model, family)
    config = model.config
    if family.no_scaling is not None:
        raise InvalidArgument(f"model: {config.model_type} does not read a RoPE scaling from its config "
                              f"({family.no_scaling}): nothing to extend")
    if family.text_config is not None:
        return _extend_text_config(model, family, base, method, factor, layer_types, params)
    current = config.to_dict()
    if "max_position_embeddings" not in current and isinstance(getattr(config, "max_position_embeddings", None), int):
        # an attribute_map alias (GPT-J's n_positions), which to_dict() spells the family's way
        current["max_position_embeddings"] = config.max_position_embeddings
    plan = _own_plan(base, current)
    if plan is not None and all(layer.encoding is None for layer in plan):
        raise InvalidArgument("model: every layer is NoPE (no positional encoding), there is no RoPE to extend")
    per_type = _per_layer_type_rope(current)
    if per_type is None:
        if layer_types is not None:
            raise InvalidArgument("layer_types: the config has one rope dict for every layer, not one per layer type")
        fields = extension_config(current, method, factor, **params)
        scaled_types = None
    else:
        key, dicts = per_type
        scaled_types = tuple(layer_types) if layer_types is not None else family.scaled_layer_types
        if not scaled_types:
            raise InvalidArgument(f"layer_types: the config has one rope dict per layer type {sorted(dicts)}; name the "
                                  "ones to scale (layer_types=[...])")
        unknown = [t for t in scaled_types if t not in dicts]
        if unknown:
            raise InvalidArgument(f"layer_types: {unknown} not among the config's {sorted(dicts)}")
        new_dicts = dict(dicts)
        fields = {}
        for layer_type in scaled_types:
            # one layer type's rope dict, read plainly (without model_type, the family's reader
            # would ask for the dict of every type): the extension's fields of that one dict
            flat = {**{k: v for k, v in current.items() if k != "model_type"}, key: dict(dicts[layer_type])}
            extension = extension_config(flat, method, factor, **params)
            if "max_position_embeddings" in extension:
                fields["max_position_embeddings"] = extension["max_position_embeddings"]
            new_dicts[layer_type] = extension.get("rope_parameters", dicts[layer_type])
        fields[key] = new_dicts
    new_config = {**current, **fields}
    _check_transformers_reads(config, fields, method)
    if reads_model_type(new_config.get("model_type")) and plan is not None and _plan_quietly(new_config) == plan.describe():
        raise InvalidArgument(f"model: {new_config['model_type']} does not read a RoPE scaling from its config "
                              "(transformers builds the same model from the extended config): nothing to extend")
    options = {} if dynamic_cache is None else {"dynamic_cache": dynamic_cache}
    new_plan = _extended_plan(plan, new_config, scaled_types, per_type is not None, model, options)
    apply = _prepare(model, new_plan, None, {})  # every refusal before the config changes
    for name, value in fields.items():
        setattr(config, name, value)
    apply()
    return model


def _extend_with_branches(model: nn.Module, method: str, params: dict) -> nn.Module:
    """extend_context for a position map (:mod:`posenc.integrations.branch_attention`): every
    check first, then the identity tables, the branch attention and the positions check."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type in ADAPTERS:
        raise InvalidArgument(f"model: {method} is not available for {model_type}: its positions go through posenc's "
                              f"adapter for the family, not transformers' AttentionInterface with RoPE tables")
    family = family_of(model)
    base = _base_model(model, family)
    if family.text_config is not None or family.rotary_positions:
        raise InvalidArgument(f"model: {model_type} has multi-axis positions (M-RoPE); {method} maps one position "
                              "per token")
    if family.head_dim != "head_dim":
        raise InvalidArgument(f"model: {model_type}'s RoPE is on the last dimensions of each head (MLA), not the "
                              f"leading ones posenc's RoPE rotates; {method} is not available for it")
    current = config.to_dict()
    own = position_plan(current) if reads_model_type(model_type) else None
    recorded = base.__dict__.get("posenc_plan")
    if recorded is not None and own is not None and recorded.describe() != own.describe():
        raise InvalidArgument(f"model: it runs a plan of use_encoding ({recorded.describe()!r}), not the RoPE of its "
                              f"config; {method} maps the config's RoPE: extend before use_encoding")
    decoder_layers = list(getattr(base, family.layers))
    plan = own if own is not None else PositionPlan.uniform(
        from_hf_config(current, interleaved=family.interleaved), len(decoder_layers))
    map_, resolved = branches.resolve_map(method, params, config)
    probe = _RotaryProbe(base, family, _sizes_config(config, family))
    chosen = []
    for index, (decoder_layer, layer_plan) in enumerate(zip(decoder_layers, plan)):
        module = getattr(decoder_layer, family.attention, None)
        encoding = layer_plan.encoding
        # sliding and chunked layers never see a distance past their window; NoPE has no RoPE
        if module is None or not isinstance(encoding, RoPE) or layer_plan.span != "full":
            continue
        layer = branches.make_layer(method, map_, resolved, encoding, f"layer {index}")
        chosen.append((index, module, layer, probe.width(index)))
    if not chosen:
        raise InvalidArgument(f"model: {model_type} has no layer with RoPE and a full span ({plan.describe()!r}); "
                              f"{method} maps full attention (sliding-window and chunked layers keep theirs)")
    original = base.__dict__.get("_posenc_original_attn", config._attn_implementation)
    _transformers_attention_function(original)  # one that cannot serve the other layers: refused now
    record = {"format": 1, "method": method, "params": dict(resolved), "layers": [c[0] for c in chosen]}

    _restore(model, base, family)
    handles = [base.register_forward_pre_hook(branches.positions_check(_refuse_static_layers), with_kwargs=True)]
    memo: dict[Any, Any] = {}
    for index, module, layer, width in chosen:
        module.__dict__[branches.BRANCH_ATTR] = layer
        identity = _Layer(index, LayerPlan(None), module, width, posenc_route=False)
        handles.append(decoder_layers[index].register_forward_pre_hook(_tables_hook(identity, family, memo),
                                                                       with_kwargs=True))
    base.__dict__["_posenc_hooks"] = handles
    base.__dict__["_posenc_original_attn"] = config._attn_implementation
    _register_branch_attention()
    for decoder_layer in decoder_layers:
        module = getattr(decoder_layer, family.attention, None)
        if module is not None:
            module.__dict__[_FALLBACK_ATTR] = original
    model.set_attn_implementation(branches.ATTN_IMPLEMENTATION)
    setattr(config, branches.CONFIG_KEY, record)
    return model


def _branch_attention_entry(module, query, key, value, attention_mask, **kwargs):
    return branches.branch_attention_forward(module, query, key, value, attention_mask, fallback=_fallback, **kwargs)


def _register_branch_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(branches.ATTN_IMPLEMENTATION, _branch_attention_entry)
    AttentionMaskInterface.register(branches.ATTN_IMPLEMENTATION, sdpa_mask)


def _extension_fields(config: Any, current: dict, method: str, factor: float, layer_types: Any, params: dict,
                      model_type: str) -> dict:
    """The extension's config fields for a config with one rope dict (read plainly: the family
    was read by the caller), checked against transformers' config class."""
    if layer_types is not None:
        raise InvalidArgument(f"layer_types: {model_type} has one rope dict for every layer, not one per layer type")
    flat = {key: value for key, value in current.items() if key != "model_type"}
    fields = extension_config(flat, method, factor, **params)
    _check_transformers_reads(config, fields, method)
    return fields


def _unchanged_plan_refusal(model_type: str, old: PositionPlan, new: PositionPlan) -> None:
    if new.describe() == old.describe():
        raise InvalidArgument(f"model: {model_type} does not read a RoPE scaling from its config (transformers builds "
                              "the same model from the extended config): nothing to extend")


def _extend_text_config(model: nn.Module, family: Family, base: nn.Module, method: str, factor: float,
                        layer_types: Any, params: dict) -> nn.Module:
    """extend_context for a model whose decoder's RoPE is in a nested config (Qwen2-VL,
    Qwen2.5-VL: ``config.text_config``, where their text model's rotary embedding reads it;
    the M-RoPE's ``mrope_section`` kept in the rope dict)."""
    config = model.config
    text = getattr(config, family.text_config)
    own = position_plan(config)
    recorded = base.__dict__.get("posenc_plan")
    if recorded is not None and recorded.describe() != own.describe():
        raise InvalidArgument(f"model: it runs a plan of use_encoding ({recorded.describe()!r}), not the RoPE of its "
                              "config; extend_context scales the config's RoPE: extend before use_encoding")
    fields = _extension_fields(text, text.to_dict(), method, factor, layer_types, params, config.model_type)
    new_plan = position_plan({**config.to_dict(), family.text_config: {**text.to_dict(), **fields}})
    _unchanged_plan_refusal(config.model_type, own, new_plan)
    apply = _prepare(model, new_plan, None, {})  # every refusal before the config changes
    for name, value in fields.items():
        setattr(text, name, value)
    apply()
    return model


def _extend_adapter_family(model: nn.Module, adapter: adapters.Adapter, method: str, factor: float,
                           layer_types: Any, params: dict) -> nn.Module:
    """extend_context for an adapter family with RoPE (Falcon's rotary): the extended config's
    plan through the family's plan adapter. ALiBi, learned tables and T5 buckets have no RoPE
    to scale: refused, saying which."""
    config = model.config
    current = config.to_dict()
    own = position_plan(current)
    if not all(isinstance(layer.encoding, RoPE) for layer in own) or own.encoder is not None:
        raise InvalidArgument(f"model: {config.model_type}'s positions are {own.describe()!r}, not RoPE on every "
                              "layer: extend_context scales a RoPE (ALiBi, learned tables and T5 buckets have no "
                              "scaling to write)")
    recorded = model.base_model.__dict__.get("posenc_plan")
    if recorded is not None and recorded.describe() != own.describe():
        raise InvalidArgument(f"model: it runs a plan of use_encoding ({recorded.describe()!r}), not the RoPE of its "
                              "config; extend_context scales the config's RoPE: extend before use_encoding")
    fields = _extension_fields(config, current, method, factor, layer_types, params, config.model_type)
    new_plan = position_plan({**current, **fields})
    _unchanged_plan_refusal(config.model_type, own, new_plan)
    apply_plan = adapter.plan(model, new_plan)  # every refusal before the config changes
    record = _record(None, None, new_plan)
    for name, value in fields.items():
        setattr(config, name, value)
    adapters.restore(model)
    apply_plan()
    _keep_plan(model, new_plan, record)
    return model


def _plan_quietly(config: dict) -> str:
    """The description of the plan ``config`` reads, without the reader's warnings (the config
    is a candidate, not the user's)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return position_plan(config).describe()


def _check_transformers_reads(config: Any, fields: dict, method: str) -> None:
    """Refuse an extension the family's own config class would refuse to load (Phi-3 accepts
    longrope only): a saved model must load in plain transformers."""
    try:
        type(config).from_dict({**config.to_dict(), **fields})
    except Exception as err:  # transformers' validators raise several types
        raise InvalidArgument(f"method={method!r}: transformers' {type(config).__name__} refuses the extended config "
                              f"({' '.join(str(err).split())[:300]})") from err


def _own_plan(base: nn.Module, config: dict) -> PositionPlan | None:
    recorded = base.__dict__.get("posenc_plan")
    if recorded is not None:
        return recorded
    # a family posenc knows is read exactly, layer by layer; another Llama-shaped model falls
    # back to the one RoPE its config spells (as before per-layer plans)
    return position_plan(config) if reads_model_type(config.get("model_type")) else None


def _per_layer_type_rope(config: dict) -> tuple[str, dict] | None:
    for key in ("rope_parameters", "rope_scaling"):
        value = config.get(key)
        if isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
            return key, value
    return None


def _extended_plan(plan: PositionPlan | None, new_config: dict, scaled_types: tuple[str, ...] | None,
                   per_type: bool, model: nn.Module, options: dict | None = None) -> PositionPlan:
    options = options or {}
    if plan is None:
        if per_type:
            raise InvalidArgument("model: a per-layer-type RoPE config needs the model's plan (use_encoding(model, plan) "
                                  "first, or posenc.hf_config.position_plan)")
        family = family_of(model)
        count = len(getattr(_base_model(model, family), family.layers))
        return PositionPlan.uniform(from_hf_config(new_config, interleaved=family.interleaved, **options), count)
    layer_types = new_config.get("layer_types")
    layers = []
    for index, layer in enumerate(plan):
        old = layer.encoding
        layer_type = layer.layer_type or (layer_types[index] if layer_types else None)
        scaled = isinstance(old, RoPE) and (scaled_types is None or layer_type in scaled_types)
        if scaled:
            read = from_hf_config(new_config, layer_type=layer_type if per_type else None)
            new = RoPE(old.head_dim, rotary_dim=old.rotary_dim, base=read.base, scaling=read.scaling,
                       interleaved=old.interleaved, max_position_embeddings=new_config.get("max_position_embeddings"),
                       **options)
            layer = LayerPlan(new, layer.span, layer.window, layer.layer_type, layer.sinks)
        layers.append(layer)
    return PositionPlan(tuple(layers), plan.embedding, plan.model_type, plan.encoder, plan.notes)


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
) -> tuple[Tensor, Tensor | None]:
    """transformers' attention-function signature over :func:`posenc.attention`.

    query (B, H, Tq, D), key and value (B, H_kv, Tk, D) -> (output (B, Tq, H, D), None). A
    module without a posenc encoding (a table-route layer) runs the model's original attention
    function (eager gets the boolean mask as an additive one).

    Raises:
        InvalidArgument: soft-capping or attention sinks asked of posenc's attention.
    """
    if _ENCODING_ATTR not in module.__dict__:
        return _fallback(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    if kwargs.get("softcap") is not None:
        raise InvalidArgument("posenc attention does not apply logit soft-capping (softcap); use the model's own attention")
    if kwargs.get("s_aux") is not None:
        raise InvalidArgument("posenc attention has no attention sinks (s_aux); use the model's own attention")
    encoding = module.__dict__[_ENCODING_ATTR]
    # the positions the layer's or the stack's pre-hook kept for this call (an adapter family's:
    # OPT's padding -1 read at 0), else the ones transformers hands the attention
    positions = module.__dict__.get(_POSITIONS_ATTR)
    if positions is None:
        positions = kwargs.get("position_ids")
    q_positions = _query_positions(positions, query)
    k_positions = _key_positions(q_positions, key.shape[2])
    out = attention(
        query, key, value, encoding, causal=bool(getattr(module, "is_causal", True)),
        q_positions=q_positions, k_positions=k_positions, mask=_boolean_mask(attention_mask),
        scale=scaling, dropout_p=dropout,
    )
    return out.transpose(1, 2).contiguous(), None


def _fallback(module, query, key, value, attention_mask, **kwargs):
    name = module.__dict__.get(_FALLBACK_ATTR, "sdpa")
    function = _transformers_attention_function(name, module)
    if name == "eager":
        attention_mask = _additive_mask(attention_mask, query, key, bool(getattr(module, "is_causal", True)))
    return function(module, query, key, value, attention_mask, **kwargs)


def _transformers_attention_function(name: str, module: nn.Module | None = None):
    """The attention function transformers runs for implementation ``name`` where it takes
    the boolean SDPA mask posenc's entry receives: "sdpa", or "eager" (the modeling file's own
    ``eager_attention_forward``, given an additive mask); None for eager without a module."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if name == "sdpa":
        return ALL_ATTENTION_FUNCTIONS[name]
    if name == "eager":
        if module is None:
            return None
        eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
        if eager is not None:
            return eager
    raise InvalidArgument(f"model: attention implementation {name!r} cannot serve the layers that keep the model's "
                          "own attention next to posenc's; load the model with attn_implementation='sdpa' or 'eager'")


def _additive_mask(mask: Tensor | None, query: Tensor, key: Tensor, causal: bool) -> Tensor | None:
    """The boolean SDPA mask (True = may attend; None = plain causal, queries the last keys) as
    eager attention's additive float mask of query's dtype."""
    if mask is not None and mask.dtype != torch.bool:
        return mask
    if mask is None:
        if not causal:
            return None
        num_queries, num_keys = query.shape[2], key.shape[2]
        rows = torch.arange(num_queries, device=query.device).unsqueeze(-1) + (num_keys - num_queries)
        mask = (torch.arange(num_keys, device=query.device) <= rows)[None, None]
    zero = torch.zeros((), dtype=query.dtype, device=query.device)
    return torch.where(mask, zero, torch.finfo(query.dtype).min)


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


def _base_model(model: nn.Module, family: Family) -> nn.Module:
    base = getattr(model, "base_model", model)
    if family.base is not None and not hasattr(base, family.layers):
        # the dotted path from the model, or its trailing parts from the model itself (a base
        # model given: Qwen2VLModel holds "language_model" of "model.language_model")
        parts = family.base.split(".")
        for start in range(len(parts)):
            found = model
            for part in parts[start:]:
                found = getattr(found, part, None)
            if found is not None and hasattr(found, family.layers):
                base = found
                break
    missing = [name for name in (family.layers, family.rotary) if not hasattr(base, name)]
    if missing or not hasattr(model, "config"):
        raise InvalidArgument(
            f"model: expected a transformers decoder whose base model has '{family.layers}' and '{family.rotary}' "
            f"(LlamaForCausalLM, Qwen2ForCausalLM, GPTNeoXForCausalLM, ...); {type(model).__name__} lacks "
            f"{missing or ['config']}"
        )
    return base


def _native_temperature(module: nn.Module, family: Family) -> tuple[int, float] | None:
    """(floor_scale, attn_scale) where this attention module scales its queries by the
    attention temperature itself (Llama 4's NoPE layers), else None."""
    if family.temperature is None:
        return None
    switch, floor_scale, attn_scale = family.temperature
    if not getattr(module, switch, False) or getattr(module, "use_rope", True):
        return None
    return int(getattr(module, floor_scale)), float(getattr(module, attn_scale))


def _is_temperature(encoding: PositionalEncoding | None, native: tuple[int, float]) -> bool:
    """The plan asks for exactly the temperature the model applies itself."""
    return isinstance(encoding, AttentionTemperature) and (encoding.floor_scale, encoding.attn_scale) == native


def _restore(model: nn.Module, base: nn.Module, family: Family) -> None:
    """Undo an earlier :func:`use_encoding` on this model, so that a second call starts clean."""
    for handle in base.__dict__.pop("_posenc_hooks", []):
        handle.remove()
    for module, switch, value in base.__dict__.pop("_posenc_switched_off", []):
        setattr(module, switch, value)
    base.__dict__.pop("posenc_plan", None)
    model.config.__dict__.pop(CONFIG_KEY, None)
    model.config.__dict__.pop(branches.CONFIG_KEY, None)
    if "posenc_encoding" in base._modules:
        del base._modules["posenc_encoding"]
    for layer in getattr(base, family.layers):
        module = getattr(layer, family.attention, None)
        if module is not None:
            for attr in (_ENCODING_ATTR, _POSITIONS_ATTR, _FALLBACK_ATTR, branches.BRANCH_ATTR):
                module.__dict__.pop(attr, None)
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
