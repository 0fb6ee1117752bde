"""The fused attention kernel with the bias inside (posenc.attention.bias_attention_triton, the
"triton" backend) under Triton's interpreter, on CPU tensors.

Every case runs the kernel and posenc's eager backend in float64 on the same inputs, and the
eager backend in the kernel's dtype: the kernel's error against float64 (output, and the
gradients of q, k, v and of every bias parameter) must stay within a few times the eager
backend's own error in that dtype (the reference's noise, which grows with the length and the
bias), plus a floor of a few ulps of the dtype. A wrong bias (a slope 1% off, a position off by
one) fails the same check. Skipped without triton (``pip install posenc[gpu]``).
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import interpreted_module, slow_unless

pytest.importorskip("triton")

import posenc
from posenc.attention import fused_triton
from posenc.errors import InvalidArgument

H, D = 4, 16


@pytest.fixture(scope="module")
def kernel():
    """The kernel module built for the interpreter; the environment restored afterwards."""
    yield from interpreted_module("posenc.attention.bias_attention_triton")


@pytest.fixture
def on_cpu(kernel, monkeypatch):
    """Let the "triton" backend take CPU tensors (the interpreter runs them)."""
    monkeypatch.setattr(fused_triton, "DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(fused_triton, "_module", kernel)
    return kernel


def _encoding(name: str, causal: bool, head_dim: int = D):
    """The encoding with its learned numbers drawn large enough to matter; ALiBi's slopes made
    trainable (a Parameter), as a user training them would."""
    torch.manual_seed(1)
    if name == "none":
        return None
    if name == "alibi":
        enc = posenc.create("alibi", num_heads=H, bidirectional=not causal)
        enc.slopes = torch.nn.Parameter(enc.slopes.clone() * 4)
        return enc
    if name in ("kerple_log", "kerple_power"):
        return posenc.create("kerple", num_heads=H, variant=name.split("_")[1])
    if name == "t5":
        enc = posenc.create("t5", num_heads=H, bidirectional=not causal, max_distance=16, num_buckets=8)
        with torch.no_grad():
            enc.relative_attention_bias.weight.normal_()
        return enc
    if name == "fox":
        enc = posenc.create("fox", d_model=32, num_heads=H)
        with torch.no_grad():
            enc.fgate_proj.weight.normal_(0, 0.3)
            enc.fgate_proj.bias.fill_(1.0)
        return enc
    if name == "fire":  # L = 16: queries on both sides of the threshold
        enc = posenc.create("fire", num_heads=H, mlp_width=8, init_L=16.0)
        with torch.no_grad():
            for p in enc.mlp.parameters():
                p.normal_(0, 1.0)
            enc.c.fill_(0.3)
        return enc
    if name == "rope":
        return posenc.create("rope", head_dim=head_dim)
    raise AssertionError(name)


def _positions(kind: str, tq: int, tk: int):
    if kind == "default":
        return None, None
    if kind == "offset":  # a KV-cache step far along: positions start at 1000
        return torch.arange(1000 + tk - tq, 1000 + tk), torch.arange(1000, 1000 + tk)
    starts = torch.tensor([[0], [7]])  # per row (B, T): left padding of 7
    return (starts + torch.arange(tk - tq, tk)).clamp(min=0), (starts + torch.arange(tk)).clamp(min=0)


def _run(enc, backend: str, dtype, q0, k0, v0, x, *, causal, qp, kp, grad, mask=None):
    """Output and gradients (q, k, v, then every parameter of the encoding, then FoX's gates)."""
    enc = copy.deepcopy(enc)
    if enc is not None:
        enc = enc.to(device=q0.device, dtype=torch.float64 if dtype == torch.float64 else torch.float32)
    q, k, v = (t.to(dtype).detach().requires_grad_() for t in (q0, k0, v0))
    extras = {}
    gates = None
    if enc is not None and "gate" in enc.hooks:
        gates = enc.gate(x.to(dtype if dtype == torch.float64 else torch.float32))
        gates.retain_grad()
        extras["gates"] = gates
    out = posenc.attention(q, k, v, enc, causal=causal, q_positions=qp, k_positions=kp, backend=backend, mask=mask,
                           **extras)
    out.backward(grad.to(out.dtype))
    params = [p.grad for p in enc.parameters()] if enc is not None else []
    return [out, q.grad, k.grad, v.grad, *params, *([gates.grad] if gates is not None else [])]


def _check(name, *, causal=True, groups=1, positions="default", dtype=torch.float32, tq=21, tk=21, wrong=None,
           device="cpu", head_dim=D):
    """None when the kernel is within the reference's noise of float64 on every tensor, else
    what is not."""
    enc = _encoding(name, causal, head_dim)
    g = torch.Generator().manual_seed(2)
    batch = 2 if positions == "rows" else 1  # one row is enough but for per-row positions
    q0 = torch.randn(batch, H, tq, head_dim, generator=g, dtype=torch.float64)
    k0, v0 = (torch.randn(batch, H // groups, tk, head_dim, generator=g, dtype=torch.float64) for _ in range(2))
    x = torch.randn(batch, tk, 32, generator=g, dtype=torch.float64)
    # inputs rounded to the kernel's dtype first, so that every run sees the same numbers
    q0, k0, v0 = (t.to(dtype).double().to(device) for t in (q0, k0, v0))
    x = x.to(device)
    grad = torch.randn(batch, H, tq, head_dim, generator=g, dtype=torch.float64).to(dtype).double().to(device)
    qp, kp = (None if p is None else p.to(device) for p in _positions(positions, tq, tk))
    args = {"causal": causal, "qp": qp, "kp": kp, "grad": grad}
    exact = _run(enc, "eager", torch.float64, q0, k0, v0, x, **args)
    reference = _run(enc, "eager", dtype, q0, k0, v0, x, **args)
    kernel_enc = enc if wrong is None else wrong(copy.deepcopy(enc))
    fused = _run(kernel_enc, "triton", dtype, q0, k0, v0, x, **args)
    assert len(fused) == len(exact)
    ulp = torch.finfo(dtype).eps
    # a parameter's gradient is a sum over every score: one that cancels to zero (FIRE's output
    # bias b2, a constant per head, which the softmax ignores) is held to the rounding of the
    # parameter gradients' own scale, not of its (zero) value
    parameter_scale = max((t.abs().max().item() for t in exact[4:]), default=0.0)
    for i, (got, ref, want) in enumerate(zip(fused, reference, exact, strict=True)):
        noise = (ref.double() - want).abs().max().item()
        error = (got.double() - want).abs().max().item()
        scale = want.abs().max().item() if i < 4 else max(want.abs().max().item(), parameter_scale)
        allowed = 4 * noise + 8 * ulp * scale
        if error > allowed:
            return f"tensor {i}: error {error:.2e} > allowed {allowed:.2e} (eager's own {noise:.2e})"
    return None


CASES = [
    # (encoding, causal, groups, positions, dtype, in the default run?): each form once by default
    ("alibi", False, 2, "rows", torch.float32, True),
    ("kerple_log", True, 2, "offset", torch.float32, True),
    ("kerple_power", True, 1, "rows", torch.float32, True),
    ("t5", False, 2, "offset", torch.float32, True),
    ("fox", True, 2, "default", torch.float32, True),
    ("fire", True, 2, "default", torch.float32, True),
    ("alibi", True, 2, "default", torch.bfloat16, True),
    ("t5", True, 1, "offset", torch.float16, True),
    ("none", True, 1, "default", torch.float32, False),
    ("rope", True, 2, "offset", torch.float32, False),
    ("alibi", True, 1, "default", torch.float32, False),
    ("t5", True, 1, "default", torch.float32, False),
    ("fire", False, 1, "offset", torch.float32, False),
]
SLOW_CASES = [
    (name, causal, groups, positions, dtype)
    for name in ("none", "alibi", "kerple_log", "kerple_power", "t5", "fox", "fire")
    for causal in (True, False) if not (name == "fox" and not causal)
    for groups in (1, 4) for positions in ("default", "offset", "rows")
    for dtype in (torch.float32, torch.bfloat16)
]


@pytest.mark.parametrize("case", [slow_unless(c[5], c[:5], id=f"{c[0]}-{'causal' if c[1] else 'bidir'}-g{c[2]}-{c[3]}-{str(c[4])[6:]}")
                                  for c in CASES]
                         + [slow_unless(False, c, id=f"all-{c[0]}-{'causal' if c[1] else 'bidir'}-g{c[2]}-{c[3]}-{str(c[4])[6:]}")
                            for c in SLOW_CASES])
def test_matches_float64_within_the_references_noise(on_cpu, case):
    name, causal, groups, positions, dtype = case
    tq = 5 if positions == "offset" else 21
    assert _check(name, causal=causal, groups=groups, positions=positions, dtype=dtype, tq=tq) is None


def _scaled_slopes(enc):
    with torch.no_grad():
        enc.slopes.mul_(1.01)
    return enc


def _shifted_kerple(enc):
    with torch.no_grad():
        enc.bias_a.mul_(1.02)
    return enc


def _other_bucket_table(enc):
    with torch.no_grad():
        enc.relative_attention_bias.weight[3] += 0.05
    return enc


def _other_fire_threshold(enc):
    with torch.no_grad():
        enc.L_multiplier.mul_(1.25)  # L = 20 instead of 16
    return enc


@pytest.mark.parametrize("name,wrong", [slow_unless(True, "alibi", _scaled_slopes), slow_unless(False, "kerple_log", _shifted_kerple),
                                        slow_unless(False, "t5", _other_bucket_table), slow_unless(True, "fire", _other_fire_threshold)])
def test_the_check_sees_a_slightly_wrong_bias(on_cpu, name, wrong):
    assert _check(name, wrong=wrong) is not None


def test_a_key_one_position_off_is_seen(on_cpu, kernel):
    """The kernel reads the positions it is given: one key moved by one changes the output."""
    enc = _encoding("alibi", True)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, H, 20, D, generator=g) for _ in range(3))
    pos = torch.arange(20)
    moved = pos.clone()
    moved[3] += 1
    a = posenc.attention(q, k, v, enc, backend="triton", k_positions=pos)
    b = posenc.attention(q, k, v, enc, backend="triton", k_positions=moved)
    assert (a - b).abs().max() > 1e-3


@pytest.mark.parametrize("call,match", [
    (lambda q: posenc.attention(q, q, q, posenc.create("cope", head_dim=D, npos_max=8), backend="triton"), "content terms"),
    (lambda q: posenc.attention(q, q, q, None, backend="triton", mask=torch.ones(7, 7, dtype=torch.bool)), "mask="),
    (lambda q: posenc.attention(q.double(), q.double(), q.double(), None, backend="triton"), "float32, bfloat16 or float16"),
    (lambda q: posenc.attention(q, q, q, posenc.create("shaw", head_dim=D), backend="triton"), "content terms"),
    (lambda q: posenc.attention(q, q, q, None, backend="triton", dropout_p=0.1), "dropout"),
])
def test_what_it_does_not_serve_is_refused_by_name(on_cpu, call, match):
    with pytest.raises(InvalidArgument, match=match):
        call(torch.randn(1, H, 7, D))


def test_bidirectional_fox_is_refused(on_cpu):
    fox = posenc.create("fox", d_model=32, num_heads=H)
    q = torch.randn(1, H, 7, D)
    with pytest.raises(InvalidArgument, match="no fused form for this call"):
        posenc.attention(q, q, q, fox, backend="triton", causal=False, gates=fox.gate(torch.randn(1, 7, 32)))


def test_cpu_tensors_are_refused_outside_the_interpreter_rule(kernel):
    q = torch.randn(1, H, 7, D)
    with pytest.raises(InvalidArgument, match="runs on CUDA tensors"):
        posenc.attention(q, q, q, None, backend="triton")


@pytest.mark.parametrize("name", [slow_unless(True, "t5"), slow_unless(False, "fox")])
def test_packed_rows_with_a_document_mask(on_cpu, name):
    """Two rows, each three documents packed, positions restarting per document: the kernel
    compares the document ids per tile; equal to eager in float64 within its float32 noise,
    gradients included; and a query of a document sees nothing of the others."""
    from posenc.masks import document_mask_mod, positions_from_document_ids

    ids = torch.tensor([[0] * 9 + [1] * 14 + [2] * 10, [0] * 20 + [1] * 3 + [2] * 10])
    positions = positions_from_document_ids(ids)
    mask = document_mask_mod(ids)
    enc = _encoding(name, True)
    g = torch.Generator().manual_seed(5)
    q0, k0, v0 = (torch.randn(2, H, 33, D, generator=g, dtype=torch.float64) for _ in range(3))
    x = torch.randn(2, 33, 32, generator=g, dtype=torch.float64)
    grad = torch.randn(2, H, 33, D, generator=g, dtype=torch.float64)
    args = {"causal": True, "qp": positions, "kp": positions, "grad": grad, "mask": mask}
    results = {(backend, dtype): _run(enc, backend, dtype, q0, k0, v0, x, **args)
               for backend, dtype in (("eager", torch.float64), ("eager", torch.float32), ("triton", torch.float32))}
    for got, ref, want in zip(results["triton", torch.float32], results["eager", torch.float32],
                              results["eager", torch.float64], strict=True):
        noise = (ref.double() - want).abs().max().item()
        assert (got.double() - want).abs().max().item() <= 4 * noise + 8 * torch.finfo(torch.float32).eps * want.abs().max().item()
    # the second document's first query sees only itself: its output is its own value
    out = results["triton", torch.float32][0]
    assert torch.allclose(out[0, :, 9], v0[0, :, 9].float(), atol=1e-6)


def test_the_kernel_knows_every_form_an_encoding_can_state(kernel):
    from posenc.kernels.fused_bias import FORMS

    assert set(kernel.KINDS) == set(FORMS)
