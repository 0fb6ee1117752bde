"""Position plans of the Hugging Face families whose positions are not (only) rotary, or whose
attention does not go through transformers' ``AttentionInterface``: Falcon (RoPE, or ALiBi
with ``alibi: true``), BLOOM and MPT (ALiBi), GPT-2, GPTBigCode, OPT and BioGPT (learned absolute tables) and
T5 / mT5 / Switch Transformers / UMT5 (relative buckets, one plan per stack).

One reader per family, ``plan_<model_type>(config) -> PositionPlan``, named by the family's
record (:attr:`posenc.hf_config.families.Family.reader`) in the one family table that
:func:`posenc.hf_config.position_plan` reads. Each reads exactly what transformers 5.24 builds from
the config (its ``configuration_<family>.py`` and ``modeling_<family>.py``):

- a key missing from the config takes the default of the family's transformers config class
  (the family decides; e.g. T5's ``relative_attention_max_distance`` 128, absent from the
  released ``t5-small`` config.json);
- where two spellings of one value disagree (GPT-2's ``n_positions`` and
  ``max_position_embeddings``), the one transformers builds wins (an ``attribute_map`` alias
  is set after the field it names, so the alias wins) and the plan's notes and a
  ``UserWarning`` name both;
- where the config says something transformers does not build (MPT's
  ``attn_config.alibi: false`` or ``alibi_bias_max``, which ``MptModel`` never reads), the
  plan follows transformers and says so in a note and a warning;
- a value it cannot read exactly raises an error naming the key.

Learned tables (GPT-2's ``wpe``, OPT's ``embed_positions``, T5's ``relative_attention_bias``)
are freshly initialised in the plan: the plan states the shapes and conventions; the model's
weights are copied in by the integration that applies the plan.

Plain dicts, no transformers import.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from posenc.encodings.alibi import ALiBi
from posenc.encodings.learned import LearnedAbsolute
from posenc.encodings.t5 import T5RelativeBias
from posenc.errors import InvalidArgument, InvalidType, MissingKey
from posenc.encodings.rope.rotary import RoPE
from posenc.hf_config.rope import read_hf_config
from posenc.plan import LayerPlan, PositionPlan
from posenc.hf_config.values import check_size, check_table

__all__ = ["plan_falcon", "plan_bloom", "plan_mpt", "plan_gpt2", "plan_opt", "plan_t5", "plan_mt5",
           "plan_switch_transformers", "plan_gpt_bigcode", "plan_biogpt", "plan_umt5"]

_NO_DEFAULT = object()


class _Reader:
    """Reads one family's config dict: values by their spellings in transformers' order of
    precedence, the family's defaults, and the notes the plan carries."""

    def __init__(self, config: Any, family: str, model_types: tuple[str, ...]) -> None:
        if not isinstance(config, Mapping):
            raise InvalidType(f"config must be a dict (a parsed config.json or config.to_dict()), got {type(config).__name__}")
        model_type = config.get("model_type")
        if model_type not in (None, "", *model_types):
            raise InvalidArgument(f"config['model_type'] is {model_type!r}; this reader reads {', '.join(model_types)}")
        self.config, self.family, self.notes = config, family, []

    def note(self, text: str, *, warn: bool = False) -> None:
        self.notes.append(text)
        if warn:
            warnings.warn(text, UserWarning, stacklevel=4)

    def value(self, *names: str, default: Any = _NO_DEFAULT, config: Mapping[str, Any] | None = None) -> Any:
        """The value of the first of ``names`` present (not None), names in transformers'
        order of precedence; a warning and a note when another spelling disagrees; the
        default when none is present, or MissingKey naming them."""
        config = self.config if config is None else config
        present = [(name, config[name]) for name in names if config.get(name) is not None]
        if not present:
            if default is _NO_DEFAULT:
                raise MissingKey(f"config: {self.family} needs {' or '.join(repr(n) for n in names)}")
            return default
        name, value = present[0]
        for other, other_value in present[1:]:
            if other_value != value:
                self.note(f"config has {name}={value!r} and {other}={other_value!r}; transformers' {self.family} "
                          f"builds {name}={value!r} (the plan follows it)", warn=True)
        return value

    def positive_int(self, *names: str, default: Any = _NO_DEFAULT, config: Mapping[str, Any] | None = None) -> int:
        """:meth:`value` as a size: an int in [1, the key's bound] (:mod:`posenc.hf_config.values`)."""
        value = self.value(*names, default=default, config=config)
        present = next((name for name in names if (self.config if config is None else config).get(name) is not None),
                       names[0])
        return check_size(value, f"config[{present!r}]", key=present)

    def flag(self, name: str, default: bool, config: Mapping[str, Any] | None = None) -> bool:
        value = (self.config if config is None else config).get(name, default)
        value = default if value is None else value
        if not isinstance(value, bool):
            raise InvalidType(f"config[{name!r}] must be true or false, got {value!r}")
        return value

    def refuse_unread(self, key: str, instead: str) -> None:
        """A key transformers' config class does not read, where the one it reads is absent:
        transformers would build its default instead of what the key says."""
        if self.config.get(key) is not None and self.config.get(instead) is None:
            raise MissingKey(f"config: {self.family} has {key!r}, which transformers' config class does not read "
                             f"(it would build its default {instead}); set {instead!r}")

    def plan(self, layers: list[LayerPlan], **kwargs: Any) -> PositionPlan:
        return PositionPlan(tuple(layers), model_type=self.config.get("model_type") or self.family, notes=tuple(self.notes),
                            **kwargs)


