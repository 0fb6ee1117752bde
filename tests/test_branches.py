"""Branch-merge attention (posenc.attention.branches): the log-sum-exp merge against one softmax
over the union, the two eager paths against each other and against a per-pair float64
reference, and the StreamingLLM and Self-Extend maps against their reference code's maps."""

from __future__ import annotations

import pytest
import torch

from posenc.attention.branches import (
    Branch,
    branch_attention,
    merge_by_lse,
    self_extend,
    streaming_llm,
)
from posenc.encodings.rope import RoPE
from posenc.errors import InvalidArgument, InvalidType

_ = None  # a key no branch takes


def rope_rotate(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """RoPE (Su et al. 2021), half-split layout, base 10000, in float64: the test's own."""
    d = x.shape[-1]
    inv_freq = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = positions.to(torch.float64).unsqueeze(-1) * inv_freq
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return (x.double() * cos + torch.cat([-x2, x1], -1).double() * sin).to(x.dtype)


def test_rotate(q, k, q_positions, k_positions):
    return rope_rotate(q, q_positions), rope_rotate(k, k_positions)


test_rotate.__test__ = False  # a helper, not a test


def qkv(b=2, h=2, tq=12, tk=12, d=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, h, t, d, generator=g, dtype=dtype) for t in (tq, tk, tk))


def reference_attention(q, k, v, rel, covered, scale=None):
    """Each logit at its pair's distance, <R(rel) q_i, k_j> (RoPE is relative), then one
    softmax over the covered keys, all in float64."""
    q, k, v = q.double(), k.double(), v.double()
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    tq, tk = rel.shape
    logits = torch.full(q.shape[:2] + (tq, tk), float("-inf"), dtype=torch.float64)
    for t in range(tq):
        for j in range(tk):
            if covered[t, j]:
                qr = rope_rotate(q[:, :, t], rel[t, j].expand(1))
                logits[:, :, t, j] = (qr * k[:, :, j]).sum(-1) * scale
    return torch.softmax(logits, -1) @ v


# ---------------------------------------------------------------- merge_by_lse


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-6)])
def test_merge_by_lse_is_the_softmax_over_the_union(dtype, tol):
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(2, 3, 5, 16, generator=g, dtype=torch.float64) * 4
    values = torch.randn(2, 3, 16, 8, generator=g, dtype=torch.float64)
    part = torch.randint(0, 3, (5, 16), generator=g)
    part[0] = 0  # row 0: branches 1 and 2 see no key (lse -inf, output ignored)
    outputs, lses = [], []
    for b in range(3):
        s = scores.masked_fill(part != b, float("-inf"))
        lse = torch.logsumexp(s, -1)
        out = torch.softmax(s, -1) @ values  # NaN in the rows where the branch has no key
        outputs.append(out.to(dtype))
        lses.append(lse.to(dtype))
    expected = torch.softmax(scores, -1) @ values
    merged = merge_by_lse(outputs, lses)
    assert merged.dtype == dtype
    torch.testing.assert_close(merged.double(), expected, atol=tol, rtol=tol)
    torch.testing.assert_close(merge_by_lse(torch.stack(outputs), torch.stack(lses)), merged, atol=0, rtol=0)


def test_merge_by_lse_rows_no_branch_covers_are_zero():
    out = torch.full((2, 1, 1, 3, 4), float("nan"))
    lse = torch.full((2, 1, 1, 3), float("-inf"))
    lse[0, 0, 0, 1], out[0, 0, 0, 1] = 0.5, 2.0
    merged = merge_by_lse(out, lse)
    assert torch.equal(merged[0, 0], torch.tensor([[0.0] * 4, [2.0] * 4, [0.0] * 4]))


def test_merge_by_lse_of_one_branch_is_that_branch_exactly():
    out = torch.randn(1, 2, 2, 5, 4)
    lse = torch.randn(1, 2, 2, 5)
    assert torch.equal(merge_by_lse(out, lse), out[0])


