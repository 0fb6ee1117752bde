"""Branch-merge attention: several ordinary attentions over disjoint key sets, each with its
own RoPE positions, merged exactly by log-sum-exp (issue 26, item 2).

A *branch* is ``(q_positions, k_positions, key_mask)``: int64 positions (Tq,) and (Tk,) at
which the queries and keys are rotated, and a bool (Tq, Tk) mask of the keys this branch
takes for each query. The branches of one call take disjoint key sets; their union is what
the query sees. The softmax over the union is recovered exactly from each branch's output o_b
and log-sum-exp l_b (the identity flash-decoding and ring attention rely on):

    out = sum_b exp(l_b - m) o_b / sum_b exp(l_b - m),   m = max_b l_b.

The training-free context extensions are position maps of this kind, eight of them, each
named and parameterized as its reference code spells it (defined in :mod:`posenc.position_maps`,
the ground floor that the encodings read too, and re-exported here): :func:`streaming_llm`
(Xiao et al. 2023, "Efficient Streaming Language Models with Attention Sinks"),
:func:`self_extend` (Jin et al. 2024, "LLM Maybe LongLM: Self-Extend LLM Context Window Without
Tuning"), :func:`rerope` and :func:`leaky_rerope` (Su 2023, bojone/rerope, with their log-n
query scaling), :func:`lm_infinite` (Han et al. 2023, "LM-Infinite"), :func:`dca` (An et al.
2024, "Training-Free Long-Context Scaling of Large Language Models", ChunkLlama) and
:func:`string` (An et al. 2024, "Why Does the Effective Context Length of LLMs Fall Short?",
STRING), and :func:`windowed_yarn` (plain RoPE in a local window, YaRN past it, each branch
rotated with its own RoPE: ``rotate`` may be one per branch); :data:`METHODS` names them.

Two ways to run them:

- :func:`branch_attention` (lengths-based: the queries are the last Tq of Tk tokens), with
  ``backend=`` "eager" (explicit scores; ``merge="select"`` or ``"lse"``), "sdpa", "blocked" or
  "flex" (one attention per branch with its log-sum-exp, merged by :func:`merge_by_lse`);
- :func:`posenc.attention` with an encoding that states branches
  (:class:`posenc.encodings.BranchedRoPE`, built by :func:`posenc.encodings.branched`): the
  maps at the call's positions (``map.branches_at``), on every backend that
  takes RoPE and in the lab model's KV cache (:func:`run_branches`).

Which backend gives the log-sum-exp how, and what each costs in memory: docs/fast_attention.md,
"Branch-merge attention".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from posenc.attention import blocked, eager, flex, sdpa
from posenc.attention.masks import as_4d
from posenc.attention.softcap_sinks import sink_column
from posenc.errors import InvalidArgument, InvalidType
from posenc.mask_rules import causal_mask, position_at
from posenc.position_maps import (
    METHODS,
    Branch,
    DualChunk,
    LeakyReRoPE,
    LMInfinite,
    ReRoPE,
    SelfExtend,
    StreamingLLM,
    String,
    WindowedYaRN,
    dca,
    leaky_rerope,
    lm_infinite,
    position_map,
    rerope,
    self_extend,
    streaming_llm,
    string,
    windowed_yarn,
)

__all__ = [
    "BRANCH_BACKENDS",
    "MERGE_MODES",
    "METHODS",
    "Branch",
    "DualChunk",
    "LMInfinite",
    "LeakyReRoPE",
    "ReRoPE",
    "SelfExtend",
    "StreamingLLM",
    "String",
    "WindowedYaRN",
    "branch_attention",
    "dca",
    "leaky_rerope",
    "lm_infinite",
    "merge_by_lse",
    "position_map",
    "rerope",
    "run_branches",
    "self_extend",
    "streaming_llm",
    "string",
    "windowed_yarn",
]

#: The backends that give each branch's log-sum-exp (``run_with_lse``): every backend that
#: takes RoPE but "flash_attention_2" (ALiBi's kernel).
BRANCH_BACKENDS = {"eager": eager, "sdpa": sdpa, "blocked": blocked, "flex": flex}

#: How :func:`branch_attention` combines its branches: ``"lse"`` (one attention per branch,
#: merged by :func:`merge_by_lse`) or ``"select"`` (each logit taken from the branch that
#: covers it, then one softmax: eager only, T² memory).
MERGE_MODES = ("lse", "select")

Rotate = Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]


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


def branch_attention(q: Tensor, k: Tensor, v: Tensor, *, rotate: Rotate | Sequence[Rotate], branches: Sequence[Branch],
                     scale: float | None = None, causal: bool = True, merge: str = "lse",
                     backend: str = "eager") -> Tensor:
    """Attention whose keys are split into branches, each rotated at its own positions.

    Args:
        q: (B, H, Tq, D); k, v: (B, H_kv, Tk, D), H a multiple of H_kv. The queries are the last
            Tq of the Tk tokens (query t at absolute position Tk - Tq + t), prefill or decode.
        rotate: ``rotate(q, k, q_positions, k_positions) -> (q, k)``, e.g. ``RoPE.rotate``; or
            one per branch, in the branches' order (a branch with a RoPE scaling of its own:
            ``map.branch_scalings``).
        branches: :class:`Branch` es with disjoint key masks (checked outside torch.compile).
        scale: the logit scale, default 1/sqrt(D).
        causal: also mask the keys after each query's absolute position.
        merge: one of :data:`MERGE_MODES`; both give the same result (to rounding).
        backend: a key of :data:`BRANCH_BACKENDS`. "eager" (the default) computes every
            branch's scores explicitly, as before; "sdpa", "blocked" and "flex" run one
            attention per branch on that backend, which returns its log-sum-exp, and merge by
            :func:`merge_by_lse` (``merge="lse"`` only).

    Returns (B, H, Tq, D) in q's dtype; scores, softmax and merge in float32 (float64 for
    float64 inputs). A query row that no branch covers is 0.

    Raises:
        InvalidArgument: an unknown merge or backend, merge="select" on a backend other than
            "eager", mismatched shapes, positions or masks of the wrong shape, overlapping
            branches, no branch, or a sequence of rotates of another length than the branches.
        InvalidType: positions that are not integer tensors, a mask that is not bool.
    """
    if merge not in MERGE_MODES:
        raise InvalidArgument(f"merge must be one of {MERGE_MODES}, got {merge!r}")
    if backend not in BRANCH_BACKENDS:
        raise InvalidArgument(f"backend must be one of {tuple(BRANCH_BACKENDS)}, got {backend!r}")
    if merge == "select" and backend != "eager":
        raise InvalidArgument(f"merge='select' needs every branch's scores: backend='eager' only, got {backend!r}")
    q_len, k_len = _check_qkv(q, k, v)
    _check_branches(branches, q_len, k_len)
    rotates = _per_branch(rotate, len(branches))
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if backend != "eager":
        return _on_backend(BRANCH_BACKENDS[backend], q, k, v, rotates, branches, scale, causal)
    allowed = causal_mask(q_len, k_len, q.device) if causal else None
    acc = torch.promote_types(q.dtype, torch.float32)
    group = q.shape[1] // k.shape[1]
    values = v.repeat_interleave(group, dim=1).to(acc) if group > 1 else v.to(acc)
    scores, masks = [], []
    for branch, rotate_b in zip(branches, rotates):
        q_rot, k_rot = rotate_b(q, k, branch.q_positions, branch.k_positions)
        if group > 1:
            k_rot = k_rot.repeat_interleave(group, dim=1)
        scores.append(torch.matmul(q_rot.to(acc), k_rot.to(acc).transpose(-1, -2)) * scale)
        masks.append(branch.key_mask.to(q.device) if allowed is None else branch.key_mask.to(q.device) & allowed)
    if merge == "select":
        return _select_then_softmax(scores, masks, values).to(q.dtype)
    outputs, lses = zip(*(_masked_attention(s, m, values) for s, m in zip(scores, masks)))
    return merge_by_lse(list(outputs), list(lses)).to(q.dtype)


def _per_branch(rotate: Rotate | Sequence[Rotate], count: int) -> list[Rotate]:
    """One rotate per branch: ``rotate`` for each, or the sequence given (its length checked)."""
    if callable(rotate):
        return [rotate] * count
    rotates = list(rotate)
    if len(rotates) != count or not all(callable(r) for r in rotates):
        raise InvalidArgument(f"rotate must be a callable or one callable per branch ({count}), got {len(rotates)} items")
    return rotates


def _on_backend(module, q: Tensor, k: Tensor, v: Tensor, rotates: Sequence[Rotate], branches: Sequence[Branch],
                scale: float, causal: bool) -> Tensor:
    """One attention per branch on ``module`` (its ``run_with_lse``), merged by log-sum-exp."""
    allowed = causal_mask(q.shape[2], k.shape[2], q.device) if causal else None
    outputs, lses = [], []
    for branch, rotate in zip(branches, rotates):
        q_rot, k_rot = rotate(q, k, branch.q_positions, branch.k_positions)
        mask = branch.key_mask.to(q.device) if allowed is None else branch.key_mask.to(q.device) & allowed
        out, lse = module.run_with_lse(q_rot, k_rot, v, mask=as_4d(mask), scale=scale, causal=False)
        outputs.append(out)
        lses.append(lse)
    return merge_by_lse(outputs, lses).to(q.dtype)


def run_branches(module, encoding, q: Tensor, k: Tensor, v: Tensor, *, q_positions: Tensor, k_positions: Tensor,
                 causal: bool, mask, scale: float, softcap: float | None = None, sinks: Tensor | None = None) -> Tensor:
    """The branch-merge attention of an encoding that states branches, for
    :func:`posenc.attention` (q, k unrotated; positions, mask and scale as it hands a backend).

    ``encoding.attention_branches(q, k, q_positions, k_positions)`` gives, per branch, q and k
    rotated at the branch's positions and the branch's key rule ``allowed(q_pos, k_pos)``
    (elementwise on positions). Each branch's mask is that rule on the call's positions
    and-ed with ``mask`` (the causal, user and positional masks as :func:`posenc.attention`
    combined them; or, on flex, a mask_mod or None, the causal mask added by flex): on flex a
    mask_mod (nothing (Tq, Tk) made), elsewhere a bool (1 or B, 1, Tq, Tk) tensor. Each
    branch runs on ``module.run_with_lse``; the outputs are merged by :func:`merge_by_lse`.
    ``softcap`` caps each branch's logits (each logit is in exactly one branch); ``sinks`` (H,)
    join the merge once, as one more branch whose log-sum-exp is s_h and whose output is zero
    (:func:`~posenc.attention.softcap_sinks.sink_column`).
    Returns (B, H, Tq, D) in q's dtype.
    """
    batch, heads, num_queries, num_keys = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    outputs, lses = [], []
    base = mask
    if module is not flex and base is None and causal:
        base = as_4d(causal_mask(num_queries, num_keys, q.device))
    branches = encoding.attention_branches(q, k, q_positions, k_positions)
    grids = None if module is flex else encoding.branch_key_masks(q_positions, k_positions, [b[2] for b in branches])
    for index, (q_rot, k_rot, allowed) in enumerate(branches):
        if grids is None:
            branch_mask = _branch_mask_mod(allowed, q_positions, k_positions, base, batch=batch, heads=heads,
                                           num_queries=num_queries, num_keys=num_keys)
        else:
            grid = grids[index]
            grid = as_4d(grid) if grid.dim() == 2 else grid.unsqueeze(1)  # (1 or B, 1, Tq, Tk)
            branch_mask = grid if base is None else grid & base
        out, lse = module.run_with_lse(q_rot, k_rot, v, mask=branch_mask, scale=scale, causal=causal,
                                       softcap=softcap)
        outputs.append(out)
        lses.append(lse)
    if sinks is not None:
        outputs.append(torch.zeros_like(outputs[0]))
        lses.append(sink_column(sinks, batch, num_queries).to(lses[0].dtype))
    return merge_by_lse(outputs, lses).to(q.dtype)


def _branch_mask_mod(allowed: Callable[[Tensor, Tensor], Tensor], q_positions: Tensor, k_positions: Tensor, mask, *,
                     batch: int, heads: int, num_queries: int, num_keys: int):
    """A branch's key rule as a FlexAttention mask_mod on the call's positions, and-ed with
    ``mask`` (None, a mask_mod or a 4-D bool tensor)."""

    def branch_mod(b, h, q_idx, kv_idx):
        return allowed(position_at(q_positions, b, q_idx), position_at(k_positions, b, kv_idx))

    if mask is None:
        return branch_mod
    if isinstance(mask, Tensor):
        mask = flex.tensor_mask_mod(mask, batch, heads, num_queries, num_keys)
    return flex.and_mask_mods(mask, branch_mod)


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
