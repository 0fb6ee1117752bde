"""One positions contract for every registered encoding (DESIGN.md, "Positions are explicit").

- decoding token by token with a KV cache = one full forward pass;
- packed rows (documents with positions reset and a document mask) = each document alone;
- left-padded rows = the same rows unpadded;
- the attention ``mask`` against an explicit float64 reference, fully masked rows included.

Tiny models in float32, compared at 1e-5. Each comparison also checks that dropping the
thing under test (the mask, the reset positions) changes the result, so it cannot pass
vacuously.
"""

import math

import pytest
import torch

import posenc
from conftest import attention_extras
from posenc.lab.model import (
    KVCache,
    LMConfig,
    TransformerLM,
    document_mask,
    key_padding_mask,
    positions_from_document_ids,
    positions_from_padding_mask,
)

NAMES = posenc.available()
TOL = dict(atol=1e-5, rtol=1e-5)
CONFIG = dict(vocab_size=256, d_model=32, num_layers=2, num_heads=4, max_positions=64)


def tiny_lm(name: str, backend: str = "auto", **encoding_kwargs) -> TransformerLM:
    """A 2-layer d_model=32 LM with weights large enough that attention is sharp and position
    matters (the default init gives near-uniform attention, which would hide mistakes)."""
    config = LMConfig(**CONFIG, backend=backend)
    encoding = posenc.create_for_model(
        name, d_model=config.d_model, num_heads=config.num_heads, head_dim=config.head_dim,
        max_positions=config.max_positions, causal=True, **encoding_kwargs,
    )
    model = TransformerLM(config, encoding)
    with torch.no_grad():
        for p in encoding.parameters():  # learned tables start near zero
            p.normal_(0, 0.5)
        for block in model.blocks:
            block.attn.qkv.weight.normal_(0, 0.3)
    return model.eval()


def backends_for(name: str) -> list[str]:
    cls = posenc.REGISTRY[name]
    sdpa_ok = "content" not in cls.hooks or not cls.content_on_values  # sdpa cannot add to the values
    blocked_ok = "content" not in cls.hooks  # blocked takes rotate and score_bias only
    return ["eager"] + (["sdpa"] if sdpa_ok else []) + (["blocked"] if blocked_ok else [])


CASES = [(name, backend) for name in NAMES for backend in backends_for(name)]


def decode_with_cache(model: TransformerLM, tokens: torch.Tensor, prefill: int) -> torch.Tensor:
    """Logits of every token: the first ``prefill`` in one call, then one token per call."""
    cache = KVCache(model.config.num_layers)
    device = tokens.device
    outs = [model(tokens[:, :prefill], torch.arange(prefill, device=device), cache=cache)]
    for t in range(prefill, tokens.shape[1]):
        outs.append(model(tokens[:, t : t + 1], torch.tensor([t], device=device), cache=cache))
    assert len(cache) == tokens.shape[1]
    return torch.cat(outs, dim=1)


# -- KV cache --------------------------------------------------------------------------------

@pytest.mark.parametrize("name, backend", CASES)
def test_cached_decoding_equals_the_full_pass(name, backend):
    model = tiny_lm(name, backend)
    assert model.encoding.call_invariant
    tokens = torch.randint(0, 256, (2, 20))
    with torch.no_grad():
        full = model(tokens)
        stepped = decode_with_cache(model, tokens, 1)
    torch.testing.assert_close(stepped, full, **TOL)


@pytest.mark.parametrize("name", NAMES)
def test_cache_default_positions_continue_after_the_cache(name):
    model = tiny_lm(name)
    tokens = torch.randint(0, 256, (1, 10))
    cache = KVCache(model.config.num_layers)
    with torch.no_grad():
        first = model(tokens[:, :6], cache=cache)
        rest = model(tokens[:, 6:], cache=cache)  # positions 6..9 by default
        torch.testing.assert_close(torch.cat((first, rest), 1), model(tokens), **TOL)


DYNAMIC = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 8}
LONGROPE = {"rope_type": "longrope", "factor": 4.0, "original_max_position_embeddings": 8,
            "short_factor": [1.0, 1.5, 2.0, 3.0], "long_factor": [1.0, 2.0, 4.0, 8.0]}

#: Options under which the rotation depends on more than the token's own position, yet every
#: (query, key) term does not: the cache stays exact (call_invariant).
CALL_INVARIANT_OPTIONS = [
    ("rope", dict(scaling=DYNAMIC, dynamic_cache="frozen")),
    ("rope", dict(scaling=LONGROPE, dynamic_cache="frozen")),
    ("rope", dict(scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8})),
    ("xpos", dict(center="call")),  # the per-call centre cancels in q'.k'
    ("xpos", dict(center=10)),
]


