"""FoX, the Forgetting Transformer (Lin et al. 2025), against an independent float64 reference:
the forget gates f_t = sigmoid(w_h . x_t + b_h) and D_ij = sum_{l=j+1..i} log f_l written out
with Python loops (math.exp, math.log; no posenc code), full attention outputs compared on
every backend that serves it. Then: constant gates are ALiBi, gradients of the gate parameters
agree between backends, c_i - c_j survives float32 cancellation on long sequences, the blocked
backend stays O(T) in memory, and the gates live per layer and in the KV cache."""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc import kernels
from posenc.attention import tiling
from posenc.lab.model import KVCache, LMConfig, TransformerLM
from loop_reference import dot, softmax_average

B, H, D, DM = 2, 2, 4, 6


def log_forget_gates(x, weight, bias):
    """log f[b][h][t] = log(1 / (1 + exp(-(w_h . x_t + b_h)))), nested lists."""
    return [[[math.log(1.0 / (1.0 + math.exp(-(dot(weight[h], x[b, t]) + float(bias[h])))))
              for t in range(x.shape[1])] for h in range(weight.shape[0])] for b in range(x.shape[0])]


def fox_reference(q, k, v, log_f, *, causal=True):
    """softmax_j(q_i.k_j / sqrt(D) + D_ij): D_ij = sum of log f over the keys l with
    j < l <= i' (i' = i + Tk - Tq, the query's own token); not causal: over min < l <= max."""
    nb, nh, tq, d = q.shape
    tk = k.shape[2]
    out = torch.zeros(nb, nh, tq, v.shape[-1], dtype=torch.float64)
    for b in range(nb):
        for h in range(nh):
            for i in range(tq):
                own = i + tk - tq
                keys = [j for j in range(tk) if not causal or j <= own]
                logits = []
                for j in keys:
                    decay = sum(log_f[b][h][l] for l in range(min(j, own) + 1, max(j, own) + 1))
                    logits.append(dot(q[b, h, i], k[b, h, j]) / math.sqrt(d) + decay)
                out[b, h, i] = softmax_average(logits, [v[b, h, j] for j in keys])
    return out


def make_fox(seed: int = 0) -> posenc.FoX:
    torch.manual_seed(seed)
    enc = posenc.create("fox", d_model=DM, num_heads=H)
    with torch.no_grad():  # gates from about 0.1 to 0.99: strong and weak forgetting
        enc.fgate_proj.weight.normal_(0, 1.0)
        enc.fgate_proj.bias.uniform_(0.0, 3.0)
    return enc


def inputs(tq, tk, seed=1, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, t, D, generator=g, dtype=dtype) for t in (tq, tk, tk))
    x = torch.randn(B, tk, DM, generator=g, dtype=dtype)  # the keys' hidden states
    return q, k, v, x


@pytest.fixture
def small_tiles(monkeypatch):
    """A tile budget of a few rows, so the blocked backend runs many query blocks."""
    monkeypatch.setattr(tiling, "BLOCKED_TILE_ELEMENTS", 2 * H * 24 * 3)


