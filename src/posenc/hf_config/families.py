"""The family table: ONE :class:`Family` record per Hugging Face ``model_type``
(:data:`FAMILIES`), everything posenc knows about the family, and :func:`position_plan`, which
reads a config into a :class:`~posenc.plan.PositionPlan` through it.

Each record states, as transformers 5.24 builds the model (its ``configuration_<family>.py``
and ``modeling_<family>.py``):

- how its config is spelled and read: ``layout``, how the rotary pairs lie, ``"half-split"``
  (i, i + r/2: Llama, GPT-NeoX) or ``"interleaved"`` (2i, 2i + 1: Cohere, Cohere2, GPT-J,
  Llama 4's complex rotation, DeepSeek-V3 with ``rope_interleave``; a config never says it, the
  family does); ``defaults``, the config class's defaults of the positional keys a config.json
  may leave out (``rope_theta`` is the class's ``default_theta``; Gemma's ``head_dim`` 256,
  Phi's ``partial_rotary_factor`` 0.5, Mistral's ``sliding_window`` 4096, ...; the keys a
  config.json always has, ``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``, have
  none: a config without them is refused, naming the key); ``aliases`` (GPT-J's ``n_embd``,
  ...); ``text_config``, a multimodal wrapper's text family; the readers ``layer_types``,
  ``span`` and ``encoding`` (most shared by several families), or ``reader``, a whole-plan
  reader (:mod:`posenc.hf_config.families_other`) where the positions are not rotary, or
  ``refused``, why posenc does not read a family it knows (the positional feature named:
  position_plan raises InvalidArgument with it);
- where its modules live, as plain attribute names (``layers``, ``attention``, ``rotary``,
  ``tables``, ``sinks``, ``softcap``, ...), read by :func:`posenc.integrations.families.family_of`;
- its adapter's name (:data:`posenc.integrations.adapters.ADAPTERS`) where its attention is
  outside transformers' ``AttentionInterface``.

Adding a family is one record, ``_family("name", ...)`` in :data:`FAMILIES` (only what differs
from Llama's), plus its test; new code only where it spells something no reader reads yet.
Plain data in, no transformers import.

Sliding windows follow ``masking_utils``: W lets query i see keys j with i - W < j <= i;
chunks of C: j // C == i // C, j <= i.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from posenc.encodings.base import PositionalEncoding
from posenc.encodings.irope import AttentionTemperature
from posenc.encodings.rope.multiaxis import MRoPE
from posenc.encodings.rope.query_scaled import QueryScaledRoPE
from posenc.encodings.rope.rotary import RoPE
from posenc.errors import InvalidArgument, InvalidType, MissingKey
from posenc.hf_config import llama4
from posenc.hf_config.families_other import (
    plan_biogpt,
    plan_bloom,
    plan_falcon,
    plan_gpt2,
    plan_gpt_bigcode,
    plan_mpt,
    plan_mt5,
    plan_opt,
    plan_switch_transformers,
    plan_t5,
    plan_umt5,
)
from posenc.hf_config.rope import head_dim_of, read_hf_config, rope_dict_spellings
from posenc.hf_config.values import check_real, config_int
from posenc.plan import LayerPlan, PositionPlan

__all__ = ["FAMILIES", "LAYOUTS", "TABLE_FORMATS", "Family", "position_plan", "reads_plainly"]

#: Values of :attr:`Family.layout`.
LAYOUTS = ("half-split", "interleaved")


#: The legacy layer-type names transformers renames when it reads a config
#: (``configuration_utils._LEGACY_LAYER_TYPE_REMAP``: Granite 4.0's and Nemotron-H's "mamba", "attention").
LEGACY_LAYER_TYPES = {"mamba": "linear_attention", "attention": "full_attention"}


class Reading:
    """One config being read: the config dict (aliases renamed, the family's defaults under the
    keys it lacks), the family, the notes gathered and the encodings built so far (layers of
    one kind share one encoding object)."""

    def __init__(self, config: Mapping[str, Any], family: Family) -> None:
        self.family = family
        self.notes: list[str] = []
        self.warnings: list[str] = []
        cfg = dict(config)
        for alias, key in family.aliases.items():
            if alias in cfg:
                if key in cfg and cfg[key] != cfg[alias]:
                    self.note(f"config has {alias}={cfg[alias]!r} and {key}={cfg[key]!r}; transformers reads {alias}",
                              warn=True)
                cfg[key] = cfg.pop(alias)
        for key, value in family.defaults.items():
            if key == "rope_theta" and value == 10000.0:
                continue  # read_hf_config's own default: the config keeps its spelling for to_hf_dict
            cfg.setdefault(key, value)
        self.given = frozenset(config)
        self.cfg = cfg
        self._encodings: dict[Any, PositionalEncoding | None] = {}

    def note(self, text: str, *, warn: bool = False) -> None:
        """Add a note to the plan; ``warn``: also ``warnings.warn`` it (two spellings disagree)."""
        if text not in self.notes:
            self.notes.append(text)
            if warn:
                self.warnings.append(text)

    def require(self, key: str) -> Any:
        """``cfg[key]``, which must be there and not null (else MissingKey naming it)."""
        value = self.cfg.get(key)
        if value is None:
            raise MissingKey(f"config ({self.family.model_type}): needs {key!r}")
        return value

    def positive_int(self, key: str) -> int:
        """``cfg[key]`` as a size (:func:`posenc.hf_config.values.config_int`: an int in [1,
        the key's bound]), else MissingKey, InvalidType or InvalidArgument naming it."""
        self.require(key)  # MissingKey naming the family
        return config_int(self.cfg, key)

    def number(self, key: str, **bounds: float) -> float:
        """``cfg[key]`` as a finite number (``gt``, ``ge``, ``le`` bounds), which must be there."""
        return check_real(self.require(key), f"config[{key!r}]", **bounds)

    def head_dim_from_sizes(self) -> int:
        """hidden_size // num_attention_heads, the head width of the families that ignore a
        ``head_dim`` key (Cohere2, GPT-J): checked sizes, a multiple."""
        hidden, heads = self.positive_int("hidden_size"), self.positive_int("num_attention_heads")
        if hidden % heads:
            raise InvalidArgument(f"config ({self.family.model_type}): hidden_size {hidden} is not divisible by "
                                  f"num_attention_heads {heads}")
        return hidden // heads

    def cached(self, key: Any, build: Callable[[], PositionalEncoding | None]) -> PositionalEncoding | None:
        if key not in self._encodings:
            self._encodings[key] = build()
        return self._encodings[key]

    def rope(self, layer_type: str | None = None, *, interleaved: bool | None = None,
             **overrides: Any) -> RoPE:
        """The family's RoPE for ``layer_type``: :func:`~posenc.hf_config.rope.read_hf_config`
        on the config (with ``overrides`` on top), ``layer_type`` passed on only where the rope
        dict holds one dict per layer type; the family's layout."""
        def build() -> RoPE:
            cfg = {**self.cfg, **overrides}
            kwargs, layout = read_hf_config(cfg, layer_type=layer_type if nested_rope(cfg) else None)
            flag = self.family.layout == "interleaved" if interleaved is None else interleaved
            return RoPE(**kwargs, interleaved=flag, hf_layout=layout,
                        max_position_embeddings=cfg.get("max_position_embeddings"))
        return self.cached(("rope", layer_type, interleaved, repr(sorted(overrides.items()))), build)

    def explicit_layer_types(self) -> list[str] | None:
        """The config's own ``layer_types`` (one per layer), or None when it has none."""
        types = self.cfg.get("layer_types")
        if types is None:
            return None
        n = self.positive_int("num_hidden_layers")
        if not isinstance(types, (list, tuple)) or len(types) != n or not all(isinstance(t, str) for t in types):
            raise InvalidArgument(f"config['layer_types'] must be {n} strings (num_hidden_layers), got {types!r}")
        return [LEGACY_LAYER_TYPES.get(t, t) for t in types]


def nested_rope(cfg: Mapping[str, Any]) -> bool:
    """Whether the config's rope dict (the one transformers builds) holds one dict per layer type."""
    resolved, _ = rope_dict_spellings(cfg)
    for key in ("rope_scaling", "rope_parameters"):
        value = resolved.get(key)
        if isinstance(value, Mapping) and value:
            return all(isinstance(v, Mapping) or v is None for v in value.values())
    return False


# -- the readers families share ----------------------------------------------------------------

def span_of_type(r: Reading, index: int, layer_type: str | None) -> tuple[str, int | None]:
    """The span transformers' masks give a layer of ``layer_type``: ``sliding_attention`` a
    window of ``sliding_window``, ``chunked_attention`` chunks of ``attention_chunk_size``,
    ``full_attention`` (and a layer type without attention: Qwen3-Next's linear attention) full."""
    if layer_type == "sliding_attention":
        return "sliding", r.positive_int("sliding_window")
    if layer_type == "chunked_attention":
        return "chunked", r.positive_int("attention_chunk_size")
    if layer_type in (None, "full_attention", "linear_attention"):
        return "full", None
    raise InvalidArgument(f"config['layer_types'][{index}] = {layer_type!r}: {r.family.model_type} layers are "
                          "'full_attention' or 'sliding_attention'")


def span_all_sliding(r: Reading, index: int, layer_type: str | None) -> tuple[str, int | None]:
    """Every layer slides over ``sliding_window`` when it is set (Mistral, Mixtral, Phi-3,
    Qwen3-MoE: the attention passes ``config.sliding_window`` on every layer), else full."""
    window = r.cfg.get("sliding_window")
    if window is None:
        return "full", None
    return "sliding", r.positive_int("sliding_window")


def rope_of_type(r: Reading, index: int, layer_type: str | None) -> PositionalEncoding | None:
    """The family's RoPE for the layer's type (one rope dict, or the layer type's own)."""
    return r.rope(layer_type)


def qwen2_layer_types(r: Reading) -> list[str]:
    """Qwen2 / Qwen3 / Qwen2-VL (``Qwen2Config.__post_init__``): sliding_window only with
    ``use_sliding_window``; then the layers from ``max_window_layers`` on slide."""
    explicit = r.explicit_layer_types()
    if explicit is not None:
        return explicit
    n = r.positive_int("num_hidden_layers")
    window = r.cfg.get("sliding_window") if r.cfg.get("use_sliding_window") else None
    first = config_int(r.cfg, "max_window_layers", minimum=0, where="config") if window is not None else 0
    return ["sliding_attention" if window is not None and i >= first else "full_attention" for i in range(n)]


def qwen2_span(r: Reading, index: int, layer_type: str | None) -> tuple[str, int | None]:
    if layer_type == "sliding_attention" and not r.cfg.get("use_sliding_window"):
        return "full", None  # transformers sets sliding_window None without use_sliding_window
    return span_of_type(r, index, layer_type)


def sliding_use_flag_span(r: Reading, index: int, layer_type: str | None) -> tuple[str, int | None]:
    """Qwen3-MoE: ``sliding_window`` on every layer, only with ``use_sliding_window``."""
    if not r.cfg.get("use_sliding_window"):
        return "full", None
    return span_all_sliding(r, index, layer_type)


def pattern_layer_types(pattern_key: str, default: int, last_full: bool = False) -> Callable[[Reading], list[str]]:
    """Layer i slides unless (i + 1) is a multiple of the pattern (Gemma 2: 2, Gemma 3: 6,
    Cohere2: 4, gpt-oss: 2), as ``__post_init__`` derives ``layer_types``."""
    def derive(r: Reading) -> list[str]:
        types = r.explicit_layer_types()
        if types is None:
            n = r.positive_int("num_hidden_layers")
            pattern = config_int(r.cfg, pattern_key, default=default) if pattern_key else default
            types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
        if last_full and types[-1] != "full_attention":
            r.note("transformers forces the last layer to full_attention (Gemma4TextConfig)")
            types[-1] = "full_attention"
        return types
    return derive


def no_rope_layers_of(r: Reading) -> list[int]:
    """SmolLM3 / Llama 4 ``no_rope_layers``: entry i is 1 for a RoPE layer, 0 for a NoPE layer
    (despite the name); absent or empty: NoPE every ``no_rope_layer_interval``-th layer."""
    n = r.positive_int("num_hidden_layers")
    schedule = r.cfg.get("no_rope_layers")
    if not schedule:
        interval = r.positive_int("no_rope_layer_interval")
        return [int((i + 1) % interval != 0) for i in range(n)]
    if not isinstance(schedule, (list, tuple)) or len(schedule) < n or any(v not in (0, 1) for v in schedule):
        raise InvalidArgument(f"config['no_rope_layers'] must hold {n} entries of 0 or 1 (1: RoPE layer), got {schedule!r}")
    return list(schedule)


def softcap_of(r: Reading) -> float | None:
    """The attention logit soft-cap the family's config sets (:attr:`Family.softcap_key`; null: none)."""
    key = r.family.softcap_key
    if key is None or r.cfg.get(key) is None:
        return None
    return r.number(key, gt=0)


# -- readers of one family ------------------------------------------------------------------------

def layer_type_rope(r: Reading, index: int, layer_type: str | None) -> PositionalEncoding | None:
    """The RoPE of a family whose config class builds one rope dict per layer type from the v4
    keys (Gemma 3's and OLMo 3's ``convert_rope_params_to_dict``): the config's own per-type
    ``rope_parameters`` first; a v4 ``rope_scaling`` goes into the global (full_attention) dict
    only; each type's theta is read from its key in :attr:`Family.type_thetas`, else its default."""
    model_type = r.family.model_type

    def dicts() -> dict[str, dict[str, Any]]:
        cfg = r.cfg
        params = cfg.get("rope_parameters")
        if params is not None and not (isinstance(params, Mapping) and nested_rope({"rope_parameters": params})):
            raise InvalidArgument(f"config['rope_parameters'] of {model_type} must hold one dict per layer type "
                                  f"({', '.join(r.family.type_thetas)}), as transformers reads it")
        out = {k: dict(v) for k, v in (params or {}).items() if v is not None}
        for kind in r.family.type_thetas:
            out.setdefault(kind, {"rope_type": "default"})
        if cfg.get("rope_scaling"):
            if not isinstance(cfg["rope_scaling"], Mapping):
                raise InvalidArgument(f"config['rope_scaling'] must be a dict or null, got {type(cfg['rope_scaling']).__name__}")
            out["full_attention"].update(cfg["rope_scaling"])
        for kind, (key, default) in r.family.type_thetas.items():
            out[kind].setdefault("rope_theta", default if key is None else cfg.get(key, default))
        return out
    cfg = {k: v for k, v in r.cfg.items() if k not in ("rope_scaling", "rope_theta")}
    cfg["rope_parameters"] = dicts()
    kwargs, layout = read_hf_config(cfg, layer_type=layer_type)
    key = ("per_type", layer_type)
    return r.cached(key, lambda: RoPE(**kwargs, hf_layout=layout, max_position_embeddings=cfg.get("max_position_embeddings")))


def gemma3_check(r: Reading) -> None:
    if r.cfg.get("use_bidirectional_attention"):
        raise InvalidArgument("config['use_bidirectional_attention'] is true: a bidirectional Gemma 3 (EmbeddingGemma) "
                              "has no causal plan; posenc reads decoders")


#: Keys a Gemma 4 ``per_layer_config`` entry may not override: transformers would build that
#: layer's positions from them (its rotary module reads the per-layer-type config), which posenc
#: does not read per layer.
GEMMA4_POSITIONAL_OVERRIDES = ("rope_parameters", "rope_scaling", "rope_theta", "partial_rotary_factor",
                               "sliding_window", "layer_types", "max_position_embeddings",
                               "use_bidirectional_attention", "attention_chunk_size")


def gemma4_layer_overrides(r: Reading) -> dict[int, Mapping[str, Any]]:
    """Gemma 4's per-layer overrides by layer index, as ``Gemma4TextConfig.__post_init__`` and
    transformers' heterogeneous config read them (``integrations/heterogeneity``: a key is
    ``int(key)``, so ``to_dict()``'s zero-padded ``"05"`` is layer 5). Without a
    ``per_layer_config`` key, every full-attention layer gets ``head_dim = global_head_dim``
    (default 512); a ``per_layer_config`` of null overrides nothing. A positional key in an
    override is refused by name."""
    if "per_layer_config" not in r.given:
        width = r.cfg.get("global_head_dim", 512)
        return {i: {"head_dim": width} for i, kind in enumerate(gemma4_layer_types(r)) if kind == "full_attention"}
    given = r.cfg.get("per_layer_config") or {}
    if not isinstance(given, Mapping):
        raise InvalidArgument(f"config['per_layer_config'] must be a dict of layer index -> overrides, "
                              f"got {type(given).__name__}")
    out: dict[int, Mapping[str, Any]] = {}
    for key, value in given.items():
        try:
            index = int(key)
        except (TypeError, ValueError):
            raise InvalidArgument(f"config['per_layer_config'] keys must be layer indices, got {key!r}") from None
        if not 0 <= index < r.positive_int("num_hidden_layers"):
            raise InvalidArgument(f"config['per_layer_config'] key {key!r}: layer {index} is not in "
                                  f"[0, {r.positive_int('num_hidden_layers')}) (num_hidden_layers), as transformers requires")
        if not isinstance(value, Mapping):
            raise InvalidArgument(f"config['per_layer_config'][{key!r}] must be a dict, got {type(value).__name__}")
        positional = sorted(set(value) & set(GEMMA4_POSITIONAL_OVERRIDES))
        if positional:
            raise InvalidArgument(f"config['per_layer_config'][{key!r}] overrides {positional}: posenc reads "
                                  "Gemma 4's positions from the global config only (per-layer head_dim is read)")
        out[index] = value
    return out


def gemma4_layer_types(r: Reading) -> list[str]:
    return pattern_layer_types("", 6, last_full=True)(r)


def gemma4_rope(r: Reading, index: int, layer_type: str | None) -> PositionalEncoding | None:
    """Gemma 4 (``Gemma4TextConfig``): one rope dict per layer type (default: sliding theta 1e4;
    global ``proportional`` with partial_rotary_factor 0.25, theta 1e6), each layer with its own
    head width (:func:`gemma4_layer_overrides`: ``per_layer_config``, else ``global_head_dim``
    on the full-attention layers). transformers builds one rotary table per layer type from the
    first such layer's config (``Gemma4TextRotaryEmbedding``), so the layers of one type must
    share a head width (transformers refuses otherwise; so does posenc, naming the layers)."""
    overrides: dict[str, Any] = {}
    by_layer = gemma4_layer_overrides(r)
    width = by_layer.get(index, {}).get("head_dim")
    if width is not None:
        overrides["head_dim"] = width
    kinds = gemma4_layer_types(r)
    first = kinds.index(layer_type) if layer_type in kinds else index
    if by_layer.get(first, {}).get("head_dim") != width:
        raise InvalidArgument(f"config['per_layer_config']: layer {index} ({layer_type}) has head_dim {width} and "
                              f"layer {first} of the same type {by_layer.get(first, {}).get('head_dim')}; "
                              "transformers builds one rotary table per layer type")
    if r.cfg.get("rope_parameters") is None:
        overrides["rope_parameters"] = {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
        }
    return r.rope(layer_type, **overrides)


def gemma4_check(r: Reading) -> None:
    if r.cfg.get("use_bidirectional_attention") == "all":
        raise InvalidArgument("config['use_bidirectional_attention'] is 'all': a bidirectional Gemma 4 has no causal plan")


def cohere2_rope(r: Reading, index: int, layer_type: str | None) -> PositionalEncoding | None:
    """Cohere2 (``Cohere2Attention.forward``): RoPE (interleaved) only on the layers with a
    sliding window; the full-attention layers are NoPE. head_dim is hidden_size //
    num_attention_heads whatever the config says (``Cohere2Config.__post_init__``)."""
    if layer_type != "sliding_attention" or r.cfg.get("sliding_window") is None:
        return None
    return r.rope(layer_type, head_dim=r.head_dim_from_sizes())


def cohere2_check(r: Reading) -> None:
    if r.cfg.get("head_dim") is not None and r.cfg["head_dim"] != r.head_dim_from_sizes():
        r.note(f"config head_dim={r.cfg['head_dim']} is ignored: transformers' Cohere2 uses hidden_size // "
               "num_attention_heads", warn=True)
    if r.cfg.get("sliding_window") is None:
        r.note("sliding_window is null: transformers' Cohere2 then rotates no layer (RoPE lives on the sliding layers)")


def smollm3_layer_types(r: Reading) -> list[str]:
    """SmolLM3 (``SmolLM3Config.__post_init__``): a layer slides only with use_sliding_window,
    a sliding_window, and no RoPE (``no_rope_layers[i] == 0``)."""
    explicit = r.explicit_layer_types()
    if explicit is not None:
        return explicit
    sliding = bool(r.cfg.get("use_sliding_window")) and r.cfg.get("sliding_window") is not None
    return ["sliding_attention" if sliding and not rope else "full_attention" for rope in no_rope_layers_of(r)]


def smollm3_span(r: Reading, index: int, layer_type: str | None) -> tuple[str, int | None]:
    if layer_type == "sliding_attention" and not r.cfg.get("use_sliding_window"):
        return "full", None
    return span_of_type(r, index, layer_type)


def no_rope_schedule_rope(r: Reading, index: int, layer_type: str | None) -> PositionalEncoding | None:
    """SmolLM3: RoPE where ``no_rope_layers[i]`` is 1, none where 0."""
    return r.rope(None) if no_rope_layers_of(r)[index] else None


def llama4_layer_types(r: Reading) -> list[str]:
    """Llama 4 (``Llama4TextConfig.__post_init__``): the RoPE layers chunked (when
    attention_chunk_size is set), the NoPE layers full."""
    explicit = r.explicit_layer_types()
    if explicit is not None:
        return explicit
    chunked = r.cfg.get("attention_chunk_size") is not None
    return ["chunked_attention" if rope and chunked else "full_attention" for rope in no_rope_layers_of(r)]


def llama4_rope(r: Reading, index: int, layer_type: str | None) -> PositionalEncoding | None:
    """Llama 4 (``Llama4TextAttention``): RoPE in the complex (interleaved) layout on the layers
    ``no_rope_layers`` marks 1; the others NoPE, their queries scaled by the attention
    temperature (``attn_temperature_tuning``; floor_scale, attn_scale)."""
    if no_rope_layers_of(r)[index]:
        return r.rope(None)
    switch, floor_scale, attn_scale = r.family.temperature
    if not r.cfg.get(switch):
        return None
    return r.cached("temperature", lambda: AttentionTemperature(
        floor_scale=r.positive_int(floor_scale), attn_scale=r.number(attn_scale, ge=0)))


def qwen_vl_rope(r: Reading, index: int, layer_type: str | None) -> PositionalEncoding | None:
    """Qwen2-VL / Qwen2.5-VL text tower (``Qwen2VLRotaryEmbedding``): M-RoPE, half-split pairs,
    ``mrope_section`` from the rope dict (default [16, 24, 24]); on text positions it is RoPE."""
    return multiaxis_rope(r, [16, 24, 24], mrope_interleaved=False)


def qwen3_vl_rope(r: Reading, index: int, layer_type: str | None) -> PositionalEncoding | None:
    """Qwen3-VL text tower (``Qwen3VLTextRotaryEmbedding.recomposition_frequencies``): interleaved
    M-RoPE, pair i on axis (T, H, W)[i % 3] while H and W last (3 * s_h, 3 * s_w), the rest T;
    always (the rope dict's ``mrope_interleaved`` is not read); ``mrope_section`` default [24, 20, 20]."""
    return multiaxis_rope(r, [24, 20, 20], mrope_interleaved=True)


def multiaxis_rope(r: Reading, default_section: list[int], *, mrope_interleaved: bool,
                   interleaved: bool = False) -> MRoPE:
    """The family's M-RoPE: ``mrope_section`` from the rope dict (else ``default_section``), base,
    scaling and rotated share from :func:`~posenc.hf_config.rope.read_hf_config`; ``interleaved``:
    the rotary pairs are (2i, 2i + 1) (GLM-4V), else half-split."""
    def build() -> MRoPE:
        kwargs, layout = read_hf_config(r.cfg)
        section = (layout.get("passthrough") or {}).get("mrope_section", default_section)
        if not isinstance(section, (list, tuple)):
            raise InvalidType(f"config: mrope_section must be a list of 3 ints, got {section!r:.60}")
        if kwargs["scaling"] is not None:
            r.note(f"rope scaling {kwargs['scaling']!r} on M-RoPE")
        rotary = (int(kwargs["head_dim"] * kwargs["partial_rotary_factor"])
                  if kwargs["partial_rotary_factor"] else None)
        try:
            enc = MRoPE(kwargs["head_dim"], mrope_section=list(section), base=kwargs["base"],
                        scaling=kwargs["scaling"], rotary_dim=rotary, mrope_interleaved=mrope_interleaved,
                        interleaved=interleaved)
        except InvalidArgument as error:
            raise InvalidArgument(f"config: mrope_section {list(section)}: {error}") from None
        enc.hf_layout = layout
        return enc
    return r.cached("mrope", build)


def deepseek_rope(r: Reading, index: int, layer_type: str | None) -> PositionalEncoding | None:
    """DeepSeek-V3 (``DeepseekV3Attention``): RoPE over the ``qk_rope_head_dim`` part of each
    MLA head only (the last qk_rope_head_dim of q's qk_nope_head_dim + qk_rope_head_dim, and
    the one shared k_rot); interleaved pairs with ``rope_interleave`` (default true)."""
    return r.rope(None, head_dim=r.positive_int("qk_rope_head_dim"), interleaved=bool(r.cfg.get(r.family.interleaved_key)))


def deepseek_check(r: Reading) -> None:
    width = r.positive_int("qk_rope_head_dim")
    r.note(f"MLA: the encoding rotates the qk_rope_head_dim={width} part of each head (q_rot, k_rot, the last "
           f"{width} dimensions of the query head), not the qk_nope_head_dim part")
    scaling = r.cfg.get("rope_scaling") or r.cfg.get("rope_parameters") or {}
    if isinstance(scaling, Mapping) and scaling.get("mscale_all_dim") and \
            scaling.get("rope_type", scaling.get("type", "default")) != "default":
        r.note("the softmax scale is qk_head_dim^-0.5 times yarn_get_mscale(factor, mscale_all_dim)^2 "
               "(DeepseekV3Attention.scaling; transformers' attention keeps it)")


def gpt_neox_rope(r: Reading, index: int, layer_type: str | None) -> PositionalEncoding | None:
    """GPT-NeoX (``GPTNeoXConfig.convert_rope_params_to_dict``): theta is the rope dict's, else
    ``rotary_emb_base`` (default 10000), the rotated share the rope dict's, else ``rotary_pct``
    (default 0.25); a top-level ``rope_theta`` / ``partial_rotary_factor`` is not read."""
    def build() -> RoPE:
        cfg = dict(r.cfg)
        resolved, _ = rope_dict_spellings(cfg)
        params = resolved.get("rope_scaling") or resolved.get("rope_parameters") or {}
        theta = params.get("rope_theta", cfg.get("rotary_emb_base", 10000.0))
        share = params.get("partial_rotary_factor", cfg.get("rotary_pct", 0.25))
        for key, used in (("rope_theta", theta), ("partial_rotary_factor", share)):
            if key in cfg and cfg[key] != used and key not in params:
                r.note(f"config {key}={cfg[key]!r} is not read by transformers' GPT-NeoX (it reads "
                       f"{'rotary_emb_base' if key == 'rope_theta' else 'rotary_pct'}): {used!r}", warn=True)
        cfg["rope_theta"], cfg["partial_rotary_factor"] = theta, share
        kwargs, layout = read_hf_config(cfg)
        return RoPE(**kwargs, hf_layout=layout, max_position_embeddings=cfg.get("max_position_embeddings"))
    return r.cached("neox", build)


def gptj_rope(r: Reading, index: int, layer_type: str | None) -> PositionalEncoding | None:
    """GPT-J (``GPTJRotaryEmbedding``, ``create_sinusoidal_positions``): base 10000 (no config key
    read), the first ``rotary_dim`` dimensions of each head rotated in interleaved pairs
    (``rotate_every_two``)."""
    def build() -> RoPE:
        rotary = r.cfg.get("rotary_dim")
        if rotary is None:
            raise MissingKey("config (gptj): needs 'rotary_dim' (transformers' GPT-J with rotary_dim null builds tables "
                             "of hidden_size columns, which do not fit a head)")
        for key in ("rope_theta", "rope_scaling", "rope_parameters"):
            if r.cfg.get(key) is not None and key in r.given:
                r.note(f"config {key}={r.cfg[key]!r} is not read by transformers' GPT-J (base 10000, no scaling)",
                       warn=True)
        head_dim = r.head_dim_from_sizes()
        rotary = config_int(r.cfg, "rotary_dim", where="config (gptj)")
        return RoPE(head_dim, rotary_dim=rotary, base=10000.0, interleaved=True,
                    max_position_embeddings=r.cfg.get("max_position_embeddings"))
    return r.cached("gptj", build)


def phi3_prepare(r: Reading) -> None:
    """Phi-3 (``Phi3Config.convert_rope_params_to_dict``): rope_type "su" and "yarn" mean longrope."""
    for key in ("rope_scaling", "rope_parameters"):
        value = r.cfg.get(key)
        if isinstance(value, Mapping) and value.get("rope_type", value.get("type")) in ("su", "yarn"):
            r.note(f"{key} rope_type {value.get('rope_type', value.get('type'))!r} is longrope to transformers' Phi-3")
            value = {k: v for k, v in value.items() if k != "type"}
            value["rope_type"] = "longrope"
            r.cfg[key] = value


def gpt_oss_prepare(r: Reading) -> None:
    """gpt-oss (``GptOssConfig.__post_init__``): without a rope dict, YaRN x32 over 4096."""
    if not (r.cfg.get("rope_parameters") or r.cfg.get("rope_scaling")):
        r.cfg["rope_parameters"] = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                    "truncate": False, "original_max_position_embeddings": 4096}


def qwen3_next_note(r: Reading) -> None:
    r.note("layers of layer_type 'linear_attention' (Gated DeltaNet) have no attention positions: no encoding")


def mistral_note(r: Reading) -> None:
    if "layer_types" in r.cfg:
        r.note("Mistral ignores layer_types (transformers warns; Ministral reads them): sliding_window on every layer")
        r.cfg.pop("layer_types")


# -- the 2025-26 families (issue 34) ----------------------------------------------------------

def rope_dict_of(r: Reading) -> tuple[str | None, Mapping[str, Any]]:
    """The config's one rope dict and its key (``rope_parameters`` or ``rope_scaling``), or
    (None, {}) where it has none."""
    for key in ("rope_parameters", "rope_scaling"):
        value = r.cfg.get(key)
        if isinstance(value, Mapping) and value:
            return key, value
    return None, {}


def apertus_prepare(r: Reading) -> None:
    """Apertus (``ApertusConfig.__post_init__``): without a rope dict, llama3 x8 over 8192, theta 1.2e7."""
    if rope_dict_of(r)[0] is None:
        r.cfg["rope_parameters"] = {"rope_type": "llama3", "rope_theta": r.cfg.get("rope_theta", 12_000_000.0),
                                    "factor": 8.0, "original_max_position_embeddings": 8192,
                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0}


def hunyuan_prepare(r: Reading) -> None:
    """HunYuan V1 (``HunYuanDenseV1RotaryEmbedding``): a ``dynamic`` rope dict with an ``alpha``
    (the released configs' spelling) is ``ntk_alpha``, static NTK-aware scaling by alpha: base
    theta * alpha^(D / (D - 2)) over the whole head D, whatever the length; posenc's ``ntk``
    with factor alpha is that formula (the plan says so, and ``extend_context`` sees a scaled RoPE)."""
    key, params = rope_dict_of(r)
    if key is None or params.get("rope_type", params.get("type")) != "dynamic" or not params.get("alpha"):
        return
    for where in (params, r.cfg):
        if where.get("partial_rotary_factor") not in (None, 1, 1.0):
            raise InvalidArgument(f"config (hunyuan): partial_rotary_factor {where['partial_rotary_factor']!r} with "
                                  "an ntk_alpha rope dict: transformers' HunYuan builds its table over the whole "
                                  "head_dim and rotates the whole head; posenc does not read that pairing")
    alpha = check_real(params["alpha"], f"config[{key!r}]['alpha']", gt=0)
    theta = params.get("rope_theta", r.cfg.get("rope_theta", 10000.0))
    r.note(f"{key} dynamic with alpha={alpha:g} is HunYuan's static NTK-alpha: ntk x{alpha:g} "
           "(base theta * alpha^(D/(D-2)), independent of the length)")
    for other in ("rope_parameters", "rope_scaling"):
        r.cfg.pop(other, None)
    r.cfg["rope_parameters"] = {"rope_type": "ntk", "factor": alpha, "rope_theta": theta}


def phimoe_check(r: Reading) -> None:
    """PhiMoE (``PhimoeRotaryEmbedding.forward``): a scaled rope dict's cos/sin are multiplied by
    ``short_mscale`` or ``long_mscale`` chosen by the sequence length, not by the scaling's own
    attention factor: refused, naming the keys."""
    key, params = rope_dict_of(r)
    kind = params.get("rope_type", params.get("type", "default"))
    if key is not None and kind != "default":
        raise InvalidArgument(f"config[{key!r}] rope_type {kind!r}: transformers' PhiMoE multiplies cos and sin by "
                              "rope_parameters['short_mscale'] or ['long_mscale'] (picked by the sequence length "
                              "against original_max_position_embeddings) in place of the scaling's attention factor; "
                              "no posenc encoding computes that, so posenc does not read it")


def exaone4_layer_types(r: Reading) -> list[str]:
    """EXAONE 4 (``Exaone4Config.__post_init__``): the config's layer_types, else layer i slides
    unless (i + 1) is a multiple of ``sliding_window_pattern`` (an int; default 4)."""
    explicit = r.explicit_layer_types()
    if explicit is not None:
        return explicit
    if r.cfg.get("sliding_window") is None:
        raise InvalidArgument(f"config ({r.family.model_type}): sliding_window is null and there are no layer_types; "
                              "transformers' config class then divides by sliding_window_pattern 0")
    pattern = config_int(r.cfg, "sliding_window_pattern", where=f"config ({r.family.model_type})")
    return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(r.positive_int("num_hidden_layers"))]


