"""extend_context: a RoPE scaling written into a loaded model's config, or a training-free
position map run in its attention (:func:`extend_context`), as planned from the config by
:func:`posenc.hf_config.extension.plan_extension`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from torch import nn

from posenc.errors import InvalidArgument
from posenc.hf_config.extension import Extension, ModelFacts, fit_to_length, plan_extension, training_length
from posenc.integrations import adapters
from posenc.integrations.adapters import adapter_of
from posenc.integrations.families import FamilyModules as Family
from posenc.integrations.families import base_model, family_of
from posenc.integrations.record import CONFIG_KEY as PLAN_KEY
from posenc.integrations.record import keep_plan, plan_record
from posenc.integrations.routes import prepare_layers


def extend_context(model: nn.Module, method: str, factor: float | None = None, *,
                   layer_types: Sequence[str] | None = None, target_length: int | None = None,
                   **params: Any) -> nn.Module:
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
    attention (keys cached unrotated); layers with logit soft-capping (Gemma 2) or attention
    sinks keep them (posenc's attention takes ``softcap=`` and ``sinks=``). transformers has no ``dynamic_yarn``: a plain ``from_pretrained`` of the
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

    **Position maps** (``method`` one of :data:`posenc.hf_config.extension.BRANCH_METHODS`,
    no ``factor`` but for windowed_yarn; :mod:`posenc.position_maps`; parameters as the reference code spells
    them, defaults the published ones, scaled to the training length L0 where the reference
    scales them, :func:`~posenc.hf_config.extension.method_defaults`):

    - ``streaming_llm`` (start_size 4, recent_size 512; every key stays in the cache, the
      evicted ones masked);
    - ``self_extend`` (group_size 8, neighbor_window 1024);
    - ``rerope`` (window 512, training_length L0) and ``leaky_rerope`` (window 512,
      scaling_factor 16, training_length L0), with their log-n query scaling;
    - ``lm_infinite`` (local_branch L0, global_branch 100);
    - ``dca`` (the config's ``dual_chunk_attention_config``, else chunk_size 3 L0 / 4,
      local_size L0 / 16);
    - ``string`` (shifted_offset int(0.33 L0), local_value 128, attention_factor 0.1 ln 2 + 1;
      ``attention_factor=1.0`` for plain RoPE inside the window);
    - ``windowed_yarn`` (window 7 L0 / 8, plain RoPE inside it, YaRN at ``factor`` past it,
      with YaRN's beta_fast 32, beta_slow 1 and attention factor 0.1 ln s + 1 on those keys;
      the one map that takes ``factor``, or ``target_length=N``: s = N / L0).

    **Fitted to a length** (``target_length=N`` instead of ``factor``): the factor and the
    parameters the method's own rule chooses for N tokens from the training length L0
    (``original_max_position_embeddings=`` if given, else the config's,
    :func:`~posenc.hf_config.extension.training_length`), as
    :func:`~posenc.hf_config.extension.fit_to_length` states them: s = N / L0 for the scalings;
    Self-Extend's smallest group_size that keeps its farthest position below L0; Leaky ReRoPE's
    smallest scaling_factor, STRING's shifted_offset, likewise; the other maps' defaults (their
    positions stay below L0 at any length). Parameters given in ``params`` are kept (and
    checked). The choice is printed on stderr, one line, e.g. ``extend_context: self_extend:
    group_size=2, neighbor_window=1024 (...; N = 12288, L0 = 8192)``.

    Every layer with a plain RoPE and a full span runs the map as a
    :class:`~posenc.encodings.BranchedRoPE` of its RoPE on posenc's route (identity rotary
    tables, keys cached unrotated, :func:`posenc.attention` rotating each branch at the layer's
    positions: left padding gives each row what the row alone gives); sliding-window
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
        target_length: N, the input length in tokens the extension is for (instead of ``factor``).
        params: the scaling's extra fields (and ``dynamic_cache``), or the map's parameters.

    Planned from the config by :func:`posenc.hf_config.extension.plan_extension` (the fields
    and the new plan, every refusal); here the fields are checked with transformers' config
    class, the plan applied (the routes, or the family's adapter) and the fields written.

    Returns:
        ``model``, changed in place (its config too).

    Raises:
        MissingKey (KeyError): a scaling without ``factor``.
        InvalidArgument (ValueError): both ``factor`` and ``target_length``; a ``target_length``
            not above L0, for llama3 (no published rule), or that a given parameter cannot reach
            (:func:`~posenc.hf_config.extension.fit_to_length`); the model's RoPE is already
            scaled (scalings), an unknown method (the message lists both kinds), s < 1, a bad or unknown parameter (named),
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
            call, a StaticCache. And as :func:`use_encoding`. On an error at extension
            time, model and config are left unchanged.
    """
    config = model.config
    adapter = adapter_of(model)
    family = None if adapter is not None else family_of(model)
    base = model.base_model if adapter is not None else base_model(model, family)
    current = config.to_dict()
    if "max_position_embeddings" not in current and isinstance(getattr(config, "max_position_embeddings", None), int):
        # an attribute_map alias (GPT-J's n_positions), which to_dict() spells the family's way
        current["max_position_embeddings"] = config.max_position_embeddings
    if target_length is not None:
        factor, params = _fitted(current, method, factor, target_length, params)
    extension = plan_extension(current, base.__dict__.get("posenc_plan"), method, factor,
                               facts=_facts(base, family), layer_types=layer_types, **params)
    target = config if extension.target is None else getattr(config, extension.target)
    if not extension.position_map:
        _check_transformers_reads(target, extension.fields, method)
    if adapter is not None:
        _apply_adapter_plan(model, adapter, extension)
        return model
    apply = prepare_layers(model, extension.plan, None, {})  # every refusal before the config changes
    if extension.position_map:
        apply()
        # recorded as the extension (rebuilt from it by from_pretrained), not as a plan of
        # use_encoding: the model still runs its config's RoPE, as a later extend_context reads it
        base.__dict__.pop("posenc_plan", None)
        config.__dict__.pop(PLAN_KEY, None)
    for name, value in extension.fields.items():
        setattr(target, name, value)
    if not extension.position_map:
        apply()
    return model


