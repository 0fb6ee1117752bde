"""The C++ kernels as ``torch.ops.posenc`` operators and their one build helper
(posenc.kernels._build): ``torch.library.opcheck`` on each operator (schema, fake kernel,
autograd registration, AOT dispatch), ``torch.compile(fullgraph=True)`` through a call of each
against float64 formulas (backend ``aot_eager`` with the graph's operators recorded, and once
inductor, which compiles C++ for the graph around the operator: seconds), the profiler naming each operator, a failed build's one
warning for each kernel, and the cross-process lock (two processes building at once, a stale
lock file left by a killed build). Skips where no compiler builds the kernels."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch.library import opcheck

import posenc
from posenc import kernels
from posenc.errors import InvalidArgument
from posenc.kernels import _build, fire_cpu, relpos_cpu, rotary_cpu

BUILDS = {"rotary": rotary_cpu, "fire": fire_cpu, "relpos": relpos_cpu}


@pytest.fixture(scope="module", autouse=True)
def built():
    """The three kernels for this module only: the modules after it find the state they had."""
    before = {name: module._lib for name, module in BUILDS.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        if not all(getattr(kernels, f"build_cpu_{name}")() for name in BUILDS):
            pytest.skip("the fused CPU kernels do not build here (no C++ compiler or ninja)")
    yield
    for name, module in BUILDS.items():
        module._lib = before[name]


# ---- inputs and float64 formulas, one per operator ----

def rotary_inputs(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 9, 16, generator=g).to(dtype)
    cos, sin = torch.randn(9, 16, generator=g), torch.randn(9, 16, generator=g)
    return x, cos, sin, torch.empty_like(x)


def rotary64(x, cos, sin):
    """x cos + rotate_half(x) sin in float64 (Su et al. 2021, eq. 34; half-split pairs)."""
    x, cos, sin = (t.double() for t in (x, cos, sin))
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), -1) * sin


def fire_inputs(tq=10, tk=12, heads=2, d=32, pieces=4, seed=0):
    """Queries, keys, values and a continuous piecewise-linear f_h (what a ReLU MLP of one input
    is, and what the kernel assumes): slopes drawn, intercepts chosen so the pieces meet."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, heads, t, d, generator=g) for t in (tq, tk, tk))
    distance = (tq - 1) - torch.arange(fire_cpu.table_length(tq, tk), dtype=torch.float32)  # q_i - k_j at m
    psi = torch.log(distance.abs() + 1.0)
    den = torch.rand(tq, generator=g) + 0.5
    bends = torch.sort(torch.rand(pieces - 1, generator=g, dtype=torch.float64) * 2).values
    slopes = torch.randn(heads, pieces, generator=g, dtype=torch.float64)
    intercepts = torch.zeros(heads, pieces, dtype=torch.float64)
    intercepts[:, 0] = torch.randn(heads, generator=g, dtype=torch.float64)
    for s in range(1, pieces):  # f continuous at each bend
        intercepts[:, s] = intercepts[:, s - 1] + (slopes[:, s - 1] - slopes[:, s]) * bends[s - 1]
    return q, k, v, psi, den, bends, slopes, intercepts


def fire64(q, k, v, psi, den, bends, slopes, intercepts, scale, causal):
    """softmax(scale q.k^T + b + mask) v in float64, b(h, i, j) = slopes[h, s] x + intercepts[h, s],
    x = psi[(Tq - 1 - i) + j] / den[i], s the number of bends <= x (the kernel's convention)."""
    tq, tk = q.shape[2], k.shape[2]
    m = (tq - 1 - torch.arange(tq)).unsqueeze(-1) + torch.arange(tk)
    x = psi.double()[m] / den.double().unsqueeze(-1)
    s = torch.searchsorted(bends, x, right=True)
    bias = slopes[:, s] * x + intercepts[:, s]  # (H, Tq, Tk)
    scores = scale * q.double() @ k.double().transpose(-2, -1) + bias
    if causal:
        scores = scores.masked_fill(torch.arange(tk) > torch.arange(tq).unsqueeze(-1) + tk - tq, float("-inf"))
    return torch.softmax(scores, -1) @ v.double()


