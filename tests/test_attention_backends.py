"""Every attention backend computes what the eager reference computes: values and gradients.

Score-bias encodings are taken from the registry (every one with the ``score_bias`` hook),
so encodings added later are covered without editing this file.
"""

from __future__ import annotations

import importlib
import math

import pytest
import torch
from conftest import skip_if_causal_only, slow_unless

import posenc
from posenc import kernels
from posenc.attention import tiling

attention_module = importlib.import_module("posenc.attention")  # the module, not the function

H, D = 4, 8
BIAS_ENCODINGS = [name for name, cls in posenc.REGISTRY.items() if "score_bias" in cls.hooks]


def make(name: str, causal: bool = True):
    torch.manual_seed(0)
    enc = posenc.create_for_model(name, d_model=H * D, num_heads=H, head_dim=D, max_positions=512, causal=causal)
    with torch.no_grad():  # learned biases start near zero; make them matter
        for p in enc.parameters():
            p.normal_()
    return enc


@pytest.fixture(autouse=True)
def small_tiles(monkeypatch):
    """Tiles of a few hundred entries and view blocks of 3 rows, so the blocked backend runs
    many query blocks, materialized or strided."""
    monkeypatch.setattr(tiling, "BLOCKED_TILE_ELEMENTS", 400)
    monkeypatch.setattr(tiling, "BLOCKED_VIEW_ROWS", 3)


CASES = [  # (Tq, Tk, positions): Tq != Tk is a KV cache; (B, T) positions are per-row offsets
    (13, 13, None),
    (5, 29, None),
    (7, 20, "offset"),
    (9, 9, "per-row"),
    (6, 12, "after"),  # consecutive queries placed after all keys: the positional causal mask is not the index one
]


def positions_for(kind, tq, tk):
    if kind == "offset":
        return torch.arange(100 + tk - tq, 100 + tk), torch.arange(100, 100 + tk)
    if kind == "after":
        return torch.arange(50, 50 + tq), torch.arange(tk)
    if kind == "per-row":
        starts = torch.tensor([[0], [37]])
        return starts + torch.arange(tq), starts + torch.arange(tk)
    return None, None


#: flex evaluates FIRE's network eagerly on the CPU (3-6 s a case): by default on two cases (plain
#: causal, and per-row positions without the causal mask); its other cases behind slow (the default
#: suite's time budget; pytest -m slow runs them)
FIRE_ON_FLEX = {((13, 13, None), True), ((9, 9, "per-row"), False)}


def _backend_cases():
    return [slow_unless(not (backend == "flex" and name == "fire") or (case, causal) in FIRE_ON_FLEX,
                        name, backend, causal, case, id=f"{case[0]}x{case[1]}-{case[2]}-{causal}-{backend}-{name}")
            for case in CASES for causal in (True, False) for backend in ("blocked", "flex", "sdpa")
            for name in BIAS_ENCODINGS + ["nope", "rope"]]


