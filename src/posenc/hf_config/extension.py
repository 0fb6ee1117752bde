"""Context extension planned from a config: a pure function, no transformers import.

:func:`plan_extension` ``(config dict, plan, method, factor, params) -> Extension`` (the config
fields to write, and the position plan the model then runs) covers every case
:func:`posenc.integrations.transformers.extend_context` handles:

- a RoPE scaling (``method`` in :data:`~posenc.hf_config.rope.EXTENSION_METHODS`) of a config
  with one rope dict; of one with a rope dict per layer type (Gemma 3: the layer types named,
  else the family's); of a nested text config (Qwen2-VL: the fields go to ``text_config``); of
  an adapter family with RoPE (Falcon: the plan read from the extended config);
- a training-free position map (``method`` in :data:`BRANCH_METHODS`): the fields are the
  :data:`CONFIG_KEY` record (method, resolved parameters, layers), the plan the layers'
  :class:`~posenc.encodings.BranchedRoPE`;

and every refusal, each stated once. A scaling of a config whose ``head_dim`` is null (Mixtral's)
also writes ``head_dim`` as the model computes it (transformers' dynamic, yarn and longrope read
it without the model's fallback). The factor is read once (by
:func:`~posenc.hf_config.extension_config`, which spells it). What the planner needs of the model
beyond its config (its family's facts, its layer count) comes as :class:`ModelFacts`; the
integration checks the fields with transformers' config class, applies the plan and writes the
fields.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from posenc.encodings import BranchedRoPE, RoPE, branched
from posenc.encodings.rope.multiaxis import MultiAxisRoPE
from posenc.encodings.rope.scaling import ROPE_TYPES
from posenc.errors import InvalidArgument, MissingKey
from posenc.hf_config.encoding import extension_config, from_hf_config
from posenc.hf_config.families import FAMILIES, Family, position_plan, reads_model_type
from posenc.hf_config.rope import EXTENSION_METHODS, head_dim_of
from posenc.plan import PositionPlan
from posenc.position_maps import MAP_METHODS, DualChunk, position_map

__all__ = ["BRANCH_METHODS", "CONFIG_KEY", "Extension", "LengthFit", "ModelFacts", "branch_params", "branched_layer",
           "fit_to_length", "method_defaults", "plan_extension", "training_length"]

#: The config attribute recording a position map's extension (plain JSON: method and resolved parameters).
CONFIG_KEY = "posenc_context_extension"

#: method -> the parameter names extend_context takes, in its reference code's spelling: the
#: fields of the method's map (:data:`posenc.position_maps.MAP_METHODS`), which the model's
#: training length turns into numbers (:func:`method_defaults`).
BRANCH_METHODS: dict[str, tuple[str, ...]] = {
    name: tuple(f.name for f in dataclasses.fields(method.map_class)) for name, method in MAP_METHODS.items()
}


@dataclass(frozen=True)
class ModelFacts:
    """What :func:`plan_extension` needs to know of the model beyond its config dict.

    Attributes:
        num_layers: the number of decoder layers (for a model whose family posenc has no plan
            reader: one RoPE read from the config on every layer).
        attention_layers: the decoder layers with softmax attention (None: every one).
    """

    num_layers: int | None = None
    attention_layers: tuple[int, ...] | None = None


@dataclass(frozen=True)
class _FamilyFacts:
    """The family record's facts the planner reads (:func:`_family_facts`)."""

    adapter: bool = False
    interleaved: bool = False
    scaled_layer_types: tuple[str, ...] = ()
    no_scaling: str | None = None
    text_config: str | None = None
    multi_axis: bool = False
    rope_at_end: bool = False


def _family_facts(config: Mapping[str, Any]) -> _FamilyFacts:
    """The facts of the config's family record (Llama-shaped defaults for a model type without one)."""
    record: Family | None = FAMILIES.get(config.get("model_type"))
    if record is None:
        return _FamilyFacts()
    interleaved = record.interleaved
    if record.interleaved_key is not None:
        interleaved = bool(config.get(record.interleaved_key, interleaved))
    return _FamilyFacts(
        adapter=record.adapter is not None, interleaved=interleaved, scaled_layer_types=record.scaled_layer_types,
        no_scaling=record.no_scaling, text_config=record.sizes_config,
        multi_axis=record.sizes_config is not None or record.rotary_positions, rope_at_end=record.head_dim != "head_dim",
    )