@pytest.mark.parametrize("name, kwargs", CALL_INVARIANT_OPTIONS, ids=lambda x: str(x)[:50])
def test_cached_decoding_equals_the_full_pass_with_options(name, kwargs):
    model = tiny_lm(name, **kwargs)
    assert model.encoding.call_invariant
    tokens = torch.randint(0, 256, (1, 20))  # past original_max_position_embeddings = 8
    with torch.no_grad():
        torch.testing.assert_close(decode_with_cache(model, tokens, 1), model(tokens), **TOL)


@pytest.mark.parametrize("scaling", [DYNAMIC, LONGROPE], ids=["dynamic", "longrope"])
def test_rerotate_mode_is_exact_in_one_layer_and_flagged_in_more(scaling):
    """dynamic_cache="rerotate" rotates every token with the frequencies of the call's length.
    The cache keeps keys unrotated, so a one-layer model decodes exactly as a full pass over
    each prefix. With two layers the second layer's cached keys and values come from hidden
    states computed at a shorter length: the encoding says so (call_invariant False), and the
    decode visibly departs from the prefix passes (generate() then runs without a cache)."""
    tokens = torch.randint(0, 256, (1, 20))
    for layers in (1, 2):
        torch.manual_seed(1)
        model = tiny_lm("rope", scaling=scaling)
        if layers == 1:
            model.blocks = model.blocks[:1]
            model.config = LMConfig(**{**CONFIG, "num_layers": 1})
        assert not model.encoding.call_invariant
        with torch.no_grad():
            stepped = decode_with_cache(model, tokens, 1)
            prefix = torch.stack([model(tokens[:, : t + 1])[0, -1] for t in range(tokens.shape[1])])
        gap = (stepped[0] - prefix).abs().max()
        if layers == 1:
            torch.testing.assert_close(stepped[0], prefix, **TOL)
        else:
            assert gap > 1e-4, gap


def test_learned_table_decoding_stops_at_its_last_row():
    """A learned table has no row past max_positions: the full pass and the cached step both refuse."""
    model = tiny_lm("learned")
    cache = KVCache(model.config.num_layers)
    with torch.no_grad():
        model(torch.zeros(1, 64, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match="learned table holds positions 0..63"):
            model(torch.zeros(1, 1, dtype=torch.long), cache=cache)
    assert len(cache) == 64  # a failed call leaves the cache as it was


# -- packed sequences --------------------------------------------------------------------------

def test_positions_from_document_ids_known_values():
    ids = torch.tensor([[0, 0, 0, 1, 1, 2], [5, 5, 5, 5, 5, 5]])
    assert positions_from_document_ids(ids).tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]]
    assert positions_from_document_ids(torch.tensor([3, 1, 1, 3])).tolist() == [0, 0, 1, 0]
    assert document_mask(torch.tensor([0, 0, 1])).tolist() == [[True, True, False], [True, True, False], [False, False, True]]


#: Each row's document lengths; both rows are 16 tokens long.
PACKING = [[5, 7, 4], [9, 1, 6]]


@pytest.mark.parametrize("name, backend", CASES)
def test_packed_documents_equal_each_document_alone(name, backend):
    model = tiny_lm(name, backend)
    docs = [[torch.randint(0, 256, (n,)) for n in row] for row in PACKING]
    tokens = torch.stack([torch.cat(row) for row in docs])
    ids = torch.tensor([[d for d, n in enumerate(row) for _ in range(n)] for row in PACKING])
    positions = positions_from_document_ids(ids)
    with torch.no_grad():
        packed = model(tokens, positions, mask=document_mask(ids))
        unmasked = model(tokens, positions)
        for b, row in enumerate(docs):
            start = 0
            for doc in row:
                alone = model(doc.unsqueeze(0))[0]
                torch.testing.assert_close(packed[b, start : start + len(doc)], alone, **TOL)
                start += len(doc)
    # without the document mask, later documents see earlier ones
    assert (packed[0, 5:12] - unmasked[0, 5:12]).abs().max() > 1e-3


@pytest.mark.parametrize("name", NAMES)
def test_packed_documents_decode_with_a_cache(name):
    """Packed rows through the cache: each step's mask is its document row of the full mask."""
    model = tiny_lm(name)
    ids = torch.tensor([[0] * 5 + [1] * 7 + [2] * 4])
    positions = positions_from_document_ids(ids)
    tokens = torch.randint(0, 256, (1, 16))
    mask = document_mask(ids)  # (1, 16, 16)
    cache = KVCache(model.config.num_layers)
    with torch.no_grad():
        full = model(tokens, positions, mask=mask)
        steps = [model(tokens[:, t : t + 1], positions[:, t : t + 1], mask=mask[:, t : t + 1, : t + 1], cache=cache)
                 for t in range(16)]
    torch.testing.assert_close(torch.cat(steps, 1), full, **TOL)


