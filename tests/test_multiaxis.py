"""M-RoPE and axial RoPE (posenc.encodings.rope.multiaxis) against independent references.

- float64 loops written from the definitions (Qwen2-VL section 2.1 and Hugging Face's chunked /
  interleaved assignment; rotary-embedding-torch's ``get_axial_freqs`` + ``apply_rotary_emb``,
  reimplemented from its source's math: the package itself is not a dependency);
- Hugging Face transformers' Qwen2-VL / Qwen3-VL rotary embeddings, Qwen2-VL's vision rotary and
  ``get_rope_index`` of Qwen2-VL, Qwen2.5-VL and Qwen3-VL (skipped without transformers);
- properties: equal coordinates on every axis is plain RoPE; scores depend on the per-axis
  differences only; every positions form and backend gives the same attention.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

import posenc
from posenc.encodings.rope.multiaxis import AxialRoPE, MRoPE, mrope_axis_of_pair, mrope_position_ids

F64 = torch.float64


# -- independent references ----------------------------------------------------------------------
def rotate_pairs_reference(x, angle_of_pair, *, rotary_dim, pair_interleaved, factor=1.0):
    """x (T, D) float64, angle_of_pair(n, i) -> angle of pair i at token n; explicit loops."""
    out = x.clone()
    half = rotary_dim // 2
    for n in range(x.shape[0]):
        for i in range(half):
            a, b = (2 * i, 2 * i + 1) if pair_interleaved else (i, i + half)
            angle = angle_of_pair(n, i)
            c, s = math.cos(angle) * factor, math.sin(angle) * factor
            out[n, a] = float(x[n, a]) * c - float(x[n, b]) * s
            out[n, b] = float(x[n, b]) * c + float(x[n, a]) * s
    return out


def mrope_axis_reference(i, section, interleaved_sections):
    if not interleaved_sections:
        return 0 if i < section[0] else 1 if i < section[0] + section[1] else 2
    if i % 3 == 1 and i < 3 * section[1]:
        return 1
    if i % 3 == 2 and i < 3 * section[2]:
        return 2
    return 0


def mrope_reference(x, coords, *, section, interleaved_sections, base, rotary_dim, pair_interleaved=False):
    """coords: list of (t, h, w) per token."""
    def angle(n, i):
        return coords[n][mrope_axis_reference(i, section, interleaved_sections)] * base ** (-2 * i / rotary_dim)

    return rotate_pairs_reference(x, angle, rotary_dim=rotary_dim, pair_interleaved=pair_interleaved)


def axial_freqs_reference(dims, grid, *, freqs_for, theta=10000.0, max_freq=10.0):
    """rotary-embedding-torch's RotaryEmbedding(dim=d, freqs_for=...).get_axial_freqs(*grid) in
    float64: for each axis a, positions arange(N_a) (lang) or linspace(-1, 1, N_a) (pixel) times
    its d/2 frequencies, each repeated twice ("... n -> ... (n r)", r=2), the axes' blocks
    concatenated on the last dimension, broadcast over the grid -> (*grid, sum(dims))."""
    blocks = []
    for a, (d, n) in enumerate(zip(dims, grid)):
        if freqs_for == "lang":
            freqs = [1.0 / theta ** (2 * j / d) for j in range(d // 2)]
            pos = [float(p) for p in range(n)]
        else:
            freqs = [math.pi * (1.0 + (max_freq / 2 - 1.0) * j / (d // 2 - 1)) if d // 2 > 1 else math.pi
                     for j in range(d // 2)]
            pos = [-1.0 + 2.0 * p / (n - 1) if n > 1 else -1.0 for p in range(n)]
        table = torch.tensor([[p * f for f in freqs for _ in range(2)] for p in pos], dtype=F64)  # (N_a, d)
        shape = [1] * len(grid) + [d]
        shape[a] = n
        blocks.append(table.reshape(shape).expand(*grid, d))
    return torch.cat(blocks, dim=-1)


def apply_rotary_emb_reference(freqs, t):
    """rotary-embedding-torch's apply_rotary_emb (start_index 0): the first freqs.shape[-1]
    features rotate by pairs (2i, 2i+1) with cos/sin of freqs, the rest pass through."""
    rot = freqs.shape[-1]
    mid = t[..., :rot]
    x1, x2 = mid[..., 0::2], mid[..., 1::2]
    rotated_half = torch.stack((-x2, x1), dim=-1).flatten(-2)
    return torch.cat((mid * freqs.cos() + rotated_half * freqs.sin(), t[..., rot:]), dim=-1)


def scores(enc, q, k, q_pos, k_pos):
    qr, kr = enc.rotate(q, k, q_pos, k_pos)
    return qr @ kr.transpose(-2, -1)


# -- M-RoPE ---------------------------------------------------------------------------------------
MROPE_CASES = [
    dict(head_dim=16, mrope_section=[2, 3, 3]),
    dict(head_dim=16, mrope_section=[4, 2, 2], mrope_interleaved=True),
    dict(head_dim=16, mrope_section=[2, 3, 3], interleaved=True, base=1e6),
    dict(head_dim=20, rotary_dim=16, mrope_section=[4, 2, 2], mrope_interleaved=True, base=5e6),
]


@pytest.mark.parametrize("kwargs", MROPE_CASES + [dict(head_dim=16, scaling={"rope_type": "yarn", "factor": 4.0,
                                                                          "original_max_position_embeddings": 32})])
def test_mrope_with_equal_axes_is_plain_rope(kwargs):
    mrope = MRoPE(**kwargs).double()
    rope = posenc.create("rope", **{k: v for k, v in kwargs.items() if k in ("head_dim", "rotary_dim", "base",
                                                                              "interleaved", "scaling")}).double()
    q, k = torch.randn(2, 3, 9, kwargs["head_dim"], dtype=F64), torch.randn(2, 1, 9, kwargs["head_dim"], dtype=F64)
    pos = torch.tensor([[0, 1, 2, 3, 7, 8, 9, 30, 31], [5, 6, 7, 100, 101, 102, 103, 104, 1000]])
    want = rope.rotate(q, k, pos, pos)
    for form in (pos, pos.unsqueeze(0).expand(3, -1, -1)):  # one coordinate, or three equal ones
        got = mrope.rotate(q, k, form, form)
        torch.testing.assert_close(got[0], want[0], rtol=0, atol=1e-12)
        torch.testing.assert_close(got[1], want[1], rtol=0, atol=1e-12)


@pytest.mark.parametrize("kwargs", MROPE_CASES)
def test_mrope_matches_the_float64_loop(kwargs):
    enc = MRoPE(**kwargs).double()
    base, r = kwargs.get("base", 10000.0), kwargs.get("rotary_dim", kwargs["head_dim"])
    coords = [(0, 0, 0), (1, 1, 1), (2, 2, 2), (2, 2, 3), (2, 3, 2), (2, 3, 3), (50, 2, 2), (6, 6, 6), (7, 40, 9)]
    pos = torch.tensor(coords).t().unsqueeze(1)  # (3, 1, T)
    x = torch.randn(1, 1, len(coords), kwargs["head_dim"], dtype=F64)
    got, _ = enc.rotate(x, x, pos, pos)
    want = mrope_reference(x[0, 0], coords, section=kwargs["mrope_section"],
                           interleaved_sections=kwargs.get("mrope_interleaved", False), base=base, rotary_dim=r,
                           pair_interleaved=kwargs.get("interleaved", False))
    torch.testing.assert_close(got[0, 0], want, rtol=0, atol=1e-12)


def test_mrope_axis_assignment_known_layouts():
    # Qwen2-VL [16, 24, 24]: chunks; Qwen3-VL [24, 20, 20]: (T H W) x 20 then T T T T
    chunked = mrope_axis_of_pair([16, 24, 24]).tolist()
    assert chunked == [0] * 16 + [1] * 24 + [2] * 24
    interleaved = mrope_axis_of_pair([24, 20, 20], True).tolist()
    assert interleaved == [0, 1, 2] * 20 + [0] * 4
    assert mrope_axis_of_pair([4, 2, 2], True).tolist() == [0, 1, 2, 0, 1, 2, 0, 0]


@pytest.mark.parametrize("enc", [MRoPE(16, mrope_section=[2, 3, 3]), MRoPE(16, mrope_section=[4, 2, 2],
                                                                            mrope_interleaved=True)])
def test_mrope_scores_depend_on_the_per_axis_differences_only(enc):
    enc = enc.double()
    q, k = torch.randn(1, 2, 6, 16, dtype=F64), torch.randn(1, 2, 8, 16, dtype=F64)
    q_pos, k_pos = torch.randint(0, 40, (3, 1, 6)), torch.randint(0, 40, (3, 1, 8))
    base = scores(enc, q, k, q_pos, k_pos)
    shift = torch.tensor([7, 100, 3]).view(3, 1, 1)  # a different shift per axis
    torch.testing.assert_close(scores(enc, q, k, q_pos + shift, k_pos + shift), base, rtol=0, atol=1e-10)
    for axis in range(3):  # moving one axis of the keys alone changes the scores
        moved = k_pos.clone()
        moved[axis] += 1
        assert (scores(enc, q, k, q_pos, moved) - base).abs().max() > 1e-3


# -- M-RoPE against transformers --------------------------------------------------------------
def _hf_qwen2_vl():
    pytest.importorskip("transformers")
    return pytest.importorskip("transformers.models.qwen2_vl.modeling_qwen2_vl")


def _hf_text_config(module_name, config_name, head_dim, heads, rope_parameters):
    config_module = pytest.importorskip(module_name)
    return getattr(config_module, config_name)(hidden_size=head_dim * heads, num_attention_heads=heads,
                                               num_key_value_heads=heads, head_dim=head_dim,
                                               rope_parameters=rope_parameters)


def test_mrope_matches_transformers_qwen2_vl():
    hf = _hf_qwen2_vl()
    head_dim, section, theta = 16, [2, 3, 3], 1e6
    config = _hf_text_config("transformers.models.qwen2_vl.configuration_qwen2_vl", "Qwen2VLTextConfig", head_dim, 2,
                             {"rope_type": "default", "rope_theta": theta, "mrope_section": section})
    ids = torch.stack([mrope_position_ids([3, (1, 4, 6), 2, (2, 4, 4), 4]),
                       mrope_position_ids([1, (1, 8, 4), 14])], dim=1)  # (3, 2, 23): two rows
    q, k = torch.randn(2, 2, ids.shape[-1], head_dim), torch.randn(2, 2, ids.shape[-1], head_dim)
    cos, sin = hf.Qwen2VLRotaryEmbedding(config)(q, ids)
    if hasattr(hf, "apply_multimodal_rotary_pos_emb"):  # transformers 4.x: the sections are split here
        want = hf.apply_multimodal_rotary_pos_emb(q, k, cos, sin, section)
    else:  # transformers 5: the rotary embedding recomposes the sections itself
        want = hf.apply_rotary_pos_emb(q, k, cos, sin)
    got = MRoPE(head_dim, mrope_section=section, base=theta).rotate(q, k, ids, ids)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=1e-6)


def test_mrope_interleaved_matches_transformers_qwen3_vl():
    pytest.importorskip("transformers")
    hf = pytest.importorskip("transformers.models.qwen3_vl.modeling_qwen3_vl")
    head_dim, section, theta = 16, [4, 2, 2], 5e6
    config = _hf_text_config("transformers.models.qwen3_vl.configuration_qwen3_vl", "Qwen3VLTextConfig", head_dim, 2,
                             {"rope_type": "default", "rope_theta": theta, "mrope_section": section,
                              "mrope_interleaved": True})
    ids = mrope_position_ids([2, (1, 6, 4), 3, (1, 4, 4), 2]).unsqueeze(1)  # (3, 1, T)
    q, k = torch.randn(1, 2, ids.shape[-1], head_dim), torch.randn(1, 2, ids.shape[-1], head_dim)
    cos, sin = hf.Qwen3VLTextRotaryEmbedding(config)(q, ids)
    want = hf.apply_rotary_pos_emb(q, k, cos, sin)
    got = MRoPE(head_dim, mrope_section=section, mrope_interleaved=True, base=theta).rotate(q, k, ids, ids)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=1e-6)


# -- mrope_position_ids ---------------------------------------------------------------------------
def test_mrope_position_ids_known_values():
    # 2 text tokens, a 1 x 4 x 6 image merged 2 x 2 into a 2 x 3 grid, 2 text tokens
    ids = mrope_position_ids([2, (1, 4, 6), 2])
    assert ids.tolist() == [
        [0, 1, 2, 2, 2, 2, 2, 2, 5, 6],
        [0, 1, 2, 2, 2, 3, 3, 3, 5, 6],
        [0, 1, 2, 3, 4, 2, 3, 4, 5, 6],
    ]
    # Qwen2.5-VL absolute time: 3 temporal patches 1.5 position apart -> 0, 1, 3 (floored)
    video = mrope_position_ids([1, (3, 2, 2, 1.5)])
    assert video.tolist() == [[0, 1, 2, 4], [0, 1, 1, 1], [0, 1, 1, 1]]
    assert mrope_position_ids([]).shape == (3, 0) and mrope_position_ids([0, 3]).tolist() == [[0, 1, 2]] * 3


def position_ids_reference(segments, merge):
    """The paper's rule written as a loop: each segment starts at (largest position so far) + 1."""
    cols, start = [], 0
    for seg in segments:
        if isinstance(seg, int):
            cols += [(start + n,) * 3 for n in range(seg)]
        else:
            t, h, w = seg[:3]
            interval = seg[3] if len(seg) == 4 else 1.0
            cols += [(start + math.floor(a * interval), start + b, start + c)
                     for a in range(t) for b in range(h // merge) for c in range(w // merge)]
        if cols:
            start = max(max(c) for c in cols) + 1
    return torch.tensor(cols, dtype=torch.long).t().reshape(3, -1)


def test_mrope_position_ids_continue_after_the_largest_position_of_a_long_video():
    segments = [2, (6, 2, 2), 3, (4, 4, 4, 2.5), 2]  # temporal extent past the spatial one
    ids = mrope_position_ids(segments, spatial_merge_size=2)
    assert torch.equal(ids, position_ids_reference(segments, 2))
    assert ids[:, 8].tolist() == [8, 8, 8]  # after the video (t = 2..7): 7 + 1, not 2 + max(h, w)/2


class _RopeIndexHost:
    """Enough of a Qwen-VL model for transformers' get_rope_index: its config and helpers."""

    def __init__(self, model_cls, **vision):
        self.config = SimpleNamespace(vision_config=SimpleNamespace(**vision), **vision)
        self._cls = model_cls

    def __getattr__(self, name):
        return getattr(self._cls, name).__get__(self)


def _hf_inputs(segments, types):
    """input_ids (unused values) and mm_token_type_ids (0 text, 1 image, 2 video) for one row."""
    kinds = []
    for seg, kind in zip(segments, types):
        if isinstance(seg, int):
            kinds += [0] * seg
        else:
            t, h, w = seg[:3]
            kinds += [kind] * (t * (h // 2) * (w // 2))
    return torch.zeros(1, len(kinds), dtype=torch.long), torch.tensor([kinds], dtype=torch.int)


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl"])
def test_mrope_position_ids_match_transformers_get_rope_index(family):
    pytest.importorskip("transformers")
    module = pytest.importorskip(f"transformers.models.{family}.modeling_{family}")
    model_cls = module.Qwen2VLModel if family == "qwen2_vl" else module.Qwen2_5_VLModel
    # text, an image, text, a video, text, an image; temporal extents within the spatial ones
    # (where transformers 5.3+ and the paper's rule agree: see mrope_position_ids)
    images, videos = [(1, 4, 6), (1, 8, 4)], [(3, 8, 8)]
    second_per_grid, tokens_per_second = 0.75, 2  # Qwen2.5-VL: time interval 1.5 positions
    interval = second_per_grid * tokens_per_second if family == "qwen2_5_vl" else 1.0
    segments = [3, images[0], 2, (*videos[0], interval), 4, images[1], 1]
    types = [0, 1, 0, 2, 0, 1, 0]
    input_ids, mm_types = _hf_inputs(segments, types)
    host = _RopeIndexHost(model_cls, spatial_merge_size=2, tokens_per_second=tokens_per_second)
    kwargs = dict(image_grid_thw=torch.tensor(images), video_grid_thw=torch.tensor(videos))
    if family == "qwen2_5_vl":
        kwargs["second_per_grid_ts"] = torch.tensor([second_per_grid])
    want, _ = host.get_rope_index(input_ids, mm_types, **kwargs)
    assert torch.equal(mrope_position_ids(segments).unsqueeze(1), want)


def test_mrope_position_ids_match_transformers_qwen3_vl_frames():
    pytest.importorskip("transformers")
    module = pytest.importorskip("transformers.models.qwen3_vl.modeling_qwen3_vl")
    # Qwen3-VL: a video of 2 frames is two (1, h, w) grids with timestamp text between them
    segments = [2, (1, 4, 4), 3, (1, 4, 4), 3, (1, 4, 4), 1, (1, 6, 4), 2]
    types = [0, 2, 0, 2, 0, 2, 0, 1, 0]
    input_ids, mm_types = _hf_inputs(segments, types)
    host = _RopeIndexHost(module.Qwen3VLModel, spatial_merge_size=2)
    want, _ = host.get_rope_index(input_ids, mm_types, image_grid_thw=torch.tensor([[1, 6, 4]]),
                                  video_grid_thw=torch.tensor([[3, 4, 4]]))
    assert torch.equal(mrope_position_ids(segments).unsqueeze(1), want)


# -- axial RoPE -----------------------------------------------------------------------------------
def grid_coords(*grid):
    return torch.stack(torch.meshgrid(*(torch.arange(n) for n in grid), indexing="ij"), dim=-1).reshape(-1, len(grid))


AXIAL_TORCH_CASES = [
    dict(dims=[8, 8], grid=(3, 4), freqs_for="lang", head_dim=16),
    dict(dims=[4, 4], grid=(5, 3), freqs_for="lang", head_dim=12, theta=100.0),  # partial: 4 dims pass through
    dict(dims=[6, 6], grid=(4, 5), freqs_for="pixel", head_dim=12, max_freq=16.0),
    dict(dims=[4, 4, 4], grid=(2, 3, 4), freqs_for="pixel", head_dim=14),
    dict(dims=[4, 4, 4], grid=(3, 2, 2), freqs_for="lang", head_dim=12),
]


@pytest.mark.parametrize("case", AXIAL_TORCH_CASES)
def test_axial_matches_rotary_embedding_torch_get_axial_freqs(case):
    dims, grid = case["dims"], case["grid"]
    theta, max_freq = case.get("theta", 10000.0), case.get("max_freq", 10.0)
    freqs = axial_freqs_reference(dims, grid, freqs_for=case["freqs_for"], theta=theta, max_freq=max_freq)
    x = torch.randn(*grid, case["head_dim"], dtype=F64)
    want = apply_rotary_emb_reference(freqs, x).reshape(-1, case["head_dim"])
    enc = AxialRoPE(case["head_dim"], axial_dims=dims, interleaved=True, freqs_for=case["freqs_for"], base=theta,
                    max_freq=max_freq, grid_size=list(grid) if case["freqs_for"] == "pixel" else None).double()
    coords = grid_coords(*grid)  # (T, A), row-major as the reference's flattening
    pos = enc.check_positions(coords, length=coords.shape[0], batch=1)
    got, _ = enc.rotate(x.reshape(1, 1, -1, case["head_dim"]), x.reshape(1, 1, -1, case["head_dim"]), pos, pos)
    torch.testing.assert_close(got[0, 0], want, rtol=0, atol=1e-12)


def test_axial_pixel_known_values():
    # grid 5 x 5: index 2 is the coordinate 0 (no rotation); index 0 is -1 and 4 is +1, where
    # every pixel frequency pi * linspace(1, max_freq/2, .) with max_freq = 10 and 2 pairs per
    # axis is pi or 5 pi: cos = -1, sin = 0, so the rotated block is negated.
    enc = AxialRoPE(10, axial_dims=[4, 4], freqs_for="pixel", max_freq=10.0, grid_size=5).double()
    x = torch.randn(1, 1, 3, 10, dtype=F64)
    pos = torch.tensor([[[2, 0, 4]], [[2, 4, 0]]])  # axis-first (A=2, B=1, T=3): (2,2), (0,4), (4,0)
    got, _ = enc.rotate(x, x, pos, pos)
    torch.testing.assert_close(got[0, 0, 0], x[0, 0, 0], rtol=0, atol=1e-12)
    for n in (1, 2):
        torch.testing.assert_close(got[0, 0, n, :8], -x[0, 0, n, :8], rtol=0, atol=1e-12)
        torch.testing.assert_close(got[0, 0, n, 8:], x[0, 0, n, 8:], rtol=0, atol=0)


def test_axial_lang_matches_transformers_qwen2_vl_vision_rotary():
    hf = _hf_qwen2_vl()
    config_module = pytest.importorskip("transformers.models.qwen2_vl.configuration_qwen2_vl")
    head_dim, theta = 16, 10000.0
    config = config_module.Qwen2VLVisionConfig(embed_dim=head_dim * 2, num_heads=2)
    coords = grid_coords(6, 9)  # (T, 2): height, width of each patch
    cos, sin = hf.Qwen2VLVisionRotaryEmbedding(config)(torch.zeros(1), coords)
    q, k = torch.randn(coords.shape[0], 2, head_dim), torch.randn(coords.shape[0], 2, head_dim)  # (T, H, D)
    want_q, want_k = hf.apply_rotary_pos_emb_vision(q, k, cos, sin)
    enc = AxialRoPE(head_dim, base=theta)  # even split, half-split pairs: Qwen2-VL's vision tower
    pos = enc.check_positions(coords, length=coords.shape[0], batch=1)
    got_q, got_k = enc.rotate(q.transpose(0, 1)[None], k.transpose(0, 1)[None], pos, pos)
    torch.testing.assert_close(got_q[0].transpose(0, 1), want_q, rtol=0, atol=1e-6)
    torch.testing.assert_close(got_k[0].transpose(0, 1), want_k, rtol=0, atol=1e-6)


@pytest.mark.parametrize("enc", [
    AxialRoPE(16), AxialRoPE(18, axial_dims=[6, 4, 8]),
    AxialRoPE(12, num_axes=3, freqs_for="pixel", grid_size=[4, 8, 8], interleaved=True),
])
def test_axial_scores_depend_on_the_per_axis_differences_only(enc):
    enc = enc.double()
    a, d = enc.num_axes, enc.head_dim
    q, k = torch.randn(2, 2, 5, d, dtype=F64), torch.randn(2, 2, 7, d, dtype=F64)
    q_pos, k_pos = torch.randint(0, 8, (2, 5, a)), torch.randint(0, 8, (2, 7, a))
    form = lambda p: enc.check_positions(p, length=p.shape[1], batch=2)  # noqa: E731
    base = scores(enc, q, k, form(q_pos), form(k_pos))
    shift = torch.arange(3, 3 + 5 * a, 5)[:a]
    torch.testing.assert_close(scores(enc, q, k, form(q_pos + shift), form(k_pos + shift)), base, rtol=0, atol=1e-10)
    for axis in range(a):
        moved = k_pos.clone()
        moved[..., axis] += 1
        assert (scores(enc, q, k, form(q_pos), form(moved)) - base).abs().max() > 1e-3


def test_axial_one_coordinate_positions_mean_every_axis_equal():
    enc = AxialRoPE(12, num_axes=3).double()
    q = torch.randn(2, 2, 6, 12, dtype=F64)
    pos = torch.tensor([[0, 1, 2, 9, 10, 11], [4, 4, 5, 6, 7, 8]])
    got = enc.rotate(q, q, pos, pos)[0]
    same = enc.check_positions(pos.unsqueeze(-1).expand(-1, -1, 3), length=6, batch=2)
    torch.testing.assert_close(got, enc.rotate(q, q, same, same)[0], rtol=0, atol=0)


# -- positions forms, backends, cache, compile --------------------------------------------------
ATTENTION_CASES = [
    ("mrope", dict(mrope_section=[1, 1, 2]), lambda p: p, lambda p: p[:, :1]),  # (3, B, T), (3, 1, T)
    ("mrope", dict(mrope_section=[2, 1, 1], mrope_interleaved=False), lambda p: p, lambda p: p[:, 0]),  # (3, T)
    ("axial_rope", dict(), lambda p: p.permute(1, 2, 0), lambda p: p[:2, 0].t()),  # (B, T, 2), (T, 2)
]


@pytest.mark.parametrize("name, kwargs, per_row, shared", ATTENTION_CASES)
def test_every_positions_form_and_backend_gives_the_same_attention(name, kwargs, per_row, shared):
    enc = posenc.create_for_model(name, d_model=32, num_heads=4, head_dim=8, max_positions=64, **kwargs)
    axes = enc.position_axes
    q, k, v = (torch.randn(2, 4, 6, 8) for _ in range(3))
    coords = torch.randint(0, 20, (axes, 2, 6))  # axis-first, per row
    want_q, want_k = enc.rotate(q, k, coords, coords)
    reference = posenc.attention(want_q, want_k, v, None, backend="eager")
    for backend in ("eager", "sdpa", "blocked"):
        got = posenc.attention(q, k, v, enc, q_positions=per_row(coords), k_positions=per_row(coords), backend=backend)
        torch.testing.assert_close(got, reference, rtol=1e-5, atol=1e-5)
    same = coords[:, :1].expand(-1, 2, -1)  # one layout for both rows, given once
    want = posenc.attention(q, k, v, enc, q_positions=per_row(same), k_positions=per_row(same), backend="eager")
    got = posenc.attention(q, k, v, enc, q_positions=shared(same), k_positions=shared(same), backend="sdpa")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_multi_axis_kv_cache_step_equals_the_full_pass():
    enc = MRoPE(8, mrope_section=[1, 1, 2])
    ids = mrope_position_ids([2, (1, 4, 4), 2])  # (3, 8)
    q, k, v = (torch.randn(1, 2, 8, 8) for _ in range(3))
    full = posenc.attention(q, k, v, enc, q_positions=ids, k_positions=ids)
    step = posenc.attention(q[:, :, -1:], k, v, enc, q_positions=ids[:, -1:].unsqueeze(1), k_positions=ids)
    torch.testing.assert_close(step, full[:, :, -1:], rtol=1e-5, atol=1e-5)


def test_multi_axis_attention_traces_in_one_graph():
    enc = AxialRoPE(8)
    q, k, v = (torch.randn(2, 2, 6, 8) for _ in range(3))
    coords = torch.randint(0, 5, (2, 6, 2))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(lambda q, k, v, p: posenc.attention(q, k, v, enc, q_positions=p, k_positions=p),
                             backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v, coords),
                               posenc.attention(q, k, v, enc, q_positions=coords, k_positions=coords),
                               rtol=1e-5, atol=1e-5)
    assert sum(torch._dynamo.utils.counters["graph_break"].values()) == 0
    torch._dynamo.reset()


# -- positions shapes (bad arguments: tests/test_bad_inputs.py) ---------------------------------
def test_ambiguous_shapes_read_as_one_coordinate_per_token():
    # (3, T) with a batch of 3 is per-row positions; (3, 1, T) is the unambiguous M-RoPE form
    enc = MRoPE(8)
    pos = torch.randint(0, 9, (3, 4))
    assert enc.check_positions(pos, length=4, batch=3) is pos
    assert enc.check_positions(pos, length=4, batch=2).shape == (3, 1, 4)
