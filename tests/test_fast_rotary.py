"""apply_rotary's fast path (chunked, no rotate_half) against the formula written as loops in float64."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
import posenc.kernels.rotary_torch as rotary


def reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """x * cos + rotate(x) * sin in float64, one pair at a time."""
    x, cos, sin = torch.broadcast_tensors(x.double(), cos.double(), sin.double())
    out = torch.empty_like(x)
    d = x.shape[-1]
    pairs = [(2 * i, 2 * i + 1) for i in range(d // 2)] if interleaved else [(i, i + d // 2) for i in range(d // 2)]
    for a, b in pairs:
        out[..., a] = x[..., a] * cos[..., a] - x[..., b] * sin[..., a]
        out[..., b] = x[..., b] * cos[..., b] + x[..., a] * sin[..., b]
    return out


@pytest.fixture(params=[None, 64], ids=["one-chunk", "many-chunks"])
def chunk(request, monkeypatch):
    if request.param is not None:
        monkeypatch.setattr(rotary, "_CHUNK_ELEMENTS", request.param)
    return request.param


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("table_shape", ["T,D", "B,1,T,D", "B,H,T,D", "1,D"])
def test_matches_float64_formula(interleaved, table_shape, chunk):
    g = torch.Generator().manual_seed(0)
    B, H, T, D = 2, 3, 11, 8
    x = torch.randn(B, H, T, D, dtype=torch.float64, generator=g)
    shape = {"T,D": (T, D), "B,1,T,D": (B, 1, T, D), "B,H,T,D": (B, H, T, D), "1,D": (1, D)}[table_shape]
    cos = torch.randn(shape, dtype=torch.float64, generator=g)  # any values: every entry is read
    sin = torch.randn(shape, dtype=torch.float64, generator=g)
    out = posenc.apply_rotary(x, cos, sin, interleaved=interleaved)
    assert out.dtype == x.dtype and out.shape == x.shape
    torch.testing.assert_close(out, reference(x, cos, sin, interleaved), rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_narrow_dtypes_round_once(interleaved, dtype, chunk):
    """float32 tables with a narrower x: the arithmetic runs in float32, rounded once to x's dtype."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4, 9, 16, generator=g).to(dtype)
    cos, sin = torch.randn(9, 16, generator=g), torch.randn(9, 16, generator=g)
    out = posenc.apply_rotary(x, cos, sin, interleaved=interleaved)
    assert out.dtype == dtype
    expected = reference(x, cos, sin, interleaved)
    # float32 products and sum (error ~ eps32 * (|x c| + |x' s|)), then one rounding to dtype
    atol = 4 * torch.finfo(torch.float32).eps * float((x.double().abs() * (cos.abs() + sin.abs())).max())
    torch.testing.assert_close(out.double(), expected, atol=atol, rtol=torch.finfo(dtype).eps)


@pytest.mark.parametrize("interleaved", [False, True])
def test_out_and_in_place(interleaved, chunk):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 2, 7, 6, dtype=torch.float64, generator=g)
    cos, sin = torch.randn(7, 6, dtype=torch.float64, generator=g), torch.randn(7, 6, dtype=torch.float64, generator=g)
    expected = reference(x, cos, sin, interleaved)
    out = torch.empty_like(x)
    assert posenc.apply_rotary(x, cos, sin, interleaved=interleaved, out=out) is out
    torch.testing.assert_close(out, expected, rtol=1e-14, atol=1e-14)
    y = x.clone()
    posenc.apply_rotary(y, cos, sin, interleaved=interleaved, out=y)
    torch.testing.assert_close(y, expected, rtol=1e-14, atol=1e-14)
    # a bf16 x rotated in place goes through the float32 scratch
    z = x.to(torch.bfloat16)
    expected = reference(z, cos.float(), sin.float(), interleaved)
    posenc.apply_rotary(z, cos.float(), sin.float(), interleaved=interleaved, out=z)
    torch.testing.assert_close(z.double(), expected, atol=1e-5, rtol=torch.finfo(torch.bfloat16).eps)


@pytest.mark.parametrize("interleaved", [False, True])
def test_gradients(interleaved, chunk):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 2, 5, 6, dtype=torch.float64, generator=g, requires_grad=True)
    cos, sin = torch.randn(5, 6, dtype=torch.float64, generator=g), torch.randn(5, 6, dtype=torch.float64, generator=g)
    assert torch.autograd.gradcheck(lambda t: posenc.apply_rotary(t, cos, sin, interleaved=interleaved), (x,))
    # tables that require grad take the plain formula, differentiable in all three
    cos.requires_grad_(), sin.requires_grad_()
    assert torch.autograd.gradcheck(lambda *a: posenc.apply_rotary(*a, interleaved=interleaved), (x, cos, sin))


def test_rope_rotate_matches_reference():
    rope = posenc.create("rope", head_dim=8)
    q, k = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 9, 8)
    qp, kp = torch.arange(4, 9), torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8], [3, 4, 5, 6, 7, 8, 9, 10, 11]])
    q2, k2 = rope.rotate(q, k, qp, kp)
    inv_freq = 1.0 / 10000 ** (torch.arange(0, 8, 2, dtype=torch.float64) / 8)

    def tables(p):
        angles = p.double().unsqueeze(-1) * inv_freq
        return torch.cat((angles.cos(),) * 2, -1), torch.cat((angles.sin(),) * 2, -1)

    torch.testing.assert_close(q2.double(), reference(q, *tables(qp), False), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(k2.double(), reference(k, *[t.unsqueeze(1) for t in tables(kp)], False), rtol=1e-6, atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(
    lead=st.lists(st.integers(1, 3), min_size=0, max_size=2),
    t=st.integers(1, 9),
    half=st.integers(1, 4),
    interleaved=st.booleans(),
    chunk=st.sampled_from([1, 8, 1 << 19]),
)
def test_any_shape(lead, t, half, interleaved, chunk):
    rotary._CHUNK_ELEMENTS, saved = chunk, rotary._CHUNK_ELEMENTS
    try:
        x = torch.randn(*lead, t, 2 * half, dtype=torch.float64)
        cos, sin = torch.randn(t, 2 * half, dtype=torch.float64), torch.randn(t, 2 * half, dtype=torch.float64)
        out = posenc.apply_rotary(x, cos, sin, interleaved=interleaved)
        torch.testing.assert_close(out, reference(x, cos, sin, interleaved), rtol=1e-14, atol=1e-14)
    finally:
        rotary._CHUNK_ELEMENTS = saved


def test_errors():
    x = torch.randn(2, 4, 6)
    with pytest.raises(ValueError, match="even"):
        posenc.apply_rotary(torch.randn(2, 5), torch.randn(2, 5), torch.randn(2, 5))
    with pytest.raises(ValueError, match="full width"):
        posenc.apply_rotary(x, torch.randn(4, 3), torch.randn(4, 3))
    with pytest.raises(ValueError, match="broadcast"):
        posenc.apply_rotary(x, torch.randn(5, 6), torch.randn(5, 6))
    with pytest.raises(ValueError, match="broadcast"):
        posenc.apply_rotary(x, torch.randn(3, 2, 4, 6), torch.randn(3, 2, 4, 6))
    with pytest.raises(ValueError, match="out"):
        posenc.apply_rotary(x, torch.randn(4, 6), torch.randn(4, 6), out=torch.empty(2, 4, 6, dtype=torch.float64))
