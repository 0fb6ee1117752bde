"""The fused CPU attention of Shaw and Transformer-XL (posenc.kernels.relpos_cpu): outputs and
gradients against the attention formula written out in float64 (Shaw et al. 2018, eqs. 3-5;
Dai et al. 2019, A^rel), gradcheck in float64, and the encodings through ``posenc.attention``
with the kernel on against their hooks' path. Built once per module; skips where no compiler
builds it."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc import kernels
from posenc.kernels import relpos_cpu

pytestmark = pytest.mark.usefixtures("relpos_built")


@pytest.fixture
def kernel_calls(relpos_kernel_calls):
    return relpos_kernel_calls


def formula64(q, k, v, key_table, query_bias, key_bias, value_table, bias_table, gate_hi, gate_lo, x_table, x_den,
              bends, slopes, intercepts, offset, causal, scale):
    """softmax(scale (q_i.k_j + (q_i + a).E[r] + u.k_j) + B[h, r] + c_i' - c_j + f_h(N[r] / den_i) + mask)
    @ (v_j + F[r]) in float64, with an explicit loop over the (i, j) pairs for r = clamp(j - i +
    offset, 0, R - 1), c = hi + lo, i' = i + Tk - Tq (the query's own key), f_h(x) = slopes[h, s] x +
    intercepts[h, s] with s the number of bends <= x (counted one by one)."""
    q, k, v = q.double(), k.double(), v.double()
    batch, heads, num_queries, _ = q.shape
    num_keys = k.shape[2]
    width = next((t.shape[-2] for t in (key_table, value_table) if t is not None), None)
    width = width or next((t.shape[-1] for t in (bias_table, x_table) if t is not None), 1)
    logits = torch.zeros(batch, heads, num_queries, num_keys, dtype=torch.float64)
    extra = [[None] * num_keys for _ in range(num_queries)]
    for i in range(num_queries):
        for j in range(num_keys):
            r = max(0, min(width - 1, j - i + offset))
            z = (q[:, :, i] * k[:, :, j]).sum(-1)
            if key_table is not None:
                table = key_table.double()
                row = table[:, r] if table.dim() == 3 else table[r]
                qa = q[:, :, i] + (query_bias.double() if query_bias is not None else 0)
                z = z + (qa * row).sum(-1)
            if key_bias is not None:
                z = z + (k[:, :, j] * key_bias.double()).sum(-1)
            logits[:, :, i, j] = z * scale
            if bias_table is not None:
                logits[:, :, i, j] += bias_table.double()[:, r]
            own = i + num_keys - num_queries
            if gate_hi is not None and 0 <= own < num_keys:
                c = gate_hi.double() + gate_lo.double()
                logits[:, :, i, j] += c[:, :, own] - c[:, :, j]
            if x_table is not None:
                x = x_table.double()[r] / x_den.double()[i]
                segment = sum(1 for b in bends.tolist() if b <= float(x.detach()))
                logits[:, :, i, j] += slopes.double()[:, segment] * x + intercepts.double()[:, segment]
            extra[i][j] = value_table.double()[r] if value_table is not None else None
    if causal:
        hidden = torch.arange(num_keys)[None, :] > torch.arange(num_queries)[:, None] + num_keys - num_queries
        logits = logits.masked_fill(hidden, float("-inf"))
    probs = torch.softmax(logits, dim=-1).nan_to_num()  # a row without keys: zeros
    out = probs @ v
    if value_table is not None:
        for i in range(num_queries):
            for j in range(num_keys):
                out[:, :, i] = out[:, :, i] + probs[:, :, i, j, None] * extra[i][j]
    return out


def inputs(kind, batch, heads, num_queries, num_keys, dim, width, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)

    def make(*shape, grad=True):
        return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_(grad)

    q, k, v = make(batch, heads, num_queries, dim), make(batch, heads, num_keys, dim), make(batch, heads, num_keys, dim)
    tables = {}
    if kind in ("shaw", "all"):
        tables.update(key_table=make(width, dim), value_table=make(width, dim))
    if kind in ("txl", "all"):
        tables.update(query_bias=make(heads, dim), key_bias=make(heads, dim))
    if kind == "txl":
        tables["key_table"] = make(heads, width, dim)
    if kind in ("bias", "all"):
        tables["bias_table"] = make(heads, width)
    if kind in ("piecewise", "all"):
        # FIRE's normalized distance: N >= 0 per table row, den > 0 per query, bends inside N / den's range
        tables["x_table"] = (2 * torch.rand(width, generator=g, dtype=dtype)).requires_grad_()
        tables["x_den"] = (1 + torch.rand(num_queries, generator=g, dtype=dtype)).requires_grad_()
        tables["bends"] = torch.sort(2 * torch.rand(3, generator=g, dtype=dtype)).values
        tables.update(slopes=make(heads, 4), intercepts=make(heads, 4))
    if kind in ("gate", "all"):
        # FoX's cumulative log gates (decreasing) and a low part of their rounding's size
        tables["gate_hi"] = (-make(batch, heads, num_keys, grad=False).abs().cumsum(-1)).requires_grad_()
        tables["gate_lo"] = make(batch, heads, num_keys, grad=False) * 1e-7
    return q, k, v, tables


NAMES = relpos_cpu.TABLE_NAMES


CASES = [
    # kind, B, H, Tq, Tk, D, R, offset, causal
    ("shaw", 2, 4, 40, 40, 16, 33, 16, True),   # the LM's layout: clipped both ways, whole vectors
    ("shaw", 2, 3, 5, 9, 4, 5, 6, True),        # a cache before the queries; D off the vector width
    ("shaw", 1, 2, 7, 5, 5, 7, -2, False),      # bidirectional, more queries than keys
    ("txl", 2, 2, 20, 20, 16, 21, 19, True),    # Tk + 1 distances (causal)
    ("txl", 1, 2, 6, 9, 32, 14, 5, False),      # Tq + Tk - 1 distances
    ("all", 2, 2, 17, 17, 16, 9, 4, True),      # every table at once
    ("shaw", 1, 2, 6, 3, 16, 5, 2, True),       # Tq > Tk: the first rows see no key
    ("bias", 2, 3, 20, 20, 16, 13, 6, True),    # T5: a bias per head and clipped distance
    ("bias", 1, 2, 5, 9, 8, 13, 8, False),      # every distance (Tq + Tk - 1), bidirectional
    ("gate", 2, 2, 19, 19, 16, 1, 0, True),     # FoX
    ("gate", 1, 3, 4, 11, 16, 1, 0, True),      # FoX after a cache: the query's own key is i + 7
    ("piecewise", 2, 3, 20, 20, 16, 39, 19, True),  # FIRE: every distance, a normalizer per query
    ("piecewise", 1, 2, 7, 12, 8, 9, 4, False),     # clipped both ways, bidirectional
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kind, batch, heads, nq, nk, dim, width, offset, causal", CASES)
def test_outputs_and_gradients_match_the_float64_formula(dtype, kind, batch, heads, nq, nk, dim, width, offset,
                                                         causal):
    q, k, v, tables = inputs(kind, batch, heads, nq, nk, dim, width, dtype)
    scale = 0.3
    out = relpos_cpu.attention(q, k, v, **tables, offset=offset, causal=causal, scale=scale)
    ref = formula64(q, k, v, *(tables.get(n) for n in NAMES), offset, causal, scale)
    tol = {"atol": 1e-10, "rtol": 1e-10} if dtype == torch.float64 else {"atol": 2e-5, "rtol": 2e-5}
    torch.testing.assert_close(out.double(), ref, **tol)
    grad = torch.randn(ref.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    leaves = [q, k, v, *(t for t in tables.values() if t.requires_grad)]
    got = torch.autograd.grad(out, leaves, grad.to(dtype))
    want = torch.autograd.grad(ref, leaves, grad)
    for g_kernel, g_ref in zip(got, want):
        torch.testing.assert_close(g_kernel.double(), g_ref.double(), **tol)


def dense64(q, k, v, key_table, query_bias, key_bias, value_table, bias_table, gate_hi, gate_lo, x_table, x_den, bends,
            slopes, intercepts, offset, causal, scale):
    """:func:`formula64` with whole-tensor operations (for lengths its loop is too slow at); every
    table present, E (R, D) or (H, R, D)."""
    q, k, v, e, a, u, f, bias, hi, lo = (t.double() for t in (q, k, v, key_table, query_bias, key_bias, value_table,
                                                              bias_table, gate_hi, gate_lo))
    tq, tk = q.shape[2], k.shape[2]
    r = (torch.arange(tk) - torch.arange(tq).unsqueeze(-1) + offset).clamp(0, e.shape[-2] - 1)  # (Tq, Tk)
    rows = e[r] if e.dim() == 2 else e[:, r]  # (Tq, Tk, D) or (H, Tq, Tk, D)
    logits = q @ k.transpose(-2, -1) + ((q + a[:, None]).unsqueeze(-2) * rows).sum(-1) + (k * u[:, None]).sum(-1)[:, :, None]
    c = hi + lo
    own = (torch.arange(tq) + tk - tq).clamp(0, tk - 1)
    logits = scale * logits + bias[:, r] + c[..., own, None] - c[..., None, :]
    x = x_table.double()[r] / x_den.double()[:, None]
    segment = torch.searchsorted(bends.double(), x, right=True)
    logits = logits + slopes.double()[:, segment] * x + intercepts.double()[:, segment]
    if causal:
        logits = logits.masked_fill(torch.arange(tk) > torch.arange(tq).unsqueeze(-1) + tk - tq, float("-inf"))
    p = torch.softmax(logits, -1).nan_to_num()
    return p @ v + (p.unsqueeze(-1) * f[r]).sum(-2)


def test_the_dense_formula_is_the_loop_formula():
    q, k, v, tables = inputs("all", 2, 2, 9, 11, 8, 7, torch.float64, seed=4)
    args = [tables[n] for n in NAMES]
    torch.testing.assert_close(dense64(q, k, v, *args, 5, True, 0.3), formula64(q, k, v, *args, 5, True, 0.3),
                               atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("nq, nk, width, offset, causal", [(300, 300, 41, 20, True), (260, 400, 60, 150, True),
                                                          (131, 140, 300, 130, False)])
def test_several_blocks_of_query_rows(dtype, nq, nk, width, offset, causal):
    """More query rows than one block of the kernel (128): the blocks' shares of dk, dv and the
    tables' gradients add up; a cache before the queries; a block past the last row's keys."""
    q, k, v, tables = inputs("all", 1, 2, nq, nk, 16, width, dtype, seed=5)
    assert nq > relpos_cpu_block()
    out = relpos_cpu.attention(q, k, v, **tables, offset=offset, causal=causal, scale=0.25)
    ref = dense64(q, k, v, *(tables[n] for n in NAMES), offset, causal, 0.25)
    tol = {"atol": 1e-10, "rtol": 1e-10} if dtype == torch.float64 else {"atol": 3e-5, "rtol": 3e-5}
    torch.testing.assert_close(out.double(), ref, **tol)
    grad = torch.randn(ref.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    leaves = [q, k, v, *(t for t in tables.values() if t.requires_grad)]
    for got, want in zip(torch.autograd.grad(out, leaves, grad.to(dtype)), torch.autograd.grad(ref, leaves, grad)):
        size = max(float(want.abs().max()), 1.0)
        torch.testing.assert_close(got.double(), want.double(), atol=tol["atol"] * size, rtol=tol["rtol"])


def relpos_cpu_block() -> int:
    """The kernel's block of query rows (``Kernel::BLOCK`` in relpos_cpu.cpp)."""
    import re

    return int(re.search(r"BLOCK = (\d+);", relpos_cpu.SOURCE.read_text()).group(1))


