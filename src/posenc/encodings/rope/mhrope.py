"""MHRoPE, multi-head multimodal RoPE (Huang et al. 2025, "Revisiting Multimodal Positional
Encoding in Vision-Language Models", arXiv 2510.23095): M-RoPE's axes split by *heads* instead
of by frequency pairs: each key/value head rotates every one of its pairs by one coordinate
(temporal, height or width), so every axis keeps RoPE's whole frequency ladder."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from posenc._validation import check_positive_int
from posenc.encodings.rope.multiaxis import (
    MRoPE,
    _three_counts,
    default_mrope_section,
    mrope_rotary_dim,
    static_rope_parameters,
)
from posenc.encodings.rope.rotary import cos_sin_table
from posenc.errors import InvalidArgument
from posenc.kernels.rotary_torch import apply_rotary


class MHRoPE(MRoPE):
    """Multi-head RoPE (arXiv 2510.23095), as its reference code computes it
    (JJJYmmm/Multimodal-RoPEs ``multimodal_ropes/freq_allocation/mhrope.py`` @8cd6d41 and
    ``test.py``'s ``apply_multihead_rotary_pos_emb`` @64f8a14): ``mrope_section`` counts *heads*:
    the first s_t key/value heads rotate by the temporal coordinate, the next s_h by the height,
    the next s_w by the width, each with RoPE's full ladder theta_i = base^(-2i/r) (half-split
    pairs, as Qwen3-VL); key/value heads past sum(section) are not rotated (the reference pads
    their angles with zeros). Query head h uses key/value head h // (H / H_kv) (the reference's
    ``repeat_interleave``). On text (every axis equal) the rotated heads are RoPE exactly.

    Args:
        head_dim: D (positive, even).
        num_key_value_heads: H_kv, the key heads the axes are split over (``create_for_model``
            passes the model's num_heads: give a GQA model's key/value heads).
        mrope_section: heads per axis (temporal, height, width), non-negative, summing to at
            most H_kv; default a quarter temporal ([2, 3, 3] of 8, the reference's).
        rotary_dim, base, interleaved, scaling: as :class:`~posenc.encodings.MRoPE`.

    Positions: as MRoPE ((T,), (B, T), (3, B, T), (3, T)).

    Raises:
        ValueError: as MRoPE; a section that is not 3 non-negative ints summing to at most
            num_key_value_heads; at rotate time, keys whose head count is not H_kv or queries
            whose head count is not a multiple of it.
    """

    name = "mhrope"
    model_sizes = {"head_dim": "head_dim", "num_key_value_heads": "num_heads"}

    def __init__(self, head_dim: int, num_key_value_heads: int, *, mrope_section: Sequence[int] | None = None,
                 rotary_dim: int | None = None, base: float = 10000.0, interleaved: bool = False,
                 scaling: dict | None = None) -> None:
        super(MRoPE, self).__init__()
        rotary_dim = mrope_rotary_dim(head_dim, rotary_dim, base, interleaved)
        check_positive_int(num_key_value_heads, "num_key_value_heads")
        section = default_mrope_section(num_key_value_heads) if mrope_section is None else mrope_section
        if not _three_counts(section) or sum(section) > num_key_value_heads:
            raise InvalidArgument(f"mrope_section must be 3 non-negative integers (temporal, height, width heads) "
                                  f"summing to at most num_key_value_heads={num_key_value_heads}, got {mrope_section!r}")
        inv_freq, attention_factor = static_rope_parameters(rotary_dim, base, scaling)
        self.base, self.scaling = float(base), dict(scaling) if scaling is not None else None
        self.mrope_section, self.mrope_interleaved = [int(s) for s in section], False
        self.num_key_value_heads = num_key_value_heads
        # the pairs read no axis of their own here (a head does); every pair's slot is axis 0
        self._init_tables(head_dim, rotary_dim, 3, interleaved, torch.zeros(rotary_dim // 2, dtype=torch.long),
                          inv_freq, attention_factor=attention_factor)
        # -1: a head past the section, not rotated
        self._axis_of_head = torch.cat((torch.repeat_interleave(torch.arange(3), torch.tensor(self.mrope_section)),
                                        torch.full((num_key_value_heads - sum(self.mrope_section),), -1)))

    def head_angles(self, positions: Tensor) -> Tensor:
        """float64 angles (H_kv, T, r/2) for (T,) positions, (B, H_kv, T, r/2) for (B, T) or
        axis-first (3, B, T): head h's coordinate times theta, 0 for the heads past the section."""
        inv_freq = self._inv_freq_f64.to(positions.device)
        axis = self._axis_of_head.to(positions.device)
        if positions.dim() <= 2:  # every axis equal
            coords = positions.to(torch.float64).unsqueeze(-2).expand(*positions.shape[:-1], axis.numel(), -1)
        else:  # (3, B, T) -> (B, H_kv, T): each head's coordinate
            coords = positions.index_select(0, axis.clamp(min=0)).to(torch.float64).movedim(0, 1)
        coords = coords * (axis >= 0).to(torch.float64).unsqueeze(-1)
        return coords.unsqueeze(-1) * inv_freq

    def cos_sin(self, positions: Tensor, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
        """Refused: MHRoPE's tables differ per head (:meth:`head_angles`), not one table per
        position as M-RoPE's.

        Raises:
            ValueError: always.
        """
        raise InvalidArgument("mhrope has one table per key/value head, not one per position: use rotate() or "
                              "head_angles()")

    def angles(self, positions: Tensor) -> Tensor:
        """Refused, as :meth:`cos_sin`.

        Raises:
            ValueError: always.
        """
        raise InvalidArgument("mhrope has angles per key/value head: use head_angles()")

    def rotate(self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor) -> tuple[Tensor, Tensor]:
        """q (B, H, Tq, D) and k (B, H_kv, Tk, D) rotated head by head at their positions, each
        in its own dtype (float32 arithmetic, float64 for float64 inputs).

        Raises:
            ValueError: a last dimension other than head_dim; k without H_kv heads, q whose
                heads are not a multiple of H_kv; positions of another shape.
        """
        if q.shape[-1] != self.head_dim or k.shape[-1] != self.head_dim:
            raise InvalidArgument(f"q and k must have head_dim={self.head_dim}, got {q.shape[-1]} and {k.shape[-1]}")
        if k.shape[1] != self.num_key_value_heads or q.shape[1] % self.num_key_value_heads:
            raise InvalidArgument(f"mhrope splits its axes over num_key_value_heads={self.num_key_value_heads}: k "
                                  f"must have that many heads and q a multiple, got {k.shape[1]} and {q.shape[1]}")
        self._hook_positions(q_positions, q, "q_positions")
        self._hook_positions(k_positions, k, "k_positions")
        return (self._turn(q, q_positions, q.shape[1] // self.num_key_value_heads),
                self._turn(k, k_positions, 1))

    def _turn(self, x: Tensor, positions: Tensor, group: int) -> Tensor:
        cos, sin = cos_sin_table(self.head_angles(positions), self.attention_factor, self.interleaved,
                                 torch.promote_types(x.dtype, torch.float32))
        if group > 1:
            cos, sin = cos.repeat_interleave(group, dim=-3), sin.repeat_interleave(group, dim=-3)
        r = self.rotary_dim
        turned = apply_rotary(x[..., :r], cos, sin, interleaved=self.interleaved)
        return turned if r == self.head_dim else torch.cat((turned, x[..., r:]), dim=-1)

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, num_key_value_heads={self.num_key_value_heads}, "
                f"mrope_section={self.mrope_section} (heads), base={self.base}, interleaved={self.interleaved}")
