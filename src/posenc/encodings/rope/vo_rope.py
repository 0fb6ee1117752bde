"""RoPE on the values and the output (VO-RoPE), as DeepSeek-V4 ships it: q, k *and* v rotated at
their positions, and the attention's output rotated back at its query's, so that the value path
carries a relative position too:

    out_i = R(-theta i) sum_j p_ij R(theta j) v_j = sum_j p_ij R(theta (j - i)) v_j

on the rotated slice (DeepSeek-V4: its keys are its values, one tensor, so the values pick up
the keys' rotation and the output's inverse rotation turns it into a relative one; Su 2025,
"VO-RoPE", proposed it on its own).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from posenc.encodings.rope.rotary import RoPE
from posenc.errors import InvalidArgument
from posenc.kernels.rotary_torch import apply_rotary

#: ``VORoPE(rotary_slice=...)``: which end of the head the rotary dimensions are.
ROTARY_SLICES = ("first", "last")


class VORoPE(RoPE):
    """RoPE on queries, keys and values, the output rotated back (DeepSeek-V4; transformers
    ``models/deepseek_v4/modeling_deepseek_v4.py``, ``DeepseekV4Attention.forward`` and
    ``apply_rotary_pos_emb``, 5.24.0).

    With RoPE's rotation R(p) on r of the D dimensions (its frequencies, scaling and
    attention factor: :class:`~posenc.encodings.RoPE`):

        q'_i = R(i) q_i,  k'_j = R(j) k_j,  v'_j = R(j) v_j,  out_i = R(-i) sum_j p_ij v'_j

    so scores depend on j - i (as RoPE's) and so does each value's contribution,
    R(j - i) v_j. The rotated slice is the *last* r dimensions with adjacent pairs (2i, 2i+1)
    by default, DeepSeek-V4's layout ``[nope | rope]`` (``x[..., -rope_dim:]``,
    ``rotate_half`` on ``0::2`` / ``1::2``); ``rotary_slice="first"`` and
    ``interleaved=False`` give the leading, half-split variant. Values and output use the same
    tables as q and k, the attention factor included (as transformers does: DeepSeek-V4's
    compressed layers force YaRN's to 1). v must have width D.

    DeepSeek-V4's tables: sliding layers ``VORoPE(512, rotary_dim=64, base=1e4)``; compressed
    layers ``base=1.6e5`` with ``scaling={"rope_type": "yarn", "factor": 16,
    "original_max_position_embeddings": ..., "attention_factor": 1.0}``.

    Args:
        head_dim, rotary_dim, partial_rotary_factor, base, scaling, max_position_embeddings:
            as :class:`~posenc.encodings.RoPE`.
        interleaved: adjacent pairs (True, the default, DeepSeek-V4's) or half-split.
        rotary_slice: ``"last"`` (default) or ``"first"``: where the r rotated dimensions are.

    Raises:
        ValueError: as RoPE; rotary_slice not one of ``ROTARY_SLICES``; a length-dependent
            scaling (dynamic, dynamic_yarn, longrope: the output's inverse rotation needs the
            table its values were rotated with, which such a type changes as the sequence
            grows).
    """

    name = "vo_rope"
    rotates_values = True

    def __init__(self, head_dim: int, *, rotary_dim: int | None = None, partial_rotary_factor: float | None = None,
                 base: float = 10000.0, interleaved: bool = True, scaling: Mapping[str, Any] | None = None,
                 rotary_slice: str = "last", max_position_embeddings: int | None = None) -> None:
        if rotary_slice not in ROTARY_SLICES:
            raise InvalidArgument(f"rotary_slice must be one of {ROTARY_SLICES}, got {rotary_slice!r}")
        super().__init__(head_dim, rotary_dim=rotary_dim, partial_rotary_factor=partial_rotary_factor, base=base,
                         interleaved=interleaved, scaling=scaling, max_position_embeddings=max_position_embeddings)
        if self.length_dependent:
            raise InvalidArgument(f"scaling: {dict(scaling or {}).get('rope_type')!r} depends on the sequence length; vo_rope takes the "
                                  "static types (default, linear, ntk, yarn, llama3, ...), since its output is rotated "
                                  "back with the table its values were rotated with")
        self.rotary_slice = rotary_slice

    def _turn(self, x: Tensor, positions: Tensor, what: str, *, inverse: bool = False) -> Tensor:
        if x.shape[-1] != self.head_dim:
            raise InvalidArgument(f"{what} must have head_dim={self.head_dim}, got {x.shape[-1]}")
        cos, sin = self.cos_sin(positions, torch.promote_types(x.dtype, torch.float32))
        if cos.dim() == 3:  # (B, T, r) -> (B, 1, T, r)
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        split = self.head_dim - self.rotary_dim if self.rotary_slice == "last" else self.rotary_dim
        lead, tail = x[..., :split], x[..., split:]
        if self.rotary_slice == "last":
            return torch.cat((lead, apply_rotary(tail, cos, -sin if inverse else sin, interleaved=self.interleaved)), -1)
        return torch.cat((apply_rotary(lead, cos, -sin if inverse else sin, interleaved=self.interleaved), tail), -1)

    def rotate(self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor) -> tuple[Tensor, Tensor]:
        """q (B, H, Tq, D) and k (B, H_kv, Tk, D) rotated at their positions ((T,) or (B, T)),
        each in its own dtype (the rotation in float32, float64 for float64 inputs).

        Raises:
            ValueError: a last dimension other than head_dim.
        """
        return self._turn(q, q_positions, "q"), self._turn(k, k_positions, "k")

    def rotate_values(self, v: Tensor, k_positions: Tensor) -> Tensor:
        """v (B, H_kv, Tk, D) rotated at its keys' positions, as k.

        Raises:
            ValueError: a last dimension other than head_dim.
        """
        return self._turn(v, k_positions, "v")

    def rotate_output(self, out: Tensor, q_positions: Tensor) -> Tensor:
        """The attention's output (B, H, Tq, D) rotated by R(-i) at its queries' positions (the
        tables' cos with -sin, transformers' ``apply_rotary_pos_emb(o, cos, -sin)``).

        Raises:
            ValueError: a last dimension other than head_dim.
        """
        return self._turn(out, q_positions, "the output", inverse=True)

    def kernel_angles(self, positions: Tensor, seq_len: int | Tensor | None = None) -> None:
        """None: the fused Triton kernel rotates leading dimensions; vo_rope keeps the table path."""

    def extra_repr(self) -> str:
        return super().extra_repr() + f", rotary_slice={self.rotary_slice!r}, rotates_values=True"