@pytest.mark.parametrize("kind", ["shaw", "txl", "bias", "gate", "piecewise", "all"])
def test_gradcheck(kind):
    q, k, v, tables = inputs(kind, 2, 2, 5, 6, 4, 6, torch.float64, seed=3)
    names = list(tables)

    def fn(q, k, v, *values):
        return relpos_cpu.attention(q, k, v, **dict(zip(names, values)), offset=3, causal=True, scale=0.5)

    assert torch.autograd.gradcheck(fn, (q, k, v, *tables.values()))


@pytest.mark.parametrize("wrong", ["bias rows reversed", "gate sign", "pieces one segment off", "den rows reversed"])
def test_the_formula_check_fails_on_a_wrong_term(wrong):
    """The comparison above can fail: a bias table read the other way round, the gate's sign
    flipped, each segment given its neighbour's slope and intercept, or the normalizers of the
    queries reversed, are far off. (The query's own gate c_i' is constant along its row: the
    softmax cancels it, and only the float64 gradients above check it.)"""
    kind = wrong.split()[0] if wrong.startswith(("bias", "gate")) else "piecewise"
    q, k, v, tables = inputs(kind, 1, 2, 4, 11, 16, 13, torch.float64)
    out = relpos_cpu.attention(q, k, v, **tables, offset=8, causal=True, scale=0.3)
    args = [tables.get(n) for n in NAMES]
    if wrong == "bias rows reversed":
        args[4] = args[4].flip(-1)
    elif wrong == "gate sign":
        args[5], args[6] = -args[5], -args[6]
    elif wrong == "pieces one segment off":
        args[10], args[11] = args[10].roll(1, -1), args[11].roll(1, -1)
    else:
        args[8] = args[8].flip(0)
    assert (out - formula64(q, k, v, *args, 8, True, 0.3)).abs().max() > 1e-2


