"""torch.compile: posenc.attention traces as one graph (fullgraph=True) on every backend, and the
LM trains compiled with no graph break, no recompile for a new length (dynamic=True), and
the eager loss. Graph breaks and graphs are counted (torch._dynamo.utils.counters) so that
a regression cannot hide behind a silent fallback. Dynamo runs with the "eager" and
"aot_eager" backends (tracing and autograd as inductor sees them, without its C++ compile
time); no timing is asserted."""

import contextlib
import warnings

import pytest
import torch
import torch.nn.functional as F

import posenc
from conftest import HOOK_REPRESENTATIVES, attention_extras, make_encoding, slow_unless
from posenc.lab.model import LMConfig, TransformerLM

torch._dynamo.config.cache_size_limit = 64

ATTENTION_NAMES = [n for n in posenc.available() if "embed" not in posenc.encodings.encoding_class(n).hooks]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


def _graph_breaks() -> int:
    return sum(torch._dynamo.utils.counters["graph_break"].values())


def _graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("name,backend", [  # eager: every encoding; the others one per hook (-m slow: all)
    slow_unless(backend == "eager" or name in HOOK_REPRESENTATIVES, name, backend, id=f"{name}-{backend}")
    for name in ATTENTION_NAMES for backend in ["eager", "sdpa", "blocked", "flex"]])
def test_attention_traces_in_one_graph(name, backend):
    enc = make_encoding(name).float()
    from posenc.attention import _BACKENDS

    if _BACKENDS[backend].unsupported(enc, mask=None) is not None:
        pytest.skip(f"{backend} does not serve {name}")
    q, k, v = (torch.randn(2, 4, 12, 8) for _ in range(3))
    extras = attention_extras(enc, 2, 4, 12, dtype=torch.float32)
    compiled = torch.compile(lambda q, k, v: posenc.attention(q, k, v, enc, backend=backend, **extras),
                             backend="eager", fullgraph=True)
    # torch's FlexAttention has no backward on the CPU: no gradient there (a learned rotation,
    # LieRE's, would otherwise ask one of q and k)
    with warnings.catch_warnings(), torch.no_grad() if backend == "flex" else contextlib.nullcontext():
        warnings.simplefilter("ignore")
        got = compiled(q, k, v)
        want = posenc.attention(q, k, v, enc, backend=backend, **extras)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert _graph_breaks() == 0


def _train_step(model, tokens):
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    return loss.detach(), grads


#: one encoding per kind of hook the LM compiles through (rotate, score bias, a learned bias
#: network, content, gate); the others behind ``slow`` (the suite's time budget), run by
#: ``pytest -m slow``
COMPILED_BY_DEFAULT = ("rope", "alibi", "fire", "shaw", "fox")


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in COMPILED_BY_DEFAULT else (pytest.mark.slow,))
                                  for n in posenc.available()])
def test_lm_trains_compiled_without_breaks_or_recompiles(name):
    torch.manual_seed(0)
    model = TransformerLM(LMConfig(vocab_size=32, d_model=16, num_layers=1, num_heads=2, max_positions=64), name)
    compiled = torch.compile(model, backend="aot_eager", dynamic=True)
    graphs = []
    for length in (9, 14):  # two lengths: the second must reuse the first graph
        tokens = torch.randint(0, 32, (2, length + 1))
        loss, grads = _train_step(model, tokens)
        compiled_loss, compiled_grads = _train_step(compiled, tokens)
        torch.testing.assert_close(compiled_loss, loss, rtol=1e-5, atol=1e-5)
        for a, b in zip(compiled_grads, grads):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        graphs.append(_graphs())
    assert _graph_breaks() == 0, dict(torch._dynamo.utils.counters["graph_break"])
    assert graphs == [1, 1], f"graphs after each length: {graphs} (a new length recompiled)"
