"""The fused CPU forward of FIRE attention (posenc.kernels.fire_cpu, FIRE.fused_attention):
against attention with FIRE's bias written out in float64 (the paper's formula and the network,
sharing no code with posenc), to within the error of the present float32 path (the blocked
backend's tiles) on the same inputs; what it declines (the caller's path runs); the blocked
backend asking for it. Built once per module; the module skips where no compiler builds it."""

from __future__ import annotations

import warnings

import pytest
import torch

import posenc
from posenc import kernels
from posenc.kernels import fire_cpu


@pytest.fixture(scope="module", autouse=True)
def built():
    was_built = fire_cpu.is_built()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        if not kernels.build_cpu_fire():
            pytest.skip("the fused CPU FIRE kernel does not build here (no C++ compiler or ninja)")
    yield
    if not was_built:  # later modules test the blocked tiles, as they would without this one
        fire_cpu.unload()


@pytest.fixture
def kernel_calls(monkeypatch):
    """How many calls reached the kernel and were done by it (not handed back with None)."""
    calls = []
    original = fire_cpu.attention

    def counting(*args, **kwargs):
        result = original(*args, **kwargs)
        calls.append(result is not None)
        return result

    monkeypatch.setattr(fire_cpu, "attention", counting)
    return calls


def fire(num_heads=4, *, seed=0, bends=True, **kwargs):
    """A FIRE; with ``bends`` its hidden units bend all over [0, 1] (normal weights), so the
    kernel's tiles cross many of them (at default init only a few lie in [0, 1])."""
    torch.manual_seed(seed)
    enc = posenc.create("fire", num_heads=num_heads, **kwargs)
    if bends:
        with torch.no_grad():
            for p in enc.mlp.parameters():
                p.normal_()
            enc.mlp[0].bias.uniform_(-1.0, 0.0)
    return enc


def reference(enc, q, k, v, q_positions, k_positions, causal):
    """softmax(q.k^T / sqrt(D) + b + causal) v in float64, b(h, i, j) = f(psi(i - j) /
    (psi(max(L, i)) + eps)), psi(x) = ln(|c x| + 1) (Li et al. 2024, eq. 4 and section 3.2),
    f the MLP; causal: key index j <= query index i + Tk - Tq."""
    c, big_l, eps = float(enc.c.detach()), abs(float(enc.L_multiplier.detach()) * float(enc.init_L)), enc.eps
    i = q_positions.double().unsqueeze(-1)
    j = k_positions.double().unsqueeze(-2)
    x = torch.log((c * (i - j)).abs() + 1) / (torch.log((c * i.clamp(min=big_l)).abs() + 1) + eps)
    w1, b1 = enc.mlp[0].weight.detach().double()[:, 0], enc.mlp[0].bias.detach().double()
    w2, b2 = enc.mlp[2].weight.detach().double(), enc.mlp[2].bias.detach().double()
    bias = (torch.relu(x.unsqueeze(-1) * w1 + b1) @ w2.t() + b2).movedim(-1, -3)[:q.shape[1]]
    scores = q.double() @ k.double().transpose(-2, -1) / q.shape[-1] ** 0.5 + bias
    if causal:
        tq, tk = q.shape[2], k.shape[2]
        future = torch.arange(tk) > torch.arange(tq).unsqueeze(-1) + (tk - tq)
        scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v.double()


def present_path(enc, q, k, v, q_positions, k_positions, causal):
    """The blocked backend's tiles with the kernel switched off (the path before it)."""
    enabled, kernels.CPU_KERNEL_ENABLED = kernels.CPU_KERNEL_ENABLED, False
    try:
        return posenc.attention(q, k, v, encoding=enc, q_positions=q_positions, k_positions=k_positions,
                                causal=causal, backend="blocked")
    finally:
        kernels.CPU_KERNEL_ENABLED = enabled


def fused(enc, q, k, v, q_positions, k_positions, causal, mask=None):
    return enc.fused_attention(q, k, v, q_positions=q_positions, k_positions=k_positions, causal=causal,
                               mask=mask, scale=q.shape[-1] ** -0.5)