def strided_qkv(batch, heads, length, dim, seed):
    """q, k, v as the LM makes them: transposed views of one (B, T, 3 H D) projection."""
    x = torch.randn(batch, length, 3 * heads * dim, generator=torch.Generator().manual_seed(seed)).requires_grad_()
    return x, [t.view(batch, length, heads, dim).transpose(1, 2) for t in x.split(heads * dim, -1)]


@pytest.mark.parametrize("name, options", [
    ("shaw", {"head_dim": 16, "max_relative_position": 5}),
    ("transformer_xl", {"d_model": 32, "num_heads": 4, "head_dim": 16}),
])
@pytest.mark.parametrize("causal, q_positions, k_positions", [
    (True, None, None),
    (False, None, None),
    (True, torch.arange(100, 124), torch.arange(100, 124)),  # consecutive, not from 0
])
def test_encodings_through_attention_match_their_hooks(name, options, causal, q_positions, k_positions, kernel_calls):
    """posenc.attention (eager) with the kernel against the same encoding's hooks path in float64."""
    torch.manual_seed(0)
    enc = posenc.create(name, **options)
    enc64 = posenc.create(name, **options).double()
    enc64.load_state_dict({key: value.double() for key, value in enc.state_dict().items()})
    x, (q, k, v) = strided_qkv(2, 4, 24, 16, seed=1)
    out = posenc.attention(q, k, v, enc, causal=causal, q_positions=q_positions, k_positions=k_positions,
                           backend="eager")
    assert kernel_calls, "the kernel did not serve the call"
    x64 = x.detach().double().requires_grad_()
    q64, k64, v64 = (t.view(2, 24, 4, 16).transpose(1, 2) for t in x64.split(64, -1))
    enabled, kernels.CPU_KERNEL_ENABLED = kernels.CPU_KERNEL_ENABLED, False
    try:
        ref = posenc.attention(q64, k64, v64, enc64, causal=causal, q_positions=q_positions, k_positions=k_positions,
                               backend="eager")
    finally:
        kernels.CPU_KERNEL_ENABLED = enabled
    assert len(kernel_calls) == 1
    torch.testing.assert_close(out.double(), ref, atol=2e-5, rtol=2e-5)
    grad = torch.randn(ref.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    got = torch.autograd.grad(out, [x, *enc.parameters()], grad.float())
    want = torch.autograd.grad(ref, [x64, *enc64.parameters()], grad)
    for g_kernel, g_ref in zip(got, want):
        torch.testing.assert_close(g_kernel.double(), g_ref, atol=5e-5, rtol=5e-5)


@pytest.mark.parametrize("case", ["mask", "packed positions", "gap in positions", "bfloat16", "float64", "switched off"])
def test_calls_the_kernel_does_not_cover_take_the_hooks(case, kernel_calls):
    """content_attention returns None and the eager backend computes the hooks' terms itself."""
    torch.manual_seed(0)
    enc = posenc.create("shaw", head_dim=8, max_relative_position=3)
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 2, 6, 8, generator=g) for _ in range(3))
    kwargs = {"backend": "eager"}
    if case == "mask":
        kwargs["mask"] = torch.rand(2, 1, 6, 6, generator=g) > 0.3
    elif case == "packed positions":
        kwargs["q_positions"] = kwargs["k_positions"] = torch.tensor([[0, 1, 2, 0, 1, 2], [0, 1, 2, 3, 4, 5]])
    elif case == "gap in positions":
        kwargs["q_positions"] = kwargs["k_positions"] = torch.tensor([0, 1, 2, 5, 6, 7])
    elif case == "bfloat16":
        q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
    elif case == "float64":  # the reference dtype keeps the hooks (exact ops, second derivatives)
        q, k, v, enc = q.double(), k.double(), v.double(), enc.double()
    enabled = kernels.CPU_KERNEL_ENABLED
    kernels.CPU_KERNEL_ENABLED = case != "switched off"
    try:
        out = posenc.attention(q, k, v, enc, **kwargs)
    finally:
        kernels.CPU_KERNEL_ENABLED = enabled
    assert not kernel_calls
    assert out.shape == (2, 2, 6, 8) and torch.isfinite(out.float()).all()