@pytest.mark.parametrize("name,backend,causal,case", _backend_cases())
def test_backends_match_eager(name, backend, causal, case):
    if backend == "flex":
        pytest.importorskip("torch.nn.attention.flex_attention")
    tq, tk, kind = case
    enc = make(name, causal) if name in BIAS_ENCODINGS else posenc.create_for_model(
        name, d_model=H * D, num_heads=H, head_dim=D, max_positions=512)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, H, t, D, generator=g) for t in (tq, tk, tk))
    qp, kp = positions_for(kind, tq, tk)
    expected = posenc.attention(q, k, v, enc, causal=causal, q_positions=qp, k_positions=kp, backend="eager")
    out = posenc.attention(q, k, v, enc, causal=causal, q_positions=qp, k_positions=kp, backend=backend)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_blocked_matches_explicit_float64_formula():
    """Independent of eager: softmax(q.k/sqrt(D) + b(h, i, j), masked) @ v with b written out for ALiBi."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, H, t, D, dtype=torch.float64, generator=g) for t in (6, 15, 15))
    out = posenc.attention(q, k, v, posenc.create("alibi", num_heads=H), backend="blocked")
    slopes = [2.0 ** (-8.0 * (h + 1) / H) for h in range(H)]
    expected = torch.empty_like(out)
    for h in range(H):
        for i in range(6):
            qi = i + 9  # queries are the last 6 of 15 keys
            logits = torch.tensor([
                (q[0, h, i] @ k[0, h, j]).item() / math.sqrt(D) - slopes[h] * (qi - j) if j <= qi else -math.inf
                for j in range(15)
            ], dtype=torch.float64)
            expected[0, h, i] = torch.softmax(logits, 0) @ v[0, h]
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)  # the bias tile is float32


@pytest.mark.parametrize("name", [n for n in BIAS_ENCODINGS if any(True for _ in posenc.create_for_model(
    n, d_model=H * D, num_heads=H, head_dim=D, max_positions=512).parameters())])
@pytest.mark.parametrize("backend", ["blocked", "sdpa"])
@pytest.mark.parametrize("causal", [True, False])
def test_learned_bias_gradients_match_eager(name, backend, causal):
    g = torch.Generator().manual_seed(3)
    q0, k0, v0 = (torch.randn(2, H, t, D, generator=g) for t in (11, 17, 17))
    grads = {}
    for b in ("eager", backend):
        enc = make(name, causal)
        q, k, v = (t.clone().requires_grad_() for t in (q0, k0, v0))
        out = posenc.attention(q, k, v, enc, causal=causal, backend=b)
        out.backward(torch.linspace(-1, 1, out.numel()).view_as(out))
        grads[b] = [q.grad, k.grad, v.grad] + [p.grad for p in enc.parameters()]
    for got, expected in zip(grads[backend], grads["eager"], strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


TOEPLITZ_ENCODINGS = [n for n in BIAS_ENCODINGS if posenc.REGISTRY[n].translation_invariant]


@pytest.mark.parametrize("name", BIAS_ENCODINGS)
@pytest.mark.parametrize("order", ["ascending", "descending", "shuffled"])
@pytest.mark.parametrize("causal", [True, False])
def test_bias_tiles_match_elementwise_bias(name, order, causal):
    """The tiling's bias (Toeplitz from the distinct distances, gathered, or elementwise) and
    the encoding's score_bias against bias() on every (i, j) pair one by one, -inf where the
    key is after the query when the causal mask is folded in."""
    enc = make(name, causal=False)
    qp = torch.arange(20, 31)
    if order == "descending":
        qp = qp.flip(0)
    elif order == "shuffled":
        qp = qp[torch.randperm(qp.numel(), generator=torch.Generator().manual_seed(0))]
    kp = torch.arange(5, 40)
    enc.prepare_bias()  # what posenc.attention does before tiling (Kerple's clamp)
    with torch.no_grad():
        got, _ = tiling.bias_tile(enc, qp, kp, H, causal=causal)
        expected = torch.empty(H, qp.numel(), kp.numel())
        for i, qi in enumerate(qp.tolist()):
            for j, kj in enumerate(kp.tolist()):
                value = enc.bias(torch.tensor(qi), torch.tensor(kj), torch.arange(H))
                expected[:, i, j] = -math.inf if causal and kj > qi else value
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
        if not causal:
            torch.testing.assert_close(enc.score_bias(qp, kp), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", TOEPLITZ_ENCODINGS)
def test_descending_queries_give_a_view_of_the_distances(name):
    """The blocked backend's memory bound: no (H, Tq, Tk) storage for a Toeplitz bias."""
    enc = make(name, causal=True)
    enc.prepare_bias()
    with torch.no_grad():
        bias, owned = tiling.bias_tile(enc, torch.arange(999, 499, -1), torch.arange(1000), H, causal=True)
    assert bias.shape == (H, 500, 1000)
    assert bias.untyped_storage().nbytes() <= H * 1500 * 4
    assert not owned  # an overlapping view: nobody may write into it


