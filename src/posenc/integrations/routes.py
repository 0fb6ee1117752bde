"""use_encoding: each decoder layer's route, chosen from what its encoding does.

See :mod:`posenc.integrations.transformers` for the two routes (the model's own attention fed
posenc's tables, or posenc's attention) and the positions each layer reads.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from posenc.encodings import Hook, PositionalEncoding, RoPE, create_for_model
from posenc.encodings.irope import AttentionTemperature
from posenc.encodings.rope.multiaxis import MultiAxisRoPE
from posenc.encodings.rope.query_scaled import QueryScaledRoPE
from posenc.errors import InvalidArgument, InvalidType
from posenc.hf_config.families import NO_ATTENTION_TYPES
from posenc.integrations import branch_attention as branches
from posenc.integrations.adapter_route import chosen_layers, prepare_adapter
from posenc.integrations.adapters import adapter_of
from posenc.integrations.attention_function import (
    ATTN_IMPLEMENTATION,
    ENCODING_ATTR,
    FALLBACK_ATTR,
    POSITIONS_ATTR,
    register_with_transformers,
    transformers_attention_function,
)
from posenc.integrations.families import FamilyModules as Family
from posenc.integrations.families import base_model, family_of, sizes_config
from posenc.integrations.record import CONFIG_KEY, plan_record
from posenc.plan import LayerPlan, PositionPlan


@dataclass
class LayerRoute:
    """One decoder layer's decision: its plan, the route, its tables' width."""

    index: int
    plan: LayerPlan
    attention: nn.Module
    width: int
    posenc_route: bool
    native_temperature_off: bool = False
    native_query_scale_off: bool = False


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
            heads (both named); one with the ``gate`` hook (FoX). (A layer with attention sinks,
            gpt-oss, or logit soft-capping, Gemma 2, keeps them on either route: posenc's
            attention takes ``sinks=`` and ``softcap=``.) For an adapter family (the message names the
            family and the encoding): a plan with ``layers`` or one the adapter cannot apply
            (it says what it takes); an encoding with the gate hook (FoX), with several
            position axes (M-RoPE), with another head count or head_dim than the model's, an
            embedding encoding with ``layers``, a name that does not build for the stack's sizes.
        InvalidType: (a TypeError) neither a plan, an encoding nor a name.
        ImportError: transformers is not installed.

    On an error the model is left as it was.
    """
    adapter = adapter_of(model)
    if adapter is not None:  # the families whose positions an adapter hands to posenc
        apply = prepare_adapter(model, adapter, plan_or_encoding, layers, kwargs)
    else:
        apply = prepare_layers(model, plan_or_encoding, layers, kwargs)
    apply()
    return model


