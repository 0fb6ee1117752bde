"""Branch-merge attention: several ordinary attentions over disjoint key sets, each with its
own RoPE positions, merged exactly by log-sum-exp (issue 26, item 2; first increment).

A *branch* is ``(q_positions, k_positions, key_mask)``: int64 positions (Tq,) and (Tk,) at
which the queries and keys are rotated, and a bool (Tq, Tk) mask of the keys this branch
takes for each query. The branches of one call take disjoint key sets; their union is what
the query sees. The softmax over the union is recovered exactly from each branch's output o_b
and log-sum-exp l_b (the identity flash-decoding and ring attention rely on):

    out = sum_b exp(l_b - m) o_b / sum_b exp(l_b - m),   m = max_b l_b.

The training-free context extensions are position maps of this kind; this module has seven,
each named and parameterized as its reference code spells it: :func:`streaming_llm` (Xiao et
al. 2023, "Efficient Streaming Language Models with Attention Sinks"), :func:`self_extend`
(Jin et al. 2024, "LLM Maybe LongLM: Self-Extend LLM Context Window Without Tuning"),
:func:`rerope` and :func:`leaky_rerope` (Su 2023, bojone/rerope, with their log-n query
scaling), :func:`lm_infinite` (Han et al. 2023, "LM-Infinite"), :func:`dca` (An et al. 2024,
"Training-Free Long-Context Scaling of Large Language Models", ChunkLlama) and :func:`string`
(An et al. 2024, "Why Does the Effective Context Length of LLMs Fall Short?", STRING). Eager
math only in this increment (T² scores per branch); the backends (sdpa, blocked, flex) and
the KV cache are not wired yet (docs/fast_attention.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from posenc._validation import check_positive_int
from posenc.errors import InvalidArgument, InvalidType, MissingKey

__all__ = [
    "MERGE_MODES",
    "Branch",
    "DualChunk",
    "LMInfinite",
    "LeakyReRoPE",
    "ReRoPE",
    "SelfExtend",
    "StreamingLLM",
    "String",
    "branch_attention",
    "dca",
    "leaky_rerope",
    "lm_infinite",
    "merge_by_lse",
    "rerope",
    "self_extend",
    "streaming_llm",
    "string",
]

#: How :func:`branch_attention` combines its branches: ``"lse"`` (one attention per branch,
#: merged by :func:`merge_by_lse`) or ``"select"`` (each logit taken from the branch that
#: covers it, then one softmax: eager only, T² memory).
MERGE_MODES = ("lse", "select")

Rotate = Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]


class Branch(NamedTuple):
    """One branch: queries rotated at ``q_positions`` (int64 (Tq,)), keys at ``k_positions``
    (int64 (Tk,)), taking the keys where ``key_mask`` (bool (Tq, Tk)) is True."""

    q_positions: Tensor
    k_positions: Tensor
    key_mask: Tensor


def merge_by_lse(outputs: Tensor | Sequence[Tensor], lses: Tensor | Sequence[Tensor]) -> Tensor:
    """The attention over the union of n disjoint key sets, from each set's attention.

    Args:
        outputs: (n, B, H, Tq, D), or a list of n tensors (B, H, Tq, D): each branch's
            softmax-weighted values over its own keys.
        lses: (n, B, H, Tq) float, or a list of n (B, H, Tq): each branch's log-sum-exp of its
            scores over its keys, -inf where the branch has no key for that query (its output
            row is then ignored, whatever it holds).

    Returns (B, H, Tq, D) in the outputs' dtype, accumulated in float32 (float64 for float64
    inputs): exactly the softmax over the union of the keys. A row that no branch covers
    (every l_b = -inf) is 0, as an attention over no key is here, not NaN.

    Raises:
        InvalidType: outputs or lses not tensors, or lses not floating point.
        InvalidArgument: no branch, or shapes that do not match (n, B, H, Tq[, D]).
    """
    outputs, lses = _stacked(outputs, "outputs"), _stacked(lses, "lses")
    if not lses.dtype.is_floating_point:
        raise InvalidType(f"lses must be a floating-point tensor, got {lses.dtype}")
    if outputs.dim() != 5 or lses.shape != outputs.shape[:-1]:
        raise InvalidArgument(f"outputs must be (n, B, H, Tq, D) and lses (n, B, H, Tq), got {tuple(outputs.shape)} "
                              f"and {tuple(lses.shape)}")
    acc = torch.promote_types(torch.promote_types(outputs.dtype, lses.dtype), torch.float32)
    lses = lses.to(acc)
    top = lses.amax(dim=0)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))  # all -inf rows: weights exp(-inf) = 0
    weights = torch.exp(lses - top)
    # a branch with no key may hold anything (NaN from a softmax over no key): it must not reach the sum
    terms = torch.where(weights.unsqueeze(-1) > 0, weights.unsqueeze(-1) * outputs.to(acc), 0.0)
    total = weights.sum(dim=0)
    merged = terms.sum(dim=0) / torch.where(total > 0, total, torch.ones_like(total)).unsqueeze(-1)
    return merged.to(outputs.dtype)


def _stacked(x, argname: str) -> Tensor:
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (list, tuple)) and x and all(isinstance(t, Tensor) for t in x):
        shapes = {tuple(t.shape) for t in x}
        if len(shapes) != 1:
            raise InvalidArgument(f"{argname} must all have one shape, got {sorted(shapes)}")
        return torch.stack(list(x))
    if isinstance(x, (list, tuple)) and not x:
        raise InvalidArgument(f"{argname} must hold at least one branch, got none")
    raise InvalidType(f"{argname} must be a tensor or a non-empty list of tensors, got {type(x).__name__}")


def branch_attention(q: Tensor, k: Tensor, v: Tensor, *, rotate: Rotate, branches: Sequence[Branch],
                     scale: float | None = None, causal: bool = True, merge: str = "lse") -> Tensor:
    """Attention whose keys are split into branches, each rotated at its own positions.

    Args:
        q: (B, H, Tq, D); k, v: (B, H_kv, Tk, D), H a multiple of H_kv. The queries are the last
            Tq of the Tk tokens (query t at absolute position Tk - Tq + t), prefill or decode.
        rotate: ``rotate(q, k, q_positions, k_positions) -> (q, k)``, e.g. ``RoPE.rotate``.
        branches: :class:`Branch` es with disjoint key masks (checked outside torch.compile).
        scale: the logit scale, default 1/sqrt(D).
        causal: also mask the keys after each query's absolute position.
        merge: one of :data:`MERGE_MODES`; both give the same result (to rounding).

    Returns (B, H, Tq, D) in q's dtype; scores, softmax and merge in float32 (float64 for
    float64 inputs). A query row that no branch covers is 0.

    Raises:
        InvalidArgument: an unknown merge, mismatched shapes, positions or masks of the wrong
            shape, overlapping branches, or no branch.
        InvalidType: positions that are not integer tensors, a mask that is not bool.
    """
    if merge not in MERGE_MODES:
        raise InvalidArgument(f"merge must be one of {MERGE_MODES}, got {merge!r}")
    q_len, k_len = _check_qkv(q, k, v)
    _check_branches(branches, q_len, k_len)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    allowed = _causal_mask(q_len, k_len, q.device) if causal else None
    acc = torch.promote_types(q.dtype, torch.float32)
    group = q.shape[1] // k.shape[1]
    values = v.repeat_interleave(group, dim=1).to(acc) if group > 1 else v.to(acc)
    scores, masks = [], []
    for branch in branches:
        q_rot, k_rot = rotate(q, k, branch.q_positions, branch.k_positions)
        if group > 1:
            k_rot = k_rot.repeat_interleave(group, dim=1)
        scores.append(torch.matmul(q_rot.to(acc), k_rot.to(acc).transpose(-1, -2)) * scale)
        masks.append(branch.key_mask.to(q.device) if allowed is None else branch.key_mask.to(q.device) & allowed)
    if merge == "select":
        return _select_then_softmax(scores, masks, values).to(q.dtype)
    outputs, lses = zip(*(_masked_attention(s, m, values) for s, m in zip(scores, masks)))
    return merge_by_lse(list(outputs), list(lses)).to(q.dtype)


def _masked_attention(scores: Tensor, mask: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
    """One branch's output and log-sum-exp; rows with no key give output 0 and lse -inf."""
    scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.softmax(scores, dim=-1)
    probs = torch.where(mask.any(dim=-1, keepdim=True), probs, torch.zeros_like(probs))
    return torch.matmul(probs, values), lse