def exaone4_span(r: Reading, index: int, layer_type: str | None) -> tuple[str, int | None]:
    if r.cfg.get("sliding_window") is None:
        return "full", None
    return span_of_type(r, index, layer_type)


def exaone4_rope(r: Reading, index: int, layer_type: str | None) -> PositionalEncoding | None:
    """EXAONE 4 (``Exaone4Attention.forward``) and Kolibri 1 (``Kolibri1Attention.forward``, the
    same test): RoPE on the sliding layers, the full layers NoPE ("global NoPE"), unless there is
    no sliding_window: then RoPE everywhere."""
    if r.cfg.get("sliding_window") is not None and layer_type != "sliding_attention":
        return None
    return r.rope(None)


def dots1_layer_types(r: Reading) -> list[str]:
    """dots.llm1 (``Dots1Config.__post_init__``): the layers from ``max_window_layers`` on slide
    when there is a sliding_window (no ``use_sliding_window`` switch, unlike Qwen2)."""
    explicit = r.explicit_layer_types()
    if explicit is not None:
        return explicit
    window = r.cfg.get("sliding_window")
    first = config_int(r.cfg, "max_window_layers", minimum=0, where="config") if window is not None else 0
    return ["sliding_attention" if window is not None and i >= first else "full_attention"
            for i in range(r.positive_int("num_hidden_layers"))]


def minimax_m2_prepare(r: Reading) -> None:
    """MiniMax-M2 (``MiniMaxM2Config.convert_rope_params_to_dict``): the released checkpoints give
    the rotated width as an absolute ``rotary_dim``; it is partial_rotary_factor rotary_dim /
    head_dim unless the config gives the factor (at its top level or in its rope dict, which
    transformers reads first)."""
    if r.cfg.get("rotary_dim") is None:
        return
    rotary, head = config_int(r.cfg, "rotary_dim", where="config (minimax_m2)"), r.positive_int("head_dim")
    in_rope_dict = rope_dict_of(r)[1].get("partial_rotary_factor") is not None
    if r.cfg.get("partial_rotary_factor") is None and not in_rope_dict:
        r.cfg["partial_rotary_factor"] = rotary / head
        r.note(f"rotary_dim {rotary} of head_dim {head}: partial_rotary_factor {rotary / head:g}")


def ministral_layer_types(r: Reading) -> list[str]:
    """Ministral (``MinistralConfig.__post_init__``): the config's layer_types, else every layer
    slides when there is a sliding_window."""
    explicit = r.explicit_layer_types()
    if explicit is not None:
        return explicit
    kind = "sliding_attention" if r.cfg.get("sliding_window") is not None else "full_attention"
    return [kind] * r.positive_int("num_hidden_layers")


#: Ministral3Config's rope dict when the config has none (``__post_init__``).
MINISTRAL3_ROPE = {"rope_type": "yarn", "rope_theta": 1_000_000.0, "factor": 16.0,
                   "original_max_position_embeddings": 16384, "beta_fast": 32.0, "beta_slow": 1.0,
                   "mscale_all_dim": 1.0, "mscale": 1.0, "llama_4_scaling_beta": 0.1}


def ministral3_prepare(r: Reading) -> None:
    """Ministral 3 / Mistral 3 text (``Ministral3Attention.forward``): after RoPE, the queries are
    multiplied by 1 + beta * log(1 + floor(position / original_max_position_embeddings)), beta the
    rope dict's ``llama_4_scaling_beta`` (default 0.1), read as
    :class:`~posenc.encodings.rope.query_scaled.QueryScaledRoPE` (:func:`ministral3_rope`); with
    beta 0 the factor is 1 and the layers are plain RoPE."""
    key, params = rope_dict_of(r)
    if key is None:
        key, params = "rope_parameters", {**MINISTRAL3_ROPE, "max_position_embeddings": r.cfg.get("max_position_embeddings")}
    beta = params.get("llama_4_scaling_beta")
    if beta is None:
        raise MissingKey(f"config[{key!r}] (ministral3): needs 'llama_4_scaling_beta' (transformers' Ministral3Attention "
                         "multiplies the queries by a factor of it)")
    if check_real(beta, f"config[{key!r}]['llama_4_scaling_beta']") < 0:
        raise InvalidArgument(f"config[{key!r}]['llama_4_scaling_beta'] = {beta!r}: must be >= 0 (the queries' factor "
                              "1 + beta * log(1 + floor(position / original_max_position_embeddings)) would shrink "
                              "with the position)")
    if beta == 0:
        r.note(f"{key} llama_4_scaling_beta 0: Ministral 3's query scale is 1")
    else:
        if params.get("original_max_position_embeddings") is None:
            raise MissingKey(f"config[{key!r}] (ministral3): llama_4_scaling_beta = {beta!r} needs "
                             "'original_max_position_embeddings' (the positions per step of the queries' scale; "
                             "transformers divides by it)")
        length = config_int(params, "original_max_position_embeddings", where=f"config[{key!r}]")
        r.llama_4_scaling = {"llama_4_scaling_beta": float(beta), "original_max_position_embeddings": length}
        r.note(f"{key} llama_4_scaling_beta {beta}: queries scaled by 1 + {beta} log(1 + floor(p / {length})) "
               "on every layer")
    r.cfg[key] = {k: v for k, v in params.items() if k not in ("llama_4_scaling_beta", "max_position_embeddings")}


def ministral3_rope(r: Reading, index: int, layer_type: str | None) -> PositionalEncoding | None:
    """Ministral 3's layers: the family's RoPE, its queries scaled by Llama 4's factor when the
    rope dict's llama_4_scaling_beta is not 0 (:func:`ministral3_prepare`)."""
    rope = r.rope(layer_type)
    scaling = getattr(r, "llama_4_scaling", None)
    if scaling is None:
        return rope
    return r.cached(("query_scaled", layer_type), lambda: QueryScaledRoPE(**rope.config(), **scaling))


def deepseek_v2_rope(r: Reading, index: int, layer_type: str | None) -> PositionalEncoding | None:
    """DeepSeek-V2 (``DeepseekV2Attention``, ``apply_rotary_emb``): RoPE over the
    ``qk_rope_head_dim`` part of each MLA head, as complex pairs (2i, 2i + 1) (``view_as_complex``),
    always: the config has no rope_interleave switch (unlike DeepSeek-V3)."""
    return r.rope(None, head_dim=r.positive_int("qk_rope_head_dim"))


def interval_layer_types(r: Reading) -> list[str]:
    """Qwen3-Next / Qwen3.5 (``__post_init__``): the config's layer_types, else every
    ``full_attention_interval``-th layer full attention, the others linear attention (Gated DeltaNet)."""
    explicit = r.explicit_layer_types()
    if explicit is not None:
        return explicit
    interval = r.positive_int("full_attention_interval")
    return ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(r.positive_int("num_hidden_layers"))]