def prepare_layers(model: nn.Module, plan_or_encoding: Any, layers: Sequence[int] | None, kwargs: dict) -> Callable[[], None]:
    """Check everything and decide every layer's route without changing the model; returns the
    function that applies the decision (it raises nothing a user could cause)."""
    family = family_of(model)
    base = base_model(model, family)
    config = model.config
    sizes = sizes_config(config, family)  # the decoder's sizes (a VL model's text_config)
    decoder_layers = list(getattr(base, family.layers))
    count = len(decoder_layers)
    head_dim = _head_dim(sizes, decoder_layers, family)
    registered: nn.Module | None = None
    uniform = isinstance(plan_or_encoding, (str, PositionalEncoding))  # every attention layer takes it
    if isinstance(plan_or_encoding, str):
        # one encoding per width of the layers' heads (Gemma 4's global layers are wider)
        widths = [getattr(attention_of(layer, family), family.head_dim, head_dim) for layer in decoder_layers]
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
    chosen = chosen_layers(layers, count)
    if layers is not None and plan.embedding is not None:
        raise InvalidArgument("layers: an embedding encoding (embed hook) is added before the first layer, not per layer")
    if plan.embedding is not None:
        _check_encoding(plan.embedding, sizes, head_dim, "plan.embedding")

    decisions: list[LayerRoute] = []
    probe = RotaryProbe(base, family, sizes)
    for index in chosen:
        layer_plan = plan[index]
        module = attention_of(decoder_layers[index], family)
        encoding = layer_plan.encoding
        where = f"layer {index}"
        if module is None or _without_attention(layer_plan, sizes, index):
            # Qwen3-Next's linear-attention layers (no module); NemotronH's Mamba / MLP blocks
            # under the attention attribute (typed): no positions to give
            if encoding is not None and not uniform:
                raise InvalidArgument(f"plan: {where} has no '{family.attention}' (no softmax attention), "
                                      f"it cannot take {type(encoding).__name__}")
            continue
        width = probe.width(index)
        native = _native_temperature(module, family, base)
        if native is not None and _is_temperature(encoding, native):
            # the model scales its queries itself: identity tables, the model's own attention
            decisions.append(LayerRoute(index, dataclasses.replace(layer_plan, encoding=None), module, width,
                                    posenc_route=False))
            continue
        scale = _native_query_scale(module, family, base)
        if scale is not None and _is_query_scale(encoding, scale):
            # the model scales its queries itself: the plan's RoPE alone, on its usual route
            layer_plan = dataclasses.replace(layer_plan, encoding=_unscaled(encoding))
            encoding, scale = layer_plan.encoding, None
        if encoding is None or not encoding.hooks:  # NoPE: the identity tables, the model's own attention
            decisions.append(LayerRoute(index, layer_plan, module, width, posenc_route=False,
                                    native_temperature_off=native is not None,
                                    native_query_scale_off=scale is not None))
            continue
        tables = _takes_tables(encoding, family, width)
        # the tables cover the rotary width (checked above); posenc's attention sees whole heads
        _check_encoding(encoding, sizes, None if tables else getattr(module, family.head_dim, head_dim), where)
        decisions.append(LayerRoute(index, layer_plan, module, width, posenc_route=not tables,
                                native_temperature_off=native is not None, native_query_scale_off=scale is not None))
    needs_posenc = any(d.posenc_route for d in decisions)
    original_attn = base.__dict__.get("_posenc_original_attn", config._attn_implementation)
    if needs_posenc:
        transformers_attention_function(original_attn)  # refuse one that cannot serve the other layers, now
    if registered is None:
        distinct = {id(e): e for e in [plan.embedding, *(d.plan.encoding for d in decisions)] if e is not None}
        registered = nn.ModuleList(distinct.values()) if distinct else None

    record = plan_record(registered if uniform else None, layers, plan)

    def apply() -> None:
        restore(model, base, family)
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
        if family.rotary_positions and probe.rotary is not None:
            handles.append(getattr(base, family.rotary).register_forward_pre_hook(_rotary_positions_hook(memo),
                                                                                  with_kwargs=True))
        switched_off = []
        for decision in decisions:
            if decision.posenc_route:
                decision.attention.__dict__[ENCODING_ATTR] = decision.plan.encoding
            if decision.native_temperature_off:
                switch = family.temperature[0]
                switched_off.append((decision.attention, switch, getattr(decision.attention, switch)))
                setattr(decision.attention, switch, False)
            if decision.native_query_scale_off:
                module = decision.attention
                switched_off.append((module, "config", module.config))
                module.config = _QueryScaleOff(module.config, family.query_scale)
            hook = tables_hook(decision, family, memo)
            handles.append(decoder_layers[decision.index].register_forward_pre_hook(hook, with_kwargs=True))
        base.__dict__["_posenc_switched_off"] = switched_off
        base.__dict__["_posenc_hooks"] = handles
        if needs_posenc:
            register_with_transformers()
            original = config._attn_implementation
            for layer in decoder_layers:
                module = attention_of(layer, family)
                if module is not None:
                    module.__dict__[FALLBACK_ATTR] = original
            model.set_attn_implementation(ATTN_IMPLEMENTATION)

    return apply


def _head_dim(config: Any, decoder_layers: list[nn.Module], family: Family) -> int:
    for layer in decoder_layers:
        module = attention_of(layer, family)
        if isinstance(getattr(module, family.head_dim, None), int):
            return getattr(module, family.head_dim)
    if isinstance(getattr(config, "head_dim", None), int):
        return config.head_dim
    return config.hidden_size // config.num_attention_heads


def attention_of(layer: nn.Module, family: Family) -> nn.Module | None:
    """The decoder layer's self-attention module at the record's (dotted) ``attention`` path
    (Zamba2's ``shared_transformer.self_attn``), or None where the layer has none."""
    module: Any = layer
    for name in family.attention.split("."):
        module = getattr(module, name, None)
    return module


def _without_attention(layer_plan: LayerPlan, config: Any, index: int) -> bool:
    """The layer has no softmax attention by its type (the plan's ``layer_type``, else the
    config's ``layer_types``): a hybrid whose Mamba, MLP or linear-attention blocks sit under
    the attention attribute (NemotronH's ``mixer``, MiniMax's ``self_attn``) is skipped by type,
    not by a missing module."""
    kind = layer_plan.layer_type
    if kind is None:
        types = getattr(config, "layer_types", None)
        kind = types[index] if isinstance(types, (list, tuple)) and index < len(types) else None
    return kind in NO_ATTENTION_TYPES


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
    # values rotated and the output turned back (vo_rope) is no cos/sin table: posenc's attention
    return ((plain_rope or multi_axis) and not length_factor and not encoding.rotates_values
            and encoding.hooks == frozenset({Hook.ROTATE}) and encoding.interleaved == family.interleaved
            and encoding.rotary_dim == width)


