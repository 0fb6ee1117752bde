"""Training T5, ALiBi, Kerple, FoX and FIRE on the CPU through the fused relative-position kernel
(posenc.kernels.relpos_cpu, its score-bias table, gate and piecewise terms; issue 38 item 5): the
``blocked`` backend asks the encoding's ``fused_attention`` (``bias_kernel_attention``), which
hands the call to the kernel with autograd. Outputs and the gradients of q, k, v and of every
bias parameter (FoX: of its gate projection, through the gates) against the same encoding's
hooks in float64, with a tolerance set from the hooks' own float32 error on the same call.
Built once per module; skips where no compiler builds it."""

from __future__ import annotations

import copy

import pytest
import torch

import posenc
from posenc import kernels

pytestmark = pytest.mark.usefixtures("relpos_built")


@pytest.fixture
def kernel_calls(relpos_kernel_calls):
    return relpos_kernel_calls


EPS32 = torch.finfo(torch.float32).eps

ENCODINGS = {
    "t5": {"num_heads": 4, "num_buckets": 8, "max_distance": 20},
    "kerple-log": {"num_heads": 4},
    "kerple-power": {"num_heads": 4, "variant": "power"},
    "alibi": {"num_heads": 4},
    "fox": {"d_model": 32, "num_heads": 4},
    "fire": {"num_heads": 4, "init_L": 64.0},  # L inside the cases' positions: den varies by row
}


def make(name: str, dtype=torch.float32):
    torch.manual_seed(0)
    enc = posenc.create(name.split("-")[0], **ENCODINGS[name]).to(dtype)
    with torch.no_grad():
        for p in enc.parameters():  # away from the init's symmetric values: every parameter matters
            p.add_(0.3 * torch.rand_like(p))
    return enc


def run(enc, x, q, k, v, *, backend, causal, q_positions, k_positions):
    gates = enc.gate(x) if "gate" in {h.value for h in enc.hooks} else None
    return posenc.attention(q, k, v, enc, causal=causal, backend=backend, gates=gates, q_positions=q_positions,
                            k_positions=k_positions)


def inputs(batch, heads, kv_heads, num_queries, num_keys, dim, dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, num_queries, dim, generator=g, dtype=dtype)
    k, v = (torch.randn(batch, kv_heads, num_keys, dim, generator=g, dtype=dtype) for _ in range(2))
    x = torch.randn(batch, num_keys, 32, generator=g, dtype=dtype)
    return [t.requires_grad_() for t in (x, q, k, v)]


CASES = [
    # B, H, H_kv, Tq, Tk, causal, first query position, first key position
    (2, 4, 4, 150, 150, True, 0, 0),      # training: two blocks of query rows
    (1, 4, 2, 40, 170, True, 130, 0),     # after a cache (the queries the last keys), GQA
    (1, 4, 4, 60, 60, False, 7, 7),       # bidirectional, positions from 7
    pytest.param(1, 4, 4, 4096, 4096, True, 0, 0, marks=pytest.mark.slow),  # the benchmark's length
]