def qkv(batch, heads, tq, tk, d, seed=1):
    torch.manual_seed(seed)
    return torch.randn(batch, heads, tq, d), torch.randn(batch, heads, tk, d), torch.randn(batch, heads, tk, d)


@pytest.mark.parametrize(
    "batch, heads, tq, tk, d, start, causal, init_l",
    [
        (1, 4, 300, 300, 64, 0, True, 64.0),  # rows past L: one normalizer per row; tails of every block
        (2, 4, 70, 333, 32, 0, True, 64.0),  # a cache before the queries (Tk > Tq), batch 2
        (1, 4, 130, 77, 128, 500, False, 512.0),  # no mask: keys after the queries too; positions from 500
        (1, 4, 1, 200, 64, 9, True, 16.0),  # one query (decoding)
        (1, 4, 128, 128, 64, 0, True, 512.0),  # whole blocks, below L (a Toeplitz bias)
    ],
)
def test_matches_the_float64_formula_as_closely_as_the_present_path(batch, heads, tq, tk, d, start, causal, init_l,
                                                                     kernel_calls):
    enc = fire(4, init_L=init_l)
    q, k, v = qkv(batch, heads, tq, tk, d)
    k_positions = torch.arange(start, start + tk)
    q_positions = k_positions[tk - tq:] if causal else torch.arange(start + 3, start + 3 + tq)
    want = reference(enc, q, k, v, q_positions, k_positions, causal)
    with torch.no_grad():
        got = fused(enc, q, k, v, q_positions, k_positions, causal)
        present = present_path(enc, q, k, v, q_positions, k_positions, causal)
    assert kernel_calls == [True]
    assert got.shape == (batch, heads, tq, d) and got.dtype == torch.float32
    present_error = float((present.double() - want).abs().max())
    error = float((got.double() - want).abs().max())
    assert present_error < 3e-6  # the float32 path itself: the scale of the tolerance
    assert error <= max(2 * present_error, 1e-6), (error, present_error)


def test_sharp_scores_that_keep_raising_each_rows_maximum(kernel_calls):
    """Scores of spread 50 whose maximum keeps rising along the keys, by more than exp's float32
    range (88) over a row: the kernel's online softmax must move each row's reference maximum
    (and rescale its sum and output), or its exponentials overflow."""
    enc = fire(4, init_L=32.0)
    q, k, v = qkv(1, 4, 260, 260, 64)
    q = q * 50
    k = k * torch.linspace(0.05, 1.0, 260).view(1, 1, -1, 1)  # later keys score higher
    positions = torch.arange(260)
    want = reference(enc, q, k, v, positions, positions, True)
    with torch.no_grad():
        got = fused(enc, q, k, v, positions, positions, True)
        present = present_path(enc, q, k, v, positions, positions, True)
    assert kernel_calls == [True]
    present_error = float((present.double() - want).abs().max())
    assert float((got.double() - want).abs().max()) <= max(2 * present_error, 1e-6)


def test_default_initialisation_and_a_wrong_bias_is_seen():
    """At FIRE's default init (few bends in [0, 1]) it matches; the same comparison tells a
    bias off by one hidden unit's share (the check can fail)."""
    enc = fire(4, bends=False, init_L=32.0)
    q, k, v = qkv(1, 4, 200, 200, 64)
    positions = torch.arange(200)
    with torch.no_grad():
        got = fused(enc, q, k, v, positions, positions, True)
    want = reference(enc, q, k, v, positions, positions, True)
    assert float((got.double() - want).abs().max()) < 1e-6
    with torch.no_grad():
        enc.mlp[2].weight[:, 0] += 0.5
        enc.mlp[0].bias[0] = 0.3  # unit 0 now on over the whole range: every score moves
    assert float((got.double() - reference(enc, q, k, v, positions, positions, True)).abs().max()) > 1e-3


def test_several_threads_give_what_one_gives():
    enc = fire(4)
    q, k, v = qkv(1, 4, 520, 520, 64)
    positions = torch.arange(520)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        with torch.no_grad():
            one = fused(enc, q, k, v, positions, positions, True)
        torch.set_num_threads(3)
        with torch.no_grad():
            several = fused(enc, q, k, v, positions, positions, True)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, several)


