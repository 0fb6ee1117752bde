"""Branch-merge attention on every backend that takes RoPE, through posenc.attention() with a
BranchedRoPE, and in the lab model's KV cache (issue 26, item 2).

References: the eager select-then-softmax of :func:`branch_attention` (one softmax over the
logits each taken from the branch that covers it; its maps golden-tested in
tests/test_branches*.py), and plain RoPE attention inside each map's window.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import slow_unless

import posenc
from posenc.attention.branches import METHODS, branch_attention, position_map
from posenc.encodings import BranchedRoPE, RoPE, branched
from posenc.errors import InvalidArgument
from posenc.lab.generation import KVCache
from posenc.lab.model import LMConfig, TransformerLM

BACKENDS = ("eager", "sdpa", "blocked", "flex")

#: Each method with parameters small enough that every branch is used at T = 24 tokens.
ACTIVE = {
    "streaming_llm": {"start_size": 2, "recent_size": 5},
    "self_extend": {"group_size": 3, "neighbor_window": 5},
    "rerope": {"window": 6, "training_length": 8},
    "leaky_rerope": {"window": 6, "scaling_factor": 4, "training_length": 8},
    "lm_infinite": {"local_branch": 6, "global_branch": 3},
    "dca": {"chunk_size": 7, "local_size": 2},
    "string": {"shifted_offset": 8, "local_value": 3},
    "windowed_yarn": {"factor": 3.0, "window": 6, "training_length": 8},
}

#: Each method with its window past T = 24 tokens: plain RoPE (STRING's logit factor aside).
INSIDE = {
    "streaming_llm": {"start_size": 4, "recent_size": 24},
    "self_extend": {"group_size": 4, "neighbor_window": 24},
    "rerope": {"window": 24, "training_length": 32},
    "leaky_rerope": {"window": 24, "scaling_factor": 4, "training_length": 32},
    "lm_infinite": {"local_branch": 24, "global_branch": 3},
    "dca": {"chunk_size": 30, "local_size": 4},
    "string": {"shifted_offset": 24, "local_value": 3},
    "windowed_yarn": {"factor": 3.0, "window": 24, "training_length": 8},
}

HEAD_DIM = 16


def _qkv(tq: int, tk: int, heads: int, kv_heads: int, dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, heads, tq, HEAD_DIM, generator=g, dtype=dtype)
    k = torch.randn(2, kv_heads, tk, HEAD_DIM, generator=g, dtype=dtype)
    v = torch.randn(2, kv_heads, tk, HEAD_DIM, generator=g, dtype=dtype)
    return q, k, v


def _reference(method: str, params: dict, q, k, v):
    """Eager select-then-softmax of the map at arange positions, the queries scaled as the
    reference scales them (ReRoPE's log-n; STRING's logit factor through the scale)."""
    pmap = position_map(method, **params)
    rope = RoPE(HEAD_DIM, scaling=None if pmap.frequency_divisor == 1 else
                {"rope_type": "linear", "factor": float(pmap.frequency_divisor)})
    tq, tk = q.shape[2], k.shape[2]
    if hasattr(pmap, "scale_queries"):
        q = pmap.scale_queries(q, tk)
    scale = pmap.logit_factor / math.sqrt(HEAD_DIM)
    branches = pmap.branches(tq, tk)
    rotates = [RoPE(HEAD_DIM, scaling=pmap.branch_scalings[b]).rotate if b in pmap.branch_scalings else rope.rotate
               for b in range(len(branches))]
    return branch_attention(q, k, v, rotate=rotates, branches=branches, scale=scale, merge="select")


def test_methods_are_the_eight_maps():
    assert sorted(METHODS) == sorted(ACTIVE) == sorted(INSIDE) == sorted(posenc.encodings.BRANCHED_METHODS)


@pytest.mark.parametrize("method", sorted(ACTIVE))
@pytest.mark.parametrize("backend", BACKENDS[1:])
@pytest.mark.parametrize("heads,kv_heads", [(2, 2), (4, 2)])
def test_branch_attention_backend_equals_eager_select(method, backend, heads, kv_heads):
    pmap = position_map(method, **ACTIVE[method])
    rope = RoPE(HEAD_DIM)
    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 1e-6)):
        for tq, tk in ((24, 24), (5, 24), (1, 24)):
            q, k, v = _qkv(tq, tk, heads, kv_heads, dtype)
            branches = pmap.branches(tq, tk)
            want = branch_attention(q, k, v, rotate=rope.rotate, branches=branches, merge="select")
            with torch.no_grad():
                got = branch_attention(q, k, v, rotate=rope.rotate, branches=branches, backend=backend)
            torch.testing.assert_close(got, want, atol=tol, rtol=0, msg=f"{method} {backend} {dtype} {tq}/{tk}")


@pytest.mark.parametrize("method", sorted(ACTIVE))
def test_eager_lse_merge_and_select_agree(method):
    pmap = position_map(method, **ACTIVE[method])
    q, k, v = _qkv(24, 24, 4, 2, torch.float32)
    rope = RoPE(HEAD_DIM)
    by_lse = branch_attention(q, k, v, rotate=rope.rotate, branches=pmap.branches(24, 24), merge="lse")
    by_select = branch_attention(q, k, v, rotate=rope.rotate, branches=pmap.branches(24, 24), merge="select")
    torch.testing.assert_close(by_lse, by_select, atol=1e-6, rtol=0)


def test_branch_attention_bad_backend_and_select_off_eager():
    q, k, v = _qkv(4, 4, 2, 2, torch.float32)
    branches = position_map("self_extend", group_size=2, neighbor_window=2).branches(4, 4)
    with pytest.raises(InvalidArgument, match="backend must be one of"):
        branch_attention(q, k, v, rotate=RoPE(HEAD_DIM).rotate, branches=branches, backend="flash_attention_2")
    with pytest.raises(InvalidArgument, match="merge='select'"):
        branch_attention(q, k, v, rotate=RoPE(HEAD_DIM).rotate, branches=branches, merge="select", backend="sdpa")


# ------------------------------------------------------------------ the maps on positions


@pytest.mark.parametrize("method", sorted(ACTIVE))
def test_branches_at_arange_is_the_lengths_map_and_a_cache_step_its_last_rows(method):
    pmap = position_map(method, **ACTIVE[method])
    full = pmap.branches(24, 24)
    at = pmap.branches_at(torch.arange(24), torch.arange(24))
    step = pmap.branches_at(torch.arange(19, 24), torch.arange(24))  # 5 new tokens after 19 cached
    for whole, same, last in zip(full, at, step):
        for a, b in zip(whole, same):
            assert torch.equal(a, b)
        assert torch.equal(last.q_positions, whole.q_positions[19:])
        assert torch.equal(last.k_positions, whole.k_positions)
        assert torch.equal(last.key_mask, whole.key_mask[19:])


@pytest.mark.parametrize("method", sorted(ACTIVE))
def test_branch_positions_and_key_rules_are_the_branches(method):
    pmap = position_map(method, **ACTIVE[method])
    q_pos, k_pos = torch.arange(3, 20), torch.arange(20)
    branches = pmap.branches_at(q_pos, k_pos)
    for index, ((qp, kp), branch) in enumerate(zip(pmap.branch_positions(q_pos, k_pos), branches)):
        assert torch.equal(qp, branch.q_positions) and torch.equal(kp, branch.k_positions)
        assert torch.equal(pmap.key_rule(index)(q_pos.unsqueeze(-1), k_pos.unsqueeze(-2)), branch.key_mask)
        # 0-d, as FlexAttention calls a mask_mod
        assert bool(pmap.key_rule(index)(q_pos[4], k_pos[2])) == bool(branch.key_mask[4, 2])


@pytest.mark.parametrize("method", sorted(ACTIVE))
def test_branches_at_per_row_positions(method):
    pmap = position_map(method, **ACTIVE[method])
    rows = torch.stack([torch.arange(16), torch.arange(16) + 7])  # (2, 16): a row shifted by 7
    per_row = pmap.branches_at(rows, rows)
    for b in range(2):
        alone = pmap.branches_at(rows[b], rows[b])
        for a, one in zip(per_row, alone):
            assert torch.equal(a.q_positions[b], one.q_positions)
            assert torch.equal(a.k_positions[b], one.k_positions)
            assert torch.equal(a.key_mask[b], one.key_mask)


def test_position_map_errors():
    with pytest.raises(InvalidArgument, match="method must be one of"):
        position_map("yarn")
    with pytest.raises(InvalidArgument, match="group_size, neighbor_window"):
        position_map("self_extend", window=3)
    with pytest.raises(InvalidArgument):
        branched(RoPE(HEAD_DIM), "dca", chunk_size=4, local_size=4)
    with pytest.raises(InvalidArgument, match="leaky_rerope"):
        branched(RoPE(HEAD_DIM, scaling={"rope_type": "linear", "factor": 2.0}), "leaky_rerope")


# ------------------------------------------------------------------ posenc.attention()


#: flex (uncompiled on the CPU: 3-7 s a method) by default on the three-branch map only; the other
#: maps on flex behind slow (the default suite's time budget; pytest -m slow runs them)
FLEX_BY_DEFAULT = ("dca",)


def backend_cases(methods, backends):
    return [slow_unless(backend != "flex" or method in FLEX_BY_DEFAULT, method, backend, id=f"{backend}-{method}")
            for method in methods for backend in backends]


@pytest.mark.parametrize("method,backend", backend_cases(sorted(ACTIVE), (*BACKENDS, "auto")))
def test_attention_with_branched_rope_equals_the_reference(method, backend):
    encoding = branched(RoPE(HEAD_DIM), method, **ACTIVE[method])
    # float32: rounding of logits up to ~10 (ReRoPE's log-n scale enlarges them) reaches 1.2e-6
    for (tq, kv_heads), (dtype, tol) in zip(((24, 2), (3, 1), (24, 1)),
                                            ((torch.float64, 1e-10), (torch.float64, 1e-10), (torch.float32, 5e-6))):
        q, k, v = _qkv(tq, 24, 4, kv_heads, dtype, seed=tq)
        want = _reference(method, ACTIVE[method], q, k, v)
        with torch.no_grad():
            got = posenc.attention(q, k, v, encoding, backend=backend)
        torch.testing.assert_close(got, want, atol=tol, rtol=0, msg=f"{method} {backend} Tq={tq} {dtype}")


@pytest.mark.parametrize("method,backend", backend_cases(sorted(INSIDE), BACKENDS))
def test_inside_the_window_every_map_is_plain_rope(method, backend):
    encoding = branched(RoPE(HEAD_DIM), method, **INSIDE[method])
    factor = encoding.map.logit_factor  # STRING's attention factor squared, 1 for the others
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-6)):
        q, k, v = _qkv(24, 24, 4, 2, dtype)
        with torch.no_grad():
            got = posenc.attention(q, k, v, encoding, backend=backend)
            want = posenc.attention(q, k, v, RoPE(HEAD_DIM), backend="eager", scale=factor / math.sqrt(HEAD_DIM))
        torch.testing.assert_close(got, want, atol=tol, rtol=0, msg=f"{method} {backend} {dtype}")


def test_attention_refuses_flash_attention_2_and_dropout_for_a_branched_encoding():
    q, k, v = _qkv(4, 4, 2, 2, torch.float32)
    encoding = branched(RoPE(HEAD_DIM), "self_extend", group_size=2, neighbor_window=2)
    with pytest.raises(InvalidArgument, match="branch-merge attention"):
        posenc.attention(q, k, v, encoding, backend="flash_attention_2")
    with pytest.raises(InvalidArgument, match="dropout"):
        posenc.attention(q, k, v, encoding, backend="eager", dropout_p=0.1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_with_a_user_mask_and_left_padding_positions(backend):
    """Per-row positions (B, T) and a key-padding mask: each row as it is alone."""
    encoding = branched(RoPE(HEAD_DIM), "self_extend", group_size=3, neighbor_window=4)
    q, k, v = _qkv(12, 12, 2, 2, torch.float32)
    pad = 3  # row 1 starts with 3 padding tokens
    positions = torch.stack([torch.arange(12), (torch.arange(12) - pad).clamp(min=0)])
    keep = torch.ones(2, 1, 12, dtype=torch.bool)
    keep[1, :, :pad] = False
    with torch.no_grad():
        got = posenc.attention(q, k, v, encoding, q_positions=positions, k_positions=positions, mask=keep,
                               backend=backend)
        alone = posenc.attention(q[1:, :, pad:], k[1:, :, pad:], v[1:, :, pad:], encoding, backend="eager")
        first = posenc.attention(q[:1], k[:1], v[:1], encoding, backend="eager")
    torch.testing.assert_close(got[1:, :, pad:], alone, atol=1e-6, rtol=0)
    torch.testing.assert_close(got[:1], first, atol=1e-6, rtol=0)
    assert torch.equal(got[1, :, :pad], torch.zeros_like(got[1, :, :pad]))  # padding queries see no key: 0, not NaN


def test_branched_rope_for_model_and_config():
    encoding = BranchedRoPE.for_model(d_model=64, num_heads=4, head_dim=16, max_positions=64, method="dca",
                                      chunk_size=8, local_size=2)
    assert encoding.head_dim == 16 and encoding.map == position_map("dca", chunk_size=8, local_size=2)
    assert encoding.branched and posenc.Hook.ROTATE in encoding.hooks
    rebuilt = BranchedRoPE(**encoding.config())
    assert rebuilt.map == encoding.map


# ------------------------------------------------------------------ the lab model and its KV cache


def _model(encoding, seed: int = 0, backend: str = "auto") -> TransformerLM:
    torch.manual_seed(seed)
    config = LMConfig(vocab_size=32, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, max_positions=64,
                      backend=backend)
    return TransformerLM(config, encoding).eval()


# STRING scales every logit by its attention factor, at every length: compared through attention() above
@pytest.mark.parametrize("method", sorted(set(INSIDE) - {"string"}))
def test_model_inside_the_window_is_the_rope_model(method):
    tokens = torch.randint(0, 32, (2, 24), generator=torch.Generator().manual_seed(1))
    plain = _model(RoPE(8))
    extended = _model(branched(RoPE(8), method, **INSIDE[method]))
    extended.load_state_dict(plain.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(extended(tokens), plain(tokens), atol=1e-5, rtol=0)


# flex (uncompiled on the CPU at these lengths: ~8 s per method) on the three-branch map only
@pytest.mark.parametrize("method,backend", [*((m, b) for m in sorted(ACTIVE) for b in ("auto", "blocked")),
                                            ("dca", "flex")])
def test_cached_decoding_equals_the_full_pass(method, backend):
    model = _model(branched(RoPE(8), method, **ACTIVE[method]), backend=backend)
    tokens = torch.randint(0, 32, (2, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(tokens)
        for chunks in ((10, *([1] * 14)), (7, 5, 8, 4)):
            cache = KVCache(model.config.num_layers)
            pieces, start = [], 0
            for size in chunks:
                pieces.append(model(tokens[:, start:start + size], cache=cache))
                start += size
            torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=2e-5, rtol=0,
                                       msg=f"{method} {backend} chunks {chunks}")


@pytest.mark.parametrize("backend", ("eager", "sdpa", "blocked"))
def test_gradients_through_a_branched_encoding(backend):
    """q, k, v gradients equal those of the eager select-then-softmax (autograd through both)."""
    method, params = "dca", ACTIVE["dca"]
    q, k, v = (t.requires_grad_() for t in _qkv(24, 24, 4, 2, torch.float64))
    weights = torch.randn(2, 4, 24, HEAD_DIM, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    (posenc.attention(q, k, v, branched(RoPE(HEAD_DIM), method, **params), backend=backend) * weights).sum().backward()
    got = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    (_reference(method, params, q, k, v) * weights).sum().backward()
    for mine, want in zip(got, (q.grad, k.grad, v.grad)):
        torch.testing.assert_close(mine, want, atol=1e-10, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_branched_attention_traces_in_one_graph(backend):
    torch._dynamo.reset()
    encoding = branched(RoPE(HEAD_DIM), "dca", **ACTIVE["dca"])
    q, k, v = _qkv(20, 20, 4, 2, torch.float32)
    compiled = torch.compile(lambda q, k, v: posenc.attention(q, k, v, encoding, backend=backend),
                             backend="eager", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(q, k, v), posenc.attention(q, k, v, encoding, backend=backend),
                                   atol=1e-6, rtol=0)
    torch._dynamo.reset()


@pytest.mark.parametrize("tq,tk", [(300, 300), (100, 300), (1, 300)])
def test_sdpa_lse_kernel_told_causal_equals_eager(tq, tk):
    """sdpa's CPU kernel is told ``is_causal`` for Tq = Tk (it then skips the key blocks above the
    diagonal, top-left aligned): at 300 tokens (several of its blocks) with a windowed causal
    mask, a prefill and a chunk of queries equal eager's output and log-sum-exp, including the
    rows that a mask leaves without a key."""
    from posenc.attention import eager, sdpa
    from posenc.attention.masks import as_4d, causal_mask

    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 2e-6)):
        q, k, v = _qkv(tq, tk, 4, 2, dtype)
        mask = causal_mask(tq, tk, q.device)
        query_at = torch.arange(tk - tq, tk).unsqueeze(-1)
        mask = mask & (query_at - torch.arange(tk) >= 40)  # a grouped branch's keys: none for the first 40 queries
        with torch.no_grad():
            out, lse = sdpa.run_with_lse(q, k, v, mask=as_4d(mask), scale=0.25, causal=True)
            want_out, want_lse = eager.run_with_lse(q, k, v, mask=as_4d(mask), scale=0.25, causal=True)
        torch.testing.assert_close(out, want_out.to(dtype), atol=tol, rtol=0)
        torch.testing.assert_close(lse, want_lse, atol=tol, rtol=0)
