"""The attention function posenc registers with transformers' ``AttentionInterface``.

:func:`posenc_attention_forward` is transformers' attention-function signature over
:func:`posenc.attention`, for the layers whose encoding the model's own attention cannot apply
(the routes: :mod:`posenc.integrations.routes`); the other layers of the same model run the
model's original attention function through the same entry (:func:`fallback`). Also here: the
module attributes the routes leave for it. transformers' masks are read and written by
:mod:`posenc.integrations.hf_masks`.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import Tensor, nn

from posenc.attention import attention
from posenc.errors import InvalidArgument
from posenc.integrations.hf_masks import additive_mask, boolean_mask

#: The name posenc's attention function is registered under with transformers.
ATTN_IMPLEMENTATION = "posenc"

#: Where the encoding is kept on the attention modules of posenc-route layers (a plain
#: attribute, not a submodule: the encodings are registered once, on the base model).
ENCODING_ATTR = "_posenc_encoding"
#: The position_ids of the current call, for attention modules that are not handed them.
POSITIONS_ATTR = "_posenc_position_ids"
#: The attention implementation the model had, for the table-route layers.
FALLBACK_ATTR = "_posenc_fallback"


def posenc_attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, Tensor | None]:
    """transformers' attention-function signature over :func:`posenc.attention`.

    query (B, H, Tq, D), key and value (B, H_kv, Tk, D) -> (output (B, Tq, H, D), None). The
    layer's logit soft-cap (``softcap=``, Gemma 2's ``attn_logit_softcapping``) and attention
    sinks (``s_aux=``, gpt-oss's ``module.sinks``, (H,)) as transformers passes them go to
    :func:`posenc.attention`'s ``softcap=`` and ``sinks=`` (the same math as those models'
    ``eager_attention_forward``). A module without a posenc encoding (a table-route layer) runs
    the model's original attention function (eager gets the boolean mask as an additive one).

    Raises:
        InvalidArgument: as :func:`posenc.attention`.
    """
    if ENCODING_ATTR not in module.__dict__:
        return fallback(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    encoding = module.__dict__[ENCODING_ATTR]
    # the positions the layer's or the stack's pre-hook kept for this call (an adapter family's:
    # OPT's padding -1 read at 0), else the ones transformers hands the attention
    positions = module.__dict__.get(POSITIONS_ATTR)
    if positions is None:
        positions = kwargs.get("position_ids")
    q_positions = _query_positions(positions, query)
    k_positions = key_positions(q_positions, key.shape[2])
    out = attention(
        query, key, value, encoding, causal=bool(getattr(module, "is_causal", True)),
        q_positions=q_positions, k_positions=k_positions, mask=boolean_mask(attention_mask),
        scale=scaling, dropout_p=dropout, **_softcap_and_sinks(kwargs),
    )
    return out.transpose(1, 2).contiguous(), None


def _softcap_and_sinks(kwargs: dict) -> dict:
    """posenc.attention's ``softcap=`` and ``sinks=`` from what transformers passes an
    attention function (``softcap``: Gemma 2; ``s_aux``: gpt-oss), those that are set."""
    given = {"softcap": kwargs.get("softcap"), "sinks": kwargs.get("s_aux")}
    return {name: value for name, value in given.items() if value is not None}


def fallback(module, query, key, value, attention_mask, **kwargs):
    name = module.__dict__.get(FALLBACK_ATTR, "sdpa")
    function = transformers_attention_function(name, module)
    if name == "eager":
        attention_mask = additive_mask(attention_mask, query, key, bool(getattr(module, "is_causal", True)))
    return function(module, query, key, value, attention_mask, **kwargs)


def transformers_attention_function(name: str, module: nn.Module | None = None):
    """The attention function transformers runs for implementation ``name`` where it takes
    the boolean SDPA mask posenc's entry receives: "sdpa", or "eager" (the modeling file's own
    ``eager_attention_forward``, given an additive mask); None for eager without a module."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if name == "sdpa":
        return ALL_ATTENTION_FUNCTIONS[name]
    if name == "eager":
        if module is None:
            return None
        eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
        if eager is not None:
            return eager
    raise InvalidArgument(f"model: attention implementation {name!r} cannot serve the layers that keep the model's "
                          "own attention next to posenc's; load the model with attn_implementation='sdpa' or 'eager'")


def _query_positions(position_ids: Tensor | None, query: Tensor) -> Tensor:
    batch, num_queries = query.shape[0], query.shape[2]
    if position_ids is None:
        return torch.arange(num_queries, device=query.device)
    if position_ids.dim() == 1:
        return position_ids
    return position_ids.expand(batch, num_queries)


def key_positions(q_positions: Tensor, num_keys: int) -> Tensor:
    num_queries = q_positions.shape[-1]
    if num_keys == num_queries:
        return q_positions
    start = q_positions[..., :1] - (num_keys - num_queries)
    return (start + torch.arange(num_keys, device=q_positions.device)).clamp(min=0)


def register_with_transformers() -> None:
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, posenc_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)