# -- left padding ------------------------------------------------------------------------------

def test_positions_from_padding_mask_known_values():
    padding = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert positions_from_padding_mask(padding).tolist() == [[1, 1, 0, 1, 2], [0, 1, 2, 3, 4]]
    assert key_padding_mask(padding.bool()).shape == (2, 1, 5)


@pytest.mark.parametrize("name, backend", CASES)
def test_left_padded_rows_equal_the_unpadded_rows(name, backend):
    model = tiny_lm(name, backend)
    lengths, width = [12, 7, 1], 12
    rows = [torch.randint(0, 256, (n,)) for n in lengths]
    tokens = torch.full((len(rows), width), 7, dtype=torch.long)
    padding = torch.zeros(len(rows), width, dtype=torch.bool)
    for b, row in enumerate(rows):
        tokens[b, width - len(row):], padding[b, width - len(row):] = row, True
    positions = positions_from_padding_mask(padding)
    with torch.no_grad():
        padded = model(tokens, positions, mask=key_padding_mask(padding))
        unmasked = model(tokens, positions)
        for b, row in enumerate(rows):
            torch.testing.assert_close(padded[b, width - len(row):], model(row.unsqueeze(0))[0], **TOL)
    assert torch.isfinite(padded).all()  # pad queries see no key: zero attention output, finite logits
    assert (padded[1, 5:] - unmasked[1, 5:]).abs().max() > 1e-3  # the pads would leak in unmasked


# -- the attention mask itself ---------------------------------------------------------------

def masked_reference(q, k, v, mask, bias=None):
    """float64, loops over (b, h, i): softmax over the allowed keys j <= i (Tq = Tk here);
    a query with no allowed key gives zeros."""
    B, H, T, D = q.shape
    out = torch.zeros(B, H, T, D, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                allowed = [j for j in range(i + 1) if mask[b, i, j]]
                if not allowed:
                    continue
                logits = torch.stack([
                    q[b, h, i].double() @ k[b, h, j].double() / math.sqrt(D) + (0.0 if bias is None else bias[h, i, j].double())
                    for j in allowed
                ])
                weights = torch.softmax(logits, 0)
                out[b, h, i] = sum(w * v[b, h, j].double() for w, j in zip(weights, allowed))
    return out


@pytest.mark.parametrize("backend", ["eager", "sdpa", "blocked"])
@pytest.mark.parametrize("encoding", [None, "alibi"])
def test_attention_mask_matches_an_explicit_reference(backend, encoding):
    q, k, v = (torch.randn(2, 4, 7, 8, dtype=torch.float64) for _ in range(3))
    mask = torch.rand(2, 7, 7) > 0.4
    mask[0, 3] = False  # a query with no key at all
    enc = posenc.create("alibi", num_heads=4).double() if encoding else None
    bias = None
    if encoding:
        i, j = torch.arange(7)[:, None], torch.arange(7)[None, :]
        bias = -posenc.alibi_slopes(4).double()[:, None, None] * (i - j)
    out = posenc.attention(q, k, v, enc, mask=mask, backend=backend)
    torch.testing.assert_close(out, masked_reference(q, k, v, mask, bias))
    assert out[0, :, 3].abs().max() == 0


@pytest.mark.parametrize("name", NAMES)
def test_fully_masked_queries_give_zeros_and_finite_gradients(name):
    enc = tiny_lm(name).encoding
    q, k, v = (torch.randn(1, 4, 6, 8, requires_grad=True) for _ in range(3))
    mask = torch.ones(1, 6, 6, dtype=torch.bool)
    mask[:, :2] = False
    out = posenc.attention(q, k, v, enc, mask=mask, **attention_extras(enc, 1, 4, 6, dtype=torch.float32))
    assert out[:, :, :2].abs().max() == 0 and torch.isfinite(out).all()
    out.sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v))


@pytest.mark.parametrize("mask, error, match", [
    (torch.ones(6, 6), TypeError, "mask must be a boolean tensor"),
    (torch.ones(6, 5, dtype=torch.bool), ValueError, "mask must have shape"),
    (torch.ones(3, 6, 6, dtype=torch.bool), ValueError, r"mask must have shape .* B=2"),
    (torch.ones(6, dtype=torch.bool), ValueError, "mask must have shape"),
])
def test_attention_bad_mask(mask, error, match):
    q = torch.randn(2, 4, 6, 8)
    with pytest.raises(error, match=match):
        posenc.attention(q, q, q, mask=mask)