def _select_then_softmax(scores: list[Tensor], masks: list[Tensor], values: Tensor) -> Tensor:
    logits = torch.full_like(scores[0], float("-inf"))
    for s, m in zip(scores, masks):
        logits = torch.where(m, s, logits)
    covered = torch.stack(masks).any(dim=0).any(dim=-1, keepdim=True)
    probs = torch.where(covered, torch.softmax(logits, dim=-1), torch.zeros_like(logits))
    return torch.matmul(probs, values)


def _causal_mask(q_len: int, k_len: int, device) -> Tensor:
    rows = torch.arange(k_len - q_len, k_len, device=device).unsqueeze(-1)
    return torch.arange(k_len, device=device) <= rows


def _check_qkv(q: Tensor, k: Tensor, v: Tensor) -> tuple[int, int]:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor) or not x.dtype.is_floating_point:
            raise InvalidType(f"{name} must be a floating-point tensor")
        if x.dim() != 4:
            raise InvalidArgument(f"{name} must be (B, H, T, D), got {tuple(x.shape)}")
    if k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1] or q.shape[1] % k.shape[1]:
        raise InvalidArgument(f"q (B, H, Tq, D) and k, v (B, H_kv, Tk, D) with H a multiple of H_kv expected, got "
                              f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[2] > k.shape[2]:
        raise InvalidArgument(f"the queries are the last Tq of the Tk keys: Tq <= Tk, got {q.shape[2]} > {k.shape[2]}")
    return q.shape[2], k.shape[2]


def _check_branches(branches: Sequence[Branch], q_len: int, k_len: int) -> None:
    if not isinstance(branches, (list, tuple)) or not branches:
        raise InvalidArgument("branches must be a non-empty list of (q_positions, k_positions, key_mask)")
    for i, branch in enumerate(branches):
        if not isinstance(branch, (tuple, list)) or len(branch) != 3:
            raise InvalidArgument(f"branches[{i}] must be (q_positions, k_positions, key_mask)")
        q_pos, k_pos, mask = branch
        for name, pos, n in (("q_positions", q_pos, q_len), ("k_positions", k_pos, k_len)):
            if not isinstance(pos, Tensor) or pos.dtype.is_floating_point or pos.dtype == torch.bool:
                raise InvalidType(f"branches[{i}].{name} must be an integer tensor")
            if pos.shape != (n,):
                raise InvalidArgument(f"branches[{i}].{name} must have shape ({n},), got {tuple(pos.shape)}")
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            raise InvalidType(f"branches[{i}].key_mask must be a bool tensor")
        if mask.shape != (q_len, k_len):
            raise InvalidArgument(f"branches[{i}].key_mask must have shape ({q_len}, {k_len}), got {tuple(mask.shape)}")
    if not torch.compiler.is_compiling() and len(branches) > 1:
        overlap = torch.stack([b[2].to(branches[0][2].device) for b in branches]).sum(dim=0).max()
        if int(overlap) > 1:
            raise InvalidArgument("branches must take disjoint keys: a (query, key) pair is in two key masks")


def _query_and_key_indices(q_len: int, k_len: int, device) -> tuple[Tensor, Tensor]:
    """Absolute positions of the queries (the last q_len tokens) as a column, and of the keys."""
    if q_len > k_len:
        raise InvalidArgument(f"q_len must be <= k_len, got {q_len} > {k_len}")
    i = torch.arange(k_len - q_len, k_len, device=device, dtype=torch.int64)
    return i, torch.arange(k_len, device=device, dtype=torch.int64)


@dataclass(frozen=True)
class _PositionMap:
    def branches(self, q_len: int, k_len: int, device=None) -> list[Branch]:  # pragma: no cover - abstract
        raise NotImplementedError

    def relative_positions(self, q_len: int, k_len: int) -> tuple[Tensor, Tensor]:
        """The map as a matrix: (rel, covered), int64 and bool (q_len, k_len); rel[t, j] is the
        rotation distance q_position - k_position of the branch that takes key j for query t
        (0 where none does, ``covered`` False). Causal: keys after the query are not covered."""
        rel = torch.zeros(q_len, k_len, dtype=torch.int64)
        covered = torch.zeros(q_len, k_len, dtype=torch.bool)
        causal = _causal_mask(q_len, k_len, None)
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
    """

    start_size: int = 4
    recent_size: int = 512

    def __post_init__(self):
        _check_size(self.start_size, "start_size", minimum=0)
        _check_size(self.recent_size, "recent_size", minimum=1)

    def branches(self, q_len: int, k_len: int, device=None) -> list[Branch]:
        i, j = _query_and_key_indices(q_len, k_len, device)
        cache = self.start_size + self.recent_size
        past = j <= i.unsqueeze(-1)
        recent = past & (j > i.unsqueeze(-1) - self.recent_size)
        sink = past & (j < self.start_size)
        warm = (i < cache).unsqueeze(-1)  # the cache not yet full: nothing evicted, plain positions
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

    def branches(self, q_len: int, k_len: int, device=None) -> list[Branch]:
        i, j = _query_and_key_indices(q_len, k_len, device)
        g, w = self.group_size, self.neighbor_window
        distance = i.unsqueeze(-1) - j
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
    log_length = torch.tensor(float(training_length), dtype=torch.float64, device=i.device).log()
    return ((i + 1).to(torch.float64).log() / log_length).clamp(min=1.0)


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

    def branches(self, q_len: int, k_len: int, device=None) -> list[Branch]:
        i, j = _query_and_key_indices(q_len, k_len, device)
        distance = i.unsqueeze(-1) - j
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

    def branches(self, q_len: int, k_len: int, device=None) -> list[Branch]:
        """Positions in units of 1/scaling_factor: rotate with :meth:`rope` (see the class)."""
        i, j = _query_and_key_indices(q_len, k_len, device)
        s, w = self.scaling_factor, self.window
        distance = i.unsqueeze(-1) - j
        near = (distance >= 0) & (distance < w)
        return [Branch(s * i, s * j, near), Branch(i + w * (s - 1), j, distance >= w)]

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

    def branches(self, q_len: int, k_len: int, device=None) -> list[Branch]:
        i, j = _query_and_key_indices(q_len, k_len, device)
        distance = i.unsqueeze(-1) - j
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

    def branches(self, q_len: int, k_len: int, device=None) -> list[Branch]:
        i, j = _query_and_key_indices(q_len, k_len, device)
        c = self.chunk_size - self.local_size
        q_chunk, k_chunk = (i // c).unsqueeze(-1), j // c
        p = i % c
        causal = j <= i.unsqueeze(-1)
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
    temperature, not a position, so the map does not apply it: pass
    ``scale=map.attention_factor ** 2 / sqrt(D)`` to :func:`branch_attention` to match it.
    """

    shifted_offset: int = int(0.33 * 4096)
    local_value: int = 128

    def __post_init__(self):
        _check_size(self.shifted_offset, "shifted_offset", minimum=1)
        _check_size(self.local_value, "local_value", minimum=0)
        if self.local_value >= self.shifted_offset:
            raise InvalidArgument(f"local_value must be < shifted_offset, got local_value={self.local_value}, "
                                  f"shifted_offset={self.shifted_offset}")

    @property
    def attention_factor(self) -> float:
        """0.1 ln 2 + 1, the reference's cos/sin multiplier (not applied by the map)."""
        return _STRING_ATTENTION_FACTOR

    def branches(self, q_len: int, k_len: int, device=None) -> list[Branch]:
        i, j = _query_and_key_indices(q_len, k_len, device)
        s, w = self.shifted_offset, self.local_value
        distance = i.unsqueeze(-1) - j
        diagonal = (distance >= 0) & (distance < s)
        # queries before shifted_offset have no shifted key; clamping keeps their unused
        # positions non-negative (a rotation table may not take negative indices)
        shifted_q = torch.clamp(i - s + w, min=w)
        return [Branch(i, j, diagonal), Branch(shifted_q, j, distance >= s)]


def string(training_length: int = 4096, shifted_offset: int | None = None, local_value: int = 128) -> String:
    """The STRING position map (:class:`String`). Defaults are the reference's:
    ``shifted_offset = int(0.33 * L)`` for the training length L
    (``config.max_position_embeddings``; 4096 here, 131072 for Llama 3.1) and
    ``small_local_value = 128``. An explicit ``shifted_offset`` overrides the derived one.

    Raises:
        InvalidArgument: training_length not a positive int, a shifted_offset < 1 (given or
            derived), local_value < 0, or local_value >= shifted_offset.
    """
    check_positive_int(training_length, "training_length")
    if shifted_offset is None:
        shifted_offset = int(0.33 * training_length)
        if shifted_offset < 1:
            raise InvalidArgument(f"training_length must be >= 4 (shifted_offset = int(0.33 * training_length) "
                                  f"must be >= 1), got {training_length!r}")
    return String(shifted_offset, local_value)
