"""The plan :func:`~posenc.integrations.transformers.use_encoding` applied, recorded as plain
JSON in ``config.posenc_plan`` (written by ``save_pretrained``, read by
:func:`~posenc.integrations.saving.from_pretrained`).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from posenc.encodings import PositionalEncoding
from posenc.errors import InvalidArgument
from posenc.integrations import adapters
from posenc.plan import PLAN_FORMAT, PositionPlan, encoding_to_dict

#: The record's key for an encoding built by name once per stack (T5's encoder and decoder).
BUILT_FROM_NAME = "built_from_name"


def with_name(record: dict, name: str, kwargs: dict) -> dict:
    """The record of a plan built from ``name`` per stack, with the name and its options (plain
    JSON) for :func:`from_pretrained` to build it again; the reason where they are not."""
    import json

    try:
        json.dumps(kwargs)
    except (TypeError, ValueError):
        return {"format": PLAN_FORMAT, "error": f"encoding {name!r}: its options {sorted(kwargs)} are not plain data"}
    return {**record, BUILT_FROM_NAME: {"name": name, "kwargs": dict(kwargs)}}


def keep_plan(model: nn.Module, plan: PositionPlan, record: dict) -> None:
    """Record the plan applied (``base_model.posenc_plan``, ``config.posenc_plan``), undone
    with the rest by :func:`posenc.integrations.adapters.restore`."""
    adapters.replace_attribute(model, model.base_model, "posenc_plan", plan)
    adapters.replace_attribute(model, model.config, CONFIG_KEY, record)


#: The config attribute holding the plan :func:`use_encoding` applied (plain JSON, written to
#: config.json by ``save_pretrained``; :func:`from_pretrained` restores it).
CONFIG_KEY = "posenc_plan"


def plan_record(encoding: PositionalEncoding | None, layers: Sequence[int] | None, plan: PositionPlan) -> dict:
    """What ``config.posenc_plan`` holds after :func:`use_encoding`: :meth:`PositionPlan.to_dict`
    of the plan applied, with ``"encoding"`` (the single encoding given, as {"name",
    "kwargs"}; None for a plan) and ``"applied_layers"`` (``layers=``; None: every layer). An
    encoding that cannot be recorded (not a registered class, options not plain data) does not
    stop use_encoding: the record is then ``{"format": 1, "error": why}``, and
    :func:`from_pretrained` raises with it."""
    try:
        record = plan.to_dict()
        record["encoding"] = None if encoding is None else encoding_to_dict(encoding)
    except InvalidArgument as err:
        return {"format": PLAN_FORMAT, "error": str(err)}
    record["applied_layers"] = None if layers is None else [int(i) for i in layers]
    return record