def test_blocked_backend_takes_it_without_grad_and_keeps_its_path_under_autograd(kernel_calls):
    enc = fire(4, init_L=32.0)
    q, k, v = qkv(1, 4, 150, 150, 64)
    positions = torch.arange(150)
    with torch.no_grad():
        out = posenc.attention(q, k, v, encoding=enc, causal=True, backend="blocked")
    assert kernel_calls == [True]
    torch.testing.assert_close(out.double(), reference(enc, q, k, v, positions, positions, True), atol=1e-6, rtol=0)
    q.requires_grad_()
    out = posenc.attention(q, k, v, encoding=enc, causal=True, backend="blocked")
    out.sum().backward()
    assert kernel_calls == [True] and q.grad is not None  # the recomputing autograd function ran
    kernels.CPU_KERNEL_ENABLED, enabled = False, kernels.CPU_KERNEL_ENABLED
    try:
        with torch.no_grad():
            posenc.attention(q, k, v, encoding=enc, causal=True, backend="blocked")
    finally:
        kernels.CPU_KERNEL_ENABLED = enabled
    assert kernel_calls == [True]  # switched off: not even asked


def declines(enc, q, k, v, q_positions, k_positions, causal=True, mask=None):
    return fused(enc, q, k, v, q_positions, k_positions, causal, mask) is None


def test_declines_what_it_does_not_cover():
    enc = fire(4)
    q, k, v = qkv(1, 4, 40, 40, 64)
    p = torch.arange(40)
    with torch.no_grad():
        assert declines(enc, q, k, v, p, p, mask=torch.ones(40, 40, dtype=torch.bool))
        assert declines(enc, q.double(), k.double(), v.double(), p, p)
        assert declines(fire(4).double(), q, k, v, p, p)  # a float64 encoding
        assert declines(enc, q, k[:, :2], v[:, :2], p, p)  # grouped key-value heads
        assert declines(enc, *qkv(1, 4, 40, 40, 48), p, p)  # a head size without a kernel
        assert declines(enc, q, k, v, p * 2, p * 2)  # gaps
        assert declines(enc, q, k, v, p.expand(2, 40), p.expand(2, 40))  # per-batch positions
        assert declines(enc, *qkv(1, 4, 40, 20, 64), p, p[:20])  # causal with Tq > Tk
        assert declines(fire(8), *qkv(1, 9, 40, 40, 64), p, p)  # more query heads than the encoding's
        zero = fire(4, init_c=0.0, eps=0.0)  # 0 / 0: the network's own path decides
        assert declines(zero, q, k, v, p, p)
    with torch.no_grad():
        assert not declines(enc, q, k, v, p, p)


def test_training_goes_to_the_relative_position_kernel(relpos_built, relpos_kernel_calls, monkeypatch):
    """With something to differentiate (FIRE's parameters, or q), the forward-only kernel is not
    asked; the relative-position kernel's piecewise term serves the call, with autograd."""
    forward_only = []
    monkeypatch.setattr(fire_cpu, "attention", lambda *args, **kwargs: forward_only.append(args))
    enc = fire(4)
    q, k, v = qkv(1, 4, 40, 40, 64)
    p = torch.arange(40)
    out = fused(enc, q, k, v, p, p, True, None)  # FIRE's parameters require grad
    assert out is not None and out.requires_grad
    with torch.no_grad():
        q.requires_grad_()
    out = fused(enc.requires_grad_(False), q, k, v, p, p, True, None)  # q requires grad
    assert out is not None and out.requires_grad
    assert not forward_only and len(relpos_kernel_calls) == 2


def test_switch_off_declines():
    enc = fire(4)
    q, k, v = qkv(1, 4, 40, 40, 64)
    p = torch.arange(40)
    enabled, kernels.CPU_KERNEL_ENABLED = kernels.CPU_KERNEL_ENABLED, False
    try:
        with torch.no_grad():
            assert declines(enc, q, k, v, p, p)
    finally:
        kernels.CPU_KERNEL_ENABLED = enabled