# ---------------------------------------------------------------------------------------------
# Falcon (transformers/models/falcon)


def plan_falcon(config: Mapping[str, Any]) -> PositionPlan:
    """Falcon's plan (``FalconConfig``, ``FalconModel``): RoPE on every layer, or ALiBi with
    ``alibi: true``; full spans.

    - Sizes: ``hidden_size`` (the old ``n_embed`` wins where both are given, as FalconConfig
      sets it after), ``num_attention_heads`` (default 71), ``num_hidden_layers`` (32);
      head_dim is always hidden_size // num_attention_heads (a FalconConfig property: a
      ``head_dim`` key that differs is refused, as FalconConfig refuses any). The old
      RefinedWeb keys ``n_head`` and ``n_layer`` are not read by FalconConfig: refused.
    - Rotary (``alibi`` false, the default): the plain :func:`~posenc.hf_config.from_hf_config` of the
      config (``rope_parameters`` / ``rope_theta`` / ``rope_scaling``), half-split pairs
      (``rotate_half``), the whole head rotated: Falcon's default rope init ignores
      ``partial_rotary_factor`` (dropped with a warning; refused with another rope_type, where
      transformers' rope init would read it and the rotation would not fit the head).
    - ALiBi (``alibi`` true): ``build_alibi_tensor`` of modeling_falcon: BLOOM's float32
      slopes, cast to bfloat16 and multiplied by the key positions in bfloat16 (whatever the
      model's dtype), then divided by sqrt(head_dim) (added to q.k before its 1/sqrt(head_dim)
      in eager, to the scaled logits in sdpa): ``ALiBi(H, slopes="bloom",
      slope_dtype="bfloat16", scale=head_dim ** -0.5)``. Positions come from the attention
      mask (``cumsum - 1``, padding 0), so left padding shifts every row by a constant. No
      rotary then (``FalconConfig.rotary = not alibi``).

    Raises:
        InvalidType: config not a dict, a non-bool ``alibi``. InvalidArgument: another
        model_type, a size that is not a positive int, hidden_size not divisible by the heads,
        a ``head_dim`` that differs. MissingKey: ``n_head`` / ``n_layer`` without
        ``num_attention_heads`` / ``num_hidden_layers``. And as :func:`from_hf_config`.
    """
    r = _Reader(config, "falcon", ("falcon",))
    r.refuse_unread("n_head", "num_attention_heads")
    r.refuse_unread("n_layer", "num_hidden_layers")
    hidden = r.positive_int("n_embed", "hidden_size", default=4544)
    heads = r.positive_int("num_attention_heads", default=71)
    num_layers = r.positive_int("num_hidden_layers", default=32)
    if hidden % heads:
        raise InvalidArgument(f"config: falcon's hidden_size {hidden} is not divisible by num_attention_heads {heads}")
    head_dim = hidden // heads
    if config.get("head_dim") is not None and config["head_dim"] != head_dim:
        raise InvalidArgument(f"config['head_dim'] is {config['head_dim']!r}; transformers' FalconConfig derives "
                              f"head_dim = hidden_size // num_attention_heads = {head_dim} and refuses the key")
    if r.flag("alibi", False):
        encoding = ALiBi(heads, slopes="bloom", slope_dtype="bfloat16", scale=head_dim ** -0.5)
        r.note("falcon alibi: BLOOM's slopes and their products with the key positions rounded to bfloat16 "
               f"(build_alibi_tensor), divided by sqrt(head_dim) = sqrt({head_dim}); positions from the attention "
               "mask (cumsum - 1); no rotary")
        rope = config.get("rope_parameters") or config.get("rope_scaling")
        if isinstance(rope, Mapping) and rope.get("rope_type", rope.get("type", "default")) != "default":
            r.note(f"config has alibi=true and a {rope.get('rope_type', rope.get('type'))} rope dict; transformers' "
                   "falcon applies no rotary with alibi (the plan follows it)", warn=True)
        return r.plan([LayerPlan(encoding) for _ in range(num_layers)])
    rope_config = {key: value for key, value in config.items() if key not in ("n_embed", "head_dim")}
    rope_config.update(hidden_size=hidden, num_attention_heads=heads, head_dim=head_dim,
                       max_position_embeddings=2048 if config.get("max_position_embeddings") is None
                       else config["max_position_embeddings"])
    rope_config, dropped = _drop_partial_rotary(rope_config)
    if dropped is not None:
        rope_type = _rope_type(rope_config)
        if rope_type != "default":
            raise InvalidArgument(f"config: falcon with rope_type {rope_type!r} and partial_rotary_factor={dropped!r}: "
                                  "transformers' rope init would rotate part of the head, its rotation the whole one")
        r.note(f"config has partial_rotary_factor={dropped!r}; transformers' falcon rotates the whole head "
               "(its default rope init does not read it; the plan follows it)", warn=True)
    # the plain reading of from_hf_config (falcon has no family-specific RoPE keys), written
    # out here: hf_config.encoding routes from_hf_config through this module's table
    rope_kwargs, layout = read_hf_config(rope_config)
    encoding = RoPE(**rope_kwargs, hf_layout=layout, max_position_embeddings=rope_config.get("max_position_embeddings"))
    return r.plan([LayerPlan(encoding) for _ in range(num_layers)])