def qwen3_5_rope(r: Reading, index: int, layer_type: str | None) -> PositionalEncoding | None:
    """Qwen3.5 (``Qwen3_5TextRotaryEmbedding``): on the full-attention layers Qwen3-VL's
    interleaved M-RoPE (mrope_section default [11, 11, 10]) over the partial_rotary_factor share
    (default 0.25) of head_dim; the linear-attention layers have no positions (None)."""
    if layer_type == "linear_attention":
        return None
    return multiaxis_rope(r, [11, 11, 10], mrope_interleaved=True)


#: Layer types of the layers without positions (their plan layer is None): the hybrids' layers
#: without softmax attention (NemotronH's blocks of only an MLP or experts: "mlp", "moe"), and
#: mllama's cross-attention layers (queries from text, keys from images).
NO_ATTENTION_TYPES = ("linear_attention", "conv", "mamba", "cross_attention", "moe", "mlp")


def hybrid_span(r: Reading, index: int, layer_type: str | None) -> tuple[str, int | None]:
    """A hybrid's layer: full attention, or a layer without softmax attention (a convolution, a
    Mamba mixer, linear attention: ``full``, nothing to mask by position)."""
    if layer_type in NO_ATTENTION_TYPES or layer_type == "hybrid":  # (Falcon-H1's attention is full)
        return "full", None
    return span_of_type(r, index, layer_type)


def attention_layers_rope(r: Reading, index: int, layer_type: str | None) -> PositionalEncoding | None:
    """A hybrid's RoPE on its softmax-attention layers, None on the others."""
    return None if layer_type in NO_ATTENTION_TYPES else r.rope(None)


def lfm2_layer_types(r: Reading) -> list[str]:
    """LFM2 (``Lfm2Config.__post_init__``): the config's layer_types, else ``full_attention`` at
    ``full_attn_idxs`` (default: every layer) and ``conv`` (short convolutions) elsewhere."""
    explicit = r.explicit_layer_types()
    if explicit is not None:
        return explicit
    n = r.positive_int("num_hidden_layers")
    indices = r.cfg.get("full_attn_idxs")
    indices = range(n) if indices is None else indices
    if not isinstance(indices, (list, tuple, range)) or not all(isinstance(i, int) for i in indices):
        raise InvalidType(f"config['full_attn_idxs'] must be a list of layer indices, got {indices!r:.60}")
    return ["full_attention" if i in indices else "conv" for i in range(n)]


def lfm2_moe_layer_types(r: Reading) -> list[str]:
    """LFM2-MoE (``Lfm2MoeConfig``): the config's layer_types only; unlike LFM2 it has no
    ``full_attn_idxs`` fallback (its model indexes ``layer_types``), so a config without them
    names no attention layer and is refused rather than read as all-attention."""
    explicit = r.explicit_layer_types()
    if explicit is None:
        raise InvalidArgument("config['layer_types'] is missing: Lfm2MoeConfig has no default schedule of "
                              "attention and convolution layers (transformers cannot build the model without it)")
    return explicit


def bamba_layer_types(r: Reading) -> list[str]:
    """Bamba (``BambaConfig.layers_block_type``): ``full_attention`` at ``attn_layer_indices``,
    Mamba (``linear_attention``) elsewhere."""
    indices = r.cfg.get("attn_layer_indices") or ()
    if not isinstance(indices, (list, tuple)) or not all(isinstance(i, int) for i in indices):
        raise InvalidType(f"config['attn_layer_indices'] must be a list of layer indices, got {indices!r:.60}")
    return ["full_attention" if i in indices else "linear_attention" for i in range(r.positive_int("num_hidden_layers"))]


def bamba_prepare(r: Reading) -> None:
    """Bamba (``BambaConfig.__post_init__``): partial_rotary_factor is 0.5 whatever the config says."""
    for key in ("rope_parameters", "rope_scaling"):
        params = r.cfg.get(key)
        if isinstance(params, Mapping) and params.get("partial_rotary_factor") not in (None, 0.5):
            r.note(f"{key} partial_rotary_factor {params['partial_rotary_factor']!r} is replaced by 0.5 "
                   "(BambaConfig hardcodes it)", warn=True)
            r.cfg[key] = {k: v for k, v in params.items() if k != "partial_rotary_factor"}
    if r.cfg.get("partial_rotary_factor") not in (None, 0.5):
        r.note(f"partial_rotary_factor {r.cfg['partial_rotary_factor']!r} is replaced by 0.5 (BambaConfig hardcodes it)",
               warn=True)
    r.cfg["partial_rotary_factor"] = 0.5


def granitemoehybrid_rope(r: Reading, index: int, layer_type: str | None) -> PositionalEncoding | None:
    """Granite 4.0 hybrid (``GraniteMoeHybridModel``): RoPE on the attention layers only with
    ``position_embedding_type`` "rope"; otherwise (the default, null) the attention layers are NoPE."""
    if layer_type in NO_ATTENTION_TYPES or r.cfg.get("position_embedding_type") != "rope":
        return None
    return r.rope(None)


def granitemoehybrid_check(r: Reading) -> None:
    kind = r.cfg.get("position_embedding_type")
    if kind not in (None, "rope", "nope"):
        raise InvalidArgument(f"config['position_embedding_type'] = {kind!r}: transformers' GraniteMoeHybrid builds "
                              "RoPE for 'rope' and none otherwise; posenc reads 'rope', 'nope' or null")
    if kind != "rope":
        r.note("position_embedding_type is not 'rope': the attention layers have no positions (NoPE)")


#: The decoders a Mistral 3 wrapper's text_config may hold (transformers' Mistral3Config: Mistral
#: Small 3.x and Devstral Small hold "mistral", Ministral 3 / Mistral Large 3 / Devstral 2 "ministral3").
MISTRAL3_TEXT_TYPES = ("mistral", "ministral3")


def plan_mistral3(config: Mapping[str, Any]) -> PositionPlan:
    """Mistral 3 (``Mistral3Config``): the plan of its ``text_config``, read as the family its own
    ``model_type`` names (default "mistral"), since the two decoders differ (Ministral 3's
    llama_4_scaling_beta query scale)."""
    text = config.get("text_config")
    if text is not None and not isinstance(text, Mapping) and hasattr(text, "to_dict"):
        text = text.to_dict()
    if not isinstance(text, Mapping):
        raise MissingKey("config (mistral3): needs 'text_config', where the decoder's positions are")
    inner = text.get("model_type", "mistral")
    if inner not in MISTRAL3_TEXT_TYPES:
        raise InvalidArgument(f"config['text_config']['model_type'] = {inner!r}: a Mistral 3 decoder is one of "
                              f"{list(MISTRAL3_TEXT_TYPES)}")
    plan = position_plan({**dict(text), "model_type": inner})
    return replace(plan, model_type="mistral3")


def mllama_layer_types(r: Reading) -> list[str]:
    """Llama 3.2 Vision's text model (``MllamaTextModel``): the layers at ``cross_attention_layers``
    attend to the image instead of the text (``cross_attention``, no positions), the others are
    Llama's self-attention."""
    indices = r.cfg.get("cross_attention_layers")
    if indices is None:
        indices = [3, 8, 13, 18, 23, 28, 33, 38]  # MllamaTextConfig's default
    if not isinstance(indices, (list, tuple)) or not all(isinstance(i, int) for i in indices):
        raise InvalidType(f"config['cross_attention_layers'] must be a list of layer indices, got {indices!r:.60}")
    return ["cross_attention" if i in indices else "full_attention" for i in range(r.positive_int("num_hidden_layers"))]


# -- issue 34, list A: the readers its families need --------------------------------------------

def dbrx_check(r: Reading) -> None:
    """DBRX (``DbrxConfig``, ``DbrxRotaryEmbedding``): the rotary table is built from the
    top-level rope dict (theta 10000 by default); the released configs' ``attn_config.rope_theta``
    is not read by transformers 5.24's rotary module, so the plan follows the top level and says so."""
    attn = r.cfg.get("attn_config")
    theta = attn.get("rope_theta") if isinstance(attn, Mapping) else None
    _, params = rope_dict_of(r)
    used = params.get("rope_theta", r.cfg.get("rope_theta", 10000.0))
    if theta is not None and theta != used:
        r.note(f"config attn_config.rope_theta={theta!r} is not read by transformers' DBRX rotary embedding "
               f"(it reads the top-level rope dict): theta {used!r}", warn=True)


def sizes_head_rope(r: Reading, index: int, layer_type: str | None) -> PositionalEncoding | None:
    """RoPE over hidden_size // num_attention_heads, the head width of a family whose attention
    ignores a ``head_dim`` key (DBRX)."""
    return r.rope(None, head_dim=r.head_dim_from_sizes())


def first_of_four_layer_types(r: Reading) -> list[str]:
    """CWM and Granite SWA (``__post_init__``): the config's layer_types, else layer i full
    attention where i % 4 == 0 (the first of every four), the others sliding."""
    explicit = r.explicit_layer_types()
    if explicit is not None:
        return explicit
    return ["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(r.positive_int("num_hidden_layers"))]


#: CwmConfig's rope dict when the config has none (``__post_init__``): llama3 x16 over 8192, theta 1e6.
CWM_ROPE = {"rope_type": "llama3", "rope_theta": 1_000_000.0, "factor": 16.0, "high_freq_factor": 4.0,
            "low_freq_factor": 1.0, "original_max_position_embeddings": 8192}


def cwm_prepare(r: Reading) -> None:
    """CWM (``CwmConfig.__post_init__``): without a rope dict, llama3 x16 over 8192, theta 1e6."""
    if rope_dict_of(r)[0] is None:
        r.cfg["rope_parameters"] = dict(CWM_ROPE)


def layer_theta_rope(r: Reading, index: int, layer_type: str | None) -> PositionalEncoding | None:
    """Granite SWA (``GraniteSWAModel``): ``layer_rope_theta[i]`` is layer i's RoPE theta (0: NoPE),
    the rest of the rope dict shared; without the list every layer has the rope dict's theta."""
    thetas = r.cfg.get("layer_rope_theta")
    if thetas is None:
        return r.rope(None)
    n = r.positive_int("num_hidden_layers")
    if not isinstance(thetas, (list, tuple)) or len(thetas) < n:
        raise InvalidArgument(f"config['layer_rope_theta'] must hold {n} thetas (num_hidden_layers; 0: NoPE), got {thetas!r:.80}")
    theta = check_real(thetas[index], f"config['layer_rope_theta'][{index}]", ge=0)
    if theta == 0:
        return None
    key, params = rope_dict_of(r)
    if key is None:
        return r.rope(None, rope_theta=theta)
    return r.rope(None, **{key: {**params, "rope_theta": theta}})


def sliding_layers_rope(r: Reading, index: int, layer_type: str | None) -> PositionalEncoding | None:
    """AFMoE (``AfmoeAttention.forward``): RoPE on the sliding (local) layers only, the full layers NoPE."""
    return r.rope(None) if layer_type == "sliding_attention" else None


def cohere2_moe_layer_types(r: Reading) -> list[str]:
    """Cohere2-MoE (``Cohere2MoeConfig.__post_init__``): the config's layer_types, else the first
    ``first_k_dense_replace`` layers slide unless (i + 1) is a multiple of
    ``prefix_dense_sliding_window_pattern``, the rest unless (i + 1 - k) is a multiple of ``sliding_window_pattern``."""
    explicit = r.explicit_layer_types()
    if explicit is not None:
        return explicit
    n = r.positive_int("num_hidden_layers")
    dense = config_int(r.cfg, "first_k_dense_replace", minimum=0, default=0, where="config (cohere2_moe)")
    prefix = config_int(r.cfg, "prefix_dense_sliding_window_pattern", where="config (cohere2_moe)")
    pattern = config_int(r.cfg, "sliding_window_pattern", where="config (cohere2_moe)")
    head = ["sliding_attention" if (i + 1) % prefix else "full_attention" for i in range(dense)]
    return head + ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n - dense)]


def cohere2_moe_rope(r: Reading, index: int, layer_type: str | None) -> PositionalEncoding | None:
    """Cohere2-MoE (``Cohere2MoeAttention``): interleaved RoPE on the layers with a sliding window,
    and on the dense-MLP layers when ``prefix_dense_sliding_window_pattern`` is 1 (``force_rope``);
    the other layers NoPE."""
    sliding = layer_type == "sliding_attention" and r.cfg.get("sliding_window") is not None
    mlp_types = r.cfg.get("mlp_layer_types")
    if mlp_types is None:
        dense = config_int(r.cfg, "first_k_dense_replace", minimum=0, default=0, where="config (cohere2_moe)")
        is_dense = index < dense
    else:
        if not isinstance(mlp_types, (list, tuple)) or len(mlp_types) <= index:
            raise InvalidArgument(f"config['mlp_layer_types'] must hold one entry per layer, got {mlp_types!r:.80}")
        is_dense = mlp_types[index] == "dense"
    forced = is_dense and r.cfg.get("prefix_dense_sliding_window_pattern") == 1
    return r.rope(None) if sliding or forced else None


def indexed_layer_types(r: Reading) -> list[str]:
    """DeepSeek-V3.2 / GLM-5 (``__post_init__``): the config's layer_types, else every layer
    ``indexed_attention`` (DeepSeek Sparse Attention)."""
    return r.explicit_layer_types() or ["indexed_attention"] * r.positive_int("num_hidden_layers")


def indexed_span(r: Reading, index: int, layer_type: str | None) -> tuple[str, int | None]:
    """DeepSeek-V3.2 / GLM-5 DSA layers (``indexed_attention``): full causal attention over the keys
    the lightning indexer selects (its top-k by content score is the model's own mask, not a span)."""
    if layer_type == "indexed_attention":
        return "full", None
    return span_of_type(r, index, layer_type)


def dsa_check(r: Reading) -> None:
    """DeepSeek-V3.2 / GLM-5 (``DeepseekV32Indexer``, ``GlmMoeDsaIndexer``): MLA as DeepSeek-V3, and
    the lightning indexer rotates the first qk_rope_head_dim dimensions of its index_head_dim heads
    with the same tables (DeepSeek-V3.2 half-split, GLM-5 interleaved): the layer's RoPE reaches
    both, so the tables route gives the indexer the plan's RoPE too."""
    deepseek_check(r)
    layout = "interleaved" if r.family.model_type == "glm_moe_dsa" else "half-split"
    r.note(f"lightning indexer (DSA): the layer's RoPE on the first qk_rope_head_dim dimensions of its "
           f"index_head_dim heads, {layout} pairs; its top-k (index_topk) selects the keys by content")


def glm4v_rope(r: Reading, index: int, layer_type: str | None) -> PositionalEncoding | None:
    """GLM-4.1V / GLM-4.6V / GLM-OCR text towers (``Glm4vTextRotaryEmbedding``): M-RoPE with
    Qwen2-VL's chunked sections (``mrope_section``, default [8, 12, 12]) over the
    partial_rotary_factor share of head_dim (default 1), the pairs interleaved
    (``repeat_interleave`` tables, ``rotate_half_llm``); GLM-4.5V (MoE) lays them half-split."""
    return multiaxis_rope(r, [8, 12, 12], mrope_interleaved=False, interleaved=r.family.interleaved)


def flint_layer_types(r: Reading) -> list[str]:
    """Flint (``FlintConfig.__post_init__``): the config's layer_types, else full attention on the
    first two layers, every layer i with i % 4 == 1 and the last layer, sliding elsewhere."""
    explicit = r.explicit_layer_types()
    if explicit is not None:
        return explicit
    n = r.positive_int("num_hidden_layers")
    return ["full_attention" if i < 2 or i % 4 == 1 or i == n - 1 else "sliding_attention" for i in range(n)]


def dory_prepare(r: Reading) -> None:
    """Dory (``DoryConfig.__post_init__``): a config.json (and ``to_dict()``) lists each layer as
    an attention block and an "mlp" block, which transformers reads as one layer per pair
    (layer_types[::2], num_hidden_layers // 2); without a rope dict, one per layer type, theta
    1e4 on the sliding layers and 1e7 on the full ones."""
    types = r.cfg.get("layer_types")
    if isinstance(types, (list, tuple)) and "mlp" in types:
        attention = list(types[::2])
        if len(types) % 2 or any(t != "mlp" for t in types[1::2]) or "mlp" in attention:
            raise InvalidArgument(f"config['layer_types'] must alternate an attention type and 'mlp' (Dory's released "
                                  f"spelling) or list attention types only, got {types!r:.120}")
        r.cfg["layer_types"] = attention
        r.cfg["num_hidden_layers"] = r.positive_int("num_hidden_layers") // 2
        r.note("layer_types lists (attention, mlp) pairs: one layer per pair, as DoryConfig reads it")
    if rope_dict_of(r)[0] is None:
        thetas = {"sliding_attention": 10_000.0, "full_attention": 10_000_000.0}
        r.cfg["rope_parameters"] = {kind: {"rope_type": "default", "rope_theta": theta} for kind, theta in thetas.items()}


def group_layer_types(r: Reading) -> list[str]:
    """Bailing hybrid (``BailingHybridConfig.__post_init__``): the config's layer_types, else every
    ``layer_group_size``-th layer full attention (MLA), the others linear attention."""
    explicit = r.explicit_layer_types()
    if explicit is not None:
        return explicit
    size = r.positive_int("layer_group_size")
    return ["full_attention" if (i + 1) % size == 0 else "linear_attention" for i in range(r.positive_int("num_hidden_layers"))]


def mla_attention_layers_rope(r: Reading, index: int, layer_type: str | None) -> PositionalEncoding | None:
    """A hybrid's MLA RoPE (over qk_rope_head_dim, :func:`deepseek_v2_rope`) on its softmax-attention
    layers, None on its linear-attention layers (Bailing hybrid's delta attention takes no positions)."""
    return None if layer_type in NO_ATTENTION_TYPES else deepseek_v2_rope(r, index, layer_type)


# -- issue 34, list B: readers ------------------------------------------------------------------

def qwen2_moe_layer_types(r: Reading) -> list[str]:
    """Qwen2-MoE (``Qwen2MoeConfig.__post_init__``): the config's layer_types, else with
    ``use_sliding_window`` the layers i < ``max_window_layers`` with i even slide (``(i + 1) % 2``),
    the others full; without it every layer is full."""
    explicit = r.explicit_layer_types()
    if explicit is not None:
        return explicit
    sliding = bool(r.cfg.get("use_sliding_window"))
    first_full = config_int(r.cfg, "max_window_layers", minimum=0, where="config") if sliding else 0
    return ["sliding_attention" if sliding and (i + 1) % 2 and i < first_full else "full_attention"
            for i in range(r.positive_int("num_hidden_layers"))]


def nanochat_refusal(r: Reading) -> None:
    """NanoChat (``modeling_nanochat.rotate_half``): ``cat((x2, -x1))``, the rotation by -angle
    (clockwise), the transpose of every other RoPE's; the scores are not those of any posenc
    rotary encoding (q.R(-(j-i)w)k differs from q.R((j-i)w)k), so it is refused by name."""
    raise InvalidArgument("config (nanochat): transformers' NanoChat rotates each pair by minus the angle "
                          "(rotate_half returns (x2, -x1): a clockwise RoPE); no posenc encoding rotates that way, "
                          "so posenc does not read it")


#: NemotronHConfig's layers_block_type when the config gives none.
NEMOTRON_H_DEFAULT_TYPES = ("linear_attention", "moe", "full_attention", "mlp")
#: NemotronH's ``hybrid_override_pattern`` letters (``NemotronHConfig._pattern_to_list``).
NEMOTRON_H_PATTERN = {"M": "linear_attention", "E": "moe", "*": "full_attention", "-": "mlp"}


def block_types_prepare(r: Reading) -> None:
    """NemotronH, Zamba, Zamba2 (``layers_block_type``, which their configs also call
    ``layer_types``; NemotronH's older ``hybrid_override_pattern`` of M E * -): the model has
    one layer per listed type, whatever ``num_hidden_layers`` says (the layers are built from
    the list), so the list is the layer count; legacy names as transformers renames them."""
    types = r.cfg.get("layer_types") or r.cfg.get("layers_block_type")
    pattern = r.cfg.get("hybrid_override_pattern")
    if types is None and isinstance(pattern, str):
        unknown = sorted(set(pattern) - set(NEMOTRON_H_PATTERN))
        if unknown:
            raise InvalidArgument(f"config['hybrid_override_pattern'] has {unknown}: its letters are "
                                  f"{sorted(NEMOTRON_H_PATTERN)} (Mamba 2, experts, attention, MLP)")
        types = [NEMOTRON_H_PATTERN[letter] for letter in pattern]
    if types is None and r.family.model_type == "nemotron_h":
        types = NEMOTRON_H_DEFAULT_TYPES
    if not isinstance(types, (list, tuple)) or not types or not all(isinstance(t, str) for t in types):
        raise InvalidArgument(f"config['layers_block_type'] must be a list of layer types, got {types!r:.80}")
    given = r.cfg.get("num_hidden_layers")
    if given is not None and given != len(types):
        r.note(f"num_hidden_layers {given!r} is not read: the model has one layer per layers_block_type entry "
               f"({len(types)})", warn=True)
    r.cfg["num_hidden_layers"] = len(types)
    r.cfg["layer_types"] = [LEGACY_LAYER_TYPES.get(t, t) for t in types]