def test_merge_by_lse_bad_input():
    with pytest.raises(InvalidArgument, match="lses"):
        merge_by_lse(torch.zeros(2, 1, 1, 3, 4), torch.zeros(2, 1, 1, 4))
    with pytest.raises(InvalidArgument, match="at least one"):
        merge_by_lse([], [])
    with pytest.raises(InvalidType, match="lses"):
        merge_by_lse(torch.zeros(2, 1, 1, 3, 4), torch.zeros(2, 1, 1, 3, dtype=torch.long))


# ---------------------------------------------------------------- branch_attention

MAPS = [self_extend(group_size=2, neighbor_window=3), self_extend(group_size=3, neighbor_window=4),
        streaming_llm(start_size=2, recent_size=3)]


@pytest.mark.parametrize("pmap", MAPS, ids=repr)
@pytest.mark.parametrize("tq", [12, 1])
def test_lse_merge_and_select_then_softmax_agree(pmap, tq):
    for dtype, tol in ((torch.float64, 1e-6), (torch.float32, 1e-5)):
        q, k, v = qkv(tq=tq, tk=12, dtype=dtype)
        branches = pmap.branches(tq, 12)
        by_lse = branch_attention(q, k, v, rotate=test_rotate, branches=branches)
        by_select = branch_attention(q, k, v, rotate=test_rotate, branches=branches, merge="select")
        assert by_lse.dtype == dtype
        torch.testing.assert_close(by_lse, by_select, atol=tol, rtol=0)


@pytest.mark.parametrize("pmap", MAPS, ids=repr)
def test_branch_attention_equals_the_per_pair_reference(pmap):
    q, k, v = qkv(tq=12, tk=12)
    rel, covered = pmap.relative_positions(12, 12)
    got = branch_attention(q, k, v, rotate=test_rotate, branches=pmap.branches(12, 12))
    torch.testing.assert_close(got, reference_attention(q, k, v, rel, covered), atol=1e-12, rtol=1e-12)


def test_branch_attention_grouped_kv_heads_and_decode_rows():
    """Decoding the last token equals the last row of the prefill; H = 2 H_kv."""
    pmap = self_extend(group_size=2, neighbor_window=3)
    q, k, v = qkv(h=4, tq=10, tk=10)
    k, v = k[:, :2], v[:, :2]
    full = branch_attention(q, k, v, rotate=test_rotate, branches=pmap.branches(10, 10))
    last = branch_attention(q[:, :, -1:], k, v, rotate=test_rotate, branches=pmap.branches(1, 10))
    torch.testing.assert_close(last, full[:, :, -1:], atol=1e-12, rtol=0)


def test_branch_attention_bad_input():
    q, k, v = qkv(tq=4, tk=4)
    i = torch.arange(4)
    everything = torch.ones(4, 4, dtype=torch.bool)
    with pytest.raises(InvalidArgument, match="disjoint"):
        branch_attention(q, k, v, rotate=test_rotate, branches=[Branch(i, i, everything)] * 2)
    with pytest.raises(InvalidArgument, match="merge"):
        branch_attention(q, k, v, rotate=test_rotate, branches=[Branch(i, i, everything)], merge="sum")
    with pytest.raises(InvalidArgument, match="key_mask"):
        branch_attention(q, k, v, rotate=test_rotate, branches=[Branch(i, i, everything[:3])])
    with pytest.raises(InvalidType, match="q_positions"):
        branch_attention(q, k, v, rotate=test_rotate, branches=[Branch(i.double(), i, everything)])
    with pytest.raises(InvalidArgument, match="branches"):
        branch_attention(q, k, v, rotate=test_rotate, branches=[])
    with pytest.raises(InvalidArgument, match="group_size"):
        self_extend(group_size=0)
    with pytest.raises(InvalidArgument, match="start_size"):
        streaming_llm(start_size=-1)


# ---------------------------------------------------------------- golden maps

