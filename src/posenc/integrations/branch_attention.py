"""The training-free position maps of :mod:`posenc.attention.branches` inside Hugging Face
decoders: ``extend_context(model, "self_extend", group_size=8, neighbor_window=1024)`` and the
other branch methods (issue 26, item 3).

How it is exact, cache included:

- The layers the map applies to get the identity rotary tables (cos 1, sin 0) through a forward
  pre-hook on each decoder layer, so their queries and keys reach the attention function, and
  transformers' ``DynamicCache``, unrotated.
- Their attention runs :func:`branch_attention_forward`, registered with transformers'
  ``AttentionInterface`` as ``"posenc_branches"``: every branch of ``map.branches(Tq, Tk)``
  rotates q and k at its own positions with posenc's RoPE of that layer (the family's pair
  layout and rotary width, the config's scaling and attention factor), the logits are taken
  from the branch that covers them and one softmax runs over the union (the "select" merge of
  :func:`posenc.attention.branches.branch_attention`, equal to its log-sum-exp merge), with the
  model's softmax scale, logit soft-capping (Gemma 2) and attention sinks (gpt-oss) as its own
  eager attention applies them. Every other layer runs the model's original attention function.
- The maps read positions as indices: the queries are the last Tq of the Tk cached tokens, token
  j at position j. A forward pre-hook on the base model checks that before any layer runs
  (one host sync per call): no padding in the 2-d ``attention_mask``, ``position_ids`` equal to
  past + 0 .. T-1, no 4-d mask, no StaticCache; anything else is refused (InvalidArgument).

Which layers take the map: those of the model's plan (:func:`posenc.hf_config.position_plan`)
with a plain RoPE and a full span. Sliding-window and chunked layers keep the model's own RoPE
and attention (their window never shows a distance past it: Gemma 2/3's local layers, Cohere 2's,
gpt-oss's); NoPE layers keep theirs. A model with no full-span RoPE layer is refused (Mistral
with a ``sliding_window``, Llama 4, whose RoPE layers are chunked).

Kernels and memory: a layer without soft-capping, sinks or dropout runs one SDPA call per branch
in float32, merged by log-sum-exp (:func:`posenc.attention.branches.branch_attention`, backend
"sdpa"); Gemma 2's and gpt-oss's global layers run the explicit softmax (eager math). Either way
the queries of a long prefill are taken in blocks so that one block's Tq x Tk stays under
:data:`BLOCK_ELEMENTS` (a block sees only the keys up to its last query).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from posenc.attention.branches import branch_attention as merged_branch_attention
from posenc.attention.branches import DualChunk, LeakyReRoPE, ReRoPE, String
from posenc.attention.branches import dca as _dca
from posenc.attention.branches import leaky_rerope as _leaky_rerope
from posenc.attention.branches import lm_infinite as _lm_infinite
from posenc.attention.branches import rerope as _rerope
from posenc.attention.branches import self_extend as _self_extend
from posenc.attention.branches import streaming_llm as _streaming_llm
from posenc.attention.branches import string as _string
from posenc.encodings import RoPE
from posenc.encodings.rope.multiaxis import MultiAxisRoPE
from posenc.errors import InvalidArgument
from posenc.integrations.hf_masks import boolean_mask

__all__ = ["ATTN_IMPLEMENTATION", "BRANCH_METHODS", "CONFIG_KEY", "BranchLayer", "branch_attention_forward",
           "method_defaults", "resolve_map", "training_length"]

#: The name the branch attention is registered under with transformers.
ATTN_IMPLEMENTATION = "posenc_branches"
#: The config attribute recording the branch extension (plain JSON: method and resolved parameters).
CONFIG_KEY = "posenc_context_extension"
#: Where a layer's :class:`BranchLayer` is kept on its attention module.
BRANCH_ATTR = "_posenc_branch"

# STRING's cos/sin multiplier (HKUNLP/STRING ``replace_with_string``): 0.1 ln 2 + 1.
_STRING_FACTOR = 0.1 * math.log(2) + 1

#: method -> the parameter names it takes, in its reference code's spelling.
BRANCH_METHODS: dict[str, tuple[str, ...]] = {
    "streaming_llm": ("start_size", "recent_size"),
    "self_extend": ("group_size", "neighbor_window"),
    "rerope": ("window", "training_length"),
    "leaky_rerope": ("window", "scaling_factor", "training_length"),
    "lm_infinite": ("local_branch", "global_branch"),
    "dca": ("chunk_size", "local_size"),
    "string": ("shifted_offset", "local_value", "attention_factor"),
}


def training_length(config: Any) -> int:
    """L0, the context the model was trained at: the rope dict's
    ``original_max_position_embeddings`` where the config has one (a llama3 or yarn model),
    else ``max_position_embeddings``."""
    for key in ("rope_parameters", "rope_scaling"):
        params = getattr(config, key, None)
        if isinstance(params, dict) and isinstance(params.get("original_max_position_embeddings"), int):
            return params["original_max_position_embeddings"]
    length = getattr(config, "max_position_embeddings", None)
    if not isinstance(length, int) or length < 1:
        raise InvalidArgument("model: its config has no max_position_embeddings, the training length the branch "
                              "methods' defaults are scaled to")
    return length


def method_defaults(method: str, config: Any) -> dict[str, Any]:
    """Each method's published defaults, scaled to the model's training length L0 where the
    reference scales them:

    - streaming_llm: start_size 4, recent_size 512 (``StartRecentKVCache``);
    - self_extend: group_size 8, neighbor_window 1024 (datamllab/LongLM; not scaled);
    - rerope: window 512, training_length L0 (bojone/rerope's globals, its 4096 the model's L0);
    - leaky_rerope: window 512, scaling_factor 16, training_length L0;
    - lm_infinite: local_branch L0 (the reference's Llama 2 scripts pass the training length),
      global_branch 100;
    - dca: the config's ``dual_chunk_attention_config`` (Qwen2.5-1M, Qwen3) where it has one,
      else chunk_size 3 L0 / 4, local_size L0 / 16 (``replace_with_chunkllama``);
    - string: shifted_offset int(0.33 L0), local_value 128, attention_factor 0.1 ln 2 + 1.
    """
    length = training_length(config)
    if method == "streaming_llm":
        return {"start_size": 4, "recent_size": 512}
    if method == "self_extend":
        return {"group_size": 8, "neighbor_window": 1024}
    if method == "rerope":
        return {"window": 512, "training_length": length}
    if method == "leaky_rerope":
        return {"window": 512, "scaling_factor": 16, "training_length": length}
    if method == "lm_infinite":
        return {"local_branch": length, "global_branch": 100}
    if method == "dca":
        if isinstance(getattr(config, "dual_chunk_attention_config", None), dict):
            read = DualChunk.from_config(config)
            return {"chunk_size": read.chunk_size, "local_size": read.local_size}
        return {"chunk_size": 3 * length // 4, "local_size": length // 16}
    if method == "string":
        return {"shifted_offset": int(0.33 * length), "local_value": 128, "attention_factor": _STRING_FACTOR}
    raise InvalidArgument(f"method must be one of {list(BRANCH_METHODS)}, got {method!r}")


def resolve_map(method: str, params: dict[str, Any], config: Any) -> tuple[Any, dict[str, Any]]:
    """(the position map, the resolved parameters: defaults with ``params`` on top).

    Raises:
        InvalidArgument: an unknown method or parameter (the allowed ones named), or a value
            the map refuses (as :mod:`posenc.attention.branches` raises).
    """
    if method not in BRANCH_METHODS:
        raise InvalidArgument(f"method must be one of {list(BRANCH_METHODS)}, got {method!r}")
    unknown = sorted(set(params) - set(BRANCH_METHODS[method]))
    if unknown:
        raise InvalidArgument(f"{method}: unknown parameter(s) {unknown}; it takes {list(BRANCH_METHODS[method])}")
    resolved = {**method_defaults(method, config), **params}
    if method == "string":
        factor = resolved["attention_factor"]
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor < math.inf:
            raise InvalidArgument(f"attention_factor must be a positive finite number, got {factor!r}")
        made = _string(shifted_offset=resolved["shifted_offset"], local_value=resolved["local_value"])
        return made, resolved
    build: dict[str, Callable[..., Any]] = {
        "streaming_llm": _streaming_llm, "self_extend": _self_extend, "rerope": _rerope,
        "leaky_rerope": _leaky_rerope, "lm_infinite": _lm_infinite, "dca": _dca,
    }
    return build[method](**resolved), resolved


@dataclass(frozen=True)
class BranchLayer:
    """What one layer's branch attention needs.

    Attributes:
        map: the position map (``map.branches(Tq, Tk, device)``).
        rope: posenc's RoPE rotating every branch (Leaky ReRoPE: the layer's RoPE at
            frequencies theta / scaling_factor, its positions being in those units).
        query_scale: multiply queries by the map's log-n scale (ReRoPE, Leaky ReRoPE).
        attention_factor: cos and sin multiplied by it (STRING's 0.1 ln 2 + 1), i.e. the rotary
            part of q and of k; 1.0 for none.
    """

    map: Any
    rope: RoPE
    query_scale: bool = False
    attention_factor: float = 1.0


def layer_rope(method: str, rope: RoPE, map_: Any, where: str) -> RoPE:
    """The RoPE that rotates the branches of a layer whose own RoPE is ``rope``.

    Raises:
        InvalidArgument: a multi-axis RoPE (M-RoPE), or leaky_rerope on an already scaled RoPE
            (its positions are in units of 1/scaling_factor of plain RoPE's frequencies).
    """
    if isinstance(rope, MultiAxisRoPE) or type(rope).rotate is not RoPE.rotate:
        raise InvalidArgument(f"{where}: {type(rope).__name__} is not a plain RoPE with one position per token; "
                              f"{method} maps one position per token")
    if rope.length_dependent:
        raise InvalidArgument(f"{where}: its RoPE's frequencies follow the length ({rope.scaling.get('rope_type')}); "
                              f"{method} needs a static RoPE")
    if not isinstance(map_, LeakyReRoPE):
        return rope
    if rope.scaling is not None:
        raise InvalidArgument(f"{where}: leaky_rerope rotates at theta / scaling_factor, which is not defined on top "
                              f"of the model's own {rope.scaling.get('rope_type')} scaling")
    return RoPE(rope.head_dim, rotary_dim=rope.rotary_dim, base=rope.base, interleaved=rope.interleaved,
                scaling={"rope_type": "linear", "factor": float(map_.scaling_factor)})


def make_layer(method: str, map_: Any, resolved: dict[str, Any], rope: RoPE, where: str) -> BranchLayer:
    return BranchLayer(map_, layer_rope(method, rope, map_, where), isinstance(map_, (ReRoPE, LeakyReRoPE)),
                       float(resolved["attention_factor"]) if isinstance(map_, String) else 1.0)


# -- the attention function -----------------------------------------------------------------------

def branch_attention_forward(
    module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
    dropout: float = 0.0, scaling: float | None = None, softcap: float | None = None, s_aux: Tensor | None = None,
    *, fallback: Callable[..., tuple[Tensor, Any]], **kwargs: Any,
) -> tuple[Tensor, None]:
    """transformers' attention-function signature over a layer's position map.

    query (B, H, Tq, D), key and value (B, H_kv, Tk, D) unrotated (the cache's keys, token j at
    position j; the queries the last Tq tokens) -> (output (B, Tq, H, D) in query's dtype,
    None). Logits, softmax and weighted sum in float32 (float64 for float64 inputs):
    logit = scale * rot(q) . rot(k) of the branch taking that key, then soft-capped
    (cap * tanh(logit / cap)), masked (causal, transformers' mask), softmax over the keys and
    the sink (exp(s_aux[h]) in the denominator, as gpt-oss's eager attention). A module without
    a map runs ``fallback`` (the model's original attention).
    """
    layer: BranchLayer | None = module.__dict__.get(BRANCH_ATTR)
    if layer is None:  # what the model passed, passed on as it came
        extra = {name: v for name, v in (("softcap", softcap), ("s_aux", s_aux)) if v is not None}
        return fallback(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **extra, **kwargs)
    q_len, k_len = query.shape[2], key.shape[2]
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    # queries in blocks so that one block's logits stay under BLOCK_ELEMENTS (a long prefill);
    # a block of queries ending at absolute position e sees the first e + 1 keys only (causal),
    # and is the map's branches(block, e + 1): the queries the last of those keys
    rows = max(1, BLOCK_ELEMENTS // max(1, query.shape[0] * query.shape[1] * k_len))
    outputs = []
    for start in range(0, q_len, rows):
        stop = min(start + rows, q_len)
        k_end = k_len - q_len + stop
        mask = attention_mask
        if mask is not None and mask.dim() == 4 and mask.shape[-2] == q_len:
            mask = mask[..., start:stop, :]
        outputs.append(_attend(module, layer, query[:, :, start:stop], key[:, :, :k_end], value[:, :, :k_end], mask,
                               dropout, scale, softcap, s_aux))
    out = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)
    return out.transpose(1, 2).contiguous(), None


#: The most logits one block of queries holds (B x H x rows x Tk); 2^25 float32: 128 MiB.
BLOCK_ELEMENTS = 1 << 25


def _attend(module: nn.Module, layer: BranchLayer, query: Tensor, key: Tensor, value: Tensor,
            attention_mask: Tensor | None, dropout: float, scale: float, softcap: float | None,
            s_aux: Tensor | None) -> Tensor:
    """(B, H, Tq, D) in query's dtype: the queries the last Tq of the Tk keys."""
    q_len, k_len = query.shape[2], key.shape[2]
    acc = torch.promote_types(query.dtype, torch.float32)
    if softcap is None and s_aux is None and not (dropout and module.training):
        return _attend_merged(layer, query.to(acc), key.to(acc), value.to(acc), scale).to(query.dtype)
    if layer.query_scale:
        query = layer.map.scale_queries(query, k_len)
    group = query.shape[1] // key.shape[1]
    logits = torch.full((*query.shape[:3], k_len), float("-inf"), dtype=acc, device=query.device)
    for branch in _branches(layer.map, q_len, k_len, query.device):
        q_rot, k_rot = layer.rope.rotate(query, key, branch.q_positions, branch.k_positions)
        q_rot, k_rot = q_rot.to(acc), k_rot.to(acc)
        if layer.attention_factor != 1.0:
            q_rot, k_rot = _scale_rotary(q_rot, layer), _scale_rotary(k_rot, layer)
        if group > 1:
            k_rot = k_rot.repeat_interleave(group, dim=1)
        scores = torch.matmul(q_rot, k_rot.transpose(-1, -2)) * scale
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        logits = torch.where(branch.key_mask, scores, logits)
    logits = logits.masked_fill(~_allowed(attention_mask, q_len, k_len, query.device), float("-inf"))
    if s_aux is not None:  # gpt-oss's sinks: one more logit per head, dropped after the softmax
        sinks = s_aux.to(acc).reshape(1, -1, 1, 1).expand(*logits.shape[:3], 1)
        probs = torch.softmax(torch.cat([logits, sinks], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(logits, dim=-1)
    probs = torch.nan_to_num(probs, nan=0.0)  # a row with no key (none in the maps: every query sees itself)
    probs = nn.functional.dropout(probs, p=dropout, training=module.training)
    values = value.to(acc).repeat_interleave(group, dim=1) if group > 1 else value.to(acc)
    return torch.matmul(probs, values).to(query.dtype)


def _attend_merged(layer: BranchLayer, query: Tensor, key: Tensor, value: Tensor, scale: float) -> Tensor:
    """The same attention as one SDPA call per branch merged by log-sum-exp
    (:func:`posenc.attention.branches.branch_attention`, backend "sdpa"): no Tq x Tk logits held
    in float32 per head, several times faster on the CPU than the explicit softmax below; for
    layers without soft-capping, sinks or dropout (the positions check has refused padding,
    so the mask is the causal one)."""
    k_len = key.shape[2]
    if layer.query_scale:
        query = layer.map.scale_queries(query, k_len)

    def rotate(q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor) -> tuple[Tensor, Tensor]:
        q, k = layer.rope.rotate(q, k, q_positions, k_positions)
        if layer.attention_factor != 1.0:
            q, k = _scale_rotary(q, layer), _scale_rotary(k, layer)
        return q, k

    branches = _branches(layer.map, query.shape[2], k_len, query.device)
    return merged_branch_attention(query, key, value, rotate=rotate, branches=branches, scale=scale,
                                   causal=True, backend="sdpa")


@functools.lru_cache(maxsize=4)
def _branches(position_map: Any, q_len: int, k_len: int, device: torch.device) -> list:
    """``position_map.branches(q_len, k_len, device)``, built once for all the layers of a call
    (the maps are frozen dataclasses: equal maps share their branches)."""
    return position_map.branches(q_len, k_len, device)


def _scale_rotary(x: Tensor, layer: BranchLayer) -> Tensor:
    """The rotary part of x (its first rotary_dim dimensions) times the attention factor, as
    a multiplier on cos and sin scales it."""
    width = layer.rope.rotary_dim
    if width == x.shape[-1]:
        return x * layer.attention_factor
    return torch.cat((x[..., :width] * layer.attention_factor, x[..., width:]), dim=-1)


def _allowed(attention_mask: Tensor | None, q_len: int, k_len: int, device) -> Tensor:
    """Causal (query t is token k_len - q_len + t) and transformers' mask: boolean as is, an
    additive float mask read where it is above half its dtype's minimum."""
    rows = torch.arange(k_len - q_len, k_len, device=device).unsqueeze(-1)
    allowed = torch.arange(k_len, device=device) <= rows
    if attention_mask is None:
        return allowed
    return allowed & boolean_mask(attention_mask)[..., :k_len]


# -- the positions check ------------------------------------------------------------------------

def positions_check(refuse_static: Callable[[Any], None]):
    """The base model's forward pre-hook refusing what the maps cannot read exactly: padding in
    the 2-d attention_mask, a 4-d mask, position_ids other than past + 0 .. T-1, a StaticCache."""
    def check(module, args, kwargs):
        tokens = args[0] if args and isinstance(args[0], Tensor) else kwargs.get("input_ids")
        if tokens is None:
            tokens = kwargs["inputs_embeds"][..., 0]
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        refuse_static(cache)
        past = cache.get_seq_length() if cache is not None else 0
        mask = kwargs.get("attention_mask")
        if isinstance(mask, Tensor):
            if mask.dim() != 2:
                raise InvalidArgument(f"attention_mask: a {mask.dim()}-d mask (packed sequences, custom masks) cannot "
                                      "be read as positions by the branch methods; pass a 2-d mask or none")
            if not bool(mask.bool().all()):
                raise InvalidArgument("attention_mask: the branch methods (extend_context with a position map) read "
                                      "token j at position j: padding is refused; run unpadded rows (batch of one, "
                                      "or rows of equal length)")
        positions = kwargs.get("position_ids")
        if isinstance(positions, Tensor):
            expected = torch.arange(past, past + tokens.shape[1], device=positions.device)
            if positions.shape[-1] != tokens.shape[1] or not bool((positions == expected).all()):
                raise InvalidArgument("position_ids: the branch methods read token j of the cache at position j; "
                                      "position_ids other than past + 0 .. T-1 (left padding, packed documents) are "
                                      "refused")

    return check