def no_positions(r: Reading, index: int, layer_type: str | None) -> PositionalEncoding | None:
    """A family whose attention layers apply no positions at all (NoPE): NemotronH, Jamba,
    Zamba, Kimi Linear's MLA; their other layers (Mamba, linear attention, MLP) have none either."""
    return None


def nope_hybrid_note(r: Reading) -> None:
    r.note(f"transformers' {r.family.model_type} applies no positions in its attention layers (NoPE); "
           "its Mamba / linear-attention layers carry the order")


def nemotron_h_prepare(r: Reading) -> None:
    block_types_prepare(r)
    nope_hybrid_note(r)


def period_layer_types(r: Reading) -> list[str]:
    """Jamba (``JambaConfig.layers_block_type``): attention where i % ``attn_layer_period`` ==
    ``attn_layer_offset``, Mamba (``linear_attention``) elsewhere."""
    period = r.positive_int("attn_layer_period")
    offset = config_int(r.cfg, "attn_layer_offset", minimum=0, where="config")
    return ["full_attention" if i % period == offset else "linear_attention"
            for i in range(r.positive_int("num_hidden_layers"))]


def kimi_linear_layer_types(r: Reading) -> list[str]:
    """Kimi Linear (``KimiLinearConfig.__post_init__``): the config's layer_types, else
    ``linear_attn_config``'s 1-based ``full_attn_layers`` / ``kda_layers``, else full attention
    at every 4th layer from 4 (i > 0, i % 4 == 0), KDA linear attention elsewhere."""
    explicit = r.explicit_layer_types()
    if explicit is not None:
        return explicit
    n = r.positive_int("num_hidden_layers")
    linear = r.cfg.get("linear_attn_config") or {}
    if isinstance(linear, Mapping) and "full_attn_layers" in linear and "kda_layers" in linear:
        types: list[str | None] = [None] * n
        for key, kind in (("full_attn_layers", "full_attention"), ("kda_layers", "linear_attention")):
            for layer in linear[key]:
                if not isinstance(layer, int) or not 1 <= layer <= n:
                    raise InvalidArgument(f"config['linear_attn_config']['{key}'] holds {layer!r}: layers are "
                                          f"numbered 1 .. {n} (num_hidden_layers)")
                types[layer - 1] = kind
        if None in types:
            raise InvalidArgument(f"config['linear_attn_config']: layer {types.index(None) + 1} is in neither "
                                  "full_attn_layers nor kda_layers")
        return [str(t) for t in types]
    return ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(n)]


def minimax_layer_types(r: Reading) -> list[str]:
    """MiniMax (``MiniMaxConfig.__post_init__``): the config's layer_types, else softmax
    attention at even layers, lightning (linear) attention at odd ones."""
    explicit = r.explicit_layer_types()
    if explicit is not None:
        return explicit
    return ["full_attention" if (i + 1) % 2 else "linear_attention" for i in range(r.positive_int("num_hidden_layers"))]


def minimax_span(r: Reading, index: int, layer_type: str | None) -> tuple[str, int | None]:
    """MiniMax's softmax layers slide over ``sliding_window`` when it is set (``MiniMaxAttention``
    passes it on every such layer); the lightning layers have no positional mask."""
    if layer_type == "linear_attention":
        return "full", None
    return span_all_sliding(r, index, layer_type)


def minimax_prepare(r: Reading) -> None:
    """MiniMax-Text-01 (``MiniMaxRotaryEmbedding``): transformers rotates the whole head_dim;
    the released config's absolute ``rotary_dim`` (64 of 128 in the original code) is not read,
    nor a ``partial_rotary_factor`` beside a default rope type (its own default init reads
    head_dim only). posenc follows transformers and says so."""
    head = r.cfg.get("head_dim") or r.head_dim_from_sizes()
    rotary = r.cfg.get("rotary_dim")
    if rotary is not None and rotary != head:
        r.note(f"rotary_dim {rotary!r} is not read by transformers' MiniMax: it rotates the whole head_dim {head}",
               warn=True)
    key, params = rope_dict_of(r)
    kind = params.get("rope_type", params.get("type", "default"))
    for where, mapping in (("", r.cfg), (f"{key}", params)):
        share = mapping.get("partial_rotary_factor")
        if kind == "default" and share not in (None, 1, 1.0):
            r.note(f"{where or 'config'} partial_rotary_factor {share!r} is not read by transformers' MiniMax "
                   "(its default RoPE covers the whole head)", warn=True)
            if mapping is r.cfg:
                r.cfg.pop("partial_rotary_factor")
            else:
                r.cfg[key] = {k: v for k, v in params.items() if k != "partial_rotary_factor"}
    r.note("layers of layer_type 'linear_attention' (lightning attention) have no positions: no encoding")


def zamba2_rope(r: Reading, index: int, layer_type: str | None) -> PositionalEncoding | None:
    """Zamba2 (``Zamba2Attention.forward``): RoPE on the shared attention blocks (the ``hybrid``
    layers) only with ``use_mem_rope``, over the attention head ``2 * hidden_size //
    num_attention_heads`` (``Zamba2Config.__post_init__`` sets attention_head_dim so, whatever
    the config says); otherwise NoPE. The Mamba layers have no positions."""
    if layer_type != "hybrid" or not r.cfg.get("use_mem_rope"):
        return None
    width = 2 * r.positive_int("hidden_size") // r.positive_int("num_attention_heads")
    return r.rope(None, head_dim=width)


def mla_half_split_rope(r: Reading, index: int, layer_type: str | None) -> PositionalEncoding | None:
    """MiniCPM3 (``MiniCPM3Attention``): MLA whose ``qk_rope_head_dim`` part of each head is
    rotated in half-split pairs (``apply_rotary_pos_emb``; no interleave switch)."""
    return r.rope(None, head_dim=r.positive_int("qk_rope_head_dim"), interleaved=False)


#: Mistral4Config's rope dict when the config has none (``__post_init__``; partial_rotary_factor
#: qk_rope_head_dim / head_dim is read as the MLA's rotated part, as DeepSeek-V3's).
MISTRAL4_ROPE = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 128.0, "original_max_position_embeddings": 8192,
                 "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0, "llama_4_scaling_beta": 0.1}


def mistral4_prepare(r: Reading) -> None:
    """Mistral 4 (``Mistral4Attention.forward``): DeepSeek-V3's MLA (RoPE on qk_rope_head_dim,
    interleaved with rope_interleave), whose queries are then multiplied by Llama 4's scale
    1 + beta * log(1 + floor(position / original_max_position_embeddings)) with the rope dict's
    ``llama_4_scaling_beta`` (default 0.1): refused by name unless beta is 0 (the whole query is
    scaled, its unrotated part too, where posenc's MLA plan covers the rotated part only)."""
    key, params = rope_dict_of(r)
    if key is None:
        key, params = "rope_parameters", MISTRAL4_ROPE
    beta = params.get("llama_4_scaling_beta")
    if beta is None:  # transformers' Mistral4Attention multiplies None into the queries (TypeError)
        raise MissingKey(f"config[{key!r}] (mistral4): needs 'llama_4_scaling_beta' (transformers' Mistral4Attention "
                         "multiplies the queries by a factor of it)")
    if check_real(beta, f"config[{key!r}]['llama_4_scaling_beta']") != 0:
        raise InvalidArgument(f"config[{key!r}]['llama_4_scaling_beta'] = {beta!r}: transformers' Mistral 4 multiplies "
                              "the whole MLA query (its unrotated qk_nope_head_dim part too) of every layer by 1 + beta * "
                              "log(1 + floor(position / original_max_position_embeddings)); posenc's MLA plan is a RoPE on "
                              "the qk_rope_head_dim part of each head, which cannot scale the rest, so posenc does not read "
                              "it (0 would be plain RoPE; Ministral 3's dense heads are read: QueryScaledRoPE)")
    # the rotated part is qk_rope_head_dim (deepseek_rope): the share of the whole head is not read again
    r.cfg[key] = {k: v for k, v in params.items()
                  if k not in ("llama_4_scaling_beta", "max_position_embeddings", "partial_rotary_factor")}
    deepseek_check(r)


def glm4_moe_prepare(r: Reading) -> None:
    """GLM-4.5 (``Glm4MoeAttention``: ``getattr(config, "head_dim", hidden_size //
    num_attention_heads)``): the config's head_dim, else hidden_size // num_attention_heads
    floored, as transformers takes it (GLM-4.5's class has no head_dim default; a released
    config gives 128). A rotated width head_dim x partial_rotary_factor that is odd is refused:
    transformers' table then covers one dimension more than its inv_freq pairs."""
    if r.cfg.get("head_dim") is not None:
        return
    hidden, heads = r.positive_int("hidden_size"), r.positive_int("num_attention_heads")
    head = hidden // heads
    r.cfg["head_dim"] = head
    if hidden % heads:
        r.note(f"no head_dim: hidden_size {hidden} // num_attention_heads {heads} = {head}, floored as "
               "transformers' Glm4MoeAttention takes it")
    _, params = rope_dict_of(r)
    share = params.get("partial_rotary_factor", r.cfg.get("partial_rotary_factor", 1.0))
    rotated = int(head * check_real(share, "config['partial_rotary_factor']", gt=0, le=1))
    if rotated % 2:
        raise InvalidArgument(f"config (glm4_moe): head_dim {head} x partial_rotary_factor {share} = {rotated} rotated "
                              "dimensions, an odd number: transformers' Glm4Moe builds (rotated + 1) / 2 frequencies and "
                              "rotates one dimension more than posenc's pairs can; give head_dim")


def glm4_moe_lite_prepare(r: Reading) -> None:
    """GLM-4.7-Flash (``Glm4MoeLiteConfig.attribute_map``): ``head_dim`` is ``qk_rope_head_dim``
    (the rotated part of the MLA head), whatever hidden_size / num_attention_heads give."""
    r.cfg["head_dim"] = r.positive_int("qk_rope_head_dim")
    deepseek_check(r)


def typed_rope(r: Reading, index: int, layer_type: str | None) -> PositionalEncoding | None:
    """A hybrid's RoPE on its softmax-attention layers, each of its type's rope dict where the
    config holds one per layer type; None on the layers without softmax attention."""
    return None if layer_type in NO_ATTENTION_TYPES else r.rope(layer_type)


def default_rope_dict(params: Mapping[str, Any]) -> Callable[[Reading], None]:
    """A ``prepare`` giving a config without a rope dict its config class's own (``__post_init__``
    sets it when ``rope_parameters`` is None: Laguna, MiMo-V2-Flash, LFM3 one dict per layer type)."""
    def prepare(r: Reading) -> None:
        if rope_dict_of(r)[0] is None:
            r.cfg["rope_parameters"] = {k: dict(v) if isinstance(v, Mapping) else v for k, v in params.items()}
    return prepare


def rule_layer_types(rule: Callable[[int, int], str]) -> Callable[[Reading], list[str]]:
    """The config's layer_types, else ``rule(i, num_hidden_layers)`` per layer, as the config
    class's ``__post_init__`` derives them."""
    def derive(r: Reading) -> list[str]:
        explicit = r.explicit_layer_types()
        if explicit is not None:
            return explicit
        n = r.positive_int("num_hidden_layers")
        return [rule(i, n) for i in range(n)]
    return derive


def olmo_hybrid_layer_types(r: Reading) -> list[str]:
    """OLMo Hybrid (``OlmoHybridConfig.__post_init__``): the config's layer_types, else linear
    attention (Gated DeltaNet) with full attention at every 4th layer (i % 4 == 3), the last
    layer full where that leaves none."""
    explicit = r.explicit_layer_types()
    if explicit is not None:
        return explicit
    n = r.positive_int("num_hidden_layers")
    types = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(n)]
    if "full_attention" not in types:
        types[-1] = "full_attention"
    return types


#: Class defaults of the per-layer-type rope dicts (their configuration files' ``__post_init__``).
LAGUNA_ROPE = {"full_attention": {"rope_type": "default", "rope_theta": 500000.0, "partial_rotary_factor": 0.5},
               "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}}
MIMO_V2_ROPE = {"full_attention": {"rope_type": "default", "rope_theta": 5_000_000.0, "partial_rotary_factor": 0.334},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.334}}
MELLUM_ROPE = {"full_attention": {"rope_type": "default", "rope_theta": 500000.0},
               "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
LFM3_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
             "full_attention": {"rope_type": "proportional", "rope_theta": 1_000_000.0, "partial_rotary_factor": 0.5}}
#: LARA Mini's released layer pattern, period 5 (``LaraMiniConfig.__post_init__``).
LARA_MINI_PATTERN = ("linear_attention", "sliding_attention", "linear_attention", "full_attention", "sliding_attention")


def mimo_v2_prepare(r: Reading) -> None:
    """MiMo-V2-Flash (``MiMoV2FlashConfig.__post_init__``): its per-type rope dicts by default;
    a released ``sliding_window_size`` is the window minus one (the reference attends to that
    many previous tokens plus the query)."""
    default_rope_dict(MIMO_V2_ROPE)(r)
    size = r.cfg.get("sliding_window_size")
    if size is not None:
        r.cfg["sliding_window"] = config_int(r.cfg, "sliding_window_size", where="config (mimo_v2_flash)") + 1
        r.note(f"sliding_window_size {size} is a window of {size + 1} (MiMoV2FlashConfig adds the query)")


def refuse_indexed_layers(kind: str, what: str) -> Callable[[Reading], None]:
    """A ``prepare`` refusing a config with layers of type ``kind``: a learned indexer picks the
    keys each query attends to (sparse attention), ``what`` names it; posenc reads positions, not
    a key selection made from them."""
    def prepare(r: Reading) -> None:
        types = r.explicit_layer_types() or []
        if kind in types:
            raise InvalidArgument(f"config['layer_types'] has {kind!r} layers (layer {types.index(kind)}): {what} picks the "
                                  "keys each query attends to from its own RoPE'd scores (sparse attention); posenc "
                                  "does not model that key selection, so it does not read this config")
    return prepare


def qwen4_exp_refusal(r: Reading) -> None:
    """Qwen4-Exp (``Qwen4ExpTextConfig.__post_init__``): every layer that is not Gated DeltaNet is
    ``indexed_attention`` (a checkpoint's ``full_attention`` entries are renamed so), whose
    indexer picks the keys: refused by name, whatever the layer schedule."""
    raise InvalidArgument("config (qwen4_exp_text): its softmax layers are 'indexed_attention' (Qwen4ExpTextConfig renames "
                          "full_attention so): Qwen4-Exp's indexer (Qwen4ExpTextIndexer) picks the keys each query "
                          "attends to from its own RoPE'd scores (sparse attention); posenc does not model that key "
                          "selection, so it does not read this config")


def minimax_m3_prepare(r: Reading) -> None:
    """MiniMax-M3's text model (``MiniMaxM3VLTextRotaryEmbedding``): the rope dict's
    partial_rotary_factor sets the rotated share; the config's absolute ``rotary_dim`` is not
    read (noted); its ``minimax_m3_sparse`` layers (a Lightning Indexer) are refused by name."""
    refuse_indexed_layers("minimax_m3_sparse", "MiniMax-M3's Lightning Indexer (index_topk_blocks)")(r)
    rotary, head = r.cfg.get("rotary_dim"), r.cfg.get("head_dim") or r.head_dim_from_sizes()
    _, params = rope_dict_of(r)
    share = params.get("partial_rotary_factor", r.cfg.get("partial_rotary_factor", 1.0))
    if rotary is not None and rotary != int(head * share):
        r.note(f"rotary_dim {rotary!r} is not read by transformers' MiniMax-M3: it rotates head_dim {head} x "
               f"partial_rotary_factor {share!r}", warn=True)


def modernbert_decoder_prepare(r: Reading) -> None:
    """ModernBERT-decoder (``ModernBertDecoderConfig``): the window is the config's
    sliding_window, else ``local_attention // 2`` (default 128 // 2); one rope dict per layer type, from the
    config's own, else theta ``global_rope_theta`` (160000) on the full layers and
    ``local_rope_theta`` (10000) on the sliding ones, a v4 ``rope_scaling`` on both; head_dim is
    hidden_size // num_attention_heads (``ModernBertDecoderAttention``)."""
    local = r.cfg.get("local_attention", 128)
    types = modernbert_decoder_layer_types(r)
    if r.cfg.get("sliding_window") is not None:
        pass  # a sliding_window given is kept (it overrides __post_init__'s, as transformers' config does)
    elif local:
        r.cfg["sliding_window"] = config_int({"local_attention": local}, "local_attention", where="config") // 2
    elif "sliding_attention" in types:
        raise InvalidArgument("config['local_attention'] is 0 or null with sliding layers: transformers' "
                              "ModernBertDecoderConfig then sets sliding_window -1, which no mask reads")
    r.cfg["head_dim"] = r.head_dim_from_sizes()
    params = r.cfg.get("rope_parameters")
    if not (isinstance(params, Mapping) and nested_rope({"rope_parameters": params})):
        params = {"full_attention": {"rope_type": "default"}, "sliding_attention": {"rope_type": "default"}}
    params = {k: dict(v) for k, v in params.items() if isinstance(v, Mapping)}
    scaling = r.cfg.pop("rope_scaling", None)
    for kind, key, theta in (("full_attention", "global_rope_theta", 160_000.0),
                             ("sliding_attention", "local_rope_theta", 10_000.0)):
        params.setdefault(kind, {"rope_type": "default"})
        if isinstance(scaling, Mapping):
            params[kind].update(scaling)
        params[kind].setdefault("rope_theta", r.cfg.get(key, theta))
    r.cfg["rope_parameters"] = params
    r.cfg.pop("rope_theta", None)


def modernbert_decoder_layer_types(r: Reading) -> list[str]:
    """ModernBERT-decoder (``__post_init__``): the config's layer_types, else full attention at
    every ``global_attn_every_n_layers``-th layer from 0 (default 3), sliding elsewhere."""
    explicit = r.explicit_layer_types()
    if explicit is not None:
        return explicit
    every = config_int(r.cfg, "global_attn_every_n_layers", default=3, where="config")
    return ["sliding_attention" if i % every else "full_attention" for i in range(r.positive_int("num_hidden_layers"))]