def test_not_used_under_compile(monkeypatch):
    """Under torch.compile the encodings keep their torch path (the kernel is not a torch op)."""
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    q = torch.randn(1, 1, 4, 8)
    assert not relpos_cpu.usable(q, q, q)


def test_backward_of_the_backward_is_refused(kernel_calls):
    """The kernel's backward has no derivative: a second derivative raises instead of being wrong."""
    enc = posenc.create("shaw", head_dim=16)
    _, (q, k, v) = strided_qkv(1, 2, 8, 16, seed=5)
    out = posenc.attention(q, k, v, enc, backend="eager")
    assert kernel_calls
    (grad_q,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)
    with pytest.raises(RuntimeError):
        grad_q.sum().backward()


def test_several_threads_give_the_one_thread_result():
    """With several torch threads a large call is split across (b, h) slices, each thread adding
    the tables' gradients into its own buffer: the same numbers as one thread."""
    q, k, v, tables = inputs("all", 16, 4, 64, 64, 16, 33, torch.float32, seed=6)
    assert 16 * 4 * 64 * 64 >= relpos_cpu._PARALLEL_MIN_ENTRIES
    grad = torch.randn(16, 4, 64, 16, generator=torch.Generator().manual_seed(7))
    leaves = [q, k, v, *(t for t in tables.values() if t.requires_grad)]
    results = []
    threads = torch.get_num_threads()
    for n in (1, 3):
        torch.set_num_threads(n)
        try:
            out = relpos_cpu.attention(q, k, v, **tables, offset=16, causal=True, scale=0.25)
            results.append((out, torch.autograd.grad(out, leaves, grad)))
        finally:
            torch.set_num_threads(threads)
    (out1, grads1), (out3, grads3) = results
    torch.testing.assert_close(out3, out1, atol=0, rtol=0)
    for g3, g1 in zip(grads3, grads1):
        # the tables' gradients: the slices' sums added in another order (float32 rounding)
        torch.testing.assert_close(g3, g1, atol=1e-6 * float(g1.abs().max()), rtol=1e-5)


