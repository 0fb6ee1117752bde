"""LieRE, Lie group relative position encodings (Ostmeier et al. 2024, "LieRE: Lie Rotational
Positional Encodings", arXiv 2406.10322): RoPE's fixed 2 x 2 rotations replaced by
learned rotations R(p) = exp(sum_a p_a A_a), each A_a a skew-symmetric matrix (block-diagonal,
blocks of b x b), so a query or key is turned in every direction of a b-dimensional block at
once rather than in planes.

In one dimension the exponentials of one generator commute, R(m)^T R(n) = R(n - m), and the
score q_m' . k_n' depends on n - m only, exactly as RoPE's. With several position axes LieRE's
generators need not commute and the score is relative only approximately (the paper's trade:
expressivity over exact relativity); :class:`~posenc.encodings.ComRoPE` constrains them to
commute.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from posenc._validation import (
    check_bool,
    check_number,
    check_position_values,
    check_positive_int,
    check_sequence_positions,
    fits_sequence_positions,
)
from posenc.encodings.base import Hook, PositionalEncoding
from posenc.errors import InvalidArgument


class LieRE(PositionalEncoding):
    """LieRE (arXiv 2406.10322), as its reference code computes it (StanfordMIMI/LieRE
    ``models/rope_vit.py`` @657fc51, ``LierePositionEncoder`` and
    ``FlexibleAttention.apply_transforms``).

    Parameters ``generator_params`` P of shape (A, H_gen, N, b, b), N = head_dim // b blocks;
    for a position p (A coordinates, each multiplied by ``position_scale``):

        A_a = triu(P_a, 1) - triu(P_a, 1)^T            (skew-symmetric, per head and block)
        R(p) = matrix_exp(sum_a p_a A_a)                (N rotations of b x b, float64)
        x' = [R_1(p) x_{0:b}, ..., R_N(p) x_{(N-1)b:Nb}, x_{Nb:}]

    Queries and keys are rotated alike (R acts on column vectors, the reference's
    ``matmul(transforms, states)``); the last head_dim - N b dimensions pass through unrotated,
    as the reference leaves them. The reference subtracts 0.5 from ``triu(P, 1)`` before
    antisymmetrizing, which cancels: not done here. Query head h uses generator head
    h // (H / H_gen) (GQA).

    Positions: the reference feeds image coordinates normalized to [0, 1] over the training
    grid (``torch.linspace(0, steps / expected_steps, steps)``, which depends on the number of
    patches and would move every position of a causal sequence as it grows); here a position
    is an integer times the fixed ``position_scale`` (:meth:`options_for_train_len` gives 1 / L,
    the training window spanning [0, 1) as the reference's grid does). One coordinate per
    token ((T,) or (B, T)) is read by every axis; several axes come axis-first (A, B, T).

    Cost: a b x b matrix exponential per (position, generator head, block), float64, and a
    b x b matrix-vector product per block: O(T H_gen head_dim b^2) against RoPE's O(T head_dim).

    Args:
        head_dim: D, the query/key width.
        num_key_value_heads: H_gen, the heads with their own generators (the reference's
            ``rotary_embedding_per_head``); queries share them in groups of H / H_gen.
            Default 1: one set for every head.
        block_size: b, the generators' block (the reference's ``generator_dim``); default
            head_dim (one dense D x D rotation, the paper's headline form). b = 2 is RoPE with
            learned frequencies.
        num_axes: A, the position's coordinates (1 for text; 2 or 3 for images and video).
        position_scale: the factor applied to integer positions (default 1.0).
        init_range: P starts uniform in [0, init_range) (the reference's 2 pi, after
            RoPE-Mixed's random angles).
        learnable: P a parameter (True, the default, as LieRE trains it) or a frozen buffer.

    Raises:
        ValueError: a size not a positive integer; block_size > head_dim; position_scale or
            init_range not positive and finite.
        TypeError: learnable not a bool.
    """

    name = "liere"
    hooks = frozenset({Hook.ROTATE})
    model_sizes = ("head_dim",)

    def __init__(self, head_dim: int, num_key_value_heads: int = 1, *, block_size: int | None = None,
                 num_axes: int = 1, position_scale: float = 1.0, init_range: float = 2 * math.pi,
                 learnable: bool = True) -> None:
        super().__init__()
        self._init_layout(head_dim, num_key_value_heads, block_size, num_axes, position_scale, learnable)
        high = check_number(init_range, "init_range", gt=0.0)
        shape = (num_axes, num_key_value_heads, self.num_blocks, self.block_size, self.block_size)
        self._store("generator_params", torch.rand(shape) * high, learnable)

    def _init_layout(self, head_dim: int, num_key_value_heads: int, block_size: int | None, num_axes: int,
                     position_scale: float, learnable: bool) -> None:
        check_positive_int(head_dim, "head_dim")
        check_positive_int(num_key_value_heads, "num_key_value_heads")
        check_positive_int(num_axes, "num_axes")
        check_bool(learnable, "learnable")
        block_size = head_dim if block_size is None else block_size
        check_positive_int(block_size, "block_size")
        if block_size > head_dim:
            raise InvalidArgument(f"block_size must be <= head_dim = {head_dim}, got {block_size}")
        self.head_dim, self.block_size, self.num_axes = head_dim, block_size, num_axes
        self.num_key_value_heads = num_key_value_heads
        self.num_blocks = head_dim // block_size
        self.rotary_dim = self.num_blocks * block_size
        self.position_scale = check_number(position_scale, "position_scale", gt=0.0)

    def _store(self, name: str, value: Tensor, learnable: bool) -> None:
        if learnable:
            setattr(self, name, nn.Parameter(value))
        else:
            self.register_buffer(name, value)

    @classmethod
    def options_for_train_len(cls, train_len: int) -> dict[str, float]:
        """``position_scale = 1 / train_len``: the training window spans [0, 1), as the
        reference's image grid does; longer sequences go past 1, as larger images do there."""
        check_positive_int(train_len, "train_len")
        return {"position_scale": 1.0 / train_len}

    @property
    def position_axes(self) -> int:
        return self.num_axes

    # -- the generators and the rotations ----------------------------------------------------
    def generators(self) -> Tensor:
        """The skew-symmetric generators A_a, float64 (A, H_gen, N, b, b) (the parameters'
        gradient flows through)."""
        upper = torch.triu(self.generator_params.to(torch.float64), diagonal=1)
        return upper - upper.transpose(-1, -2)

    def rotations(self, positions: Tensor) -> Tensor:
        """R(p), float64: (H_gen, T, N, b, b) for (T,) positions, (B, H_gen, T, N, b, b) for
        (B, T) or axis-first (A, B, T)."""
        generators = self.generators() * self.position_scale
        coords = positions.to(torch.float64)
        if positions.dim() <= 2:  # one coordinate per token: every axis reads it
            exponent = torch.einsum("...t,hnij->...htnij", coords, generators.sum(0))
        else:
            exponent = torch.einsum("abt,ahnij->bhtnij", coords, generators)
        # matrix_exp views its batch flat: einsum's output can be strided across it
        return torch.linalg.matrix_exp(exponent.contiguous())

    # -- positions ---------------------------------------------------------------------------
    def check_positions(self, positions: Tensor, *, length: int, batch: int, argname: str = "positions") -> Tensor:
        """(T,) or (B, T) (every axis equal), or with num_axes > 1 axis-first (A, B, T), B 1 or
        ``batch``; returned unchanged.

        Raises:
            TypeError: not an integer tensor.
            ValueError: another shape (the message lists the allowed ones), a negative entry.
        """
        if self.num_axes == 1 or fits_sequence_positions(positions, length, batch):
            return check_sequence_positions(positions, length=length, batch=batch, argname=argname)
        check_position_values(positions, argname)
        if not self._is_axis_first(positions, length, batch):
            raise InvalidArgument(
                f"{argname} must have shape ({length},) or ({batch}, {length}) (every axis equal) or "
                f"({self.num_axes}, {batch}, {length}) (axis-first, B may be 1); got {tuple(positions.shape)}")
        return positions

    def _is_axis_first(self, positions: Tensor, length: int, batch: int) -> bool:
        return (positions.dim() == 3 and positions.shape[0] == self.num_axes and positions.shape[2] == length
                and positions.shape[1] in (1, batch))

    # -- the hook ----------------------------------------------------------------------------
    def rotate(self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor) -> tuple[Tensor, Tensor]:
        """q (B, H, Tq, D) and k (B, Hk, Tk, D) rotated at their positions ((T,), (B, T) or
        axis-first (A, B, T)); R is built in float64, applied in float32 (float64 for float64
        inputs), each returned in its own dtype. H and Hk must be multiples of H_gen.

        Raises:
            ValueError: a last dimension other than head_dim; a head count that is not a
                multiple of the generator heads; positions of another shape.
        """
        self._check(q, q_positions, "q")
        self._check(k, k_positions, "k")
        dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), torch.float32)
        q_rot = self.rotations(q_positions).to(dtype)
        k_rot = q_rot if k_positions is q_positions else self.rotations(k_positions).to(dtype)
        return self._turn(q, q_rot), self._turn(k, k_rot)

    def _check(self, x: Tensor, positions: Tensor, what: str) -> None:
        if x.shape[-1] != self.head_dim:
            raise InvalidArgument(f"{what}: last dimension {x.shape[-1]} != head_dim {self.head_dim}")
        if x.shape[1] % self.num_key_value_heads:
            raise InvalidArgument(f"{what}: {x.shape[1]} heads is not a multiple of {self.name}'s "
                                  f"{self.num_key_value_heads} generator heads (num_key_value_heads)")
        if not (fits_sequence_positions(positions, x.shape[2], x.shape[0])
                or self._is_axis_first(positions, x.shape[2], x.shape[0])):
            raise InvalidArgument(f"{what}_positions: shape {tuple(positions.shape)} is not ({x.shape[2]},), "
                                  f"({x.shape[0]}, {x.shape[2]}) or ({self.num_axes}, {x.shape[0]}, {x.shape[2]})")

    def _turn(self, x: Tensor, rotations: Tensor) -> Tensor:
        """x (B, H, T, D) turned by rotations (..., H_gen, T, N, b, b): query head h by generator
        head h // (H / H_gen), broadcast over the group (no copy of the rotations per head)."""
        wide = x.to(rotations.dtype)
        batch, heads, length = x.shape[:3]
        gen_heads = self.num_key_value_heads
        blocks = wide[..., :self.rotary_dim].reshape(batch, gen_heads, heads // gen_heads, length, self.num_blocks,
                                                     self.block_size, 1)
        turned = (rotations.unsqueeze(-5) @ blocks).reshape(batch, heads, length, self.rotary_dim)
        return torch.cat((turned, wide[..., self.rotary_dim:]), dim=-1).to(x.dtype)

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, block_size={self.block_size}, num_blocks={self.num_blocks}, "
                f"num_axes={self.num_axes}, generator_heads={self.num_key_value_heads}, "
                f"position_scale={self.position_scale:g}")
