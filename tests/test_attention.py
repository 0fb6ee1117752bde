"""posenc.attention: backends agree, equivariance without positions, KV-cache alignment."""

import math

import pytest
import torch

import posenc
from conftest import attention_extras, make_encoding, skip_if_causal_only

NAMES = posenc.available()


def naive_attention(q, k, v, bias=None, causal=True):
    """Softmax attention written out in float64 with loops over queries."""
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    out = torch.zeros(B, H, Tq, v.shape[-1], dtype=torch.float64)
    for i in range(Tq):
        logits = (q[:, :, i : i + 1].double() @ k.double().transpose(-1, -2))[:, :, 0] / math.sqrt(D)
        if bias is not None:
            logits = logits + bias[..., i, :].double()
        if causal:
            logits[..., i + Tk - Tq + 1 :] = float("-inf")
        out[:, :, i] = torch.softmax(logits, -1).unsqueeze(-2).matmul(v.double())[:, :, 0]
    return out


@pytest.mark.parametrize("causal", [True, False])
def test_nope_matches_naive_attention(causal):
    q, k, v = (torch.randn(2, 3, 6, 8, dtype=torch.float64) for _ in range(3))
    for backend in ("eager", "sdpa"):
        torch.testing.assert_close(posenc.attention(q, k, v, causal=causal, backend=backend), naive_attention(q, k, v, causal=causal))


def test_alibi_matches_naive_attention_with_its_bias():
    q, k, v = (torch.randn(1, 4, 5, 8, dtype=torch.float64) for _ in range(3))
    slopes = posenc.alibi_slopes(4).double()
    i, j = torch.arange(5)[:, None], torch.arange(5)[None, :]
    bias = -slopes[:, None, None] * (i - j)
    torch.testing.assert_close(posenc.attention(q, k, v, posenc.create("alibi", num_heads=4).double()), naive_attention(q, k, v, bias))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("causal", [True, False])
def test_eager_and_sdpa_agree_for_every_encoding(name, causal):
    skip_if_causal_only(name, causal)
    enc = make_encoding(name, causal=causal).float()
    if "embed" in enc.hooks:
        pytest.skip("an embed-only encoding acts at the model input, not in attention")
    q, k, v = (torch.randn(2, 4, 12, 8) for _ in range(3))
    backends = ["eager", "auto"] + (["sdpa"] if "content" not in enc.hooks or not getattr(enc, "content_on_values", True) else [])
    extras = attention_extras(enc, 2, 4, 12, dtype=torch.float32)
    outs = [posenc.attention(q, k, v, enc, causal=causal, backend=b, **extras) for b in backends]
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_kv_cache_step_equals_the_full_pass(name):
    """The last query alone against all keys (positions default to the end) = the last row
    of the full causal pass."""
    enc = make_encoding(name)
    q, k, v = (torch.randn(1, 4, 9, 8, dtype=torch.float64) for _ in range(3))
    extras = attention_extras(enc, 1, 4, 9)
    full = posenc.attention(q, k, v, enc, backend="eager", **extras)
    step = posenc.attention(q[:, :, -1:], k, v, enc, backend="eager", **extras)
    torch.testing.assert_close(step[:, :, 0], full[:, :, -1])
    explicit = posenc.attention(q[:, :, -1:], k, v, enc, q_positions=torch.tensor([8]), k_positions=torch.arange(9), backend="eager",
                                **extras)
    torch.testing.assert_close(explicit, step)


def test_without_positions_bidirectional_attention_is_permutation_equivariant():
    q, k, v = (torch.randn(1, 2, 7, 8, dtype=torch.float64) for _ in range(3))
    perm = torch.randperm(7)
    out = posenc.attention(q, k, v, None, causal=False)
    permuted = posenc.attention(q[:, :, perm], k[:, :, perm], v[:, :, perm], None, causal=False)
    torch.testing.assert_close(permuted, out[:, :, perm])


@pytest.mark.parametrize("name", [n for n in NAMES if n != "nope"])
def test_every_encoding_breaks_permutation_equivariance(name):
    skip_if_causal_only(name, False)  # a causal mask breaks the symmetry by itself
    enc = make_encoding(name, causal=False)
    torch.manual_seed(1)
    x = torch.randn(1, 7, 32, dtype=torch.float64)
    perm = torch.tensor([3, 0, 6, 1, 5, 2, 4])
    pos = torch.arange(7)

    def layer(h):
        if "embed" in enc.hooks:
            h = enc.embed(h, pos)
        q = k = v = h.view(1, 7, 4, 8).transpose(1, 2)
        gates = {"gates": enc.gate(h)} if "gate" in enc.hooks else {}  # from the (permuted) hidden states
        return posenc.attention(q, k, v, enc, causal=False, backend="eager", **gates)

    assert not torch.allclose(layer(x[:, perm]), layer(x)[:, :, perm], atol=1e-6)


@pytest.mark.parametrize("kwargs, match", [
    (dict(backend="cuda-magic"), "backend must be one of"),
    (dict(q_positions=torch.tensor([0, 1, -1])), "q_positions must be >= 0"),
    (dict(q_positions=torch.tensor([0.0, 1.0, 2.0])), "integer dtype"),
    (dict(k_positions=torch.arange(5)), r"k_positions must have shape \(3,\)"),
])
def test_attention_bad_arguments(kwargs, match):
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises((ValueError, TypeError), match=match):
        posenc.attention(q, q, q, **kwargs)


def test_attention_bad_shapes():
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(ValueError, match="4-D"):
        posenc.attention(q[0], q, q)
    with pytest.raises(ValueError, match="head_dim"):
        posenc.attention(q, torch.randn(1, 2, 3, 6), torch.randn(1, 2, 3, 6))
    with pytest.raises(ValueError, match="Tq <= Tk"):
        posenc.attention(q, q[:, :, :2], q[:, :, :2])
    with pytest.raises(ValueError, match="dtype"):
        posenc.attention(q, q.double(), q)
