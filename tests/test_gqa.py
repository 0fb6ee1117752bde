"""Grouped- and multi-query attention, the softmax scale and attention dropout.

References: torch's SDPA with ``enable_gqa=True``, and posenc's own attention with k and v
repeated per query head (``repeat_interleave``: query head h reads key-value head h // G, the
order of transformers' ``repeat_kv``), values and gradients, for every encoding and backend.
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
import torch.nn.functional as F

import posenc
from conftest import attention_extras, slow_unless
from posenc.attention import tiling

H, D = 8, 8
ATTENDING = [name for name, cls in posenc.REGISTRY.items() if cls.hooks - {"embed"}] + ["nope"]
BACKENDS = ["eager", "sdpa", "blocked", "flex"]


@pytest.fixture(autouse=True)
def small_tiles(monkeypatch):
    monkeypatch.setattr(tiling, "BLOCKED_TILE_ELEMENTS", 400)
    monkeypatch.setattr(tiling, "BLOCKED_VIEW_ROWS", 3)


#: Encodings whose rotation differs per key/value head by design (MHRoPE's axes): repeating the
#: keys changes which rotation each one gets, so grouped and repeated are different models.
PER_KV_HEAD = ("mhrope",)


def make(name):
    torch.manual_seed(0)
    enc = posenc.create_for_model(name, d_model=H * D, num_heads=H, head_dim=D, max_positions=256)
    with torch.no_grad():
        for p in enc.parameters():
            p.normal_(0, 0.5)
    return enc.double()


def inputs(kv_heads, tq=9, tk=9, batch=2):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(batch, H, tq, D, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(batch, kv_heads, tk, D, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(batch, kv_heads, tk, D, generator=g, dtype=torch.float64, requires_grad=True)
    return q, k, v


def supported(name, backend):
    from posenc.attention import _BACKENDS

    return _BACKENDS[backend].unsupported(make(name), mask=None) is None


#: flex evaluates FIRE's network and T5's bucket table eagerly on the CPU (5-7 s at its first call
#: here): behind slow on flex (pytest -m slow runs them); ALiBi and KERPLE keep the score bias on
#: flex by default, and the other backends run every encoding
FLEX_SLOW = ("fire", "t5")


@pytest.mark.parametrize("name,backend,kv_heads", [
    slow_unless(not (backend == "flex" and name in FLEX_SLOW), name, backend, kv_heads, id=f"{name}-{backend}-{kv_heads}")
    for name in ATTENDING for backend in BACKENDS for kv_heads in (1, 2, 4)])
def test_grouped_query_equals_repeated_keys_and_values(name, backend, kv_heads):
    if not supported(name, backend):
        pytest.skip(f"{backend} does not serve {name}")
    if name in PER_KV_HEAD:
        pytest.skip(f"{name} assigns its axes per key/value head: grouping is part of the encoding (test_mhrope.py)")
    enc = make(name)
    tq, tk = (5, 12) if backend != "flex" else (9, 9)
    q, k, v = inputs(kv_heads, tq, tk)
    groups = H // kv_heads
    extras = attention_extras(enc, 2, H, tk)
    # torch's FlexAttention has no backward on the CPU: no gradient at all there (an encoding's
    # learned rotation, LieRE's, would otherwise ask one of q and k)
    with torch.no_grad() if backend == "flex" else contextlib.nullcontext():
        out = posenc.attention(q, k, v, enc, backend=backend, **extras)
        # the same backend with k and v repeated: only the grouping differs (backends against eager: test_attention_backends)
        reference = posenc.attention(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), enc,
                                     backend=backend, **extras)
    assert out.shape == (2, H, tq, D)
    torch.testing.assert_close(out, reference, rtol=1e-9, atol=1e-9)
    if backend == "flex":
        return
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    expected = torch.autograd.grad(reference.square().sum(), (q, k, v))
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("backend", ["eager", "sdpa", "blocked"])
def test_no_encoding_equals_sdpa_enable_gqa(backend):
    q, k, v = inputs(2, 6, 11)
    mask = torch.rand(2, 1, 6, 11, generator=torch.Generator().manual_seed(2)) > 0.3
    mask[..., 0] = True
    out = posenc.attention(q, k, v, causal=False, backend=backend, mask=mask)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("backend", BACKENDS)
def test_scale(backend):
    q, k, v = (x.detach() for x in inputs(4, 9, 9))
    scale = 0.37
    out = posenc.attention(q, k, v, backend=backend, scale=scale)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-9)
    default = posenc.attention(q, k, v, backend=backend)
    torch.testing.assert_close(default, posenc.attention(q, k, v, backend=backend, scale=1 / math.sqrt(D)))


def test_scale_multiplies_the_content_scores_not_the_bias():
    """softmax(scale * (q.k + content) + bias): ALiBi's bias is not scaled (Press et al.)."""
    q, k, v = inputs(8, 7, 7)
    alibi = posenc.create("alibi", num_heads=H).double()
    out = posenc.attention(q, k, v, alibi, backend="eager", scale=0.5)
    positions = torch.arange(7)
    logits = 0.5 * q @ k.transpose(-1, -2) + alibi.score_bias(positions, positions)
    logits = logits.masked_fill(positions[None, :] > positions[:, None], float("-inf"))
    torch.testing.assert_close(out, torch.softmax(logits, -1) @ v)


@pytest.mark.parametrize("backend", ["eager", "sdpa", "blocked"])
def test_dropout_drops_and_rescales(backend):
    q, k, v = inputs(2, 16, 16)
    v = torch.ones_like(v)  # every output entry is the sum of the kept, rescaled probabilities
    torch.manual_seed(0)
    out = posenc.attention(q.detach(), k.detach(), v, backend=backend, dropout_p=0.5)
    assert not torch.allclose(out, torch.ones_like(out))  # some probabilities were dropped
    assert abs(out.mean().item() - 1.0) < 0.15  # E[kept / (1 - p)] = 1
    clean = posenc.attention(q.detach(), k.detach(), v, backend=backend, dropout_p=0.0)
    torch.testing.assert_close(clean, torch.ones_like(clean))


def test_shaw_and_transformer_xl_with_grouped_keys_take_per_head_content():
    for name in ("shaw", "transformer_xl"):
        enc = make(name)
        q, k, v = inputs(2, 6, 6)
        out = posenc.attention(q, k, v, enc)
        reference = posenc.attention(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), enc)
        torch.testing.assert_close(out, reference)