def relpos_inputs(seed=0, requires_grad=True):
    """Shaw's tables (E and F shared by the heads), Transformer-XL's biases a and u, a score bias
    table B (T5's, Kerple's), FoX's gate parts hi and lo (lo carries no gradient) and the
    piecewise-linear term's N, den, bends (no gradient), slopes and intercepts, all at once."""
    g = torch.Generator().manual_seed(seed)

    def make(*shape, grad=requires_grad):
        return torch.randn(*shape, generator=g).requires_grad_(grad)

    q, k, v = make(1, 2, 6, 8), make(1, 2, 7, 8), make(1, 2, 7, 8)
    lo = make(1, 2, 7, grad=False) * 1e-6
    x_table = (torch.rand(5, generator=g) * 2).requires_grad_(requires_grad)
    x_den = (1 + torch.rand(6, generator=g)).requires_grad_(requires_grad)
    bends = torch.tensor([0.4, 1.1])
    return (q, k, v, make(5, 8), make(2, 8), make(2, 8), make(5, 8), make(2, 5), -make(1, 2, 7).abs().cumsum(-1), lo,
            x_table, x_den, bends, make(2, 3), make(2, 3))


def relpos64(q, k, v, key_table, query_bias, key_bias, value_table, bias_table, gate_hi, gate_lo, x_table, x_den,
             bends, slopes, intercepts, offset, causal, scale):
    """softmax(scale (q_i.k_j + (q_i + a).E[r] + u.k_j) + B[h, r] + c_i' - c_j + f_h(N[r] / den_i) + mask)
    (v_j + F[r]) in float64, r = clamp(j - i + offset, 0, R - 1), c = hi + lo, i' = i + Tk - Tq,
    f_h(x) = slopes[h, s] x + intercepts[h, s], s = #{bends <= x} (Shaw et al. 2018, eqs. 3-5; Dai
    et al. 2019, A^rel; a T5-style bias table; Lin et al. 2025, eq. 6; FIRE's MLP as its pieces)."""
    q, k, v, e, a, u, f, bias, hi, lo = (t.double() for t in (q, k, v, key_table, query_bias, key_bias, value_table,
                                                              bias_table, gate_hi, gate_lo))
    tq, tk = q.shape[2], k.shape[2]
    r = (torch.arange(tk) - torch.arange(tq).unsqueeze(-1) + offset).clamp(0, e.shape[0] - 1)  # (Tq, Tk)
    logits = q @ k.transpose(-2, -1) + ((q + a[:, None]).unsqueeze(-2) * e[r]).sum(-1) + (k * u[:, None]).sum(-1)[:, :, None]
    c = hi + lo
    logits = scale * logits + bias[:, r] + c[..., tk - tq:, None] - c[..., None, :]
    x = x_table.double()[r] / x_den.double()[:, None]
    segment = torch.searchsorted(bends.double(), x, right=True)
    logits = logits + slopes.double()[:, segment] * x + intercepts.double()[:, segment]
    if causal:
        logits = logits.masked_fill(torch.arange(tk) > torch.arange(tq).unsqueeze(-1) + tk - tq, float("-inf"))
    p = torch.softmax(logits, -1)
    return p @ v + (p.unsqueeze(-1) * f[r]).sum(-2)


def differentiable(tensors):
    return [t for t in tensors if t.requires_grad]


RELPOS_OPTIONS = (2, True, 0.3)  # offset, causal, scale
FIRE_OPTIONS = (0.2, True)  # scale, causal


# ---- opcheck ----

def test_opcheck_rotary():
    opcheck(torch.ops.posenc.rotary_cpu.default, (*rotary_inputs(), False))
    opcheck(torch.ops.posenc.rotary_cpu.default, (*rotary_inputs(torch.bfloat16), True))


def test_opcheck_fire():
    opcheck(torch.ops.posenc.fire_attention_cpu.default, (*fire_inputs(), *FIRE_OPTIONS))


def test_opcheck_relpos_forward_and_backward():
    opcheck(torch.ops.posenc.relpos_attention_cpu.default, (*relpos_inputs(), *RELPOS_OPTIONS))
    opcheck(torch.ops.posenc.relpos_attention_cpu.default, (*relpos_inputs()[:4], *[None] * 11, *RELPOS_OPTIONS))
    opcheck(torch.ops.posenc.relpos_attention_cpu.default, (*relpos_inputs()[:3], *[None] * 4, *relpos_inputs()[7:],
                                                            *RELPOS_OPTIONS))
    q, k, v, *tables = relpos_inputs(requires_grad=False)
    out, lse = torch.ops.posenc.relpos_attention_cpu(q, k, v, *tables, *RELPOS_OPTIONS)
    opcheck(torch.ops.posenc.relpos_attention_cpu_backward.default,
            (torch.randn_like(out), q, k, v, out, lse, *tables, *RELPOS_OPTIONS))
    # a q whose last dimension is not contiguous: copied first, and the outputs' layouts follow the copy
    q_t = q.transpose(-1, -2).contiguous().transpose(-1, -2)
    assert q_t.stride(-1) != 1
    opcheck(torch.ops.posenc.relpos_attention_cpu.default, (q_t, k, v, *tables, *RELPOS_OPTIONS))
    opcheck(torch.ops.posenc.relpos_attention_cpu_backward.default,
            (torch.randn_like(out), q_t, k, v, out, lse, *tables, *RELPOS_OPTIONS))


