"""Sinusoidal and learned absolute encodings against the formula in float64."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc


def vaswani(p: int, i: int, d: int, base: float = 10000.0) -> float:
    """Vaswani et al. (2017) section 3.5, one entry at a time."""
    angle = p / base ** (2 * (i // 2) / d)
    return math.sin(angle) if i % 2 == 0 else math.cos(angle)


@given(n=st.integers(1, 40), half=st.integers(1, 16))
@settings(max_examples=30, deadline=None)
def test_sinusoidal_table_matches_the_formula(n, half):
    d = 2 * half
    table = posenc.sinusoidal_table(n, d)
    assert table.shape == (n, d) and table.dtype == torch.float32
    expected = torch.tensor([[vaswani(p, i, d) for i in range(d)] for p in range(n)], dtype=torch.float64)
    torch.testing.assert_close(table.double(), expected, rtol=0, atol=1e-6)


def test_sinusoidal_known_values():
    table = posenc.sinusoidal_table(3, 4)
    # p=1: sin(1), cos(1), sin(1/100), cos(1/100)
    torch.testing.assert_close(table[1], torch.tensor([math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)]))
    torch.testing.assert_close(table[0], torch.tensor([0.0, 1.0, 0.0, 1.0]))


def test_sinusoidal_precision_at_long_positions():
    """Angles in float64: position 1,000,000 is as exact as float32 output allows."""
    enc = posenc.create("sinusoidal", dim=8)
    out = enc.embed(torch.zeros(1, 1, 8), torch.tensor([1_000_000]))
    expected = torch.tensor([vaswani(1_000_000, i, 8) for i in range(8)], dtype=torch.float64)
    torch.testing.assert_close(out[0, 0].double(), expected, rtol=0, atol=1e-6)


def test_sinusoidal_concat_layout_is_a_permutation_of_vaswani():
    vas = posenc.create("sinusoidal", dim=8)
    cat = posenc.create("sinusoidal", dim=8, layout="concat")
    x, pos = torch.zeros(1, 5, 8), torch.arange(5)
    perm = [0, 2, 4, 6, 1, 3, 5, 7]  # [sin || cos] from interleaved
    torch.testing.assert_close(cat.embed(x, pos), vas.embed(x, pos)[..., perm])


def test_sinusoidal_embed_uses_positions_per_row():
    enc = posenc.create("sinusoidal", dim=6)
    x = torch.zeros(2, 3, 6)
    pos = torch.tensor([[0, 1, 2], [7, 8, 9]])
    out = enc.embed(x, pos)
    torch.testing.assert_close(out[1], posenc.sinusoidal_table(10, 6)[7:10])


def test_learned_adds_its_rows_and_refuses_positions_past_the_table():
    enc = posenc.create("learned", num_positions=16, dim=4)
    x = torch.zeros(1, 3, 4)
    out = enc.embed(x, torch.tensor([0, 5, 15]))
    torch.testing.assert_close(out[0], enc.weight[[0, 5, 15]].detach())
    with pytest.raises(ValueError, match="positions: the learned table holds positions 0..15, got 16"):
        enc.embed(x, torch.tensor([14, 15, 16]))
    assert enc.max_positions == 16


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_positions=10, dim=0), "dim"),
    (dict(num_positions=0, dim=4), "num_positions"),
    (dict(num_positions=10, dim=4, init_std=-1.0), "init_std"),
])
def test_learned_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        posenc.create("learned", **kwargs)


@pytest.mark.parametrize("kwargs, match", [
    (dict(dim=7), "dim must be a positive even integer"),
    (dict(dim=8, layout="diagonal"), "layout must be one of"),
    (dict(dim=8, base=1.0), "base"),
])
def test_sinusoidal_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        posenc.create("sinusoidal", **kwargs)
    with pytest.raises(ValueError, match="num_positions"):
        posenc.sinusoidal_table(0, 8)