def as_rows(rel, covered):
    return [[int(r) if c else _ for r, c in zip(rr, cc)] for rr, cc in zip(rel.tolist(), covered.tolist())]


def test_self_extend_golden_map_worked_by_hand():
    """G = 2, W = 3: neighbours (i - j < 3) at i - j; the rest at i//2 + 3 - 3//2 - j//2."""
    rel, covered = self_extend(group_size=2, neighbor_window=3).relative_positions(8, 8)
    assert as_rows(rel, covered) == [
        [0, _, _, _, _, _, _, _],
        [1, 0, _, _, _, _, _, _],
        [2, 1, 0, _, _, _, _, _],
        [3, 2, 1, 0, _, _, _, _],
        [4, 4, 2, 1, 0, _, _, _],
        [4, 4, 3, 2, 1, 0, _, _],
        [5, 5, 4, 4, 2, 1, 0, _],
        [5, 5, 4, 4, 3, 2, 1, 0],
    ]


def longlm_eager_prefill_map(t, g, w):
    """datamllab/LongLM self_extend_patch/Llama.py, ``self_extend_forward`` (q_len == kv_seq_len):
    neighbour mask tril minus tril placed at [w:, :-w]; group query position
    q // g + w - w / g (true division) when max q >= w; group key position k // g."""
    pos = torch.arange(t)
    neighbor = torch.tril(torch.ones(t, t))
    if t - w > 0:
        neighbor[w:, :-w] -= torch.tril(torch.ones(t - w, t - w))
    re_w = 0 if pos.max() < w else w
    gq, gk = pos // g + re_w - re_w / g, pos // g
    rel = torch.where(neighbor.bool(), pos[:, None] - pos[None, :], gq[:, None] - gk[None, :])
    return rel, torch.tril(torch.ones(t, t)).bool()


def longlm_flash_decode_map(t, g, w):
    """The same file, ``flash_self_extend_forward`` (q_len == 1): the last query's key
    distances, group ones q//g - k//g + (w - w // g), the last w keys at q - k."""
    pos = torch.arange(t)
    neighbor = pos[-1] - pos
    re_w = 0 if pos.max() < w else w
    group = pos[-1] // g - pos // g + (re_w - re_w // g)
    return torch.cat([group[:-w], neighbor[-w:]]) if t > w else neighbor


