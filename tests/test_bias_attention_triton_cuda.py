"""The fused attention kernel with the bias inside, compiled for a GPU: the checks of
tests/test_bias_attention_triton.py at sizes the interpreter cannot afford (300 tokens, head
dimensions 64 and 128, grouped-query heads). Skipped without CUDA; the first step of the GPU
script (benchmarks/gpu.sh)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from test_bias_attention_triton import _check

FORMS = ("none", "rope", "alibi", "kerple_log", "kerple_power", "t5", "fox", "fire")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("name", FORMS)
def test_compiled_kernel_matches_float64(name, head_dim, dtype):
    assert _check(name, groups=2, dtype=dtype, tq=300, tk=300, device="cuda", head_dim=head_dim) is None


@pytest.mark.parametrize("name", ["alibi", "t5", "kerple_log"])
def test_compiled_kernel_bidirectional_and_a_cache_step(name):
    assert _check(name, causal=False, groups=4, positions="rows", tq=300, tk=300, device="cuda", head_dim=64) is None
    assert _check(name, positions="offset", tq=7, tk=300, device="cuda", head_dim=64) is None
