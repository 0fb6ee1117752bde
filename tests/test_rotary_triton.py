"""The fused RoPE kernel (posenc.kernels.rotary_triton) under Triton's interpreter, on CPU tensors.

Every check compares with the formula in float64 (angles, cos, sin and the rotation) and asks
for the kernel's output to be that value rounded to the activation dtype: at most half an ulp
of the dtype away, plus the float32 arithmetic's own error (cos/sin rounded once to float32,
one product and one sum: 2 eps32 (|x_a| + |x_b|) per element). A kernel that truncated
instead of rounding, or computed the angles in float32 (error ~4.7e-3 at 2^20), fails.

``TRITON_INTERPRET=1`` must be set when the kernels are decorated (the module is imported)
and while they run; a module fixture sets it, imports (or re-imports) the kernel module,
and restores the environment afterwards. Skipped without triton (``pip install posenc[gpu]``).
"""

from __future__ import annotations

import importlib

import pytest
import torch
from conftest import interpreted_module

pytest.importorskip("triton")

import posenc  # noqa: E402
import posenc.kernels as kernels  # noqa: E402
from rotary_kernel_reference import (  # noqa: E402
    angles64, assert_rounded, case, frequencies, partner_index, rotate64, ulp,
)

EPS32 = torch.finfo(torch.float32).eps
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


@pytest.fixture(scope="module")
def rt():
    """The kernel module built for the interpreter; the environment restored afterwards."""
    yield from interpreted_module("posenc.kernels.rotary_triton")