@pytest.mark.parametrize("g,w", [(2, 4), (4, 8), (3, 6), (2, 3), (3, 4), (4, 6)])
@pytest.mark.parametrize("t", [1, 5, 9, 17])
def test_self_extend_matches_longlm(g, w, t):
    rel, covered = self_extend(group_size=g, neighbor_window=w).relative_positions(t, t)
    ref_rel, ref_covered = longlm_eager_prefill_map(t, g, w)
    assert torch.equal(covered, ref_covered)
    if w % g == 0:  # the reference's prefill is integer here, and agrees with its decode
        assert torch.equal(rel.double(), ref_rel.double().masked_fill(~ref_covered, 0))
    else:  # its prefill shifts by the fraction w/g - w//g; this map is the decode's
        diff = (ref_rel.double() - rel.double())[covered & (rel != ref_rel)]
        assert torch.allclose(diff, torch.full_like(diff, w // g - w / g))
    # the decode's map at every prefix is the prefill's last row
    for n in range(1, t + 1):
        last_rel, _ = self_extend(group_size=g, neighbor_window=w).relative_positions(1, n)
        assert torch.equal(last_rel[0], longlm_flash_decode_map(n, g, w))
        assert torch.equal(last_rel[0], rel[n - 1, :n])


def test_streaming_llm_golden_map_worked_by_hand():
    """start 2, recent 3 (cache of 5): sinks at 4 - j once full, recent keys at i - j."""
    rel, covered = streaming_llm(start_size=2, recent_size=3).relative_positions(8, 8)
    assert as_rows(rel, covered) == [
        [0, _, _, _, _, _, _, _],
        [1, 0, _, _, _, _, _, _],
        [2, 1, 0, _, _, _, _, _],
        [3, 2, 1, 0, _, _, _, _],
        [4, 3, 2, 1, 0, _, _, _],
        [4, 3, _, 2, 1, 0, _, _],
        [4, 3, _, _, 2, 1, 0, _],
        [4, 3, _, _, _, 2, 1, 0],
    ]


def streaming_llm_reference_map(t, start, recent):
    """mit-han-lab/streaming-llm, token by token: ``StartRecentKVCache.evict_for_space(past, 1)``
    (streaming_llm/kv_cache.py) keeps cache[:start] + cache[len - recent + 1:], the new key is
    appended, and ``pos_shift/modify_llama.py`` rotates keys at arange(len) and the query at
    its own index, len - 1 (the absolute index of each cached key tracked here)."""
    rel = torch.zeros(t, t, dtype=torch.int64)
    covered = torch.zeros(t, t, dtype=torch.bool)
    cache: list[int] = []
    for i in range(t):
        if len(cache) + 1 > start + recent:
            cache = cache[:start] + cache[len(cache) - recent + 1:]
        cache.append(i)
        for index, j in enumerate(cache):
            rel[i, j], covered[i, j] = len(cache) - 1 - index, True
    return rel, covered


@pytest.mark.parametrize("start,recent", [(1, 1), (2, 3), (4, 4), (0, 3), (3, 1)])
def test_streaming_llm_matches_the_reference_cache(start, recent):
    t = 14
    rel, covered = streaming_llm(start, recent).relative_positions(t, t)
    ref_rel, ref_covered = streaming_llm_reference_map(t, start, recent)
    assert torch.equal(covered, ref_covered)
    assert torch.equal(rel.masked_fill(~covered, 0), ref_rel)
    last, last_covered = streaming_llm(start, recent).relative_positions(1, t)
    assert torch.equal(last[0].masked_fill(~last_covered[0], 0), ref_rel[-1])


# ---------------------------------------------------------------- inside the window: plain RoPE


def plain_rope_attention(q, k, v, rope):
    """Plain causal RoPE attention, eager, float32 accumulation."""
    t = k.shape[2]
    pos = torch.arange(t)
    qr, kr = rope.rotate(q, k, pos[t - q.shape[2]:], pos)
    acc = torch.promote_types(q.dtype, torch.float32)
    s = qr.to(acc) @ kr.to(acc).transpose(-1, -2) * q.shape[-1] ** -0.5
    causal = pos <= pos[t - q.shape[2]:].unsqueeze(-1)
    return (torch.softmax(s.masked_fill(~causal, float("-inf")), -1) @ v.to(acc)).to(q.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("pmap,t", [(self_extend(group_size=4, neighbor_window=16), 16),
                                    (self_extend(group_size=3, neighbor_window=7), 5),
                                    (streaming_llm(start_size=4, recent_size=12), 16),
                                    (streaming_llm(start_size=2, recent_size=3), 5)], ids=repr)
def test_inside_the_window_equals_plain_rope_exactly(pmap, t, dtype):
    rope = RoPE(8)
    q, k, v = qkv(tq=t, tk=t, dtype=dtype)
    for tq in (t, 1):  # prefill and the last decoding step
        got = branch_attention(q[:, :, t - tq:], k, v, rotate=rope.rotate, branches=pmap.branches(tq, t))
        assert torch.equal(got, plain_rope_attention(q[:, :, t - tq:], k, v, rope))


def test_outside_the_window_differs_from_plain_rope():
    """The property above can fail: keys past the window change the result."""
    rope = RoPE(8)
    q, k, v = qkv(tq=24, tk=24)  # at 17 the one grouped key sits at distance 16 either way
    got = branch_attention(q, k, v, rotate=rope.rotate, branches=self_extend(4, 16).branches(24, 24))
    assert not torch.allclose(got[:, :, -1], plain_rope_attention(q, k, v, rope)[:, :, -1])
