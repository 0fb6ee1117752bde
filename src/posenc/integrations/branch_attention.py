"""The training-free position maps of :mod:`posenc.position_maps` in Hugging Face decoders:
``extend_context(model, "self_extend", group_size=8, neighbor_window=1024)`` and the other
branch methods (issue 26, item 3), kept importable here (benchmarks and docs name this module).

They are planned from the config by :func:`posenc.hf_config.extension.plan_extension`: each
chosen layer's plan entry becomes ``branched(rope, method, **params)`` of that layer's RoPE
(a :class:`~posenc.encodings.BranchedRoPE`), which
:func:`~posenc.integrations.transformers.use_encoding`'s routes put on posenc's route like any
encoding the model's tables cannot carry: identity rotary tables (queries and keys reach the
attention function, and transformers' ``DynamicCache``, unrotated), and :func:`posenc.attention`
in posenc's attention function, which rotates every branch at the layer's positions and merges
the branches by log-sum-exp, with the model's softmax scale, logit soft-cap (Gemma 2) and
attention sinks (gpt-oss). The positions are the layer's ``position_ids``, so a cached step,
left padding (each row at its own positions, the padding masked) and shifted positions see
what the row alone would.
"""

from __future__ import annotations

from typing import Any

from posenc.hf_config import extension
from posenc.hf_config.extension import BRANCH_METHODS, CONFIG_KEY, branched_layer

__all__ = ["BRANCH_METHODS", "CONFIG_KEY", "branched_layer", "method_defaults", "training_length"]


def _as_dict(config: Any) -> Any:
    return config.to_dict() if hasattr(config, "to_dict") else config


def training_length(config: Any) -> int:
    """:func:`posenc.hf_config.extension.training_length` of a config dict or a transformers config."""
    return extension.training_length(_as_dict(config))


def method_defaults(method: str, config: Any) -> dict[str, Any]:
    """:func:`posenc.hf_config.extension.method_defaults` of a config dict or a transformers config."""
    return extension.method_defaults(method, _as_dict(config))
