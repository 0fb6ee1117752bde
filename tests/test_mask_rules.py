"""The ground floor of masks (posenc.mask_rules): the position lookup of score_mods and
mask_mods, and the window and chunk rules, each against a rule written out pair by pair."""

from __future__ import annotations

import pytest
import torch

from posenc.mask_rules import (
    causal_mask,
    causal_rule,
    in_sliding_window,
    position_at,
    same_chunk,
    value_at,
)

B, T = 3, 7


def grids():
    """b (B, 1) and idx (1, T) as FlexAttention would pass them, int32."""
    return torch.arange(B, dtype=torch.int32)[:, None], torch.arange(T, dtype=torch.int32)[None, :]


@pytest.mark.parametrize("form", ["none", "shared", "one_row", "per_row"])
def test_position_at_reads_token_idx_of_row_b(form):
    table = torch.arange(B * T).reshape(B, T) * 3 + 1
    values = {"none": None, "shared": table[1], "one_row": table[1:2], "per_row": table}[form]
    b, idx = grids()
    got = position_at(values, b, idx)
    expected = [[(j if values is None else int(table[1 if form in ("shared", "one_row") else r, j])) for j in range(T)]
                for r in range(B)]
    assert got.dtype == torch.int64
    assert got.expand(B, T).tolist() == expected


def test_value_at_keeps_the_dtype():
    flags = torch.tensor([[True, False, True], [False, False, True]])
    b, idx = torch.arange(2)[:, None], torch.arange(3)[None, :]
    got = value_at(flags, b, idx)
    assert got.dtype == torch.bool and torch.equal(got, flags)
    assert value_at(None, b, idx.int()).dtype == torch.int32  # the index itself


def test_window_and_chunk_rules_pair_by_pair():
    q, k = torch.tensor([0, 3, 4, 7, 8, 13]), torch.arange(15)
    window = in_sliding_window(q[:, None], k[None, :], 3)
    chunk = same_chunk(q[:, None], k[None, :], 4)
    assert window.tolist() == [[qp - kp < 3 for kp in k.tolist()] for qp in q.tolist()]
    assert chunk.tolist() == [[qp // 4 == kp // 4 for kp in k.tolist()] for qp in q.tolist()]


@pytest.mark.parametrize("num_queries,num_keys", [(1, 1), (4, 4), (2, 6), (6, 6), (0, 3), (1, 5)])
def test_causal_mask_pair_by_pair(num_queries, num_keys):
    """Query i (the last Tq of Tk keys) sees key j iff j <= i + Tk - Tq, on the grid and elementwise."""
    expected = [[j <= i + num_keys - num_queries for j in range(num_keys)] for i in range(num_queries)]
    assert causal_mask(num_queries, num_keys).tolist() == expected
    offset = torch.tensor(num_keys - num_queries)
    for i in range(num_queries):
        for j in range(num_keys):
            assert bool(causal_rule(torch.tensor(i), torch.tensor(j), offset)) == expected[i][j]


def test_the_causal_mask_is_written_once():
    """No module of posenc defines its own causal mask function: the backends, the branch-merge
    attention and the position maps use posenc.mask_rules' (issue 33, "written once")."""
    import ast
    from pathlib import Path

    import posenc
    from posenc.attention import masks

    assert masks.causal_mask is causal_mask
    root = Path(posenc.__file__).parent
    found = []
    for path in root.rglob("*.py"):
        if path.name == "mask_rules.py" and path.parent == root:
            continue
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.FunctionDef) and "causal" in node.name and ("mask" in node.name or "mod" in node.name) \
                    and node.name != "causal_mod":
                found.append(f"{path.relative_to(root)}: {node.name}")
            if isinstance(node, ast.FunctionDef) and node.name == "causal_mod":
                body = ast.unparse(node)
                if "causal_rule" not in body:
                    found.append(f"{path.relative_to(root)}: causal_mod without causal_rule")
    assert not found, found
