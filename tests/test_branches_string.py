"""STRING map (posenc.attention.branches.string): a golden matrix worked by hand, the reference
code's map re-implemented (HKUNLP/STRING string_for_llama.py), plain RoPE inside the window."""

from __future__ import annotations

import math

import pytest
import torch
from test_branches import (
    as_rows,
    plain_rope_attention,
    qkv,
    reference_attention,
    test_rotate,
)

from posenc.attention.branches import String, branch_attention, string
from posenc.encodings.rope import RoPE
from posenc.errors import InvalidArgument

_ = None


def test_string_golden_map_worked_by_hand():
    """shifted_offset 3, local_value 1: d < 3 kept, d >= 3 becomes d - 3 + 1 = d - 2."""
    rel, covered = string(shifted_offset=3, local_value=1).relative_positions(8, 8)
    assert as_rows(rel, covered) == [
        [0, _, _, _, _, _, _, _],
        [1, 0, _, _, _, _, _, _],
        [2, 1, 0, _, _, _, _, _],
        [1, 2, 1, 0, _, _, _, _],
        [2, 1, 2, 1, 0, _, _, _],
        [3, 2, 1, 2, 1, 0, _, _],
        [4, 3, 2, 1, 2, 1, 0, _],
        [5, 4, 3, 2, 1, 2, 1, 0],
    ]


def string_prefill_pairs(t, shifted_offset, local_value):
    """HKUNLP/STRING string_for_llama.py ``forward`` without cache, ``string_flash_forward``:
    the diagonal pass is flash_attn_func(causal=True, window_size=[diag_size, 0]) with queries
    and keys at their positions (0 <= i - j <= diag_size); the shifted pass takes the last
    t - diag_size queries, rotated at position_ids - diag_size + local_window, against the
    first t - diag_size keys, causal (bottom-right aligned: j <= i - diag_size). Returns, per
    (i, j), the list of distances at which the reference scores that pair."""
    pairs = {}
    for i in range(t):
        for j in range(i + 1):
            d = i - j
            got = []
            if d <= shifted_offset:
                got.append(d)
            if t - shifted_offset > 0 and j <= i - shifted_offset:
                got.append((i - shifted_offset + local_value) - j)
            pairs[i, j] = got
    return pairs


def string_decode_row(n, shifted_offset, local_value):
    """The same file's cached branch (q_len 1, kv_seq_len n >= diag_size): flash decoding over
    the keys [n - diag_size, n) with the query at n - 1, and over [0, n - diag_size) with the
    query at n - 1 - diag_size + local_window."""
    row = []
    for j in range(n):
        if j >= n - shifted_offset:
            row.append(n - 1 - j)
        else:
            row.append(n - 1 - shifted_offset + local_value - j)
    return torch.tensor(row)


@pytest.mark.parametrize("offset,local", [(3, 1), (4, 0), (5, 2), (2, 1), (6, 5), (1, 0)])
def test_string_matches_the_reference(offset, local):
    t = 15
    pmap = string(shifted_offset=offset, local_value=local)
    rel, covered = pmap.relative_positions(t, t)
    assert torch.equal(covered, torch.ones(t, t, dtype=torch.bool).tril())
    for (i, j), distances in string_prefill_pairs(t, offset, local).items():
        if i - j == offset:
            # the reference's prefill scores this key twice; here the shifted branch alone takes it
            assert distances == [offset, local]
            assert int(rel[i, j]) == local
        else:
            assert distances == [int(rel[i, j])]
    for n in range(offset, t + 1):
        last, last_covered = pmap.relative_positions(1, n)
        assert bool(last_covered.all())
        assert torch.equal(last[0], string_decode_row(n, offset, local))
        assert torch.equal(last[0], rel[n - 1, :n])  # a decode step is a row of the full pass


def test_defaults_are_the_references():
    pmap = string()
    assert pmap == String(int(0.33 * 4096), 128) == String()
    assert string(training_length=131072) == String(43253, 128)  # Llama 3.1's L0 = 131072: int(0.33 L0)
    assert string(shifted_offset=10, local_value=3) == String(10, 3)
    assert pmap.attention_factor == pytest.approx(1 + 0.1 * math.log(2), rel=1e-15)


def test_bad_parameters():
    with pytest.raises(InvalidArgument, match="local_value"):
        string(shifted_offset=4, local_value=4)
    with pytest.raises(InvalidArgument, match="local_value"):
        string(shifted_offset=4, local_value=-1)
    with pytest.raises(InvalidArgument, match="shifted_offset"):
        string(shifted_offset=0, local_value=0)
    with pytest.raises(InvalidArgument, match="training_length"):
        string(training_length=3, local_value=0)
    with pytest.raises(InvalidArgument, match="training_length"):
        string(training_length=0)
    with pytest.raises(InvalidArgument, match="local_value"):
        string(training_length=100)  # int(0.33 * 100) = 33 <= 128


# ---------------------------------------------------------------- attention

MAPS = [string(shifted_offset=3, local_value=1), string(shifted_offset=5, local_value=2),
        string(shifted_offset=4, local_value=0)]


@pytest.mark.parametrize("pmap", MAPS, ids=repr)
def test_branch_attention_equals_the_per_pair_reference(pmap):
    q, k, v = qkv(tq=12, tk=12)
    rel, covered = pmap.relative_positions(12, 12)
    for merge in ("lse", "select"):
        got = branch_attention(q, k, v, rotate=test_rotate, branches=pmap.branches(12, 12), merge=merge)
        torch.testing.assert_close(got, reference_attention(q, k, v, rel, covered), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("pmap,t", [(string(shifted_offset=16, local_value=4), 16),
                                    (string(shifted_offset=7, local_value=2), 5)], ids=repr)
def test_inside_the_window_equals_plain_rope_exactly(pmap, t, dtype):
    rope = RoPE(8)
    q, k, v = qkv(tq=t, tk=t, dtype=dtype)
    for tq in (t, 1):
        got = branch_attention(q[:, :, t - tq:], k, v, rotate=rope.rotate, branches=pmap.branches(tq, t))
        assert torch.equal(got, plain_rope_attention(q[:, :, t - tq:], k, v, rope))


def test_outside_the_window_differs_from_plain_rope():
    rope = RoPE(8)
    q, k, v = qkv(tq=24, tk=24)
    pmap = string(shifted_offset=8, local_value=2)
    got = branch_attention(q, k, v, rotate=rope.rotate, branches=pmap.branches(24, 24))
    assert not torch.allclose(got[:, :, -1], plain_rope_attention(q, k, v, rope)[:, :, -1])


def test_decode_steps_are_rows_of_the_full_pass():
    rope = RoPE(8)
    t = 14
    q, k, v = qkv(tq=t, tk=t)
    pmap = string(shifted_offset=4, local_value=1)
    full = branch_attention(q, k, v, rotate=rope.rotate, branches=pmap.branches(t, t))
    for n in range(1, t + 1):
        step = branch_attention(q[:, :, n - 1:n], k[:, :, :n], v[:, :, :n], rotate=rope.rotate,
                                branches=pmap.branches(1, n))
        torch.testing.assert_close(step[:, :, 0], full[:, :, n - 1], atol=1e-12, rtol=1e-12)