@dataclass(frozen=True)
class Extension:
    """What :func:`plan_extension` decided.

    Attributes:
        fields: the config fields to write, in order (a position map: ``{CONFIG_KEY: record}``).
        plan: the position plan the model runs afterwards.
        target: None: the fields go to the config; else the key of its nested config they go
            to (``"text_config"``).
        position_map: the fields record a position map (posenc's own field, which no
            transformers config class reads), not a scaling in Hugging Face's spelling.
    """

    fields: dict[str, Any]
    plan: PositionPlan
    target: str | None = None
    position_map: bool = False


def plan_extension(config: Mapping[str, Any], plan: PositionPlan | None, method: str, factor: float | None = None,
                   *, facts: ModelFacts, layer_types: Any = None, **params: Any) -> Extension:
    """The fields and the plan that extend a model's context (the module's docstring lists the cases).

    Args:
        config: the model's config dict (``config.to_dict()``, with ``max_position_embeddings``
            where the family spells it otherwise).
        plan: the plan the model runs now where :func:`use_encoding` applied one, else None
            (the config's own is read here).
        method: a scaling (:data:`~posenc.hf_config.rope.EXTENSION_METHODS`) or a position map
            (:data:`BRANCH_METHODS`).
        factor: s >= 1, for the scalings only.
        facts: the model's :class:`ModelFacts` (its family's facts are read from its record).
        layer_types: for a per-layer-type config, the layer types to scale (scalings only).
        params: the scaling's extra fields (and ``dynamic_cache``), or the map's parameters.

    Returns:
        the :class:`Extension`.

    Raises:
        MissingKey: a scaling without ``factor``. InvalidArgument: as
        :func:`~posenc.integrations.transformers.extend_context` lists (every refusal that needs
        the config alone).
    """
    family = _family_facts(config)
    if isinstance(method, str) and method in BRANCH_METHODS:
        if factor is not None and "factor" in BRANCH_METHODS[method]:
            params = {**params, "factor": factor}  # the map's own (windowed_yarn's far YaRN)
        elif factor is not None:
            raise InvalidArgument(f"factor: {method} is a position map and takes no factor; its parameters are "
                                  f"{list(BRANCH_METHODS[method])}")
        if layer_types is not None:
            raise InvalidArgument(f"layer_types: {method} applies to every layer with RoPE and a full span")
        return _plan_position_map(config, plan, method, params, family, facts)
    if not isinstance(method, str) or method not in EXTENSION_METHODS:
        raise InvalidArgument(f"method must be one of the scalings {list(EXTENSION_METHODS)} or the position maps "
                              f"{list(BRANCH_METHODS)}, got {method!r}")
    if factor is None:
        raise MissingKey(f"factor: extend_context(model, {method!r}, factor) needs the scaling factor s")
    params = dict(params)
    dynamic_cache = params.pop("dynamic_cache", None)
    if dynamic_cache is not None and method not in ("dynamic", "dynamic_yarn"):
        raise InvalidArgument(f"dynamic_cache: for dynamic and dynamic_yarn only, not {method!r}")
    if dynamic_cache is not None and (family.adapter or family.text_config is not None):
        raise InvalidArgument(f"dynamic_cache: not taken for {config.get('model_type')} (its plan is read from the "
                              "config alone)")
    if family.adapter:
        return _plan_adapter_scaling(config, plan, method, factor, layer_types, params)
    if family.no_scaling is not None:
        raise InvalidArgument(f"model: {config.get('model_type')} does not read a RoPE scaling from its config "
                              f"({family.no_scaling}): nothing to extend")
    if family.text_config is not None:
        return _plan_text_config_scaling(config, plan, method, factor, layer_types, params, family.text_config)
    options = {} if dynamic_cache is None else {"dynamic_cache": dynamic_cache}
    return _plan_scaling(config, plan, method, factor, layer_types, params, family, facts, options)


# -- scalings ------------------------------------------------------------------------------------

