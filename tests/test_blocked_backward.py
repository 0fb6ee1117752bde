"""The blocked backend's recomputing backward (posenc.attention.blocked.BlockedAttention).

Its gradients in q, k, v, the encoding's parameters and FoX's gates are checked against finite
differences of the forward (torch.autograd.gradcheck, float64) over several query blocks with
a ragged last one, causal and not, with a mask, grouped-query heads and per-row positions, and
against the eager reference in float32 at a moderate size; its forward against eager; and
what it keeps for the backward: O(B H T) tensors, never a (Tq, Tk) one.

Every learned encoding the blocked backend serves is taken from the registry (the ``score_bias``
and ``gate`` hooks), so encodings added later are covered without editing this file.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from conftest import slow_unless

import posenc
from posenc import kernels
from posenc.attention import tiling

H, D = 2, 4
SERVED = sorted(name for name, cls in posenc.REGISTRY.items()
                if {"score_bias", "gate"} & set(cls.hooks) and "content" not in cls.hooks)
LEARNED = [name for name in SERVED if any(True for _ in posenc.create_for_model(
    name, d_model=H * D, num_heads=H, head_dim=D, max_positions=512).parameters())]


@pytest.fixture(autouse=True)
def small_tiles(monkeypatch):
    """Tiles of about 60 entries and view blocks of 5 rows: T = 17..40 gives several query
    blocks, the last one ragged."""
    monkeypatch.setattr(tiling, "BLOCKED_TILE_ELEMENTS", 60)
    monkeypatch.setattr(tiling, "BLOCKED_VIEW_ROWS", 5)


def make(name: str, *, causal: bool, heads: int = H, head_dim: int = D, dtype=torch.float64):
    torch.manual_seed(0)
    enc = posenc.create_for_model(name, d_model=heads * head_dim, num_heads=heads, head_dim=head_dim,
                                  max_positions=512, causal=causal).to(dtype)
    with torch.no_grad():  # learned biases start near zero: make them matter (inside Kerple's ranges)
        for p in enc.parameters():
            p.copy_(torch.rand(p.shape, dtype=dtype) * 0.8 + 0.4 if p.dim() <= 1 else torch.randn(p.shape, dtype=dtype))
    return enc


def test_the_learned_encodings_are_found():
    assert {"t5", "kerple", "fire", "fox"} <= set(LEARNED)


def _case_inputs(batch, tq, tk, kv_heads, dtype=torch.float64, heads=H, head_dim=D):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(batch, heads, tq, head_dim, generator=g, dtype=dtype)
    k, v = (torch.randn(batch, kv_heads, tk, head_dim, generator=g, dtype=dtype) for _ in range(2))
    return q, k, v


def _attend(enc, causal, mask=None, q_positions=None, k_positions=None, x=None, backend="blocked"):
    """A function of (q, k, v, *parameters) for gradcheck; FoX's gates come from x through its
    gate projection (whose parameters are among the inputs)."""
    def f(q, k, v, *params):
        gates = enc.gate(x) if x is not None else None
        return posenc.attention(q, k, v, enc, causal=causal, mask=mask, q_positions=q_positions,
                                k_positions=k_positions, backend=backend, gates=gates)
    return f


def _runs_blocked_attention(out) -> bool:
    """Whether the graph of ``out`` holds the recomputing backward (not SDPA's)."""
    seen, stack = set(), [out.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node).__name__ == "BlockedAttentionBackward":
            return True
        stack.extend(next_node for next_node, _ in node.next_functions)
    return False


CASES = {  # batch, Tq, Tk, H_kv, extra
    "self-17": (1, 17, 17, H, None),
    "self-40-batch": (2, 40, 40, H, None),
    "cache-9x23": (1, 9, 23, H, None),
    "gqa-19": (2, 19, 19, 1, None),
    "mask-21": (2, 21, 21, H, "mask"),
    "per-row-18": (2, 18, 18, H, "per-row"),
}


@pytest.mark.parametrize("name", LEARNED)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("case", list(CASES), ids=str)
def test_gradcheck_float64(name, causal, case):
    batch, tq, tk, kv_heads, extra = CASES[case]
    enc = make(name, causal=causal)
    q, k, v = (t.requires_grad_() for t in _case_inputs(batch, tq, tk, kv_heads))
    mask = q_positions = k_positions = None
    if extra == "mask":
        mask = torch.rand(batch, 1, tq, tk, generator=torch.Generator().manual_seed(2)) > 0.3
        mask[..., torch.arange(tq), torch.arange(tk - tq, tk)] = True  # every query sees itself
    if extra == "per-row":
        starts = torch.tensor([[0], [29]])
        q_positions, k_positions = starts + torch.arange(tk - tq, tk), starts + torch.arange(tk)
    x = None
    if "gate" in enc.hooks:
        x = torch.randn(batch, tk, H * D, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    params = [p for p in enc.parameters() if p.requires_grad]
    f = _attend(enc, causal, mask, q_positions, k_positions, x)
    out = f(q, k, v, *params)
    assert _runs_blocked_attention(out)
    assert torch.autograd.gradcheck(f, (q, k, v, *params), eps=1e-6, atol=1e-6, rtol=1e-5, fast_mode=True)


#: the full Jacobian by default for KERPLE (a learned score bias) only: 7-18 s an encoding on a CPU;
#: the others behind slow (pytest -m slow), and every one's fast-mode gradcheck above runs by default
FULL_JACOBIAN_BY_DEFAULT = ("kerple",)


@pytest.mark.parametrize("name", [slow_unless(n in FULL_JACOBIAN_BY_DEFAULT, n) for n in LEARNED])
def test_gradcheck_every_entry_of_the_jacobian(name):
    """The full Jacobian (not random projections) at the smallest size: 17 queries in blocks
    of a few rows, the last one ragged."""
    enc = make(name, causal=True)
    q, k, v = (t.requires_grad_() for t in _case_inputs(1, 17, 17, H))
    x = torch.randn(1, 17, H * D, dtype=torch.float64) if "gate" in enc.hooks else None
    params = [p for p in enc.parameters() if p.requires_grad]
    assert torch.autograd.gradcheck(_attend(enc, True, x=x), (q, k, v, *params), eps=1e-6, atol=1e-6, rtol=1e-5)


def _grads(enc, backend, q0, k0, v0, causal, x=None, mask=None):
    enc.zero_grad()
    q, k, v = (t.clone().requires_grad_() for t in (q0, k0, v0))
    gates = enc.gate(x) if x is not None else None
    out = posenc.attention(q, k, v, enc, causal=causal, backend=backend, gates=gates, mask=mask)
    out.backward(torch.linspace(-1, 1, out.numel()).view_as(out))
    return [out.detach(), q.grad, k.grad, v.grad] + [p.grad for p in enc.parameters() if p.requires_grad]


@pytest.mark.parametrize("name", LEARNED)
@pytest.mark.parametrize("causal", [True, False])
def test_float32_matches_eager_at_a_moderate_size(name, causal, monkeypatch):
    """T = 300, H = 4, D = 16, blocks of 32 rows (and view blocks of 64): values and every
    gradient as the eager reference's, to float32 rounding (both are as far from the float64
    gradients: a few 1e-6 of each tensor's largest entry, 1e-4 for FoX's gate projection)."""
    heads, head_dim, length = 4, 16, 300
    monkeypatch.setattr(tiling, "BLOCKED_TILE_ELEMENTS", heads * 32 * length)
    monkeypatch.setattr(tiling, "BLOCKED_VIEW_ROWS", 64)
    enc = make(name, causal=causal, heads=heads, head_dim=head_dim, dtype=torch.float32)
    q, k, v = _case_inputs(2, length, length, heads, torch.float32, heads, head_dim)
    x = torch.randn(2, length, heads * head_dim) if "gate" in enc.hooks else None
    expected = _grads(enc, "eager", q, k, v, causal, x)
    got = _grads(enc, "blocked", q, k, v, causal, x)
    assert all(g is not None for g in expected)
    assert any(g.abs().max() > 1e-3 for g in expected[4:])  # the parameters' gradients are not all zero
    for a, b in zip(got, expected, strict=True):
        # a gradient entry is a float32 sum over B H T^2 terms: its rounding scales with the
        # tensor's largest entries, not with its own (near-zero entries are sums that cancel)
        torch.testing.assert_close(a, b, rtol=2e-4, atol=1e-4 * max(1.0, b.abs().max().item()))


def test_an_encoding_without_parameters_and_no_bias():
    """ALiBi (no parameter) and no encoding: the q, k, v gradients through the blocks."""
    q, k, v = (t.requires_grad_() for t in _case_inputs(2, 23, 23, 1))
    for enc in (posenc.create("alibi", num_heads=H).double(), None):
        for causal in (True, False):
            assert torch.autograd.gradcheck(_attend(enc, causal), (q, k, v), eps=1e-6, atol=1e-6, rtol=1e-5, fast_mode=True)


def test_only_parameters_require_grad():
    """Frozen activations, a trained bias (the gradient reaches the parameters alone)."""
    enc = make("t5", causal=True)
    q, k, v = _case_inputs(1, 19, 19, H)
    params = list(enc.parameters())
    assert torch.autograd.gradcheck(lambda *p: _attend(enc, True)(q, k, v, *p), params, eps=1e-6, atol=1e-6, fast_mode=True)


class _SavedByTheGraph(torch.autograd.graph.saved_tensors_hooks):
    """Records every tensor autograd saves; :meth:`alive` gives the sizes of those a live graph
    still holds (a tile's own graph, made and dropped inside the forward, is not counted)."""

    class _Box:
        def __init__(self, tensor):
            # detached: a box holding the tensor itself would hold its grad_fn, which holds
            # the box (a cycle through C++ that nothing collects)
            self.tensor, self.numel = tensor.detach(), tensor.numel()

    def __init__(self):
        self.boxes = []

        def pack(tensor):
            box = self._Box(tensor)
            self.boxes.append(weakref.ref(box))
            return box

        super().__init__(pack, lambda box: box.tensor)

    def __enter__(self):
        super().__enter__()
        return self

    def alive(self) -> list[int]:
        gc.collect()
        return [box().numel for box in self.boxes if box() is not None]


@pytest.mark.parametrize("name", ["t5", "fire", "fox"])
def test_saves_no_tensor_of_the_scores_size(name, monkeypatch):
    """What autograd keeps after the forward: tensors of O(B H T D) entries (q, k, v, the
    output, the log-sum-exp; FoX's gate projection), none with Tq Tk entries per head. The
    SDPA blocks it replaces keep each block's probabilities: H T^2 / 2 entries in all."""
    length, heads = 256, 4
    monkeypatch.setattr(tiling, "BLOCKED_TILE_ELEMENTS", heads * 16 * length)
    enc = make(name, causal=True, heads=heads, head_dim=8, dtype=torch.float32)
    q, k, v = (t.requires_grad_() for t in _case_inputs(1, length, length, heads, torch.float32, heads, 8))
    x = torch.randn(1, length, heads * 8) if "gate" in enc.hooks else None
    with _SavedByTheGraph() as kept:
        gates = enc.gate(x) if x is not None else None
        out = posenc.attention(q, k, v, enc, backend="blocked", gates=gates)
    sizes = kept.alive()
    out.sum().backward()
    assert q.grad is not None and all(p.grad is not None for p in enc.parameters())
    assert max(sizes) <= heads * length * 8
    assert sum(sizes) <= 12 * heads * length * 8, sizes


def test_the_saved_tensor_count_can_fail(monkeypatch):
    """The check above sees an O(T^2) graph: SDPA blocks under autograd (dropout keeps them)."""
    length, heads = 256, 4
    monkeypatch.setattr(tiling, "BLOCKED_TILE_ELEMENTS", heads * 16 * length)
    q = torch.randn(1, heads, length, 8, requires_grad=True)
    with _SavedByTheGraph() as kept:
        out = posenc.attention(q, q, q, make("t5", causal=True, heads=heads, head_dim=8, dtype=torch.float32),
                               backend="blocked", dropout_p=0.1)
    assert sum(kept.alive()) > heads * length * length / 2
    del out


def test_no_grad_calls_keep_the_sdpa_blocks(monkeypatch):
    """Inference is unchanged: one SDPA call per block, no autograd function."""
    monkeypatch.setattr(kernels, "CPU_KERNEL_ENABLED", False)  # the blocks themselves, not the fused CPU kernel
    calls = []
    blocked = __import__("posenc.attention.blocked", fromlist=["F"])
    real = blocked.F.scaled_dot_product_attention
    monkeypatch.setattr(blocked.F, "scaled_dot_product_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    q = torch.randn(1, H, 30, D)
    with torch.no_grad():
        posenc.attention(q, q, q, make("t5", causal=True, dtype=torch.float32), backend="blocked")
    assert len(calls) > 1
    calls.clear()
    posenc.attention(q.requires_grad_(), q, q, make("t5", causal=True, dtype=torch.float32), backend="blocked")
    assert not calls
