"""LM-Infinite and Dual Chunk Attention maps (posenc.attention.branches): golden matrices worked
by hand, the reference code's maps re-implemented, and plain RoPE inside the window."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from posenc.attention.branches import DualChunk, branch_attention, dca, lm_infinite
from posenc.encodings.rope import RoPE
from posenc.errors import InvalidArgument, MissingKey
from test_branches import (
    as_rows,
    plain_rope_attention,
    qkv,
    reference_attention,
    test_rotate,
)

_ = None


# ---------------------------------------------------------------- LM-Infinite

def test_lm_infinite_golden_map_worked_by_hand():
    """local 3, global 2: the last 3 keys at i - j; keys 0 and 1 beyond them at distance 3."""
    rel, covered = lm_infinite(local_branch=3, global_branch=2).relative_positions(8, 8)
    assert as_rows(rel, covered) == [
        [0, _, _, _, _, _, _, _],
        [1, 0, _, _, _, _, _, _],
        [2, 1, 0, _, _, _, _, _],
        [3, 2, 1, 0, _, _, _, _],
        [3, 3, 2, 1, 0, _, _, _],
        [3, 3, _, 2, 1, 0, _, _],
        [3, 3, _, _, 2, 1, 0, _],
        [3, 3, _, _, _, 2, 1, 0],
    ]


def lm_infinite_reference_map(t, local, glob):
    """Glaciohound/LM-Infinite models/llama.py (``convert_llama_model``: limit_distance = local)
    with models/lambda_attention.py: rotated scores kept where 0 <= i - j < local (blocks of
    ``local`` paired with the previous block, triu(1).tril(local) on (local, 2 local)); the
    stationary scores on keys j < glob, masked by triu(-local + 1), with the query rotated at
    min(limit_distance, kv_len - 1) and the key unrotated."""
    rel = torch.zeros(t, t, dtype=torch.int64)
    covered = torch.zeros(t, t, dtype=torch.bool)
    limit = min(local, t - 1)
    for i in range(t):
        for j in range(i + 1):
            if i - j < local:  # the rotated band
                rel[i, j], covered[i, j] = i - j, True
            elif j < glob:  # not removed by triu(-local + 1): j <= i - local
                rel[i, j], covered[i, j] = limit, True
    return rel, covered


@pytest.mark.parametrize("local,glob", [(1, 1), (3, 2), (4, 0), (2, 5), (5, 3)])
def test_lm_infinite_matches_the_reference(local, glob):
    t = 13
    pmap = lm_infinite(local, glob)
    rel, covered = pmap.relative_positions(t, t)
    ref_rel, ref_covered = lm_infinite_reference_map(t, local, glob)
    assert torch.equal(covered, ref_covered)
    assert torch.equal(rel.masked_fill(~covered, 0), ref_rel)
    for n in range(1, t + 1):  # decoding: the reference's single_query mode is the last row
        last, last_covered = pmap.relative_positions(1, n)
        ref_last, ref_last_covered = lm_infinite_reference_map(n, local, glob)
        assert torch.equal(last_covered[0], ref_last_covered[-1])
        assert torch.equal(last[0].masked_fill(~last_covered[0], 0), ref_last[-1])


# ---------------------------------------------------------------- DCA

def test_dca_golden_map_worked_by_hand():
    """chunk_size 4, local_size 1: chunks of 3, keys at j mod 3; successive query at
    min(p + 3, 4), inter query at min(5, 4) = 4."""
    rel, covered = dca(chunk_size=4, local_size=1).relative_positions(8, 8)
    assert as_rows(rel, covered) == [
        [0, _, _, _, _, _, _, _],
        [1, 0, _, _, _, _, _, _],
        [2, 1, 0, _, _, _, _, _],
        [3, 2, 1, 0, _, _, _, _],
        [4, 3, 2, 1, 0, _, _, _],
        [4, 3, 2, 2, 1, 0, _, _],
        [4, 3, 2, 3, 2, 1, 0, _],
        [4, 3, 2, 4, 3, 2, 1, 0],
    ]


def chunkllama_prefill_map(t, chunk_size, local_window):
    """HKUNLP/ChunkLlama chunkllama_attn_replace.py, ``forward`` without cache: keys at
    k_t = pos % chunk_len; per chunk [begin, end) the intra query at q_t[pos % chunk_len]
    (causal), the successive query at qc_t[pos % chunk_len] = min(p + chunk_len, chunk_size)
    on the previous chunk, the inter query at qc_t[chunk_len - 1] on keys [0, begin - prev)."""
    c = chunk_size - local_window
    q_t = list(range(c))
    qc_t = [min(p + c, chunk_size) for p in range(c)]
    k_t = [j % c for j in range(t)]
    rel = torch.zeros(t, t, dtype=torch.int64)
    covered = torch.zeros(t, t, dtype=torch.bool)

    def attend(rows, cols, qpos, causal):
        for i in rows:
            for j in cols:
                if not causal or j <= i:
                    rel[i, j], covered[i, j] = qpos(i) - k_t[j], True

    attend(range(min(c, t)), range(min(c, t)), lambda i: q_t[i % c], True)
    prev = range(min(c, t))
    remain = t - c
    while remain > 0:
        begin = t - remain
        end = begin + min(c, remain)
        attend(range(begin, end), range(begin, end), lambda i: q_t[i % c], True)
        attend(range(begin, end), prev, lambda i: qc_t[i % c], False)
        if begin - len(prev) > 0:
            attend(range(begin, end), range(begin - len(prev)), lambda i: qc_t[c - 1], False)
        prev = range(begin, end)
        remain -= c
    return rel, covered


def chunkllama_decode_row(n, chunk_size, local_window):
    """The same file's cached branch (q_len 1, kv_seq_len n): chunk_num_curr = (n - 1) // c,
    intra keys [c * cur, n), successive [c * (cur - 1), c * cur), inter [0, c * (cur - 1)),
    the query at (n - 1) % c in q_t and qc_t, and at qc_t[c - 1] for inter."""
    c = chunk_size - local_window
    cur, p = (n - 1) // c, (n - 1) % c
    qc = [min(x + c, chunk_size) for x in range(c)]
    row = [0] * n
    for j in range(n):
        if j >= c * cur:
            row[j] = p - j % c
        elif j >= c * (cur - 1):
            row[j] = qc[p] - j % c
        else:
            row[j] = qc[c - 1] - j % c
    return torch.tensor(row)


@pytest.mark.parametrize("chunk_size,local", [(4, 1), (5, 2), (6, 1), (3, 0), (8, 3)])
def test_dca_matches_chunkllama(chunk_size, local):
    t = 17
    pmap = dca(chunk_size, local)
    rel, covered = pmap.relative_positions(t, t)
    ref_rel, ref_covered = chunkllama_prefill_map(t, chunk_size, local)
    assert torch.equal(covered, ref_covered)
    assert torch.equal(rel.masked_fill(~covered, 0), ref_rel)
    assert int(rel.max()) <= chunk_size
    for n in range(1, t + 1):
        last, last_covered = pmap.relative_positions(1, n)
        assert bool(last_covered.all())
        assert torch.equal(last[0], chunkllama_decode_row(n, chunk_size, local))


def test_dca_reads_qwen_dual_chunk_attention_config():
    config = {"dual_chunk_attention_config": {"chunk_size": 262144, "local_size": 8192,
                                              "original_max_position_embeddings": 262144}}
    assert DualChunk.from_config(config) == dca(262144, 8192)

    hf_config = SimpleNamespace(dual_chunk_attention_config={"chunk_size": 16, "local_size": 4})
    assert DualChunk.from_config(hf_config) == dca(16, 4)
    with pytest.raises(MissingKey, match="local_size"):
        DualChunk.from_config({"chunk_size": 16})


def test_bad_parameters():
    with pytest.raises(InvalidArgument, match="local_size"):
        dca(chunk_size=4, local_size=4)
    with pytest.raises(InvalidArgument, match="chunk_size"):
        dca(chunk_size=0)
    with pytest.raises(InvalidArgument, match="local_branch"):
        lm_infinite(local_branch=0)
    with pytest.raises(InvalidArgument, match="global_branch"):
        lm_infinite(global_branch=-1)


# ---------------------------------------------------------------- attention

MAPS = [lm_infinite(3, 2), lm_infinite(4, 1), dca(4, 1), dca(5, 2)]


@pytest.mark.parametrize("pmap", MAPS, ids=repr)
def test_branch_attention_equals_the_per_pair_reference(pmap):
    q, k, v = qkv(tq=12, tk=12)
    rel, covered = pmap.relative_positions(12, 12)
    for merge in ("lse", "select"):
        got = branch_attention(q, k, v, rotate=test_rotate, branches=pmap.branches(12, 12), merge=merge)
        torch.testing.assert_close(got, reference_attention(q, k, v, rel, covered), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("pmap,t", [(lm_infinite(16, 4), 16), (lm_infinite(7, 2), 5),
                                    (dca(20, 4), 16), (dca(9, 2), 5)], ids=repr)
def test_inside_the_window_equals_plain_rope_exactly(pmap, t, dtype):
    rope = RoPE(8)
    q, k, v = qkv(tq=t, tk=t, dtype=dtype)
    for tq in (t, 1):
        got = branch_attention(q[:, :, t - tq:], k, v, rotate=rope.rotate, branches=pmap.branches(tq, t))
        assert torch.equal(got, plain_rope_attention(q[:, :, t - tq:], k, v, rope))


@pytest.mark.parametrize("pmap", [lm_infinite(8, 2), dca(10, 2)], ids=repr)
def test_outside_the_window_differs_from_plain_rope(pmap):
    rope = RoPE(8)
    q, k, v = qkv(tq=24, tk=24)
    got = branch_attention(q, k, v, rotate=rope.rotate, branches=pmap.branches(24, 24))
    assert not torch.allclose(got[:, :, -1], plain_rope_attention(q, k, v, rope)[:, :, -1])