@pytest.mark.parametrize("rising", [True, False])
def test_an_x_on_a_bend_takes_the_slope_where_its_unit_is_off(rising):
    """relu'(0) = 0, as torch's: an x equal to a bend (as rounded) is on the side where the bend's
    unit is off, below a rising unit's bend (w1 > 0), above a falling one's. Every other table
    row's x sits exactly on the bend; its gradient (through f' there) against the float64
    formula with that rule."""
    from posenc.kernels.relpos_cpu import _kernel_bends

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 8, generator=g) for _ in range(3))
    x_table = torch.rand(11, generator=g)
    x_table[::2] = 0.5
    x_table.requires_grad_()
    bends = _kernel_bends(torch.tensor([0.5], dtype=torch.float64), torch.tensor([rising]), torch.float32)
    slopes, intercepts = torch.tensor([[1.0, -2.0], [0.5, 3.0]]), torch.tensor([[0.0, 1.5], [0.0, -1.25]])
    out = relpos_cpu.attention(q, k, v, x_table=x_table, x_den=torch.ones(6), bends=bends, slopes=slopes,
                               intercepts=intercepts, offset=5, causal=True, scale=0.3)
    grad = torch.randn(out.shape, generator=g)
    got = torch.autograd.grad(out, x_table, grad)[0]

    x64 = x_table.detach().double().requires_grad_()
    x = x64[(torch.arange(6) - torch.arange(6).unsqueeze(-1) + 5).clamp(0, 10)]
    upper = x > 0.5 if rising else x >= 0.5  # the unit is off at the bend
    bias = torch.where(upper, slopes[:, 1, None, None].double() * x + intercepts[:, 1, None, None].double(),
                       slopes[:, 0, None, None].double() * x + intercepts[:, 0, None, None].double())
    logits = 0.3 * q.double() @ k.double().transpose(-2, -1) + bias
    logits = logits.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
    want = torch.autograd.grad(torch.softmax(logits, -1) @ v.double(), x64, grad.double())[0]
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    assert want[:6:2].abs().min() > 1e-2  # the rows on the bend a causal call reaches carry a gradient
