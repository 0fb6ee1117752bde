"""Edges of posenc.attention: empty batches and sequences, the NaN rule, float64 end to end
(gradcheck of every learned encoding), double backward."""

import contextlib

import pytest
import torch

import posenc
from conftest import HOOK_REPRESENTATIVES, attention_extras, make_encoding, slow_unless

NAMES = posenc.available()
ATTENTION_NAMES = [n for n in NAMES if "embed" not in posenc.encodings.encoding_class(n).hooks]
BACKENDS = ("eager", "sdpa", "blocked", "flex")
H, D = 4, 8



def _serves(enc, backend, mask=None) -> bool:
    from posenc.attention import _BACKENDS

    return _BACKENDS[backend].unsupported(enc, mask=mask) is None


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ATTENTION_NAMES)
@pytest.mark.parametrize("shape", [(2, H, 0, D), (0, H, 5, D)], ids=["T=0", "B=0"])
def test_empty_batch_or_sequence_gives_an_empty_output(name, backend, shape):
    enc = make_encoding(name)
    if not _serves(enc, backend):
        pytest.skip(f"{backend} does not serve {name}")
    q, k, v = (torch.randn(*shape, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out = posenc.attention(q, k, v, enc, backend=backend, **attention_extras(enc, shape[0], H, shape[2]))
    assert out.shape == shape and out.dtype == q.dtype
    out.sum().backward()  # still in the graph
    assert q.grad.shape == shape


def test_no_keys_non_causal_gives_zeros_and_nan_queries_stay_nan():
    q, k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 0, 4), torch.randn(1, 2, 0, 4)
    q[0, 1, 2, 0] = float("nan")
    out = posenc.attention(q, k, v, causal=False)
    assert out.shape == (1, 2, 3, 4)
    expected = torch.zeros(1, 2, 3, 4)
    expected[0, 1, 2] = float("nan")
    torch.testing.assert_close(out, expected, equal_nan=True)


def _nan_rows(out):
    return out.isnan().any(-1)  # (B, H, Tq)


#: flex evaluates FIRE's and KERPLE's learned score_mod eagerly on the CPU (5-10 s a case): behind
#: slow (-m slow runs them); on flex ALiBi and T5 keep the score bias by default, and every other
#: backend runs all encodings
FLEX_SLOW = ("fire", "kerple")


@pytest.mark.parametrize("name,backend", [
    slow_unless(not (backend == "flex" and name in FLEX_SLOW), name, backend, id=f"{name}-{backend}")
    for name in ["nope", *ATTENTION_NAMES[1:]] for backend in ["auto", *BACKENDS]])
def test_nan_rule(name, backend):
    """A NaN in a query, or in a key or value some row sees, makes exactly the rows that see it
    NaN; a key a row cannot see (causally hidden, or masked by mask=) never changes that row.
    Every backend alike."""
    enc = make_encoding(name)
    if backend != "auto" and not _serves(enc, backend):
        pytest.skip(f"{backend} does not serve {name}")
    B, T = 2, 7
    q, k, v = (torch.randn(B, H, T, D, dtype=torch.float64) for _ in range(3))
    extras = attention_extras(enc, B, H, T)

    def run(q, k, v, **kw):
        # torch's FlexAttention has no backward on the CPU: no gradient there (LieRE's learned
        # rotation would otherwise ask one of q and k)
        with torch.no_grad() if backend == "flex" else contextlib.nullcontext():
            return posenc.attention(q, k, v, enc, backend=backend, **kw, **extras)

    clean = run(q, k, v)
    # a NaN query: its own row only
    bad_q = q.clone()
    bad_q[1, 2, 3, 0] = float("nan")
    out = run(bad_q, k, v)
    expected = torch.zeros(B, H, T, dtype=torch.bool)
    expected[1, 2, 3] = True
    assert torch.equal(_nan_rows(out), expected)
    torch.testing.assert_close(out[~expected], clean[~expected])
    # a NaN key (then a NaN value) at j: the rows i >= j of that head, causally
    for which in ("k", "v"):
        j = 4
        tensors = {"k": k.clone(), "v": v.clone()}
        tensors[which][0, 1, j, 2] = float("nan")
        out = run(q, tensors["k"], tensors["v"])
        expected = torch.zeros(B, H, T, dtype=torch.bool)
        expected[0, 1, j:] = True
        assert torch.equal(_nan_rows(out), expected), which
        torch.testing.assert_close(out[~expected], clean[~expected])
    # a NaN key hidden by mask= (key padding of the last key) from every row: no effect at all
    if backend == "auto" or _serves(enc, backend, mask=torch.ones(1, 1, 1, T, dtype=torch.bool)):
        keep = torch.ones(B, 1, T, dtype=torch.bool)
        keep[:, :, T - 1] = False
        masked_clean = run(q, k, v, mask=keep)
        bad_k, bad_v = k.clone(), v.clone()
        bad_k[:, :, T - 1] = float("nan")
        bad_v[:, :, T - 1] = float("inf")
        out = run(q, bad_k, bad_v, mask=keep)
        assert not out.isnan().any()
        torch.testing.assert_close(out, masked_clean)


@pytest.mark.parametrize("backend", ["eager", "sdpa", "blocked"])
def test_nan_rule_with_grouped_query_heads(backend):
    q = torch.randn(1, 4, 5, 8)
    k, v = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    v[0, 1, 2, 0] = float("nan")  # key-value head 1 serves query heads 2 and 3
    out = posenc.attention(q, k, v, posenc.create("alibi", num_heads=4), backend=backend)
    expected = torch.zeros(1, 4, 5, dtype=torch.bool)
    expected[0, 2:, 2:] = True
    assert torch.equal(_nan_rows(out), expected)


# -- float64 end to end --------------------------------------------------------------------

class _Attend(torch.nn.Module):
    def __init__(self, enc):
        super().__init__()
        self.enc = enc

    def forward(self, q, k, v):
        return posenc.attention(q, k, v, self.enc)


LEARNED = ["t5", "kerple", "fire", "shaw", "transformer_xl", "cope"]


@pytest.mark.parametrize("name", LEARNED)
def test_gradcheck_float64_through_attention(name):
    enc = make_encoding(name, d_model=8, num_heads=2)
    if name == "kerple":
        with torch.no_grad():  # away from the clamp at eps, where the finite difference would be cut
            enc.bias_p.uniform_(0.5, 1.5)
            enc.bias_a.uniform_(0.5, 1.0)
    module = _Attend(enc)
    names = [n for n, _ in module.named_parameters()]
    params = [p.detach().clone().requires_grad_() for _, p in module.named_parameters()]
    q, k, v = (torch.randn(1, 2, 4, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))

    def f(q, k, v, *params):
        out = torch.func.functional_call(module, dict(zip(names, params)), (q, k, v))
        assert out.dtype == torch.float64
        return out

    assert torch.autograd.gradcheck(f, (q, k, v, *params))


class _Embed(torch.nn.Module):
    def __init__(self, enc, positions):
        super().__init__()
        self.enc, self.positions = enc, positions

    def forward(self, x):
        return self.enc.embed(x, self.positions)


def test_gradcheck_float64_learned_embed():
    module = _Embed(make_encoding("learned", d_model=4, max_positions=8), torch.tensor([0, 2, 3, 5, 7]))
    weight = module.enc.weight.detach().clone().requires_grad_()
    x = torch.randn(2, 5, 4, dtype=torch.float64, requires_grad=True)

    def f(x, weight):
        out = torch.func.functional_call(module, {"enc.weight": weight}, (x,))
        assert out.dtype == torch.float64
        return out

    assert torch.autograd.gradcheck(f, (x, weight))


@pytest.mark.parametrize("name", LEARNED + ["alibi"])
def test_float64_bias_and_content_terms_are_float64(name):
    enc = make_encoding(name)  # .double() in the fixture
    pos = torch.arange(6)
    if "score_bias" in enc.hooks:
        assert enc.score_bias(pos, pos).dtype == torch.float64
    else:
        q = torch.randn(1, H, 6, D, dtype=torch.float64)
        assert enc.content_scores(q, q, pos, pos).dtype == torch.float64


def test_sinusoidal_embed_float64_is_the_float64_formula():
    enc = posenc.create("sinusoidal", dim=8)
    x = torch.zeros(1, 3, 8, dtype=torch.float64)
    positions = torch.tensor([1, 1000, 123456])
    i = torch.arange(0, 8, 2, dtype=torch.float64)
    angles = positions.double()[:, None] / 10000.0 ** (i / 8)
    expected = torch.stack((angles.sin(), angles.cos()), -1).flatten(-2)
    torch.testing.assert_close(enc.embed(x, positions)[0], expected, rtol=0, atol=1e-15)


# -- double backward -----------------------------------------------------------------------

@pytest.mark.parametrize("name,backend", [  # sdpa: one encoding per hook by default (-m slow: all)
    slow_unless(backend == "eager" or name in HOOK_REPRESENTATIVES, name, backend, id=f"{name}-{backend}")
    for name in ATTENTION_NAMES for backend in ["eager", "sdpa"]])
def test_double_backward(name, backend):
    """Second derivatives (gradient penalties, Hessian-vector products) on the eager backend,
    and on "sdpa" under torch's math kernel: the fused SDPA kernels' backward has no derivative
    (torch's limit), so a user who needs one selects the math kernel (docs/precision.md)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    enc = make_encoding(name)
    if not _serves(enc, backend):
        pytest.skip(f"{backend} does not serve {name}")
    q, k, v = (torch.randn(2, H, 6, D, dtype=torch.float64, requires_grad=True) for _ in range(3))
    extras = attention_extras(enc, 2, H, 6)
    with sdpa_kernel(SDPBackend.MATH):
        out = posenc.attention(q, k, v, enc, backend=backend, **extras)
        grads = torch.autograd.grad(out.pow(2).sum(), (q, k, v), create_graph=True)
        penalty = sum(g.pow(2).sum() for g in grads)
        penalty.backward()
        assert all(x.grad is not None and torch.isfinite(x.grad).all() for x in (q, k, v))
        # the second derivative is the float64 one: a finite difference of the first agrees
        assert torch.autograd.gradgradcheck(
            lambda q: posenc.attention(q, k.detach(), v.detach(), enc, backend=backend, **extras), (q.detach().requires_grad_(),),
            fast_mode=True)  # a random projection of the Jacobian (the whole one: 18x the time here)