# ---- torch.compile(fullgraph=True) ----

class Recorder:
    """A torch.compile backend that records the operators of each graph, then runs aot_eager."""

    def __init__(self):
        self.targets = []

    def __call__(self, gm, example_inputs):
        from torch._dynamo.backends.registry import lookup_backend

        self.targets += [str(node.target) for node in gm.graph.nodes if node.op == "call_function"]
        return lookup_backend("aot_eager")(gm, example_inputs)


def test_compile_traces_rotary_without_a_graph_break():
    x, cos, sin, _ = rotary_inputs()
    recorder = Recorder()

    @torch.compile(fullgraph=True, backend=recorder)
    def rotate(x, cos, sin):
        out = torch.empty_like(x)
        torch.ops.posenc.rotary_cpu(x, cos, sin, out, False)
        return out * 2.0

    got = rotate(x, cos, sin)
    assert any("posenc.rotary_cpu" in t for t in recorder.targets)
    torch.testing.assert_close(got.double(), 2.0 * rotary64(x, cos, sin), rtol=1e-6, atol=1e-6)


def test_compile_traces_fire_without_a_graph_break():
    inputs = fire_inputs()
    recorder = Recorder()
    fn = torch.compile(lambda *a: torch.ops.posenc.fire_attention_cpu(*a) + 1.0, fullgraph=True, backend=recorder)
    got = fn(*inputs, *FIRE_OPTIONS)
    assert any("posenc.fire_attention_cpu" in t for t in recorder.targets)
    torch.testing.assert_close(got.double(), fire64(*inputs, *FIRE_OPTIONS) + 1.0, rtol=2e-5, atol=2e-5)


def test_compile_traces_relpos_forward_and_backward_without_a_graph_break():
    inputs = relpos_inputs()
    recorder = Recorder()
    fn = torch.compile(lambda *a: torch.ops.posenc.relpos_attention_cpu(*a)[0].square().sum(), fullgraph=True,
                       backend=recorder)
    loss = fn(*inputs, *RELPOS_OPTIONS)
    grads = torch.autograd.grad(loss, differentiable(inputs))
    assert any("posenc.relpos_attention_cpu" in t for t in recorder.targets)
    leaves = [t.detach().double().requires_grad_(t.requires_grad) for t in inputs]
    ref = relpos64(*leaves, *RELPOS_OPTIONS).square().sum()
    torch.testing.assert_close(loss.double(), ref, rtol=2e-5, atol=2e-5)
    for got, want in zip(grads, torch.autograd.grad(ref, differentiable(leaves))):
        torch.testing.assert_close(got.double(), want, rtol=2e-4, atol=2e-5)


def test_inductor_compiles_a_call_of_each_operator():
    """The default backend too (seconds here: a small graph around each operator)."""
    x, cos, sin, _ = rotary_inputs()

    @torch.compile(fullgraph=True)
    def rotate(x, cos, sin):
        out = torch.empty_like(x)
        torch.ops.posenc.rotary_cpu(x, cos, sin, out, False)
        return out * 2.0

    torch.testing.assert_close(rotate(x, cos, sin).double(), 2.0 * rotary64(x, cos, sin), rtol=1e-6, atol=1e-6)
    inputs = fire_inputs()
    fire = torch.compile(lambda *a: torch.ops.posenc.fire_attention_cpu(*a) + 1.0, fullgraph=True)
    torch.testing.assert_close(fire(*inputs, *FIRE_OPTIONS).double(), fire64(*inputs, *FIRE_OPTIONS) + 1.0,
                               rtol=2e-5, atol=2e-5)
    inputs = relpos_inputs(seed=3)
    loss = torch.compile(lambda *a: torch.ops.posenc.relpos_attention_cpu(*a)[0].square().sum(),
                         fullgraph=True)(*inputs, *RELPOS_OPTIONS)
    grads = torch.autograd.grad(loss, differentiable(inputs))
    leaves = [t.detach().double().requires_grad_(t.requires_grad) for t in inputs]
    ref = relpos64(*leaves, *RELPOS_OPTIONS).square().sum()
    torch.testing.assert_close(loss.double(), ref, rtol=2e-5, atol=2e-5)
    for got, want in zip(grads, torch.autograd.grad(ref, differentiable(leaves))):
        torch.testing.assert_close(got.double(), want, rtol=2e-4, atol=2e-5)


