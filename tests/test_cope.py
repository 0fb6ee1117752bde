"""CoPE (Golovneva et al. 2024) against an independent float64 reference: the paper's formulas
written out with Python loops over the query i, the key j and the counted keys k (math.exp,
no posenc code); full attention outputs are compared. Then its properties (every gate 1: a
relative encoding e[i - j + 1]; positions never read), its gradients on every backend that
serves it, its per-layer tables, and cached decoding with the position clamp active."""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc.lab.model import KVCache, LMConfig, TransformerLM
from loop_reference import dot, softmax_average

B, H, D = 2, 2, 4


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def cope_reference(q, k, v, table, *, npos_max, causal=True, mask=None):
    """softmax_j((q_i.k_j + z_ij) / sqrt(D)) over the visible j, z_ij = q_i . e(p_ij) with
    p_ij = sum of sigmoid(q_i.k_m / sqrt(D)) over the visible keys m >= j, clamped to
    npos_max - 1, e interpolated linearly between e[floor p] and e[ceil p]."""
    nb, nh, tq, d = q.shape
    tk = k.shape[2]
    out = torch.zeros(nb, nh, tq, v.shape[-1], dtype=torch.float64)
    for b in range(nb):
        for h in range(nh):
            for i in range(tq):
                visible = [j for j in range(tk) if (not causal or j <= i + tk - tq) and (mask is None or bool(mask[b, i, j]))]
                if not visible:
                    continue
                gate = {m: sigmoid(dot(q[b, h, i], k[b, h, m]) / math.sqrt(d)) for m in visible}
                logits = []
                for j in visible:
                    p = min(sum(g for m, g in gate.items() if m >= j), npos_max - 1)
                    low, high = math.floor(p), math.ceil(p)
                    w = p - low
                    z = dot(q[b, h, i], table[high]) * w + dot(q[b, h, i], table[low]) * (1 - w)
                    logits.append((dot(q[b, h, i], k[b, h, j]) + z) / math.sqrt(d))
                out[b, h, i] = softmax_average(logits, [v[b, h, j] for j in visible])
    return out


def make_cope(npos_max: int, seed: int = 0) -> posenc.CoPE:
    torch.manual_seed(seed)
    enc = posenc.create("cope", head_dim=D, npos_max=npos_max)
    with torch.no_grad():
        enc.pos_emb.normal_()  # zeros at initialisation: make the positions matter
    return enc


def qkv(tq, tk, seed=1, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, t, D, generator=g, dtype=dtype) for t in (tq, tk, tk))


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("npos_max", [3, 64], ids=["clamped", "unclamped"])
@pytest.mark.parametrize("shape", [(6, 6), (3, 9)], ids=["self", "cache"])
def test_cope_matches_the_float64_formula(backend, npos_max, shape):
    enc = make_cope(npos_max).double()
    q, k, v = qkv(*shape)
    out = posenc.attention(q, k, v, enc, backend=backend)
    expected = cope_reference(q, k, v, enc.pos_emb.detach(), npos_max=npos_max)
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_cope_float32_against_the_float64_formula(backend):
    enc = make_cope(5)
    q, k, v = qkv(7, 7, dtype=torch.float32)
    out = posenc.attention(q, k, v, enc, backend=backend)
    torch.testing.assert_close(out.double(), cope_reference(q, k, v, enc.pos_emb.detach(), npos_max=5), rtol=2e-5, atol=2e-5)


def test_masked_keys_are_not_counted_and_bidirectional_counts_to_the_end():
    """A user mask (no causal one): only the keys a query may attend have a gate, and p_ij runs
    from j to the last visible key (the reference's gates * mask, then the reverse cumsum)."""
    enc = make_cope(16).double()
    q, k, v = qkv(6, 6, seed=2)
    mask = torch.rand(B, 6, 6, generator=torch.Generator().manual_seed(3)) > 0.3
    mask[:, :, 0] = True  # every query sees a key
    for backend in ("eager", "sdpa"):
        out = posenc.attention(q, k, v, enc, causal=False, mask=mask, backend=backend)
        expected = cope_reference(q, k, v, enc.pos_emb.detach(), npos_max=16, causal=False, mask=mask)
        torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-9)
    no_mask = posenc.attention(q, k, v, enc, causal=False)
    torch.testing.assert_close(no_mask, cope_reference(q, k, v, enc.pos_emb.detach(), npos_max=16, causal=False))