def _plan_scaling(config: Mapping[str, Any], plan: PositionPlan | None, method: str, factor: float, layer_types: Any,
                  params: dict, family: _FamilyFacts, facts: ModelFacts, options: dict) -> Extension:
    """A decoder's config with one rope dict, or one per layer type."""
    config = dict(config)
    if plan is None and reads_model_type(config.get("model_type")):
        # a family posenc knows is read exactly, layer by layer; another Llama-shaped model falls
        # back to the one RoPE its config spells
        plan = position_plan(config)
    if plan is not None and all(layer.encoding is None for layer in plan):
        raise InvalidArgument("model: every layer is NoPE (no positional encoding), there is no RoPE to extend")
    per_type = _per_layer_type_rope(config)
    if per_type is None:
        if layer_types is not None:
            raise InvalidArgument("layer_types: the config has one rope dict for every layer, not one per layer type")
        fields = extension_config(config, method, factor, **params)
        scaled_types = None
    else:
        scaled_types = tuple(layer_types) if layer_types is not None else family.scaled_layer_types
        fields = _per_type_fields(config, *per_type, scaled_types, method, factor, params)
    fields = _with_head_width(config, fields)
    new_config = {**config, **fields}
    if reads_model_type(new_config.get("model_type")) and plan is not None and _plan_quietly(new_config) == plan.describe():
        raise InvalidArgument(f"model: {new_config['model_type']} does not read a RoPE scaling from its config "
                              "(transformers builds the same model from the extended config): nothing to extend")
    new_plan = _extended_plan(plan, new_config, scaled_types, per_type is not None, family.interleaved, facts, options)
    return Extension(fields, new_plan)


def _per_type_fields(config: dict, key: str, dicts: dict, scaled_types: tuple[str, ...], method: str, factor: float,
                     params: dict) -> dict:
    """The fields of a config with one rope dict per layer type: each scaled type's dict extended."""
    if not scaled_types:
        raise InvalidArgument(f"layer_types: the config has one rope dict per layer type {sorted(dicts)}; name the "
                              "ones to scale (layer_types=[...])")
    unknown = [t for t in scaled_types if t not in dicts]
    if unknown:
        raise InvalidArgument(f"layer_types: {unknown} not among the config's {sorted(dicts)}")
    new_dicts = dict(dicts)
    fields: dict[str, Any] = {}
    for layer_type in scaled_types:
        # one layer type's rope dict, read plainly (without model_type, the family's reader
        # would ask for the dict of every type): the extension's fields of that one dict
        flat = {**_without_model_type(config), key: dict(dicts[layer_type])}
        extension = extension_config(flat, method, factor, **params)
        if "max_position_embeddings" in extension:
            fields["max_position_embeddings"] = extension["max_position_embeddings"]
        new_dicts[layer_type] = extension.get("rope_parameters", dicts[layer_type])
    fields[key] = new_dicts
    return fields


def _plan_text_config_scaling(config: Mapping[str, Any], plan: PositionPlan | None, method: str, factor: float,
                              layer_types: Any, params: dict, key: str) -> Extension:
    """A model whose decoder's RoPE is in a nested config (Qwen2-VL, Qwen2.5-VL: ``text_config``,
    where their text model's rotary embedding reads it; the M-RoPE's ``mrope_section`` kept)."""
    own = position_plan(config)
    _refuse_another_plan(plan, own, "extend_context scales the config's RoPE")
    text = dict(config[key])
    fields = _with_head_width(text, _one_dict_fields(text, method, factor, layer_types, params,
                                                     config.get("model_type")))
    new_plan = position_plan({**config, key: {**text, **fields}})
    _refuse_unchanged(config.get("model_type"), own, new_plan)
    return Extension(fields, new_plan, target=key)


def _plan_adapter_scaling(config: Mapping[str, Any], plan: PositionPlan | None, method: str, factor: float,
                          layer_types: Any, params: dict) -> Extension:
    """An adapter family with RoPE (Falcon's rotary): the extended config's plan. ALiBi, learned
    tables and T5 buckets have no RoPE to scale: refused, saying which."""
    model_type = config.get("model_type")
    own = position_plan(config)
    if not all(isinstance(layer.encoding, RoPE) for layer in own) or own.encoder is not None:
        raise InvalidArgument(f"model: {model_type}'s positions are {own.describe()!r}, not RoPE on every "
                              "layer: extend_context scales a RoPE (ALiBi, learned tables and T5 buckets have no "
                              "scaling to write)")
    _refuse_another_plan(plan, own, "extend_context scales the config's RoPE")
    fields = _with_head_width(config, _one_dict_fields(dict(config), method, factor, layer_types, params, model_type))
    new_plan = position_plan({**config, **fields})
    _refuse_unchanged(model_type, own, new_plan)
    return Extension(fields, new_plan)


