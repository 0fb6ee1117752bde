"""On a CUDA device (skipped without one): the flex backend, compiled, forward and backward
(q, k, v and every learned bias parameter) against eager in float32, with a mask_mod; one graph
for every length; FlashAttention-2's ALiBi against eager where flash-attn is installed; the
auto rule's CUDA picks running. What the CPU tests cannot reach: torch's CPU FlexAttention has
no backward for q, k, v."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc.attention import flash_attention_2, flex
from posenc.masks import document_mask_mod

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
H, D = 4, 32
BIAS_ENCODINGS = [name for name, cls in posenc.REGISTRY.items() if "score_bias" in cls.hooks]


def make(name):
    torch.manual_seed(0)
    enc = posenc.create_for_model(name, d_model=H * D, num_heads=H, head_dim=D, max_positions=4096, causal=True)
    with torch.no_grad():
        for p in enc.parameters():
            p.normal_()
    return enc.cuda()


@pytest.mark.parametrize("name", BIAS_ENCODINGS)
def test_compiled_flex_forward_and_backward_equal_eager(name):
    g = torch.Generator(device="cuda").manual_seed(1)
    q0, k0, v0 = (torch.randn(2, H, 300, D, device="cuda", generator=g) for _ in range(3))
    docs = torch.arange(300, device="cuda") // 70
    results = {}
    for backend, mask in (("eager", posenc.masks.document_mask(docs)), ("flex", document_mask_mod(docs))):
        enc = make(name)
        q, k, v = (t.clone().requires_grad_() for t in (q0, k0, v0))
        out = posenc.attention(q, k, v, enc, mask=mask, backend=backend)
        out.backward(torch.linspace(-1, 1, out.numel(), device="cuda").view_as(out))
        results[backend] = [out, q.grad, k.grad, v.grad] + [p.grad for p in enc.parameters()]
    for got, expected in zip(results["flex"], results["eager"], strict=True):
        torch.testing.assert_close(got, expected, rtol=2e-3, atol=2e-3)


def test_one_graph_for_every_length():
    torch._dynamo.utils.counters.clear()
    flex._compiled.clear()
    enc = make("alibi")
    graphs = []
    with torch.no_grad():
        for length in (256, 384, 1000, 2048):
            q = torch.randn(1, H, length, D, device="cuda", dtype=torch.bfloat16)
            posenc.attention(q, q, q, enc, backend="flex")
            graphs.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    assert graphs == [graphs[0]] * 4, graphs


@pytest.mark.skipif(flash_attention_2.flash_attn_func() is None, reason="flash-attn not installed")
@pytest.mark.parametrize("tq, tk, kv_heads", [(256, 256, H), (64, 512, 2)])
def test_flash_attention_2_alibi_equals_eager(tq, tk, kv_heads):
    alibi = posenc.create("alibi", num_heads=H).cuda()
    q = torch.randn(2, H, tq, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, kv_heads, tk, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    out = posenc.attention(q, k, v, alibi, backend="flash_attention_2")
    expected = posenc.attention(q.float(), k.float(), v.float(), alibi, backend="eager")
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2)
    assert posenc.attention(q, k, v, alibi).shape == out.shape  # auto picks it here


def test_auto_on_cuda_runs_every_bias_encoding_in_bf16():
    for name in BIAS_ENCODINGS:
        q = torch.randn(1, H, 2048, D, device="cuda", dtype=torch.bfloat16)  # 16M bias entries: flex
        out = posenc.attention(q, q, q, make(name).to(torch.float32))
        assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
