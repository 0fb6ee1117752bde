"""Where a transformers model family keeps its decoder layers and how they take positions.

One :class:`Family` entry per model type whose layers differ from Llama's; its table format
(:class:`TableFormat`) says how the decoder layers take their rotary tables.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from posenc.errors import InvalidArgument


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


def sizes_config(config: Any, family: Family) -> Any:
    """The config holding the decoder's sizes: the model's, or its ``family.text_config``."""
    return config if family.text_config is None else getattr(config, family.text_config)


def base_model(model: nn.Module, family: Family) -> nn.Module:
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