def test_every_gate_one_is_a_relative_encoding():
    """The relative property CoPE generalizes: when every gate is 1 (q.k / sqrt(D) >> 1), p_ij
    is the token count i - j + 1 and z_ij = q_i . e[min(i - j + 1, npos_max - 1)]."""
    enc = make_cope(5).double()
    q = torch.full((1, 1, 6, D), 5.0, dtype=torch.float64) + torch.rand(1, 1, 6, D, dtype=torch.float64)
    k = torch.full((1, 1, 6, D), 5.0, dtype=torch.float64)  # q.k / 2 > 50: sigmoid is 1.0 in float64
    causal = torch.arange(6) <= torch.arange(6).unsqueeze(-1)
    z = enc.content_scores(q, k, None, None, mask=causal).detach()
    table = enc.pos_emb.detach()
    for i in range(6):
        for j in range(i + 1):
            assert abs(float(z[0, 0, i, j]) - dot(q[0, 0, i], table[min(i - j + 1, 4)])) < 1e-12
    positions = enc.contextual_positions(q, k, causal)[0, 0]
    assert torch.equal(positions.tril(), (torch.arange(6).unsqueeze(-1) - torch.arange(6) + 1).double().tril())


def test_positions_are_never_read():
    """CoPE counts keys, not positions: any explicit positions give the same attention."""
    enc = make_cope(8).double()
    q, k, v = qkv(4, 10)
    base = posenc.attention(q, k, v, enc)
    far = posenc.attention(q, k, v, enc, q_positions=torch.arange(4) + 10**6, k_positions=torch.arange(10) * 7 + 5)
    torch.testing.assert_close(far, base, rtol=0, atol=0)


@pytest.mark.parametrize("causal", [True, False])
def test_gradients_match_between_eager_and_sdpa(causal):
    g = torch.Generator().manual_seed(4)
    q0, k0, v0 = (torch.randn(B, H, t, D, generator=g) for t in (7, 11, 11))
    grads = {}
    for backend in ("eager", "sdpa"):
        enc = make_cope(6)
        q, k, v = (t.clone().requires_grad_() for t in (q0, k0, v0))
        out = posenc.attention(q, k, v, enc, causal=causal, backend=backend)
        out.backward(torch.linspace(-1, 1, out.numel()).view_as(out))
        grads[backend] = [q.grad, k.grad, v.grad, enc.pos_emb.grad]
    assert grads["eager"][3].abs().max() > 0
    for got, expected in zip(grads["sdpa"], grads["eager"], strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)


def test_one_table_per_layer():
    model = TransformerLM(LMConfig(d_model=16, num_layers=3, num_heads=2, max_positions=32), "cope")
    tables = [model.encoding.for_layer(i).pos_emb for i in range(3)]
    assert len({id(t) for t in tables}) == 3 and all(t.shape == (33, 8) for t in tables)  # npos_max = 32 + 1
    assert {n for n, _ in model.encoding.named_parameters()} == {"pos_emb", "deeper_layers.0.pos_emb", "deeper_layers.1.pos_emb"}
    shared = posenc.create("cope", head_dim=8, npos_max=4)
    assert shared.for_layer(5) is shared  # num_layers=1: every layer shares the table
    with pytest.raises(ValueError, match=r"layer must be in 0..2, got 3"):
        model.encoding.for_layer(3)


def test_cached_decoding_equals_the_full_pass_with_the_clamp_active():
    """npos_max = 3: most p_ij are clamped. Decoding token by token (each step's p_ij summed
    over the cached keys) gives the full pass's logits."""
    torch.manual_seed(0)
    config = LMConfig(d_model=16, num_layers=2, num_heads=2, max_positions=64)
    model = TransformerLM(config, posenc.create_for_model("cope", **config.encoding_sizes(), npos_max=3)).eval()
    with torch.no_grad():
        for p in model.encoding.parameters():
            p.normal_()
        for block in model.blocks:
            block.attn.qkv.weight.normal_(0, 0.3)
    tokens = torch.randint(0, 256, (2, 14))
    cache = KVCache(config.num_layers)
    with torch.no_grad():
        full = model(tokens)
        steps = [model(tokens[:, :3], cache=cache)] + [model(tokens[:, t:t + 1], cache=cache) for t in range(3, 14)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)
