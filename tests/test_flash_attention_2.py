"""The FlashAttention-2 backend: where flash-attn is missing it names the reason; the argument
mapping (layout, slopes, sign, scale, causal alignment, grouped heads) against FlashAttention-2's
documented contract, written here in float64 from its docstring ("a bias of
(-alibi_slope * |i + seqlen_k - seqlen_q - j|) is added to the attention score of query i and
key j"); ALiBi's statement of its slopes; the CUDA column of the auto rule."""

from __future__ import annotations

import importlib
import math

import pytest
import torch

import posenc
from posenc.attention import flash_attention_2 as fa2
from posenc.masks import sliding_window_mask_mod

attention_module = importlib.import_module("posenc.attention")
H, D = 4, 8


def reference_flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, alibi_slopes=None):
    """FlashAttention-2's flash_attn_func as documented, in float64: q (B, Tq, H, D), k and v
    (B, Tk, H_kv, D); query head h reads key head h // (H / H_kv); causal bottom-right."""
    assert dropout_p == 0.0
    batch, tq, heads, dim = q.shape
    tk, kv_heads = k.shape[1], k.shape[2]
    scale = 1 / math.sqrt(dim) if softmax_scale is None else softmax_scale
    out = torch.empty(batch, tq, heads, v.shape[-1], dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            kh = h // (heads // kv_heads)
            for i in range(tq):
                logits = []
                for j in range(tk):
                    if causal and j > i + tk - tq:
                        logits.append(-math.inf)
                        continue
                    score = float(q[b, i, h].double() @ k[b, j, kh].double()) * scale
                    if alibi_slopes is not None:
                        score -= float(alibi_slopes[h]) * abs(i + tk - tq - j)
                    logits.append(score)
                out[b, i, h] = torch.softmax(torch.tensor(logits, dtype=torch.float64), 0) @ v[b, :, kh].double()
    return out


def test_without_flash_attn_the_backend_names_the_reason():
    if fa2.flash_attn_func() is not None:
        pytest.skip("flash-attn is installed here")
    reason = fa2.unsupported(posenc.create("alibi", num_heads=H))
    assert "needs the flash-attn package, which is not installed" in reason and "pip install flash-attn" in reason
    q = torch.randn(1, H, 4, D)
    with pytest.raises(ValueError, match="needs the flash-attn package"):
        posenc.attention(q, q, q, posenc.create("alibi", num_heads=H), backend="flash_attention_2")


@pytest.fixture
def fake_flash_attn(monkeypatch):
    """flash-attn "installed": its function is the documented reference."""
    monkeypatch.setattr(fa2, "flash_attn_func", lambda: reference_flash_attn_func)


def test_what_the_backend_serves(fake_flash_attn):
    assert fa2.unsupported(posenc.create("alibi", num_heads=H)) is None
    assert fa2.unsupported(posenc.create("rope", head_dim=D)) is None
    assert fa2.unsupported(None) is None
    assert "not T5RelativeBias's" in fa2.unsupported(posenc.create("t5", num_heads=H))
    assert "no content terms" in fa2.unsupported(posenc.create("shaw", head_dim=D))
    assert "does not take mask=" in fa2.unsupported(None, mask=torch.ones(1, 1, 1, 4, dtype=torch.bool))


@pytest.mark.parametrize("bidirectional", [False, True])
def test_alibi_states_its_slopes_where_its_bias_is_linear_in_the_distance(bidirectional):
    alibi = posenc.create("alibi", num_heads=6, bidirectional=bidirectional)
    i, j = torch.arange(9)[:, None], torch.arange(9)[None, :]
    for causal in (True, False):
        slopes = alibi.linear_bias_slopes(causal)
        if not causal and not bidirectional:
            assert slopes is None  # -m (i - j) is not -m |i - j| for keys after the query
            continue
        visible = (j <= i) if causal else torch.ones(9, 9, dtype=torch.bool)
        bias = alibi.bias(i, j, torch.arange(6)[:, None, None])
        linear = -slopes[:, None, None] * (i - j).abs()
        torch.testing.assert_close(bias[:, visible], linear[:, visible])
    for name in ("t5", "kerple", "fire"):
        assert posenc.create(name, num_heads=6).linear_bias_slopes(True) is None


CASES = [  # (Tq, Tk, H_kv, causal, bidirectional, scale)
    (6, 6, H, True, False, None),
    (3, 9, H, True, False, None),  # a KV cache: queries are the last keys
    (5, 5, 2, True, False, 0.3),   # grouped-query heads, a custom scale
    (4, 7, 1, False, True, None),  # bidirectional ALiBi without the causal mask
]


@pytest.mark.parametrize("tq, tk, kv_heads, causal, bidirectional, scale", CASES)
def test_argument_mapping_gives_posenc_alibi(tq, tk, kv_heads, causal, bidirectional, scale):
    alibi = posenc.create("alibi", num_heads=H, bidirectional=bidirectional)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, H, tq, D, generator=g)
    k, v = (torch.randn(2, kv_heads, tk, D, generator=g) for _ in range(2))
    kwargs = fa2.flash_attn_arguments(q, k, v, slopes=alibi.linear_bias_slopes(causal), causal=causal,
                                      scale=scale if scale is not None else 1 / math.sqrt(D))
    assert kwargs["q"].shape == (2, tq, H, D) and kwargs["k"].shape == (2, tk, kv_heads, D)
    assert kwargs["alibi_slopes"].dtype == torch.float32 and torch.equal(kwargs["alibi_slopes"], posenc.alibi_slopes(H))
    got = reference_flash_attn_func(**kwargs).transpose(1, 2)
    expected = posenc.attention(q.double(), k.double(), v.double(), alibi.double(), causal=causal, scale=scale,
                                backend="eager")
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


