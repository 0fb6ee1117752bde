"""The rotary path under torch.compile, its higher-order gradients, and its memory at huge positions.

- fullgraph compilation of apply_rotary and of RoPE / xPos ``rotate`` for every rope_type,
  equal to the uncompiled result;
- with dynamic=True a change of length compiles no new graph (T = 1 is specialized once,
  as torch does for every size 0 or 1);
- gradgradcheck of the rotation (both layouts, partial rotary) and float64 gradcheck of
  RoPE / xPos rotate at default tolerances;
- a decoding step at position 2^31 - 1 allocates kilobytes and matches an mpmath reference.

Most compiles use the "aot_eager" backend (dynamo and AOTAutograd trace the same graph as
inductor, without generating C++); one test goes through inductor end to end.
"""

from __future__ import annotations

import math

import mpmath
import pytest
import torch
from torch._dynamo.utils import counters
from torch.profiler import ProfilerActivity, profile

import posenc
from conftest import slow_unless

from rope_reference import SAMPLES as SCALINGS  # noqa: E402  (one dict per rope_type, rotary dim 8)
LENGTH_DEPENDENT = ("dynamic", "dynamic_yarn", "longrope")
#: compiled by default: one rope_type per kind of table (a fixed one: default; one with an
#: attention factor: yarn; length-dependent: dynamic; short / long regimes: longrope); the
#: others behind slow (the default suite's time budget; pytest -m slow runs them)
COMPILED_BY_DEFAULT = ("default", "yarn", "dynamic", "longrope")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def graphs_compiled() -> int:
    return counters["stats"]["unique_graphs"]


def encodings(name):
    """RoPE (both dynamic_cache modes for length-dependent types) and xPos with this scaling;
    rotary_dim 8 of head_dim 12, so the pass-through tail is exercised too."""
    scaling = SCALINGS[name]
    modes = ("rerotate", "frozen") if name in LENGTH_DEPENDENT else ("rerotate",)
    built = [posenc.RoPE(12, rotary_dim=8, scaling=scaling, dynamic_cache=mode) for mode in modes]
    built.append(posenc.XPos(12, rotary_dim=8, scaling=scaling, interleaved=True))
    return built


# -- fullgraph, equal to uncompiled -----------------------------------------------------------------
@pytest.mark.parametrize("interleaved, backend", [(False, "inductor"), (True, "aot_eager")])
def test_apply_rotary_compiles_fullgraph(interleaved, backend):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 7, 16, generator=g, requires_grad=True)
    cos, sin = torch.randn(7, 16, generator=g), torch.randn(7, 16, generator=g)
    compiled = torch.compile(lambda *a: posenc.apply_rotary(*a, interleaved=interleaved), fullgraph=True, backend=backend)
    got = compiled(x, cos, sin)
    want = posenc.apply_rotary(x, cos, sin, interleaved=interleaved)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    (grad_got,) = torch.autograd.grad(got.square().sum(), x)
    (grad_want,) = torch.autograd.grad(want.square().sum(), x)
    torch.testing.assert_close(grad_got, grad_want, rtol=1e-5, atol=1e-5)


def test_apply_rotary_with_out_and_narrow_dtype_compiles():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 2, 5, 8, generator=g).to(torch.bfloat16)
    cos, sin = torch.randn(5, 8, generator=g), torch.randn(5, 8, generator=g)
    out = torch.empty_like(x)
    compiled = torch.compile(lambda a, c, s, o: posenc.apply_rotary(a, c, s, out=o), fullgraph=True, backend="aot_eager")
    compiled(x, cos, sin, out)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, posenc.apply_rotary(x, cos, sin), rtol=0, atol=0)


