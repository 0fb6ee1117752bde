"""The fused CPU RoPE kernel (posenc.kernels.rotary_cpu): bit-identical to the torch path where
that path rounds once (float32, bf16, fp16), within one rounding of the float64 formula, exact on
hand-worked rotations and bf16 ties, through apply_rotary's every CPU form (allocating, ``out=``,
in place, autograd). Built once per module; the module skips where no compiler builds it."""

from __future__ import annotations

import warnings

import pytest
import torch

import posenc
from posenc import kernels
from posenc.kernels import rotary_cpu


@pytest.fixture(scope="module", autouse=True)
def built():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        if not kernels.build_cpu_rotary():
            pytest.skip("the fused CPU kernel does not build here (no C++ compiler or ninja)")


def torch_path(fn):
    """fn() with the CPU kernel switched off: today's torch path."""
    enabled, kernels.CPU_KERNEL_ENABLED = kernels.CPU_KERNEL_ENABLED, False
    try:
        return fn()
    finally:
        kernels.CPU_KERNEL_ENABLED = enabled


@pytest.fixture
def kernel_calls(monkeypatch):
    """How many calls reached the kernel and were done by it (not handed back with None)."""
    calls = []
    original = rotary_cpu.rotate_with_tables

    def counting(*args):
        result = original(*args)
        calls.append(result is not None)
        return result

    monkeypatch.setattr(rotary_cpu, "rotate_with_tables", counting)
    return calls


def formula64(x, cos, sin):
    """x * cos + rotate_half(x) * sin in float64 (Su et al. 2021, eq. 34; half-split pairs)."""
    x, cos, sin = (t.double() for t in (x, cos, sin))
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), -1) * sin


def same_bits(a, b):
    return torch.equal(a.view(torch.int16 if a.element_size() == 2 else torch.int32),
                       b.view(torch.int16 if b.element_size() == 2 else torch.int32))


DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TABLES = {"T,D": (37, 64), "B,1,T,D": (2, 1, 37, 64), "B,H,T,D": (2, 3, 37, 64), "1,D": (1, 64)}


