"""VideoRoPE (encodings/rope/videorope.py) against float64 re-implementations of the official code
(Wiselnn570/VideoRoPE ``videorope-transformer/modeling_videorope.py`` @309f5c8:
``apply_m_modify_multimodal_rotary_pos_emb`` and ``get_t_scale_rope_index``), RoPE on text, and
relative in every axis."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc.encodings import VideoRoPE, videorope_position_ids
from posenc.errors import InvalidArgument


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def official_rotation(q, position_ids, mrope_section, base):
    """The official forward, float64: Qwen2-VL's (3, B, T, D) cos/sin (``cat(freqs, freqs)``), then
    its loop over the reversed sections [h + w, t, h + w, t]: entries of an (h + w) run read height
    at even j and width at odd j, those of a t run read time."""
    dim = q.shape[-1]
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    freqs = position_ids[..., None].double() * inv_freq  # (3, B, T, D/2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    sections = [mrope_section[0], mrope_section[1] + mrope_section[2]] * 2
    index, cos_parts, sin_parts = 0, [], []
    for i, section in enumerate(sections[::-1]):
        if i % 2 == 0:
            for j in range(section):
                row = 1 if j % 2 == 0 else 2
                cos_parts.append(cos[row, ..., index:index + 1])
                sin_parts.append(sin[row, ..., index:index + 1])
                index += 1
        else:
            cos_parts.append(cos[0, ..., index:index + section])
            sin_parts.append(sin[0, ..., index:index + section])
            index += section
    cos, sin = torch.cat(cos_parts, -1).unsqueeze(1), torch.cat(sin_parts, -1).unsqueeze(1)
    return q * cos + rotate_half(q) * sin


def official_position_ids(text_before, grid, text_after, scale, merge):
    """``get_t_scale_rope_index`` for one row [text, video, text], as written there."""
    pieces = [torch.arange(text_before).view(1, -1).expand(3, -1)]
    t, h, w = grid[0], grid[1] // merge, grid[2] // merge
    t_index = torch.arange(t).view(-1, 1).expand(-1, h * w).flatten()
    h_index = torch.arange(h).view(1, -1, 1).expand(t, -1, w).flatten() - (h - 1) // 2
    w_index = torch.arange(w).view(1, 1, -1).expand(t, h, -1).flatten() - (w - 1) // 2
    t_index = t_index * scale + text_before
    pieces.append(torch.stack([t_index, h_index + t_index, w_index + t_index]))
    st_idx = pieces[-1][0].max() + 1
    pieces.append(torch.arange(text_after).view(1, -1).expand(3, -1) + st_idx)
    return torch.cat(pieces, dim=1)


@pytest.mark.parametrize("section,head_dim", [([16, 24, 24], 128), ([2, 3, 3], 16)])
def test_rotation_equals_the_official_forward(section, head_dim):
    position_ids = torch.stack([official_position_ids(3, (3, 4, 6), 2, 2, 2),
                                official_position_ids(1, (3, 6, 4), 4, 3, 2)], dim=1)  # (3, 2, T)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 2, position_ids.shape[-1], head_dim, generator=g, dtype=torch.float64)
    enc = VideoRoPE(head_dim, mrope_section=section, base=10000.0)
    got, _ = enc.rotate(q, q, position_ids, position_ids)
    torch.testing.assert_close(got, official_rotation(q, position_ids, section, 10000.0), rtol=0, atol=1e-12)
    # M-RoPE's chunked layout on the same positions is another rotation
    mrope, _ = posenc.create("mrope", head_dim=head_dim, mrope_section=section).rotate(q, q, position_ids, position_ids)
    assert (mrope - got).abs().max() > 1e-2


@pytest.mark.parametrize("before,grid,after,stride", [(3, (2, 4, 6), 2, 2), (1, (3, 6, 4), 4, 3), (5, (1, 2, 2), 1, 1)])
def test_position_ids_equal_the_official_diagonal_layout(before, grid, after, stride):
    got = videorope_position_ids([before, grid, after], temporal_stride=stride)
    torch.testing.assert_close(got, official_position_ids(before, grid, after, stride, 2), rtol=0, atol=0)


def test_on_text_it_is_rope_and_scores_are_relative_per_axis():
    enc = VideoRoPE(32)
    g = torch.Generator().manual_seed(1)
    q, k = (torch.randn(1, 2, 10, 32, generator=g, dtype=torch.float64) for _ in range(2))
    text = torch.arange(10)
    rope_q, rope_k = posenc.create("rope", head_dim=32).rotate(q, k, text, text)
    got_q, got_k = enc.rotate(q, k, text, text)
    torch.testing.assert_close(got_q, rope_q, rtol=0, atol=1e-12)
    torch.testing.assert_close(got_k, rope_k, rtol=0, atol=1e-12)
    positions = videorope_position_ids([2, (2, 4, 4), 0]).unsqueeze(1)  # (3, 1, 10)
    shift = torch.tensor([7, 3, 11]).view(3, 1, 1)

    def scores(p):
        a, b = enc.rotate(q, k, p, p)
        return a @ b.transpose(-1, -2)

    torch.testing.assert_close(scores(positions + shift), scores(positions), rtol=0, atol=1e-10)


def test_bad_inputs():
    with pytest.raises(InvalidArgument, match=r"equal sizes, got \[4, 3, 5\]"):
        VideoRoPE(24, mrope_section=[4, 3, 5])
    with pytest.raises(InvalidArgument, match="temporal_stride must be an integer >= 1"):
        videorope_position_ids([1, (1, 2, 2)], temporal_stride=0)
    with pytest.raises(InvalidArgument, match=r"start at -1 < 0.*put text before it"):
        videorope_position_ids([(1, 6, 6)])
    with pytest.raises(InvalidArgument, match="not a time_interval"):
        videorope_position_ids([1, (2, 2, 2, 0.5)])
    assert VideoRoPE(128).mrope_section == [16, 24, 24] and VideoRoPE(16).mrope_section == [2, 3, 3]
