"""How a Hugging Face ``config.json`` spells RoPE: read a model's RoPE fields into the
arguments of a :class:`~posenc.RoPE`, write them back in the config's own spelling, inspect
them, and spell a context extension.

- :func:`read_hf_config` / :func:`write_hf_config`: config dict <-> RoPE arguments, v4
  (``rope_scaling``) and v5 (``rope_parameters``, per-layer dicts) spellings, the round trip
  the identity on :data:`HF_ROPE_FIELDS`. The ``layout`` the reader returns (kept by
  ``RoPE(hf_layout=...)``) records the spelling.
- :func:`inspect_config` -> :class:`RopeInspection`: per frequency pair, the wavelengths
  against the original and extended contexts (drawn by :func:`posenc.hf_config.rope_figure.plot_rope_inspection`).
- :func:`extension_scaling` (:data:`EXTENSION_METHODS`): the ``rope_scaling`` dict of a
  context extension; :func:`rope_parameters_of` the v5 dict a config's RoPE is written over
  (:func:`posenc.hf_config.encoding.extension_config` spells a whole extension).

What Hugging Face takes from the model config rather than the rope dict (L0, a derived
factor) is filled in as each rope_type's record in
:data:`~posenc.encodings.rope.scaling.ROPE_TYPES` says. Plain dicts in and out: imports
torch, the rope_type table, validation and errors only (never transformers, never an
encoding module: :meth:`posenc.RoPE.to_hf_dict` imports :func:`write_hf_config` from here).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from posenc.encodings.rope.scaling import (
    ROPE_TYPES,
    compute_rope_parameters,
    extension_methods,
    rope_type_of,
    yarn_correction_dim,
)
from posenc.errors import InvalidArgument, MissingKey
from posenc.hf_config.values import (
    MAX_POSITIONS,
    MAX_ROPE_THETA,
    check_real,
    check_rope_dict,
    check_size,
    config_int,
    config_mapping,
    config_number,
    rotary_dim_of,
)

#: The config.json fields that determine a model's RoPE (read by :func:`read_hf_config`).
HF_ROPE_FIELDS = (
    "rope_theta", "rope_scaling", "rope_parameters", "head_dim", "hidden_size", "num_attention_heads",
    "partial_rotary_factor", "max_position_embeddings", "original_max_position_embeddings",
)
_MISSING = "<missing>"


def rope_dict_spellings(config: Mapping[str, Any]) -> tuple[Mapping[str, Any], str | None]:
    """The config with one rope dict, as transformers 5 builds it, and a note when two disagreed.

    transformers' ``convert_rope_params_to_dict`` (``modeling_rope_utils.py``) takes
    ``rope_scaling or rope_parameters``: a non-empty v4 ``rope_scaling`` replaces the v5
    ``rope_parameters`` wholesale (the latter's ``rope_theta`` included). A config holding both
    is read the same way; when ``rope_parameters`` says anything the ``rope_scaling`` dict does
    not (another rope_type, factor, theta), the note names both.

    Returns:
        (config, note): the config without the dict transformers ignores (the same object when
        there is nothing to resolve), and the note or None.
    """
    scaling, params = config.get("rope_scaling"), config.get("rope_parameters")
    if not scaling or "rope_parameters" not in config:
        return config, None
    resolved = {k: v for k, v in config.items() if k != "rope_parameters"}
    note = None
    if isinstance(params, Mapping) and params:
        def kind(d: Mapping[str, Any]) -> Any:
            return d.get("rope_type", d.get("type", "default")) if isinstance(d, Mapping) else d
        same = kind(scaling) == kind(params) and all(
            params[k] == scaling[k] for k in params if k in scaling and k not in ("rope_type", "type"))
        extra = {k: params[k] for k in params if k not in scaling and k not in ("rope_type", "type")}
        if "rope_theta" in extra and extra["rope_theta"] == config.get("rope_theta", extra["rope_theta"]):
            extra.pop("rope_theta")
        if not same or extra:
            note = (f"config holds both rope_scaling={dict(scaling)!r} and rope_parameters={dict(params)!r}, which "
                    "disagree; transformers builds rope_scaling (convert_rope_params_to_dict: rope_scaling or "
                    "rope_parameters), so posenc reads rope_scaling")
    return resolved, note


def _scaling_container(config: Mapping[str, Any], layer_type: str | None) -> tuple[str | None, Any]:
    """(key, dict) of the rope dict: the one transformers builds (:func:`rope_dict_spellings`:
    v4 ``rope_scaling`` when non-empty, else v5 ``rope_parameters``).

    Raises:
        InvalidArgument: a per-layer-type dict without ``layer_type`` (or a layer type it does
            not hold), ``layer_type`` given for a config without per-layer-type parameters.
    """
    order = ("rope_scaling", "rope_parameters") if config.get("rope_scaling") else ("rope_parameters", "rope_scaling")
    for key in order:
        if key in config:
            value = config[key]
            if isinstance(value, Mapping) and value and all(isinstance(v, Mapping) or v is None for v in value.values()):
                # v5 per-layer dict: {"full_attention": {...}, "sliding_attention": {...}}
                if layer_type not in value:
                    raise InvalidArgument(f"config[{key!r}] holds one rope dict per layer type {sorted(value)}; pass layer_type=one of them")
                return key, value[layer_type]
            if value is not None and not isinstance(value, Mapping):
                raise InvalidArgument(f"config[{key!r}] must be a dict or null, got {type(value).__name__}")
            if layer_type is not None:
                raise InvalidArgument(
                    f"layer_type={layer_type!r}: config[{key!r}] is one rope dict for every layer, not one per "
                    "layer type; leave layer_type out (posenc.hf_config.position_plan reads a model layer by layer)")
            return key, value
    if layer_type is not None:
        raise InvalidArgument(f"layer_type={layer_type!r}: the config has no per-layer-type rope_parameters; leave layer_type out")
    return None, None


#: rope dict keys that are not RoPE's own: M-RoPE's sections (Qwen2-VL, Qwen2.5-VL), kept in the
#: layout so that the dict is written back whole.
_PASSTHROUGH_KEYS = ("mrope_section", "mrope_interleaved")
#: rope_type spellings transformers reads as the default rope_type (Qwen2-VL's v4 "mrope").
_DEFAULT_ALIASES = frozenset({"mrope"})


#: Model families whose configs carry no RoPE field because they have no RoPE.
_NON_ROPE_MODEL_TYPES = frozenset({
    "bert", "roberta", "distilbert", "electra", "albert", "deberta", "deberta-v2", "gpt2", "opt", "bart",
    "t5", "mt5", "bloom", "mpt", "whisper", "xlm-roberta",
})
_ROPE_FIELDS = ("rope_theta", "rope_parameters", "rope_scaling", "partial_rotary_factor", "rotary_dim", "rotary_pct")


def _refuse_without_rope(config: Mapping[str, Any]) -> None:
    """Refuse a config that says its model has no RoPE rather than invent theta = 10000 for it:
    no RoPE field and either a ``position_embedding_type`` that is not rotary (BERT's
    "absolute", "relative_key"), ALiBi switched on (Falcon's ``alibi``, MPT's
    ``attn_config.alibi``), or a family without RoPE (``model_type`` bert, gpt2, t5, bloom, ...).
    A config with no RoPE field and none of these (old Llama configs) reads as theta = 10000.

    Raises:
        ValueError: naming what was found.
    """
    if any(config.get(key) is not None for key in _ROPE_FIELDS):
        return
    embedding = config.get("position_embedding_type")
    attn_config = config.get("attn_config") if isinstance(config.get("attn_config"), Mapping) else {}
    found = None
    if embedding is not None and str(embedding).lower() not in ("rope", "rotary"):
        found = f"position_embedding_type={embedding!r}"
    elif config.get("alibi") or attn_config.get("alibi"):
        found = "alibi=true"
    elif config.get("model_type") in _NON_ROPE_MODEL_TYPES:
        found = f"model_type={config['model_type']!r}"
    if found is not None:
        raise InvalidArgument(
            f"config: this model has no RoPE ({found}; no rope_theta, rope_parameters or rope_scaling); "
            "posenc reads the RoPE of rotary models (Llama, Qwen, Mistral, Gemma, Phi, ...)"
        )


#: Grok's top-level rope_type values (vLLM / SGLang ``grok.py``, ``get_rope_scaling``) -> posenc's.
_GROK_ROPE_TYPES = {"original": "default", "yarn": None, "yarn_linear": None, "yarn_log": "yarn_log", "theta_scale": "theta_scale"}


def _refuse_grok_spelling(config: Mapping[str, Any]) -> None:
    """Refuse Grok's spelling of its RoPE, which no Hugging Face config uses and
    :func:`read_hf_config` would otherwise read as plain RoPE: a top-level ``rope_type`` with
    ``scaling_factor`` / ``original_max_position_embeddings`` beside it (vLLM's and SGLang's
    ``grok.py`` read it), or ``rope_rotate_half_dims`` (the rotary part half the head). The
    message spells the posenc scaling of the same frequencies where there is one.

    Raises:
        InvalidArgument: naming the key and what to construct instead.
    """
    if config.get("rope_rotate_half_dims"):
        raise InvalidArgument(
            "config['rope_rotate_half_dims'] = true (Grok: RoPE on the first half of each head) is not read by "
            "posenc's config reader; construct RoPE(head_dim, rotary_dim=head_dim // 2, ...) instead"
        )
    method = config.get("rope_type")
    if method is None or method == "original":
        return
    spelled = _GROK_ROPE_TYPES.get(method) if isinstance(method, str) else None
    if spelled is None:
        raise InvalidArgument(
            f"config['rope_type'] = {method!r} at the top level (Grok's spelling) is not read by posenc; "
            f"the top-level values with a posenc rope_type are {sorted(k for k, v in _GROK_ROPE_TYPES.items() if v)} "
            "(Grok's 'yarn' is YaRN with attention factor 1: write a rope_scaling dict with rope_type 'yarn' and "
            "'attention_factor': 1.0)"
        )
    keys = {"factor": config.get("scaling_factor"),
            "original_max_position_embeddings": config.get("original_max_position_embeddings"),
            **{k: config[k] for k in ("beta_fast", "beta_slow", "extrapolation_factor") if k in config and spelled == "yarn_log"}}
    raise InvalidArgument(
        f"config['rope_type'] = {method!r} at the top level (Grok's spelling) is not read by posenc's config reader; "
        f"construct RoPE(head_dim, base=rope_theta, scaling={ {'rope_type': spelled, **keys} })"
    )


def head_dim_of(config: Mapping[str, Any]) -> int:
    """The per-head width D of a config dict: ``head_dim``, else ``hidden_size //
    num_attention_heads`` (the configs that predate ``head_dim``: Llama 2, Qwen2, ...).

    Every one of the three keys that is there (not null) must be a positive int within
    posenc's bounds (:mod:`posenc.hf_config.values`: head_dim <= 65536, heads <= 65536,
    hidden_size <= 2^31); without ``head_dim``, hidden_size must be a multiple of the heads.

    Raises:
        MissingKey: neither is there. InvalidType: a value that is not an int (a string, a
        bool, a float). InvalidArgument: zero, negative, past a bound, or hidden_size not
        divisible by num_attention_heads.
    """
    hidden = config_int(config, "hidden_size", default=None)
    heads = config_int(config, "num_attention_heads", default=None)
    if config.get("head_dim") is not None:
        return config_int(config, "head_dim")
    if hidden is not None and heads is not None:
        if hidden % heads:
            raise InvalidArgument(f"config: hidden_size {hidden} is not divisible by num_attention_heads {heads}, "
                                  "and there is no head_dim; give head_dim")
        return check_size(hidden // heads, "config: head_dim (hidden_size // num_attention_heads)", key="head_dim")
    raise MissingKey("config: needs 'head_dim', or 'hidden_size' and 'num_attention_heads'")


def read_hf_config(config: Mapping[str, Any], *, layer_type: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Read the RoPE of a Hugging Face ``config.json`` dict.

    Fields: ``rope_theta`` (default 10000), ``rope_parameters`` (v5, may carry rope_theta and
    partial_rotary_factor) or ``rope_scaling`` (v4), ``head_dim`` (else hidden_size //
    num_attention_heads), ``partial_rotary_factor``, ``max_position_embeddings`` and Phi-3's
    top-level ``original_max_position_embeddings``. Values that Hugging Face takes from the
    config rather than the rope dict are filled into the returned scaling as v5's
    ``standardize_rope_params`` does: L0 for dynamic/yarn/llama3/longrope (Phi-3's top-level
    value first, else max_position_embeddings), yarn's ``factor: null`` and longrope's missing
    ``factor`` as max_position_embeddings / L0.

    Returns:
        (kwargs for :class:`~posenc.RoPE` (head_dim, base, scaling, partial_rotary_factor),
        layout: how the config spelled things, for :func:`write_hf_config`).

    Every number is read through :mod:`posenc.hf_config.values`, with its bounds: head_dim an
    even int <= 65536 (:func:`head_dim_of`), ``rope_theta`` a finite number in (1, 1e30]
    (null refused), ``partial_rotary_factor`` in (0, 1] giving an even rotary_dim >= 2,
    ``max_position_embeddings`` / ``original_max_position_embeddings`` ints in [1, 2^31],
    and a scaling's L0 x factor at most 2^31 positions.

    Raises:
        InvalidType: (a TypeError) config is not a dict; a number given as a string, a bool,
            or null for rope_theta.
        MissingKey: (a KeyError) no head_dim nor hidden_size and num_attention_heads, or a
            context length that cannot be found.
        InvalidArgument: (a ValueError) a value out of range or past a bound (named), a
            per-layer rope dict without ``layer_type``, ``layer_type`` for a config without
            per-layer-type parameters, or a config that says its model has no RoPE (see
            ``_refuse_without_rope``).

    Both ``rope_scaling`` and ``rope_parameters`` present: read as transformers builds it
    (:func:`rope_dict_spellings`), with a ``warnings.warn`` naming both when they disagree.
    Qwen2-VL's ``{"type": "mrope", "mrope_section": [...]}`` reads as the default rope_type (as
    transformers does); ``mrope_section`` is kept in the layout and written back.
    """
    config_mapping(config)
    _refuse_grok_spelling(config)
    _refuse_without_rope(config)
    config, note = rope_dict_spellings(config)
    if note is not None:
        warnings.warn(note, stacklevel=2)
    present = {key: config[key] for key in HF_ROPE_FIELDS if key in config}
    container, params = _scaling_container(config, layer_type)
    params = dict(params) if params is not None else None
    passthrough: dict[str, Any] = {}
    if params is not None:
        check_rope_dict(params, f"config[{container!r}]" + (f"[{layer_type!r}]" if layer_type is not None else ""))
        for key in _PASSTHROUGH_KEYS:
            if key in params:
                passthrough[key] = params.pop(key)
        alias = rope_type_of(params)
        if alias in _DEFAULT_ALIASES:
            # Qwen2-VL's v4 spelling {"type": "mrope", "mrope_section": [...]}: transformers reads it as
            # the default rope_type (Qwen2VLTextConfig.convert_rope_params_to_dict); on text, M-RoPE is RoPE
            params = {k: v for k, v in params.items() if k not in ("type", "rope_type")}
            unknown = sorted(set(params) - {"rope_theta", "partial_rotary_factor"})
            if unknown:
                raise InvalidArgument(f"config[{container!r}]: rope_type {alias!r} takes no {unknown} (transformers reads it as the default rope_type)")

    head_dim = head_dim_of(config)
    if head_dim % 2:
        raise InvalidArgument(f"config: head_dim {head_dim} must be even (RoPE rotates pairs of dimensions)")
    # every number below through posenc.hf_config.values: one set of checks and bounds for all families
    base = config_number(config, "rope_theta", default=10000.0, nullable=False, gt=1, le=MAX_ROPE_THETA)
    prf = config_number(config, "partial_rotary_factor", default=None)
    max_pos = config_int(config, "max_position_embeddings", default=None)
    config_int(config, "original_max_position_embeddings", default=None)
    config_int(config, "num_hidden_layers", default=None)  # not read here, but a malformed config is refused whole
    scaling = None
    implicit: dict[str, Any] = {}
    if params is not None:
        if "rope_theta" in params:
            base = check_real(params.pop("rope_theta"), f"config[{container!r}]['rope_theta']", gt=1, le=MAX_ROPE_THETA)
        if "partial_rotary_factor" in params:
            prf = params.pop("partial_rotary_factor")
            prf = None if prf is None else check_real(prf, f"config[{container!r}]['partial_rotary_factor']")
        if rope_type_of(params) != "default":
            scaling = params
            if scaling.get("original_max_position_embeddings") is not None:  # read below: checked first
                check_size(scaling["original_max_position_embeddings"],
                           f"config[{container!r}]['original_max_position_embeddings']",
                           key="original_max_position_embeddings")
    # an unknown rope_type is left for RoPE to refuse, with the list of known ones
    record = ROPE_TYPES.get(rope_type_of(scaling)) if scaling is not None else None
    if record is not None and record.needs_context:
        rope_type = rope_type_of(scaling)
        top = config.get("original_max_position_embeddings") if record.hf_top_level_context else None
        if top is not None or scaling.get("original_max_position_embeddings") is None:
            context = top if top is not None else max_pos
            if context is None:
                raise MissingKey(f"config: rope_type {rope_type!r} needs 'original_max_position_embeddings' or 'max_position_embeddings'")
            if scaling.get("original_max_position_embeddings") != context:
                implicit["original_max_position_embeddings"] = scaling.get("original_max_position_embeddings", _MISSING)
                scaling["original_max_position_embeddings"] = context
        context = scaling["original_max_position_embeddings"]
        derive_factor = record.hf_factor_from_context is not None and record.hf_factor_from_context(scaling)
        if derive_factor and max_pos is not None:
            implicit["factor"] = scaling.get("factor", _MISSING)
            scaling["factor"] = max_pos / context
    if record is not None and record.partial_rotary_selects_frequencies:
        # p-RoPE's share of kept frequencies: its own parameter, the rotation spans the head
        if prf is not None:
            scaling["partial_rotary_factor"] = prf
        prf = None
    if prf is not None:
        rotary_dim_of(head_dim, prf)  # an even width in [2, head_dim], as RoPE(partial_rotary_factor=) needs
    if scaling is not None:
        _check_extent(scaling, container, max_pos)
    layout = {"present": present, "container": container, "layer_type": layer_type, "implicit": implicit,
              "partial_rotary_factor": prf, "passthrough": passthrough}
    kwargs = {"head_dim": head_dim, "base": base, "scaling": scaling,
              "partial_rotary_factor": None if prf is None or prf == 1.0 else prf}
    return kwargs, layout


