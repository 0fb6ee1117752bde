"""Llama 4's text config as transformers' ``Llama4TextConfig`` spells it: the defaults of its
positional keys and the names of its attention temperature, stated once for its family record
(``FAMILIES["llama4_text"]`` in :mod:`posenc.hf_config.families`) and for
:meth:`posenc.IRoPE.from_hf_config`, which reads a config through them
(:func:`irope_arguments`).

A module of its own because the encoding cannot import the family table: the table builds
:class:`~posenc.plan.LayerPlan` objects, and the plan's encoding registry holds
:class:`~posenc.IRoPE`, so that import would close a cycle. Plain dicts, no transformers import.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from posenc.errors import InvalidArgument, InvalidType
from posenc.hf_config.rope import read_hf_config

__all__ = ["TEMPERATURE", "TEXT_DEFAULTS", "irope_arguments"]

#: ``Llama4TextConfig``'s defaults of the positional keys a config.json may leave out
#: (transformers/models/llama4/configuration_llama4.py).
TEXT_DEFAULTS: Mapping[str, Any] = {
    "rope_theta": 500000.0, "head_dim": 128, "no_rope_layer_interval": 4, "attention_chunk_size": 8192,
    "attn_temperature_tuning": True, "floor_scale": 8192, "attn_scale": 0.1,
}
#: The attention temperature's names (switch, floor_scale, attn_scale): the config's keys and
#: ``Llama4TextAttention``'s attributes alike.
TEMPERATURE: tuple[str, str, str] = ("attn_temperature_tuning", "floor_scale", "attn_scale")


def irope_arguments(config: Mapping[str, Any]) -> dict[str, Any]:
    """The :class:`~posenc.IRoPE` arguments of a Llama 4 text config (a parsed config.json's
    ``text_config``, or ``Llama4TextConfig.to_dict()``): rope_theta and the rope scaling (v4
    ``rope_scaling`` or v5 ``rope_parameters``), head_dim, no_rope_layers (an empty list: the
    interval's schedule, as transformers reads it) or no_rope_layer_interval,
    attention_chunk_size and the temperature, each absent key at :data:`TEXT_DEFAULTS`.

    Raises:
        InvalidType: config not a dict. KeyError, ValueError: as
            :func:`posenc.hf_config.rope.read_hf_config`; InvalidArgument for a
            partial_rotary_factor (Llama 4 rotates the whole head).
    """
    if not isinstance(config, Mapping):
        raise InvalidType(f"config must be a dict (a Llama 4 text config), got {type(config).__name__}")
    cfg = {**TEXT_DEFAULTS, **config}
    rope, _ = read_hf_config(cfg)
    if rope["partial_rotary_factor"] is not None:
        raise InvalidArgument(f"config: partial_rotary_factor={rope['partial_rotary_factor']}; iRoPE rotates the whole head")
    switch, floor_scale, attn_scale = TEMPERATURE
    return {"head_dim": rope["head_dim"], "rope_theta": rope["base"], "rope_scaling": rope["scaling"],
            "no_rope_layers": cfg.get("no_rope_layers") or None,
            "no_rope_layer_interval": cfg["no_rope_layer_interval"],
            "attention_chunk_size": cfg["attention_chunk_size"], "attn_temperature_tuning": cfg[switch],
            "floor_scale": cfg[floor_scale], "attn_scale": cfg[attn_scale]}