@pytest.mark.parametrize("name", [slow_unless(n in COMPILED_BY_DEFAULT, n) for n in sorted(SCALINGS)])
def test_rotate_compiles_fullgraph_for_every_rope_type(name):
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(2, 2, 5, 12, generator=g), torch.randn(2, 1, 40, 12, generator=g)
    # a query block past L0 over keys from 0: the length-dependent types use their long regime;
    # (B, T) key positions (left padding) in one row
    q_positions = torch.arange(35, 40)
    k_positions = torch.stack((torch.arange(40), torch.arange(40).clamp(min=3)))
    short = torch.arange(4, 9)  # within L0: the short regime
    for encoding in encodings(name):
        compiled = torch.compile(encoding.rotate, fullgraph=True, backend="aot_eager")
        for qp, kp in ((q_positions, k_positions), (short, short)):
            kk = k if kp is k_positions else k[:, :, :5]
            got_q, got_k = compiled(q, kk, qp, kp)
            want_q, want_k = encoding.rotate(q, kk, qp, kp)
            torch.testing.assert_close(got_q, want_q, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(got_k, want_k, rtol=1e-5, atol=1e-5)


def test_rope_rotate_compiles_fullgraph_with_inductor():
    rope = posenc.RoPE(16)
    q = torch.randn(1, 2, 24, 16)
    positions = torch.arange(24)
    got = torch.compile(rope.rotate, fullgraph=True)(q, q, positions, positions)
    want = rope.rotate(q, q, positions, positions)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


# -- dynamic shapes: no recompilation for a new length -------------------------------------------
def test_apply_rotary_dynamic_length_does_not_recompile():
    # the first T differs from the other sizes: torch gives equal sizes of the first call one
    # symbol ("duck sizing"), and a later T that breaks the equality would recompile once
    compiled = torch.compile(posenc.apply_rotary, dynamic=True, fullgraph=True, backend="aot_eager")
    for t in (5, 3, 17, 64, 2):
        x = torch.randn(2, 3, t, 8)
        compiled(x, torch.randn(t, 8), torch.randn(t, 8))
    assert graphs_compiled() == 1
    for t in (1, 1, 9):  # T = 1 is specialized, once
        compiled(torch.randn(2, 3, t, 8), torch.randn(t, 8), torch.randn(t, 8))
    assert graphs_compiled() == 2


@pytest.mark.parametrize("name", [slow_unless(n in COMPILED_BY_DEFAULT, n) for n in LENGTH_DEPENDENT])
def test_rope_and_xpos_dynamic_length_does_not_recompile(name):
    """Crossing L0 (the length-dependent regimes) does not recompile either: the frequencies
    follow the length through tensor ops, not Python branches."""
    for encoding in (posenc.RoPE(8, scaling=SCALINGS[name]), posenc.XPos(8, scaling=SCALINGS[name])):
        torch._dynamo.reset()
        counters.clear()
        compiled = torch.compile(encoding.rotate, dynamic=True, fullgraph=True, backend="aot_eager")
        for t in (3, 12, 17, 40, 2):
            q = torch.randn(1, 2, t, 8)
            got = compiled(q, q, torch.arange(t), torch.arange(t))
            torch.testing.assert_close(got[0], encoding.rotate(q, q, torch.arange(t), torch.arange(t))[0],
                                       rtol=1e-5, atol=1e-5)
        assert graphs_compiled() == 1, type(encoding).__name__


# -- higher-order gradients and float64 -------------------------------------------------------------
@pytest.mark.parametrize("interleaved", [False, True])
def test_apply_rotary_gradgradcheck(interleaved):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 2, 4, 6, dtype=torch.float64, generator=g, requires_grad=True)
    cos, sin = torch.randn(4, 6, dtype=torch.float64, generator=g), torch.randn(4, 6, dtype=torch.float64, generator=g)
    fn = lambda t: posenc.apply_rotary(t, cos, sin, interleaved=interleaved)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x,))
    assert torch.autograd.gradgradcheck(fn, (x,))