def _check_extent(scaling: Mapping[str, Any], container: str | None, max_pos: int | None) -> None:
    """Bound the positions a scaling reaches: its L0 (``original_max_position_embeddings``) and
    L0 x ``factor`` at most :data:`~posenc.hf_config.values.MAX_POSITIONS` (2^31), L0 being the
    dict's or else ``max_position_embeddings``. The rope_type's own rules (factor >= 1, ...) are
    :class:`~posenc.RoPE`'s.

    Raises:
        InvalidType: a factor that is not a number. InvalidArgument: NaN, inf, <= 0, or
            past the bound (1e308 x 4096 would overflow every context computed from it).
    """
    where = f"config[{container!r}]" if container else "config['rope_scaling']"
    context = scaling.get("original_max_position_embeddings")  # checked by read_hf_config
    factor = scaling.get("factor")
    if factor is None:
        return
    factor = check_real(factor, f"{where}['factor']", gt=0, le=MAX_POSITIONS)
    context = context if context is not None else max_pos
    if context is not None and context * factor > MAX_POSITIONS:
        raise InvalidArgument(f"{where}['factor'] = {factor:g} over a context of {context} reaches "
                              f"{context * factor:.4g} positions, past posenc's bound of 2^31 = {MAX_POSITIONS}")


def write_hf_config(
    *, head_dim: int, rotary_dim: int, base: float, scaling: Mapping[str, Any] | None, layout: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The RoPE fields of a config.json, the inverse of :func:`read_hf_config`.

    Writes the current values in the spelling recorded in ``layout`` (v4 ``rope_scaling`` or
    v5 ``rope_parameters``, ``type`` or ``rope_type``, head_dim or hidden_size /
    num_attention_heads, implicit keys dropped again), so that
    ``write(read(config)) == {k: config[k] for k in HF_ROPE_FIELDS if k in config}``.
    Without a layout: ``rope_theta``, ``head_dim``, ``partial_rotary_factor`` (when
    partial) and ``rope_scaling``.

    Raises:
        ValueError: the recorded hidden_size / num_attention_heads disagree with head_dim.
    """
    if layout is None:
        out: dict[str, Any] = {"rope_theta": base, "head_dim": head_dim}
        if rotary_dim != head_dim:
            out["partial_rotary_factor"] = rotary_dim / head_dim
        out["rope_scaling"] = dict(scaling) if scaling is not None else None
        return out
    present = layout["present"]
    out = dict(present)  # keys RoPE does not own (hidden_size, max_position_embeddings) as read
    if "head_dim" in present and present["head_dim"] is not None:
        out["head_dim"] = head_dim
    elif present.get("hidden_size") is not None and present["hidden_size"] // present["num_attention_heads"] != head_dim:
        raise InvalidArgument(f"hidden_size // num_attention_heads != head_dim={head_dim}; write head_dim instead")
    prf = layout["partial_rotary_factor"]
    if prf is None or int(head_dim * prf) != rotary_dim:
        prf = None if rotary_dim == head_dim else rotary_dim / head_dim
    rope_dict: dict[str, Any] | None = None if scaling is None else dict(scaling)
    if rope_dict is not None:
        for key, original in layout["implicit"].items():
            if original == _MISSING:
                rope_dict.pop(key, None)
            else:
                rope_dict[key] = original
        record = ROPE_TYPES.get(rope_type_of(rope_dict))
        if record is not None and record.partial_rotary_selects_frequencies:
            prf = rope_dict.pop("partial_rotary_factor", None)  # placed below where the config had it
    container = layout["container"]
    original_params = present.get(container) if container else None
    if container is not None and layout["layer_type"] is not None:
        original_params = original_params[layout["layer_type"]]
    if rope_dict is None and original_params is not None:  # an explicit {"rope_type": "default"}
        rope_dict = {k: original_params[k] for k in ("rope_type", "type") if k in original_params}
    if rope_dict is not None:
        rope_dict.update(layout.get("passthrough") or {})  # mrope_section, as read
    if container == "rope_parameters" and original_params is not None:
        # v5 keeps rope_theta / partial_rotary_factor inside the dict when they were there
        if "rope_theta" in original_params:
            rope_dict["rope_theta"] = base
        if "partial_rotary_factor" in original_params:
            rope_dict["partial_rotary_factor"] = prf if prf is not None else 1.0
    if "rope_theta" in present:
        out["rope_theta"] = base
    elif container != "rope_parameters" or original_params is None or "rope_theta" not in original_params:
        if base != 10000.0:
            out["rope_theta"] = base
    if "partial_rotary_factor" in present:
        out["partial_rotary_factor"] = prf if prf is not None else 1.0
    elif prf is not None and not (original_params is not None and "partial_rotary_factor" in original_params):
        out["partial_rotary_factor"] = prf
    if container is None:
        if rope_dict is not None:
            out["rope_scaling"] = rope_dict
    elif layout["layer_type"] is not None:
        out[container] = {**present[container], layout["layer_type"]: rope_dict}
    else:
        out[container] = rope_dict
    return out


@dataclass(frozen=True)
class RopeInspection:
    """A model's RoPE at a glance (:func:`inspect_config`).

    Per frequency pair i (i = 0 .. rotary_dim/2 - 1): ``wavelength_original[i]`` = 2 pi /
    theta_i and ``wavelength_scaled[i]`` = 2 pi / theta'_i in tokens (theta' evaluated at
    the extended context, so dynamic and longrope show their long-context frequencies);
    ``full_rotation[i]``: the pair completes a full turn within the original context
    (wavelength_original <= original_context). ``critical_dim`` is YaRN's critical
    dimension d * ln(L0 / 2 pi) / (2 ln b) (Peng et al. 2023, eq. 17 with r = 1): the
    fractional pair index where the wavelength equals L0.
    """

    model_type: str | None
    rope_type: str
    head_dim: int
    rotary_dim: int
    rope_theta: float
    original_context: int
    extended_context: int
    attention_factor: float
    wavelength_original: Tensor
    wavelength_scaled: Tensor
    full_rotation: Tensor
    critical_dim: float

    @property
    def num_full_rotation_pairs(self) -> int:
        return int(self.full_rotation.sum())

    @property
    def scale(self) -> Tensor:
        """Per pair, how much the scaling stretched the wavelength (1 = untouched)."""
        return self.wavelength_scaled / self.wavelength_original


def inspect_config(
    config: Mapping[str, Any],
    *,
    layer_type: str | None = None,
    original_context: int | None = None,
    extended_context: int | None = None,
    rope: Any = None,
) -> RopeInspection:
    """Per frequency pair, the wavelengths of a config's RoPE against its contexts.

    The original context L0 is the rope dict's ``original_max_position_embeddings`` (as
    :func:`read_hf_config` fills it in), else ``max_position_embeddings``. The extended
    context is max(max_position_embeddings, L0 * factor). Either can be given instead (an
    int in [1, 2^31]).

    Args:
        rope: the RoPE to inspect (anything with ``head_dim``, ``rotary_dim``, ``base`` and
            ``scaling``: ``from_hf_config(config, layer_type=...)``, which reads a family's own
            keys, as ``posenc inspect`` does); default: :func:`read_hf_config` of ``config``,
            with ``layer_type``. Either way the config's numbers pass the same checks.

    Raises:
        KeyError: no context length can be found (give ``original_context``); and as
        :func:`read_hf_config`.
    """
    if rope is None:
        kwargs, _ = read_hf_config(config, layer_type=layer_type)
        head_dim, base, scaling = kwargs["head_dim"], kwargs["base"], kwargs["scaling"]
        prf = kwargs["partial_rotary_factor"]
        rotary_dim = rotary_dim_of(head_dim, prf) if prf is not None else head_dim
    else:
        head_dim, rotary_dim, base, scaling = rope.head_dim, rope.rotary_dim, rope.base, rope.scaling
    max_pos = config_int(config_mapping(config), "max_position_embeddings", default=None)
    if original_context is None:
        original_context = (scaling or {}).get("original_max_position_embeddings") or max_pos
        if original_context is None:
            raise MissingKey("config: needs 'max_position_embeddings' (or pass original_context=)")
    check_size(original_context, "original_context", key="max_position_embeddings")
    if extended_context is None:
        factor = (scaling or {}).get("factor") or 1.0
        extended_context = max(int(max_pos or 0), int(round(original_context * factor)), int(original_context))
    check_size(extended_context, "extended_context", key="max_position_embeddings")
    inv_original, _ = compute_rope_parameters(rotary_dim, base, None, None)
    inv_scaled, attention_factor = compute_rope_parameters(rotary_dim, base, scaling, extended_context)
    wavelength_original = 2 * math.pi / inv_original.double()
    return RopeInspection(
        model_type=config.get("model_type"),
        rope_type=rope_type_of(scaling),
        head_dim=head_dim,
        rotary_dim=rotary_dim,
        rope_theta=base,
        original_context=int(original_context),
        extended_context=int(extended_context),
        attention_factor=attention_factor,
        wavelength_original=wavelength_original,
        wavelength_scaled=2 * math.pi / inv_scaled.double(),
        full_rotation=wavelength_original <= original_context,
        critical_dim=yarn_correction_dim(1.0, rotary_dim, base, int(original_context)),
    )


# -- context extension ------------------------------------------------------------------------

#: Context-extension methods that need nothing but a factor and the training context: the
#: rope_types whose record has ``extension`` defaults (longrope needs searched per-pair factors,
#: so it is not among them). Taken from the table at import.
EXTENSION_METHODS = extension_methods()


def extension_scaling(method: str, factor: float, original_max_position_embeddings: int) -> dict[str, Any] | None:
    """The ``rope_scaling`` dict that extends a RoPE trained at context L0 by ``factor`` s.

    Each method with its published defaults (its record's ``extension`` in
    :data:`~posenc.encodings.rope.scaling.ROPE_TYPES`):

    - ``linear``: Position Interpolation (Chen et al. 2023), theta_i / s.
    - ``ntk``: static NTK-aware, base * s^(d/(d-2)).
    - ``dynamic``: dynamic NTK as Hugging Face computes it, with L0 and factor s: at length
      L > L0, base * (s L / L0 - (s - 1))^(d/(d-2)); at L = s L0 that is
      base * (s^2 - s + 1)^(d/(d-2)), a stronger stretch than ``ntk`` at the same s.
    - ``yarn``: Peng et al. 2023 with Hugging Face's defaults (beta_fast 32, beta_slow 1,
      attention_factor 0.1 ln s + 1).
    - ``dynamic_yarn``: YaRN at s(L) = max(1, L / L0) of the current length L (frequencies
      and attention factor), plain RoPE within L0; ``factor`` is kept as the declared
      extension and does not enter the frequencies. Not a transformers type.
    - ``llama3``: Llama 3.1's low_freq_factor 1 and high_freq_factor 4.

    Args:
        method: one of :data:`EXTENSION_METHODS`.
        factor: s >= 1, the extended context over L0.
        original_max_position_embeddings: L0, the training context (positive int).

    Returns:
        The dict for :class:`~posenc.RoPE` ``(scaling=...)``, or None when s = 1: every method
        then leaves RoPE exactly as trained.

    Raises:
        ValueError: an unknown method (the message lists them), s < 1 or L0 < 1.
    """
    record = ROPE_TYPES.get(method) if isinstance(method, str) else None
    if record is None or record.extension is None:
        raise InvalidArgument(f"method must be one of {list(extension_methods())}, got {method!r}")
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor >= 1 or math.isinf(factor):
        raise InvalidArgument(f"factor must be a finite number >= 1, got {factor!r}")
    context = original_max_position_embeddings
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise InvalidArgument(f"original_max_position_embeddings must be a positive integer, got {context!r}")
    if factor == 1:
        return None
    scaling: dict[str, Any] = {"rope_type": method, "factor": float(factor)}
    if record.needs_context:
        scaling["original_max_position_embeddings"] = context
    scaling.update(record.extension)
    return scaling


def rope_parameters_of(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the config's v5 ``rope_parameters`` dict, or, for a config without one (v4,
    or an empty dict), the default rope dict ``{"rope_type": "default", "rope_theta": ...}``
    with the config's ``rope_theta`` (10000 when absent, Hugging Face's default)."""
    params = config.get("rope_parameters")
    if isinstance(params, Mapping) and params:
        return dict(params)
    return {"rope_type": "default", "rope_theta": config.get("rope_theta", 10000.0)}