def _one_dict_fields(config: dict, method: str, factor: float, layer_types: Any, params: dict, model_type: Any) -> dict:
    """The extension's fields for a config with one rope dict, read plainly (the family was read
    by the caller)."""
    if layer_types is not None:
        raise InvalidArgument(f"layer_types: {model_type} has one rope dict for every layer, not one per layer type")
    return extension_config(_without_model_type(config), method, factor, **params)


def _with_head_width(config: Mapping[str, Any], fields: dict) -> dict:
    """The fields with ``head_dim`` written where the config spells it None (Mixtral's config
    class: ``head_dim: int | None = None``) and the fields write a rope dict.

    Its model reads ``getattr(config, "head_dim", None) or hidden_size // num_attention_heads``,
    but transformers 5.24's dynamic, yarn and longrope (modeling_rope_utils.py) read
    ``getattr(config, "head_dim", hidden_size // num_attention_heads)``: None there, and a plain
    ``from_pretrained`` of the extended config raises TypeError. Writing the width the model
    computes changes nothing else it builds.

    Raises:
        as :func:`~posenc.hf_config.rope.head_dim_of` (MissingKey: no ``hidden_size`` /
        ``num_attention_heads`` to write it from; InvalidArgument: not divisible), named.
    """
    if not fields or "head_dim" not in config or config["head_dim"] is not None:
        return fields
    return {"head_dim": head_dim_of(config), **fields}


def _extended_plan(plan: PositionPlan | None, new_config: dict, scaled_types: tuple[str, ...] | None,
                   per_type: bool, interleaved: bool, facts: ModelFacts, options: dict) -> PositionPlan:
    if plan is None:
        if per_type:
            raise InvalidArgument("model: a per-layer-type RoPE config needs the model's plan (use_encoding(model, plan) "
                                  "first, or posenc.hf_config.position_plan)")
        return PositionPlan.uniform(from_hf_config(new_config, interleaved=interleaved, **options),
                                    _num_layers(facts))
    layer_types = new_config.get("layer_types")
    layers = []
    for index, layer in enumerate(plan):
        old = layer.encoding
        layer_type = layer.layer_type or (layer_types[index] if layer_types else None)
        if isinstance(old, RoPE) and (scaled_types is None or layer_type in scaled_types):
            read = from_hf_config(new_config, layer_type=layer_type if per_type else None)
            new = RoPE(old.head_dim, rotary_dim=old.rotary_dim, base=read.base, scaling=read.scaling,
                       interleaved=old.interleaved, max_position_embeddings=new_config.get("max_position_embeddings"),
                       **options)
            layer = dataclasses.replace(layer, encoding=new)
        layers.append(layer)
    return dataclasses.replace(plan, layers=tuple(layers))


# -- position maps ---------------------------------------------------------------------------------

def _plan_position_map(config: Mapping[str, Any], plan: PositionPlan | None, method: str, params: dict,
                       family: _FamilyFacts, facts: ModelFacts) -> Extension:
    """The plan with a :class:`~posenc.encodings.BranchedRoPE` of each full-span RoPE layer's
    RoPE; the fields, the :data:`CONFIG_KEY` record."""
    model_type = config.get("model_type")
    if family.adapter:
        raise InvalidArgument(f"model: {method} is not available for {model_type}: its positions go through posenc's "
                              f"adapter for the family, not transformers' AttentionInterface with RoPE tables")
    if family.multi_axis:
        raise InvalidArgument(f"model: {model_type} has multi-axis positions (M-RoPE); {method} maps one position "
                              "per token")
    if family.rope_at_end:
        raise InvalidArgument(f"model: {model_type}'s RoPE is on the last dimensions of each head (MLA), not the "
                              f"leading ones posenc's RoPE rotates; {method} is not available for it")
    own = position_plan(config) if reads_model_type(model_type) else None
    if own is not None:
        _refuse_another_plan(plan, own, f"{method} maps the config's RoPE")
    else:
        own = PositionPlan.uniform(from_hf_config(config, interleaved=family.interleaved), _num_layers(facts))
    resolved = branch_params(method, params, config)
    layers, chosen = [], []
    for index, layer_plan in enumerate(own):
        # sliding and chunked layers never see a distance past their window; NoPE has no RoPE
        attends = facts.attention_layers is None or index in facts.attention_layers
        if attends and isinstance(layer_plan.encoding, RoPE) and layer_plan.span == "full":
            encoding = branched_layer(method, resolved, layer_plan.encoding, f"layer {index}")
            layer_plan = dataclasses.replace(layer_plan, encoding=encoding)
            chosen.append(index)
        layers.append(layer_plan)
    if not chosen:
        raise InvalidArgument(f"model: {model_type} has no layer with RoPE and a full span ({own.describe()!r}); "
                              f"{method} maps full attention (sliding-window and chunked layers keep theirs)")
    record = {"format": 1, "method": method, "params": dict(resolved), "layers": chosen}
    return Extension({CONFIG_KEY: record}, dataclasses.replace(own, layers=tuple(layers)), position_map=True)


