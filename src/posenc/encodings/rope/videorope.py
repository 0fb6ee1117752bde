"""VideoRoPE (Wei et al. 2025, "VideoRoPE: What Makes for Good Video Rotary Position
Embedding?", arXiv 2502.05173): M-RoPE with the temporal axis on the *lowest*
frequencies (low-frequency temporal allocation, LTA), height and width alternating over the
high ones, and video positions laid on the diagonal of text's (diagonal layout, DL) with an
adjustable temporal step (ATS)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from posenc.encodings.rope.multiaxis import MRoPE, _vision_segment
from posenc.errors import InvalidArgument


def videorope_axis_of_pair(mrope_section: Sequence[int]) -> Tensor:
    """The axis (0 temporal, 1 height, 2 width) of each frequency pair, int64 (sum(section),):
    pairs 0 .. 2 s_h - 1 alternate height (even) and width (odd), the last s_t pairs (the lowest
    frequencies) are temporal: H W H W ... T T T (the official ``apply_m_modify_multimodal_rotary_pos_emb``,
    Wiselnn570/VideoRoPE ``videorope-transformer/modeling_videorope.py`` @309f5c8, section
    [16, 24, 24]: 48 pairs H W, 16 T).

    Raises:
        ValueError: height and width of different sizes (they alternate pair by pair).
    """
    temporal, height, width = (int(s) for s in mrope_section)
    if height != width:
        raise InvalidArgument(f"VideoRoPE alternates height and width pair by pair: mrope_section must give them "
                              f"equal sizes, got {list(mrope_section)}")
    spatial = torch.arange(height + width) % 2 + 1
    return torch.cat((spatial, torch.zeros(temporal, dtype=torch.long)))


def _videorope_default_section(num_pairs: int) -> list[int]:
    """A quarter of the pairs (rounded so height and width are equal) temporal: [16, 24, 24] of 64."""
    spatial = (num_pairs - num_pairs // 4) // 2
    return [num_pairs - 2 * spatial, spatial, spatial]


class VideoRoPE(MRoPE):
    """VideoRoPE's frequency allocation (arXiv 2502.05173: LTA, DL and ATS; the official
    Wiselnn570/VideoRoPE ``videorope-transformer/modeling_videorope.py`` @309f5c8): M-RoPE
    (:class:`~posenc.encodings.MRoPE`: pair i rotates by p[a(i)] theta_i, half-split pairs as
    Qwen2-VL) with a(i) from :func:`videorope_axis_of_pair`: height and width alternate over the
    high frequencies, time takes the s_t lowest, so temporal distances do not alias onto fast
    oscillations (the paper's V-NIAH-D distractors). Positions: :func:`videorope_position_ids`
    (diagonal layout, temporal stride). On text (every axis equal) it is RoPE exactly.

    Args:
        head_dim, rotary_dim, base, interleaved, scaling: as :class:`~posenc.encodings.MRoPE`.
        mrope_section: pairs (temporal, height, width), height == width, summing to
            rotary_dim / 2; default a quarter temporal ([16, 24, 24] for 64 pairs, the paper's).

    Raises:
        ValueError: as MRoPE; height and width of different sizes.
    """

    name = "videorope"
    _default_section = staticmethod(_videorope_default_section)

    def __init__(self, head_dim: int, *, mrope_section: Sequence[int] | None = None, rotary_dim: int | None = None,
                 base: float = 10000.0, interleaved: bool = False, scaling: Any = None) -> None:
        super().__init__(head_dim, mrope_section=mrope_section, rotary_dim=rotary_dim, base=base,
                         interleaved=interleaved, scaling=scaling)

    @staticmethod
    def _pair_axes(section: list[int], mrope_interleaved: bool) -> Tensor:
        return videorope_axis_of_pair(section)

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
                f"mrope_section={self.mrope_section}, interleaved={self.interleaved}")


def videorope_position_ids(segments: Sequence[Any], *, temporal_stride: int = 2, spatial_merge_size: int = 2) -> Tensor:
    """VideoRoPE position ids (3, T), int64, of one sequence of text and videos: the official
    ``get_t_scale_rope_index`` (@309f5c8) with an integer ``scale_factor`` (the paper's delta).

    ``segments`` as :func:`~posenc.encodings.mrope_position_ids`: an int n (n text tokens, at s,
    s+1, ... on all three axes) or (t, h, w) (a video or image grid in patches, before the
    spatial merge m; its tokens in t, row, column order). A grid's token at frame k, row y,
    column x of H = h/m rows and W = w/m columns sits at

        t = s + delta k,   h = t + y - (H - 1) // 2,   w = t + x - (W - 1) // 2

    (diagonal layout: each frame centred on the text diagonal, frames delta apart), s the
    position after the text before it; the text after a grid continues at its largest *temporal*
    position + 1 (the official rule; the spatial coordinates may run past it).

    Raises:
        ValueError: temporal_stride or spatial_merge_size not an integer >= 1; a segment of
            another form, h or w not divisible by spatial_merge_size; a video at the very start
            whose centred coordinates would be negative (posenc's positions are >= 0: put a
            text token before it).
    """
    for value, name in ((temporal_stride, "temporal_stride"), (spatial_merge_size, "spatial_merge_size")):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InvalidArgument(f"{name} must be an integer >= 1, got {value!r}")
    pieces, start = [], 0
    for index, segment in enumerate(segments):
        if isinstance(segment, int) and not isinstance(segment, bool) and segment >= 0:
            ids = torch.arange(start, start + segment).expand(3, -1)
            if segment:
                start += segment
        else:
            t, h, w, interval = _vision_segment(segment, index, spatial_merge_size)
            if interval != 1.0:
                raise InvalidArgument(f"segments[{index}]: VideoRoPE spaces frames by temporal_stride, not a "
                                      f"time_interval; got {segment!r}")
            rows, cols = h // spatial_merge_size, w // spatial_merge_size
            frame, row, col = torch.meshgrid(torch.arange(t), torch.arange(rows), torch.arange(cols), indexing="ij")
            temporal = start + temporal_stride * frame
            ids = torch.stack((temporal, temporal + row - (rows - 1) // 2, temporal + col - (cols - 1) // 2)).reshape(3, -1)
            if int(ids.min()) < 0:
                raise InvalidArgument(f"segments[{index}]: the video's centred coordinates start at {int(ids.min())} "
                                      "< 0 (posenc's positions are >= 0): put text before it")
            start = int(temporal.max()) + 1
        pieces.append(ids)
    return torch.cat(pieces, dim=1) if pieces else torch.zeros(3, 0, dtype=torch.long)
