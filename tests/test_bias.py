"""ALiBi slopes and T5 buckets against their papers' recipes, written independently here."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.attention import tiling
from t5_reference import t5_bucket_reference


def press_slopes(n: int) -> list[float]:
    """Press et al. (2022): a geometric sequence starting at and with ratio 2^(-8/n) for n a
    power of two; else the closest smaller power's slopes plus every other slope of twice it."""
    def geometric(m):
        start = 2 ** (-(2 ** -(math.log2(m) - 3)))
        return [start * start**i for i in range(m)]

    if math.log2(n).is_integer():
        return geometric(n)
    p = 2 ** math.floor(math.log2(n))
    return geometric(p) + press_slopes(2 * p)[0::2][: n - p]


@pytest.mark.parametrize("n", range(1, 65))
def test_alibi_slopes_match_press_recipe(n):
    torch.testing.assert_close(posenc.alibi_slopes(n).double(), torch.tensor(press_slopes(n), dtype=torch.float64), rtol=1e-7, atol=0)


def test_alibi_slopes_known_values():
    torch.testing.assert_close(posenc.alibi_slopes(8), torch.tensor([2.0 ** -k for k in range(1, 9)]))
    # 12 heads: the 8-head set, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5
    torch.testing.assert_close(posenc.alibi_slopes(12)[8:], torch.tensor([2 ** -0.5, 2 ** -1.5, 2 ** -2.5, 2 ** -3.5]))


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_alibi_bad_num_heads(bad):
    with pytest.raises(ValueError, match="num_heads"):
        posenc.alibi_slopes(bad)
    with pytest.raises(ValueError, match="num_heads"):
        posenc.create("alibi", num_heads=bad)


def test_alibi_bias_forms():
    heads, slopes = 3, posenc.alibi_slopes(3)
    causal = posenc.create("alibi", num_heads=heads)
    symmetric = posenc.create("alibi", num_heads=heads, bidirectional=True)
    qp, kp = torch.arange(4), torch.arange(4)
    b_causal, b_sym = causal.score_bias(qp, kp), symmetric.score_bias(qp, kp)
    assert b_causal.shape == (heads, 4, 4) and b_causal.dtype == torch.float32
    for h in range(heads):
        for i in range(4):
            for j in range(4):
                assert b_sym[h, i, j].item() == pytest.approx(-slopes[h].item() * abs(i - j))
                if j <= i:  # the causal form only has meaning where the mask lets a key through
                    assert b_causal[h, i, j].item() == pytest.approx(-slopes[h].item() * (i - j))


@given(
    rel=st.lists(st.integers(-5000, 5000), min_size=1, max_size=64),
    bidirectional=st.booleans(),
    config=st.sampled_from([(32, 128), (16, 64), (64, 256), (8, 20)]),
)
@settings(max_examples=200, deadline=None)
def test_t5_buckets_match_the_recipe(rel, bidirectional, config):
    nb, md = config
    got = posenc.t5_relative_position_bucket(torch.tensor(rel), bidirectional=bidirectional, num_buckets=nb, max_distance=md)
    assert got.dtype == torch.long
    assert got.tolist() == [t5_bucket_reference(r, bidirectional, nb, md) for r in rel]


def test_t5_buckets_known_values():
    rel = torch.tensor([0, -1, -7, -8, -12, -16, -32, -64, -127, -128, -1000, 1, 5])
    causal = posenc.t5_relative_position_bucket(rel, bidirectional=False)
    # causal: 16 exact buckets, then log-spaced 16..31 up to 128
    assert causal.tolist()[:4] == [0, 1, 7, 8]
    assert causal[-3:-2].item() == 31 and causal[-2:].tolist() == [0, 0]
    bidir = posenc.t5_relative_position_bucket(rel, bidirectional=True)
    assert bidir[0].item() == 0 and bidir[-2].item() == 17 and bidir[-1].item() == 21


def test_t5_bias_reads_the_table():
    enc = posenc.create("t5", num_heads=2, bidirectional=False)
    qp, kp = torch.arange(5), torch.arange(5)
    bias = enc.score_bias(qp, kp)
    buckets = posenc.t5_relative_position_bucket(kp[None, :] - qp[:, None], bidirectional=False)
    w = enc.relative_attention_bias.weight.detach()
    for h in range(2):
        torch.testing.assert_close(bias[h].detach(), w[buckets, h])


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_heads=0), "num_heads"),
    (dict(num_heads=2, num_buckets=0), "num_buckets"),
    (dict(num_heads=2, num_buckets=32, max_distance=8), "max_distance"),
])
def test_t5_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        posenc.create("t5", **kwargs)


def test_bias_is_relative_for_translation_invariant_encodings():
    for name in ("alibi", "t5"):
        enc = posenc.create(name, num_heads=4)
        qp, kp = torch.arange(10, 20), torch.arange(5, 20)
        torch.testing.assert_close(enc.score_bias(qp, kp), enc.score_bias(qp + 1000, kp + 1000))


@pytest.mark.parametrize("name", [n for n, cls in posenc.REGISTRY.items() if getattr(cls, "translation_invariant", False)])
@pytest.mark.parametrize("q_start, num_queries, k_start, num_keys", [(0, 9, 0, 9), (300, 1, 0, 301), (40, 5, 30, 20), (7, 12, 0, 3)])
def test_toeplitz_bias_equals_the_elementwise_formula(name, q_start, num_queries, k_start, num_keys):
    """The attention layer's tiles of consecutive positions take the Toeplitz path (the
    encoding's score_bias is elementwise): both must equal bias() entry by entry."""
    enc = posenc.create(name, num_heads=3)
    with torch.no_grad():
        for p in enc.parameters():
            p.uniform_(0.1, 1.5)
    qp, kp = torch.arange(q_start, q_start + num_queries), torch.arange(k_start, k_start + num_keys)
    fast, _ = tiling.bias_tile(enc, qp, kp, 3)
    assert fast.shape == (3, num_queries, num_keys) and fast.is_contiguous()
    slow = enc.bias(qp[:, None], kp[None, :], torch.arange(3)[:, None, None])
    torch.testing.assert_close(fast, slow, rtol=0, atol=0)
    torch.testing.assert_close(enc.score_bias(qp, kp), slow, rtol=0, atol=0)
    # the same values through a permutation (not consecutive: gathered or elementwise)
    perm = torch.randperm(num_keys)
    torch.testing.assert_close(enc.score_bias(qp, kp[perm]), fast[:, :, perm], rtol=0, atol=0)
    torch.testing.assert_close(tiling.bias_tile(enc, qp, kp[perm], 3)[0], fast[:, :, perm], rtol=0, atol=0)


def test_encodings_state_math_not_backends():
    """How a bias is tiled is the attention layer's business: the encoding protocol and the
    encoding files name no backend and carry no timings or size thresholds."""
    import re
    from pathlib import Path

    src = Path(posenc.__file__).parent / "encodings"
    for path in sorted(src.glob("*.py")):
        name, text = path.name, path.read_text()
        assert not re.search(r"\b(sdpa|blocked|flex_attention|eager)\b|\d\s*ms\b|\dx faster|numel\(\) <=", text), name