@pytest.mark.parametrize("interleaved", [False, True], ids=["half-split", "interleaved"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("table", list(TABLES))
def test_bit_identical_to_torch_path(dtype, table, interleaved, kernel_calls):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(2, 3, 37, 64, generator=g) * 3).to(dtype)
    cos, sin = (torch.randn(TABLES[table], generator=g) for _ in range(2))
    expected = torch_path(lambda: posenc.apply_rotary(x, cos, sin, interleaved=interleaved))
    got = posenc.apply_rotary(x, cos, sin, interleaved=interleaved)
    buf = torch.empty_like(x)
    got_out = posenc.apply_rotary(x, cos, sin, interleaved=interleaved, out=buf)
    inplace = x.clone()
    posenc.apply_rotary(inplace, cos, sin, interleaved=interleaved, out=inplace)
    assert kernel_calls == [True, True, True]
    assert got_out is buf and got.dtype == dtype
    for result in (got, buf, inplace):
        assert same_bits(result, expected)


@pytest.mark.parametrize("d", [2, 18, 74])
def test_bit_identical_at_widths_off_the_vector_length(d):
    """Half widths 1, 9, 37: the scalar tails of the vector loops (here and in torch) round alike."""
    g = torch.Generator().manual_seed(6)
    cos, sin = torch.randn(11, d, generator=g), torch.randn(11, d, generator=g)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(2, 3, 11, d, generator=g).to(dtype)
        for interleaved in (False, True):
            expected = torch_path(lambda x=x, il=interleaved: posenc.apply_rotary(x, cos, sin, interleaved=il))
            assert same_bits(posenc.apply_rotary(x, cos, sin, interleaved=interleaved), expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_within_one_rounding_of_float64_formula(dtype):
    """float32 products and one fused sum (error <= 2 eps32 (|x1 c1| + |x2 s1|)), then one
    rounding to the dtype (half an ulp: eps_dtype / 2 relative)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 4, 50, 128, generator=g).to(dtype)
    cos, sin = torch.randn(50, 128, generator=g), torch.randn(50, 128, generator=g)
    got = posenc.apply_rotary(x, cos, sin).double()
    expected = formula64(x, cos, sin)
    h = 64
    xd = x.double()
    magnitude = xd.abs() * cos.double().abs() + torch.cat((xd[..., h:], xd[..., :h]), -1).abs() * sin.double().abs()
    bound = 2 * torch.finfo(torch.float32).eps * magnitude + torch.finfo(dtype).eps / 2 * expected.abs() * (1 + 1e-6)
    assert bool(((got - expected).abs() <= bound).all())


def test_hand_worked_quarter_turn():
    """theta = 90 degrees: (x_1, x_2) -> (-x_2, x_1) exactly; theta = 0 leaves x unchanged."""
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0]])
    cos = torch.tensor([[0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    sin = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    for dtype in DTYPES:
        got = posenc.apply_rotary(x.to(dtype), cos, sin)
        assert torch.equal(got.float(), torch.tensor([[-3.0, -4.0, 1.0, 2.0], [1.0, 2.0, 3.0, 4.0]]))


def test_bf16_ties_round_to_even():
    """out_1 = x_1 - x_2 s_1 with s_1 = -2^-8 lands exactly halfway between two bf16 values:
    1 + 2^-8 -> 1 (even), 1 + 2^-7 + 2^-8 -> 1 + 2^-6 (even); truncation or round-half-up would
    get one of them wrong. NaN stays NaN."""
    x = torch.tensor([[1.0, 1.0], [1.0 + 2**-7, 1.0], [float("nan"), 1.0]], dtype=torch.bfloat16)
    cos = torch.tensor([1.0, 1.0])
    sin = torch.tensor([-(2.0**-8), 0.0])
    got = posenc.apply_rotary(x, cos, sin)
    assert got[0, 0].item() == 1.0 and got[1, 0].item() == 1.0 + 2**-6
    assert torch.isnan(got[2, 0]) and torch.isnan(got[2, 1])


def test_extremes_match_torch_path():
    """Overflow to inf, inf * 0 = NaN, subnormals: the same as the torch path (NaN as NaN)."""
    values = torch.tensor([3e38, -3e38, float("inf"), 1e-40, -0.0, 0.0, 1.0, -2.5] * 8)
    x = values.reshape(2, 32)
    cos = torch.tensor([1.0, 0.5, 1.0, 1e-3] * 8)
    sin = torch.tensor([1.0, 2.0, 0.0, 1e38] * 8)
    for dtype in DTYPES:
        xd = x.to(dtype)
        expected = torch_path(lambda xd=xd: posenc.apply_rotary(xd, cos, sin))
        torch.testing.assert_close(posenc.apply_rotary(xd, cos, sin), expected, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("layout", ["5-D", "1-D", "transposed (B, T, H, D)", "partial rotary"])
def test_layouts(layout, kernel_calls):
    g = torch.Generator().manual_seed(2)
    if layout == "5-D":
        x, cos = torch.randn(2, 2, 3, 5, 16, generator=g), torch.randn(5, 16, generator=g)
    elif layout == "1-D":
        x, cos = torch.randn(16, generator=g), torch.randn(16, generator=g)
    elif layout == "transposed (B, T, H, D)":
        x, cos = torch.randn(2, 9, 3, 16, generator=g).transpose(1, 2), torch.randn(9, 16, generator=g)
    else:
        x, cos = torch.randn(2, 3, 9, 24, generator=g), torch.randn(9, 16, generator=g)
    sin = torch.randn(cos.shape, generator=g)
    if layout == "partial rotary":  # the first 16 of 24 dimensions, through the encodings' rotate_heads
        from posenc.kernels.rotary_torch import rotate_heads
        got = rotate_heads(x, cos, sin)
        expected = torch_path(lambda: rotate_heads(x, cos, sin))
        assert torch.equal(got[..., 16:], x[..., 16:])
    else:
        got = posenc.apply_rotary(x, cos, sin)
        expected = torch_path(lambda: posenc.apply_rotary(x, cos, sin))
    assert kernel_calls == [True]
    assert got.shape == expected.shape == x.shape
    assert same_bits(got, expected)
    torch.testing.assert_close(got.double()[..., :16], formula64(x[..., :16], cos, sin), rtol=1e-6, atol=1e-6)


def test_autograd_uses_kernel_and_matches_torch_path(kernel_calls):
    """The allocating call with x requiring grad: forward and backward (the rotation by -theta)
    both through the kernel; the gradient is the float64 formula's."""
    g = torch.Generator().manual_seed(3)
    x64 = torch.randn(2, 3, 7, 32, dtype=torch.float64, generator=g)
    cos, sin = torch.randn(7, 32, generator=g), torch.randn(7, 32, generator=g)
    weight = torch.randn(2, 3, 7, 32, generator=g)
    x = x64.float().requires_grad_(True)
    (posenc.apply_rotary(x, cos, sin) * weight).sum().backward()
    assert kernel_calls == [True, True]
    x_ref = x64.float().double().requires_grad_(True)
    (formula64(x_ref, cos, sin) * weight.double()).sum().backward()
    torch.testing.assert_close(x.grad.double(), x_ref.grad, rtol=1e-6, atol=1e-6)
    x2 = x64.float().requires_grad_(True)
    torch_path(lambda: (posenc.apply_rotary(x2, cos, sin) * weight).sum().backward())
    assert same_bits(x.grad, x2.grad)


def test_interleaved_hand_worked():
    """Interleaved pairs (2i, 2i+1), a quarter turn: (x_0, x_1, x_2, x_3) -> (-x_1, x_0, -x_3, x_2)."""
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    got = posenc.apply_rotary(x, torch.zeros(4), torch.ones(4), interleaved=True)
    assert torch.equal(got, torch.tensor([-2.0, 1.0, -4.0, 3.0]))


def test_torch_path_where_kernel_does_not_cover(kernel_calls):
    """float64, a float64 table and an out that partly overlaps x go to the torch path."""
    g = torch.Generator().manual_seed(4)
    x, cos, sin = torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)
    posenc.apply_rotary(x.double(), cos.double(), sin.double())
    posenc.apply_rotary(x, cos.double(), sin)
    buf = torch.randn(5, 8, generator=g)
    expected = torch_path(lambda: posenc.apply_rotary(buf[1:].clone(), cos, sin))
    got = posenc.apply_rotary(buf[1:], cos, sin, out=buf[:4])
    assert kernel_calls == [False, False, False]
    assert same_bits(got, expected)


def test_out_with_grad_raises_as_torch_path():
    """``out=`` records no gradient: with x requiring grad the torch path's error, not a silent write."""
    x = torch.randn(2, 4, 8, requires_grad=True)
    cos, sin = torch.randn(4, 8), torch.randn(4, 8)
    with pytest.raises(RuntimeError, match="don't support automatic differentiation"):
        posenc.apply_rotary(x, cos, sin, out=torch.empty(2, 4, 8))
    with torch.no_grad():
        got = posenc.apply_rotary(x, cos, sin, out=torch.empty(2, 4, 8))
    assert same_bits(got, torch_path(lambda: posenc.apply_rotary(x.detach(), cos, sin)))


def test_switch_off_compiling_and_other_devices_keep_torch_path(kernel_calls, monkeypatch):
    x, cos, sin = torch.randn(4, 8), torch.randn(4, 8), torch.randn(4, 8)
    torch_path(lambda: posenc.apply_rotary(x, cos, sin))
    assert kernel_calls == []
    assert kernels.use_cpu_kernel(x) and not kernels.use_cpu_kernel(x, x.to("meta"))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not kernels.use_cpu_kernel(x)


def test_threads_split_rows_bit_identical():
    """With two torch threads a large call is split across threads: the same bits."""
    before = torch.get_num_threads()
    g = torch.Generator().manual_seed(5)
    for shape in [(1, 4, 1024, 64), (64, 64, 1, 64)]:  # split by positions, then by heads
        x = torch.randn(shape, generator=g).to(torch.bfloat16)
        cos, sin = torch.randn(shape[2], 64, generator=g), torch.randn(shape[2], 64, generator=g)
        try:
            torch.set_num_threads(2)
            got = posenc.apply_rotary(x, cos, sin)
        finally:
            torch.set_num_threads(before)
        assert same_bits(got, torch_path(lambda x=x, cos=cos, sin=sin: posenc.apply_rotary(x, cos, sin)))


def test_build_failure_warns_once_and_keeps_torch_path(monkeypatch):
    from torch.utils import cpp_extension

    def no_compiler(*args, **kwargs):
        raise RuntimeError("Ninja is required to load C++ extensions")

    monkeypatch.setattr(rotary_cpu, "_lib", None)
    monkeypatch.setattr(rotary_cpu, "_failed", False)
    monkeypatch.setattr(cpp_extension, "load", no_compiler)
    monkeypatch.setattr(kernels, "CPU_KERNEL_AUTOBUILD", True)
    x, cos, sin = torch.randn(4, 8), torch.randn(4, 8), torch.randn(4, 8)
    with pytest.warns(RuntimeWarning, match="could not be built"):
        got = posenc.apply_rotary(x, cos, sin)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not kernels.build_cpu_rotary()
        posenc.apply_rotary(x, cos, sin)
    torch.testing.assert_close(got.double(), formula64(x, cos, sin), rtol=1e-6, atol=1e-6)