@pytest.mark.parametrize("interleaved", [False, True])
def test_partial_rope_gradgradcheck(interleaved):
    rope = posenc.RoPE(8, rotary_dim=4, interleaved=interleaved)
    g = torch.Generator().manual_seed(4)
    q = torch.randn(1, 2, 3, 8, dtype=torch.float64, generator=g, requires_grad=True)
    k = torch.randn(1, 2, 3, 8, dtype=torch.float64, generator=g, requires_grad=True)
    positions = torch.tensor([0, 7, 1000])
    fn = lambda a, b: rope.rotate(a, b, positions, positions)  # noqa: E731
    assert torch.autograd.gradgradcheck(fn, (q, k))


@pytest.mark.parametrize("name", sorted(SCALINGS))
def test_float64_gradcheck_of_rotate_at_default_tolerances(name):
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 2, 3, 12, dtype=torch.float64, generator=g, requires_grad=True)
    k = torch.randn(1, 2, 4, 12, dtype=torch.float64, generator=g, requires_grad=True)
    qp, kp = torch.tensor([18, 19, 20]), torch.tensor([0, 5, 19, 20])
    for encoding in encodings(name):
        cos, _ = encoding.cos_sin(qp, torch.float64)
        assert cos.dtype == torch.float64
        out = encoding.rotate(q, k, qp, kp)
        assert all(t.dtype == torch.float64 for t in out)
        assert torch.autograd.gradcheck(lambda a, b: encoding.rotate(a, b, qp, kp), (q, k))


# -- a decoding step at 2^31 - 1 ----------------------------------------------------------------------
P = 2**31 - 1


def bytes_allocated(fn) -> int:
    """Total CPU bytes allocated while fn runs (the profiler's allocation events)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return sum(max(event.self_cpu_memory_usage, 0) for event in prof.events())


def test_decode_step_at_2_31_costs_kilobytes():
    """One query and three keys near 2^31 - 1, head_dim 64: the old cos/sin tables from 0 to
    the largest position would need ~2.8 KB per position, terabytes here."""
    q, k = torch.randn(1, 8, 1, 64), torch.randn(1, 8, 3, 64)
    qp, kp = torch.tensor([P]), torch.tensor([P - 2, P - 1, P])
    for encoding in (posenc.RoPE(64), posenc.RoPE(64, scaling=SCALINGS["dynamic"] | {"original_max_position_embeddings": 4096}),
                     posenc.XPos(64)):
        encoding.rotate(q, k, qp, kp)  # first call: one-off per-device set-up
        used = bytes_allocated(lambda: encoding.rotate(q, k, qp, kp))
        assert 0 < used <= 64 * 1024, (type(encoding).__name__, used)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_decode_step_at_2_31_is_exact(dtype):
    """cos/sin at 2^31 - 1 against mpmath at 120 bits. The angle p * theta_i is formed in
    float64 from float64 theta_i (relative error < 2^-50, docs/precision.md), so it is off
    by at most p * theta_i * 2^-50 + half an ulp of the angle; cos and sin are 1-Lipschitz
    and correctly rounded to float64 within an ulp; then one rounding to ``dtype``."""
    mpmath.mp.prec = 120
    d = 16
    rope = posenc.RoPE(d)
    positions = torch.tensor([P, P - 1, 2**31 - 2**20])
    cos, sin = rope.cos_sin(positions, dtype)
    assert cos.dtype == sin.dtype == dtype and cos.shape == (3, d)
    half_ulp = 2.0**-53 if dtype == torch.float64 else 2.0**-24
    for row, p in enumerate(positions.tolist()):
        for i in range(d // 2):
            theta = mpmath.mpf(10000) ** (-mpmath.mpf(2 * i) / d)
            angle_bound = float(p * theta) * 2.0**-50 + math.ulp(float(p * theta)) / 2 + 2.0**-52
            for table, fn in ((cos, mpmath.cos), (sin, mpmath.sin)):
                exact = float(fn(p * theta))
                got = float(table[row, i])
                assert abs(got - exact) <= angle_bound + half_ulp * max(abs(exact), 2.0**-126), (p, i, got, exact)
                assert table[row, i + d // 2] == table[row, i]  # half-split: the half repeated