def _drop_partial_rotary(config: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """The config without ``partial_rotary_factor`` (top level, and in the rope dict), and the
    value dropped (None when absent or 1)."""
    dropped = config.pop("partial_rotary_factor", None)
    for key in ("rope_parameters", "rope_scaling"):
        if isinstance(config.get(key), Mapping) and "partial_rotary_factor" in config[key]:
            inner = dict(config[key])
            dropped = inner.pop("partial_rotary_factor")
            config[key] = inner
    return config, None if dropped in (None, 1, 1.0) else dropped


def _rope_type(config: Mapping[str, Any]) -> str:
    for key in ("rope_parameters", "rope_scaling"):
        rope = config.get(key)
        if isinstance(rope, Mapping):
            return rope.get("rope_type", rope.get("type", "default"))
    return "default"


# ---------------------------------------------------------------------------------------------
# BLOOM (transformers/models/bloom)


def plan_bloom(config: Mapping[str, Any]) -> PositionPlan:
    """BLOOM's plan (``BloomConfig``, ``BloomModel``): ALiBi on every layer, full spans.

    ``build_alibi_tensor`` / ``_get_alibi_slopes`` of modeling_bloom: Press et al.'s slopes,
    the non-power-of-two rule included (the n0 slopes of the largest power of two n0 <= n,
    then every other slope of 2 n0), in float32 as float32 powers of a float32 base
    (``slopes="bloom"``: a few float32 ulps from posenc's correctly rounded
    :func:`~posenc.alibi_slopes` from 11 heads on); the bias m * j (key position, from the
    attention mask: ``cumsum - 1``, padding 0) is added with ``baddbmm`` to the scaled q.k, as
    posenc adds its biases. In a bfloat16 or float16 model BLOOM casts m * j to the model's
    dtype (a float32 plan is exact in float32 only). Sizes: ``num_attention_heads`` (an alias
    of ``n_head``, winning where both are given; default 8), ``num_hidden_layers`` /
    ``n_layer`` (default 2).

    Raises:
        InvalidType: config not a dict. InvalidArgument: another model_type, a size that is not
        a positive int.
    """
    r = _Reader(config, "bloom", ("bloom",))
    heads = r.positive_int("num_attention_heads", "n_head", default=8)
    num_layers = r.positive_int("num_hidden_layers", "n_layer", default=2)
    encoding = ALiBi(heads, slopes="bloom")
    r.note("bloom alibi: Press's slopes in BLOOM's float32 arithmetic, bias m * j added to the scaled logits; "
           "positions from the attention mask (cumsum - 1)")
    return r.plan([LayerPlan(encoding) for _ in range(num_layers)])


# ---------------------------------------------------------------------------------------------
# MPT (transformers/models/mpt)


def plan_mpt(config: Mapping[str, Any]) -> PositionPlan:
    """MPT's plan (``MptConfig``, ``MptModel``): ALiBi on every layer, full spans.

    ``build_mpt_alibi_tensor`` of modeling_mpt: with n2 = 2^ceil(log2 n), slopes 1 / 2^(8k/n2)
    for k = 1..n2 in float32, and for n < n2 the even k followed by the odd k, cut to n: the
    same slopes as Press's rule (``slopes="mpt"``, a float32 ulp apart above 64 heads). The
    bias is m * (j - (L - 1)) over the last keys of a ``max_seq_len`` table L, added to the
    scaled q.k: -m (i - j) up to a constant per query, which the softmax ignores; positions are
    key indices (the mask plays no part, so left padding shifts every row by a constant). More
    keys than ``max_seq_len`` fail in transformers (the table is that long); posenc's ALiBi has
    no such limit.

    What transformers 5.24 does not read, and the plan follows it, with a warning: ``MptModel``
    calls ``build_mpt_alibi_tensor`` with its default ``alibi_bias_max`` 8 and whatever
    ``attn_config.alibi`` says; it has no learned position table (``learned_pos_emb`` is not
    read). Sizes: ``num_attention_heads`` (an alias of ``n_heads``, winning where both are
    given; default 16), ``num_hidden_layers`` / ``n_layers`` (24).

    Raises:
        InvalidType: config not a dict, ``attn_config`` not a dict, a non-bool flag.
        InvalidArgument: another model_type, a size that is not a positive int.
    """
    r = _Reader(config, "mpt", ("mpt",))
    heads = r.positive_int("num_attention_heads", "n_heads", default=16)
    num_layers = r.positive_int("num_hidden_layers", "n_layers", default=24)
    attn_config = config.get("attn_config") or {}
    if not isinstance(attn_config, Mapping):
        raise InvalidType(f"config['attn_config'] must be a dict, got {type(attn_config).__name__}")
    if not r.flag("alibi", True, config=attn_config):
        r.note("config has attn_config.alibi=false; transformers' MptModel applies ALiBi whatever it says "
               "(the plan follows it)", warn=True)
    bias_max = attn_config.get("alibi_bias_max", 8)
    if bias_max is not None and bias_max != 8:
        r.note(f"config has attn_config.alibi_bias_max={bias_max!r}; transformers' MptModel builds its ALiBi with "
               "alibi_bias_max 8 (it does not pass the config's; the plan follows it)", warn=True)
    if r.flag("learned_pos_emb", True):
        r.note("learned_pos_emb is not read: transformers' MptModel has no position table")
    max_seq_len = config.get("max_seq_len", 2048)
    r.note(f"mpt alibi: bias over the last keys of a max_seq_len={max_seq_len} table, positions are key indices; "
           "transformers fails past max_seq_len keys")
    if attn_config.get("softmax_scale") is not None:
        r.note(f"attn_config.softmax_scale={attn_config['softmax_scale']!r} scales q.k (not the ALiBi bias)")
    encoding = ALiBi(heads, slopes="mpt")
    return r.plan([LayerPlan(encoding) for _ in range(num_layers)])


# ---------------------------------------------------------------------------------------------
# GPT-2 and OPT: learned absolute tables


def plan_gpt2(config: Mapping[str, Any]) -> PositionPlan:
    """GPT-2's plan (``GPT2Config``, ``GPT2Model``): a learned table ``wpe`` of
    ``max_position_embeddings`` x ``hidden_size`` rows added to the token embeddings
    (:attr:`PositionPlan.embedding`, a :class:`~posenc.LearnedAbsolute`), no positions in the
    attention layers. ``max_position_embeddings`` and ``hidden_size`` are GPT2Config's aliases
    of ``n_positions`` and ``n_embd`` and win where both are given (defaults 1024, 768);
    ``num_hidden_layers`` / ``n_layer`` (12). Positions: ``position_ids``, else arange plus the
    cached length (GPT2Model ignores the attention mask; ``generate()`` passes cumsum(mask) - 1).

    Raises:
        InvalidType: config not a dict. InvalidArgument: another model_type, a size that is not
        a positive int.
    """
    return _plan_wpe(config, "gpt2")


def plan_gpt_bigcode(config: Mapping[str, Any]) -> PositionPlan:
    """GPTBigCode's plan (``GPTBigCodeConfig``, ``GPTBigCodeModel``; StarCoder, SantaCoder): GPT-2's
    (:func:`plan_gpt2`): the learned table ``wpe`` (``max_position_embeddings`` x ``hidden_size``,
    aliases of ``n_positions`` and ``n_embd``, defaults 1024 and 768; ``n_layer`` 12) added to the
    token embeddings at ``position_ids``, else arange plus the cached length (the attention mask
    plays no part); no positions in the attention layers, whose multi-query keys and values
    (``multi_query``) go through ``AttentionInterface``.

    Raises:
        InvalidType: config not a dict. InvalidArgument: another model_type, a size that is not
        a positive int.
    """
    return _plan_wpe(config, "gpt_bigcode")


def _plan_wpe(config: Mapping[str, Any], family: str) -> PositionPlan:
    """The plan of a GPT-2-shaped family: a learned table ``wpe``, NoPE attention layers."""
    r = _Reader(config, family, (family,))
    num_positions = r.positive_int("max_position_embeddings", "n_positions", default=1024)
    hidden = r.positive_int("hidden_size", "n_embd", default=768)
    num_layers = r.positive_int("num_hidden_layers", "n_layer", default=12)
    check_table(num_positions, hidden, f"config ({family}): max_position_embeddings x hidden_size")
    r.note(f"{family}: learned table wpe added to the token embeddings; positions arange + cache length "
           "unless position_ids are given")
    return r.plan([LayerPlan() for _ in range(num_layers)], embedding=LearnedAbsolute(num_positions, hidden))


def plan_opt(config: Mapping[str, Any]) -> PositionPlan:
    """OPT's plan (``OPTConfig``, ``OPTModel``): ``OPTLearnedPositionalEmbedding``, a learned
    table of ``max_position_embeddings + 2`` rows of ``hidden_size`` (after ``project_in``
    where ``word_embed_proj_dim`` differs), position p reading row p + 2:
    ``LearnedAbsolute(max_position_embeddings, hidden_size, offset=2)`` as the plan's
    :attr:`~PositionPlan.embedding`. Positions come from the attention mask:
    ``cumsum(mask) * mask - 1``, so padding tokens get position -1 (row 1) and the first real
    token of a left-padded row position 0. No positions in the attention layers. Defaults
    (OPTConfig): 2048 positions, hidden 768, 12 layers.

    Raises:
        InvalidType: config not a dict. InvalidArgument: another model_type, a size that is not
        a positive int.
    """
    return _offset_two_table_plan(config, "opt", (2048, 768, 12),
                                  "learned table with an offset of 2 rows (OPTLearnedPositionalEmbedding); positions "
                                  "from the attention mask (cumsum * mask - 1: padding -1)")


def plan_biogpt(config: Mapping[str, Any]) -> PositionPlan:
    """BioGPT's plan (``BioGptConfig``, ``BioGptModel``): ``BioGptLearnedPositionalEmbedding``, OPT's
    table (``max_position_embeddings + 2`` rows of ``hidden_size``, position p reading row p + 2):
    ``LearnedAbsolute(max_position_embeddings, hidden_size, offset=2)`` as the plan's
    :attr:`~PositionPlan.embedding`, added to the token embeddings (scaled by sqrt(hidden_size)
    with ``scale_embedding``, the model's own business). Unlike OPT, BioGptModel hands the table
    ``position_ids``, else arange plus the cached length (the attention mask plays no part).
    No positions in the attention layers. Defaults (BioGptConfig): 1024 positions, hidden 1024,
    24 layers.

    Raises:
        InvalidType: config not a dict. InvalidArgument: another model_type, a size that is not
        a positive int.
    """
    return _offset_two_table_plan(config, "biogpt", (1024, 1024, 24),
                                  "learned table with an offset of 2 rows (BioGptLearnedPositionalEmbedding); "
                                  "positions arange + cache length unless position_ids are given")


def _offset_two_table_plan(config: Mapping[str, Any], model_type: str, defaults: tuple[int, int, int],
                           note: str) -> PositionPlan:
    """OPT's table shape (OPT, BioGPT): ``max_position_embeddings + 2`` rows of ``hidden_size``,
    position p at row p + 2, as the plan's embedding; no positions in the attention layers.
    ``defaults``: the config class's (positions, hidden size, layers)."""
    r = _Reader(config, model_type, (model_type,))
    num_positions = r.positive_int("max_position_embeddings", default=defaults[0])
    hidden = r.positive_int("hidden_size", default=defaults[1])
    num_layers = r.positive_int("num_hidden_layers", default=defaults[2])
    check_table(num_positions + 2, hidden, f"config ({model_type}): (max_position_embeddings + 2) x hidden_size")
    r.note(f"{model_type}: {note}")
    return r.plan([LayerPlan() for _ in range(num_layers)], embedding=LearnedAbsolute(num_positions, hidden, offset=2))


# ---------------------------------------------------------------------------------------------
# T5 (transformers/models/t5)


#: The defaults of T5Config, MT5Config and SwitchTransformersConfig (transformers 5.24) that a T5
#: plan reads; ``num_decoder_layers`` is the field's default (None: num_layers, in ``__post_init__``).
_T5_DEFAULTS = {"t5": {"num_layers": 6, "num_heads": 8, "num_decoder_layers": None},
                "mt5": {"num_layers": 8, "num_heads": 6, "num_decoder_layers": None},
                "switch_transformers": {"num_layers": 12, "num_heads": 12, "num_decoder_layers": 12},
                "umt5": {"num_layers": 8, "num_heads": 6, "num_decoder_layers": None}}


def plan_t5(config: Mapping[str, Any]) -> PositionPlan:
    """T5's plans (``T5Config``, ``T5Stack``): relative position buckets, computed by the first
    layer of each stack (``compute_bias`` of its ``T5Attention``) and shared by every layer of
    that stack; one learned table (num_buckets, H) per stack. The returned plan is the
    decoder's (``num_decoder_layers`` layers, causal buckets: ``bidirectional=False``), its
    :attr:`~PositionPlan.encoder` the encoder's (``num_layers`` layers, bidirectional buckets).
    Every layer of a stack holds the same :class:`~posenc.T5RelativeBias` instance.
    Cross-attention has no position bias. T5 does not scale q.k by 1/sqrt(d_kv): its bias is
    added to the unscaled product.

    Keys (T5Config defaults): ``num_layers`` (an alias ``num_hidden_layers`` wins; 6),
    ``num_decoder_layers`` (default: the config's ``num_layers``, else 6, even where
    ``num_hidden_layers`` is given, as T5Config sets it before the alias; warned), ``num_heads`` (alias ``num_attention_heads``;
    8), ``relative_attention_num_buckets`` (32), ``relative_attention_max_distance`` (128).

    Raises:
        InvalidType: config not a dict. InvalidArgument: another model_type, a size that is not
        a positive int, buckets and distance T5's formula cannot use.
    """
    return _plan_t5_family(config, "t5")


def plan_mt5(config: Mapping[str, Any]) -> PositionPlan:
    """mT5's plans: T5's (``MT5Stack`` and ``MT5Attention`` are T5's, copied), with MT5Config's
    defaults (8 layers, 6 heads): see :func:`plan_t5`."""
    return _plan_t5_family(config, "mt5")


def plan_switch_transformers(config: Mapping[str, Any]) -> PositionPlan:
    """Switch Transformers' plans: T5's (``SwitchTransformersAttention``'s ``compute_bias`` and
    ``_relative_position_bucket`` are T5's, copied; the first layer of each stack holds the
    table, ``has_relative_attention_bias=bool(i == 0)``; the experts replace feed-forward layers
    only), with SwitchTransformersConfig's defaults: 12 layers, 12 heads, and
    ``num_decoder_layers`` 12 where the config has no such key (the field's default; an explicit
    null is num_layers, as ``__post_init__`` sets it). See :func:`plan_t5`."""
    return _plan_t5_family(config, "switch_transformers")


def plan_umt5(config: Mapping[str, Any]) -> PositionPlan:
    """UMT5's plans: T5's buckets (``UMT5Attention._relative_position_bucket``, T5's formula with
    the settings of the config), but with a table of its own in every self-attention layer
    (``has_relative_attention_bias=True`` on every ``UMT5Block``, each layer computing its own
    bias), so each layer of each stack holds its own :class:`~posenc.T5RelativeBias`; UMT5Config's
    defaults: 8 layers, 6 heads, ``num_decoder_layers`` num_layers. See :func:`plan_t5`."""
    return _plan_t5_family(config, "umt5", per_layer=True)


def _plan_t5_family(config: Mapping[str, Any], family: str, per_layer: bool = False) -> PositionPlan:
    r = _Reader(config, family, (family,))
    defaults = _T5_DEFAULTS[family]
    num_layers = r.positive_int("num_hidden_layers", "num_layers", default=defaults["num_layers"])
    # the config class sets num_decoder_layers from num_layers (when the field is None) before its
    # alias num_hidden_layers is set
    decoder_default = config.get("num_layers") if config.get("num_layers") is not None else defaults["num_layers"]
    field_default = "num_decoder_layers" not in config and defaults["num_decoder_layers"] is not None
    if field_default:
        decoder_default = defaults["num_decoder_layers"]  # the field's own default, not None
    num_decoder_layers = r.positive_int("num_decoder_layers", default=decoder_default)
    if field_default and num_decoder_layers != num_layers:
        r.note(f"config has no num_decoder_layers; transformers' {family} config gives the decoder its field's "
               f"default {num_decoder_layers} layers, not num_layers ({num_layers}) (the plan follows it)", warn=True)
    elif config.get("num_decoder_layers") is None and num_decoder_layers != num_layers:
        r.note(f"config has num_hidden_layers={num_layers} and no num_decoder_layers; transformers' {family} config "
               f"sets num_decoder_layers from num_layers ({num_decoder_layers}) before the alias: the decoder has "
               f"{num_decoder_layers} layers (the plan follows it)", warn=True)
    heads = r.positive_int("num_attention_heads", "num_heads", default=defaults["num_heads"])
    buckets = r.positive_int("relative_attention_num_buckets", default=32)
    max_distance = r.positive_int("relative_attention_max_distance", default=128)
    check_table(buckets, heads, f"config ({family}): relative_attention_num_buckets x num_heads")
    r.note(f"{family}: " + ("a bucket table in every self-attention layer" if per_layer else
                            "one bucket table per stack, computed in its first layer and shared")
           + "; the tables are learned (the integration copies the model's)")

    def stack(count: int, bidirectional: bool) -> list[LayerPlan]:
        def bias() -> T5RelativeBias:
            return T5RelativeBias(heads, num_buckets=buckets, max_distance=max_distance, bidirectional=bidirectional)
        if per_layer:
            return [LayerPlan(bias()) for _ in range(count)]
        shared = bias()
        return [LayerPlan(shared) for _ in range(count)]

    model_type = config.get("model_type") or family
    encoder = PositionPlan(tuple(stack(num_layers, True)), model_type=model_type)
    return r.plan(stack(num_decoder_layers, False), encoder=encoder)

