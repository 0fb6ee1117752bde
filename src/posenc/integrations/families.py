"""Where a transformers model's decoder layers and modules live, and how they take positions.

The facts are the family's record, :class:`posenc.hf_config.families.Family` (plain strings,
one record per ``model_type`` in :data:`FAMILIES`, the one family table); this module turns a
record into what the integrations read (:func:`family_of` -> :class:`FamilyModules`) and holds
the table formats (:class:`TableFormat`), the code that the records name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from posenc.errors import InvalidArgument
from posenc.hf_config.families import FAMILIES, Family

__all__ = ["FAMILIES", "TABLE_FORMATS", "Family", "FamilyModules", "LayerStack", "TableFormat", "base_model", "decoder_stacks",
           "family_of", "layer_stacks", "record_of", "sizes_config"]


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


#: The table formats by name, the names the family records give (:attr:`Family.tables`).
TABLE_FORMATS: dict[str, TableFormat] = {
    "cos_sin": COS_SIN, "half_cos_sin": HALF_COS_SIN, "pair_sin_cos": PAIR_SIN_COS,
    "deinterleaved_cos_sin": DEINTERLEAVED_COS_SIN, "complex_pairs": COMPLEX_PAIRS,
}


@dataclass(frozen=True)
class FamilyModules:
    """Where one model's decoder layers and modules live and how they take positions: its
    family's record (:class:`posenc.hf_config.families.Family`, read by :func:`family_of`) with
    the pair layout read where the config chooses it and the table format as code. The
    attributes are the record's, except:

    Attributes:
        interleaved: the rotation pairs dimension 2i with 2i+1 (RoFormer, GPT-J, Cohere, Llama
            4); False: i with i + r/2 (GPT-NeoX, Llama and most others). The record's layout,
            or its ``interleaved_key`` on the model's config (DeepSeek-V3's ``rope_interleave``).
        tables: the :class:`TableFormat` of its ``position_embeddings`` (the record's
            ``interleaved_tables`` where the config chooses interleaved pairs).
        interleaved_tables: that format, or None.
        text_config: the record's ``sizes_config``: the model config's attribute holding the
            decoder's sizes (Qwen2-VL: ``"text_config"``), or None; :func:`extend_context`
            refuses such a model (it writes the top-level config only).
        temperature: Llama 4's attention temperature attributes (switch, floor_scale,
            attn_scale) on the attention module, where the model scales its queries itself on
            the layers whose ``use_rope`` is false. A plan layer with the same
            :class:`~posenc.encodings.irope.AttentionTemperature` then keeps the model's own
            attention; any other encoding turns the model's own scaling off on that layer.
        query_scale: the rope dict key of Llama 4's query scale that the attention module
            applies on every layer from its config (Ministral 3's ``llama_4_scaling_beta``). A
            plan layer with the same :class:`~posenc.encodings.rope.query_scaled.QueryScaledRoPE`
            keeps the model's own scaling (its RoPE on the usual route); any other encoding
            turns it off on that layer (the module then reads a config view with beta 0).
    """

    base: str | None
    layers: str
    attention: str
    rotary: str | None
    interleaved: bool
    tables: TableFormat
    sinks: str | None
    softcap: str | None
    scaled_layer_types: tuple[str, ...]
    temperature: tuple[str, str, str] | None
    query_scale: str | None
    interleaved_key: str | None
    interleaved_tables: TableFormat | None
    head_dim: str
    text_config: str | None
    no_scaling: str | None
    rotary_positions: bool

    @classmethod
    def of(cls, family: Family, config: Any = None) -> FamilyModules:
        """The modules of ``family``'s models; ``config``: the model's config, which decides the
        pair layout where the record names an ``interleaved_key``."""
        interleaved = family.interleaved
        if family.interleaved_key is not None and config is not None:
            interleaved = bool(getattr(config, family.interleaved_key, interleaved))
        other = TABLE_FORMATS[family.interleaved_tables] if family.interleaved_tables is not None else None
        tables = other if interleaved and other is not None else TABLE_FORMATS[family.tables]
        return cls(base=family.base, layers=family.layers, attention=family.attention, rotary=family.rotary,
                   interleaved=interleaved, tables=tables, sinks=family.sinks, softcap=family.softcap,
                   scaled_layer_types=family.scaled_layer_types, temperature=family.temperature,
                   query_scale=family.query_scale,
                   interleaved_key=family.interleaved_key, interleaved_tables=other, head_dim=family.head_dim,
                   text_config=family.sizes_config, no_scaling=family.no_scaling,
                   rotary_positions=family.rotary_positions)


#: The record of a model type posenc has no record of: Llama-shaped (``layers``, ``self_attn``,
#: half-split (cos, sin)).
LLAMA_SHAPED = Family("llama")


def record_of(model: nn.Module) -> Family:
    """The :class:`Family` record of a model's config's ``model_type`` (Llama-shaped if none)."""
    return FAMILIES.get(getattr(getattr(model, "config", None), "model_type", None), LLAMA_SHAPED)


def family_of(model: nn.Module) -> FamilyModules:
    """Where a model's decoder layers and modules live (:class:`FamilyModules`), from its
    family's record (its config's ``model_type``; Llama-shaped if none), its pair layout read
    from the config where the family lets the config choose."""
    return FamilyModules.of(record_of(model), getattr(model, "config", None))


def sizes_config(config: Any, family: FamilyModules) -> Any:
    """The config holding the decoder's sizes: the model's, or its ``family.text_config``."""
    return config if family.text_config is None else getattr(config, family.text_config)


def _holder(model: nn.Module, family: Family | FamilyModules) -> nn.Module:
    """The module holding the family's decoder layers (or its stacks): the model's base model,
    or the record's ``base`` path from the model."""
    base = getattr(model, "base_model", model)
    first = family.stacks[0] if getattr(family, "stacks", ()) else family.layers
    if family.base is not None and not hasattr(base, first):
        # the dotted path from the model, or its trailing parts from the model itself (a base
        # model given: Qwen2VLModel holds "language_model" of "model.language_model")
        parts = family.base.split(".")
        for start in range(len(parts)):
            found = model
            for part in parts[start:]:
                found = getattr(found, part, None)
            if found is not None and hasattr(found, first):
                return found
    return base