def _fitted(config: dict, method: str, factor: float | None, target_length: int, params: dict,
            ) -> tuple[float | None, dict]:
    """(factor, params) of :func:`~posenc.hf_config.extension.fit_to_length`, the choice printed."""
    if factor is not None:
        raise InvalidArgument(f"factor: give factor or target_length, not both (got factor={factor!r}, "
                              f"target_length={target_length!r})")
    l0 = params.get("original_max_position_embeddings") or training_length(config)
    fit = fit_to_length(method, target_length, l0, params)
    print(f"extend_context: {fit.rule}", file=sys.stderr)
    chosen = dict(fit.params)
    # a map's own factor (windowed_yarn's) goes where extend_context takes a factor
    return (fit.factor if fit.factor is not None else chosen.pop("factor", None)), chosen


def _facts(base: nn.Module, family: Family | None) -> ModelFacts:
    """What the planner needs of the model beyond its config: its decoder layers."""
    if family is None:  # an adapter family: its plan is read from the config alone
        return ModelFacts()
    layers = list(getattr(base, family.layers))
    return ModelFacts(num_layers=len(layers), attention_layers=tuple(
        i for i, layer in enumerate(layers) if getattr(layer, family.attention, None) is not None))


def _apply_adapter_plan(model: nn.Module, adapter: adapters.Adapter, extension: Extension) -> None:
    """An adapter family's extension (Falcon's rotary): the new plan through the family's adapter."""
    apply_plan = adapter.plan(model, extension.plan)  # every refusal before the config changes
    record = plan_record(None, None, extension.plan)
    for name, value in extension.fields.items():
        setattr(model.config, name, value)
    adapters.restore(model)
    apply_plan()
    keep_plan(model, extension.plan, record)


def _check_transformers_reads(config: Any, fields: dict, method: str) -> None:
    """Refuse an extension the family's own config class would refuse to load (Phi-3 accepts
    longrope only): a saved model must load in plain transformers."""
    try:
        type(config).from_dict({**config.to_dict(), **fields})
    except Exception as err:  # transformers' validators raise several types
        raise InvalidArgument(f"method={method!r}: transformers' {type(config).__name__} refuses the extended config "
                              f"({' '.join(str(err).split())[:300]})") from err