def test_positions_must_be_the_row_indices_up_to_a_shift():
    fa2.check_index_aligned(torch.arange(3, 8), torch.arange(8))
    fa2.check_index_aligned(torch.tensor([[10, 11], [3, 4]]), torch.tensor([[8, 9, 10, 11], [1, 2, 3, 4]]))  # per-row shifts
    for q_positions, k_positions in ((torch.arange(4), torch.arange(4) * 2),  # gaps
                                     (torch.tensor([0, 1, 0, 1]), torch.tensor([0, 1, 0, 1])),  # packed documents
                                     (torch.arange(3), torch.arange(5))):  # queries not at the end of the keys
        with pytest.raises(ValueError, match="needs consecutive positions with the queries at the end"):
            fa2.check_index_aligned(q_positions, k_positions)


def test_run_refuses_cpu_and_float32(fake_flash_attn):
    q = torch.randn(1, H, 4, D)
    with pytest.raises(ValueError, match="runs fp16 or bf16 CUDA tensors, got torch.float32 on cpu"):
        posenc.attention(q, q, q, posenc.create("alibi", num_heads=H), backend="flash_attention_2")


def test_auto_rule_on_cuda(monkeypatch):
    resolve = attention_module._resolve_backend
    cuda, small, large = torch.device("cuda"), 8 * 64 * 64, 8 * 1024 * 1024
    alibi, t5, rope = posenc.create("alibi", num_heads=8), posenc.create("t5", num_heads=8), posenc.create("rope", head_dim=8)
    bf16 = dict(dtype=torch.bfloat16, default_positions=True)
    monkeypatch.setattr(fa2, "flash_attn_func", lambda: None)  # not installed
    assert resolve("auto", alibi, small, cuda, **bf16) == "sdpa"
    assert resolve("auto", alibi, large, cuda, **bf16) == "flex"
    monkeypatch.setattr(fa2, "flash_attn_func", lambda: reference_flash_attn_func)  # installed
    assert resolve("auto", alibi, small, cuda, **bf16) == "flash_attention_2"
    assert resolve("auto", alibi, large, cuda, **bf16) == "flash_attention_2"
    assert resolve("auto", alibi, large, cuda, dtype=torch.float32, default_positions=True) == "flex"  # FA2: half only
    assert resolve("auto", alibi, large, cuda, dtype=torch.bfloat16) == "flex"  # positions given: not checked here
    assert resolve("auto", alibi, large, cuda, causal=False, **bf16) == "flex"  # causal-form ALiBi without the mask
    assert resolve("auto", t5, large, cuda, **bf16) == "blocked"  # T5's table learns: not on flex (its backward)
    with torch.no_grad():
        assert resolve("auto", t5, large, cuda, **bf16) == "flex"
    assert resolve("auto", t5, large, cuda, dropout_p=0.1, **bf16) == "blocked"
    assert resolve("auto", t5, small, cuda, **bf16) == "sdpa"
    assert resolve("auto", rope, large, cuda, **bf16) == "sdpa"
    assert resolve("auto", rope, small, cuda, mask=sliding_window_mask_mod(4), **bf16) == "flex"
    assert resolve("auto", posenc.create("shaw", head_dim=8), small, cuda, **bf16) == "eager"
    # the CPU rule does not look at any of it
    assert resolve("auto", alibi, small, torch.device("cpu"), **bf16) == "sdpa"
    assert resolve("auto", alibi, large, torch.device("cpu"), **bf16) == "blocked"