def test_relpos_operator_refuses_a_second_derivative():
    q, k, v, *tables = relpos_inputs()
    out, _ = torch.ops.posenc.relpos_attention_cpu(q, k, v, *tables, *RELPOS_OPTIONS)
    (grad_q,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        grad_q.sum().backward()


# ---- the profiler ----

def profiled_names(fn) -> set[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return {event.key for event in prof.key_averages()}


def test_profiler_names_the_rotary_operator_only_when_the_kernel_runs():
    x, cos, sin, _ = rotary_inputs()
    assert "posenc::rotary_cpu" in profiled_names(lambda: posenc.apply_rotary(x, cos, sin))
    enabled, kernels.CPU_KERNEL_ENABLED = kernels.CPU_KERNEL_ENABLED, False
    try:
        assert "posenc::rotary_cpu" not in profiled_names(lambda: posenc.apply_rotary(x, cos, sin))
    finally:
        kernels.CPU_KERNEL_ENABLED = enabled


def test_profiler_names_the_fire_operator():
    inputs = fire_inputs()
    names = profiled_names(lambda: fire_cpu.attention(*inputs[:3], psi=inputs[3], den=inputs[4], bends=inputs[5],
                                                      slopes=inputs[6], intercepts=inputs[7], scale=0.2, causal=True))
    assert "posenc::fire_attention_cpu" in names


def test_profiler_names_the_relpos_operators_forward_and_backward():
    q, k, v, e, a, u, f, *_ = relpos_inputs()

    def step():
        out = relpos_cpu.attention(q, k, v, key_table=e, query_bias=a, key_bias=u, value_table=f, offset=2,
                                   causal=True, scale=0.3)
        out.sum().backward()

    names = profiled_names(step)
    assert {"posenc::relpos_attention_cpu", "posenc::relpos_attention_cpu_backward"} <= names


# ---- errors ----

def test_operator_names_the_argument_it_cannot_take():
    x, cos, sin, out = rotary_inputs()
    with pytest.raises(InvalidArgument, match="x and out must share a dtype"):
        torch.ops.posenc.rotary_cpu(x.double(), cos, sin, out.double(), False)
    with pytest.raises(InvalidArgument, match="out must have x's shape"):
        torch.ops.posenc.rotary_cpu(x, cos, sin, out[:1], False)
    inputs = fire_inputs()
    with pytest.raises(InvalidArgument, match="D in"):
        torch.ops.posenc.fire_attention_cpu(*(t[..., :16] for t in inputs[:3]), *inputs[3:], *FIRE_OPTIONS)
    with pytest.raises(InvalidArgument, match="den must have Tq = 10 entries"):
        torch.ops.posenc.fire_attention_cpu(*inputs[:4], inputs[4][:9], *inputs[5:], *FIRE_OPTIONS)
    q, k, v, e, a, u, f, bias, hi, lo, *piecewise = relpos_inputs(requires_grad=False)
    with pytest.raises(InvalidArgument, match="value_table \\(R, 8\\), bias_table \\(2, R\\) with one R"):
        torch.ops.posenc.relpos_attention_cpu(q, k, v, e, a, u, f[:4], bias, hi, lo, *piecewise, *RELPOS_OPTIONS)
    with pytest.raises(InvalidArgument, match="with one R"):
        torch.ops.posenc.relpos_attention_cpu(q, k, v, e, a, u, f, bias[:, :4], hi, lo, *piecewise, *RELPOS_OPTIONS)
    with pytest.raises(InvalidArgument, match="gate_hi and gate_lo both \\(1, 2, 7\\) or both None"):
        torch.ops.posenc.relpos_attention_cpu(q, k, v, e, a, u, f, bias, hi, None, *piecewise, *RELPOS_OPTIONS)
    with pytest.raises(InvalidArgument, match="k, v \\(B, H, Tk, D\\)"):
        torch.ops.posenc.relpos_attention_cpu(q, k, v[:, :1], e, a, u, f, bias, hi, lo, *piecewise, *RELPOS_OPTIONS)
    with pytest.raises(InvalidArgument, match="x_table must be \\(R,\\) with the other tables' R, x_den \\(6,\\)"):
        torch.ops.posenc.relpos_attention_cpu(q, k, v, e, a, u, f, bias, hi, lo, piecewise[0], piecewise[1][:5],
                                              *piecewise[2:], *RELPOS_OPTIONS)
    with pytest.raises(InvalidArgument, match="all five or none"):
        torch.ops.posenc.relpos_attention_cpu(q, k, v, e, a, u, f, bias, hi, lo, *piecewise[:4], None, *RELPOS_OPTIONS)
    with pytest.raises(InvalidArgument, match="bends \\(S - 1,\\)"):
        torch.ops.posenc.relpos_attention_cpu(q, k, v, e, a, u, f, bias, hi, lo, *piecewise[:2], piecewise[2][:1],
                                              *piecewise[3:], *RELPOS_OPTIONS)
    with pytest.raises(InvalidArgument, match="one dtype"):
        torch.ops.posenc.relpos_attention_cpu(q, k, v, e.double(), a, u, f, bias, hi, lo, *piecewise, *RELPOS_OPTIONS)


@pytest.mark.parametrize("name", list(BUILDS))
def test_a_failed_build_warns_once_and_the_operator_says_why(name, monkeypatch):
    from torch.utils import cpp_extension

    def no_compiler(*args, **kwargs):
        raise RuntimeError("Ninja is required to load C++ extensions")

    module = BUILDS[name]
    monkeypatch.setattr(module, "_lib", None)
    monkeypatch.setattr(module, "_failed", False)
    monkeypatch.setattr(cpp_extension, "load", no_compiler)
    with pytest.warns(RuntimeWarning, match=r"could not be built \(RuntimeError: Ninja is required"):
        assert not module.build()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not getattr(kernels, f"build_cpu_{name}")()
        if name == "rotary":
            x, cos, sin, out = rotary_inputs()
            with pytest.raises(_build.KernelUnavailable, match="build_cpu_rotary"):
                torch.ops.posenc.rotary_cpu(x, cos, sin, out, False)


# ---- the lock across processes ----

BUILD_SCRIPT = "import posenc.kernels as k, sys; sys.exit(0 if k.build_cpu_rotary() else 1)"


def _build_in(cache: Path, count: int) -> list[subprocess.Popen]:
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(cache), PYTHONPATH=os.pathsep.join(sys.path))
    return [subprocess.Popen([sys.executable, "-c", BUILD_SCRIPT], env=env, stderr=subprocess.PIPE, text=True)
            for _ in range(count)]


def test_processes_building_at_once_share_one_build(tmp_path):
    procs = _build_in(tmp_path, 2)
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    (folder,) = [p for p in (tmp_path / "posenc_cpu").iterdir() if p.is_dir()]
    assert folder.name == rotary_cpu.extension_name(rotary_cpu.torch_fuses_addcmul())
    assert len(list(folder.glob("*.so"))) == 1 and not (folder / "lock").exists()


def test_a_lock_file_left_by_a_killed_build_blocks_nobody(tmp_path):
    """torch's build waits on its ``lock`` file for ever; under posenc's lock a leftover one is stale."""
    folder = tmp_path / "posenc_cpu" / rotary_cpu.extension_name(rotary_cpu.torch_fuses_addcmul())
    folder.mkdir(parents=True)
    (folder / "lock").touch()
    (proc,) = _build_in(tmp_path, 1)
    try:
        _, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the build waited on a stale lock file")
    assert proc.returncode == 0, err


def test_the_build_name_follows_the_source_and_the_flags():
    name = _build.extension_name("rotary_cpu", rotary_cpu.CFLAGS)
    assert name.startswith("posenc_rotary_cpu_")
    assert name != _build.extension_name("rotary_cpu", rotary_cpu.CFLAGS + ("-DX",))
    assert name != _build.extension_name("fire_cpu", rotary_cpu.CFLAGS)


def test_each_environment_keeps_its_own_build(monkeypatch):
    """Another torch install (another environment) gets another build folder: one folder shared
    by two environments is compiled again by each in turn (torch's build file names the
    environment's include paths)."""
    name = _build.extension_name("rotary_cpu", rotary_cpu.CFLAGS)
    monkeypatch.setattr(torch, "__file__", "/another/env/site-packages/torch/__init__.py")
    assert _build.extension_name("rotary_cpu", rotary_cpu.CFLAGS) != name
