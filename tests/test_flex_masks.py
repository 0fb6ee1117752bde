"""Masks as FlexAttention mask_mods (posenc.masks) and the flex backend with them: each mask
against its definition written out pair by pair; attention with a mask_mod on every backend
against eager with the written-out mask; the NaN rule and rows without keys under a mask_mod;
learned-bias gradients through FlexAttention against eager's.

Small sizes run FlexAttention uncompiled (fast); the compiled path, one graph for every length,
is in the tests marked slow (torch.compile's C++ build takes tens of seconds on a CPU)."""

from __future__ import annotations

import warnings

import pytest
import torch

import posenc
from posenc.attention import flex
from posenc.attention.masks import mask_from_mod
from posenc.masks import (
    chunked_mask_mod, document_ids_from_positions, document_mask, document_mask_mod, key_padding_mask,
    key_padding_mask_mod, positions_from_document_ids, sliding_window_mask_mod,
)

pytest.importorskip("torch.nn.attention.flex_attention")
H, D = 4, 8
BIAS_ENCODINGS = [name for name, cls in posenc.REGISTRY.items() if "score_bias" in cls.hooks]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()  # as tests/test_score_mod.py: flex traces through dynamo even uncompiled


def make(name):
    torch.manual_seed(0)
    enc = posenc.create_for_model(name, d_model=H * D, num_heads=H, head_dim=D, max_positions=512, causal=True)
    with torch.no_grad():
        for p in enc.parameters():
            p.normal_()
    return enc


def written_out(rule, batch, tq, tk):
    """The mask pair by pair from a Python rule(b, i, j) -> bool: the independent reference."""
    return torch.tensor([[[rule(b, i, j) for j in range(tk)] for i in range(tq)] for b in range(batch)])


POSITIONS = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [0, 1, 2, 0, 1, 2, 3, 4, 0, 1]])
DOCS = torch.tensor([[0] * 10, [0, 0, 0, 1, 1, 1, 1, 1, 2, 2]])


@pytest.mark.parametrize("kind", ["sliding", "chunked", "document", "padding"])
def test_mask_mods_match_their_definition(kind):
    qp = kp = POSITIONS
    if kind == "sliding":
        mod = sliding_window_mask_mod(3, qp, kp)
        expected = written_out(lambda b, i, j: qp[b, i] - kp[b, j] < 3, 2, 10, 10)
    elif kind == "chunked":
        mod = chunked_mask_mod(4, qp, kp)
        expected = written_out(lambda b, i, j: qp[b, i] // 4 == kp[b, j] // 4, 2, 10, 10)
    elif kind == "document":
        mod = document_mask_mod(DOCS)
        expected = written_out(lambda b, i, j: DOCS[b, i] == DOCS[b, j], 2, 10, 10)
        torch.testing.assert_close(document_mask(DOCS), expected)
    else:
        pad = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 1, 1], [1] * 10])
        mod = key_padding_mask_mod(pad)
        expected = written_out(lambda b, i, j: bool(pad[b, j]), 2, 10, 10)
        torch.testing.assert_close(key_padding_mask(pad).expand(2, 10, 10), expected)
    got = mask_from_mod(mod, 2, H, 10, 10)
    assert got.dtype == torch.bool and got.shape[1] == 1  # a mask that ignores h is not repeated per head
    assert torch.equal(got.expand(2, H, 10, 10), expected[:, None].expand(2, H, 10, 10))