@pytest.mark.parametrize("name", list(ENCODINGS))
@pytest.mark.parametrize("batch, heads, kv_heads, nq, nk, causal, q0, k0", CASES)
def test_blocked_training_through_the_kernel_matches_the_hooks(name, batch, heads, kv_heads, nq, nk, causal, q0, k0,
                                                              kernel_calls):
    enc = make(name)
    if name == "fox" and not causal:
        pytest.skip("FoX's fused form is causal only (its bidirectional bias, -|c_i - c_j|, has none)")
    positions = {"q_positions": torch.arange(q0, q0 + nq), "k_positions": torch.arange(k0, k0 + nk)}
    x, q, k, v = inputs(batch, heads, kv_heads, nq, nk, 16, torch.float32)
    out = run(enc, x, q, k, v, backend="blocked", causal=causal, **positions)
    assert len(kernel_calls) == 1, "the kernel did not serve the call"
    assert kernel_calls[0] in (["bias_table"], ["gate_hi", "gate_lo"], ["bends", "intercepts", "slopes", "x_den", "x_table"])
    leaves = [x, q, k, v, *enc.parameters()]
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    got = [out.detach(), *torch.autograd.grad(out, leaves, grad, allow_unused=True)]

    enabled, kernels.CPU_KERNEL_ENABLED = kernels.CPU_KERNEL_ENABLED, False
    try:
        results = {}
        for dtype in (torch.float32, torch.float64):
            enc_d = copy.deepcopy(enc).to(dtype)  # the same parameters, widened
            leaves_d = [t.detach().to(dtype).requires_grad_() for t in (x, q, k, v)]
            out_d = run(enc_d, *leaves_d, backend="eager", causal=causal, **positions)
            results[dtype] = [out_d.detach(), *torch.autograd.grad(out_d, [*leaves_d, *enc_d.parameters()], grad.to(dtype),
                                                          allow_unused=True)]
    finally:
        kernels.CPU_KERNEL_ENABLED = enabled
    assert len(kernel_calls) == 1
    names = ["out", "x", "q", "k", "v", *(n for n, _ in enc.named_parameters())]
    for label, kernel, hooks32, ref in zip(names, got, results[torch.float32], results[torch.float64]):
        if ref is None:
            assert kernel is None or not kernel.any(), label
            continue
        noise = float((hooks32.double() - ref).abs().max())
        size = float(ref.abs().max())
        error = float((kernel.double() - ref).abs().max())
        # the hooks' own float32 error, with room for another order of summation
        assert error <= 8 * noise + 2 * EPS32 * size, f"{label}: {error:.3g} against the hooks' {noise:.3g}"


@pytest.mark.parametrize("name", ["t5", "kerple-power", "fox", "fire"])
def test_the_comparison_fails_on_a_wrong_bias(name, kernel_calls):
    """The check above can fail: the same call with every parameter 10% larger (FoX: its gate
    projection's) is far outside the float32 noise."""
    enc = make(name)
    x, q, k, v = inputs(1, 4, 4, 50, 50, 16, torch.float32)
    out = run(enc, x, q, k, v, backend="blocked", causal=True, q_positions=None, k_positions=None)
    wrong = make(name)
    with torch.no_grad():
        for p in wrong.parameters():
            p.mul_(1.1)
    enabled, kernels.CPU_KERNEL_ENABLED = kernels.CPU_KERNEL_ENABLED, False
    try:
        ref = run(wrong, x, q, k, v, backend="eager", causal=True, q_positions=None, k_positions=None)
    finally:
        kernels.CPU_KERNEL_ENABLED = enabled
    assert float((out - ref).abs().max()) > 1e-3


@pytest.mark.parametrize("case", ["mask", "packed positions", "float64", "switched off"])
@pytest.mark.parametrize("name", ["t5", "fire"])
def test_calls_the_kernel_does_not_cover_take_the_blocks(case, name, kernel_calls):
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 4, 12, 8, generator=g).requires_grad_() for _ in range(3))
    enc = make(name)
    kwargs = {"backend": "blocked", "causal": True}
    if case == "mask":
        kwargs["mask"] = torch.rand(2, 1, 12, 12, generator=g) > 0.3
    elif case == "packed positions":
        kwargs["q_positions"] = kwargs["k_positions"] = torch.tensor([[0, 1, 2, 3, 4, 5] * 2] * 2)
    elif case == "float64":
        q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
        enc = enc.double()
    enabled = kernels.CPU_KERNEL_ENABLED
    kernels.CPU_KERNEL_ENABLED = case != "switched off"
    try:
        out = posenc.attention(q, k, v, enc, **kwargs)
        out.sum().backward()
    finally:
        kernels.CPU_KERNEL_ENABLED = enabled
    assert not kernel_calls
    assert torch.isfinite(q.grad).all()