#: ZayaConfig's rope dicts when the config has none (``__post_init__``).
ZAYA_ROPE = {"hybrid": {"rope_type": "default", "rope_theta": 5_000_000.0, "partial_rotary_factor": 0.5},
             "hybrid_sliding": {"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.5}}


def zaya_span(r: Reading, index: int, layer_type: str | None) -> tuple[str, int | None]:
    """ZAYA (``ZayaAttention``): ``hybrid_sliding`` layers slide over sliding_window, ``hybrid`` ones are full."""
    if layer_type == "hybrid_sliding":
        return "sliding", r.positive_int("sliding_window")
    if layer_type == "hybrid":
        return "full", None
    raise InvalidArgument(f"config['layer_types'][{index}] = {layer_type!r}: ZAYA layers are 'hybrid' or 'hybrid_sliding'")


def zaya_prepare(r: Reading) -> None:
    default_rope_dict(ZAYA_ROPE)(r)
    r.note("ZAYA's attention (CCA) passes q and k through a causal convolution over the last tokens before "
           "RoPE: that stays the model's; the plan is its RoPE")


def nope_where_theta_zero_rope(r: Reading, index: int, layer_type: str | None) -> PositionalEncoding | None:
    """Muse Glimmer's text model (``MuseGlimmerTextModel.forward``, as Muse Spark's): a layer whose
    ``layer_rope_theta`` entry is 0 gets no position embeddings (NoPE); any other entry gets the
    model's one RoPE (theta from the rope dict: the entry's value is only tested for zero)."""
    thetas = r.cfg.get("layer_rope_theta")
    n = r.positive_int("num_hidden_layers")
    if thetas is None:  # __post_init__: NoPE on every 4th layer counted back from the last
        thetas = [0 if (n - 1 - i) % 4 == 0 else 1 for i in range(n)]
    if not isinstance(thetas, (list, tuple)) or len(thetas) < n:
        raise InvalidArgument(f"config['layer_rope_theta'] must hold {n} numbers (num_hidden_layers; 0: a NoPE layer), "
                              f"got {thetas!r:.80}")
    return r.rope(None) if thetas[index] else None


def molmo2_rope(r: Reading, index: int, layer_type: str | None) -> PositionalEncoding | None:
    """Molmo2's text model (``Molmo2TextModel``: ``rotary_emb`` and ``rotary_emb_unscaled``): the rope
    dict's RoPE (with its scaling) on the layers of ``rope_scaling_layers`` (default: every layer),
    the same theta unscaled (``Molmo2RotaryEmbedding(scaled=False)``: rope_type default) elsewhere."""
    n = r.positive_int("num_hidden_layers")
    scaled_layers = r.cfg.get("rope_scaling_layers")
    if scaled_layers is None:
        scaled_layers = range(n)
    elif not isinstance(scaled_layers, (list, tuple)) or not all(isinstance(i, int) for i in scaled_layers):
        raise InvalidArgument(f"config['rope_scaling_layers'] must be a list of layer indices, got {scaled_layers!r:.80}")
    rope = r.rope(None)
    if index in scaled_layers or rope.scaling is None:
        return rope
    return r.rope(None, rope_parameters={"rope_type": "default", "rope_theta": rope.base}, rope_scaling=None)


def mistral_large4_refusal(r: Reading) -> None:
    """Mistral Large 4's text model (``MistralLarge4TextAttention``): every layer attends to the
    ``index_topk`` keys a learned indexer picks (built on its ``full`` layers, shared by the
    others: DeepSeek-V3.2's sparse attention), refused by name."""
    raise InvalidArgument(f"config (mistral_large4_text): index_topk {r.cfg.get('index_topk', 2048)!r}: transformers' "
                          "Mistral Large 4 attends to the top-k keys a learned indexer picks from its own RoPE'd scores "
                          "(sparse attention); posenc does not model that key selection, so it does not read this config")


#: The names of the rotary table formats a family's decoder layers take
#: (:attr:`Family.tables`; the formats themselves, code, are in
#: :mod:`posenc.integrations.families`).
TABLE_FORMATS = ("cos_sin", "half_cos_sin", "pair_sin_cos", "deinterleaved_cos_sin", "complex_pairs")


@dataclass(frozen=True)
class Family:
    """Everything posenc knows about one model family, by ``model_type`` (one record of
    :data:`FAMILIES`): how its config is spelled and read, where its modules live in the model
    transformers builds, and its adapter where its attention is outside transformers'
    ``AttentionInterface``. Plain data (strings, dicts, reader functions): the integrations
    read the module names with ``getattr``.

    How the config is read (:func:`position_plan`):
        model_type: the config's ``model_type``.
        layout: ``"half-split"`` or ``"interleaved"`` rotary pairs (:data:`LAYOUTS`); the one
            statement of the pair layout (the integrations derive ``interleaved`` from it).
        defaults: the config class's defaults of the positional keys a config may lack.
        aliases: other spellings, renamed to the key the readers use (GPT-J's n_embd -> hidden_size).
        text_config: a wrapper's text family: the plan is read from ``config["text_config"]``
            as that family (a ``model_type`` of this table).
        flat_text: the wrapper's text keys may sit at the top level when there is no
            ``text_config`` (Qwen2-VL's older config.json); otherwise a missing text_config is refused.
        layer_types: derives the per-layer types (the config's own ``layer_types`` first);
            None: the family has none.
        span: (reading, index, layer_type) -> (span, window).
        encoding: (reading, index, layer_type) -> the layer's encoding or None (NoPE).
        type_thetas: per layer type, the config key its RoPE theta is read from (None: none,
            always the default) and the default, for a family whose config class builds one
            rope dict per layer type from the v4 keys (Gemma 3, OLMo 3: :func:`layer_type_rope`,
            a v4 ``rope_scaling`` scaling the full_attention layers only); empty: none.
        softcap_key: the config key of the attention logit soft-cap (Gemma 2's
            ``attn_logit_softcapping``), read into :attr:`LayerPlan.softcap`; None: the family has none.
        prepare: checks and rewrites before reading (refusals, notes, spellings).
        reader: ``config dict -> PositionPlan`` for a family whose positions are not (only)
            rotary (:mod:`posenc.hf_config.families_other`: Falcon, BLOOM, MPT, GPT-2, GPTBigCode,
            OPT, BioGPT, T5, mT5, Switch Transformers, UMT5); it replaces everything above. None:
            the rotary reading above.
        refused: why posenc does not read the family, naming the positional feature transformers
            builds that posenc's plan or its integrations do not model (RoBERTa's position ids
            derived from the padding in the input ids, a recurrent state without attention
            positions, ...): :func:`position_plan` raises InvalidArgument with it for every
            config of the family, before reading anything. None: the family is read.
        source: the transformers files read.

    Where its modules live (plain attribute names; :func:`posenc.integrations.families.family_of`):
        base: the causal LM's attribute holding the decoder stack where ``model.base_model`` is
            not it (Llama 4's text model ``"model"``; a dotted path, Qwen2-VL's
            ``"model.language_model"``, OPT's ``"model.decoder"``), or None.
        layers: the base model's attribute holding the decoder layers.
        stacks: the base model's attributes holding each self-attention stack, encoder first,
            where there are several (T5: ``("encoder", "decoder")``, each with its ``layers``);
            empty: one stack.
        attention: a decoder layer's attribute (a dotted path) holding its self-attention module.
        rotary: the base model's rotary embedding module, or None (no rotary module).
        tables: the name (:data:`TABLE_FORMATS`) of the format of its ``position_embeddings``.
        sinks: the attention module's attribute holding learned attention sinks (gpt-oss), or
            None; the plan's layers have sinks when it is set.
        softcap: the attention module's attribute holding the logit soft-cap, or None.
        scaled_layer_types: the layer types ``extend_context`` scales by default in a config
            with per-layer-type RoPE (Gemma 3: the global layers); empty: the caller names them.
        temperature: the names (switch, floor_scale, attn_scale) of Llama 4's attention
            temperature, the same on the config and on the attention module; None: no such scaling.
        query_scale: the rope dict key of the beta of Llama 4's query scale 1 + beta log(1 +
            floor(p / original_max_position_embeddings)) that the attention module applies itself
            on every layer, reading it from its config at each call (Ministral 3:
            ``"llama_4_scaling_beta"``); None: no such scaling.
        interleaved_key: the config attribute that decides the pair layout where the family
            lets the config choose (DeepSeek-V3's ``rope_interleave``); None: ``layout``.
        interleaved_tables: the table format's name when that attribute chooses interleaved pairs.
        head_dim: the attention module's attribute holding the width of its query and key heads.
        sizes_config: the model config's attribute holding the decoder's sizes where they are
            not on the model's config itself (Qwen2-VL: ``"text_config"``), or None.
        no_scaling: why transformers' model of the family reads no RoPE scaling from its config
            (GPT-J); None: it reads one.
        rotary_positions: the decoder layers are not handed the positions their tables are
            computed at (Qwen2-VL): they are read from the rotary module's input.
        adapter: the name of its adapter in :data:`posenc.integrations.adapters.ADAPTERS`, where
            its attention is outside transformers' ``AttentionInterface``; None: none.
    """

    model_type: str
    layout: str = "half-split"
    defaults: Mapping[str, Any] = field(default_factory=dict)
    aliases: Mapping[str, str] = field(default_factory=dict)
    text_config: str | None = None
    flat_text: bool = False
    layer_types: Callable[[Reading], list[str]] | None = None
    span: Callable[[Reading, int, str | None], tuple[str, int | None]] = span_of_type
    encoding: Callable[[Reading, int, str | None], PositionalEncoding | None] = rope_of_type
    type_thetas: Mapping[str, tuple[str | None, float]] = field(default_factory=dict)
    softcap_key: str | None = None
    prepare: Callable[[Reading], None] | None = None
    reader: Callable[[Mapping[str, Any]], PositionPlan] | None = None
    refused: str | None = None
    source: str = ""
    base: str | None = None
    layers: str = "layers"
    stacks: tuple[str, ...] = ()
    attention: str = "self_attn"
    rotary: str | None = "rotary_emb"
    tables: str = "cos_sin"
    sinks: str | None = None
    softcap: str | None = "attn_logit_softcapping"
    scaled_layer_types: tuple[str, ...] = ()
    temperature: tuple[str, str, str] | None = None
    query_scale: str | None = None
    interleaved_key: str | None = None
    interleaved_tables: str | None = None
    head_dim: str = "head_dim"
    sizes_config: str | None = None
    no_scaling: str | None = None
    rotary_positions: bool = False
    adapter: str | None = None

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise InvalidArgument(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        for name in ("tables", "interleaved_tables"):
            value = getattr(self, name)
            if value is not None and value not in TABLE_FORMATS:
                raise InvalidArgument(f"{name} must be one of {TABLE_FORMATS}, got {value!r}")
        if self.refused is not None and (not isinstance(self.refused, str) or not self.refused.strip()):
            raise InvalidArgument(f"refused must be a reason (a non-empty str) or None, got {self.refused!r}")

    @property
    def interleaved(self) -> bool:
        """The rotary pairs are (2i, 2i + 1) (``layout == "interleaved"``)."""
        return self.layout == "interleaved"


def _family(model_type: str, **kwargs: Any) -> Family:
    kwargs.setdefault("source", f"transformers/models/{model_type}/configuration_{model_type}.py, modeling_{model_type}.py")
    return Family(model_type, **kwargs)


def _refused(model_type: str, reason: str, folder: str | None = None) -> Family:
    """A family posenc knows and does not read: its record says why (:attr:`Family.refused`)."""
    folder = folder or model_type.replace("-", "_")
    return _family(model_type, refused=reason, rotary=None,
                   source=f"transformers/models/{folder}/configuration_{folder}.py, modeling_{folder}.py")


# -- issue 34, non-rotary families: the reasons several records share

#: The recurrent families: no attention layer, so no position a plan could state.
_RECURRENT = "recurrent state: no attention positions to read ({mixer}; no attention layer)"
#: BERT's embeddings: the learned table sits inside them, under the embedding LayerNorm.
_BERT_TABLE = ("a learned absolute table inside BERT-style embeddings ({module}.position_embeddings, rows at "
               "position_ids = arange + the cache length, summed with the token-type rows{extra} under the "
               "embedding LayerNorm); posenc's learned-table adapters serve GPT-2's wpe and OPT's embed_positions only")
#: RoBERTa's position ids, counted from the padding of the input ids.
_ROBERTA_IDS = ("position ids derived from the input ids' padding (RoBERTa's create_position_ids_from_input_ids: "
                "padding_idx + 1 + the count of non-padding tokens so far, padding tokens at row padding_idx) into a "
                "learned table inside BERT-style embeddings ({module}.position_embeddings); posenc's plan takes "
                "positions from position_ids or the attention mask, never from the token ids")
#: fairseq's sinusoids: sin in the first half of the columns, cos in the second (not Vaswani's interleaving).
_FAIRSEQ_SINUSOIDS = ("a fixed sinusoidal table in fairseq's layout ({module}: sin of frequencies "
                      "10000^(-i / (d/2 - 1)) in the first half of the columns, cos in the second, the padding row "
                      "zero, not posenc's sinusoidal with even columns sin and odd columns cos)")
#: The composite configs: two models, each with its own positions.
_COMPOSITE = ("a composite of two independent models ({encoder} encoder and a decoder, config['encoder'] and "
              "config['decoder']), each with its own positions; position_plan reads one model's config: pass "
              "config['decoder']")


_QWEN2 = dict(defaults={"rope_theta": 10000.0, "sliding_window": 4096, "max_window_layers": 28,
                        "use_sliding_window": False},
              layer_types=qwen2_layer_types, span=qwen2_span)
_QWEN_VL_TEXT = dict(defaults={"rope_theta": 1_000_000.0, "sliding_window": 4096, "max_window_layers": 80,
                               "use_sliding_window": False},
                     layer_types=qwen2_layer_types, span=qwen2_span, encoding=qwen_vl_rope)
_LLAMA4_TEXT = dict(layout="interleaved", defaults=llama4.TEXT_DEFAULTS, temperature=llama4.TEMPERATURE,
                    layer_types=llama4_layer_types, encoding=llama4_rope, base="model", tables="complex_pairs")
_GEMMA3_TEXT = dict(defaults={"head_dim": 256, "sliding_window": 4096},
                    layer_types=pattern_layer_types("sliding_window_pattern", 6), encoding=layer_type_rope,
                    type_thetas={"full_attention": ("rope_theta", 1_000_000.0),
                                 "sliding_attention": ("rope_local_base_freq", 10_000.0)},
                    prepare=gemma3_check, scaled_layer_types=("full_attention",))
_QWEN_VL_MODULES = {"base": "model.language_model", "sizes_config": "text_config", "rotary_positions": True}
_GEMMA4_TEXT = dict(defaults={"head_dim": 256, "sliding_window": 512},
                    layer_types=gemma4_layer_types, encoding=gemma4_rope,
                    prepare=gemma4_check)

#: Qwen3.5 and Qwen3.5-MoE's text models: one spelling (their configuration files' defaults agree)
_QWEN3_5_TEXT = dict(defaults={"rope_theta": 10000.0, "head_dim": 256, "partial_rotary_factor": 0.25,
                               "full_attention_interval": 4},
                     layer_types=interval_layer_types, encoding=qwen3_5_rope, prepare=qwen3_next_note)

#: GPT-J's rotary as transformers builds it (rotate_every_two over the first rotary_dim
#: dimensions, base 10000), in GPT-J's config spelling: GPT-J's record and CodeGen's.
_GPTJ_ROTARY = dict(layout="interleaved", defaults={"rotary_dim": 64},
                    aliases={"n_embd": "hidden_size", "n_head": "num_attention_heads", "n_layer": "num_hidden_layers",
                             "n_positions": "max_position_embeddings"},
                    encoding=gptj_rope, layers="h", attention="attn", tables="pair_sin_cos")


#: model_type -> :class:`Family`, as transformers 5.24 builds each family. One entry per family.
FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    _family("llama", defaults={"rope_theta": 10000.0}),
    _family("mistral", defaults={"rope_theta": 10000.0, "sliding_window": 4096}, span=span_all_sliding,
            prepare=mistral_note),
    _family("mixtral", defaults={"rope_theta": 1_000_000.0, "sliding_window": None}, span=span_all_sliding),
    _family("qwen2", **_QWEN2),
    _family("qwen3", **{**_QWEN2, "defaults": {**_QWEN2["defaults"], "head_dim": 128}}),
    _family("qwen3_moe", defaults={"rope_theta": 10000.0, "sliding_window": 4096, "use_sliding_window": False},
            span=sliding_use_flag_span),
    _family("qwen3_next", defaults={"rope_theta": 10000.0, "head_dim": 256, "partial_rotary_factor": 0.25,
                                    "full_attention_interval": 4},
            layer_types=lambda r: r.explicit_layer_types() or [
                "linear_attention" if (i + 1) % r.positive_int("full_attention_interval") else "full_attention"
                for i in range(r.positive_int("num_hidden_layers"))],
            encoding=lambda r, i, t: None if t == "linear_attention" else r.rope(t), prepare=qwen3_next_note),
    _family("qwen2_vl_text", **_QWEN_VL_TEXT, source="transformers/models/qwen2_vl/"),
    _family("qwen2_5_vl_text", **_QWEN_VL_TEXT, source="transformers/models/qwen2_5_vl/"),
    # the text tower of the VL models; its rotary embedding recomposes the M-RoPE axes by
    # mrope_section into Llama-format (cos, sin) (B, T, D) (transformers 5's Qwen2VLRotaryEmbedding)
    _family("qwen2_vl", text_config="qwen2_vl_text", flat_text=True, **_QWEN_VL_MODULES),
    _family("qwen2_5_vl", text_config="qwen2_5_vl_text", flat_text=True, **_QWEN_VL_MODULES),
    _family("gemma", defaults={"rope_theta": 10000.0, "head_dim": 256}),
    _family("gemma2", defaults={"rope_theta": 10000.0, "head_dim": 256, "sliding_window": 4096,
                                "attn_logit_softcapping": 50.0},
            layer_types=pattern_layer_types("", 2), softcap_key="attn_logit_softcapping"),
    _family("gemma3_text", **_GEMMA3_TEXT, source="transformers/models/gemma3/"),
    _family("gemma3", text_config="gemma3_text"),
    _family("gemma4_text", **_GEMMA4_TEXT, source="transformers/models/gemma4/"),
    _family("gemma4", text_config="gemma4_text"),
    _family("phi", defaults={"rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
    _family("phi3", defaults={"rope_theta": 10000.0, "sliding_window": None}, span=span_all_sliding,
            prepare=phi3_prepare),
    _family("cohere", layout="interleaved", defaults={"rope_theta": 500000.0}),
    _family("cohere2", layout="interleaved", defaults={"rope_theta": 10000.0, "sliding_window": 4096},
            layer_types=pattern_layer_types("sliding_window_pattern", 4), encoding=cohere2_rope,
            prepare=cohere2_check),
    _family("olmo2", defaults={"rope_theta": 10000.0}),
    # OLMo 3: 3 sliding layers to 1 full; Olmo3Config pops rope_theta for the full_attention dict
    # first, so the sliding dict of a v4 config always gets the class's 500000
    _family("olmo3", defaults={"sliding_window": 4096}, layer_types=pattern_layer_types("", 4),
            encoding=layer_type_rope, type_thetas={"full_attention": ("rope_theta", 500_000.0),
                                                   "sliding_attention": (None, 500_000.0)},
            scaled_layer_types=("full_attention",)),
    _family("smollm3", defaults={"rope_theta": 2_000_000.0, "no_rope_layer_interval": 4,
                                 "use_sliding_window": False, "sliding_window": None},
            layer_types=smollm3_layer_types, span=smollm3_span, encoding=no_rope_schedule_rope),
    _family("gpt_oss", defaults={"rope_theta": 150000.0, "head_dim": 64, "sliding_window": 128},
            layer_types=pattern_layer_types("", 2), prepare=gpt_oss_prepare, tables="half_cos_sin", sinks="sinks"),
    _family("deepseek_v3", layout="interleaved",
            defaults={"rope_theta": 10000.0, "qk_rope_head_dim": 64, "rope_interleave": True},
            encoding=deepseek_rope, prepare=deepseek_check, interleaved_key="rope_interleave",
            interleaved_tables="deinterleaved_cos_sin", head_dim="qk_head_dim"),
    _family("gpt_neox", encoding=gpt_neox_rope, attention="attention"),
    _family("gptj", **_GPTJ_ROTARY,
            no_scaling="transformers' GPT-J builds its rotary table once, with create_sinusoidal_positions from "
                       "rotary_dim and base 10000, and reads no rope_theta, rope_scaling or rope_parameters"),
    _family("stablelm", defaults={"rope_theta": 10000.0, "partial_rotary_factor": 0.25}),
    _family("persimmon", defaults={"rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
    # issue 34's families, as transformers 5.24 builds them
    _family("arcee", defaults={"rope_theta": 10000.0}),
    _family("apertus", defaults={"rope_theta": 12_000_000.0}, prepare=apertus_prepare),
    _family("seed_oss", defaults={"rope_theta": 10000.0, "head_dim": 128}),
    _family("helium", layout="interleaved", defaults={"rope_theta": 100000.0, "head_dim": 128},
            tables="deinterleaved_cos_sin"),
    _family("ernie4_5", layout="interleaved", defaults={"rope_theta": 500000.0, "head_dim": 128},
            tables="deinterleaved_cos_sin"),
    _family("ernie4_5_moe", layout="interleaved", defaults={"rope_theta": 500000.0}, tables="deinterleaved_cos_sin"),
    _family("glm", layout="interleaved", defaults={"rope_theta": 10000.0, "head_dim": 128, "partial_rotary_factor": 0.5},
            tables="deinterleaved_cos_sin"),
    _family("glm4", layout="interleaved", defaults={"rope_theta": 10000.0, "head_dim": 128, "partial_rotary_factor": 0.5},
            tables="deinterleaved_cos_sin"),
    _family("glm4_moe", defaults={"rope_theta": 10000.0, "partial_rotary_factor": 0.5}, prepare=glm4_moe_prepare),
    _family("granite", defaults={"rope_theta": 10000.0}),
    _family("granitemoe", defaults={"rope_theta": 10000.0}),
    _family("granitemoeshared", defaults={"rope_theta": 10000.0}),
    _family("hunyuan_v1_dense", defaults={"rope_theta": 10000.0}, prepare=hunyuan_prepare),
    _family("hunyuan_v1_moe", defaults={"rope_theta": 10000.0}, prepare=hunyuan_prepare),
    _family("starcoder2", defaults={"rope_theta": 10000.0, "sliding_window": None}, span=span_all_sliding),
    _family("phimoe", defaults={"rope_theta": 1_000_000.0, "sliding_window": None}, span=span_all_sliding,
            prepare=phimoe_check),
    _family("exaone4", defaults={"rope_theta": 10000.0, "sliding_window": 4096, "sliding_window_pattern": 4},
            layer_types=exaone4_layer_types, span=exaone4_span, encoding=exaone4_rope),
    _family("dots1", defaults={"rope_theta": 10000.0, "sliding_window": 4096, "max_window_layers": 62},
            layer_types=dots1_layer_types),
    _family("vaultgemma", defaults={"rope_theta": 10000.0, "head_dim": 256, "sliding_window": 4096,
                                    "attn_logit_softcapping": 50.0},
            layer_types=pattern_layer_types("", 2), softcap_key="attn_logit_softcapping"),
    _family("minimax_m2", defaults={"rope_theta": 5_000_000.0, "head_dim": 128}, prepare=minimax_m2_prepare),
    _family("ministral", defaults={"rope_theta": 10000.0, "sliding_window": 4096}, layer_types=ministral_layer_types),
    _family("ministral3", defaults={"head_dim": 128, "sliding_window": None}, span=span_all_sliding,
            encoding=ministral3_rope, prepare=ministral3_prepare, query_scale="llama_4_scaling_beta"),
    _family("deepseek_v2", layout="interleaved", defaults={"rope_theta": 10000.0, "qk_rope_head_dim": 64},
            encoding=deepseek_v2_rope, prepare=deepseek_check, tables="complex_pairs", head_dim="qk_head_dim"),
    # Qwen3-VL: interleaved M-RoPE in the text tower (no sliding window)
    _family("qwen3_vl_text", defaults={"rope_theta": 500_000.0, "head_dim": 128}, encoding=qwen3_vl_rope,
            source="transformers/models/qwen3_vl/"),
    _family("qwen3_vl", text_config="qwen3_vl_text", base="model.language_model", sizes_config="text_config",
            rotary_positions=True),
    # NVIDIA's Cosmos 3 Omni: Qwen3-VL's text tower (AutoModel of its qwen3_vl_text text_config) at
    # model.language_model, fed the wrapper's 3-axis position ids as Qwen3-VL feeds them
    _family("cosmos3_omni", text_config="qwen3_vl_text", base="model.language_model", sizes_config="text_config",
            rotary_positions=True, source="transformers/models/cosmos3_omni/"),
    _family("qwen3_vl_moe_text", defaults={"rope_theta": 500_000.0}, encoding=qwen3_vl_rope,
            source="transformers/models/qwen3_vl_moe/"),
    _family("qwen3_vl_moe", text_config="qwen3_vl_moe_text", base="model.language_model", sizes_config="text_config",
            rotary_positions=True),
    # Qwen3.5: Qwen3-Next's hybrid (Gated DeltaNet layers, no positions) with interleaved M-RoPE
    _family("qwen3_5_text", **_QWEN3_5_TEXT, source="transformers/models/qwen3_5/"),
    _family("qwen3_5", text_config="qwen3_5_text", base="model.language_model", sizes_config="text_config",
            rotary_positions=True),
    _family("qwen3_5_moe_text", **_QWEN3_5_TEXT, source="transformers/models/qwen3_5_moe/"),
    _family("qwen3_5_moe", text_config="qwen3_5_moe_text", base="model.language_model", sizes_config="text_config",
            rotary_positions=True),
    # the hybrids: their softmax-attention layers get their positions, the other layers None
    _family("lfm2", defaults={"rope_theta": 1_000_000.0}, layer_types=lfm2_layer_types, span=hybrid_span,
            encoding=attention_layers_rope),
    _family("bamba", defaults={"rope_theta": 10000.0}, layer_types=bamba_layer_types, span=hybrid_span,
            encoding=attention_layers_rope, prepare=bamba_prepare),
    _family("granitemoehybrid", defaults={"rope_theta": 10000.0},
            layer_types=lambda r: r.explicit_layer_types() or ["linear_attention"] * r.positive_int("num_hidden_layers"),
            span=hybrid_span, encoding=granitemoehybrid_rope, prepare=granitemoehybrid_check, rotary_positions=True),
    # Falcon-H1: every layer runs attention and a Mamba mixer side by side; the attention has RoPE
    _family("falcon_h1", defaults={"rope_theta": 10000.0},
            layer_types=lambda r: ["hybrid"] * r.positive_int("num_hidden_layers"), span=hybrid_span),
    # Mistral 3: a Pixtral vision tower and a Mistral or Ministral 3 decoder, read as its text_config names it
    _family("mistral3", reader=plan_mistral3, base="model.language_model", sizes_config="text_config",
            query_scale="llama_4_scaling_beta"),
    # Llama 3.2 Vision: Llama's RoPE on the self-attention layers, none on the cross-attention layers
    _family("mllama_text_model", defaults={"rope_theta": 500_000.0}, layer_types=mllama_layer_types, span=hybrid_span,
            encoding=attention_layers_rope, base="model", source="transformers/models/mllama/"),
    _family("mllama", text_config="mllama_text_model", base="model.language_model", sizes_config="text_config"),
    _family("lfm2_moe", defaults={"rope_theta": 1_000_000.0}, layer_types=lfm2_moe_layer_types, span=hybrid_span,
            encoding=attention_layers_rope, rotary="pos_emb"),
    # GLM-4.7-Flash: DeepSeek-V3's MLA, RoPE on qk_rope_head_dim, interleaved with rope_interleave (default true)
    _family("glm4_moe_lite", layout="interleaved",
            defaults={"rope_theta": 10000.0, "qk_rope_head_dim": 64, "rope_interleave": True},
            encoding=deepseek_rope, prepare=glm4_moe_lite_prepare, interleaved_key="rope_interleave",
            interleaved_tables="deinterleaved_cos_sin", head_dim="qk_head_dim"),
    # Gemma 3n: Gemma 3's two thetas (rope_theta global, rope_local_base_freq local), 4 sliding layers to 1 full
    _family("gemma3n_text", defaults={"head_dim": 256, "sliding_window": 512},
            layer_types=pattern_layer_types("", 5), encoding=layer_type_rope,
            type_thetas={"full_attention": ("rope_theta", 1_000_000.0),
                         "sliding_attention": ("rope_local_base_freq", 10_000.0)},
            prepare=gemma3_check, scaled_layer_types=("full_attention",), source="transformers/models/gemma3n/"),
    _family("gemma3n", text_config="gemma3n_text", base="model.language_model", sizes_config="text_config"),
    _family("llama4_text", **_LLAMA4_TEXT, source="transformers/models/llama4/"),
    _family("llama4", text_config="llama4_text"),
    # the families whose positions are not (only) rotary: a reader of their own and an adapter
    _family("falcon", reader=plan_falcon, adapter="falcon", layers="h", attention="self_attention"),
    _family("bloom", reader=plan_bloom, adapter="bloom", layers="h", attention="self_attention",
            rotary=None),
    _family("mpt", reader=plan_mpt, adapter="mpt", layers="blocks", attention="attn", rotary=None),
    _family("gpt2", reader=plan_gpt2, adapter="gpt2", layers="h", attention="attn", rotary=None),
    _family("opt", reader=plan_opt, adapter="opt", base="model.decoder", attention="self_attn", rotary=None),
    _family("t5", reader=plan_t5, adapter="t5", stacks=("encoder", "decoder"), layers="block",
            attention="layer.0.SelfAttention", rotary=None),
    _family("mt5", reader=plan_mt5, adapter="t5", stacks=("encoder", "decoder"), layers="block",
            attention="layer.0.SelfAttention", rotary=None),
    # -- issue 34, non-rotary families
    # GPT-2's learned table wpe (StarCoder's multi-query attention goes through AttentionInterface): GPT-2's adapter
    _family("gpt_bigcode", reader=plan_gpt_bigcode, adapter="gpt2", layers="h", attention="attn", rotary=None),
    _refused("gpt_neo", "a learned table (transformer.wpe) under attention computed outside transformers' "
                        "AttentionInterface (GPTNeoSelfAttention._attn: q.k unscaled, its own causal mask and, on the "
                        "'local' layers of attention_types, a window of window_size keys); posenc has no adapter "
                        "for GPT-Neo's attention"),
    _refused("csm_depth_decoder_model",
             "position-indexed weights: the depth decoder picks each token's input embedding rows (input_ids + "
             "vocab_size * (position - 1)) and its output head (CsmCodebooksHead, one weight per codebook position) by "
             "its position, which it computes itself (arange over the cache, ignoring position_ids); posenc's plan "
             "positions attention only", folder="csm"),
    # OPT's learned table (offset 2, OPT's call) at position_ids = arange + the cache length: OPT's adapter
    _family("biogpt", reader=plan_biogpt, adapter="opt", base="biogpt", rotary=None),
    # T5's buckets in a mixture-of-experts T5 (the experts are feed-forward layers): T5's reader and adapter
    _family("switch_transformers", reader=plan_switch_transformers, adapter="t5", stacks=("encoder", "decoder"),
            layers="block", attention="layer.0.SelfAttention", rotary=None),
    # recurrent: no attention layer at all
    _refused("mamba", _RECURRENT.format(mixer="Mamba's selective state-space mixers")),
    _refused("mamba2", _RECURRENT.format(mixer="Mamba-2's state-space duality mixers")),
    _refused("falcon_mamba", _RECURRENT.format(mixer="Mamba's selective state-space mixers")),
    _refused("rwkv", _RECURRENT.format(mixer="RWKV's time mixing with a learned per-channel decay")),
    _refused("xlstm", _RECURRENT.format(mixer="xLSTM's mLSTM blocks")),
    _refused("recurrent_gemma",
             "RG-LRU recurrent blocks (no attention positions) between local attention layers whose RoPE over "
             "half of each head (partial_rotary_factor 0.5) is computed inside each attention module "
             "(RecurrentGemmaAttention.rotary_emb) with a fixed attention_window_size cache; posenc's records place "
             "one rotary module on the base model"),
    # T5's buckets with a table in every self-attention layer (UMT5Attention): T5's adapter, a table per layer
    _family("umt5", reader=plan_umt5, adapter="t5", stacks=("encoder", "decoder"), layers="block",
            attention="layer.0.SelfAttention", rotary=None),
    # T5's buckets, changed
    _refused("longt5", "an encoder of block-local attention (encoder_attention_type 'local': blocks of local_radius "
                       "tokens each way; 'transient-global': plus global_block_size summary tokens with their own "
                       "buckets), which posenc's spans (full, causal sliding, chunked) do not model"),
    _refused("pix2struct", "a vision encoder whose patches carry learned row and column embeddings "
                           "(Pix2StructVisionEmbeddings) under a text decoder with T5 buckets; posenc's t5 adapter "
                           "needs T5 buckets in both stacks"),
    _refused("udop", "T5 buckets plus 2-D layout biases from each token's bounding box "
                     "(RelativePositionBiasAggregated: 1-D, horizontal and vertical buckets): positions that are "
                     "boxes, not indices"),
    _refused("t5gemma", "an encoder-decoder of Gemma 2 layers with RoPE in both stacks (a bidirectional encoder, "
                        "sliding windows); posenc's plan of an encoder-decoder holds T5 buckets only"),
    _refused("t5gemma2", "an encoder-decoder of Gemma 3 layers with RoPE in both stacks and a decoder whose "
                         "self- and cross-attention are one softmax (T5Gemma2MergedAttention); posenc's plan of an "
                         "encoder-decoder holds T5 buckets only"),
    # BERT-style embeddings (the ...ForCausalLM of encoder families)
    _refused("roberta", _ROBERTA_IDS.format(module="RobertaEmbeddings")),
    _refused("roberta-prelayernorm", _ROBERTA_IDS.format(module="RobertaPreLayerNormEmbeddings")),
    _refused("xlm-roberta", _ROBERTA_IDS.format(module="XLMRobertaEmbeddings")),
    _refused("xlm-roberta-xl", _ROBERTA_IDS.format(module="XLMRobertaXLEmbeddings")),
    _refused("camembert", _ROBERTA_IDS.format(module="CamembertEmbeddings")),
    _refused("xmod", _ROBERTA_IDS.format(module="XmodEmbeddings")),
    _refused("electra", _BERT_TABLE.format(module="ElectraEmbeddings", extra="")),
    _refused("ernie", _BERT_TABLE.format(module="ErnieEmbeddings", extra=" and, with use_task_id, task-type rows")),
    _refused("rembert", _BERT_TABLE.format(module="RemBertEmbeddings", extra=", of input_embedding_size")),
    _refused("roc_bert", _BERT_TABLE.format(module="RoCBertEmbeddings",
                                            extra=" and the pronunciation and shape embeddings")),
    _refused("megatron-bert", _BERT_TABLE.format(module="MegatronBertEmbeddings", extra="")),
    _refused("big_bird", "block-sparse attention (attention_type 'block_sparse': random, sliding and global blocks "
                         "of block_size), which posenc's spans do not model, and "
                         + _BERT_TABLE.format(module="BigBirdEmbeddings", extra="")),
    _refused("roformer", "rotary positions from a sinusoidal table computed in the encoder "
                         "(RoFormerSinusoidalPositionalEmbedding: sin in the first half of the columns, cos in the "
                         "second, rotating interleaved pairs, the values too with rotary_value) and handed to BERT-style "
                         "layers; posenc's records place a rotary module of cos/sin tables on a Llama-shaped model"),
    _refused("git", "image tokens prefixed to the text (attending to each other bidirectionally), the text numbered from 0 after "
                    "them by " + _BERT_TABLE.format(module="GitEmbeddings", extra="")),
    _refused("blip", "a BERT-style text decoder with cross-attention to the image (BlipTextModel) and "
                     + _BERT_TABLE.format(module="BlipTextEmbeddings", extra="")),
    # learned or sinusoidal tables in decoders, in modules posenc's adapters do not reach
    _refused("xglm", _FAIRSEQ_SINUSOIDS.format(module="XGLMSinusoidalPositionalEmbedding") +
             " with an offset of 2 rows, at position_ids = arange + the cache length"),
    _refused("trocr", "a learned table with an offset of 2 rows (TrOCRLearnedPositionalEmbedding), or with "
                      "use_learned_position_embeddings false " + _FAIRSEQ_SINUSOIDS.format(
                          module="TrOCRSinusoidalPositionalEmbedding") + " at positions derived from the input ids' "
                      "padding; posenc's learned-table adapters serve GPT-2's wpe and OPT's embed_positions only"),
    _refused("clvp_decoder", "a learned table (ClvpDecoder.position_embeds_layer, rows at position_ids) in CLVP's "
                             "speech decoder, conditioned on a prefix of text and mel embeddings; posenc's "
                             "learned-table adapters serve GPT-2's wpe and OPT's embed_positions only", folder="clvp"),
    _refused("cpmant", "T5-style relative buckets combined with segment-pair buckets (CpmAntSegmentPositionEmbedding: "
                       "position_bias_num_buckets, position_bias_max_distance, segment_types) and a learned prompt "
                       "prefix; posenc's T5 bias has no segments"),
    _refused("prophetnet", "n-gram self-attention (ngram predicting streams, ProphetNetNgramSelfAttention) with its "
                           "own relative buckets (num_buckets, relative_max_distance) over a learned table whose "
                           "positions come from the attention mask plus padding_idx (ProphetNetPositionalEmbeddings)"),
    _refused("mvp", "BART's learned tables with an offset of 2 rows (MvpLearnedPositionalEmbedding) and, with "
                    "use_prompt, learned key/value prompts prefixed in every layer (MvpPrompt); posenc's plan has no "
                    "prompt prefix and its learned-table adapters serve GPT-2's wpe and OPT's embed_positions only"),
    _refused("kosmos-2", _FAIRSEQ_SINUSOIDS.format(module="Kosmos2TextSinusoidalPositionalEmbedding") +
             " at positions derived from the input ids' padding (create_position_ids_from_input_ids), image features "
             "inserted where image_embeds_position_mask says", folder="kosmos2"),
    _refused("kosmos_2_text_model", _FAIRSEQ_SINUSOIDS.format(module="Kosmos2TextSinusoidalPositionalEmbedding") +
             " at positions derived from the input ids' padding (create_position_ids_from_input_ids)", folder="kosmos2"),
    _refused("kosmos-2.5", _FAIRSEQ_SINUSOIDS.format(module="Kosmos2_5TextSinusoidalPositionalEmbedding") +
             " at positions derived from the input ids' padding (create_position_ids_from_input_ids), image features "
             "inserted where image_embeds_position_mask says", folder="kosmos2_5"),
    _refused("kosmos_2_5_text_model", _FAIRSEQ_SINUSOIDS.format(module="Kosmos2_5TextSinusoidalPositionalEmbedding")
             + " at positions derived from the input ids' padding (create_position_ids_from_input_ids)",
             folder="kosmos2_5"),
    _refused("idefics", "Llama's RoPE computed inside each attention module (IdeficsAttention.rotary_emb) and gated "
                        "cross-attention layers to the images every cross_layer_interval layers; posenc's records "
                        "place one rotary module on the base model"),
    _refused("musicgen", "a fixed sinusoidal table with cos in the first half of the columns and sin in the second "
                         "(MusicgenSinusoidalPositionalEmbedding, frequencies 10000^(-i / (d/2 - 1))) over the sum of "
                         "num_codebooks token streams, not posenc's sinusoidal with even columns sin and odd columns cos"),
    _refused("musicgen_melody", "a fixed sinusoidal table with cos in the first half of the columns and sin in the "
                                "second (MusicgenMelodySinusoidalPositionalEmbedding) over the sum of num_codebooks token "
                                "streams after a prefix of melody conditioning, not posenc's sinusoidal with even "
                                "columns sin and odd columns cos"),
    _refused("moshi", "RoPE computed inside each attention module (MoshiAttention.rotary_emb) of the temporal "
                      "transformer and a depth decoder whose linear weights are picked by codebook position "
                      "(MoshiFlexibleLinear); posenc's records place one rotary module on the base model and have no "
                      "position-indexed weights"),
    # encoder-decoders: both stacks' positions, or a decoder of the same kind on its own
    _refused("bart", "learned tables with an offset of 2 rows (BartLearnedPositionalEmbedding, rows at position_ids "
                     "+ 2, position_ids = arange + the cache length, not OPT's attention-mask positions) in the "
                     "encoder and the decoder; posenc's learned-table adapters serve GPT-2's wpe and OPT's "
                     "embed_positions only"),
    _refused("mbart", "learned tables with an offset of 2 rows (MBartLearnedPositionalEmbedding, rows at position_ids "
                      "+ 2, position_ids = arange + the cache length) in the encoder and the decoder; posenc's "
                      "learned-table adapters serve GPT-2's wpe and OPT's embed_positions only"),
    _refused("plbart", "learned tables with an offset of 2 rows (PLBartLearnedPositionalEmbedding, rows at "
                       "position_ids + 2, position_ids = arange + the cache length) in the encoder and the decoder; "
                       "posenc's learned-table adapters serve GPT-2's wpe and OPT's embed_positions only"),
    _refused("marian", "fixed sinusoidal tables in the encoder and the decoder (MarianSinusoidalPositionalEmbedding: "
                       "sin in the first half of the columns, cos in the second, not posenc's sinusoidal with even "
                       "columns sin and odd columns cos) at position_ids = arange + the cache length"),
    _refused("pegasus", "fixed sinusoidal tables in the encoder and the decoder (PegasusSinusoidalPositionalEmbedding:"
                        " sin in the first half of the columns, cos in the second, not posenc's sinusoidal with even "
                        "columns sin and odd columns cos) at position_ids = arange + the cache length"),
    _refused("pegasus_x", "an encoder of block-local attention (block_size) with num_global_tokens global tokens "
                          "and sinusoids computed on the fly (PegasusXSinusoidalPositionalEmbedding, sin half and "
                          "cos half), which posenc's spans and sinusoidal layout do not model"),
    _refused("blenderbot", "learned tables without offset in the encoder and the decoder "
                           "(BlenderbotLearnedPositionalEmbedding, rows at position_ids = arange + the cache length); "
                           "posenc's learned-table adapters serve GPT-2's wpe and OPT's embed_positions only"),
    _refused("blenderbot-small", "learned tables without offset in the encoder and the decoder "
                                 "(BlenderbotSmallLearnedPositionalEmbedding, rows at position_ids = arange + the cache "
                                 "length); posenc's learned-table adapters serve GPT-2's wpe and OPT's "
                                 "embed_positions only"),
    _refused("fsmt", _FAIRSEQ_SINUSOIDS.format(module="SinusoidalPositionalEmbedding") + " in the encoder and the "
             "decoder, at positions derived from the input ids' padding (make_positions: padding_idx + 1 + the count "
             "of non-padding tokens so far)"),
    _refused("m2m_100", _FAIRSEQ_SINUSOIDS.format(module="M2M100SinusoidalPositionalEmbedding") + " with an offset "
             "of 2 rows in the encoder and the decoder, at positions derived from the input ids' padding "
             "(create_position_ids_from_input_ids)"),
    _refused("nllb-moe", _FAIRSEQ_SINUSOIDS.format(module="NllbMoeSinusoidalPositionalEmbedding") + " with an offset "
             "of 2 rows in the encoder and the decoder, at positions derived from the input ids' padding "
             "(create_position_ids_from_input_ids)"),
    _refused("seamless_m4t", _FAIRSEQ_SINUSOIDS.format(module="SeamlessM4TSinusoidalPositionalEmbedding") +
             " with an offset of 2 rows in the text encoder and decoder, at positions derived from the input ids' "
             "padding (create_position_ids_from_input_ids)"),
    _refused("seamless_m4t_v2", _FAIRSEQ_SINUSOIDS.format(module="SeamlessM4Tv2SinusoidalPositionalEmbedding") +
             " with an offset of 2 rows in the text encoder and decoder, at positions derived from the input ids' "
             "padding (create_position_ids_from_input_ids)"),
    _refused("led", "a Longformer encoder of symmetric local windows (attention_window) with global attention "
                    "tokens, which posenc's spans do not model, and learned tables without offset "
                    "(LEDLearnedPositionalEmbedding)"),
    _refused("bigbird_pegasus", "an encoder of block-sparse attention (attention_type 'block_sparse': random, sliding "
                                "and global blocks of block_size), which posenc's spans do not model, and learned "
                                "tables without offset (BigBirdPegasusLearnedPositionalEmbedding)"),
    _refused("whisper", "a fixed sinusoidal table over the audio frames in the encoder (sinusoids: sin half, cos "
                        "half) and a learned table without offset in the decoder (WhisperPositionalEmbedding, rows at "
                        "position_ids = arange + the cache length); posenc's learned-table adapters serve GPT-2's "
                        "wpe and OPT's embed_positions only"),
    _refused("encoder-decoder", _COMPOSITE.format(encoder="a text"), folder="encoder_decoder"),
    _refused("vision-encoder-decoder", _COMPOSITE.format(encoder="an image"), folder="vision_encoder_decoder"),
    # -- issue 34, list A
    # Llama's RoPE, as their modeling files build it (HyperCLOVA X: Granite's multipliers; IQuest-Coder: Llama)
    _family("hyperclovax", defaults={"rope_theta": 10000.0}),
    _family("iquestcoder", defaults={"rope_theta": 10000.0, "head_dim": 128},
            source="transformers/models/iquestcoder/configuration_iquestcoder.py, llama/modeling_llama.py"),
    _family("jais2", defaults={"rope_theta": 10000.0}),
    _family("flex_olmo", defaults={"rope_theta": 500_000.0}),
    _family("aria_text", defaults={"rope_theta": 10000.0}, source="transformers/models/aria/"),
    _family("aria", text_config="aria_text", base="model.language_model", sizes_config="text_config"),
    _family("granite4_vision_text", defaults={"rope_theta": 10000.0}, source="transformers/models/granite4_vision/"),
    _family("granite4_vision", text_config="granite4_vision_text", base="model.language_model",
            sizes_config="text_config"),
    # Apertus 1.5: Apertus's text model (llama3 x8 over 8192, theta 1.2e7 without a rope dict)
    _family("apertus1p5_text", defaults={"rope_theta": 12_000_000.0}, prepare=apertus_prepare,
            source="transformers/models/apertus1p5/"),
    _family("apertus1p5", text_config="apertus1p5_text", base="model.language_model", sizes_config="text_config"),
    # GPT-NeoX Japanese: GPT-NeoX's spelling (rotary_emb_base, rotary_pct), the whole head rotated by default
    _family("gpt_neox_japanese", defaults={"rotary_pct": 1.0}, encoding=gpt_neox_rope, attention="attention"),
    # GLM-4.1V / GLM-4.6V / GLM-OCR: chunked M-RoPE, interleaved pairs; GLM-4.5V (MoE): the same, half-split
    _family("glm4v_text", layout="interleaved", defaults={"rope_theta": 10000.0}, encoding=glm4v_rope,
            source="transformers/models/glm4v/"),
    _family("glm4v", text_config="glm4v_text", **_QWEN_VL_MODULES),
    _family("glm46v", text_config="glm4v_text", **_QWEN_VL_MODULES),
    _family("glmga", text_config="glm4v_text", **_QWEN_VL_MODULES),
    _family("glm_ocr_text", layout="interleaved", defaults={"rope_theta": 10000.0}, encoding=glm4v_rope,
            source="transformers/models/glm_ocr/"),
    _family("glm_ocr", text_config="glm_ocr_text", **_QWEN_VL_MODULES),
    _family("glm4v_moe_text", defaults={"rope_theta": 10000.0, "partial_rotary_factor": 0.5}, encoding=glm4v_rope,
            source="transformers/models/glm4v_moe/"),
    _family("glm4v_moe", text_config="glm4v_moe_text", **_QWEN_VL_MODULES),
    # Doge: Llama's RoPE; its dynamic mask (dt_states, a content bias on the keys) is the model's own mask
    _family("doge", defaults={"rope_theta": 10000.0, "sliding_window": None}, span=span_all_sliding),
    # CodeGen: GPT-J's rotary (rotate_every_two over the first rotary_dim dimensions, base 10000)
    _family("codegen", **_GPTJ_ROTARY,
            no_scaling="transformers' CodeGen builds its rotary table once, with create_sinusoidal_positions from "
                       "rotary_dim and base 10000, and reads no rope_theta, rope_scaling or rope_parameters"),
    # Chameleon: Llama's RoPE over hidden_size // num_attention_heads (its attention ignores head_dim)
    _family("chameleon", defaults={"rope_theta": 10000.0}, encoding=sizes_head_rope, base="model"),
    # Emu3: a Llama-like text model (theta 1e6) under a VQ-VAE wrapper (text at model.text_model)
    _family("emu3_text_model", defaults={"rope_theta": 1_000_000.0}, source="transformers/models/emu3/"),
    _family("emu3", text_config="emu3_text_model", base="model.text_model", sizes_config="text_config"),
    # InternLM3 and EXAONE 3 are built as Llama (transformers' auto mapping: LlamaForCausalLM)
    _family("internlm3", defaults={"rope_theta": 10000.0, "head_dim": 128},
            source="transformers/models/internlm3/configuration_internlm3.py, llama/modeling_llama.py"),
    _family("exaone", defaults={"rope_theta": 500_000.0},
            aliases={"num_layers": "num_hidden_layers"},
            source="transformers/models/exaone/configuration_exaone.py, llama/modeling_llama.py"),
    # DBRX: GPT-style names (d_model, n_heads, n_layers), head width d_model // n_heads
    _family("dbrx", aliases={"d_model": "hidden_size", "n_heads": "num_attention_heads", "n_layers": "num_hidden_layers",
                             "max_seq_len": "max_position_embeddings"},
            encoding=sizes_head_rope, prepare=dbrx_check, layers="blocks", attention="norm_attn_norm.attn"),
    # JetMoE: the head width is kv_channels (attribute_map head_dim -> kv_channels)
    _family("jetmoe", defaults={"rope_theta": 10000.0, "head_dim": 128}, aliases={"kv_channels": "head_dim"},
            attention="self_attention"),
    _family("bitnet", defaults={"rope_theta": 500_000.0}),
    _family("diffllama", defaults={"rope_theta": 10000.0}),
    # CWM: Llama 3's llama3 x16 RoPE on every layer, 3 sliding layers to 1 full (the first of four)
    _family("cwm", defaults={"sliding_window": 8192}, layer_types=first_of_four_layer_types, span=exaone4_span,
            prepare=cwm_prepare),
    # Granite SWA: per-layer theta (layer_rope_theta, 0 = NoPE), learned sinks, the first of four layers full
    _family("granite_swa", defaults={"rope_theta": 10000.0, "sliding_window": 128}, layer_types=first_of_four_layer_types,
            span=exaone4_span, encoding=layer_theta_rope, sinks="sinks"),
    _family("granitemoe_swa", defaults={"rope_theta": 10000.0, "sliding_window": 128},
            layer_types=first_of_four_layer_types, span=exaone4_span, encoding=layer_theta_rope, sinks="sinks"),
    # AFMoE: RoPE on the sliding layers, the every-n-th full layers NoPE
    _family("afmoe", defaults={"rope_theta": 10000.0, "head_dim": 128, "sliding_window": 1024,
                               "global_attn_every_n_layers": 4},
            layer_types=pattern_layer_types("global_attn_every_n_layers", 4), span=exaone4_span,
            encoding=sliding_layers_rope),
    # EXAONE MoE (K-EXAONE): EXAONE 4's global NoPE layers
    _family("exaone_moe", defaults={"rope_theta": 10000.0, "sliding_window": 4096, "sliding_window_pattern": 4},
            layer_types=exaone4_layer_types, span=exaone4_span, encoding=exaone4_rope),
    # Cohere2-MoE: Cohere2's interleaved RoPE on the sliding layers (and the dense prefix), NoPE elsewhere
    # DeepSeek-V3.2 and GLM-5 (GLM-MoE-DSA): DeepSeek-V3's MLA (interleaved pairs, always) and the
    # lightning indexer, whose RoPE is the layer's own tables on its first qk_rope_head_dim dimensions
    _family("deepseek_v32", layout="interleaved", defaults={"rope_theta": 10000.0, "qk_rope_head_dim": 64},
            layer_types=indexed_layer_types, span=indexed_span, encoding=deepseek_v2_rope, prepare=dsa_check, tables="deinterleaved_cos_sin",
            head_dim="qk_head_dim"),
    _family("glm_moe_dsa", layout="interleaved", defaults={"rope_theta": 10000.0, "qk_rope_head_dim": 64},
            layer_types=indexed_layer_types, span=indexed_span, encoding=deepseek_v2_rope, prepare=dsa_check, tables="deinterleaved_cos_sin",
            head_dim="qk_head_dim"),
    # A.X K1: DeepSeek-V3's MLA (rope_interleave, default true); A.X K2: DeepSeek-V3.2's MLA and indexer
    _family("axk1", layout="interleaved", defaults={"rope_theta": 10000.0, "qk_rope_head_dim": 64, "rope_interleave": True},
            encoding=deepseek_rope, prepare=deepseek_check, interleaved_key="rope_interleave",
            interleaved_tables="deinterleaved_cos_sin", head_dim="qk_head_dim"),
    _family("axk2", layout="interleaved", defaults={"rope_theta": 10000.0, "qk_rope_head_dim": 32},
            layer_types=indexed_layer_types, span=indexed_span, encoding=deepseek_v2_rope, prepare=dsa_check,
            tables="deinterleaved_cos_sin", head_dim="qk_head_dim"),
    # Hy V4: MLA with half-split RoPE on qk_rope_head_dim, the DSA indexer (half-split), learned sinks
    _family("hy_v4", defaults={"rope_theta": 10000.0, "qk_rope_head_dim": 64},
            layer_types=indexed_layer_types, span=indexed_span, encoding=deepseek_v2_rope, prepare=dsa_check,
            head_dim="qk_head_dim", sinks="sinks"),
    # Bailing (Ling) hybrid: MLA layers (interleaved RoPE on qk_rope_head_dim) among linear-attention layers
    _family("bailing_hybrid", layout="interleaved",
            defaults={"rope_theta": 6_000_000.0, "qk_rope_head_dim": 64, "layer_group_size": 6},
            layer_types=group_layer_types, span=hybrid_span, encoding=mla_attention_layers_rope, prepare=deepseek_check,
            tables="deinterleaved_cos_sin", head_dim="qk_head_dim"),
    # Hy V3 (Hunyuan 3): Llama's RoPE, theta 11158840 and head_dim 128 by default
    _family("hy_v3", defaults={"rope_theta": 11_158_840.0, "head_dim": 128}),
    # DeepSeek-V4: compressed KV branches with their own RoPE at compressed positions: refused by name
    _refused("deepseek_v4", "DeepSeek-V4's attention layers (layer_types sliding_attention, compressed_sparse_attention, "
        "heavily_compressed_attention) merge a sliding-window branch with compressed key/value branches "
        "(compress_rates) rotated at compressed positions by a RoPE of their own (compress_rope_theta, the rope "
        "dict's 'compress' entry); no posenc encoding models compressed-position attention (the layers' own "
        "rotation, q, k and v rotated and the output turned back, is posenc.VORoPE: build it by hand)"),
    # Granite Docling: a Granite-like text model (Llama's RoPE) at model.text_model
    _family("granite_docling_text", defaults={"rope_theta": 10000.0}, source="transformers/models/granite_docling/"),
    _family("granite_docling", text_config="granite_docling_text", base="model.text_model", sizes_config="text_config"),
    # DiffusionGemma: a block-diffusion model (it denoises a canvas of tokens, not a causal decoder)
    _refused("diffusion_gemma", "DiffusionGemma denoises a canvas of tokens (DiffusionGemmaForBlockDiffusion: its decoder attends "
        "bidirectionally over the canvas and the encoder's cached prompt), not a causal decoder"),
    # Cosmos 3 Edge: Qwen3-VL's interleaved M-RoPE (default [24, 20, 20]), theta 1e8, at model.language_model
    _family("cosmos3_edge_text", defaults={"rope_theta": 100_000_000.0, "head_dim": 128}, encoding=qwen3_vl_rope,
            source="transformers/models/cosmos3_edge/"),
    _family("cosmos3_edge", text_config="cosmos3_edge_text", **_QWEN_VL_MODULES),
    # HyperCLOVA X Vision v2: a HyperCLOVA X decoder (text positions) at model.language_model
    _family("hyperclovax_vision_v2", text_config="hyperclovax", base="model.language_model", sizes_config="text_config"),
    # DeepSeek-OCR 2: a DeepSeek-V2-MoE text model with Llama's attention and RoPE (no MLA)
    _family("deepseek_ocr2_text", defaults={"rope_theta": 10000.0}, source="transformers/models/deepseek_ocr2/"),
    _family("deepseek_ocr2", text_config="deepseek_ocr2_text", base="model.language_model", sizes_config="text_config"),
    # Gemma 4 Unified: Gemma 4's text model (two rope dicts, global head width), window 1024 by default
    _family("gemma4_unified_text", **{**_GEMMA4_TEXT, "defaults": {"head_dim": 256, "sliding_window": 1024}},
            source="transformers/models/gemma4_unified/"),
    _family("gemma4_unified", text_config="gemma4_unified_text"),
    # Multimodal RoPEs whose axis layout no posenc encoding builds (on text positions both are RoPE)
    _refused("hunyuan_vl", "HunYuan-VL's XD-RoPE (HunYuanVLRotaryEmbedding.recomposition_frequencies) assigns the M-RoPE axes over the "
        "duplicated frequency vector cat(freqs, freqs) in blocks of 2 x mrope_section, so the two halves of a rotary "
        "pair can take different axes; posenc's MRoPE assigns one axis per pair"),
    _refused("ernie4_5_vl_moe", "ERNIE 4.5 VL's 3D RoPE (Ernie4_5_VLMoeTextRotaryEmbedding) alternates the height and width axes pair by pair "
        "over the first mrope_section[0] + mrope_section[1] pairs and puts time on the last mrope_section[2]; "
        "posenc's MRoPE lays the axes in sections (Qwen2-VL) or T H W cycles (Qwen3-VL), not that layout"),
    # Flint: gpt-oss's sinks; RoPE on the sliding layers only, the full layers NoPE
    _family("flint", defaults={"rope_theta": 10000.0, "head_dim": 128, "sliding_window": 513},
            layer_types=flint_layer_types, encoding=sliding_layers_rope, sinks="sinks"),
    # Dory: a rope dict per layer type (1e4 sliding, 1e7 full), RoPE on every layer; its recurrent
    # block runs its layers n_recurrent_loops times at the same positions; its layers are not handed
    # position_ids (the tables' positions are the rotary module's input)
    _family("dory", defaults={"head_dim": 256, "sliding_window": 1024},
            layer_types=lambda r: r.explicit_layer_types() or [
                "full_attention" if (i + 1) % 4 == 0 else "sliding_attention"
                for i in range(r.positive_int("num_hidden_layers"))],
            prepare=dory_prepare, rotary_positions=True),
    _family("cohere2_moe", layout="interleaved",
            defaults={"rope_theta": 10000.0, "head_dim": 128, "sliding_window": 4096, "sliding_window_pattern": 4,
                      "prefix_dense_sliding_window_pattern": 1},
            layer_types=cohere2_moe_layer_types, span=exaone4_span, encoding=cohere2_moe_rope),
    # -- issue 34, list B
    # Qwen2-MoE: Qwen2's RoPE; with use_sliding_window every other layer below max_window_layers slides
    _family("qwen2_moe", defaults={"rope_theta": 10000.0, "sliding_window": 4096, "max_window_layers": 28,
                                   "use_sliding_window": False},
            layer_types=qwen2_moe_layer_types, span=qwen2_span),
    _family("olmo", defaults={"rope_theta": 10000.0}),
    _family("olmoe", defaults={"rope_theta": 10000.0}),
    _family("solar_open", defaults={"rope_theta": 1_000_000.0, "head_dim": 128}),
    # Nemotron: partial RoPE, partial_rotary_factor 0.5 unless the config says otherwise
    _family("nemotron", defaults={"rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
    _family("nanochat", defaults={"rope_theta": 10000.0}, prepare=nanochat_refusal),
    # NemotronH: Mamba 2, attention, MLP and MoE blocks by a pattern, all under "mixer"; its
    # attention applies no positions (NoPE) and the model builds no rotary module
    _family("nemotron_h", prepare=nemotron_h_prepare, layer_types=lambda r: r.cfg["layer_types"], span=hybrid_span,
            encoding=no_positions, attention="mixer", rotary=None),
    # Jamba: Mamba layers with an attention layer every attn_layer_period-th; no positions in attention
    _family("jamba", defaults={"attn_layer_period": 8, "attn_layer_offset": 4}, prepare=nope_hybrid_note,
            layer_types=period_layer_types, span=hybrid_span, encoding=no_positions, rotary=None),
    # Zamba: Mamba layers and "hybrid" layers whose shared attention block has no positions
    _family("zamba", prepare=nemotron_h_prepare, layer_types=lambda r: r.cfg["layer_types"], span=hybrid_span,
            encoding=no_positions, attention="shared_transf.self_attn", rotary=None, head_dim="head_dim"),
    # Zamba2: the shared attention blocks take RoPE only with use_mem_rope
    _family("zamba2", defaults={"rope_theta": 10000.0}, prepare=block_types_prepare,
            layer_types=lambda r: r.cfg["layer_types"], span=hybrid_span, encoding=zamba2_rope,
            attention="shared_transformer.self_attn"),
    # Kimi Linear: KDA linear attention and MLA layers without positions (NoPE)
    _family("kimi_linear", prepare=nope_hybrid_note, layer_types=kimi_linear_layer_types, span=hybrid_span,
            encoding=no_positions, rotary=None, head_dim="qk_head_dim"),
    # the DeepSeek-V3 MLA copies: RoPE on qk_rope_head_dim, interleaved with rope_interleave (default true)
    _family("sarvam_mla", layout="interleaved",
            defaults={"rope_theta": 10000.0, "qk_rope_head_dim": 64, "rope_interleave": True},
            encoding=deepseek_rope, prepare=deepseek_check, interleaved_key="rope_interleave",
            interleaved_tables="deinterleaved_cos_sin", head_dim="qk_head_dim"),
    _family("youtu", layout="interleaved",
            defaults={"rope_theta": 10000.0, "qk_rope_head_dim": 64, "rope_interleave": True},
            encoding=deepseek_rope, prepare=deepseek_check, interleaved_key="rope_interleave",
            interleaved_tables="deinterleaved_cos_sin", head_dim="qk_head_dim"),
    _family("mistral4", layout="interleaved",
            defaults={"rope_theta": 10000.0, "qk_rope_head_dim": 64, "rope_interleave": True},
            encoding=deepseek_rope, prepare=mistral4_prepare, interleaved_key="rope_interleave",
            interleaved_tables="deinterleaved_cos_sin", head_dim="qk_head_dim"),
    # MiniCPM3: MLA, RoPE on qk_rope_head_dim in half-split pairs
    _family("minicpm3", defaults={"rope_theta": 10000.0, "qk_rope_head_dim": 32}, encoding=mla_half_split_rope,
            prepare=deepseek_check, head_dim="qk_head_dim"),
    # Sarvam-MoE: GLM-4.5's class with the whole head rotated (partial_rotary_factor 1.0), theta 8e6
    _family("sarvam_moe", defaults={"rope_theta": 8_000_000.0, "head_dim": 64, "partial_rotary_factor": 1.0}),
    # the sliding / full hybrids with one rope dict per layer type (their config classes' defaults)
    _family("laguna", defaults={"sliding_window": 512, "head_dim": 128}, prepare=default_rope_dict(LAGUNA_ROPE),
            layer_types=rule_layer_types(lambda i, n: "full_attention"), encoding=typed_rope,
            scaled_layer_types=("full_attention",)),
    _family("mimo_v2_flash", defaults={"sliding_window": 129, "head_dim": 192}, prepare=mimo_v2_prepare,
            layer_types=rule_layer_types(lambda i, n: "full_attention" if i == 0 or not (i + 1) % 6
                                         else "sliding_attention"), encoding=typed_rope,
            scaled_layer_types=("full_attention",)),
    # Kolibri 1: "global NoPE" as EXAONE 4 (its full layers apply no rotary when there is a window)
    _family("kolibri1", defaults={"rope_theta": 10000.0, "sliding_window": 513, "head_dim": 128},
            layer_types=rule_layer_types(lambda i, n: "full_attention" if (i + 1) % 5 == 0 else "sliding_attention"),
            encoding=exaone4_rope),
    # LFM3: short convolutions, sliding layers (theta 1e4) and full layers (proportional, a half of the head)
    _family("lfm3", defaults={"sliding_window": 256, "head_dim": 128}, prepare=default_rope_dict(LFM3_ROPE), span=hybrid_span, encoding=typed_rope,
            layer_types=rule_layer_types(lambda i, n: "full_attention" if i % 4 == 2 else
                                         "sliding_attention" if i % 4 == 0 and i > 0 else "conv"),
            scaled_layer_types=("full_attention",)),
    # OLMo Hybrid and LARA Mini: Gated DeltaNet layers (no positions) beside RoPE attention layers
    _family("olmo_hybrid", defaults={"rope_theta": 10000.0}, layer_types=olmo_hybrid_layer_types, span=hybrid_span,
            encoding=typed_rope),
    # (LARA Mini's full-attention layers are NoPE: its model hands RoPE to the sliding layers only)
    _family("lara_mini", defaults={"rope_theta": 10000.0, "sliding_window": 512, "head_dim": 128},
            layer_types=rule_layer_types(lambda i, n: LARA_MINI_PATTERN[i % len(LARA_MINI_PATTERN)]), span=hybrid_span,
            encoding=lambda r, i, t: r.rope(None) if t == "sliding_attention" else None),
    # Qwen4-Exp: Gated DeltaNet layers and indexed (sparse) attention layers, refused by name
    # (its config class renames a checkpoint's full_attention layers indexed_attention: every softmax layer is indexed)
    _family("qwen4_exp_text", defaults={"rope_theta": 10000.0, "head_dim": 256}, prepare=qwen4_exp_refusal,
            layer_types=lambda r: r.explicit_layer_types() or ["full_attention"] * r.positive_int("num_hidden_layers"),
            span=hybrid_span, encoding=typed_rope, source="transformers/models/qwen4_exp/"),
    _family("qwen4_exp", text_config="qwen4_exp_text", base="model.language_model", sizes_config="text_config"),
    # MiniMax-M3's text model: RoPE over the rope dict's share of the head; its sparse layers refused
    _family("minimax_m3_vl_text", defaults={"rope_theta": 5_000_000.0, "head_dim": 128}, prepare=minimax_m3_prepare,
            layer_types=lambda r: r.explicit_layer_types() or ["full_attention"] * r.positive_int("num_hidden_layers"),
            source="transformers/models/minimax_m3_vl/"),
    _family("minimax_m3_vl", text_config="minimax_m3_vl_text", base="model.language_model", sizes_config="text_config"),
    # ModernBERT-decoder: global layers (theta 160000) every third, sliding ones (local_attention // 2, theta 10000)
    _family("modernbert-decoder", prepare=modernbert_decoder_prepare, layer_types=modernbert_decoder_layer_types,
            attention="attn", scaled_layer_types=("full_attention",),
            source="transformers/models/modernbert_decoder/"),
    # ZAYA: compressed convolutional attention, one rope dict per layer type (hybrid, hybrid_sliding)
    _family("zaya", defaults={"head_dim": 128, "sliding_window": None}, prepare=zaya_prepare,
            layer_types=lambda r: r.explicit_layer_types() or ["hybrid"] * r.positive_int("num_hidden_layers"),
            span=zaya_span, encoding=rope_of_type, scaled_layer_types=("hybrid",), rotary_positions=True),
    # Mistral Large 4: sparse attention by a learned indexer on every layer, refused by name
    _family("mistral_large4_text", prepare=mistral_large4_refusal, source="transformers/models/mistral_large4/"),
    _family("mistral_large4", text_config="mistral_large4_text", base="model.language_model", sizes_config="text_config"),
    # Muse Glimmer: RoPE or NoPE per layer (layer_rope_theta 0), sliding / full layer types
    _family("muse_glimmer_text", defaults={"head_dim": 128, "sliding_window": 2048},
            layer_types=rule_layer_types(lambda i, n: "full_attention" if (n - 1 - i) % 4 == 0 else "sliding_attention"),
            encoding=nope_where_theta_zero_rope, source="transformers/models/muse_glimmer/"),
    _family("muse_glimmer", text_config="muse_glimmer_text", base="model.language_model", sizes_config="text_config"),
    # MiniMax-Text-01: lightning attention (no positions) and softmax attention with RoPE on the whole head
    _family("minimax", defaults={"rope_theta": 1_000_000.0, "sliding_window": None},
            layer_types=minimax_layer_types, span=minimax_span, prepare=minimax_prepare,
            encoding=attention_layers_rope),
    # -- issue 34, the rest
    # Mellum: Qwen3-MoE's attention (half-split RoPE) in Laguna's model: one rope dict per layer type
    # (full 5e5, sliding 1e4 by default), every layer full unless layer_types says otherwise
    _family("mellum", defaults={"sliding_window": 1024, "head_dim": 128}, prepare=default_rope_dict(MELLUM_ROPE),
            layer_types=rule_layer_types(lambda i, n: "full_attention"), encoding=typed_rope,
            scaled_layer_types=("full_attention",)),
    _refused("longcat_flash", "two attention modules per decoder layer (LongcatFlashDecoderLayer.self_attn: a "
             "ModuleList of two LongcatFlashMLA, cache layers 2i and 2i + 1), which posenc's one route per layer does "
             "not reach"),
    _refused("beam", "its full-attention layers are NoPE with a scalable-softmax query scale (1 + (position + 1) / "
             "2048) ** 0.1 (compute_attention_scaling, applied in BeamAttention), which posenc's query temperature "
             "(Llama 4's log1p(floor((position + 1) / floor_scale)) formula) does not model"),
    _refused("hrm_text", "hierarchical recurrence: its L and H stacks (HrmTextStack, num_layers_per_stack layers "
             "each) run H_cycles x (L_cycles + 1) times, so num_hidden_layers counts attention calls, not layer "
             "modules; with prefix_lm the token_type_ids block attends bidirectionally"),
    _refused("unlimited_ocr_text", "reference sliding-window attention (create_reference_sliding_window_causal_mask): "
             "every token attends to the last sliding_window tokens and to all image and prompt tokens, a span "
             "posenc's full / sliding / chunked spans do not model", folder="unlimited_ocr"),
    _family("unlimited_ocr", text_config="unlimited_ocr_text", base="model.language_model", sizes_config="text_config"),
    # Muse Spark's text model: Muse Glimmer's (MuseSparkTextModel(MuseGlimmerTextModel)): RoPE or NoPE per layer by
    # layer_rope_theta, sliding / full layer types; its attention adds a query scale and an output norm and gate
    _family("muse_spark_text", defaults={"rope_theta": 500_000.0, "head_dim": 64, "sliding_window": 2048},
            layer_types=rule_layer_types(lambda i, n: "full_attention" if (n - 1 - i) % 4 == 0 else "sliding_attention"),
            encoding=nope_where_theta_zero_rope, source="transformers/models/muse_spark/"),
    _family("muse_spark", text_config="muse_spark_text", base="model.language_model", sizes_config="text_config"),
    # Phi-4-multimodal: Phi-3's model (Phi4MultimodalModel(Phi3Model)) with its towers; its rope dict's
    # partial_rotary_factor (default 1.0) and longrope ("su" / "yarn" read as longrope) as Phi-3's
    _family("phi4_multimodal", defaults={"rope_theta": 10000.0, "sliding_window": None}, span=span_all_sliding,
            prepare=phi3_prepare),
    # Molmo2's text model: half-split RoPE, scaled on rope_scaling_layers only (the same theta unscaled elsewhere)
    _family("molmo2_text", defaults={"rope_theta": 10000.0, "head_dim": 128}, encoding=molmo2_rope,
            source="transformers/models/molmo2/"),
    _family("molmo2", text_config="molmo2_text", base="model.language_model", sizes_config="text_config"),
    _refused("pp_formulanet", "a vision encoder-decoder whose text decoder reads a learned table with an offset of 2 "
             "rows (PPFormulaNetLearnedPositionalEmbedding, rows at position_ids + 2); posenc's learned-table "
             "adapters serve GPT-2's wpe and OPT's embed_positions only"),
    _refused("pi0", "a vision-language-action model: a PaliGemma VLM (vlm) and a flow-matching action expert (dit, "
             "timestep-conditioned by PI0ActionTimeEmbedding) predict continuous actions, not tokens; no text decoder "
             "whose positions a plan drives"),
    _refused("blt", "byte latent transformer: a byte-level local encoder and decoder (BltLocalEncoder, BltLocalDecoder, "
             "joined to the patches by BltCrossAttention) around a global transformer over dynamic patches, each "
             "with positions of its own (bytes, patches); not one decoder's layers"),
)}


def reads_plainly(config: Mapping[str, Any]) -> bool:
    """Whether :func:`posenc.hf_config.rope.read_hf_config` alone reads this config's RoPE
    exactly: its family is half-split, without aliases, a text_config or a reader of its own
    (Llama, Mistral, Qwen, Gemma 1/2, Phi, OLMo 2, ...)."""
    family = FAMILIES.get(config.get("model_type"))
    return (family is not None and family.reader is None and family.refused is None and family.layout == "half-split" and not family.aliases
            and family.text_config is None and family.encoding is rope_of_type and family.prepare is None
            and not _rope_defaults_needed(config, family))


#: The config keys whose class default changes the RoPE itself (a family default of one of them
#: that the config lacks must be applied: Seed-OSS's head_dim 128, PhiMoE's theta 1e6, ...).
_ROPE_DEFAULT_KEYS = ("rope_theta", "head_dim", "partial_rotary_factor")


def _rope_defaults_needed(config: Mapping[str, Any], family: Family) -> bool:
    """Whether the family's defaults change this config's RoPE: a default (other than theta 10000,
    read_hf_config's own) of a key in :data:`_ROPE_DEFAULT_KEYS` that neither the config nor its
    rope dict gives."""
    resolved, _ = rope_dict_spellings(config)
    params = resolved.get("rope_parameters") or resolved.get("rope_scaling")
    params = params if isinstance(params, Mapping) else {}
    for key in _ROPE_DEFAULT_KEYS:
        if key not in family.defaults or config.get(key) is not None or params.get(key) is not None:
            continue
        if key == "rope_theta" and family.defaults[key] == 10000.0:
            continue
        if key == "head_dim" and config.get("hidden_size") is None:
            continue
        return True
    return False


def plan_for_one_rope(config: Mapping[str, Any]) -> PositionPlan:
    """:func:`position_plan` of a config that may lack ``num_hidden_layers`` (the RoPE of a
    layer type does not depend on it): then as many layers as it takes to meet every layer
    type of the family's patterns (12)."""
    cfg = dict(config)
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), Mapping) else cfg
    if "num_hidden_layers" not in text and "n_layer" not in text and not any(
            isinstance(text.get(key), (list, tuple)) for key in ("layer_types", "no_rope_layers")):
        text = {**text, "num_hidden_layers": 12}
        cfg = {**cfg, "text_config": text} if text is not cfg and "text_config" in cfg else text
    return position_plan(cfg)


def _as_dict(config: Any) -> dict[str, Any]:
    if isinstance(config, Mapping):
        return dict(config)
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        out = to_dict()
        if isinstance(out, Mapping):
            return dict(out)
    raise InvalidType(f"config must be a config.json dict or a transformers config, got {type(config).__name__}")


#: The ``model_type`` spellings transformers maps to another family (``CONFIG_MAPPING``'s
#: special cases in transformers/models/auto/configuration_auto.py: Falcon's first releases).
MODEL_TYPE_ALIASES: dict[str, str] = {"RefinedWeb": "falcon", "RefinedWebModel": "falcon"}
#: The class-name suffixes of a model's heads, stripped to find its family in ``architectures``.
_HEAD_SUFFIX = re.compile(r"(For[A-Z][A-Za-z]*|LMHeadModel|RewardModel|Model)$")


def family_of_class(class_name: Any) -> str | None:
    """The family (a ``model_type`` of :data:`FAMILIES`) whose transformers class is
    ``class_name`` (an ``architectures`` entry: ``"DeepseekV3ForCausalLM"`` -> ``deepseek_v3``,
    ``"GPTNeoXRewardModel"`` -> ``gpt_neox``): the name without its head suffix
    (``For...``, ``LMHeadModel``, ``Model``), compared with the model types without
    underscores, case ignored; None when no family has that name."""
    if not isinstance(class_name, str):
        return None
    stem = _HEAD_SUFFIX.sub("", class_name).lower()
    matches = [model_type for model_type in FAMILIES if model_type.replace("_", "").lower() == stem]
    return matches[0] if len(matches) == 1 else None


def resolve_family(cfg: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The config to read and, when it is read as another ``model_type`` than it says, why.

    A known ``model_type`` is read as it is. Otherwise, in this order: an alias transformers
    maps (``RefinedWeb`` / ``RefinedWebModel`` -> ``falcon``); the family of the class its
    ``architectures`` names (Kimi K2's ``kimi_k2`` with ``DeepseekV3ForCausalLM``, a
    ``gpt_neox_reward_model`` with ``GPTNeoXRewardModel``); a wrapper whose ``text_config``
    has a known ``model_type`` (LLaVA's ``llava`` around a Llama): its text model, whose
    positions are the decoder's. The second item names both types (position_plan warns it
    and keeps it in the plan's notes); a config none of these resolves is returned as it is.
    """
    model_type = cfg.get("model_type")
    if model_type in FAMILIES:
        return cfg, None
    if model_type in MODEL_TYPE_ALIASES:
        target = MODEL_TYPE_ALIASES[model_type]
        return {**cfg, "model_type": target}, (f"model_type {model_type!r} read as {target!r} (transformers maps "
                                               f"{model_type!r} to {target!r})")
    architectures = cfg.get("architectures")
    if isinstance(architectures, list):
        for class_name in architectures:
            target = family_of_class(class_name)
            if target is not None:
                return {**cfg, "model_type": target}, (
                    f"model_type {model_type!r} is not a family posenc reads; read as {target!r}, the family of "
                    f"its architectures class {class_name!r}")
    text = cfg.get("text_config")
    if isinstance(text, Mapping) and text.get("model_type") in FAMILIES:
        target = text["model_type"]
        return dict(text), (f"model_type {model_type!r} is not a family posenc reads; read as its text model, "
                            f"text_config's {target!r} (the positions of its decoder)")
    return cfg, None


def reads_model_type(model_type: Any) -> bool:
    """True when :func:`position_plan` reads the family ``model_type``: it has a record, and the
    record does not refuse it (:attr:`Family.refused`)."""
    family = FAMILIES.get(model_type)
    return family is not None and family.refused is None


def position_plan(config: Any) -> PositionPlan:
    """The per-layer position plan of a Hugging Face model config.

    Reads a parsed ``config.json`` (no transformers import) or a transformers config object
    (its ``to_dict()``), in every spelling in use: v4 ``rope_scaling`` (``type`` or
    ``rope_type``), v5 ``rope_parameters`` (flat or per layer type), the top-level keys, a
    nested ``text_config``. The family (:data:`FAMILIES`, by ``model_type``) decides what the
    config does not say: the pair layout (interleaved or half-split) and the config class's
    defaults. Each layer gets the encoding transformers 5.24 builds for it (a
    :class:`~posenc.RoPE` in the family's layout, with rotary width, base and scaling; an
    :class:`~posenc.MRoPE` for the Qwen-VL text towers; Llama 4's query temperature on its
    NoPE layers; None for a NoPE layer), its span (full, sliding W, chunked C) and sinks.
    Layers of one kind share one encoding object.

    Where two spellings disagree (``rope_scaling`` and ``rope_parameters``, GPT-NeoX's
    ``rotary_emb_base`` and ``rope_theta``), the plan follows what transformers builds and says
    so in :attr:`PositionPlan.notes` and a ``warnings.warn``.

    Returns:
        A :class:`~posenc.plan.PositionPlan`, one layer per decoder layer.

    Every number is read through :mod:`posenc.hf_config.values` (one set of checks for every
    family), bounded before anything is allocated: head widths <= 65536, positions and windows
    <= 2^31, ``num_hidden_layers`` and heads <= 65536, a learned table (GPT-2, OPT, T5) <= 2^30
    values (docs/errors.md, "Malformed configs").

    Raises:
        InvalidType: config neither a dict nor a transformers config; a number given as a
            string, a bool or a float where an int is needed.
        MissingKey: no ``model_type``, a missing key the family needs (``num_hidden_layers``,
            ``hidden_size`` / ``num_attention_heads``, GPT-J's ``rotary_dim``, a wrapper's
            ``text_config``), named.
        InvalidArgument: an unknown ``model_type`` (the message lists the ones read), a family
            its record refuses (:attr:`Family.refused`: the message names the positional feature
            posenc does not model), a bad value (named), or a config posenc cannot read exactly.
    """
    cfg, resolution = resolve_family(_as_dict(config))
    model_type = cfg.get("model_type")
    if model_type is None:
        raise MissingKey("config: needs 'model_type' (the family decides the layout and the defaults)")
    family = FAMILIES.get(model_type)
    if family is None:
        raise InvalidArgument(f"config['model_type'] = {model_type!r}: posenc reads "
                              f"{sorted(name for name in FAMILIES if reads_model_type(name))}")
    if resolution is not None:
        warnings.warn(f"position_plan: {resolution}", stacklevel=2)
        return _with_note(_plan_of_family(cfg, family), resolution)
    return _plan_of_family(cfg, family)


def _with_note(plan: PositionPlan, note: str) -> PositionPlan:
    return dataclasses.replace(plan, notes=(note, *plan.notes))


def _plan_of_family(cfg: dict[str, Any], family: Family) -> PositionPlan:
    """position_plan of a config whose ``model_type`` is ``family``'s."""
    model_type = family.model_type
    if family.refused is not None:  # known, and outside what posenc models: the record says why
        raise InvalidArgument(f"config ({model_type}): {family.refused}; posenc does not read this family")
    if family.reader is not None:  # the families whose positions are not (only) rotary
        return family.reader(cfg)
    if family.text_config is not None:
        text = cfg.get("text_config")
        if isinstance(text, Mapping):
            cfg = {**dict(text), "model_type": family.text_config}
        elif text is not None and hasattr(text, "to_dict"):
            cfg = {**text.to_dict(), "model_type": family.text_config}
        elif family.flat_text:
            cfg = {**cfg, "model_type": family.text_config}
        else:
            raise MissingKey(f"config ({model_type}): needs 'text_config', where the decoder's positions are")
        family = FAMILIES[family.text_config]
        if family.refused is not None:  # a wrapper around a text model its record refuses (Unlimited-OCR)
            raise InvalidArgument(f"config ({model_type}, text model {family.model_type}): {family.refused}; "
                                  f"posenc does not read this family")
    r = Reading(cfg, family)
    resolved, note = rope_dict_spellings(r.cfg)
    if note is not None and not family.type_thetas:  # there rope_scaling and rope_parameters both hold
        r.note(note, warn=True)
        r.cfg = dict(resolved)
    if family.prepare is not None:
        family.prepare(r)
    num_layers = r.positive_int("num_hidden_layers")
    head_dim_of(r.cfg)  # the head width must be readable (MissingKey naming the keys)
    types = family.layer_types(r) if family.layer_types is not None else None
    softcap = softcap_of(r)
    layers = []
    for index in range(num_layers):
        layer_type = types[index] if types is not None else None
        span, window = family.span(r, index, layer_type)
        encoding = family.encoding(r, index, layer_type)
        layers.append(LayerPlan(encoding, span, window, layer_type=layer_type, sinks=family.sinks is not None,
                                softcap=softcap))
    for text in r.warnings:
        warnings.warn(f"position_plan ({model_type}): {text}", stacklevel=2)
    return PositionPlan(tuple(layers), model_type=model_type, notes=tuple(r.notes))