def training_length(config: Mapping[str, Any]) -> int:
    """L0, the context the model was trained at: the rope dict's
    ``original_max_position_embeddings`` where the config has one (a llama3 or yarn model),
    else ``max_position_embeddings``.

    Raises:
        InvalidArgument: neither is a positive int.
    """
    for key in ("rope_parameters", "rope_scaling"):
        params = config.get(key)
        if isinstance(params, dict) and isinstance(params.get("original_max_position_embeddings"), int):
            return params["original_max_position_embeddings"]
    length = config.get("max_position_embeddings")
    if not isinstance(length, int) or length < 1:
        raise InvalidArgument("model: its config has no max_position_embeddings, the training length the branch "
                              "methods' defaults are scaled to")
    return length


def method_defaults(method: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """Each method's published defaults (its record in :data:`posenc.position_maps.MAP_METHODS`,
    ``defaults(L0)``), scaled to the model's training length L0 (:func:`training_length`) where
    the reference scales them:

    - streaming_llm: start_size 4, recent_size 512 (``StartRecentKVCache``);
    - self_extend: group_size 8, neighbor_window 1024 (datamllab/LongLM; not scaled);
    - rerope: window 512, training_length L0 (bojone/rerope's globals, its 4096 the model's L0);
    - leaky_rerope: window 512, scaling_factor 16, training_length L0;
    - lm_infinite: local_branch L0 (the reference's Llama 2 scripts pass the training length),
      global_branch 100;
    - dca: the config's ``dual_chunk_attention_config`` (Qwen2.5-1M, Qwen3) where it has one,
      else chunk_size 3 L0 / 4, local_size L0 / 16 (``replace_with_chunkllama``);
    - string: shifted_offset int(0.33 L0), local_value 128, attention_factor 0.1 ln 2 + 1
      (:class:`posenc.position_maps.String`'s);
    - windowed_yarn: window 7 L0 / 8, training_length L0, YaRN's beta_fast 32, beta_slow 1 and
      attention factor (None: 0.1 ln s + 1); ``factor`` None, to be given (or fitted:
      :func:`fit_to_length`).

    Raises:
        InvalidArgument: an unknown method (the methods named); a config without a training length.
    """
    if method not in BRANCH_METHODS:
        raise InvalidArgument(f"method must be one of {list(BRANCH_METHODS)}, got {method!r}")
    length = training_length(config)
    record = MAP_METHODS[method]
    defaults = record.defaults(length)
    if method == "dca" and isinstance(config.get("dual_chunk_attention_config"), dict):
        read = DualChunk.from_config(config["dual_chunk_attention_config"])
        defaults = {"chunk_size": read.chunk_size, "local_size": read.local_size}
    if "shifted_offset" in BRANCH_METHODS[method]:
        # STRING's offset, derived from L0 as its factory derives it (string()); stated as the
        # map's own parameter, so that the record names it and a user may set it
        defaults["shifted_offset"] = int(0.33 * defaults.pop("training_length"))
    if "attention_factor" in BRANCH_METHODS[method] and "attention_factor" not in defaults:
        defaults["attention_factor"] = record.attention_factor  # STRING's (windowed_yarn's is YaRN's, None)
    return {name: defaults[name] for name in BRANCH_METHODS[method]}


def branch_params(method: str, params: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """The map's parameters: its defaults for ``config`` with ``params`` on top, checked by
    building the map once.

    Raises:
        InvalidArgument: an unknown method or parameter (the allowed ones named), or a value
            the map refuses (as :mod:`posenc.position_maps` raises).
    """
    if method not in BRANCH_METHODS:
        raise InvalidArgument(f"method must be one of {list(BRANCH_METHODS)}, got {method!r}")
    unknown = sorted(set(params) - set(BRANCH_METHODS[method]))
    if unknown:
        raise InvalidArgument(f"{method}: unknown parameter(s) {unknown}; it takes {list(BRANCH_METHODS[method])}")
    resolved = {**method_defaults(method, config), **params}
    position_map(method, **resolved)
    return resolved


def branched_layer(method: str, resolved: Mapping[str, Any], rope: RoPE, where: str) -> BranchedRoPE:
    """A layer's :class:`~posenc.encodings.BranchedRoPE`: ``branched(rope, method, **resolved)``
    of the layer's own RoPE.

    Raises:
        InvalidArgument: a multi-axis RoPE (M-RoPE) or one whose rotation is not RoPE's; one
            whose frequencies follow the length; leaky_rerope or windowed_yarn on an already
            scaled RoPE (a scaling of plain RoPE's frequencies, not of a scaled RoPE's).
    """
    if isinstance(rope, MultiAxisRoPE) or type(rope).rotate is not RoPE.rotate:
        raise InvalidArgument(f"{where}: {type(rope).__name__} is not a plain RoPE with one position per token; "
                              f"{method} maps one position per token")
    if rope.length_dependent:
        raise InvalidArgument(f"{where}: its RoPE's frequencies follow the length ({rope.scaling.get('rope_type')}); "
                              f"{method} needs a static RoPE")
    if rope.scaling is not None:
        rescaled = ("at theta / scaling_factor" if method == "leaky_rerope" else
                    "its far keys with its own scaling of the plain frequencies"
                    if position_map(method, **resolved).branch_scalings else None)
        if rescaled is not None:
            raise InvalidArgument(f"{where}: {method} rotates {rescaled}, which is not defined on top of the model's "
                                  f"own {rope.scaling.get('rope_type')} scaling")
    return branched(rope, method, **resolved)


# -- parameters fitted to a target length -------------------------------------------------------

@dataclass(frozen=True)
class LengthFit:
    """What :func:`fit_to_length` chose.

    Attributes:
        factor: the scaling factor s (scalings), None for a position map.
        params: the method's parameters: the ones given kept, the fitted ones added.
        rule: one line: the values chosen and the rule that chose them.
    """

    factor: float | None
    params: dict[str, Any]
    rule: str


#: Position maps whose positions stay below L0 at every length with their defaults: the target
#: length chooses nothing (ReRoPE caps distances at its window, DCA's intra- and inter-chunk
#: positions stay below its chunk plus local window, LM-Infinite caps distances at its local
#: branch L0, StreamingLLM's cache positions below start + recent).
_LENGTH_FREE = {
    "rerope": "ReRoPE caps every distance at its window",
    "dca": "DCA's positions stay below chunk_size + local_size at any length (ChunkLlama's chunk is 3 L0 / 4)",
    "lm_infinite": "LM-Infinite caps every distance at its local branch",
    "streaming_llm": "StreamingLLM's cache positions stay below start_size + recent_size",
}


def fit_to_length(method: str, target_length: int, training_length: int, params: Mapping[str, Any] | None = None,
                  ) -> LengthFit:
    """The method's parameters for inputs of ``target_length`` tokens N on a model trained at
    ``training_length`` L0, by the method's rule (the parameters in ``params`` kept, and checked
    against the rule):

    - the scalings (linear, ntk, dynamic, yarn, dynamic_yarn): s = N / L0 (Position
      Interpolation, Chen et al. 2023, sec. 2.3; YaRN, Peng et al. 2023, sec. 2: s = L' / L);
      llama3 is refused (Meta scaled Llama 3.1 from 8192 to 131072 tokens with s = 8: no
      published rule ties its factor to N; give ``factor``);
    - self_extend: neighbor_window w the given one, else the published 1024 (for Llama 2's
      4096; L0 / 4 where L0 < 4096), and the smallest group_size G >= 2 whose farthest grouped
      distance, (N - 1) // G + w - w // G, is at most L0 - 1 (datamllab/LongLM README sec. 4:
      "ensure the input sequence length is within (L0 - w) G + w", "try the smallest group size first");
    - leaky_rerope: the smallest integer scaling_factor k whose farthest position,
      window + (N - 1 - window) / k, is at most L0 - 1 (Su 2023: ReRoPE's far positions kept inside the trained range);
    - string: shifted_offset S = max(int(0.33 L0), N - L0 + local_value), so that the farthest
      shifted distance N - 1 - S + local_value stays at most L0 - 1 (STRING, An et al. 2024,
      sec. 3: S = L0 / 3 within the training length); the unshifted ones reach S - 1, so N is
      at most 2 L0 - local_value;
    - windowed_yarn: YaRN's rule for its far keys, factor = N / L0 (YaRN sec. 2), window the
      given one else 7 L0 / 8, training_length L0;
    - rerope, dca, lm_infinite, streaming_llm: their defaults for L0 (:func:`method_defaults`):
      their positions stay below L0 at every length.

    Args:
        method: a scaling (:data:`~posenc.hf_config.rope.EXTENSION_METHODS`) or a position map
            (:data:`BRANCH_METHODS`).
        target_length: N, the input length in tokens, > L0.
        training_length: L0 in tokens (:func:`training_length` of the config).
        params: parameters already chosen (kept; for self_extend, leaky_rerope and string,
            checked against N).

    Returns:
        the :class:`LengthFit`.

    Raises:
        InvalidArgument: N not an int > L0; an unknown method; llama3; string past
            2 L0 - local_value; a given parameter with which the method's positions pass L0 - 1
            at N (named, with the values that fit).
    """
    params = dict(params or {})
    if isinstance(target_length, bool) or not isinstance(target_length, int) or target_length <= training_length:
        raise InvalidArgument(f"target_length must be an int > the training length L0 = {training_length}, got "
                              f"{target_length!r}")
    n, l0 = target_length, training_length
    if method in EXTENSION_METHODS:
        if not ROPE_TYPES[method].factor_is_length_ratio:
            raise InvalidArgument(f"target_length: {method} has no published rule from the target length to its "
                                  "factor (llama3: Llama 3.1 extended 8192 -> 131072 tokens with factor 8); give factor=")
        factor = n / l0
        return LengthFit(factor, params, f"{method}: factor = N / L0 = {n} / {l0} = {factor:g}")
    if method not in BRANCH_METHODS:
        raise InvalidArgument(f"method must be one of the scalings {list(EXTENSION_METHODS)} or the position maps "
                              f"{list(BRANCH_METHODS)}, got {method!r}")
    if method in _LENGTH_FREE:
        chosen = {**method_defaults(method, {"max_position_embeddings": l0}), **params}
        return LengthFit(None, chosen, f"{method}: {_spelled(chosen)} (its defaults for L0 = {l0}: "
                                       f"{_LENGTH_FREE[method]})")
    fit = {"self_extend": _fit_self_extend, "leaky_rerope": _fit_leaky_rerope, "string": _fit_string,
           "windowed_yarn": _fit_windowed_yarn}[method]
    chosen, rule = fit(n, l0, params)
    return LengthFit(None, chosen, f"{method}: {_spelled(chosen)} ({rule}; N = {n}, L0 = {l0})")


def _spelled(params: Mapping[str, Any]) -> str:
    return ", ".join(f"{name}={value:g}" if isinstance(value, float) else f"{name}={value}"
                     for name, value in params.items())


def _check_fits(name: str, value: int, farthest: int, l0: int, best: Any) -> None:
    if farthest > l0 - 1:
        raise InvalidArgument(f"{name}: {value} puts the farthest position at {farthest}, past L0 - 1 = {l0 - 1} "
                              f"at the target length; {best}")


def _fit_self_extend(n: int, l0: int, params: dict) -> tuple[dict, str]:
    w = params.get("neighbor_window", 1024 if l0 >= 4096 else l0 // 4)
    if not isinstance(w, int) or not 1 <= w < l0:
        raise InvalidArgument(f"neighbor_window must be an int in [1, L0 = {l0}), got {w!r}")

    def farthest(g: int) -> int:
        return (n - 1) // g + w - w // g

    smallest = next(k for k in range(2, n + 1) if farthest(k) <= l0 - 1)
    g = params.get("group_size", smallest)
    if g != smallest:
        _check_fits("group_size", g, farthest(g), l0, f"the smallest that fits is {smallest}")
    return {"group_size": g, "neighbor_window": w}, "the smallest group_size with (N - 1) // G + w - w // G <= L0 - 1"


def _fit_leaky_rerope(n: int, l0: int, params: dict) -> tuple[dict, str]:
    defaults = method_defaults("leaky_rerope", {"max_position_embeddings": l0})
    w = params.get("window", defaults["window"])
    if not isinstance(w, int) or not 1 <= w < l0 - 1:
        raise InvalidArgument(f"window must be an int in [1, L0 - 1 = {l0 - 1}), got {w!r}")
    smallest = -(-(n - 1 - w) // (l0 - 1 - w))  # ceil: w + (N - 1 - w) / k <= L0 - 1
    k = params.get("scaling_factor", max(1, smallest))
    if isinstance(k, int) and k < smallest:
        _check_fits("scaling_factor", k, math.ceil(w + (n - 1 - w) / k), l0, f"the smallest that fits is {smallest}")
    chosen = {**defaults, **params, "window": w, "scaling_factor": k}
    return chosen, "the smallest integer scaling_factor with window + (N - 1 - window) / k <= L0 - 1"


def _fit_windowed_yarn(n: int, l0: int, params: dict) -> tuple[dict, str]:
    defaults = method_defaults("windowed_yarn", {"max_position_embeddings": l0})
    factor = params.get("factor", n / l0)
    if isinstance(factor, (int, float)) and not isinstance(factor, bool) and factor < n / l0:
        raise InvalidArgument(f"factor: {factor!r} reaches N = {factor * l0:g} tokens, short of the target length "
                              f"{n}; YaRN's rule gives {n / l0:g}")
    chosen = {**defaults, **params, "factor": factor}
    return chosen, "YaRN's factor = N / L0 past the window"


def _fit_string(n: int, l0: int, params: dict) -> tuple[dict, str]:
    defaults = method_defaults("string", {"max_position_embeddings": l0})
    local = params.get("local_value", defaults["local_value"])
    needed = n - l0 + local
    if needed > l0:  # the unshifted distances reach shifted_offset - 1, the shifted ones N - 1 - S + local_value
        raise InvalidArgument(f"target_length: STRING keeps every distance below L0 only up to 2 L0 - local_value = "
                              f"{2 * l0 - local} tokens, got {n}")
    offset = params.get("shifted_offset", max(defaults["shifted_offset"], needed))
    if isinstance(offset, int) and not needed <= offset <= l0:
        _check_fits("shifted_offset", offset, max(offset - 1, n - 1 - offset + local), l0,
                    f"those that fit are {needed} to {l0}")
    chosen = {**defaults, **params, "shifted_offset": offset, "local_value": local}
    return chosen, "shifted_offset = max(int(0.33 L0), N - L0 + local_value), at most L0"


# -- shared checks ---------------------------------------------------------------------------------

def _refuse_another_plan(recorded: PositionPlan | None, own: PositionPlan, what: str) -> None:
    if recorded is not None and recorded.describe() != own.describe():
        raise InvalidArgument(f"model: it runs a plan of use_encoding ({recorded.describe()!r}), not the RoPE of its "
                              f"config; {what}: extend before use_encoding")


def _refuse_unchanged(model_type: Any, old: PositionPlan, new: PositionPlan) -> None:
    if new.describe() == old.describe():
        raise InvalidArgument(f"model: {model_type} does not read a RoPE scaling from its config (transformers builds "
                              "the same model from the extended config): nothing to extend")


def _plan_quietly(config: dict) -> str:
    """The description of the plan ``config`` reads, without the reader's warnings (the config
    is a candidate, not the user's)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return position_plan(config).describe()


def _per_layer_type_rope(config: Mapping[str, Any]) -> tuple[str, dict] | None:
    for key in ("rope_parameters", "rope_scaling"):
        value = config.get(key)
        if isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
            return key, value
    return None


def _without_model_type(config: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in config.items() if key != "model_type"}


def _num_layers(facts: ModelFacts) -> int:
    if facts.num_layers is None:
        raise InvalidArgument("model: the number of decoder layers is needed to plan every layer")
    return facts.num_layers

