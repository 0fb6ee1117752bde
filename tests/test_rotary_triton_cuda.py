"""The fused RoPE kernel compiled and run on CUDA: the interpreter tests' checks at a larger
size, on the GPU. Skipped without CUDA or triton (tests/test_rotary_triton.py runs the same
kernels on the CPU through Triton's interpreter)."""

from __future__ import annotations

import importlib
import os

import pytest
import torch

pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import posenc  # noqa: E402
import posenc.kernels as kernels  # noqa: E402
from rotary_kernel_reference import angles64, assert_rounded, case, frequencies, rotate64  # noqa: E402

DEVICE = "cuda"


@pytest.fixture(scope="module")
def rt():
    """The compiled kernels (re-imported if an interpreter test built them for the interpreter)."""
    saved = os.environ.pop("TRITON_INTERPRET", None)
    module = importlib.import_module("posenc.kernels.rotary_triton")
    if module._interpreted():
        module = importlib.reload(module)
    yield module
    if saved is not None:
        os.environ["TRITON_INTERPRET"] = saved


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64], ids=str)
@pytest.mark.parametrize("interleaved", [False, True], ids=["half-split", "interleaved"])
@pytest.mark.parametrize("rotary_dim", [128, 64], ids=["full", "partial"])
def test_fused_matches_float64_within_rounding(rt, dtype, interleaved, rotary_dim):
    q, k, q_pos, k_pos = case(dtype, B=2, H=32, H_kv=8, Tq=300, Tk=333, D=128, device=DEVICE)
    inv_freq, factor = frequencies(rotary_dim).to(DEVICE), 1.25
    q2, k2 = rt.fused_rope(q, k, q_pos, k_pos, inv_freq, interleaved=interleaved, attention_factor=factor)
    assert_rounded(q2, rotate64(q, angles64(q_pos, inv_freq), interleaved, factor), q, interleaved, rotary_dim, dtype, factor)
    assert_rounded(k2, rotate64(k, angles64(k_pos, inv_freq), interleaved, factor), k, interleaved, rotary_dim, dtype, factor)


def test_mrope_strided_in_place_and_backward(rt):
    q, k, _, _ = case(torch.bfloat16, B=2, H=8, H_kv=2, Tq=64, Tk=64, D=64, device=DEVICE)
    positions = torch.randint(0, 5000, (3, 2, 64), device=DEVICE)
    pair_axis = torch.tensor([0] * 8 + [1] * 12 + [2] * 12, device=DEVICE)
    inv_freq = frequencies(64, base=1e6).to(DEVICE)
    q_base = q.transpose(1, 2).contiguous().requires_grad_(False)
    expected = rotate64(q, angles64(positions, inv_freq, pair_axis), False)
    rt.fused_rope(q_base.transpose(1, 2), k, positions, positions, inv_freq, pair_axis=pair_axis, inplace=True)
    assert_rounded(q_base.transpose(1, 2), expected, q, False, 64, torch.bfloat16)
    qg = q.clone().requires_grad_(True)
    out, _ = rt.fused_rope(qg, k, positions, positions, inv_freq, pair_axis=pair_axis)
    g = torch.randn_like(out)
    (grad,) = torch.autograd.grad(out, qg, g)
    assert_rounded(grad, rotate64(g, angles64(positions, inv_freq, pair_axis), False, inverse=True), g, False, 64, torch.bfloat16)


def test_rope_and_apply_rotary_use_the_kernel_on_cuda(rt):
    assert kernels.use_triton(torch.zeros(1, device=DEVICE))
    rope = posenc.create("rope", head_dim=64, scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64})
    q, k, q_pos, k_pos = case(torch.bfloat16, H=4, H_kv=2, Tq=50, Tk=60, D=64, device=DEVICE)
    q2, k2 = rope.rotate(q, k, q_pos, k_pos)
    kernels.TRITON_ENABLED = False
    try:
        q_ref, _ = rope.rotate(q, k, q_pos, k_pos)
    finally:
        kernels.TRITON_ENABLED = True
    expected = rotate64(q, angles64(q_pos, rope._inv_freq_f64.to(DEVICE)), False, rope.attention_factor)
    assert_rounded(q2, expected, q, False, 64, torch.bfloat16, rope.attention_factor)
    assert_rounded(q_ref, expected, q, False, 64, torch.bfloat16, rope.attention_factor)
    expected_k = rotate64(k, angles64(k_pos, rope._inv_freq_f64.to(DEVICE)), False, rope.attention_factor)
    assert_rounded(k2, expected_k, k, False, 64, torch.bfloat16, rope.attention_factor)
    cos, sin = rope.cos_sin(k_pos)  # the table kernel (xPos and user tables take this path)
    assert_rounded(posenc.apply_rotary(k, cos, sin), expected_k, k, False, 64, torch.bfloat16, rope.attention_factor)
