"""Hugging Face config knowledge, in one place: how a ``config.json`` (or a transformers
config's ``to_dict()``) spells a model's positions, read and written as plain dicts. No
transformers import: the model glue is :mod:`posenc.integrations.transformers`.

- :mod:`posenc.hf_config.rope`: the RoPE fields (v4 ``rope_scaling``, v5 ``rope_parameters``,
  per layer type): read, write, inspect, and the ``rope_scaling`` dict of a context extension.
- :mod:`posenc.hf_config.families`: the family table, one :class:`Family` record per
  ``model_type`` (how its config is read, where its modules live, its adapter), and
  :func:`position_plan`, a config's per-layer :class:`~posenc.plan.PositionPlan` (the plan
  lives in :mod:`posenc.plan`; ``posenc.hf_config.plan`` re-exports it).
- :mod:`posenc.hf_config.encoding`: config <-> posenc encodings: :func:`from_hf_config`,
  :func:`to_hf_dict`, and :func:`extension_config`, the fields that extend a model's context.
- :mod:`posenc.hf_config.extension`: :func:`plan_extension`, a context extension planned from
  a config dict (the fields to write and the new plan; the position maps' record and defaults).
- :mod:`posenc.hf_config.gguf`: GGUF files read as llama.cpp reads them:
  :func:`position_plan_from_gguf` (the plan of a ``.gguf`` file for the checkpoint's weights),
  :func:`gguf_rope_metadata` (its position keys by their GGUF names), ``plan_differences``.
- :mod:`posenc.hf_config.values`: the one reader of a config's numbers (types, ranges and the
  bounds checked before any allocation) and :func:`load_config_json`, a config.json file parsed
  or refused with one error naming it.

>>> import json, posenc.hf_config as hf
>>> rope = hf.from_hf_config(json.load(open("config.json")))       # doctest: +SKIP
>>> report = hf.inspect_config(json.load(open("config.json")))     # doctest: +SKIP

``posenc.rope`` re-exports the RoPE names (their documented paths).
"""

from posenc.hf_config.encoding import extension_config, from_hf_config, to_hf_dict
from posenc.hf_config.extension import Extension, ModelFacts, plan_extension
from posenc.hf_config.families import FAMILIES, Family, position_plan, reads_model_type
from posenc.hf_config.gguf import gguf_rope_metadata, position_plan_from_gguf
from posenc.hf_config.rope import (
    EXTENSION_METHODS,
    HF_ROPE_FIELDS,
    RopeInspection,
    extension_scaling,
    head_dim_of,
    inspect_config,
    read_hf_config,
    rope_parameters_of,
    write_hf_config,
)
from posenc.hf_config.values import load_config_json
from posenc.plan import LayerPlan, PositionPlan

__all__ = [
    "HF_ROPE_FIELDS", "read_hf_config", "write_hf_config", "head_dim_of", "inspect_config", "RopeInspection",
    "EXTENSION_METHODS", "extension_scaling", "rope_parameters_of",
    "from_hf_config", "to_hf_dict", "extension_config", "plan_extension", "Extension", "ModelFacts",
    "position_plan", "reads_model_type", "FAMILIES", "Family", "PositionPlan", "LayerPlan", "load_config_json",
    "position_plan_from_gguf", "gguf_rope_metadata",
]