@pytest.fixture
def on_cpu(rt, monkeypatch):
    """Let posenc's dispatch send CPU tensors to the (interpreted) kernels."""
    monkeypatch.setattr(kernels, "KERNEL_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(kernels, "TRITON_ENABLED", True)
    return rt


# --- the fused kernel -----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("interleaved", [False, True], ids=["half-split", "interleaved"])
@pytest.mark.parametrize("rotary_dim", [16, 10], ids=["full", "partial"])
def test_fused_matches_float64_within_rounding(rt, dtype, interleaved, rotary_dim):
    """GQA (4 q heads, 2 kv heads), (B, T) and (T,) positions up to 2^20, an attention factor."""
    q, k, q_pos, k_pos = case(dtype)
    inv_freq, factor = frequencies(rotary_dim), 1.25
    q2, k2 = rt.fused_rope(q, k, q_pos, k_pos, inv_freq, interleaved=interleaved, attention_factor=factor)
    assert_rounded(q2, rotate64(q, angles64(q_pos, inv_freq), interleaved, factor), q, interleaved, rotary_dim, dtype, factor)
    assert_rounded(k2, rotate64(k, angles64(k_pos, inv_freq), interleaved, factor), k, interleaved, rotary_dim, dtype, factor)
    assert torch.equal(q2[..., rotary_dim:], q[..., rotary_dim:]) and torch.equal(k2[..., rotary_dim:], k[..., rotary_dim:])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_narrow_outputs_are_the_float32_result_rounded_to_nearest(rt, dtype):
    """Bit for bit: the kernel's bf16/fp16 output is its own float32 result (same inputs, same
    arithmetic) rounded to nearest even by torch. The interpreter's own float32 -> bfloat16
    cast truncates; the kernel must not."""
    q, k, q_pos, k_pos = case(dtype, seed=3)
    inv_freq = frequencies(16)
    q2, k2 = rt.fused_rope(q, k, q_pos, k_pos, inv_freq)
    q32, k32 = rt.fused_rope(q.float(), k.float(), q_pos, k_pos, inv_freq)
    assert torch.equal(q2, q32.to(dtype)) and torch.equal(k2, k32.to(dtype))


def test_proportional_zero_frequencies_pass_through(rt):
    """p-RoPE: inv_freq with zeros; those pairs keep x exactly."""
    q, k, q_pos, k_pos = case(torch.float32)
    inv_freq = frequencies(16)
    inv_freq[3:] = 0.0
    q2, k2 = rt.fused_rope(q, k, q_pos, k_pos, inv_freq)
    still = [i for i in range(16) if i % 8 >= 3]
    assert torch.equal(q2[..., still], q[..., still]) and torch.equal(k2[..., still], k[..., still])
    assert_rounded(q2, rotate64(q, angles64(q_pos, inv_freq), False), q, False, 16, torch.float32)


@pytest.mark.parametrize("positions_shape", ["3,B,T", "3,T"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["half-split", "interleaved"])
def test_mrope_pair_axis_selects_a_position_row_per_pair(rt, positions_shape, interleaved):
    """M-RoPE: pair i turns by positions[pair_axis[i]] * inv_freq[i] (Qwen2-VL's mrope_section
    [2, 3, 3] as a per-pair axis over 8 pairs)."""
    q, k, _, _ = case(torch.float32)
    B, Tq, Tk = q.shape[0], q.shape[2], k.shape[2]
    g = torch.Generator().manual_seed(5)
    shape = (3, B) if positions_shape == "3,B,T" else (3,)
    q_pos = torch.randint(0, 5000, shape + (Tq,), generator=g)
    k_pos = torch.randint(0, 5000, shape + (Tk,), generator=g)
    pair_axis = torch.tensor([0, 0, 1, 1, 1, 2, 2, 2])
    inv_freq = frequencies(16, base=1e6)
    q2, k2 = rt.fused_rope(q, k, q_pos, k_pos, inv_freq, pair_axis=pair_axis, interleaved=interleaved)
    expected_q = rotate64(q, angles64(q_pos, inv_freq, pair_axis), interleaved)
    assert_rounded(q2, expected_q, q, interleaved, 16, torch.float32)
    assert_rounded(k2, rotate64(k, angles64(k_pos, inv_freq, pair_axis), interleaved), k, interleaved, 16, torch.float32)
    # and it is not plain RoPE on the temporal row
    assert (q2.double() - rotate64(q, angles64(q_pos[0], inv_freq), interleaved)).abs().max() > 1e-3


def test_per_position_frequencies(rt):
    """inv_freq (B, T, P) for q and (T, P) for k: the "frozen" mode of dynamic / longrope."""
    q, k, q_pos, k_pos = case(torch.float32)
    g = torch.Generator().manual_seed(6)
    q_freq = torch.rand(q.shape[0], q.shape[2], 8, dtype=torch.float64, generator=g)
    k_freq = torch.rand(k.shape[2], 8, dtype=torch.float64, generator=g)
    q2, k2 = rt.fused_rope(q, k, q_pos, k_pos, q_freq, k_inv_freq=k_freq)
    assert_rounded(q2, rotate64(q, q_pos.double()[..., None] * q_freq, False), q, False, 16, torch.float32)
    assert_rounded(k2, rotate64(k, k_pos.double()[..., None] * k_freq, False), k, False, 16, torch.float32)


def test_strided_inputs_are_read_and_written_through_their_strides(rt):
    """q as a (B, T, H, D) projection transposed, k a slice of a fused kv tensor, in place: the
    results land in the base tensors (no copies), equal to the contiguous computation."""
    q, k, q_pos, k_pos = case(torch.bfloat16)
    inv_freq = frequencies(12)
    expected_q, expected_k = rt.fused_rope(q, k, q_pos, k_pos, inv_freq)
    q_base = q.transpose(1, 2).contiguous()  # (B, T, H, D)
    kv_base = torch.cat((k, torch.zeros_like(k)), dim=-1).transpose(1, 2).contiguous()  # (B, T, H_kv, 2D)
    q_view, k_view = q_base.transpose(1, 2), kv_base.transpose(1, 2)[..., :16]
    assert not q_view.is_contiguous() and not k_view.is_contiguous()
    out_q, out_k = rt.fused_rope(q_view, k_view, q_pos, k_pos, inv_freq)
    assert torch.equal(out_q, expected_q) and torch.equal(out_k, expected_k)
    assert out_q.stride() == q_view.stride()  # the result keeps q's memory layout
    rt.fused_rope(q_view, k_view, q_pos, k_pos, inv_freq, inplace=True)
    assert torch.equal(q_base.transpose(1, 2), expected_q)
    assert torch.equal(kv_base.transpose(1, 2)[..., :16], expected_k)
    assert torch.equal(kv_base[..., 16:], torch.zeros_like(kv_base[..., 16:]))  # the neighbours untouched


@pytest.mark.parametrize("rotary_dim", [16, 10], ids=["full", "partial"])
def test_in_place_equals_out_of_place(rt, rotary_dim):
    q, k, q_pos, k_pos = case(torch.float16)
    inv_freq = frequencies(rotary_dim)
    expected_q, expected_k = rt.fused_rope(q, k, q_pos, k_pos, inv_freq, interleaved=True)
    q_in, k_in = q.clone(), k.clone()
    out = rt.fused_rope(q_in, k_in, q_pos, k_pos, inv_freq, interleaved=True, inplace=True)
    assert out[0] is q_in and out[1] is k_in
    assert torch.equal(q_in, expected_q) and torch.equal(k_in, expected_k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("interleaved", [False, True], ids=["half-split", "interleaved"])
def test_backward_is_the_inverse_rotation(rt, dtype, interleaved):
    """Gradients against autograd of the float64 formula: the rotation by -angle of the
    upstream gradient, rounded to the dtype; the tail's gradient passes through."""
    q, k, q_pos, k_pos = case(dtype, seed=7)
    inv_freq, factor = frequencies(10), 0.8
    q.requires_grad_(True)
    k.requires_grad_(True)
    q2, k2 = rt.fused_rope(q, k, q_pos, k_pos, inv_freq, interleaved=interleaved, attention_factor=factor)
    gq, gk = torch.randn_like(q2), torch.randn_like(k2)
    grad_q, grad_k = torch.autograd.grad((q2, k2), (q, k), (gq, gk))
    q64, k64 = q.detach().double().requires_grad_(True), k.detach().double().requires_grad_(True)
    ref_q = rotate64(q64, angles64(q_pos, inv_freq), interleaved, factor)
    ref_k = rotate64(k64, angles64(k_pos, inv_freq), interleaved, factor)
    exp_q, exp_k = torch.autograd.grad((ref_q, ref_k), (q64, k64), (gq.double(), gk.double()))
    assert_rounded(grad_q, exp_q, gq, interleaved, 10, dtype, factor)
    assert_rounded(grad_k, exp_k, gk, interleaved, 10, dtype, factor)


def test_double_backward(rt):
    """create_graph=True: the gradient J^T g is itself differentiable, and its derivative in g
    along w is J w, the forward rotation of w (checked against the float64 formula)."""
    q, k, q_pos, k_pos = case(torch.float64, seed=12)
    inv_freq = frequencies(10)
    q.requires_grad_(True)
    k.requires_grad_(True)
    q2, k2 = rt.fused_rope(q, k, q_pos, k_pos, inv_freq, attention_factor=1.1)
    gq, gk = torch.randn_like(q2, requires_grad=True), torch.randn_like(k2, requires_grad=True)
    grad_q, grad_k = torch.autograd.grad((q2, k2), (q, k), (gq, gk), create_graph=True)
    wq, wk = torch.randn_like(q), torch.randn_like(k)
    jq, jk = torch.autograd.grad((grad_q, grad_k), (gq, gk), (wq, wk))
    torch.testing.assert_close(jq, rotate64(wq, angles64(q_pos, inv_freq), False, 1.1), rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(jk, rotate64(wk, angles64(k_pos, inv_freq), False, 1.1), rtol=1e-13, atol=1e-13)


def test_in_place_under_autograd(rt):
    """inplace=True on non-leaf tensors: autograd records the in-place rotation."""
    q, k, q_pos, k_pos = case(torch.float32, seed=8)
    inv_freq = frequencies(16)
    leaf_q, leaf_k = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
    q_in, k_in = leaf_q * 1.0, leaf_k * 1.0
    rt.fused_rope(q_in, k_in, q_pos, k_pos, inv_freq, inplace=True)
    (q_in.square().sum() + k_in.sum()).backward()
    ref_q, ref_k = rt.fused_rope(q.requires_grad_(True), k.requires_grad_(True), q_pos, k_pos, inv_freq)
    (ref_q.square().sum() + ref_k.sum()).backward()
    torch.testing.assert_close(leaf_q.grad, q.grad, rtol=0, atol=0)
    torch.testing.assert_close(leaf_k.grad, k.grad, rtol=0, atol=0)


def test_empty_and_single_token(rt):
    q, k, _, _ = case(torch.float32)
    inv_freq = frequencies(16)
    q0, k0 = rt.fused_rope(q[:, :, :0], k, torch.zeros(0, dtype=torch.long), torch.arange(7), inv_freq)
    assert q0.shape == (2, 4, 0, 16) and k0.shape == k.shape
    q1, k1 = rt.fused_rope(q[:, :, -1:], k, torch.tensor([1 << 30]), torch.arange(7), inv_freq)  # a decoding step
    assert_rounded(q1, rotate64(q[:, :, -1:], angles64(torch.tensor([1 << 30]), inv_freq), False), q[:, :, -1:], False, 16, torch.float32)


@pytest.mark.parametrize("call, error, words", [
    (lambda q, k, p, f: (q.long(), k, p, p, f), TypeError, "q must be a floating-point"),
    (lambda q, k, p, f: (q[0], k, p, p, f), ValueError, "(B, H, T, D)"),
    (lambda q, k, p, f: (q, k[..., :4], p, p, f), ValueError, "head_dim"),
    (lambda q, k, p, f: (q, k, p.double(), p, f), TypeError, "q_positions must be an integer"),
    (lambda q, k, p, f: (q, k, p[:3], p, f), ValueError, "q_positions must have shape"),
    (lambda q, k, p, f: (q, k, p, p, f.repeat(2)), ValueError, "inv_freq must have shape"),
    (lambda q, k, p, f: (q, k, p, p, f.long()), TypeError, "inv_freq must be a floating-point"),
])
def test_bad_inputs(rt, call, error, words):
    q, k = torch.randn(1, 2, 5, 8), torch.randn(1, 1, 5, 8)
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        rt.fused_rope(*call(q, k, torch.arange(5), frequencies(8)))


def test_bad_pair_axis(rt):
    q, k = torch.randn(1, 2, 5, 8), torch.randn(1, 1, 5, 8)
    positions = torch.zeros(3, 5, dtype=torch.long)
    with pytest.raises(ValueError, match=r"pair_axis values must be in \[0, 3\)"):
        rt.fused_rope(q, k, positions, positions, frequencies(8), pair_axis=torch.tensor([0, 1, 2, 3]))
    with pytest.raises(ValueError, match="pair_axis must have shape"):
        rt.fused_rope(q, k, positions, positions, frequencies(8), pair_axis=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"\(A, T\) or \(A, B, T\)"):
        rt.fused_rope(q, k, torch.arange(5), torch.arange(5), frequencies(8), pair_axis=torch.tensor([0, 1, 2, 0]))


# --- apply_rotary's table kernel --------------------------------------------------------------

@pytest.mark.parametrize("table_shape", ["T,D", "B,1,T,D", "B,H,T,D", "1,D"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["half-split", "interleaved"])
def test_tables_kernel_matches_the_formula(on_cpu, table_shape, interleaved, monkeypatch):
    """posenc.apply_rotary on a kernel device: any broadcast table, every entry read."""
    calls = []
    monkeypatch.setattr(on_cpu, "_tables_kernel", _counting(on_cpu._tables_kernel, calls))
    g = torch.Generator().manual_seed(9)
    B, H, T, D = 2, 3, 5, 8
    x = torch.randn(B, H, T, D, generator=g).to(torch.bfloat16)
    shape = {"T,D": (T, D), "B,1,T,D": (B, 1, T, D), "B,H,T,D": (B, H, T, D), "1,D": (1, D)}[table_shape]
    cos, sin = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    out = posenc.apply_rotary(x, cos, sin, interleaved=interleaved)
    assert calls, "the table kernel did not run"
    x64, c64, s64 = torch.broadcast_tensors(x.double(), cos.double(), sin.double())
    idx = partner_index(D, D, interleaved)
    sign = torch.tensor([-1.0 if (i % 2 == 0 if interleaved else i < D // 2) else 1.0 for i in range(D)], dtype=torch.float64)
    expected = x64 * c64 + sign * x64[..., idx] * s64
    arithmetic = 2 * EPS32 * (x64.abs() * c64.abs() + x64[..., idx].abs() * s64.abs())
    bound = ulp(expected.abs() + arithmetic, torch.bfloat16) / 2 + arithmetic
    assert ((out.double() - expected).abs() <= bound).all()


def test_apply_rotary_out_in_place_backward_and_fallback(on_cpu, monkeypatch):
    g = torch.Generator().manual_seed(10)
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64, generator=g)
    angle = torch.rand(5, 4, dtype=torch.float64, generator=g) * 100
    cos, sin = torch.cat((angle.cos(),) * 2, -1), torch.cat((angle.sin(),) * 2, -1)
    expected = rotate64(x, angle, False)
    y = x.clone()
    assert posenc.apply_rotary(y, cos, sin, out=y) is y
    torch.testing.assert_close(y, expected, rtol=1e-15, atol=1e-15)
    # the gradient (the transposed rotation, through the same kernel) and double backward
    xg = x.clone().requires_grad_(True)
    g_out = torch.randn(x.shape, dtype=torch.float64, generator=g, requires_grad=True)
    (grad,) = torch.autograd.grad(posenc.apply_rotary(xg, cos, sin), xg, g_out, create_graph=True)
    torch.testing.assert_close(grad, rotate64(g_out.detach(), angle, False, inverse=True), rtol=1e-14, atol=1e-14)
    w = torch.randn(x.shape, dtype=torch.float64, generator=g)
    (jw,) = torch.autograd.grad(grad, g_out, w)
    torch.testing.assert_close(jw, rotate64(w, angle, False), rtol=1e-14, atol=1e-14)
    # more than 4 dimensions: the torch path, same values
    calls = []
    monkeypatch.setattr(on_cpu, "_tables_kernel", _counting(on_cpu._tables_kernel, calls))
    x5 = x.unsqueeze(0)
    torch.testing.assert_close(posenc.apply_rotary(x5, cos, sin), expected.unsqueeze(0), rtol=1e-15, atol=1e-15)
    assert not calls


# --- the dispatch: RoPE.rotate and the switch ---------------------------------------------------

def _counting(kernel, calls):
    class Counting:
        def __getitem__(self, grid):
            calls.append(grid)
            return kernel[grid]

    return Counting()


@pytest.mark.parametrize("kwargs", [
    {},
    {"interleaved": True, "rotary_dim": 10},
    {"scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}},
    {"scaling": {"rope_type": "proportional", "partial_rotary_factor": 0.5, "factor": 2.0}},
    {"scaling": {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 16}},
    {"scaling": {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 16}, "dynamic_cache": "frozen"},
], ids=["default", "interleaved-partial", "yarn", "proportional", "dynamic", "dynamic-frozen"])
def test_rope_rotate_uses_the_kernel_on_kernel_devices(on_cpu, monkeypatch, kwargs):
    """RoPE.rotate sends q and k to one launch and agrees with its table path to rounding."""
    rope = posenc.RoPE(16, **kwargs)
    q, k, _, _ = case(torch.bfloat16)
    q_pos, k_pos = torch.arange(40, 45).expand(2, 5), torch.arange(38, 45)
    calls = []
    monkeypatch.setattr(on_cpu, "_rope_qk_kernel", _counting(on_cpu._rope_qk_kernel, calls))
    q2, k2 = rope.rotate(q, k, q_pos, k_pos)
    assert len(calls) == 1, "q and k in one launch"
    monkeypatch.setattr(kernels, "TRITON_ENABLED", False)
    q_ref, k_ref = rope.rotate(q, k, q_pos, k_pos)  # the table path
    assert len(calls) == 1
    # the same fp32 cos/sin and arithmetic up to the order of one product and one sum
    for out, ref in ((q2, q_ref), (k2, k_ref)):
        assert (out.double() - ref.double()).abs().max() <= float(ulp(ref.double().abs().max(), torch.bfloat16))
    # and both are the float64 formula rounded
    seq_len = torch.tensor(45) if rope.length_dependent and rope.dynamic_cache == "rerotate" else None
    expected = rotate64(q, q_pos.double()[..., None] * rope._frequencies(q_pos, seq_len), rope.interleaved, rope.attention_factor)
    assert_rounded(q2, expected, q, rope.interleaved, rope.rotary_dim, torch.bfloat16, rope.attention_factor)


def test_attention_runs_the_kernel_and_matches_the_torch_path(on_cpu, monkeypatch):
    rope = posenc.create("rope", head_dim=16)
    g = torch.Generator().manual_seed(11)
    q, k, v = torch.randn(1, 4, 6, 16, generator=g), torch.randn(1, 2, 6, 16, generator=g), torch.randn(1, 2, 6, 16, generator=g)
    calls = []
    monkeypatch.setattr(on_cpu, "_rope_qk_kernel", _counting(on_cpu._rope_qk_kernel, calls))
    out = posenc.attention(q, k, v, rope, causal=True)
    assert calls
    monkeypatch.setattr(kernels, "TRITON_ENABLED", False)
    torch.testing.assert_close(out, posenc.attention(q, k, v, rope, causal=True), rtol=1e-5, atol=1e-5)


def test_cpu_tensors_keep_the_torch_path_by_default(rt, monkeypatch):
    calls = []
    monkeypatch.setattr(rt, "_rope_qk_kernel", _counting(rt._rope_qk_kernel, calls))
    monkeypatch.setattr(rt, "_tables_kernel", _counting(rt._tables_kernel, calls))
    rope = posenc.create("rope", head_dim=16)
    q, k, q_pos, k_pos = case(torch.float32)
    rope.rotate(q, k, q_pos, k_pos)
    posenc.apply_rotary(q, *rope.cos_sin(k_pos[:5]))
    assert kernels.KERNEL_DEVICES == ("cuda",) and not calls


def test_not_under_torch_compile(on_cpu, monkeypatch):
    """Traced by dynamo, RoPE.rotate takes the plain formula (the compiler fuses it)."""
    calls = []
    monkeypatch.setattr(on_cpu, "_rope_qk_kernel", _counting(on_cpu._rope_qk_kernel, calls))
    rope = posenc.create("rope", head_dim=16)
    q, k, q_pos, k_pos = case(torch.float32)
    compiled = torch.compile(lambda q, k: rope.rotate(q, k, q_pos, k_pos), backend="eager", fullgraph=True)
    q2, _ = compiled(q, k)
    assert not calls
    assert_rounded(q2, rotate64(q, angles64(q_pos, rope._inv_freq_f64), False), q, False, 16, torch.float32)


def test_subclass_overriding_cos_sin_keeps_the_table_path(on_cpu, monkeypatch):
    class Doubled(posenc.RoPE):
        def cos_sin(self, positions, dtype=torch.float32, seq_len=None):
            return super().cos_sin(positions * 2, dtype, seq_len)

    calls = []
    monkeypatch.setattr(on_cpu, "_rope_qk_kernel", _counting(on_cpu._rope_qk_kernel, calls))
    q, k, q_pos, k_pos = case(torch.float32)
    q2, _ = Doubled(16).rotate(q, k, q_pos, k_pos)
    assert not calls
    assert_rounded(q2, rotate64(q, angles64(q_pos * 2, frequencies(16)), False), q, False, 16, torch.float32)


def test_the_environment_switch(monkeypatch):
    monkeypatch.setenv("POSENC_TRITON", "0")
    try:
        assert importlib.reload(kernels).TRITON_ENABLED is False
        monkeypatch.setenv("POSENC_TRITON", "1")
        assert importlib.reload(kernels).TRITON_ENABLED is True
    finally:
        monkeypatch.delenv("POSENC_TRITON")
        importlib.reload(kernels)
    assert not kernels.use_triton(torch.zeros(1))  # CPU tensors: never, by default


def test_the_benchmark_times_the_kernel(on_cpu):
    """The accelerator benchmark lists the fused kernel where it runs, checked against float64."""
    from posenc.lab import bench

    rows, _ = bench.rope_device_benchmark("cpu", lengths=(8,), q_heads=2, kv_heads=1, head_dim=8, repeats=1, compile_peers=False)
    fused = [row for row in rows if row["method"].startswith("posenc fused_rope")]
    assert {row["mode"] for row in fused} == {"forward", "forward+backward"}
    assert fused[0]["max_err"] < 0.05


@pytest.mark.parametrize("mrope_interleaved", [False, True], ids=["sections", "interleaved-sections"])
def test_mrope_encoding_angles_are_the_pair_axis_path(rt, mrope_interleaved):
    """posenc's MRoPE (Qwen2-VL's sections, or Qwen3-VL's interleaved T H W): its rotation is
    the fused kernel with pair_axis = its axis of each pair, positions (3, B, T) as given, its
    float64 inv_freq and attention factor; how MRoPE.rotate can hand its calls to the kernel."""
    mrope = posenc.create("mrope", head_dim=16, rotary_dim=12, mrope_section=[2, 2, 2], mrope_interleaved=mrope_interleaved,
                          scaling={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64})
    q, k, _, _ = case(torch.bfloat16)
    g = torch.Generator().manual_seed(13)
    q_pos = torch.randint(0, 4000, (3, 2, q.shape[2]), generator=g)
    k_pos = torch.randint(0, 4000, (3, 1, k.shape[2]), generator=g)
    expected_q, expected_k = mrope.rotate(q, k, q_pos, k_pos)  # its own table path
    assert mrope._phase_f64 is None
    q2, k2 = rt.fused_rope(q, k, q_pos, k_pos, mrope._inv_freq_f64, pair_axis=mrope._axis_of_pair,
                           interleaved=mrope.interleaved, attention_factor=mrope.attention_factor)
    for out, ref in ((q2, expected_q), (k2, expected_k)):  # the same fp32 numbers up to one product-sum order
        assert (out.double() - ref.double()).abs().max() <= float(ulp(ref.double().abs().max(), torch.bfloat16))
    angle = angles64(q_pos, mrope._inv_freq_f64, mrope._axis_of_pair)
    assert_rounded(q2, rotate64(q, angle, False, mrope.attention_factor), q, False, 12, torch.bfloat16, mrope.attention_factor)
