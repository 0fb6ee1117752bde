"""The per-layer position plan, where the docs and older code import it from.

:class:`PositionPlan` and its helpers live in :mod:`posenc.plan` (a plan is generic data the
lab, the hf config module and the integrations share, not a Hugging Face concept); every name
is re-exported here unchanged.
"""

from posenc.plan import (
    PLAN_FORMAT,
    SPANS,
    LayerPlan,
    PositionPlan,
    describe_encoding,
    encoding_from_dict,
    encoding_to_dict,
    is_plain_data,
    layer_ranges,
)

__all__ = ["PLAN_FORMAT", "SPANS", "LayerPlan", "PositionPlan", "describe_encoding", "encoding_from_dict",
           "encoding_to_dict", "is_plain_data", "layer_ranges"]
