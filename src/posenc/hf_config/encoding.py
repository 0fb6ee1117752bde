"""Config dicts <-> posenc encodings: the RoPE of a Hugging Face ``config.json``
(:func:`from_hf_config`), its fields back (:func:`to_hf_dict`), and the fields that extend
its context (:func:`extension_config`, what
:func:`posenc.integrations.transformers.extend_context` writes into a model's config).

The spelling itself is :mod:`posenc.hf_config.rope`'s; this module builds encodings from
what that one reads. It is kept apart from it because it imports the RoPE class, and
:meth:`posenc.RoPE.to_hf_dict` imports the writer: one module holding both would close a
circle. Plain dicts in and out, no transformers import.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from posenc.encodings.rope.multiaxis import MRoPE
from posenc.encodings.rope.rotary import RoPE, rope_frequencies
from posenc.encodings.rope.scaling import rope_type_record
from posenc.errors import InvalidArgument, InvalidType, MissingKey
from posenc.hf_config.rope import extension_scaling, read_hf_config, rope_parameters_of, write_hf_config


def _same_rope(a: RoPE, b: RoPE) -> bool:
    """The same rotation: class and every recorded constructor argument equal."""
    return a is b or (type(a) is type(b) and a.config() == b.config())


def from_hf_config(config: Mapping[str, Any], *, layer_type: str | None = None, **kwargs: Any) -> RoPE:
    """The :class:`~posenc.RoPE` of a Hugging Face model config (a parsed ``config.json``).

    For a family whose RoPE the plain reading below gets wrong (interleaved pairs: Cohere,
    Cohere2, GPT-J, Llama 4, DeepSeek-V3; keys of its own: GPT-NeoX's ``rotary_pct`` /
    ``rotary_emb_base``, GPT-J's ``n_embd`` / ``rotary_dim``, DeepSeek-V3's
    ``qk_rope_head_dim``; a nested ``text_config``; Gemma 3's ``rope_local_base_freq``), the
    RoPE of its :func:`~posenc.hf_config.families.position_plan` for ``layer_type`` (one RoPE
    must remain). Otherwise it reads rope_theta, rope_scaling (v4) or rope_parameters (v5), head_dim (or hidden_size //
    num_attention_heads), partial_rotary_factor and max_position_embeddings, filling in what
    Hugging Face takes from the config rather than the rope dict (see
    :func:`~posenc.hf_config.rope.read_hf_config`). Hugging Face's layout: half-split pairs
    (i, i + r/2), cos and sin multiplied by the attention factor.

    Args:
        config: the config dict.
        layer_type: for a v5 per-layer ``rope_parameters`` dict, which layer type to read.
        kwargs: more :class:`~posenc.RoPE` options (``interleaved``, ``dynamic_cache``).

    Returns:
        A RoPE whose :meth:`~posenc.RoPE.to_hf_dict` gives back the config's RoPE fields
        unchanged (its ``hf_layout`` is the layout read); ``rope.max_position_embeddings``
        holds the config's value (or None).

    Every number is read through :mod:`posenc.hf_config.values`, bounded before anything is
    allocated: head_dim <= 65536, positions (max_position_embeddings, a scaling's L0 and
    L0 x factor) <= 2^31, layers and heads <= 65536, rope_theta in (1, 1e30]; a malformed
    config (a number as a string, a bool, null, NaN, inf, zero or negative, a
    partial_rotary_factor without an even rotary width in [2, head_dim]) raises posenc's
    errors (docs/errors.md, "Malformed configs"), never a raw Python one.

    Raises:
        InvalidType (a TypeError), MissingKey (a KeyError), InvalidArgument (a ValueError): as
        :func:`~posenc.hf_config.rope.read_hf_config`, :func:`~posenc.hf_config.position_plan`
        and :class:`~posenc.RoPE`.
    """
    family_rope = _family_rope(config, layer_type, kwargs)
    if family_rope is not None:
        return family_rope
    rope_kwargs, layout = read_hf_config(config, layer_type=layer_type)
    return RoPE(**rope_kwargs, **kwargs, hf_layout=layout, max_position_embeddings=config.get("max_position_embeddings"))


def _family_rope(config: Mapping[str, Any], layer_type: str | None, kwargs: dict[str, Any]) -> RoPE | None:
    """For a family whose RoPE the plain reading gets wrong (a layout, keys of its own, a
    nested text_config, a RoPE per layer type: :func:`posenc.hf_config.families.reads_plainly`),
    the RoPE its :func:`~posenc.hf_config.families.position_plan` gives the layers of
    ``layer_type`` (or every RoPE layer); None for the others.

    Raises:
        InvalidArgument: the plan's RoPE layers differ and no ``layer_type`` picks one (a theta
            per layer, Granite SWA's ``layer_rope_theta``: named, whatever ``layer_type``), no layer
            of ``layer_type``, no RoPE layer at all; and as :func:`position_plan`.
    """
    # imported here: families imports this module's neighbours, and most configs never get here
    from posenc.hf_config.families import FAMILIES, plan_for_one_rope, reads_plainly

    family = FAMILIES.get(config.get("model_type")) if isinstance(config, Mapping) else None
    if family is None or family.reader is not None or reads_plainly(config):
        return None  # (a family with a whole-plan reader of its own: its RoPE, if any, reads plainly)
    plan = plan_for_one_rope(config)
    layers = [layer for layer in plan if layer_type is None or layer.layer_type == layer_type]
    if not layers:
        raise InvalidArgument(f"layer_type={layer_type!r}: no layer of that type; the layer types are "
                              f"{sorted({str(layer.layer_type) for layer in plan})}")
    ropes = []
    for layer in layers:  # layers of different types may hold equal RoPEs (gpt-oss): one then
        if isinstance(layer.encoding, RoPE) and all(not _same_rope(layer.encoding, other) for other in ropes):
            ropes.append(layer.encoding)
    if not ropes and any(isinstance(layer.encoding, MRoPE) for layer in layers):
        raise InvalidArgument(f"config ({config['model_type']}): its layers are M-RoPE (multimodal RoPE: "
                              "temporal, height and width positions per mrope_section), not one RoPE; read them "
                              "with posenc.hf_config.position_plan (a posenc.MRoPE per layer)")
    if not ropes:
        raise InvalidArgument(f"config ({config['model_type']}): no RoPE on " +
                              ("any layer" if layer_type is None else f"the {layer_type} layers"))
    if len(ropes) > 1 and isinstance(config.get("layer_rope_theta"), (list, tuple)):
        # one theta per layer (Granite SWA): layers of one type differ too, so layer_type= cannot choose
        raise InvalidArgument(f"config ({config['model_type']}): the layers' RoPEs differ layer by layer "
                              f"(layer_rope_theta = {list(config['layer_rope_theta'])!r:.120}: a theta per layer, "
                              "0 for NoPE), not one RoPE nor one per layer type; read them with "
                              "posenc.hf_config.position_plan (one RoPE per layer)")
    if len(ropes) > 1:
        raise InvalidArgument(f"config ({config['model_type']}): the layers' RoPEs differ by layer type; pass "
                              f"layer_type= one of {sorted({str(layer.layer_type) for layer in plan})} "
                              "(posenc.hf_config.position_plan reads every layer)")
    rope = ropes[0]
    if not kwargs:
        return rope
    args = dict(head_dim=rope.head_dim, rotary_dim=rope.rotary_dim, base=rope.base, interleaved=rope.interleaved,
                scaling=rope.scaling, hf_layout=rope.hf_layout, max_position_embeddings=rope.max_position_embeddings)
    return RoPE(**{**args, **kwargs})


def to_hf_dict(rope: RoPE | MRoPE) -> dict[str, Any]:
    """The RoPE fields of a Hugging Face config for ``rope`` (same as ``rope.to_hf_dict()``).

    An :class:`~posenc.MRoPE` (Qwen2-VL / Qwen2.5-VL text tower) is written with its
    ``mrope_section`` in the rope dict, in the spelling it was read in (its ``hf_layout``, set by
    :func:`posenc.hf_config.position_plan`: v4 ``{"type": "mrope", "mrope_section": [...]}``
    or v5 ``rope_parameters``), else v4 ``rope_scaling`` ``{"rope_type": "default",
    "mrope_section": [...]}``.

    Raises:
        TypeError: ``rope`` is neither a posenc RoPE nor an MRoPE.
    """
    if isinstance(rope, MRoPE):
        out = write_hf_config(head_dim=rope.head_dim, rotary_dim=rope.rotary_dim, base=rope.base,
                              scaling=rope.scaling, layout=getattr(rope, "hf_layout", None))
        container = next((key for key in ("rope_scaling", "rope_parameters") if isinstance(out.get(key), dict)), None)
        if container is None:
            container = "rope_scaling"
            out[container] = {"rope_type": "default"}
        out[container] = {**out[container], "mrope_section": list(rope.mrope_section)}
        if rope.mrope_interleaved:
            out[container]["mrope_interleaved"] = True
        return out
    if not isinstance(rope, RoPE):
        raise InvalidType(f"rope must be a posenc RoPE or MRoPE, got {type(rope).__name__}")
    return rope.to_hf_dict()


def extension_config(config: Mapping[str, Any], rope_type: str, factor: float, **params: Any) -> dict[str, Any]:
    """The config fields that extend the context of a model with the default RoPE by
    ``factor`` s, in Hugging Face's v5 spelling, so that a plain transformers
    ``from_pretrained`` of the updated config computes what posenc's RoPE of it computes.

    The scaling is :func:`~posenc.hf_config.rope.extension_scaling` ``(rope_type, s, L0)``
    with ``params`` on top (e.g. ``beta_fast=16`` for yarn), L0 the config's
    ``max_position_embeddings`` (or ``original_max_position_embeddings=`` in ``params``),
    written over the config's ``rope_parameters``
    (:func:`~posenc.hf_config.rope.rope_parameters_of`):

    - linear, yarn, dynamic_yarn, llama3: ``{"rope_type": ..., "factor": s, ...}``;
      ``max_position_embeddings`` becomes round(s * L0) (yarn, dynamic_yarn and llama3 keep L0
      as ``original_max_position_embeddings``). transformers has no dynamic_yarn: it loads
      that config with a logged warning and raises KeyError('dynamic_yarn') building the model
      (docs/encodings.md);
    - dynamic: ``{"rope_type": "dynamic", "factor": s}``; ``max_position_embeddings`` stays L0,
      which is where transformers reads dynamic NTK's original context from;
    - ntk (static NTK-aware, no transformers rope_type): the equivalent plain RoPE with
      ``rope_theta`` = theta * s^(d/(d-2)) (the record's ``hf_equivalent``).

    Args:
        config: the model's config dict (``model.config.to_dict()``), its RoPE unscaled.
        rope_type: one of :data:`~posenc.hf_config.rope.EXTENSION_METHODS`.
        factor: s >= 1.

    Returns:
        The fields to set on the config, in the order to set them: ``max_position_embeddings``
        (where it changes), then ``rope_parameters``; ``{}`` when s = 1 (the model stays as
        trained). The updated config reads back (:func:`from_hf_config`) without error.

    Raises:
        ValueError: the config's RoPE is already scaled, an unknown rope_type, s < 1, or a bad
            parameter (named, as :func:`posenc.rope_frequencies` raises). KeyError: no
            ``max_position_embeddings`` and no ``original_max_position_embeddings=``. And as
            :func:`from_hf_config` for the config itself.
    """
    current = from_hf_config(config)
    if current.scaling is not None:
        raise InvalidArgument(f"model: its RoPE is already scaled ({current.scaling.get('rope_type')}); extend a model with the default rope_type")
    params = dict(params)
    original = params.pop("original_max_position_embeddings", None) or config.get("max_position_embeddings")
    if original is None:
        raise MissingKey("config: needs 'max_position_embeddings' (or pass original_max_position_embeddings=)")
    original = int(original)
    scaling = extension_scaling(rope_type, factor, original)  # validates rope_type and factor
    if scaling is None:
        return {}
    scaling.update(params)
    fields = _spelled_extension(scaling, rope_parameters_of(config), current, original)
    from_hf_config({**config, **fields})  # the reader refuses a bad parameter before anything is written
    return fields


def _spelled_extension(scaling: dict[str, Any], rope_parameters: dict[str, Any], current: RoPE, original: int) -> dict[str, Any]:
    """The scaling in Hugging Face's spelling, written over ``rope_parameters``, with
    ``max_position_embeddings`` set to the extended context where Hugging Face does not read
    the original one from it."""
    fields: dict[str, Any] = {}
    record = rope_type_record(scaling)
    if record.hf_equivalent is not None:
        rope_frequencies(current.rotary_dim, base=current.base, scaling=scaling)  # refuse bad values first
        theta, scaling = record.hf_equivalent(scaling, current.base, current.rotary_dim)
        rope_parameters.update(rope_type="default", rope_theta=theta)
        if scaling is None:
            return {"rope_parameters": rope_parameters}
        record = rope_type_record(scaling)
    if record.needs_context and not record.hf_top_level_context:
        # dynamic NTK: Hugging Face takes L0 from max_position_embeddings, so that stays L0
        scaling.pop("original_max_position_embeddings", None)
    else:
        fields["max_position_embeddings"] = int(round(original * float(scaling["factor"])))
    rope_parameters.update(scaling)
    fields["rope_parameters"] = rope_parameters
    return fields
