"""A bias reaches SDPA in the query's dtype (issue 24, item 4): cuDNN's attention read a float32
mask as bfloat16 (a PyTorch bug, fixed in 2026), so posenc casts the summed float32 bias once,
after the sum, to q's dtype. Checked on the CPU by recording what SDPA receives."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc.attention import sdpa as sdpa_backend


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("name", ["alibi", "t5", "kerple", "fire"])
def test_the_bias_reaches_sdpa_in_the_query_dtype(monkeypatch, name, dtype):
    seen = []
    real = sdpa_backend.F.scaled_dot_product_attention

    def recording(q, k, v, attn_mask=None, **kwargs):
        seen.append(attn_mask.dtype if attn_mask is not None else None)
        return real(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(sdpa_backend.F, "scaled_dot_product_attention", recording)
    enc = posenc.create_for_model(name, d_model=64, num_heads=4, head_dim=16, max_positions=64, causal=True)
    q = torch.randn(1, 4, 12, 16).to(dtype)
    with torch.no_grad():
        out = posenc.attention(q, q, q, enc, backend="sdpa")
        expected = posenc.attention(q.double(), q.double(), q.double(), enc.double(), backend="eager")
    assert seen == [dtype] and out.dtype == dtype
    tol = {torch.float32: 1e-5, torch.bfloat16: 5e-2, torch.float16: 5e-3}[dtype]
    torch.testing.assert_close(out.double(), expected, rtol=tol, atol=tol)