class RotaryProbe:
    """Each layer's rotary width, read from the model's own tables (one call of its rotary
    module per layer type, on one position)."""

    def __init__(self, base: nn.Module, family: Family, config: Any) -> None:
        # None: the model builds no rotary module (Granite 4.0 hybrid without RoPE, NemotronH)
        self.rotary = getattr(base, family.rotary, None) if family.rotary is not None else None
        self.family = family
        self.layer_types = getattr(config, "layer_types", None)
        self.takes_layer_type = self.rotary is not None and "layer_type" in inspect.signature(self.rotary.forward).parameters
        self.cache: dict[Any, int] = {}
        parameter = next(base.parameters(), None)
        self.x = torch.zeros(1, 1, 1, device=None if parameter is None else parameter.device,
                             dtype=torch.float32 if parameter is None else parameter.dtype)

    def width(self, index: int) -> int:
        """The rotary width of layer ``index``'s tables; 0 where the model has no rotary module
        (its layers are handed no tables)."""
        if self.rotary is None:
            return 0
        layer_type = self.layer_types[index] if self.takes_layer_type and self.layer_types else None
        if layer_type not in self.cache:
            positions = torch.zeros(1, 1, dtype=torch.long, device=self.x.device)
            with torch.no_grad():
                tables = self.rotary(self.x, positions, layer_type) if self.takes_layer_type else self.rotary(self.x, positions)
            self.cache[layer_type] = self.family.tables.width(tables)
        return self.cache[layer_type]


def _second_parameter(layer: nn.Module) -> str | None:
    """The name of the decoder layer's forward parameter after the hidden states."""
    names = list(inspect.signature(layer.forward).parameters)
    return names[1] if len(names) > 1 else None


def tables_hook(decision: LayerRoute, family: Family, memo: dict):
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
            attention_module.__dict__[POSITIONS_ATTR] = sequence
        if rope is None and not width:  # no rotary module: the layer takes no tables, none given
            return None
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
        if len(args) > 1 and "position_embeddings" not in kwargs and _second_parameter(module) == "position_embeddings":
            return (args[0], tables, *args[2:]), kwargs  # handed positionally (Gemma 3n's decoder layers)
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


def _original(base: nn.Module, module: nn.Module, name: str) -> Any:
    """The attribute as the model has it without posenc: an earlier :func:`use_encoding` may have
    switched it (its value until restore is in ``_posenc_switched_off``). Read before this call
    restores the model, so that a refused call leaves it as it was."""
    for owner, attribute, value in base.__dict__.get("_posenc_switched_off", []):
        if owner is module and attribute == name:
            return value
    return getattr(module, name, None)


def _native_temperature(module: nn.Module, family: Family, base: nn.Module) -> tuple[int, float] | None:
    """(floor_scale, attn_scale) where this attention module scales its queries by the
    attention temperature itself (Llama 4's NoPE layers), else None: the model's own switch,
    not one an earlier call turned off (its restore would scale the queries twice)."""
    if family.temperature is None:
        return None
    switch, floor_scale, attn_scale = family.temperature
    if not _original(base, module, switch) or getattr(module, "use_rope", True):
        return None
    return int(getattr(module, floor_scale)), float(getattr(module, attn_scale))


def _is_temperature(encoding: PositionalEncoding | None, native: tuple[int, float]) -> bool:
    """The plan asks for exactly the temperature the model applies itself."""
    return isinstance(encoding, AttentionTemperature) and (encoding.floor_scale, encoding.attn_scale) == native


def _native_query_scale(module: nn.Module, family: Family, base: nn.Module) -> tuple[float, int] | None:
    """(beta, original_max_position_embeddings) where this attention module multiplies its
    queries by Llama 4's scale at every call, reading beta from its own config's rope dict
    (Ministral 3; not the view an earlier call gave it), else None (no such family, or beta 0
    or absent)."""
    if family.query_scale is None:
        return None
    params = getattr(_original(base, module, "config"), "rope_parameters", None)
    if not isinstance(params, Mapping) or not params.get(family.query_scale):
        return None
    return float(params[family.query_scale]), params.get("original_max_position_embeddings")


def _is_query_scale(encoding: PositionalEncoding | None, native: tuple[float, int]) -> bool:
    """The plan asks for exactly the query scale the model applies itself."""
    return isinstance(encoding, QueryScaledRoPE) and (
        encoding.llama_4_scaling_beta, encoding.original_max_position_embeddings) == native


def _unscaled(encoding: QueryScaledRoPE) -> RoPE:
    """The RoPE of a QueryScaledRoPE, without its query scale."""
    options = {k: v for k, v in encoding.config().items()
               if k not in ("llama_4_scaling_beta", "original_max_position_embeddings")}
    return RoPE(**options)


class _QueryScaleOff:
    """A view of an attention module's config whose rope dict has the query scale's beta at 0
    (the module's own scaling off on that layer; every other attribute read from the config
    itself, so later changes to it, ``_attn_implementation`` among them, are seen)."""

    def __init__(self, config: Any, key: str) -> None:
        object.__setattr__(self, "_posenc_config", config)
        object.__setattr__(self, "_posenc_key", key)

    @property
    def rope_parameters(self) -> dict:
        return {**self._posenc_config.rope_parameters, self._posenc_key: 0.0}

    def __getattr__(self, name: str) -> Any:
        if name.startswith(("__", "_posenc_")):  # copy and pickle probe a bare instance: no recursion
            raise AttributeError(name)
        return getattr(self._posenc_config, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._posenc_config, name, value)


def restore(model: nn.Module, base: nn.Module, family: Family) -> None:
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
        module = attention_of(layer, family)
        if module is not None:
            for attr in (ENCODING_ATTR, POSITIONS_ATTR, FALLBACK_ATTR):
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
