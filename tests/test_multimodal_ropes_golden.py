"""M-RoPE, Qwen3-VL's interleaved M-RoPE, MHRoPE and Qwen3.5's partial interleaved M-RoPE against
the golden tensors of JJJYmmm/Multimodal-RoPEs @cd413b9 (``tests/golden/qwen3vl_rope_hf4571.pt``,
made with transformers 4.57.1; MIT License, Copyright (c) 2025 Qwen Team, Alibaba Group): a
subset kept in tests/data/multimodal_ropes_golden.pt (its ``source`` says which).

Each golden entry holds the position ids (3, 1, T) its index function gave and the cos/sin
tables of its rotary embedding: posenc builds its tables from those same ids. The tolerance is
the golden's own float32 noise: transformers forms the angle position x inv_freq in float32
(posenc in float64), off by up to |angle| x 2^-24 ~ 1.7e-6 at the 29 tokens' positions (< 23).
VideoRoPE is not compared: Multimodal-RoPEs' unified version lays out its pairs otherwise than the
official code posenc follows (docs/encodings.md, "videorope")."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import posenc
from posenc.encodings.rope.rotary import cos_sin_table

GOLDEN = torch.load(Path(__file__).parent / "data" / "multimodal_ropes_golden.pt", weights_only=True)["expected"]
TOLERANCE = 4e-6


def _tables(name: str):
    """posenc's cos, sin for the golden entry ``name``, in its shape."""
    entry = GOLDEN[name]
    positions = entry["position_ids"]
    if name == "vanilla-rope":
        return posenc.create("rope", head_dim=128, base=5e6).cos_sin(positions[0])
    if name == "mrope":
        return posenc.MRoPE(128, mrope_section=[16, 24, 24], base=5e6).cos_sin(positions)
    if name == "mrope-interleave":
        return posenc.MRoPE(128, mrope_section=[24, 20, 20], mrope_interleaved=True, base=5e6).cos_sin(positions)
    if name == "mhrope":
        enc = posenc.MHRoPE(128, 8, mrope_section=[2, 3, 3], base=5e6)
        cos, sin = cos_sin_table(enc.head_angles(positions), 1.0, False, torch.float32)
        return cos[:, entry["heads"]], sin[:, entry["heads"]]
    if name == "qwen35":  # Qwen3.5: head_dim 256, partial_rotary_factor 0.25, interleaved [11, 11, 10]
        enc = posenc.MRoPE(256, rotary_dim=64, mrope_section=[11, 11, 10], mrope_interleaved=True, base=1e7)
        return enc.cos_sin(positions)
    raise AssertionError(name)


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_tables_equal_the_golden(name):
    cos, sin = _tables(name)
    want_cos, want_sin = GOLDEN[name]["cos"], GOLDEN[name]["sin"]
    assert cos.shape == want_cos.shape and sin.shape == want_sin.shape
    assert (cos - want_cos).abs().max() < TOLERANCE and (sin - want_sin).abs().max() < TOLERANCE


def test_the_check_sees_the_other_layout():
    """Chunked sections where the golden interleaves (and the reverse) are far off."""
    positions = GOLDEN["mrope-interleave"]["position_ids"]
    chunked, _ = posenc.MRoPE(128, mrope_section=[24, 20, 20], base=5e6).cos_sin(positions)
    assert (chunked - GOLDEN["mrope-interleave"]["cos"]).abs().max() > 0.1
    interleaved, _ = posenc.MRoPE(128, mrope_section=[22, 21, 21], mrope_interleaved=True, base=5e6).cos_sin(
        GOLDEN["mrope"]["position_ids"])
    assert (interleaved - GOLDEN["mrope"]["cos"]).abs().max() > 0.1