def test_blocked_memory_is_linear_in_length(monkeypatch):
    """With the causal mask folded into a strided bias view, no tile of H * rows * T floats is
    allocated: the largest mask SDPA sees holds O(H T) values."""
    monkeypatch.setattr(tiling, "BLOCKED_VIEW_ROWS", 64)
    positions = torch.arange(1024)
    seen = [block.mask.untyped_storage().nbytes() for block in tiling.query_blocks(
        make("alibi"), positions, positions, num_heads=H, batch=1, causal=True, mask=None, dtype=torch.float32)]
    assert len(seen) == 1 + math.ceil((1024 - 2) / 64)  # a 2-row probe (the tile budget), then 64-row blocks
    assert max(seen) <= H * (64 + 1024) * 4


def test_blocked_backend_runs_the_tiles(monkeypatch):
    """The blocked backend hands SDPA exactly the tiling's masks: O(H T) values each."""
    monkeypatch.setattr(kernels, "CPU_KERNEL_ENABLED", False)  # the blocks themselves, not the fused CPU kernel
    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kwargs):
        seen.append(attn_mask.untyped_storage().nbytes())
        return sdpa(q, k, v, attn_mask=attn_mask, **kwargs)

    blocked = importlib.import_module("posenc.attention.blocked")
    monkeypatch.setattr(blocked.F, "scaled_dot_product_attention", spy)
    monkeypatch.setattr(tiling, "BLOCKED_VIEW_ROWS", 64)
    q = torch.randn(1, H, 1024, D)
    posenc.attention(q, q, q, make("alibi"), backend="blocked")
    assert len(seen) == 1 + math.ceil((1024 - 2) / 64)
    assert max(seen) <= H * (64 + 1024) * 4


@pytest.mark.parametrize("positions", ["consecutive", "gaps"])
def test_t5_tile_lookup_matches_buckets(positions):
    """T5's bias evaluated once per distinct distance by the tiling (laid out as a Toeplitz
    matrix, or gathered when positions have gaps): same values as the formula."""
    t5 = make("t5", causal=False)
    qp, kp = torch.arange(300, 380), torch.arange(0, 400)
    if positions == "gaps":
        qp, kp = qp * 3, kp * 2
    bucket = posenc.t5_relative_position_bucket(kp[None, :] - qp[:, None], bidirectional=True)
    expected = t5.relative_attention_bias.weight[bucket].permute(2, 0, 1)
    bias, _ = tiling.bias_tile(t5, qp, kp, H)
    assert torch.equal(bias, expected)
    assert torch.equal(t5.score_bias(qp, kp), expected)


def test_auto_rule():
    resolve = attention_module._resolve_backend
    alibi = posenc.create("alibi", num_heads=8)
    assert resolve("auto", alibi, 8 * 64 * 64) == "sdpa"
    assert resolve("auto", alibi, 8 * 1024 * 1024) == "blocked"
    assert resolve("auto", posenc.create("rope", head_dim=8), 8 * 1024 * 1024) == "sdpa"
    assert resolve("auto", None, 8 * 1024 * 1024) == "sdpa"
    t5 = posenc.create("t5", num_heads=8)  # a learned bias: eager while it trains on the CPU
    assert resolve("auto", t5, 8 * 64 * 64, torch.device("cpu")) == "eager"
    assert resolve("auto", t5, 8 * 64 * 64, torch.device("cuda")) == "sdpa"
    assert resolve("auto", t5, 8 * 1024 * 1024, torch.device("cpu")) == "blocked"
    with torch.no_grad():
        assert resolve("auto", t5, 8 * 64 * 64, torch.device("cpu")) == "sdpa"


def test_blocked_refuses_content_hooks():
    class Content(posenc.PositionalEncoding):
        hooks = frozenset({"content"})

    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match="content"):
        posenc.attention(q, q, q, Content(), backend="blocked")