@pytest.mark.parametrize("backend", ["eager", "sdpa", "blocked"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("shape", [(7, 7), (3, 10)], ids=["self", "cache"])
def test_fox_matches_the_float64_formula(backend, causal, shape, small_tiles):
    enc = make_fox().double()
    q, k, v, x = inputs(*shape)
    out = posenc.attention(q, k, v, enc, causal=causal, backend=backend, gates=enc.gate(x))
    log_f = log_forget_gates(x, enc.fgate_proj.weight.detach(), enc.fgate_proj.bias.detach())
    torch.testing.assert_close(out, fox_reference(q, k, v, log_f, causal=causal), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("backend", ["eager", "sdpa", "blocked"])
def test_fox_float32_against_the_float64_formula(backend, small_tiles):
    enc = make_fox()
    q, k, v, x = inputs(5, 12, dtype=torch.float32)
    out = posenc.attention(q, k, v, enc, backend=backend, gates=enc.gate(x))
    log_f = log_forget_gates(x, enc.fgate_proj.weight.detach(), enc.fgate_proj.bias.detach())
    torch.testing.assert_close(out.double(), fox_reference(q, k, v, log_f), rtol=2e-5, atol=2e-5)


def test_constant_gates_are_alibi():
    """The paper's reading of FoX as a data-dependent ALiBi: log f_t = -m_h for every token
    gives D_ij = -m_h (i - j), ALiBi with slopes m_h."""
    enc, alibi = posenc.create("fox", d_model=DM, num_heads=4), posenc.create("alibi", num_heads=4)
    q, k, v = (torch.randn(1, 4, t, D, dtype=torch.float64) for t in (5, 9, 9))
    gates = -posenc.alibi_slopes(4).double()[None, :, None].expand(1, 4, 9)
    for backend in ("eager", "sdpa", "blocked"):
        torch.testing.assert_close(posenc.attention(q, k, v, enc, gates=gates, backend=backend),
                                   posenc.attention(q, k, v, alibi.double(), backend=backend))


@pytest.mark.parametrize("causal", [True, False])
def test_gate_parameter_gradients_match_between_backends(causal, small_tiles):
    grads = {}
    q0, k0, v0, x = inputs(6, 13, dtype=torch.float32)
    for backend in ("eager", "sdpa", "blocked"):
        enc = make_fox()
        q, k, v = (t.clone().requires_grad_() for t in (q0, k0, v0))
        out = posenc.attention(q, k, v, enc, causal=causal, backend=backend, gates=enc.gate(x))
        out.backward(torch.linspace(-1, 1, out.numel()).view_as(out))
        grads[backend] = [enc.fgate_proj.weight.grad, enc.fgate_proj.bias.grad, q.grad, k.grad, v.grad]
    # the float64 reference: c in float64 alone, no (hi, lo) split
    enc = make_fox().double()
    q, k, v = (t.double().requires_grad_() for t in (q0, k0, v0))
    out = posenc.attention(q, k, v, enc, causal=causal, backend="eager", gates=enc.gate(x.double()))
    out.backward(torch.linspace(-1, 1, out.numel(), dtype=torch.float64).view_as(out))
    grads["float64"] = [enc.fgate_proj.weight.grad, enc.fgate_proj.bias.grad, q.grad, k.grad, v.grad]
    assert grads["eager"][0].abs().max() > 1e-3
    for backend in ("sdpa", "blocked", "float64"):
        for got, expected in zip(grads[backend], grads["eager"], strict=True):
            torch.testing.assert_close(got.float(), expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("causal", [True, False])
def test_gradcheck_through_the_gates_in_float64(causal):
    """d out / d log f through the cumulative sum and the (hi, lo) split: finite differences agree."""
    enc = make_fox().double()
    q, k, v, x = inputs(3, 5)
    gates = enc.gate(x).detach().requires_grad_()
    assert torch.autograd.gradcheck(
        lambda q, gates: posenc.attention(q, k, v, enc, causal=causal, gates=gates, backend="eager"),
        (q.requires_grad_(), gates))


def test_long_sequences_keep_c_i_minus_c_j_exact():
    """c grows like the length times the mean log f: at T = 200k and log f = -2.5, |c| ~ 5e5,
    where float32 steps are 0.03. D_ij near the diagonal (what the softmax reads) stays exact
    to float32 rounding of D itself; a float32 cumulative sum would be off by ~1e-2."""
    T = 200_000
    g = torch.Generator().manual_seed(5)
    gates = (-2.5 + 0.5 * torch.randn(1, 1, T, generator=g)).clamp(max=-1e-3)
    enc = posenc.create("fox", d_model=4, num_heads=1)
    state = enc.prepare_gates(gates)
    rows = torch.tensor([T - 1, T - 2, 150_000])
    keys = torch.arange(T - 40, T)
    got = enc.gate_bias(state, rows, keys, causal=True)[0, 0]
    exact = torch.cumsum(gates.double(), -1)[0, 0]
    expected = exact[rows].unsqueeze(-1) - exact[keys]
    visible = keys <= rows.unsqueeze(-1)
    error = (got.double() - expected).abs()[visible]
    assert float(error.max()) <= 4 * 2.0**-24 * float(expected.abs()[visible].max()) + 1e-9
    naive = torch.cumsum(gates, -1)[0, 0]
    assert float(((naive[rows].unsqueeze(-1) - naive[keys]).double() - expected).abs()[visible].max()) > 1e-3


def test_blocked_backend_keeps_one_row_block_of_gate_bias_at_a_time(monkeypatch):
    """Memory O(T): every gate tile the blocked backend asks for is a few query rows wide."""
    monkeypatch.setattr(kernels, "CPU_KERNEL_ENABLED", False)  # the blocks themselves, not the fused CPU kernel
    monkeypatch.setattr(tiling, "BLOCKED_TILE_ELEMENTS", 64 * 256)
    enc = posenc.create("fox", d_model=8, num_heads=2)
    shapes = []
    gate_bias = enc.gate_bias

    def spy(state, q_index, k_index, *, causal):
        tile = gate_bias(state, q_index, k_index, causal=causal)
        shapes.append(tuple(tile.shape))
        return tile

    monkeypatch.setattr(enc, "gate_bias", spy)
    q, k, v = (torch.randn(1, 2, 256, 8) for _ in range(3))
    x = torch.randn(1, 256, 8)
    out = posenc.attention(q, k, v, enc, gates=enc.gate(x), backend="blocked")
    assert len(shapes) > 4 and max(rows * keys for _, _, rows, keys in shapes) <= 64 * 256 // 2
    monkeypatch.setattr(enc, "gate_bias", gate_bias)
    torch.testing.assert_close(out, posenc.attention(q, k, v, enc, gates=enc.gate(x), backend="eager"), rtol=1e-5, atol=1e-5)


def test_gates_live_per_layer_and_in_the_cache():
    config = LMConfig(d_model=16, num_layers=3, num_heads=2, max_positions=64)
    model = TransformerLM(config, "fox").eval()
    weights = [model.encoding.for_layer(i).fgate_proj.weight for i in range(3)]
    assert len({id(w) for w in weights}) == 3
    cache = KVCache(config.num_layers)
    tokens = torch.randint(0, 256, (2, 9))
    with torch.no_grad():
        model(tokens[:, :5], cache=cache)
        model(tokens[:, 5:], cache=cache)
    keys, values, gates = cache.past(2)
    assert keys.shape == (2, 2, 9, 8) and gates.shape == (2, 2, 9) and bool((gates < 0).all())
    with pytest.raises(ValueError, match=r"layer must be in 0..2, got -1"):
        model.encoding.for_layer(-1)


def test_auto_backend_for_a_gate_encoding():
    """As a learned score bias: blocked once the bias would hold 4M entries, eager while it
    trains on the CPU (no gradient through SDPA's CPU float mask), else sdpa."""
    import importlib

    resolve = importlib.import_module("posenc.attention")._resolve_backend
    enc = posenc.create("fox", d_model=8, num_heads=2)
    gates = torch.zeros(1, 2, 64, requires_grad=True)
    assert resolve("auto", enc, 2 * 64 * 64, torch.device("cpu"), gates) == "eager"
    assert resolve("auto", enc, 2 * 2048 * 2048, torch.device("cpu"), gates) == "blocked"
    assert resolve("auto", enc, 2 * 64 * 64, torch.device("cuda"), gates) == "sdpa"
    with torch.no_grad():
        assert resolve("auto", enc, 2 * 64 * 64, torch.device("cpu"), gates.detach()) == "sdpa"


def test_gate_takes_bfloat16_activations_with_float32_parameters():
    """Mixed precision (issue 22): bf16 x with float32 weights raised a raw dtype RuntimeError;
    x is widened to the parameters' dtype, as the other encodings compute."""
    fox = posenc.create("fox", d_model=16, num_heads=2)
    x = torch.randn(2, 5, 16).bfloat16()
    out = fox.gate(x)
    assert out.dtype == torch.float32 and out.shape == (2, 2, 5)
    torch.testing.assert_close(out, fox.gate(x.float()), rtol=0, atol=0)