def test_index_positions_by_default_and_shared_positions():
    got = mask_from_mod(sliding_window_mask_mod(2), 1, 1, 4, 4)[0, 0]
    assert torch.equal(got, written_out(lambda b, i, j: i - j < 2, 1, 4, 4)[0])
    shared = mask_from_mod(chunked_mask_mod(2, torch.arange(3, 7), torch.arange(3, 7)), 2, 1, 4, 4)
    assert shared.shape == (1, 1, 4, 4)  # (T,) positions: one mask for every row
    assert torch.equal(shared[0, 0], written_out(lambda b, i, j: (i + 3) // 2 == (j + 3) // 2, 1, 4, 4)[0])


def test_document_ids_from_positions_inverts_positions_from_document_ids():
    assert torch.equal(document_ids_from_positions(POSITIONS), torch.tensor([[0] * 10, [0, 0, 0, 1, 1, 1, 1, 1, 2, 2]]))
    assert torch.equal(positions_from_document_ids(document_ids_from_positions(POSITIONS)), POSITIONS)


@pytest.mark.parametrize("bad", [
    (lambda: sliding_window_mask_mod(0), ValueError, "sliding_window must be an integer >= 1"),
    (lambda: chunked_mask_mod(2.0), ValueError, "attention_chunk_size must be an integer >= 1"),
    (lambda: chunked_mask_mod(4, torch.zeros(3)), ValueError, "q_positions must be an integer tensor"),
    (lambda: document_mask_mod(torch.zeros(2, 2, 2, dtype=torch.long)), ValueError, "q_document_ids must be an integer tensor"),
    (lambda: mask_from_mod(lambda b, h, i, j: i - j, 1, 1, 3, 3), TypeError, "a mask_mod must return a boolean tensor"),
    (lambda: posenc.attention(*(torch.randn(1, 2, 3, 8) for _ in range(3)), mask="causal"), TypeError,
     "mask must be a boolean tensor .* or a mask_mod"),
])
def test_bad_masks(bad):
    call, error, match = bad
    with pytest.raises(error, match=match):
        call()


def combined_mask():
    """Packed documents (per row), a 4-token sliding window, and causality written out."""
    docs = DOCS
    qp = kp = positions_from_document_ids(docs)
    mod = torch.nn.attention.flex_attention.and_masks(document_mask_mod(docs), sliding_window_mask_mod(4, qp, kp))
    expected = written_out(lambda b, i, j: j <= i and docs[b, i] == docs[b, j] and qp[b, i] - kp[b, j] < 4, 2, 10, 10)
    return mod, expected[:, None], qp


@pytest.mark.parametrize("backend", ["flex", "eager", "sdpa", "blocked", "auto"])
@pytest.mark.parametrize("name", BIAS_ENCODINGS + ["rope", "nope"])
@pytest.mark.parametrize("kv_heads", [H, 2])
def test_attention_with_a_mask_mod_equals_eager_with_the_written_out_mask(name, backend, kv_heads):
    enc = make(name)
    mod, expected_mask, positions = combined_mask()
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, H, 10, D, generator=g)
    k, v = (torch.randn(2, kv_heads, 10, D, generator=g) for _ in range(2))
    with torch.no_grad():
        out = posenc.attention(q, k, v, enc, q_positions=positions, k_positions=positions, mask=mod, backend=backend)
        expected = posenc.attention(q, k, v, enc, q_positions=positions, k_positions=positions, mask=expected_mask,
                                    backend="eager")
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", BIAS_ENCODINGS)
def test_flex_with_a_tensor_mask_and_a_kv_cache(name):
    """A boolean tensor mask (any shape that broadcasts) through flex's lookup, queries at the end of the keys."""
    enc = make(name)
    g = torch.Generator().manual_seed(2)
    q, k, v = torch.randn(2, H, 5, D, generator=g), torch.randn(2, H, 13, D, generator=g), torch.randn(2, H, 13, D, generator=g)
    mask = torch.rand(2, 1, 5, 13, generator=g) > 0.4
    with torch.no_grad():
        out = posenc.attention(q, k, v, enc, mask=mask, backend="flex")
        expected = posenc.attention(q, k, v, enc, mask=mask, backend="eager")
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_nan_rule_and_empty_rows_under_a_mask_mod():
    """A NaN key makes NaN exactly the rows that see it through the mask_mod (the visibility
    pass of flex.any_visible); a row that sees no key gets zeros; everything else is untouched."""
    q, k, v = (torch.randn(1, H, 10, D, dtype=torch.float64) for _ in range(3))
    window = sliding_window_mask_mod(3)
    late = lambda b, h, i, j: (i >= 2) & window(b, h, i, j)  # rows 0 and 1 see nothing  # noqa: E731
    clean = posenc.attention(q, k, v, mask=late, backend="flex")
    assert torch.equal(clean[0, :, :2], torch.zeros(H, 2, D, dtype=torch.float64))
    bad_k = k.clone()
    bad_k[0, 1, 5, 0] = float("nan")
    out = posenc.attention(q, bad_k, v, mask=late, backend="flex")
    expected = torch.zeros(1, H, 10, dtype=torch.bool)
    expected[0, 1, 5:8] = True  # rows 5, 6, 7 of head 1 see key 5 in a window of 3
    assert torch.equal(out.isnan().any(-1), expected)
    torch.testing.assert_close(out[~expected], clean[~expected])


@pytest.mark.parametrize("name", [n for n in BIAS_ENCODINGS if any(True for _ in make(n).parameters())])
def test_learned_bias_gradients_through_flex_equal_eager(name):
    """The score_mod's gradient in the encoding's parameters (T5's table, Kerple's, FIRE's): on the
    CPU FlexAttention differentiates only the score_mod, so q, k and v are constants here."""
    g = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(2, H, 7, D, generator=g), torch.randn(2, H, 11, D, generator=g), torch.randn(2, H, 11, D, generator=g)
    chunks = chunked_mask_mod(4, torch.arange(4, 11), torch.arange(11))  # queries are the last 7 keys
    mask = lambda b, h, i, j: chunks(b, h, i, j) | (j == 0)  # noqa: E731 - every row keeps a key
    grads = {}
    for backend in ("eager", "flex"):
        enc = make(name)
        out = posenc.attention(q, k, v, enc, mask=mask, backend=backend)
        out.backward(torch.linspace(-1, 1, out.numel()).view_as(out))
        grads[backend] = [p.grad for p in enc.parameters()]
    for got, expected in zip(grads["flex"], grads["eager"], strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_flex_refuses_q_k_v_gradients_on_the_cpu():
    q = torch.randn(1, 2, 4, 8, requires_grad=True)
    with pytest.raises(ValueError, match="backend='flex' has no backward for q, k, v on the CPU"):
        posenc.attention(q, q, q, backend="flex")


# -- compiled: one graph for every length ---------------------------------------------------

def _graphs():
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


@pytest.mark.slow
def test_compiled_flex_is_exact_and_compiles_once_per_shape_family():
    """Lengths past one 128-token block run the compiled kernels (dynamic=True): equal to eager,
    and no new graph for a new length with a document mask. Dynamo gives equal sizes one symbol
    (duck sizing), so the first call with Tq != Tk (a KV cache) compiles once more; after that,
    no length compiles again. (docs/fast_attention.md has the counts against static shapes and
    padding to buckets: benchmarks/flex_recompiles.py.)"""
    torch._dynamo.utils.counters.clear()
    flex._compiled.clear()
    enc = make("alibi")
    graphs = []
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        for tq, tk in ((200, 200), (300, 300), (333, 333), (150, 450), (210, 350)):
            g = torch.Generator().manual_seed(tq)
            q, k, v = torch.randn(1, H, tq, D, generator=g), torch.randn(1, H, tk, D, generator=g), torch.randn(1, H, tk, D, generator=g)
            docs = torch.arange(tk) // 97
            mask = document_mask_mod(docs[tk - tq:], docs)
            out = posenc.attention(q, k, v, enc, mask=mask, backend="flex")
            expected = posenc.attention(q, k, v, enc, mask=mask, backend="eager")
            torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
            graphs.append(_graphs())
    first, square, cache = graphs[0], graphs[:3], graphs[3:]
    assert square == [first] * 3 and cache == [cache[0]] * 2 and cache[0] <= 2 * first, f"graphs after each call: {graphs}"


@pytest.mark.parametrize("name", BIAS_ENCODINGS + ["irope"])
def test_one_row_of_positions_serves_every_batch_row_on_flex(name):
    """Positions (1, T) with B = 2 (check_positions takes B in {1, batch}): the score_mod and the
    mask_mod read that one row for every batch row b, as eager broadcasts it."""
    enc = posenc.create("irope", head_dim=D, attention_chunk_size=3).for_layer(0) if name == "irope" else make(name)
    positions = torch.arange(5, 17).unsqueeze(0)
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(2, H, 12, D, generator=g) for _ in range(3))
    with torch.no_grad():
        out = posenc.attention(q, k, v, enc, q_positions=positions, k_positions=positions, backend="flex")
        expected = posenc.attention(q, k, v, enc, q_positions=positions, k_positions=positions, backend="eager")
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_an_encodings_mask_hook_and_a_mask_mod_meet_on_flex():
    """iRoPE's chunked layer states its chunk mask (the mask hook); a document mask_mod from the
    user joins it as one mask_mod on flex: equal to eager, where both are tensors."""
    enc = posenc.create("irope", head_dim=D, attention_chunk_size=3, floor_scale=4).for_layer(0)
    mod, expected_mask, positions = combined_mask()
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, H, 10, D, generator=g) for _ in range(3))
    out = posenc.attention(q, k, v, enc, q_positions=positions, k_positions=positions, mask=mod, backend="flex")
    expected = posenc.attention(q, k, v, enc, q_positions=positions, k_positions=positions, mask=expected_mask,
                                backend="eager")
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", BIAS_ENCODINGS)
def test_compiled_flex_runs_every_bias_encoding(name):
    """Past one 128-token block flex runs compiled: every score_mod must lower to Inductor's
    pointwise kernel (FIRE's per-score MLP did not: "Buffers cannot be created while lowering a
    pointwise subgraph") with its float attributes as constants ("unbacked_bindings" otherwise),
    and equal eager."""
    enc = make(name)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, H, 200, D, generator=g) for _ in range(3))
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        out = posenc.attention(q, k, v, enc, backend="flex")
        expected = posenc.attention(q, k, v, enc, backend="eager")
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
