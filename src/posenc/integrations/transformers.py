"""posenc encodings and per-layer position plans inside Hugging Face transformers decoders.

>>> from transformers import LlamaConfig, LlamaForCausalLM                      # doctest: +SKIP
>>> from posenc.integrations.transformers import use_encoding, extend_context   # doctest: +SKIP
>>> model = use_encoding(LlamaForCausalLM(config), "alibi")                     # doctest: +SKIP
>>> model = use_encoding(model, "t5", layers=[0, 2])                            # doctest: +SKIP
>>> model = use_encoding(model, plan)        # a posenc.hf_config.PositionPlan   # doctest: +SKIP
>>> model = extend_context(LlamaForCausalLM.from_pretrained(path), "yarn", 4.0)  # doctest: +SKIP
>>> model = extend_context(model, "self_extend", group_size=8, neighbor_window=1024)  # doctest: +SKIP

The position maps of :func:`extend_context` (self_extend, dca, ...) are a
:class:`~posenc.encodings.BranchedRoPE` per layer on posenc's attention route
(:mod:`posenc.integrations.branch_attention`); every extension is planned from the config by
:func:`posenc.hf_config.extension.plan_extension`.

Every layer of the plan takes one of two routes, chosen from what its encoding does, never
from its name:

- **Tables** (a plain :class:`posenc.RoPE`, any rope_type, in the family's own pair layout and
  rotary width; or no encoding at all, NoPE): the layer keeps the model's own attention
  (sdpa, eager, flash, flex; attention sinks, logit soft-capping) and its cache of rotated keys;
  posenc hands it the rotary tables it applies, computed for that layer from posenc's RoPE with
  angles in float64 (docs/precision.md), or the identity tables (cos 1, sin 0) for NoPE. The
  tables replace the ``position_embeddings`` the model passes the decoder layer (a forward
  pre-hook per layer), so Gemma 3's per-layer-type tables, Cohere's interleaved ones, gpt-oss's
  half-width ones, GPT-J's (sin, cos) and Llama 4's complex ones are served alike: the family's
  table format is one entry of :data:`FAMILIES`.
- **posenc's attention** (score biases, content terms, xPos, a RoPE in another layout or width
  than the model's, chunked RoPE, every other encoding): the layer gets the identity tables and
  its attention runs through :func:`posenc.attention`, registered with transformers'
  ``AttentionInterface`` as ``"posenc"`` and selected with ``model.set_attn_implementation``;
  the layers on the table route then run the model's original attention function through the
  same entry. The cache holds unrotated keys and posenc rotates every key at its position on
  each call (exact for xPos and the length-dependent scalings). Grouped-query layouts, the
  softmax ``scaling``, the attention dropout, the logit soft-cap (Gemma 2) and the attention
  sinks (gpt-oss) transformers passes are honoured.
- An ``embed`` hook (sinusoidal, learned absolute; a plan's ``embedding``) adds to the hidden
  states entering the first decoder layer, at that call's ``position_ids``.

Positions: the queries' are the ``position_ids`` transformers hands every decoder layer (left
padding: cumsum(attention_mask) - 1, as ``generate()`` computes them; packed rows: positions
restarting per document). The keys': the queries' own without a cache; with transformers'
``DynamicCache`` the Tk keys are the Tk consecutive slots ending at the queries, so key j of row
b is at position j - (Tk - Tq) + q_positions[b, 0], clamped at 0 (left-padding slots, which the
mask hides). A ``StaticCache`` (keys in fixed slots, unfilled ones past the queries) is refused
on the layers that run posenc's attention, at the first call; table-route layers work with it.

The mask is transformers' boolean SDPA mask (True = may attend; padding, sliding window, chunks
and packed documents folded in), or None when plain causal attention is meant
(:mod:`posenc.integrations.hf_masks` reads and writes transformers' masks).

This module is the public face; the work is done by job in :mod:`posenc.integrations.routes`
(which layer goes where), :mod:`posenc.integrations.adapter_route` (the adapter families),
:mod:`posenc.integrations.attention_function` (the attention function transformers calls),
:mod:`posenc.integrations.extend` (extend_context), :mod:`posenc.integrations.saving`
(from_pretrained) and :mod:`posenc.integrations.families` (where a family's modules live).
"""

from __future__ import annotations

from posenc.hf_config import position_plan
from posenc.integrations.adapters import RotaryEmbedding
from posenc.integrations.attention_function import (
    ATTN_IMPLEMENTATION,
    posenc_attention_forward,
)
from posenc.integrations.extend import extend_context
from posenc.integrations.families import FAMILIES, Family, family_of
from posenc.integrations.record import CONFIG_KEY
from posenc.integrations.routes import use_encoding
from posenc.integrations.saving import from_pretrained
from posenc.plan import LayerPlan, PositionPlan

__all__ = [
    "ATTN_IMPLEMENTATION", "CONFIG_KEY", "FAMILIES", "Family", "family_of", "LayerPlan", "PositionPlan", "position_plan", "use_encoding",
    "extend_context", "from_pretrained", "posenc_attention_forward", "RotaryEmbedding",
]
