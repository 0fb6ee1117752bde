"""extend_context: a RoPE scaling written into a loaded model's config, or a training-free
position map run in its attention (:func:`extend_context`).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from torch import nn

from posenc.encodings import RoPE
from posenc.errors import InvalidArgument, MissingKey
from posenc.hf_config import (
    EXTENSION_METHODS,
    extension_config,
    from_hf_config,
    position_plan,
    reads_model_type,
)
from posenc.integrations import adapters
from posenc.integrations import branch_attention as branches
from posenc.integrations.adapter_route import refuse_static_layers
from posenc.integrations.adapters import adapter_of
from posenc.integrations.attention_function import (
    FALLBACK_ATTR,
    fallback,
    transformers_attention_function,
)
from posenc.integrations.families import FamilyModules as Family
from posenc.integrations.families import base_model, family_of, sizes_config
from posenc.integrations.record import keep_plan, plan_record
from posenc.integrations.routes import (
    LayerRoute,
    RotaryProbe,
    prepare_layers,
    restore,
    tables_hook,
)
from posenc.plan import LayerPlan, PositionPlan


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
    adapter = adapter_of(model)
    family = family_of(model) if adapter is None else None
    if dynamic_cache is not None and (adapter is not None or family.text_config is not None):
        raise InvalidArgument(f"dynamic_cache: not taken for {model.config.model_type} (its plan is read from the "
                              "config alone)")
    if adapter is not None:
        return _extend_adapter_family(model, adapter, method, factor, layer_types, params)
    base = base_model(model, family)
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
    apply = prepare_layers(model, new_plan, None, {})  # every refusal before the config changes
    for name, value in fields.items():
        setattr(config, name, value)
    apply()
    return model


def _extend_with_branches(model: nn.Module, method: str, params: dict) -> nn.Module:
    """extend_context for a position map (:mod:`posenc.integrations.branch_attention`): every
    check first, then the identity tables, the branch attention and the positions check."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if adapter_of(model) is not None:
        raise InvalidArgument(f"model: {method} is not available for {model_type}: its positions go through posenc's "
                              f"adapter for the family, not transformers' AttentionInterface with RoPE tables")
    family = family_of(model)
    base = base_model(model, family)
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
    probe = RotaryProbe(base, family, sizes_config(config, family))
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
    transformers_attention_function(original)  # one that cannot serve the other layers: refused now
    record = {"format": 1, "method": method, "params": dict(resolved), "layers": [c[0] for c in chosen]}

    restore(model, base, family)
    handles = [base.register_forward_pre_hook(branches.positions_check(refuse_static_layers), with_kwargs=True)]
    memo: dict[Any, Any] = {}
    for index, module, layer, width in chosen:
        module.__dict__[branches.BRANCH_ATTR] = layer
        identity = LayerRoute(index, LayerPlan(None), module, width, posenc_route=False)
        handles.append(decoder_layers[index].register_forward_pre_hook(tables_hook(identity, family, memo),
                                                                       with_kwargs=True))
    base.__dict__["_posenc_hooks"] = handles
    base.__dict__["_posenc_original_attn"] = config._attn_implementation
    _register_branch_attention()
    for decoder_layer in decoder_layers:
        module = getattr(decoder_layer, family.attention, None)
        if module is not None:
            module.__dict__[FALLBACK_ATTR] = original
    model.set_attn_implementation(branches.ATTN_IMPLEMENTATION)
    setattr(config, branches.CONFIG_KEY, record)
    return model


def _branch_attention_entry(module, query, key, value, attention_mask, **kwargs):
    return branches.branch_attention_forward(module, query, key, value, attention_mask, fallback=fallback, **kwargs)


def _register_branch_attention() -> None:
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    from transformers import AttentionInterface

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
    apply = prepare_layers(model, new_plan, None, {})  # every refusal before the config changes
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
    record = plan_record(None, None, new_plan)
    for name, value in fields.items():
        setattr(config, name, value)
    adapters.restore(model)
    apply_plan()
    keep_plan(model, new_plan, record)
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
        count = len(getattr(base_model(model, family), family.layers))
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
            layer = LayerPlan(new, layer.span, layer.window, layer.layer_type, layer.sinks, layer.softcap)
        layers.append(layer)
    return PositionPlan(tuple(layers), plan.embedding, plan.model_type, plan.encoder, plan.notes)