class ToyBias(posenc.ScoreBias):
    """A score bias defined in the test by its math only: -(h + 1) / 4 * sqrt(|i - j|), plus,
    when not translation invariant, a term in the absolute query position."""

    name = "toy"

    def __init__(self, num_heads, translation_invariant):
        super().__init__()
        self.num_heads = num_heads
        self.translation_invariant = translation_invariant

    def bias(self, q_positions, k_positions, head):
        out = -(head + 1).to(torch.float32) / 4 * (q_positions - k_positions).abs().to(torch.float32).sqrt()
        if not self.translation_invariant:
            out = out + 0.01 * q_positions.to(torch.float32)
        return out


@pytest.mark.parametrize("translation_invariant", [True, False])
@pytest.mark.parametrize("backend", ["sdpa", "blocked", "flex", "auto"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}-{c[2]}")
def test_a_new_score_bias_runs_on_every_backend(translation_invariant, backend, causal, case):
    """An encoding that states only bias() and translation_invariant gets every backend."""
    if backend == "flex":
        pytest.importorskip("torch.nn.attention.flex_attention")
    tq, tk, kind = case
    enc = ToyBias(H, translation_invariant)
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, H, t, D, generator=g) for t in (tq, tk, tk))
    qp, kp = positions_for(kind, tq, tk)
    expected = posenc.attention(q, k, v, enc, causal=causal, q_positions=qp, k_positions=kp, backend="eager")
    out = posenc.attention(q, k, v, enc, causal=causal, q_positions=qp, k_positions=kp, backend=backend)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    qp = torch.arange(tk - tq, tk) if qp is None else qp
    kp = torch.arange(tk) if kp is None else kp
    if qp.dim() == 1:
        explicit = enc.bias(qp[:, None], kp[None, :], torch.arange(H)[:, None, None])  # (H, Tq, Tk)
    else:
        explicit = enc.bias(qp[:, None, :, None], kp[:, None, None, :], torch.arange(H)[:, None, None])  # (B, H, Tq, Tk)
    torch.testing.assert_close(enc.score_bias(qp, kp), explicit)


GATE_ENCODINGS = [name for name, cls in posenc.REGISTRY.items() if "gate" in cls.hooks]


@pytest.mark.parametrize("name", GATE_ENCODINGS)
@pytest.mark.parametrize("backend", ["blocked", "sdpa", "auto"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}-{c[2]}")
def test_gate_encodings_match_eager_values_and_gradients(name, backend, causal, case):
    """A ``gate`` encoding (its bias from per-key values of the hidden state, ``gates=``) on
    every backend that serves it: the tiles of the blocked backend, the materialized bias of
    sdpa, against eager; gradients of q, k, v, the gates and the encoding's parameters."""
    skip_if_causal_only(name, causal)
    if backend != "auto" and attention_module._BACKENDS[backend].unsupported(make(name, causal), mask=None) is not None:
        pytest.skip(f"{backend} refuses {name} (a content term: tests/test_path.py)")
    tq, tk, kind = case
    qp, kp = positions_for(kind, tq, tk)
    g = torch.Generator().manual_seed(5)
    q0, k0, v0 = (torch.randn(2, H, t, D, generator=g) for t in (tq, tk, tk))
    x = torch.randn(2, tk, H * D, generator=g)
    results = {}
    for b in ("eager", backend):
        enc = make(name, causal)
        q, k, v = (t.clone().requires_grad_() for t in (q0, k0, v0))
        gates = enc.gate(x)
        gates.retain_grad()
        out = posenc.attention(q, k, v, enc, causal=causal, q_positions=qp, k_positions=kp, backend=b, gates=gates)
        out.backward(torch.linspace(-1, 1, out.numel()).view_as(out))
        results[b] = [out, q.grad, k.grad, v.grad, gates.grad] + [p.grad for p in enc.parameters()]
    for got, expected in zip(results[backend], results["eager"], strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