def base_model(model: nn.Module, family: FamilyModules) -> nn.Module:
    """The module holding ``model``'s decoder layers and rotary module (``family.layers``,
    ``family.rotary``).

    Raises:
        InvalidArgument: it lacks its layers, or the model has no config; a model of no known
            family (read as Llama-shaped) also needs its rotary module. A model of a family in
            :data:`FAMILIES` may lack it: the model builds none (Zamba2 without
            ``use_mem_rope``), and its layers are handed no tables. A family whose record
            refuses it: the refusal, naming the positional feature.
    """
    base = _holder(model, family)
    record = record_of(model)
    if record.refused is not None:  # a family posenc knows and does not read: say why
        raise InvalidArgument(f"model ({record.model_type}): {record.refused}; posenc does not read this family")
    # a known family's missing rotary module is one the model does not build (the family sweep
    # checks every record against transformers); a Llama-shaped guess must have one
    rotary = family.rotary if record is LLAMA_SHAPED else None
    missing = [name for name in (family.layers, rotary) if name is not None and not hasattr(base, name)]
    if missing or not hasattr(model, "config"):
        raise InvalidArgument(
            f"model: expected a transformers decoder whose base model has '{family.layers}' and '{family.rotary}' "
            f"(LlamaForCausalLM, Qwen2ForCausalLM, GPTNeoXForCausalLM, ...); {type(model).__name__} lacks "
            f"{missing or ['config']}"
        )
    return base


def _attribute(root: Any, dotted: str) -> Any:
    for name in dotted.split("."):
        root = getattr(root, name, None)
    return root


@dataclass(frozen=True)
class LayerStack:
    """One self-attention stack of a model, where its family's record says it lives.

    Attributes:
        name: ``"decoder"``, or the record's stack attribute (T5: ``"encoder"``, ``"decoder"``).
        module: the module holding the stack's layers (the base model, or its stack attribute).
        layers: the stack's layers (the record's ``layers``), in order.
        attentions: each layer's self-attention module (the record's ``attention`` path), or
            the layer itself where it has none (Qwen3-Next's linear-attention layers).
    """

    name: str
    module: nn.Module
    layers: tuple[nn.Module, ...]
    attentions: tuple[nn.Module, ...]


def layer_stacks(model: nn.Module) -> list[LayerStack]:
    """Every self-attention stack of ``model`` (encoder first), read through its family's record."""
    family = record_of(model)
    holder = _holder(model, family)
    stacks = [(name, getattr(holder, name)) for name in family.stacks] or [("decoder", holder)]
    out = []
    for name, module in stacks:
        layers = tuple(getattr(module, family.layers))
        out.append(LayerStack(name, module, layers,
                              tuple(_attribute(layer, family.attention) or layer for layer in layers)))
    return out


def decoder_stacks(model: nn.Module) -> list[tuple[str, list[nn.Module]]]:
    """(stack name, each layer's self-attention module) for every self-attention stack of
    ``model`` (encoder first), where its family's record says they live (:func:`layer_stacks`)."""
    return [(stack.name, list(stack.attentions)) for stack in layer_stacks(model)]
