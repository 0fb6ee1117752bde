"""The position maps of branch-merge attention: training-free context extensions stated as
elementwise rules on (query position, key position).

A map splits the keys a query sees into *branches*, each :class:`Branch` ``(q_positions,
k_positions, key_mask)``: the positions at which the queries and keys are rotated for that
branch, and the keys the branch takes. :mod:`posenc.attention.branches` evaluates them (one
attention per branch, merged by log-sum-exp); :class:`posenc.encodings.BranchedRoPE` states them
as an encoding, so that :func:`posenc.attention`, every backend that takes RoPE and the lab's
KV cache run them. This module is on the ground floor (it imports only torch and posenc's
errors and validation) because both the attention layer and the encodings read it.

Every map states its branches once, in :meth:`~_PositionMap.rules`: elementwise on
broadcastable int64 tensors i (query positions) and j (key positions), a grid, a row, or the
0-d tensors of a FlexAttention mask_mod. From it:

- :meth:`~_PositionMap.branches_at` (q_positions (Tq,) or (B, Tq), k_positions (Tk,) or
  (B, Tk)): the branches on the call's positions, so that a KV cache (the queries at positions
  Tk - Tq ..), left padding and packed rows see what the full pass sees;
- :meth:`~_PositionMap.branches` (q_len, k_len): the same at the positions arange(k_len - q_len,
  k_len) and arange(k_len), exactly (it is :meth:`branches_at` of those);
- :meth:`~_PositionMap.relative_positions`: the map as a matrix of rotation distances.

The seven maps of the references, each named and parameterized as its reference code spells it:
:func:`streaming_llm` (Xiao et al. 2023), :func:`self_extend` (Jin et al. 2024), :func:`rerope`
and :func:`leaky_rerope` (Su 2023, with their log-n query scaling), :func:`lm_infinite` (Han et
al. 2023), :func:`dca` (An et al. 2024, ChunkLlama) and :func:`string` (An et al. 2024, STRING);
and one combination of published pieces, :func:`windowed_yarn` (plain RoPE in a local window,
YaRN, Peng et al. 2023, past it: each branch may rotate with its own RoPE scaling,
:attr:`~_PositionMap.branch_scalings`);
:data:`MAP_METHODS` holds one record per method (:class:`MapMethod`: its name, map, parameters
and reference defaults, the one place they are stated); :data:`METHODS` names their factories.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from posenc._validation import check_number, check_positive_int
from posenc.errors import InvalidArgument, InvalidType, MissingKey
from posenc.mask_rules import causal_mask

__all__ = [
    "MAP_METHODS",
    "METHODS",
    "REFERENCE_LENGTH",
    "Branch",
    "DualChunk",
    "LMInfinite",
    "LeakyReRoPE",
    "MapMethod",
    "ReRoPE",
    "SelfExtend",
    "StreamingLLM",
    "String",
    "WindowedYaRN",
    "dca",
    "leaky_rerope",
    "lm_infinite",
    "position_map",
    "rerope",
    "self_extend",
    "streaming_llm",
    "string",
    "windowed_yarn",
]


class Branch(NamedTuple):
    """One branch: queries rotated at ``q_positions`` (int64 (Tq,)), keys at ``k_positions``
    (int64 (Tk,)), taking the keys where ``key_mask`` (bool (Tq, Tk)) is True. From
    :meth:`~_PositionMap.branches_at` with (B, T) positions: (B, Tq), (B, Tk), (B, Tq, Tk)."""

    q_positions: Tensor
    k_positions: Tensor
    key_mask: Tensor


def _query_and_key_indices(q_len: int, k_len: int, device) -> tuple[Tensor, Tensor]:
    """Absolute positions of the queries (the last q_len tokens) as a column, and of the keys."""
    if q_len > k_len:
        raise InvalidArgument(f"q_len must be <= k_len, got {q_len} > {k_len}")
    i = torch.arange(k_len - q_len, k_len, device=device, dtype=torch.int64)
    return i, torch.arange(k_len, device=device, dtype=torch.int64)


@dataclass(frozen=True)
class _PositionMap:
    def rules(self, i: Tensor, j: Tensor) -> list[Branch]:  # pragma: no cover - abstract
        """The map, elementwise: i (query positions) and j (key positions) broadcastable int64
        tensors (a (..., Tq, 1) column and a (..., 1, Tk) row, or 0-d) -> one :class:`Branch`
        per branch whose q_positions are a function of i alone (i's shape), k_positions of j
        alone (j's shape) and key_mask of both (their broadcast shape). Causal on positions:
        a key after its query is in no branch."""
        raise NotImplementedError

    def branches_at(self, q_positions: Tensor, k_positions: Tensor) -> list[Branch]:
        """The branches of one attention call at its positions: q_positions int64 (Tq,) or
        (B, Tq), k_positions (Tk,) or (B, Tk) (a KV cache: the cached keys' positions, then the
        new ones'). Returns :class:`Branch` es with q_positions (Tq,) or (B, Tq), k_positions
        (Tk,) or (B, Tk) and key_mask (Tq, Tk), or (B, Tq, Tk) when a side is per row. With
        positions arange(k_len - q_len, k_len) and arange(k_len) it is :meth:`branches`.

        Raises:
            InvalidType: positions that are not integer tensors.
            InvalidArgument: positions that are not 1-D or 2-D.
        """
        for name, positions in (("q_positions", q_positions), ("k_positions", k_positions)):
            if not isinstance(positions, Tensor) or positions.dtype.is_floating_point or positions.dtype == torch.bool:
                raise InvalidType(f"{name} must be an integer tensor (T,) or (B, T)")
            if positions.dim() not in (1, 2):
                raise InvalidArgument(f"{name} must be (T,) or (B, T), got {tuple(positions.shape)}")
        i, j = q_positions.long().unsqueeze(-1), k_positions.long().unsqueeze(-2)
        return [Branch(torch.broadcast_to(b.q_positions, i.shape)[..., 0].contiguous(),
                       torch.broadcast_to(b.k_positions, j.shape)[..., 0, :].contiguous(), b.key_mask)
                for b in self.rules(i, j)]

    def branches(self, q_len: int, k_len: int, device=None) -> list[Branch]:
        """The branches of q_len queries, the last of k_len tokens: :meth:`branches_at` at
        positions arange(k_len - q_len, k_len) and arange(k_len); key masks (q_len, k_len).

        Raises:
            InvalidArgument: q_len > k_len.
        """
        return self.branches_at(*_query_and_key_indices(q_len, k_len, device))

    @property
    def frequency_divisor(self) -> int:
        """The branches' positions are in units of 1 / frequency_divisor: rotate them with RoPE
        at frequencies theta / frequency_divisor (linear scaling by it). 1 for every map but
        :class:`LeakyReRoPE` (its scaling_factor)."""
        return 1

    @property
    def branch_scalings(self) -> dict[int, dict]:
        """The RoPE scaling (a Hugging Face rope dict, ``{"rope_type": ..., ...}``) that a
        branch rotates with instead of the model's own RoPE, by branch index: ``{}`` (every
        branch rotates with the model's RoPE) for every map but :class:`WindowedYaRN` (its far
        branch's YaRN). Applied by :class:`posenc.encodings.BranchedRoPE` to a RoPE without a
        scaling of its own."""
        return {}

    @property
    def logit_factor(self) -> float:
        """A factor on every logit that the reference applies besides the positions: 1 for
        every map but :class:`String` (its attention factor squared). Applied by
        :class:`posenc.encodings.BranchedRoPE`, not by the map's branches."""
        return 1.0

    def query_scale_at(self, q_positions: Tensor) -> Tensor | None:
        """A factor on each query before any rotation, float64 of q_positions' shape, or None
        (the default: none). ReRoPE and Leaky ReRoPE's log-n scaling."""
        return None

    def branch_positions(self, q_positions: Tensor, k_positions: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Each branch's (q_positions, k_positions) of :meth:`branches_at`, without its key mask:
        O(Tq + Tk) (a branch's query positions are a function of the query's alone, its key
        positions of the key's alone, :meth:`rules`)."""
        i, j = q_positions.long(), k_positions.long()
        zero_i, zero_j = torch.zeros((), dtype=torch.long, device=j.device), torch.zeros((), dtype=torch.long, device=i.device)
        on_queries, on_keys = self.rules(i, zero_j), self.rules(zero_i, j)
        return [(torch.broadcast_to(a.q_positions, i.shape), torch.broadcast_to(b.k_positions, j.shape))
                for a, b in zip(on_queries, on_keys)]

    def key_rule(self, index: int) -> Callable[[Tensor, Tensor], Tensor]:
        """Branch ``index``'s key mask as an elementwise rule ``allowed(q_pos, k_pos) -> bool``
        (broadcastable int64 tensors, or FlexAttention's 0-d ones), for a mask_mod."""

        def allowed(q_pos: Tensor, k_pos: Tensor) -> Tensor:
            return self.rules(q_pos, k_pos)[index].key_mask

        return allowed

    def relative_positions(self, q_len: int, k_len: int) -> tuple[Tensor, Tensor]:
        """The map as a matrix: (rel, covered), int64 and bool (q_len, k_len); rel[t, j] is the
        rotation distance q_position - k_position of the branch that takes key j for query t
        (0 where none does, ``covered`` False). Causal: keys after the query are not covered."""
        rel = torch.zeros(q_len, k_len, dtype=torch.int64)
        covered = torch.zeros(q_len, k_len, dtype=torch.bool)
        causal = causal_mask(q_len, k_len, None)
        for b in self.branches(q_len, k_len):
            mask = b.key_mask & causal
            rel = torch.where(mask, b.q_positions.unsqueeze(-1) - b.k_positions, rel)
            covered |= mask
        return rel, covered


@dataclass(frozen=True)
class StreamingLLM(_PositionMap):
    """StreamingLLM (Xiao et al. 2023, arXiv 2309.17453): each query sees the first
    ``start_size`` keys (the attention sinks) and its last ``recent_size`` keys (itself
    included), with positions *within the cache*: the kept keys re-indexed 0..len-1 in cache
    order and the query at the index of its own key, len - 1 (mit-han-lab/streaming-llm,
    ``StartRecentKVCache.evict_for_space`` then ``pos_shift/modify_llama.py``, token by token).

    The key masks are causal (a key after its query is in no branch). A recent key keeps its distance i - j; a sink key j is at distance
    start_size + recent_size - 1 - j once the cache is full. Two branches: "direct" (the
    recent keys, and every key while i < start_size + recent_size, at positions i and j) and
    "sinks" (the evicted-window sinks, query at start_size + recent_size - 1). The reference's
    first prompt, prefilled in one pass without eviction, is not this map: here every query is
    treated as if decoded one token at a time.

    In a KV cache that keeps every key (the lab model's, run with
    :class:`posenc.encodings.BranchedRoPE`) the evicted keys are masked, not dropped: the
    attention is the reference's evicting cache's, the memory is not bounded.
    """

    start_size: int = 4
    recent_size: int = 512

    def __post_init__(self):
        _check_size(self.start_size, "start_size", minimum=0)
        _check_size(self.recent_size, "recent_size", minimum=1)

    def rules(self, i: Tensor, j: Tensor) -> list[Branch]:
        cache = self.start_size + self.recent_size
        past = j <= i
        recent = past & (j > i - self.recent_size)
        sink = past & (j < self.start_size)
        warm = (i < cache)  # the cache not yet full: nothing evicted, plain positions
        direct = recent | (sink & warm)
        sinks = sink & ~recent & ~warm
        return [Branch(i, j, direct), Branch(torch.clamp(i, max=cache - 1), j, sinks)]


@dataclass(frozen=True)
class SelfExtend(_PositionMap):
    """Self-Extend (Jin et al. 2024, arXiv 2401.01325): keys within ``neighbor_window`` of the
    query (distance i - j < neighbor_window) at their normal positions; farther keys at grouped
    positions, query i at i // group_size + neighbor_window - neighbor_window // group_size and
    key j at j // group_size, so that the grouped distances continue the neighbor ones.

    Integer floor division throughout, in prefill and decode alike: the reference's flash
    decode (datamllab/LongLM ``self_extend_patch/Llama.py``, ``flash_self_extend_forward``,
    q_len == 1) subtracts ``neighbor_window // group_size``, while its eager and flash prefill
    subtract ``neighbor_window / group_size``, a fraction when the window is not a multiple of
    the group: the two disagree there, and this map follows the decode (integer positions).
    Where the window is a multiple of the group the reference's paths agree with this map.
    """

    group_size: int = 8
    neighbor_window: int = 1024

    def __post_init__(self):
        _check_size(self.group_size, "group_size", minimum=1)
        _check_size(self.neighbor_window, "neighbor_window", minimum=1)

    def rules(self, i: Tensor, j: Tensor) -> list[Branch]:
        g, w = self.group_size, self.neighbor_window
        distance = i - j
        neighbor = (distance >= 0) & (distance < w)
        grouped_q = i // g + w - w // g
        return [Branch(i, j, neighbor), Branch(grouped_q, j // g, distance >= w)]


def streaming_llm(start_size: int = 4, recent_size: int = 512) -> StreamingLLM:
    """The StreamingLLM position map (:class:`StreamingLLM`); defaults are the reference's
    ``StartRecentKVCache(start_size=4, recent_size=512)``."""
    return StreamingLLM(start_size, recent_size)


def self_extend(group_size: int = 8, neighbor_window: int = 1024) -> SelfExtend:
    """The Self-Extend position map (:class:`SelfExtend`); defaults are the reference's
    (``group_size_1=8``, ``group_size_2=1024`` in datamllab/LongLM)."""
    return SelfExtend(group_size, neighbor_window)


# ReRoPE and Leaky ReRoPE (Su 2023, https://kexue.fm/archives/9708), reference code
# bojone/rerope ``rerope_patch.py`` and ``leaky_rerope_patch.py`` (transformers 4.31 patches).


def _log_n_query_scale(q_len: int, k_len: int, training_length: int, device=None) -> Tensor:
    """max(1, log(i + 1) / log(training_length)) at each query's absolute position i, float64
    (q_len,): bojone/rerope multiplies every query by it before any rotation."""
    i, _ = _query_and_key_indices(q_len, k_len, device)
    return _log_n_scale_at(i, training_length)


def _log_n_scale_at(positions: Tensor, training_length: int) -> Tensor:
    """max(1, log(p + 1) / log(training_length)), float64, at the integer positions p."""
    log_length = torch.tensor(float(training_length), dtype=torch.float64, device=positions.device).log()
    return ((positions + 1).to(torch.float64).log() / log_length).clamp(min=1.0)


def _check_training_length(value) -> None:
    check_positive_int(value, "training_length")
    if value < 2:  # log(training_length) is the divisor of the query scale
        raise InvalidArgument(f"training_length must be an int >= 2, got {value!r}")


@dataclass(frozen=True)
class _LogNScaled(_PositionMap):
    def query_scale(self, q_len: int, k_len: int, device=None) -> Tensor:
        """The log-n query scale, float64 (q_len,): max(1, log(i + 1) / log(training_length))
        at each query's absolute position i (the queries are the last q_len of k_len tokens).
        1 exactly for every query at i + 1 <= training_length."""
        return _log_n_query_scale(q_len, k_len, self.training_length, device)

    def query_scale_at(self, q_positions: Tensor) -> Tensor:
        """The log-n query scale at the queries' own positions, float64 of q_positions' shape:
        max(1, log(p + 1) / log(training_length)); :meth:`query_scale` at arange positions."""
        return _log_n_scale_at(q_positions, self.training_length)

    def scale_queries(self, q: Tensor, k_len: int) -> Tensor:
        """q (B, H, Tq, D) times :meth:`query_scale`, the scale cast to q's dtype first as the
        reference does (``.to(query_states.dtype)``); q itself, bit for bit, where every scale
        is 1. Apply it before :func:`branch_attention` (the scale multiplies every branch).

        Raises:
            InvalidType: q not a floating-point tensor.
            InvalidArgument: q not 4-d, or its Tq > k_len.
        """
        if not isinstance(q, Tensor) or not q.dtype.is_floating_point:
            raise InvalidType("q must be a floating-point tensor")
        if q.dim() != 4:
            raise InvalidArgument(f"q must be (B, H, Tq, D), got {tuple(q.shape)}")
        scale = self.query_scale(q.shape[2], k_len, q.device).to(q.dtype)
        return q * scale.unsqueeze(-1)


@dataclass(frozen=True)
class ReRoPE(_LogNScaled):
    """ReRoPE (Su 2023, "Rectified Rotary Position Embeddings"): keys within ``window`` of the
    query (0 <= i - j < window) at their normal distance i - j, every farther key at distance
    ``window`` exactly (the reference's query at position ``window``, key at 0), so no distance
    past the window is ever seen. Queries are scaled by max(1, log(i + 1) / log(training_length))
    (:meth:`query_scale`, :meth:`scale_queries`), as the reference does in prefill and decode.

    Reference: bojone/rerope ``rerope_patch.py`` (``forward_with_rerope``): prefill takes
    attn_weights1 (positions i, j) where |i - j| < window, else attn_weights2 (query at
    window, key unrotated); decode rotates keys by -clip(i - j, max=window). The same map.
    Defaults are its globals (``window = 512``, ``training_length = 4096``).
    """

    window: int = 512
    training_length: int = 4096

    def __post_init__(self):
        _check_size(self.window, "window", minimum=1)
        _check_training_length(self.training_length)

    def rules(self, i: Tensor, j: Tensor) -> list[Branch]:
        distance = i - j
        near = (distance >= 0) & (distance < self.window)
        capped_q = torch.full_like(i, self.window)
        return [Branch(i, j, near), Branch(capped_q, torch.zeros_like(j), distance >= self.window)]


@dataclass(frozen=True)
class LeakyReRoPE(_LogNScaled):
    """Leaky ReRoPE (Su 2023): keys within ``window`` at distance i - j; farther keys at
    window + (i - j - window) / scaling_factor, slope 1/scaling_factor past the window. Queries
    log-n scaled as :class:`ReRoPE`.

    A fractional distance cannot come from integer positions at the plain frequencies, and
    ``RoPE.rotate`` takes integer positions only. So the branches' positions are in units of
    1/scaling_factor: the near branch at (s i, s j), the far branch at (i + window (s - 1), j),
    and ``rotate`` must be RoPE at frequencies theta/s, i.e.
    ``RoPE(head_dim, scaling={"rope_type": "linear", "factor": s})`` (this module may not
    import RoPE: the attention layer sees the encodings' protocol only), the
    reference's ``LlamaLinearScalingRotaryEmbedding`` for the far branch. Inside the window the
    angles s i theta/s equal plain RoPE's i theta to float rounding only (not bit for bit);
    ``scaling_factor`` is an integer, as the reference's table offset window (s - 1) needs.

    Reference: bojone/rerope ``leaky_rerope_patch.py`` (``forward_with_leaky_rerope``): the
    far branch rotates the query at i + offset, offset = window (scaling_factor - 1), and the
    key at j, both by the linear-scaled table; decode takes the key table's first ``window``
    rows from the plain table and the rest from the scaled one at d + offset. Defaults are
    its globals (``window = 512``, ``scaling_factor = 16``, ``training_length = 4096``).
    """

    window: int = 512
    scaling_factor: int = 16
    training_length: int = 4096

    def __post_init__(self):
        _check_size(self.window, "window", minimum=1)
        _check_size(self.scaling_factor, "scaling_factor", minimum=1)
        _check_training_length(self.training_length)

    def rules(self, i: Tensor, j: Tensor) -> list[Branch]:
        """Positions in units of 1/scaling_factor: rotate with a linear-scaled RoPE (the class)."""
        s, w = self.scaling_factor, self.window
        distance = i - j
        near = (distance >= 0) & (distance < w)
        return [Branch(s * i, s * j, near), Branch(i + w * (s - 1), j, distance >= w)]

    @property
    def frequency_divisor(self) -> int:
        """scaling_factor: the branches' positions are in units of 1/scaling_factor."""
        return self.scaling_factor

    def relative_positions(self, q_len: int, k_len: int) -> tuple[Tensor, Tensor]:
        """(rel, covered) as the base class, but rel in float64 in units of one position:
        i - j inside the window, window + (i - j - window) / scaling_factor past it."""
        rel, covered = super().relative_positions(q_len, k_len)
        return rel.to(torch.float64) / self.scaling_factor, covered


def rerope(window: int = 512, training_length: int = 4096) -> ReRoPE:
    """The ReRoPE position map (:class:`ReRoPE`); defaults are bojone/rerope's."""
    return ReRoPE(window, training_length)


def leaky_rerope(window: int = 512, scaling_factor: int = 16, training_length: int = 4096) -> LeakyReRoPE:
    """The Leaky ReRoPE position map (:class:`LeakyReRoPE`); defaults are bojone/rerope's."""
    return LeakyReRoPE(window, scaling_factor, training_length)


def _check_size(value, argname: str, *, minimum: int) -> None:
    if minimum >= 1:
        check_positive_int(value, argname)
    elif isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidArgument(f"{argname} must be an int >= {minimum}, got {value!r}")


# ---------------------------------------------------------------- LM-Infinite and DCA (issue 26, item 2)


@dataclass(frozen=True)
class LMInfinite(_PositionMap):
    """LM-Infinite (Han et al. 2023, arXiv 2308.16137): a Λ-shaped mask and a distance limit.
    Each query sees its last ``local_branch`` keys (distance i - j < local_branch, itself
    included) at their normal positions, and the first ``global_branch`` keys beyond that at
    the capped distance ``local_branch`` (query rotated at local_branch, key unrotated, as
    the reference's "stationary" branch: Glaciohound/LM-Infinite ``models/llama.py``
    ``convert_llama_model`` with ``limit_distance = local_branch``, and
    ``models/lambda_attention.py``). The middle keys are in no branch.

    The reference rotates the stationary query at min(limit_distance, kv_len - 1); a global
    key beyond the local branch implies kv_len - 1 >= local_branch, so the two agree.
    """

    local_branch: int = 2048
    global_branch: int = 100

    def __post_init__(self):
        _check_size(self.local_branch, "local_branch", minimum=1)
        _check_size(self.global_branch, "global_branch", minimum=0)

    def rules(self, i: Tensor, j: Tensor) -> list[Branch]:
        distance = i - j
        local = (distance >= 0) & (distance < self.local_branch)
        stationary = (distance >= self.local_branch) & (j < self.global_branch)
        return [Branch(i, j, local),
                Branch(torch.full_like(i, self.local_branch), torch.zeros_like(j), stationary)]


@dataclass(frozen=True)
class DualChunk(_PositionMap):
    """Dual Chunk Attention (An et al. 2024, "Training-Free Long-Context Scaling of Large
    Language Models", arXiv 2402.17463; HKUNLP/ChunkLlama ``chunkllama_attn_replace.py``).

    The sequence is cut into chunks of c = chunk_size - local_size tokens; every key is
    rotated at j mod c. Query i (chunk i // c, in-chunk position p = i mod c) sees
    - intra-chunk: the keys of its own chunk, query at p (distance i - j);
    - successive-chunk: the keys of the previous chunk, query at min(p + c, chunk_size);
    - inter-chunk: the keys of all earlier chunks, query at min(2c - 1, chunk_size).
    Distances never exceed chunk_size. Names as Qwen's ``dual_chunk_attention_config``
    (``chunk_size``, ``local_size``); see :meth:`from_config`.
    """

    chunk_size: int = 3072
    local_size: int = 256

    def __post_init__(self):
        _check_size(self.chunk_size, "chunk_size", minimum=2)
        _check_size(self.local_size, "local_size", minimum=0)
        if self.local_size >= self.chunk_size:
            raise InvalidArgument(f"local_size must be < chunk_size, got local_size={self.local_size}, "
                                  f"chunk_size={self.chunk_size}")

    @classmethod
    def from_config(cls, config) -> DualChunk:
        """From a Hugging Face config (or its dict) holding ``dual_chunk_attention_config``
        (Qwen2.5-1M, Qwen3), or from that dict itself: reads ``chunk_size`` and ``local_size``.

        Raises:
            MissingKey: no ``chunk_size`` or ``local_size``.
            InvalidType: config is neither a mapping nor has ``dual_chunk_attention_config``.
        """

        if not isinstance(config, dict):
            config = getattr(config, "dual_chunk_attention_config", None)
            if not isinstance(config, dict):
                raise InvalidType("config must be a dict or have a dual_chunk_attention_config dict")
        config = config.get("dual_chunk_attention_config", config)
        missing = [key for key in ("chunk_size", "local_size") if key not in config]
        if missing:
            raise MissingKey(f"dual_chunk_attention_config lacks {missing}")
        return cls(config["chunk_size"], config["local_size"])

    def rules(self, i: Tensor, j: Tensor) -> list[Branch]:
        c = self.chunk_size - self.local_size
        q_chunk, k_chunk = (i // c), j // c
        p = i % c
        causal = j <= i
        intra = causal & (k_chunk == q_chunk)
        successive = k_chunk == q_chunk - 1
        inter = k_chunk < q_chunk - 1
        q_succ = torch.clamp(p + c, max=self.chunk_size)
        q_inter = torch.full_like(i, min(2 * c - 1, self.chunk_size))
        k_pos = j % c
        return [Branch(p, k_pos, intra), Branch(q_succ, k_pos, successive), Branch(q_inter, k_pos, inter)]


def lm_infinite(local_branch: int = 2048, global_branch: int = 100) -> LMInfinite:
    """The LM-Infinite position map (:class:`LMInfinite`); defaults are the reference's
    (``--local_branch 2048 --global_branch 100`` in Glaciohound/LM-Infinite
    ``utils/arguments.py``; its Llama 2 scripts pass local_branch 4096, the training length)."""
    return LMInfinite(local_branch, global_branch)


def dca(chunk_size: int = 3072, local_size: int = 256) -> DualChunk:
    """The Dual Chunk Attention position map (:class:`DualChunk`); defaults are the
    reference's for a 4096-token model (``replace_with_chunkllama(pretraining_length=4096)``:
    chunk_size = 3/4 of it, local window 1/16 of it)."""
    return DualChunk(chunk_size, local_size)


# ---------------------------------------------------------------- STRING (issue 26, item 2)

# STRING's attention factor, 0.1 ln 2 + 1 (HKUNLP/STRING ``replace_with_string``).
_STRING_ATTENTION_FACTOR = 0.1 * math.log(2) + 1


@dataclass(frozen=True)
class String(_PositionMap):
    """STRING (An et al. 2024, "Why Does the Effective Context Length of LLMs Fall Short?",
    arXiv 2410.18745; reference code HKUNLP/STRING ``string_for_llama.py``): distances
    d = i - j >= ``shifted_offset`` are shifted down to d - shifted_offset + local_value, so far
    keys reuse the well-trained small distances; nearer keys (d < shifted_offset) keep d.
    Two branches: "diagonal" (0 <= d < shifted_offset, positions i and j) and "shifted"
    (d >= shifted_offset, query at i - shifted_offset + local_value, key at j).

    The reference's prefill (``string_flash_forward``) counts the key at d = shifted_offset
    twice: its diagonal pass is flash-attn's ``window_size=[shifted_offset, 0]`` (0 <= d <=
    shifted_offset) and its shifted pass takes the keys j <= i - shifted_offset; the two are
    merged by log-sum-exp. Branches here are disjoint, and that key goes to the shifted branch
    only (distance local_value), as in the reference's decode (flash decoding over the last
    shifted_offset keys, d < shifted_offset, and over the rest). Inside the window (every
    d < shifted_offset) this is plain RoPE.

    The reference also multiplies its cos and sin tables by its attention factor
    (0.1 ln 2 + 1, :attr:`attention_factor`), i.e. every logit by its square, at every position; that is a
    temperature, not a position, so the branches do not apply it: pass
    ``scale=map.attention_factor ** 2 / sqrt(D)`` to :func:`branch_attention` to match it;
    :class:`posenc.encodings.BranchedRoPE` applies it (:attr:`logit_factor`).
    """

    shifted_offset: int = int(0.33 * 4096)
    local_value: int = 128
    #: the reference's cos/sin multiplier, 0.1 ln 2 + 1 (not applied by the map); 1.0: none
    attention_factor: float = _STRING_ATTENTION_FACTOR

    def __post_init__(self):
        _check_size(self.shifted_offset, "shifted_offset", minimum=1)
        _check_size(self.local_value, "local_value", minimum=0)
        if self.local_value >= self.shifted_offset:
            raise InvalidArgument(f"local_value must be < shifted_offset, got local_value={self.local_value}, "
                                  f"shifted_offset={self.shifted_offset}")
        factor = self.attention_factor
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor < math.inf:
            raise InvalidArgument(f"attention_factor must be a positive finite number, got {factor!r}")

    @property
    def logit_factor(self) -> float:
        """attention_factor ** 2: the reference's cos and sin both carry the factor."""
        return float(self.attention_factor) ** 2

    def rules(self, i: Tensor, j: Tensor) -> list[Branch]:
        s, w = self.shifted_offset, self.local_value
        distance = i - j
        diagonal = (distance >= 0) & (distance < s)
        # queries before shifted_offset have no shifted key; clamping keeps their unused
        # positions non-negative (a rotation table may not take negative indices)
        shifted_q = torch.clamp(i - s + w, min=w)
        return [Branch(i, j, diagonal), Branch(shifted_q, j, distance >= s)]


def string(training_length: int = 4096, shifted_offset: int | None = None, local_value: int = 128,
           attention_factor: float = _STRING_ATTENTION_FACTOR) -> String:
    """The STRING position map (:class:`String`). Defaults are the reference's:
    ``shifted_offset = int(0.33 * L)`` for the training length L
    (``config.max_position_embeddings``; 4096 here, 131072 for Llama 3.1),
    ``small_local_value = 128`` and the cos/sin factor 0.1 ln 2 + 1. An explicit
    ``shifted_offset`` overrides the derived one.

    Raises:
        InvalidArgument: training_length not a positive int, a shifted_offset < 1 (given or
            derived), local_value < 0, local_value >= shifted_offset, or attention_factor
            not a positive finite number.
    """
    check_positive_int(training_length, "training_length")
    if shifted_offset is None:
        shifted_offset = int(0.33 * training_length)
        if shifted_offset < 1:
            raise InvalidArgument(f"training_length must be >= 4 (shifted_offset = int(0.33 * training_length) "
                                  f"must be >= 1), got {training_length!r}")
    return String(shifted_offset, local_value, attention_factor)



# ---------------------------------------------------------------- windowed YaRN (issue 36, item 5)


@dataclass(frozen=True)
class WindowedYaRN(_PositionMap):
    """Plain RoPE within a local window, YaRN beyond it. Keys at distance d = i - j <
    ``window`` are rotated by the model's own RoPE at positions i and j, as in training; farther
    keys by YaRN at ``factor`` s (Peng et al. 2023, "YaRN", arXiv 2309.00071, sec. 3.2-3.4: its
    "NTK-by-parts" frequencies, theta_i / s on the slow pairs and theta_i on the fast ones with
    the ramp of ``beta_fast`` and ``beta_slow`` over L0 = ``training_length``, and its
    attention factor, default 0.1 ln s + 1, on cos and sin, i.e. those keys' logits times its
    square), at the same positions i and j. Two branches: "near" (0 <= d < window) and "far"
    (d >= window), both at (i, j); the far branch's YaRN is :attr:`branch_scalings`.

    A combination, not a reference's method (issue 36, item 5 asks for "a YaRN-scaled global
    branch under a local window"): Leaky ReRoPE (Su 2023) splits the keys the same way and
    interpolates the far ones linearly; here they are interpolated as YaRN does, whose
    s = N / L0 keeps every slow pair's angle inside the range trained at L0 up to N tokens,
    while the near keys keep the exact positions a truncation to the window would give them.
    No distance is remapped: inside the window (every d < window) this is plain RoPE bit for
    bit, and at s = 1 (YaRN's frequencies theta, attention factor 1) plain RoPE everywhere.

    ``attention_factor`` None is YaRN's default 0.1 ln s + 1, as Hugging Face's ``yarn``
    computes it; 1.0 leaves the far logits' temperature alone.
    """

    factor: float = 1.0
    window: int = 3584
    training_length: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None

    def __post_init__(self):
        check_number(self.factor, "factor", ge=1.0)
        _check_size(self.window, "window", minimum=1)
        check_positive_int(self.training_length, "training_length")
        check_number(self.beta_fast, "beta_fast", gt=0.0)
        check_number(self.beta_slow, "beta_slow", gt=0.0)
        if self.beta_fast < self.beta_slow:
            raise InvalidArgument(f"beta_fast must be >= beta_slow, got beta_fast={self.beta_fast!r}, "
                                  f"beta_slow={self.beta_slow!r}")
        if self.attention_factor is not None:
            check_number(self.attention_factor, "attention_factor", gt=0.0)

    def rules(self, i: Tensor, j: Tensor) -> list[Branch]:
        distance = i - j
        near = (distance >= 0) & (distance < self.window)
        return [Branch(i, j, near), Branch(i, j, distance >= self.window)]

    @property
    def branch_scalings(self) -> dict[int, dict]:
        """The far branch's (index 1) YaRN, in Hugging Face's ``rope_parameters`` spelling."""
        scaling = {"rope_type": "yarn", "factor": float(self.factor),
                   "original_max_position_embeddings": self.training_length,
                   "beta_fast": float(self.beta_fast), "beta_slow": float(self.beta_slow)}
        if self.attention_factor is not None:
            scaling["attention_factor"] = float(self.attention_factor)
        return {1: scaling}


def windowed_yarn(factor: float | None = None, window: int = 3584, training_length: int = 4096,
                  beta_fast: float = 32.0, beta_slow: float = 1.0,
                  attention_factor: float | None = None) -> WindowedYaRN:
    """The windowed-YaRN position map (:class:`WindowedYaRN`). ``factor`` is YaRN's s, which
    its paper sets to N / L0 for inputs of N tokens (sec. 2); no default is published for a
    length no one named, so it must be given (``extend_context(..., target_length=N)`` sets
    it). ``window`` defaults to 7 L0 / 8 (3584 for L0 = 4096, scaled with the training length
    by :data:`MAP_METHODS`): the nearest 7/8 of the training length at their trained
    positions, as the truncation baseline of issue 36 keeps them; ``beta_fast``,
    ``beta_slow`` and ``attention_factor`` are YaRN's (32, 1, 0.1 ln s + 1).

    Raises:
        InvalidArgument: factor missing or < 1, window or training_length not a positive int,
            beta_fast < beta_slow or either not positive, attention_factor not positive.
    """
    if factor is None:
        raise InvalidArgument("factor: windowed_yarn needs YaRN's factor s >= 1 (s = N / L0 for N-token inputs); "
                              "give factor=, or target_length=N to extend_context")
    return WindowedYaRN(factor, window, training_length, beta_fast, beta_slow, attention_factor)


# ---------------------------------------------------------------- the methods, one record each

#: The context the references state their numbers for (Llama 2's 4096 tokens).
REFERENCE_LENGTH = 4096


@dataclass(frozen=True)
class MapMethod:
    """Everything said about one branch-merge method, once: its name, its map, the parameters
    it takes and the reference's defaults.

    Attributes:
        name: the method's name (``"self_extend"``, ...), the key of :data:`MAP_METHODS`.
        map_class: the map's class (:class:`SelfExtend`, ...).
        factory: builds the map from the reference's parameter names
            (:func:`self_extend`, ...); :attr:`parameters` are its arguments.
        reference_defaults: the reference's defaults for a model trained at
            :data:`REFERENCE_LENGTH` (Llama 2, L0 = 4096), by parameter name, in tokens where
            they are lengths.
        proportional: the parameters the reference derives from the training length L0 (a
            fraction of it); the others it fixes.
        lengths: the parameters that are token counts (windows, chunks, lengths); the rest
            are ratios or counts that stay as they are at any length.
        attention_factor: what the reference multiplies cos and sin by (every logit by its
            square): STRING's 0.1 ln 2 + 1, 1 for the others.
        source: the reference code the defaults are read from.
    """

    name: str
    map_class: type
    factory: Callable[..., _PositionMap]
    reference_defaults: dict[str, int]
    proportional: tuple[str, ...] = ()
    lengths: tuple[str, ...] = ()
    attention_factor: float = 1.0
    source: str = ""

    @property
    def parameters(self) -> tuple[str, ...]:
        """The parameter names :attr:`factory` (and :func:`position_map`) takes."""
        return tuple(inspect.signature(self.factory).parameters)

    def defaults(self, training_length: int) -> dict[str, int]:
        """The reference's defaults for a model trained at L0 = ``training_length``: the
        :attr:`proportional` ones scaled by L0 / 4096 (floor, as the references' integer
        arithmetic: ChunkLlama's ``3 * L0 // 4``), the others as the reference fixes them.

        Raises:
            InvalidArgument: training_length not a positive int.
        """
        check_positive_int(training_length, "training_length")
        return {name: value * training_length // REFERENCE_LENGTH if name in self.proportional else value
                for name, value in self.reference_defaults.items()}

    def scaled_defaults(self, training_length: int) -> dict[str, int]:
        """Every :attr:`lengths` parameter of the reference's defaults scaled by L0 / 4096,
        rounded, at least 1 (ratios and counts kept): the methods at the proportions the
        references chose for Llama 2, for a model trained at another length (the lab's small
        models; docs/results.md). The derived ones (:attr:`proportional`) agree with
        :meth:`defaults` up to rounding.

        Raises:
            InvalidArgument: training_length not a positive int.
        """
        check_positive_int(training_length, "training_length")
        return {name: max(1, round(value * training_length / REFERENCE_LENGTH)) if name in self.lengths else value
                for name, value in self.reference_defaults.items()}


#: The eight methods by name, one record each (:class:`MapMethod`): the one statement of their
#: names, maps, parameters and reference defaults, which :func:`position_map`,
#: :class:`posenc.encodings.BranchedRoPE`, the lab's extension rows and the Hugging Face
#: integration read.
MAP_METHODS: dict[str, MapMethod] = {m.name: m for m in (
    MapMethod("self_extend", SelfExtend, self_extend, {"group_size": 8, "neighbor_window": 1024},
              lengths=("neighbor_window",), source="datamllab/LongLM (group_size_1=8, group_size_2=1024)"),
    MapMethod("rerope", ReRoPE, rerope, {"window": 512, "training_length": 4096},
              proportional=("training_length",), lengths=("window", "training_length"),
              source="bojone/rerope rerope_patch.py (window 512, training_length the model's)"),
    MapMethod("leaky_rerope", LeakyReRoPE, leaky_rerope, {"window": 512, "scaling_factor": 16, "training_length": 4096},
              proportional=("training_length",), lengths=("window", "training_length"),
              source="bojone/rerope leaky_rerope_patch.py"),
    MapMethod("dca", DualChunk, dca, {"chunk_size": 3072, "local_size": 256},
              proportional=("chunk_size", "local_size"), lengths=("chunk_size", "local_size"),
              source="HKUNLP/ChunkLlama replace_with_chunkllama (chunk 3 L0 / 4, local window L0 / 16)"),
    MapMethod("string", String, string, {"training_length": 4096, "local_value": 128},
              proportional=("training_length",), lengths=("training_length", "local_value"),
              attention_factor=_STRING_ATTENTION_FACTOR,
              source="HKUNLP/STRING (shifted_offset int(0.33 L0), small_local_value 128, factor 0.1 ln 2 + 1)"),
    MapMethod("lm_infinite", LMInfinite, lm_infinite, {"local_branch": 4096, "global_branch": 100},
              proportional=("local_branch",), lengths=("local_branch", "global_branch"),
              source="Glaciohound/LM-Infinite (its Llama 2 scripts: local_branch L0, global_branch 100)"),
    MapMethod("streaming_llm", StreamingLLM, streaming_llm, {"start_size": 4, "recent_size": 512},
              lengths=("recent_size",), source="mit-han-lab/streaming-llm StartRecentKVCache(4, 512)"),
    MapMethod("windowed_yarn", WindowedYaRN, windowed_yarn,
              {"factor": None, "window": 3584, "training_length": 4096, "beta_fast": 32.0, "beta_slow": 1.0,
               "attention_factor": None},
              proportional=("window", "training_length"), lengths=("window", "training_length"),
              source="posenc (issue 36): window 7 L0 / 8; YaRN's beta_fast 32, beta_slow 1, 0.1 ln s + 1 past it"),
)}

#: The maps by method name -> their factory (each takes the reference's parameter names, with
#: its published defaults): what :func:`position_map` and :func:`posenc.encodings.branched`
#: build from a name; :data:`MAP_METHODS` read.
METHODS: dict[str, Callable[..., _PositionMap]] = {name: method.factory for name, method in MAP_METHODS.items()}


def position_map(method: str, **params) -> _PositionMap:
    """The map of ``method`` (a key of :data:`METHODS`) with its parameters, e.g.
    ``position_map("self_extend", group_size=8, neighbor_window=1024)``.

    Raises:
        InvalidArgument: an unknown method (the message lists them), or a bad parameter (the
            map's own check, naming it); an unexpected parameter name (the message names the
            method's parameters).
    """
    if not isinstance(method, str) or method not in METHODS:
        raise InvalidArgument(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    factory = METHODS[method]
    allowed = list(inspect.signature(factory).parameters)
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise InvalidArgument(f"{method} takes {', '.join(allowed)}; got unexpected {', '.join(unknown)}")
    return factory(**params)
